//! The devlink read path against the real kernel: one `DEVLINK_CMD_HEALTH_REPORTER_GET`
//! dump through generic netlink. This VM has no devlink instance: the family resolves and
//! the dump answers nothing (or the kernel has no devlink family: "not supported"), and
//! the reader says so once, with no reporter and no failure.
use std::collections::BTreeSet;
use std::time::Duration;

use nicmon::model::Snapshot;
use nicmon::read::devlink::{DevlinkReader, DevlinkSource, netlink};

#[test]
fn the_real_dump_answers_empty_or_not_supported_said_once() {
    let answer = netlink::dump(Duration::from_secs(10));
    match &answer {
        Ok(all) => {
            // Any instance's reporters parse to names with counts; on this VM there are none.
            for (instance, r) in all {
                assert!(instance.contains('/'), "{instance}");
                assert!(r.reporters.iter().all(|x| !x.name.is_empty()), "{r:?}");
            }
        }
        Err(e) => assert!(e.is_unsupported(), "the devlink dump failed: {e}"),
    }
    let source = DevlinkSource::kernel(std::sync::Arc::new(|| netlink::dump(Duration::from_secs(10))));
    let reader = DevlinkReader::default();
    let host = nicmon::read::host::Host::new("/sys", "/proc");
    let pci_of = |i: &str| nicmon::read::devlink::pci_of(&host, i);
    let pcis: BTreeSet<String> = ["0000:fe:00.0".to_string()].into();
    let mut snap = Snapshot::default();
    let notes = reader.read(&source, &mut snap, &pcis, Duration::from_secs(10), &pci_of);
    assert!(snap.devlink.is_empty(), "{:?}", snap.devlink);
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(notes[0].contains("not supported"), "{notes:?}");
    assert!(reader.read(&source, &mut snap, &pcis, Duration::from_secs(10), &pci_of).is_empty(), "said once");
    eprintln!("devlink_kernel: {}", notes[0]);
}
