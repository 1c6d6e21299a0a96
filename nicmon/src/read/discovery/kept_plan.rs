//! The plan of a full poll's devices kept between polls (issue 47, "poll cost"): between
//! walks, while nothing the plan was made from has changed, the next full poll reads the
//! same files in the same order and finishes its devices from the same plan — so it is
//! taken as it is instead of being made again (no path formatted, no path compared).
//!
//! What a plan is made from, and what makes the kept one stand aside:
//! - the device listing, each device's static attributes and netdevs, the files found
//!   absent, the RoCE ports that gave a rate, the frozen (unmonitored) devices: every change
//!   of those in the [`StaticCache`] drops the kept plan (`CacheInner::plan = None`);
//! - a walk ([`super::walk`]): it checks each device's incarnation, so it plans anew;
//! - the static attributes' age: the plan stands until the oldest device's attributes are
//!   due a re-read ([`STATIC_REFRESH`]);
//! - the default route and the frozen generation, compared as a key;
//! - the batch read last: the plan's files are a prefix of it (`last_batch`), so a batch
//!   dropped or replaced since makes it stand aside.
//!
//! The character-device entries, planned after the devices, are planned on every poll
//! ([`super::chars`]), against the same last batch.
//!
//! The plan also keeps the devices as the last poll finished them from its results
//! ([`Finished`]): a device whose files all read the same again is that reading again (the
//! same `Arc`, nothing parsed or built). On a quiet node that is every device, every poll;
//! a port whose counter moved is finished anew, its device alone.
use super::*;

/// A full poll's device plan and where it stands.
#[derive(Clone)]
pub(super) struct KeptPlan {
    /// Per device of the listing, its plan.
    pub(super) reads: Arc<[Planned]>,
    /// How many files of the batch are the devices' (the character devices' follow).
    pub(super) len: usize,
    /// Those read once ([`Batch::read_once`]).
    pub(super) once: Vec<usize>,
    /// The batch it was made into ([`StaticCache::keep_plan`]).
    files: Option<Arc<FileSet>>,
    /// The default route devices and the frozen generation it was made under.
    route: Vec<String>,
    generation: u64,
    /// When the first device's static attributes are due a re-read.
    expires: Instant,
    /// The devices as a poll by this plan last finished them, and what it read.
    pub(super) finished: Option<Arc<Finished>>,
}

/// The most files a poll's batch may have for its results to be kept with its devices
/// ([`Finished`]): a GPU node's dozen NICs read a few hundred; a device of a thousand ports,
/// tens of thousands — a second copy of those would cost more memory than finishing them
/// saves time (the 1,000-port node's memory bar, docs/performance.md).
pub(super) const FINISHED_MAX_FILES: usize = 4096;

/// A poll's devices as finished from its results by a kept plan ([`KeptPlan::finished`]).
#[derive(Debug)]
pub(super) struct Finished {
    /// Per device of the plan (by its position), its reading.
    devices: Vec<Arc<Device>>,
    /// The poll's results, by place in the batch.
    results: Texts,
}

impl Finished {
    /// Device `i` of the plan, read as `r` with `results`: the kept reading when every one
    /// of its files read the same as then. A file found absent is never taken as the same
    /// (its finish notes it: [`StaticCache::mark_absent`]).
    pub(super) fn reuse(&self, i: usize, r: &DeviceRead, results: &Texts) -> Option<Arc<Device>> {
        let d = self.devices.get(i).filter(|d| d.name == r.name)?;
        let same =
            |j: usize| !matches!(results.get(j), Some(Err(ReadError::Missing))) && results.same(j, &self.results, j);
        r.indices().all(same).then(|| d.clone())
    }
}

impl std::fmt::Debug for KeptPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeptPlan").field("devices", &self.reads.len()).field("files", &self.len).finish()
    }
}

impl KeptPlan {
    /// The plan just made of `reads` (`batch`: before the character devices were added).
    pub(super) fn new(reads: &Arc<[Planned]>, batch: &Batch, route: &[String], generation: u64) -> KeptPlan {
        let now = Instant::now();
        let expires = reads
            .iter()
            .filter_map(|r| match r {
                Planned::Read(d) => Some(d.statics.read_at + STATIC_REFRESH),
                Planned::Frozen(_) => None,
            })
            .min()
            .unwrap_or(now + STATIC_REFRESH);
        KeptPlan {
            reads: reads.clone(),
            len: batch.len,
            once: batch.once.clone(),
            files: None,
            route: route.to_vec(),
            generation,
            expires,
            finished: None,
        }
    }

    /// A batch resumed after the plan's files: the character devices' are added to it.
    pub(super) fn batch(&self) -> Batch {
        Batch { prev: self.files.clone(), len: self.len, once: self.once.clone(), ..Batch::default() }
    }

    /// Whether a device's port listing is read on every poll (a device caught registering,
    /// before its ports appeared): such a plan is not kept.
    pub(super) fn keepable(reads: &[Planned]) -> bool {
        reads.iter().all(|r| match r {
            Planned::Read(d) => !d.statics.ports.is_empty(),
            Planned::Frozen(_) => true,
        })
    }
}

impl StaticCache {
    /// The kept plan, if it stands for a poll that does not walk, under this route and
    /// frozen generation, against the batch read last.
    pub(super) fn kept_plan(&self, walk: bool, route: &[String]) -> Option<KeptPlan> {
        if walk {
            return None;
        }
        let c = self.inner.lock().ok()?;
        let p = c.plan.as_ref()?;
        let last = c.last_batch.as_ref()?;
        let stands = p.files.as_ref().is_some_and(|f| Arc::ptr_eq(f, last))
            && p.route == route
            && p.generation == c.frozen.generation()
            && Instant::now() < p.expires;
        stands.then(|| p.clone())
    }

    /// The frozen generation now.
    pub(super) fn frozen_generation(&self) -> u64 {
        self.inner.lock().map(|c| c.frozen.generation()).unwrap_or(u64::MAX)
    }

    /// Keep `devices`, finished from `results` by the kept plan of `files` (if it still
    /// stands: a finish that changed what the plan is made from has dropped it). A batch of
    /// more than [`FINISHED_MAX_FILES`] is not kept: its devices are finished every poll.
    pub(super) fn keep_finished(&self, files: &Arc<FileSet>, devices: &[Arc<Device>], results: Texts) {
        if let Ok(mut c) = self.inner.lock()
            && let Some(p) = c.plan.as_mut().filter(|p| p.files.as_ref().is_some_and(|f| Arc::ptr_eq(f, files)))
        {
            p.finished = (results.len() <= FINISHED_MAX_FILES)
                .then(|| Arc::new(Finished { devices: devices.to_vec(), results }));
        }
    }

    /// Keep `plan`, made into `files`.
    pub(super) fn keep_plan(&self, mut plan: KeptPlan, files: &Arc<FileSet>) {
        plan.files = Some(files.clone());
        if let Ok(mut c) = self.inner.lock() {
            c.plan = Some(plan);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nicmon_tests::platforms::Platform;

    const PATH: &str = "counters/symbol_error";

    fn counter_of(s: &Snapshot, dev: &str) -> Option<u64> {
        s.devices.iter().find(|d| d.name == dev).and_then(|d| d.ports[0].counters.get(PATH).copied())
    }

    fn kept(host: &Host) -> u64 {
        host.stats.plans_kept.load(Ordering::Relaxed)
    }

    #[test]
    fn a_poll_between_walks_takes_the_kept_plan_and_reads_every_value_anew() {
        let node = Platform::H100Oci.build();
        let host = Host::new(node.sys(), node.proc());
        let cache = Arc::new(StaticCache::default());
        let plan =
            ReadPlan { statics: Some(cache.clone()), counter_paths: vec![PATH.into()].into(), ..ReadPlan::default() };
        let first = discover(&host, &plan);
        assert_eq!(kept(&host), 0, "the first poll walks and makes its plan");
        let second = discover(&host, &plan);
        assert_eq!(kept(&host), 1, "the next poll takes it");
        assert_eq!(second, first, "and reads the same node the same way");
        // A value that changes is read anew through the kept plan.
        node.set_counter("mlx5_0", 1, PATH, 42);
        let third = discover(&host, &plan);
        assert_eq!((kept(&host), counter_of(&third, "mlx5_0")), (2, Some(42)));
        // The same node read without any cache.
        let fresh = discover(&host, &ReadPlan { counter_paths: vec![PATH.into()].into(), ..ReadPlan::default() });
        assert_eq!(third, fresh);
        // A device's static attributes forgotten (a wake-up naming it): planned anew, then kept again.
        cache.invalidate("mlx5_0");
        assert_eq!(discover(&host, &plan), fresh);
        assert_eq!(kept(&host), 2, "planned anew");
        assert_eq!(discover(&host, &plan), fresh);
        assert_eq!(kept(&host), 3, "kept again");
        // A hint: this poll walks, so it plans anew.
        host.topology_hint();
        assert_eq!(discover(&host, &plan), fresh);
        assert_eq!(kept(&host), 3, "a walk plans anew");
    }

    #[test]
    fn a_device_whose_files_read_the_same_is_the_last_reading_again() {
        let node = Platform::H100Oci.build();
        let host = Host::new(node.sys(), node.proc());
        let cache = Arc::new(StaticCache::default());
        let plan =
            ReadPlan { statics: Some(cache.clone()), counter_paths: vec![PATH.into()].into(), ..ReadPlan::default() };
        let device = |s: &Snapshot, name: &str| s.devices.iter().find(|d| d.name == name).cloned().unwrap();
        let same = |a: &Snapshot, b: &Snapshot, name: &str| Arc::ptr_eq(&device(a, name), &device(b, name));
        let first = discover(&host, &plan);
        let second = discover(&host, &plan);
        assert_eq!(kept(&host), 1);
        assert!(first.devices.iter().all(|d| same(&first, &second, &d.name)), "nothing read differently");
        let third = discover(&host, &plan);
        assert!(second.devices.iter().all(|d| same(&second, &third, &d.name)));
        // A counter that moved: its device is finished anew, the others are kept.
        node.set_counter("mlx5_0", 1, PATH, 42);
        let fourth = discover(&host, &plan);
        assert_eq!(counter_of(&fourth, "mlx5_0"), Some(42));
        assert!(!same(&third, &fourth, "mlx5_0"));
        assert!(third.devices.iter().filter(|d| d.name != "mlx5_0").all(|d| same(&third, &fourth, &d.name)));
        // A port's state that changed, the same way.
        node.set_port("mlx5_1", 1, "1: DOWN", "3: Disabled");
        let fifth = discover(&host, &plan);
        assert_eq!(device(&fifth, "mlx5_1").ports[0].state, Some(crate::model::PortState::Down));
        assert!(!same(&fourth, &fifth, "mlx5_1") && same(&fourth, &fifth, "mlx5_0"));
        // Every poll read what a poll without any cache reads.
        let fresh = discover(&host, &ReadPlan { counter_paths: vec![PATH.into()].into(), ..ReadPlan::default() });
        assert_eq!(fifth, fresh);
        assert_eq!(kept(&host), 4);
        // A walk plans anew, and finishes every device anew.
        host.topology_hint();
        let sixth = discover(&host, &plan);
        assert_eq!(sixth, fresh);
        assert!(!same(&fifth, &sixth, "mlx5_0"));
    }

    #[test]
    fn a_counter_found_absent_drops_the_kept_plan_and_is_not_read_again() {
        let node = Platform::H100Oci.build();
        let host = Host::new(node.sys(), node.proc());
        let cache = Arc::new(StaticCache::default());
        let plan =
            ReadPlan { statics: Some(cache.clone()), counter_paths: vec![PATH.into()].into(), ..ReadPlan::default() };
        discover(&host, &plan);
        let files = host.stats.files_read.load(Ordering::Relaxed);
        discover(&host, &plan);
        assert_eq!(kept(&host), 1);
        let read_kept = host.stats.files_read.load(Ordering::Relaxed) - files;
        std::fs::remove_file(node.port_file("mlx5_0", 1, PATH)).unwrap();
        let s = discover(&host, &plan);
        assert_eq!(counter_of(&s, "mlx5_0"), None);
        let again = discover(&host, &plan);
        assert_eq!(kept(&host), 2, "the poll after the one that found it absent plans anew");
        assert_eq!(again, s);
        let files = host.stats.files_read.load(Ordering::Relaxed);
        discover(&host, &plan);
        assert_eq!(kept(&host), 3, "then keeps that plan");
        assert_eq!(host.stats.files_read.load(Ordering::Relaxed) - files, read_kept - 1, "without the absent file");
    }
}
