//! tracefs: where it is (mounting it when it is not), and the layout of tracepoint
//! records as the running kernel describes it in `events/<system>/<event>/format`.
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// The standard mount points, in the order the kernel documentation prefers them.
pub const MOUNT_POINTS: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

/// Why no tracefs could be found: each says what was tried.
#[derive(Debug, thiserror::Error)]
pub enum TracefsError {
    #[error(
        "tracefs not mounted (looked at {}); mount it with `mount -t tracefs nodev /sys/kernel/tracing`",
        MOUNT_POINTS.join(", ")
    )]
    NotMounted,
    #[error("mounted tracefs at {} but it has no events/", MOUNT_POINTS[0])]
    NoEvents,
    #[error("tracefs not mounted and mounting it at {at} failed: {error}", at = MOUNT_POINTS[0])]
    MountFailed { error: io::Error },
}

/// Finds a mounted tracefs (a mount point with an `events` directory). With `mount`,
/// mounts one at `/sys/kernel/tracing` when none is found. The error says what was tried.
pub fn locate(mount: bool) -> Result<PathBuf, TracefsError> {
    if let Some(found) = find() {
        return Ok(found);
    }
    if !mount {
        return Err(TracefsError::NotMounted);
    }
    match mount_tracefs(Path::new(MOUNT_POINTS[0])) {
        Ok(()) => find().ok_or(TracefsError::NoEvents),
        Err(error) => Err(TracefsError::MountFailed { error }),
    }
}

fn find() -> Option<PathBuf> {
    MOUNT_POINTS.iter().map(PathBuf::from).find(|p| p.join("events").is_dir())
}

fn mount_tracefs(at: &Path) -> io::Result<()> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let target = CString::new(at.as_os_str().as_bytes())?;
    // SAFETY: NUL-terminated strings that outlive the call; no data argument.
    let rc = unsafe { libc::mount(c"nodev".as_ptr(), target.as_ptr(), c"tracefs".as_ptr(), 0, std::ptr::null()) };
    if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// The directory of one tracepoint under a tracefs mount.
pub fn event_dir(tracefs: &Path, system: &str, event: &str) -> PathBuf {
    tracefs.join("events").join(system).join(event)
}

/// Offset in the record of the `__data_loc char[] <field>` field of a tracepoint, read
/// from its `format` file. `None` when the file cannot be read or has no such field.
pub fn data_loc_offset(tracefs: &Path, system: &str, event: &str, field: &str) -> Option<u32> {
    let text = fs::read_to_string(event_dir(tracefs, system, event).join("format")).ok()?;
    parse_data_loc_offset(&text, field)
}

/// Parses a tracepoint `format` file for the offset of `__data_loc char[] <field>`.
///
/// A line looks like
/// `\tfield:__data_loc char[] dev;\toffset:8;\tsize:4;\tsigned:0;`. Only `__data_loc`
/// strings qualify (a `__rel_loc` field is relative to itself and is not supported): the
/// kernel program decodes the 32-bit location as `offset | len << 16` from the record
/// start.
pub fn parse_data_loc_offset(format: &str, field: &str) -> Option<u32> {
    for line in format.lines() {
        let mut decl = None;
        let mut offset = None;
        let mut size = None;
        for part in line.split(';') {
            let part = part.trim();
            if let Some(d) = part.strip_prefix("field:") {
                decl = Some(d.trim());
            } else if let Some(o) = part.strip_prefix("offset:") {
                offset = o.trim().parse::<u32>().ok();
            } else if let Some(s) = part.strip_prefix("size:") {
                size = s.trim().parse::<u32>().ok();
            }
        }
        let (Some(decl), Some(offset), Some(4)) = (decl, offset, size) else {
            continue;
        };
        let Some(rest) = decl.strip_prefix("__data_loc ") else {
            continue;
        };
        let name = rest.rsplit(|c: char| c.is_whitespace()).next().unwrap_or("");
        if name == field && rest.trim_start().starts_with("char") && offset != 0 {
            return Some(offset);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    // From kernel 6.18, /sys/kernel/tracing/events/qdisc/qdisc_reset/format.
    const QDISC_RESET: &str = "name: qdisc_reset
ID: 1514
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:__data_loc char[] dev;\toffset:8;\tsize:4;\tsigned:0;
\tfield:__data_loc char[] kind;\toffset:12;\tsize:4;\tsigned:0;
\tfield:u32 parent;\toffset:16;\tsize:4;\tsigned:0;
\tfield:u32 handle;\toffset:20;\tsize:4;\tsigned:0;

print fmt: \"dev=%s kind=%s parent=%x:%x handle=%x:%x\", __get_str(dev), __get_str(kind)
";

    #[test]
    fn finds_data_loc_fields_by_name() {
        assert_eq!(parse_data_loc_offset(QDISC_RESET, "dev"), Some(8));
        assert_eq!(parse_data_loc_offset(QDISC_RESET, "kind"), Some(12));
    }

    #[test]
    fn ignores_non_string_and_missing_fields() {
        assert_eq!(parse_data_loc_offset(QDISC_RESET, "parent"), None);
        assert_eq!(parse_data_loc_offset(QDISC_RESET, "dev_name"), None);
        assert_eq!(parse_data_loc_offset("", "dev"), None);
        assert_eq!(parse_data_loc_offset("garbage;;offset:x;", "dev"), None);
    }

    #[test]
    fn rel_loc_is_not_taken_for_data_loc() {
        let f = "\tfield:__rel_loc char[] dev;\toffset:8;\tsize:4;\tsigned:0;\n";
        assert_eq!(parse_data_loc_offset(f, "dev"), None);
    }
}
