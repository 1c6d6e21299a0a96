//! Kernel log records: the `/dev/kmsg` record format and plain text lines.
//!
//! `/dev/kmsg` (`Documentation/ABI/testing/dev-kmsg`) hands out one record per `read()`:
//! `prio,seq,ts_usec,flags[,more];text\n`, then optional continuation lines that begin
//! with a space (` SUBSYSTEM=pci`, ` DEVICE=+pci:0000:3b:00.0`, ` DEVICE=n7`). Bytes that
//! are not printable ASCII (and `\` itself) arrive as `\xNN`.
//!
//! `nicmon check --kmsg FILE` accepts either that format or plain text (one message per
//! line, as `dmesg` or `journalctl -k` print it); [`parse_text`] decides per line.
//! Everything here is pure and total: any byte string parses to something, nothing panics.
//! Also the host facts a line's attribution needs beside the snapshot ([`HostLinks`]).
use std::collections::BTreeMap;

/// The device a record's ` DEVICE=` continuation line names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceRef {
    /// `+pci:0000:3b:00.0` (any `+<subsystem>:<name>`; `subsystem` kept as printed).
    Named { subsystem: String, name: String },
    /// `n7`: a network interface by ifindex.
    Netdev(u32),
    /// `b8:0`, `c4:1` or anything else: kept, never used for attribution.
    Other(String),
}

impl DeviceRef {
    fn parse(v: &str) -> DeviceRef {
        if let Some(rest) = v.strip_prefix('+')
            && let Some((subsystem, name)) = rest.split_once(':')
        {
            return DeviceRef::Named { subsystem: subsystem.to_string(), name: name.to_string() };
        }
        if let Some(n) = v.strip_prefix('n')
            && let Ok(ifindex) = n.parse()
        {
            return DeviceRef::Netdev(ifindex);
        }
        DeviceRef::Other(v.to_string())
    }

    /// The PCI address when the record names a PCI device.
    pub fn pci(&self) -> Option<&str> {
        match self {
            DeviceRef::Named { subsystem, name } if subsystem == "pci" => Some(name),
            _ => None,
        }
    }
}

/// One kernel log message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The syslog prefix value (`facility << 3 | level`); `None` for plain text lines.
    pub prio: Option<u32>,
    /// The kernel's sequence number; `None` for plain text lines (never part of the cursor).
    pub seq: Option<u64>,
    /// Monotonic microseconds since boot (`ts_usec`, or a `dmesg` `[   12.345678]` prefix).
    pub ts_usec: Option<u64>,
    /// The message, `\xNN` escapes decoded (invalid UTF-8 replaced).
    pub text: String,
    /// ` SUBSYSTEM=` continuation value.
    pub subsystem: Option<String>,
    /// ` DEVICE=` continuation value.
    pub device: Option<DeviceRef>,
}

impl Record {
    /// A plain text message (no header, no continuation lines).
    pub fn plain(text: impl Into<String>) -> Record {
        Record { prio: None, seq: None, ts_usec: None, text: text.into(), subsystem: None, device: None }
    }

    /// `prio & 7`: 0 emerg … 7 debug.
    pub fn level(&self) -> Option<u32> {
        self.prio.map(|p| p & 7)
    }
}

/// Parse one `/dev/kmsg` record (what one `read()` returns). A buffer without a valid
/// header becomes a plain text record, so a record is never lost to a parse error.
pub fn parse_record(buf: &[u8]) -> Record {
    let mut lines = buf.split(|&b| b == b'\n');
    let first = lines.next().unwrap_or_default();
    let Some(mut rec) = parse_header_line(first) else {
        return plain_line(buf.strip_suffix(b"\n").unwrap_or(buf));
    };
    for line in lines {
        apply_continuation(&mut rec, line);
    }
    rec
}

/// Parse what one `read()` of the kernel log device returned: normally one record, but
/// every record is kept when a read holds several (a record starts at each line that does
/// not begin with a space; those that do are its continuation lines).
pub fn parse_records(buf: &[u8]) -> Vec<Record> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut at = 0;
    for line in buf.split_inclusive(|&b| b == b'\n') {
        if at > start && !line.starts_with(b" ") {
            if buf[start..at].iter().any(|b| !b.is_ascii_whitespace()) {
                out.push(parse_record(&buf[start..at]));
            }
            start = at;
        }
        at += line.len();
    }
    if buf[start..].iter().any(|b| !b.is_ascii_whitespace()) {
        out.push(parse_record(&buf[start..]));
    }
    out
}

/// Parse a file of kernel log text: `/dev/kmsg` records (header line + ` KEY=VALUE`
/// continuation lines) and plain text lines, mixed freely; the format is decided per
/// line. Empty lines are skipped.
pub fn parse_text(buf: &[u8]) -> Vec<Record> {
    let mut out: Vec<Record> = Vec::new();
    // Whether the last record came from a kmsg header (only those take continuations).
    let mut last_is_kmsg = false;
    for raw in buf.split(|&b| b == b'\n') {
        let line = raw.strip_suffix(b"\r").unwrap_or(raw);
        if last_is_kmsg && is_continuation(line) {
            if let Some(rec) = out.last_mut() {
                apply_continuation(rec, line);
            }
            continue;
        }
        if line.iter().all(|b| b.is_ascii_whitespace()) {
            continue;
        }
        match parse_header_line(line) {
            Some(rec) => {
                out.push(rec);
                last_is_kmsg = true;
            }
            None => {
                out.push(plain_line(line));
                last_is_kmsg = false;
            }
        }
    }
    out
}

/// ` KEY=VALUE` with an upper-case key: a continuation line, not an indented message
/// (stack frames in plain text also begin with a space).
fn is_continuation(line: &[u8]) -> bool {
    let Some(rest) = line.strip_prefix(b" ") else {
        return false;
    };
    let key_len = rest.iter().take_while(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || **b == b'_').count();
    key_len > 0 && rest.get(key_len) == Some(&b'=')
}

fn apply_continuation(rec: &mut Record, line: &[u8]) {
    let Some(rest) = line.strip_prefix(b" ") else {
        return;
    };
    let kv = decode_escapes(rest);
    let Some((key, value)) = kv.split_once('=') else {
        return;
    };
    match key {
        "SUBSYSTEM" => rec.subsystem = Some(value.to_string()),
        "DEVICE" => rec.device = Some(DeviceRef::parse(value)),
        _ => {}
    }
}

/// `prio,seq,ts_usec[,flags[,more…]];text`. Fields after the third are ignored.
fn parse_header_line(line: &[u8]) -> Option<Record> {
    let semi = line.iter().position(|&b| b == b';')?;
    let header = std::str::from_utf8(&line[..semi]).ok()?;
    let mut fields = header.split(',');
    let prio: u32 = fields.next()?.parse().ok()?;
    let seq: u64 = fields.next()?.parse().ok()?;
    let ts_usec: u64 = fields.next()?.parse().ok()?;
    Some(Record {
        prio: Some(prio),
        seq: Some(seq),
        ts_usec: Some(ts_usec),
        text: decode_escapes(&line[semi + 1..]),
        subsystem: None,
        device: None,
    })
}

/// A plain text line: an optional `journalctl -k` prefix (`Nov 19 19:26:01 host kernel: `)
/// and an optional `dmesg` timestamp (`[   12.345678] `) are removed; the timestamp is kept.
fn plain_line(line: &[u8]) -> Record {
    let text = decode_escapes(line);
    let mut rest = strip_syslog_prefix(&text);
    let mut ts_usec = None;
    if let Some((ts, after)) = split_dmesg_timestamp(rest) {
        ts_usec = ts;
        rest = after;
    }
    let mut rec = Record::plain(rest);
    rec.ts_usec = ts_usec;
    rec
}

fn strip_syslog_prefix(s: &str) -> &str {
    // `Mmm dd hh:mm:ss host kernel: ` — only when the marker comes after a clock.
    match s.find(" kernel: ") {
        Some(i) if i < 64 && s[..i].matches(':').count() >= 2 => &s[i + " kernel: ".len()..],
        _ => s,
    }
}

/// `[   12.345678] rest` → (12345678 µs, `rest`); `dmesg -T`'s
/// `[Thu Nov 19 19:26:01 2026] rest` → (unknown, `rest`).
fn split_dmesg_timestamp(s: &str) -> Option<(Option<u64>, &str)> {
    let inner_end = s.strip_prefix('[')?.find(']')? + 1;
    let inner = s[1..inner_end].trim();
    if is_human_date(inner) {
        let rest = &s[inner_end + 1..];
        return Some((None, rest.strip_prefix(' ').unwrap_or(rest)));
    }
    let (secs, frac) = inner.split_once('.').unwrap_or((inner, ""));
    if secs.is_empty()
        || !secs.bytes().all(|b| b.is_ascii_digit())
        || !frac.bytes().all(|b| b.is_ascii_digit())
        || frac.len() > 9
    {
        return None;
    }
    let micros = format!("{frac:0<6}");
    let ts = secs
        .parse::<u64>()
        .ok()
        .and_then(|s| s.checked_mul(1_000_000))
        .and_then(|s| s.checked_add(micros[..6].parse::<u64>().ok()?));
    let rest = &s[inner_end + 1..];
    Some((ts, rest.strip_prefix(' ').unwrap_or(rest)))
}

/// `Thu Nov 19 19:26:01 2026`.
fn is_human_date(s: &str) -> bool {
    let w: Vec<&str> = s.split_whitespace().collect();
    w.len() == 5
        && w[3].len() == 8
        && w[3].matches(':').count() == 2
        && w[4].len() == 4
        && w[4].bytes().all(|b| b.is_ascii_digit())
}

/// Decode the kernel's `\xNN` escapes into bytes, then read them as UTF-8 (lossily):
/// the kernel escapes every byte ≥ 0x7f, so multi-byte characters come back whole.
/// A `\x` not followed by two hex digits is kept as written.
pub fn decode_escapes(raw: &[u8]) -> String {
    let mut bytes = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        if raw[i] == b'\\'
            && raw.get(i + 1) == Some(&b'x')
            && let (Some(h), Some(l)) = (raw.get(i + 2).and_then(|b| hex(*b)), raw.get(i + 3).and_then(|b| hex(*b)))
        {
            bytes.push(h << 4 | l);
            i += 4;
            continue;
        }
        bytes.push(raw[i]);
        i += 1;
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

/// Extra host facts the snapshot model does not carry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostLinks {
    /// netdev name → ifindex (`class/net/<if>/ifindex`), for ` DEVICE=n<ifindex>`.
    pub ifindex: BTreeMap<String, u32>,
    /// IB device name → the PCI bridges above it (from its `bus/pci/devices/<BDF>` path),
    /// for AER lines printed by a root or switch port.
    pub bridges: BTreeMap<String, Vec<String>>,
    /// Devices monitored earlier in this boot and absent from the snapshot now (their
    /// driver unloaded after a failure, or the card left the bus): the lines that explain
    /// why (`slot_reset_failed`, `load_failed`, `aer_recovery_failed`) arrive just then.
    pub departed: Vec<Departed>,
}

/// A device the monitor knew earlier in this boot (the state's known devices) that the
/// snapshot no longer has. It counts as monitored: it was, until it went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Departed {
    pub device: String,
    pub pci_address: Option<String>,
    pub card: Option<String>,
}

/// `0000:3b:00.0` → `0000:3b:00`.
pub fn card_of(bdf: &str) -> Option<&str> {
    let (card, func) = bdf.rsplit_once('.')?;
    (func.len() == 1 && card.matches(':').count() == 2).then_some(card)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_a_kmsg_record_with_continuation_lines() {
        let r = parse_record(
            b"3,1234,5678901,-,caller=T12;mlx5_core 0000:3b:00.0: poll_health:801:(pid 0): device's health compromised - reached miss count\n SUBSYSTEM=pci\n DEVICE=+pci:0000:3b:00.0\n",
        );
        assert_eq!(r.prio, Some(3));
        assert_eq!(r.level(), Some(3));
        assert_eq!(r.seq, Some(1234));
        assert_eq!(r.ts_usec, Some(5678901));
        assert!(r.text.starts_with("mlx5_core 0000:3b:00.0: poll_health"));
        assert_eq!(r.subsystem.as_deref(), Some("pci"));
        assert_eq!(r.device.as_ref().and_then(|d| d.pci()), Some("0000:3b:00.0"));
    }

    #[test]
    fn netdev_device_and_unknown_keys() {
        let r = parse_record(
            b"6,9,10,c;mlx5_core 0000:01:00.0 enp1s0f0np0: Link down\n SUBSYSTEM=net\n DEVICE=n7\n FOO=bar\n",
        );
        assert_eq!(r.device, Some(DeviceRef::Netdev(7)));
        assert_eq!(r.subsystem.as_deref(), Some("net"));
        let r = parse_record(b"6,9,10;x\n DEVICE=b8:0\n");
        assert_eq!(r.device, Some(DeviceRef::Other("b8:0".into())));
        assert_eq!(r.text, "x");
    }

    #[test]
    fn escapes_are_decoded() {
        assert_eq!(decode_escapes(br"a\x5cb\x09c"), "a\\b\tc");
        assert_eq!(decode_escapes(br"caf\xc3\xa9"), "café");
        assert_eq!(decode_escapes(br"bad \xZZ \x4"), r"bad \xZZ \x4");
        assert_eq!(decode_escapes(br"\xff"), "\u{fffd}");
    }

    #[test]
    fn a_buffer_without_header_is_plain_text() {
        let r = parse_record(b"hello; world\n");
        assert_eq!(r.seq, None);
        assert_eq!(r.text, "hello; world");
    }

    #[test]
    fn text_files_mix_formats_per_line() {
        let recs = parse_text(
            b"6,1,100,-;first\n DEVICE=+pci:0000:01:00.0\n\
              [   12.500000] mlx5_core 0000:01:00.0: second\n \
              mlx5e_napi_poll+0x12b/0x5c0 [mlx5_core]\n\
              Nov 19 19:26:01 node7 kernel: third\n\
              [Thu Nov 19 19:26:01 2026] dated\n\
              [drm] not a timestamp\n\
              \n\
              6,2,200,-;fourth\r\n",
        );
        let texts: Vec<&str> = recs.iter().map(|r| r.text.as_str()).collect();
        assert_eq!(
            texts,
            [
                "first",
                "mlx5_core 0000:01:00.0: second",
                " mlx5e_napi_poll+0x12b/0x5c0 [mlx5_core]",
                "third",
                "dated",
                "[drm] not a timestamp",
                "fourth"
            ]
        );
        assert_eq!(recs[0].device.as_ref().and_then(|d| d.pci()), Some("0000:01:00.0"));
        assert_eq!(recs[1].ts_usec, Some(12_500_000));
        assert_eq!(recs[1].seq, None);
        assert_eq!(recs[6].seq, Some(2));
    }

    #[test]
    fn a_continuation_after_plain_text_is_text() {
        let recs = parse_text(b"plain\n DEVICE=+pci:0000:01:00.0\n");
        assert_eq!(recs.len(), 2);
        assert_eq!(recs[1].text, " DEVICE=+pci:0000:01:00.0");
    }

    #[test]
    fn a_read_holding_several_records_gives_each() {
        let recs = parse_records(b"3,7,1,-;one\n DEVICE=+pci:0000:01:00.0\n6,8,2,-;two\n\n6,9,3,-;three");
        let seqs: Vec<_> = recs.iter().map(|r| r.seq).collect();
        assert_eq!(seqs, [Some(7), Some(8), Some(9)]);
        assert_eq!(recs[0].device.as_ref().and_then(|d| d.pci()), Some("0000:01:00.0"));
        assert_eq!(recs[1].text, "two");
        assert_eq!(
            parse_records(b"3,7,1,-;only\n SUBSYSTEM=pci\n"),
            vec![parse_record(b"3,7,1,-;only\n SUBSYSTEM=pci\n")]
        );
        assert!(parse_records(b"").is_empty());
        assert!(parse_records(b"\n").is_empty());
    }

    proptest! {
        #[test]
        fn record_parser_is_total(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = parse_record(&bytes);
            let _ = parse_text(&bytes);
            // Every record of a read is kept: no more records than lines.
            let lines = bytes.split(|&b| b == b'\n').count();
            prop_assert!(parse_records(&bytes).len() <= lines);
        }

        #[test]
        fn kmsg_shaped_input_is_total(
            prio in "[0-9]{0,12}", seq in "[0-9]{0,22}", ts in "[0-9]{0,22}",
            text in ".{0,200}", cont in "( [A-Z]{0,8}=.{0,20}\n){0,3}",
        ) {
            let buf = format!("{prio},{seq},{ts},-;{text}\n{cont}");
            let r = parse_record(buf.as_bytes());
            if let (Ok(p), Ok(s), Ok(t)) = (prio.parse::<u32>(), seq.parse::<u64>(), ts.parse::<u64>())
                && !text.contains('\n')
            {
                prop_assert_eq!(r.prio, Some(p));
                prop_assert_eq!(r.seq, Some(s));
                prop_assert_eq!(r.ts_usec, Some(t));
            }
        }

        #[test]
        fn a_read_of_several_records_parses_as_each_alone(
            recs in proptest::collection::vec(("[0-7]", 0u64..1000, "[a-z ;,]{0,30}", "( (SUBSYSTEM|DEVICE)=[a-z0-9:+.]{0,12}\n){0,2}"), 1..6),
        ) {
            let bufs: Vec<String> = recs.iter().map(|(p, s, t, c)| format!("{p},{s},1,-;{t}\n{c}")).collect();
            let alone: Vec<Record> = bufs.iter().map(|b| parse_record(b.as_bytes())).collect();
            prop_assert_eq!(parse_records(bufs.concat().as_bytes()), alone);
        }

        #[test]
        fn dmesg_timestamps_never_panic(s in r"\[[ 0-9.]{0,30}\].{0,20}") {
            let _ = parse_text(s.as_bytes());
        }
    }
}
