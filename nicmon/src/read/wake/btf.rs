//! Kernel BTF, kept small: an fentry program needs only the BTF id of the function it
//! attaches to. aya parses the whole of `/sys/kernel/btf/vmlinux` for that (~18 MiB of heap
//! for a 5 MiB file); here the raw file is streamed through a small buffer, twice (its
//! string section for where the wanted names start, then its type section for the `FUNC`s
//! with those names), and aya is handed a stand-in BTF in which those functions sit at
//! their kernel ids and every other slot is an anonymous pointer (72 bytes a type, up to
//! the largest wanted id, instead of a full parse).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};

use aya::Btf;
use aya_obj::btf::{BtfType, Func, FuncLinkage, Ptr};

/// Why a BTF blob cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    #[error("reading the BTF blob: {0}")]
    Io(#[from] std::io::Error),
    #[error("not little-endian BTF (magic {0:x?})")]
    Magic(Option<u16>),
    #[error("BTF header truncated ({0} bytes)")]
    HeaderTruncated(usize),
    #[error("BTF {what} section (offset {off}, {len} bytes) outside the {size} byte blob")]
    SectionOutside { what: &'static str, off: u32, len: u32, size: u64 },
    #[error("type {id} truncated at byte {at}: {error}")]
    TypeRead { id: u32, at: u64, error: std::io::Error },
    #[error("type {id}: unknown BTF kind {kind}")]
    UnknownKind { id: u32, kind: u32 },
    #[error("type {id} truncated at byte {at}")]
    TypeTruncated { id: u32, at: u64 },
    #[error("too many types")]
    TooManyTypes,
    #[error("stand-in BTF: type {0} landed at another id")]
    StandInId(u32),
}

const MAGIC: u16 = 0xeb9f;
const HEADER_LEN: usize = 24;
const KIND_FUNC: u32 = 12;
/// Read buffer for the streamed sections.
const CHUNK: usize = 64 * 1024;

/// The BTF ids of the `FUNC` types named in `wanted`, from a raw BTF blob (the contents of
/// `/sys/kernel/btf/vmlinux`), read in chunks from `blob`. Names not in the blob are absent
/// from the map. A name is found where its string starts (BTF string tables hold each
/// string once, and names point at their start).
pub fn func_ids(mut blob: impl Read + Seek, wanted: &[&str]) -> Result<HashMap<String, u32>, BtfError> {
    let io = BtfError::Io;
    let size = blob.seek(SeekFrom::End(0)).map_err(io)?;
    let mut head = [0u8; HEADER_LEN];
    blob.seek(SeekFrom::Start(0)).map_err(io)?;
    let got = read_up_to(&mut blob, &mut head).map_err(io)?;
    let header = Header::read(&head[..got])?;
    let (str_at, str_len) = header.section(size, header.str_off, header.str_len, "string")?;
    let (type_at, type_len) = header.section(size, header.type_off, header.type_len, "type")?;

    // 1. Where each wanted name starts in the string section.
    blob.seek(SeekFrom::Start(str_at)).map_err(io)?;
    let names = name_offsets(BufReader::with_capacity(CHUNK, (&mut blob).take(str_len)), wanted).map_err(io)?;
    if names.is_empty() {
        return Ok(HashMap::new());
    }

    // 2. The FUNC types whose name is one of those.
    blob.seek(SeekFrom::Start(type_at)).map_err(io)?;
    let mut types = BufReader::with_capacity(CHUNK, (&mut blob).take(type_len));
    let mut found = HashMap::new();
    let mut at = 0u64;
    let mut id = 1u32; // id 0 is `void`, never encoded
    while at < type_len {
        let mut rec = [0u8; 12];
        types.read_exact(&mut rec).map_err(|error| BtfError::TypeRead { id, at, error })?;
        let word = |i: usize| u32::from_le_bytes([rec[4 * i], rec[4 * i + 1], rec[4 * i + 2], rec[4 * i + 3]]);
        let (name_off, info) = (word(0), word(1));
        let kind = (info >> 24) & 0x1f;
        let vlen = u64::from(info & 0xffff);
        let extra = match kind {
            1 | 14 | 17 => 4,             // INT, VAR, DECL_TAG: one u32
            3 => 12,                      // ARRAY: struct btf_array
            4 | 5 | 15 | 19 => vlen * 12, // STRUCT, UNION, DATASEC, ENUM64
            6 | 13 => vlen * 8,           // ENUM, FUNC_PROTO
            2 | 7..=12 | 16 | 18 => 0,
            other => return Err(BtfError::UnknownKind { id, kind: other }),
        };
        if kind == KIND_FUNC
            && let Some(w) = names.get(&name_off)
        {
            found.entry((*w).to_string()).or_insert(id);
        }
        let skipped = std::io::copy(&mut (&mut types).take(extra), &mut std::io::sink()).map_err(io)?;
        if skipped < extra {
            return Err(BtfError::TypeTruncated { id, at });
        }
        at += 12 + extra;
        id = id.checked_add(1).ok_or(BtfError::TooManyTypes)?;
    }
    Ok(found)
}

/// `string offset → wanted name` for every string in `strings` (a string section) that is
/// one of `wanted`. Holds at most one name's bytes at a time.
fn name_offsets<'w>(mut strings: impl BufRead, wanted: &[&'w str]) -> std::io::Result<HashMap<u32, &'w str>> {
    let longest = wanted.iter().map(|w| w.len()).max().unwrap_or(0);
    let mut found = HashMap::new();
    let mut current = Vec::with_capacity(longest);
    let (mut pos, mut start, mut too_long) = (0u64, 0u64, false);
    loop {
        let buf = strings.fill_buf()?;
        if buf.is_empty() {
            return Ok(found);
        }
        for &b in buf {
            if b == 0 {
                if !too_long
                    && let Some(w) = wanted.iter().find(|w| w.as_bytes() == current)
                    && let Ok(off) = u32::try_from(start)
                {
                    found.entry(off).or_insert(*w);
                }
                current.clear();
                too_long = false;
                start = pos + 1;
            } else if current.len() < longest {
                current.push(b);
            } else {
                too_long = true;
            }
            pos += 1;
        }
        let n = buf.len();
        strings.consume(n);
    }
}

/// Reads until `buf` is full or the input ends; the bytes read.
fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// A BTF that aya resolves `FUNC` names against: each function at its kernel id, every
/// other slot up to the largest id an anonymous pointer.
pub fn stand_in(ids: &HashMap<String, u32>) -> Result<Btf, BtfError> {
    let max = ids.values().copied().max().unwrap_or(0);
    let mut btf = Btf::new();
    let mut at_id = HashMap::new();
    for (name, id) in ids {
        at_id.insert(*id, btf.add_string(name));
    }
    for id in 1..=max {
        let ty = match at_id.get(&id) {
            Some(name) => BtfType::Func(Func::new(*name, 0, FuncLinkage::Static)),
            None => BtfType::Ptr(Ptr::new(0, 0)),
        };
        if btf.add_type(ty) != id {
            return Err(BtfError::StandInId(id));
        }
    }
    Ok(btf)
}

struct Header {
    hdr_len: usize,
    type_off: u32,
    type_len: u32,
    str_off: u32,
    str_len: u32,
}

impl Header {
    fn read(raw: &[u8]) -> Result<Header, BtfError> {
        let u32_at = |i: usize| raw.get(i..i + 4).map(|b| u32::from_le_bytes(b.try_into().expect("four bytes")));
        let magic = raw.get(0..2).map(|b| u16::from_le_bytes([b[0], b[1]]));
        if magic != Some(MAGIC) {
            return Err(BtfError::Magic(magic));
        }
        let field = |i| u32_at(i).ok_or(BtfError::HeaderTruncated(raw.len()));
        Ok(Header {
            hdr_len: field(4)? as usize,
            type_off: field(8)?,
            type_len: field(12)?,
            str_off: field(16)?,
            str_len: field(20)?,
        })
    }

    /// `(file offset, length)` of a section, checked to lie inside a blob of `size` bytes.
    fn section(&self, size: u64, off: u32, len: u32, what: &'static str) -> Result<(u64, u64), BtfError> {
        let start = self.hdr_len as u64 + u64::from(off);
        let end = start + u64::from(len);
        if end > size {
            return Err(BtfError::SectionOutside { what, off, len, size });
        }
        Ok((start, u64::from(len)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aya_obj::btf::BtfKind;
    use proptest::prelude::*;
    use std::io::Cursor;

    /// A blob with one type of every size class, then `FUNC`s named `f` and `g`.
    fn blob() -> Vec<u8> {
        let strings = b"\0int\0s\0a\0f\0g\0".to_vec();
        let mut t: Vec<u32> = Vec::new();
        t.extend([1, 1 << 24, 4, 32]); // 1 INT "int"
        t.extend([5, (4 << 24) | 2, 8, 7, 1, 0, 7, 1, 32]); // 2 STRUCT "s" { a, a }
        t.extend([0, (13 << 24) | 1, 1, 0, 1]); // 3 FUNC_PROTO (int)
        t.extend([0, 3 << 24, 0, 1, 1, 4]); // 4 ARRAY
        t.extend([9, KIND_FUNC << 24, 3]); // 5 FUNC "f"
        t.extend([0, (6 << 24) | 1, 4, 7, 0]); // 6 ENUM
        t.extend([11, KIND_FUNC << 24, 3]); // 7 FUNC "g"
        let types: Vec<u8> = t.iter().flat_map(|w| w.to_le_bytes()).collect();
        let mut b = vec![0x9f, 0xeb, 1, 0];
        for w in [24u32, 0, types.len() as u32, types.len() as u32, strings.len() as u32] {
            b.extend(w.to_le_bytes());
        }
        b.extend(types);
        b.extend(strings);
        b
    }

    #[test]
    fn finds_functions_by_name_across_every_size_class() {
        let ids = func_ids(Cursor::new(blob()), &["f", "g", "missing", "int"]).unwrap();
        assert_eq!(ids, HashMap::from([("f".into(), 5), ("g".into(), 7)]));
        // aya's own parse of the same blob agrees.
        let full = Btf::parse(&blob(), Default::default()).unwrap();
        assert_eq!(full.id_by_type_name_kind("g", BtfKind::Func).unwrap(), 7);
    }

    #[test]
    fn stand_in_resolves_each_function_to_its_kernel_id() {
        let ids = HashMap::from([("f".to_string(), 5), ("netif_carrier_off".to_string(), 90_000)]);
        let btf = stand_in(&ids).unwrap();
        assert_eq!(btf.id_by_type_name_kind("f", BtfKind::Func).unwrap(), 5);
        assert_eq!(btf.id_by_type_name_kind("netif_carrier_off", BtfKind::Func).unwrap(), 90_000);
        assert!(btf.id_by_type_name_kind("g", BtfKind::Func).is_err());
    }

    /// On a kernel with BTF: the scan and the stand-in give exactly aya's full-parse ids.
    #[test]
    fn matches_a_full_parse_of_this_kernel() {
        let Ok(raw) = std::fs::read("/sys/kernel/btf/vmlinux") else {
            eprintln!("SKIP: no /sys/kernel/btf/vmlinux on this kernel");
            return;
        };
        let names = ["netif_carrier_off", "netif_carrier_on", "netif_carrier_event", "linkwatch_fire_event"];
        // Streamed from the file itself, as the agent reads it.
        let ids = func_ids(std::fs::File::open("/sys/kernel/btf/vmlinux").unwrap(), &names).unwrap();
        assert_eq!(func_ids(Cursor::new(&raw), &names).unwrap(), ids);
        let full = Btf::parse(&raw, Default::default()).unwrap();
        let small = stand_in(&ids).unwrap();
        for n in names {
            let want = full.id_by_type_name_kind(n, BtfKind::Func).ok();
            assert_eq!(ids.get(n).copied(), want, "{n}");
            if let Some(id) = want {
                assert_eq!(small.id_by_type_name_kind(n, BtfKind::Func).unwrap(), id, "{n}");
            }
        }
        assert!(!ids.is_empty(), "no carrier function in this kernel's BTF");
    }

    #[test]
    fn rejects_what_is_not_btf() {
        assert!(func_ids(Cursor::new(b""), &["f"]).unwrap_err().to_string().contains("magic"));
        let mut b = blob();
        b.truncate(40);
        assert!(func_ids(Cursor::new(&b), &["f"]).unwrap_err().to_string().contains("outside"));
        let mut b = blob();
        b[24 + 7] = 31; // kind of type 1
        assert!(func_ids(Cursor::new(&b), &["f"]).unwrap_err().to_string().contains("unknown BTF kind 31"));
    }

    proptest! {
        #[test]
        fn never_panics_on_garbage(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = func_ids(Cursor::new(&bytes), &["f"]);
        }

        #[test]
        fn never_panics_on_a_damaged_blob(at in 0usize..136, byte in any::<u8>(), cut in 0usize..140) {
            let mut b = blob();
            let i = at % b.len();
            b[i] = byte;
            b.truncate(cut.max(1));
            let _ = func_ids(Cursor::new(&b), &["f", "g"]);
        }
    }
}
