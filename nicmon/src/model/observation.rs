//! One observation of the node: everything one poll reads from the host, read once before
//! anything is decided ([`crate::read::observe`] makes it, [`crate::decide::poll`] takes it).
use std::collections::BTreeSet;

use crate::model::Snapshot;
use crate::model::kmsg::HostLinks;

/// Everything one cycle reads from the host, read once before anything is decided.
#[derive(Debug, Clone, Default)]
pub struct Observation {
    pub snapshot: Snapshot,
    /// Network links for attributing kernel log lines; read only when there are records.
    pub links: Option<HostLinks>,
    /// The EINVAL memo after this read: the previous state's memo plus the files whose read
    /// failed with `EINVAL` now (never opened again in this boot, SPEC §1.1).
    pub einval: BTreeSet<String>,
    /// Host reads abandoned at their deadline so far (cumulative), and those not returned yet.
    pub reads_abandoned: u64,
    pub stuck_reads: Vec<(std::path::PathBuf, std::time::Duration)>,
    /// A targeted read ([`crate::read::observe::Observer::observe_targeted`]): only these devices were read now,
    /// the rest of the snapshot is the previous full poll's. `None`: a full read.
    pub targeted: Option<Vec<String>>,
    /// What the ethtool read of the RoCE ports found absent, said once per netdev.
    pub ethtool_notes: Vec<String>,
    /// The wake-ups this poll answers (hook names; empty: the interval's poll), for the port
    /// history. Set by the daemon.
    pub woken_by: Vec<String>,
    /// What the kernel said was removed lately (uevent `remove`, rtnetlink `RTM_DELLINK`):
    /// RDMA device names, netdev names and PCI addresses. A known device this names that
    /// the poll finds gone is reported at once (SPEC §1.15). Set by the daemon.
    pub kernel_removed: BTreeSet<String>,
}
