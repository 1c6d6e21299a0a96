//! A port's transceiver memory through ethtool netlink (SPEC §1.13):
//! `ETHTOOL_MSG_MODULE_EEPROM_GET` (kernel 5.13+, `net/ethtool/eeprom.c`) with the request
//! header (the netdev's name), `OFFSET`, `LENGTH`, `PAGE`, `BANK` and `I2C_ADDRESS` (0x50);
//! the reply's `DATA`. The kernel allows at most 128 bytes a request, never across offset
//! 128, and of pages other than 0 only the upper half (others are `EINVAL`). A driver without
//! `get_module_eeprom_by_page` falls back to the legacy `get_module_info`/`get_module_eeprom`;
//! one with neither (veth; mlx5's IPoIB netdevs, whose `mlx5i_ethtool_ops` have no module
//! operation) answers `EOPNOTSUPP`: not supported, a property of the netdev.
//!
//! What is read: page 0 (lower and upper half), then what page 0 says
//! ([`crate::model::module::pages_to_read`]): SFF-8636 page 03h, CMIS pages 01h, 02h and
//! 11h, bank 0. mlx5 answers each request with an MCIA firmware command, so the reads are
//! paced ([`super::modules`]). A page beyond 0 that fails is left out (its fields are then
//! unknown, as ethtool does for a missing page 03h); a page 0 that fails fails the read.
//! The encoder and parser are pure and never panic.
use std::collections::BTreeMap;

use super::netlink::{EthtoolSocket, attrs, header_attr, put_attr};
use crate::model::ethtool::Absent;
use crate::model::module::{Pages, pages_to_read};

/// `ETHTOOL_MSG_MODULE_EEPROM_GET`.
pub const MODULE_EEPROM_GET: u8 = 31;
/// `ETHTOOL_A_MODULE_EEPROM_*`.
const A_OFFSET: u16 = 2;
const A_LENGTH: u16 = 3;
const A_PAGE: u16 = 4;
const A_BANK: u16 = 5;
const A_I2C_ADDRESS: u16 = 6;
const A_DATA: u16 = 7;
/// The module's management interface (SFF-8636 and CMIS: 0x50, "A0h").
pub const I2C_ADDRESS: u8 = 0x50;
/// One request: half a page.
pub const HALF: u32 = 128;

/// The attributes of a request for half page `page` (bank 0) at `offset` (0 or 128).
pub fn request(netdev: &str, page: u8, offset: u32) -> Vec<u8> {
    let mut out = header_attr(netdev);
    put_attr(&mut out, A_OFFSET, &offset.to_ne_bytes());
    put_attr(&mut out, A_LENGTH, &HALF.to_ne_bytes());
    put_attr(&mut out, A_PAGE, &[page]);
    put_attr(&mut out, A_BANK, &[0]);
    put_attr(&mut out, A_I2C_ADDRESS, &[I2C_ADDRESS]);
    out
}

/// The reply's data: `Some` only when it is the whole half page asked for.
pub fn parse_data(reply: &[u8]) -> Option<Vec<u8>> {
    attrs(reply).find(|(k, _)| *k == A_DATA).map(|(_, v)| v.to_vec()).filter(|d| d.len() == HALF as usize)
}

/// What answers one half-page request: the kernel, or a stand-in in tests.
pub trait Eeprom {
    /// Half page `page` at `offset` (0 or 128), 128 bytes.
    fn half(&mut self, page: u8, offset: u32) -> Result<Vec<u8>, Absent>;
}

/// The kernel, through an ethtool socket, for one netdev.
pub struct Kernel<'a> {
    pub socket: &'a mut EthtoolSocket,
    pub netdev: &'a str,
}

impl Eeprom for Kernel<'_> {
    fn half(&mut self, page: u8, offset: u32) -> Result<Vec<u8>, Absent> {
        let what = format!("{} module page {page:#04x}", self.netdev);
        let reply = self.socket.call(MODULE_EEPROM_GET, &request(self.netdev, page, offset), &what)?;
        parse_data(&reply).ok_or_else(|| Absent::Failed(format!("{what}: no {HALF} bytes of data in the answer")))
    }
}

/// The module's pages: page 0, then the pages it says it has (module doc).
pub fn read_pages(e: &mut impl Eeprom) -> Result<Pages, Absent> {
    let mut page0 = e.half(0, 0)?;
    page0.extend(e.half(0, HALF)?);
    let more = pages_to_read(&page0);
    let mut pages = BTreeMap::from([(0, page0)]);
    for p in more {
        if let Ok(bytes) = e.half(p, HALF) {
            pages.insert(p, bytes);
        }
    }
    Ok(Pages(pages))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_request_carries_the_header_the_half_page_and_the_address() {
        let a = request("eth0", 0x11, 128);
        let got: Vec<(u16, Vec<u8>)> = attrs(&a).map(|(k, v)| (k, v.to_vec())).collect();
        assert_eq!(got.len(), 6);
        assert_eq!(got[0].0, 1, "ETHTOOL_A_MODULE_EEPROM_HEADER");
        let header: Vec<(u16, &[u8])> = attrs(&got[0].1).collect();
        assert_eq!(header, [(2, &b"eth0\0"[..])], "ETHTOOL_A_HEADER_DEV_NAME, no flags");
        assert_eq!(got[1], (A_OFFSET, 128u32.to_ne_bytes().to_vec()));
        assert_eq!(got[2], (A_LENGTH, 128u32.to_ne_bytes().to_vec()));
        assert_eq!(got[3], (A_PAGE, vec![0x11]));
        assert_eq!(got[4], (A_BANK, vec![0]));
        assert_eq!(got[5], (A_I2C_ADDRESS, vec![0x50]));
    }

    #[test]
    fn the_data_is_the_whole_half_page_or_nothing() {
        let mut reply = header_attr("eth0");
        put_attr(&mut reply, A_DATA, &[7u8; 128]);
        assert_eq!(parse_data(&reply), Some(vec![7u8; 128]));
        let mut short = Vec::new();
        put_attr(&mut short, A_DATA, &[7u8; 100]);
        assert_eq!(parse_data(&short), None);
        assert_eq!(parse_data(&[]), None);
    }

    /// A module answering from `pages` (by page, 256 bytes each: the half asked for), failing
    /// the pages in `broken`; the requests it saw.
    struct Fake {
        pages: BTreeMap<u8, Vec<u8>>,
        broken: Vec<u8>,
        asked: Vec<(u8, u32)>,
    }

    impl Eeprom for Fake {
        fn half(&mut self, page: u8, offset: u32) -> Result<Vec<u8>, Absent> {
            self.asked.push((page, offset));
            if self.broken.contains(&page) {
                return Err(Absent::Failed(format!("page {page}: Input/output error")));
            }
            let p = self.pages.get(&page).ok_or_else(|| Absent::Failed("EINVAL".into()))?;
            Ok(p[offset as usize..offset as usize + 128].to_vec())
        }
    }

    fn cmis_module() -> Fake {
        let mut p0 = vec![0u8; 256];
        p0[0] = 0x18;
        p0[200] = 0xAB;
        let pages = [(0, p0), (1, vec![1u8; 256]), (2, vec![2u8; 256]), (0x11, vec![0x11u8; 256])];
        Fake { pages: pages.into(), broken: Vec::new(), asked: Vec::new() }
    }

    #[test]
    fn page_0_then_the_pages_it_names() {
        let mut m = cmis_module();
        let pages = read_pages(&mut m).unwrap();
        assert_eq!(m.asked, [(0, 0), (0, 128), (1, 128), (2, 128), (0x11, 128)]);
        assert_eq!(pages.0.keys().copied().collect::<Vec<_>>(), [0, 1, 2, 0x11]);
        assert_eq!((pages.0[&0].len(), pages.0[&0][200], pages.0[&0x11].len()), (256, 0xAB, 128));
        assert!(pages.0[&0x11].iter().all(|&b| b == 0x11), "the upper half of page 11h");
        // A page beyond 0 that fails is left out; page 0 failing fails the read.
        let mut m = cmis_module();
        m.broken = vec![2];
        assert_eq!(read_pages(&mut m).unwrap().0.keys().copied().collect::<Vec<_>>(), [0, 1, 0x11]);
        let mut m = cmis_module();
        m.broken = vec![0];
        assert!(matches!(read_pages(&mut m), Err(Absent::Failed(_))));
        assert_eq!(m.asked, [(0, 0)], "nothing more is asked");
    }

    #[test]
    fn an_sff8636_module_is_read_with_page_3_and_a_flat_one_alone() {
        let mut p0 = vec![0u8; 256];
        p0[0] = 0x11;
        let mut m =
            Fake { pages: [(0, p0.clone()), (3, vec![3u8; 256])].into(), broken: Vec::new(), asked: Vec::new() };
        read_pages(&mut m).unwrap();
        assert_eq!(m.asked, [(0, 0), (0, 128), (3, 128)]);
        p0[2] = 0x04;
        let mut m = Fake { pages: [(0, p0)].into(), broken: Vec::new(), asked: Vec::new() };
        assert_eq!(read_pages(&mut m).unwrap().0.len(), 1);
        assert_eq!(m.asked.len(), 2);
    }

    proptest! {
        #[test]
        fn the_parser_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = parse_data(&bytes);
        }
    }
}
