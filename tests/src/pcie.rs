//! The PCIe attributes of the testbed's PCI functions, as the kernel prints them
//! (`drivers/pci/pci-sysfs.c`, `drivers/pci/pcie/aer.c`): `current_link_speed`,
//! `current_link_width`, `max_link_speed`, `max_link_width` and the AER statistics
//! `aer_dev_correctable|nonfatal|fatal`. Every function (bridges, GPUs, NICs) is Gen5 x16
//! with no AER error by default; the helpers below downtrain a link, put a card in a
//! narrower or slower slot, count AER errors, or take the AER files away.
use std::fs;
use std::path::{Path, PathBuf};

use crate::Node;

use crate::write;

/// The correctable error bits the kernel names, in its order (`aer_correctable_error_string`).
pub const CORRECTABLE_BITS: [&str; 8] =
    ["RxErr", "BadTLP", "BadDLLP", "Rollover", "Timeout", "NonFatalErr", "CorrIntErr", "HeaderOF"];

/// The uncorrectable error bits the kernel names (`aer_uncorrectable_error_string`); the
/// non-fatal and the fatal file both list them.
pub const UNCORRECTABLE_BITS: [&str; 18] = [
    "Undefined",
    "DLP",
    "SDES",
    "TLP",
    "FCP",
    "CmpltTO",
    "CmpltAbrt",
    "UnxCmplt",
    "RxOF",
    "MalfTLP",
    "ECRC",
    "UnsupReq",
    "ACSViol",
    "UncorrIntErr",
    "BlockedTLP",
    "AtomicOpBlocked",
    "TLPBlockedErr",
    "PoisonTLPBlocked",
];

/// One of the three AER statistics files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AerFile {
    Correctable,
    NonFatal,
    Fatal,
}

impl AerFile {
    pub const ALL: [AerFile; 3] = [AerFile::Correctable, AerFile::NonFatal, AerFile::Fatal];

    pub fn name(self) -> &'static str {
        match self {
            AerFile::Correctable => "aer_dev_correctable",
            AerFile::NonFatal => "aer_dev_nonfatal",
            AerFile::Fatal => "aer_dev_fatal",
        }
    }

    /// The file's text with these counts (bits not named count 0): `NAME count` lines, an
    /// unnamed bit as `dev_cor_errs_bit[N]` (`("bit[1]", 2)`), and the `TOTAL_ERR_*` line.
    pub fn text(self, counts: &[(&str, u64)]) -> String {
        let (names, total, unnamed): (&[&str], _, _) = match self {
            AerFile::Correctable => (&CORRECTABLE_BITS, "TOTAL_ERR_COR", "dev_cor_errs"),
            AerFile::NonFatal => (&UNCORRECTABLE_BITS, "TOTAL_ERR_NONFATAL", "dev_nonfatal_errs"),
            AerFile::Fatal => (&UNCORRECTABLE_BITS, "TOTAL_ERR_FATAL", "dev_fatal_errs"),
        };
        let count = |n: &str| counts.iter().filter(|(c, _)| *c == n).map(|(_, v)| v).sum::<u64>();
        let mut s = String::new();
        for n in names {
            s.push_str(&format!("{n} {}\n", count(n)));
        }
        for (n, v) in counts.iter().filter(|(n, v)| n.starts_with("bit[") && *v > 0) {
            s.push_str(&format!("{unnamed}_{n} {v}\n"));
        }
        s.push_str(&format!("{total} {}\n", counts.iter().map(|(_, v)| v).sum::<u64>()));
        s
    }
}

/// `pci_speed_string()` of PCIe generation `gen` (1..=6): `"32.0 GT/s PCIe"`.
pub fn speed_text(generation: u8) -> &'static str {
    match generation {
        1 => "2.5 GT/s PCIe",
        2 => "5.0 GT/s PCIe",
        3 => "8.0 GT/s PCIe",
        4 => "16.0 GT/s PCIe",
        5 => "32.0 GT/s PCIe",
        6 => "64.0 GT/s PCIe",
        _ => "Unknown",
    }
}

/// The link files and quiet AER files of a new PCI function directory: Gen5 x16.
pub(crate) fn write_function(dir: &Path) {
    write_link(dir, "current", Some((16, 5)));
    write_link(dir, "max", Some((16, 5)));
    for f in AerFile::ALL {
        write(&dir.join(f.name()), f.text(&[]));
    }
}

/// `<which>_link_width` and `<which>_link_speed`; `None` is a link that is down
/// (`0`, `Unknown`).
fn write_link(dir: &Path, which: &str, link: Option<(u8, u8)>) {
    let (width, speed) = match link {
        Some((w, g)) => (w.to_string(), speed_text(g)),
        None => ("0".to_string(), "Unknown"),
    };
    write(&dir.join(format!("{which}_link_width")), format!("{width}\n"));
    write(&dir.join(format!("{which}_link_speed")), format!("{speed}\n"));
}

fn read_link(dir: &Path, which: &str) -> (u8, u8) {
    let width = fs::read_to_string(dir.join(format!("{which}_link_width"))).unwrap_or_default();
    let speed = fs::read_to_string(dir.join(format!("{which}_link_speed"))).unwrap_or_default();
    let generation = (1..=6).find(|g| speed_text(*g) == speed.trim()).unwrap_or(0);
    (width.trim().parse().unwrap_or(0), generation)
}

impl Node {
    /// The PCI directory (under `sys/`) of each PF of `dev`'s card: a card's functions
    /// share one link.
    fn card_dirs(&self, dev: &str) -> Vec<PathBuf> {
        let info = self.info.get(dev).unwrap_or_else(|| panic!("no device {dev} on node {}", self.name));
        let card = info.bdf.rsplit_once('.').map(|(c, _)| c.to_string()).unwrap_or_default();
        self.info
            .values()
            .filter(|i| !i.is_vf && i.bdf.rsplit_once('.').is_some_and(|(c, _)| c == card))
            .map(|i| self.sys().join(&i.pci_dir))
            .collect()
    }

    /// The directory of the bridge port at the other end of `dev`'s link.
    pub fn upstream_port_dir(&self, dev: &str) -> PathBuf {
        let info = self.info.get(dev).unwrap_or_else(|| panic!("no device {dev} on node {}", self.name));
        self.sys().join(&info.pci_dir).parent().expect("a PCI function has a parent").to_path_buf()
    }

    /// `dev`'s card trains at `width` lanes and PCIe generation `generation` (both ends of
    /// its link show it); `None`: the link is down (`Unknown`, `0`).
    pub fn set_pcie_link(&self, dev: &str, link: Option<(u8, u8)>) {
        for d in self.card_dirs(dev) {
            write_link(&d, "current", link);
        }
        write_link(&self.upstream_port_dir(dev), "current", link);
    }

    /// `dev`'s card sits in a slot that can do `width` lanes at generation `generation`
    /// (the upstream port's maximum): the link trains at what both ends can do.
    pub fn set_slot_capability(&self, dev: &str, width: u8, generation: u8) {
        let up = self.upstream_port_dir(dev);
        write_link(&up, "max", Some((width, generation)));
        let (card_w, card_g) = read_link(&self.card_dirs(dev)[0], "max");
        self.set_pcie_link(dev, Some((card_w.min(width), card_g.min(generation))));
    }

    /// The current link figures of `dev`: `(width, generation)` (0 when down).
    pub fn pcie_link(&self, dev: &str) -> (u8, u8) {
        read_link(&self.card_dirs(dev)[0], "current")
    }

    /// Write `dev`'s AER file with these counts (`[("BadTLP", 3)]`; other bits 0).
    pub fn set_aer(&self, dev: &str, file: AerFile, counts: &[(&str, u64)]) {
        let info = self.info.get(dev).unwrap_or_else(|| panic!("no device {dev} on node {}", self.name));
        write(&self.sys().join(&info.pci_dir).join(file.name()), file.text(counts));
    }

    /// `dev` has no AER statistics (a kernel without AER, firmware-first error handling).
    pub fn remove_aer(&self, dev: &str) {
        let info = self.info.get(dev).unwrap_or_else(|| panic!("no device {dev} on node {}", self.name));
        for f in AerFile::ALL {
            let _ = fs::remove_file(self.sys().join(&info.pci_dir).join(f.name()));
        }
    }

    /// No PCI function of the node has AER statistics (the kernel was built without AER).
    pub fn without_aer(&self) {
        for name in self.info.keys() {
            self.remove_aer(name);
        }
        let mut dirs = vec![self.sys().join("devices")];
        while let Some(d) = dirs.pop() {
            for e in fs::read_dir(&d).into_iter().flatten().flatten() {
                let p = e.path();
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    dirs.push(p);
                } else if AerFile::ALL.iter().any(|f| p.file_name().is_some_and(|n| n == f.name())) {
                    let _ = fs::remove_file(p);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aer_text_as_the_kernel_prints_it() {
        let t = AerFile::Correctable.text(&[("BadTLP", 3), ("bit[1]", 2)]);
        assert!(t.starts_with("RxErr 0\nBadTLP 3\n"), "{t}");
        assert!(t.contains("dev_cor_errs_bit[1] 2\n"), "{t}");
        assert!(t.ends_with("TOTAL_ERR_COR 5\n"), "{t}");
        assert!(AerFile::Fatal.text(&[]).ends_with("TOTAL_ERR_FATAL 0\n"));
    }
}
