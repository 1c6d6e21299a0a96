//! NVSentinel's command-line conventions, so that its charts can start nicmon unchanged
//! (SPEC §1.9 "Drop-in by image swap", `reference/nvsentinel-upstream.md` §1).
//!
//! Upstream's monitor is a Go program: its chart passes flags only (no subcommand), with
//! Go's value syntax (`--poll-stall-deadline=10s`, `--poll-stall-store-only=true`), and older
//! charts pass flags the current code no longer has ([`RETIRED_FLAGS`], declared here only).
//! Everything here is a pure function of the arguments; none panics on any input (proptests
//! below).
use std::ffi::OsString;
use std::time::Duration;

/// A flag of earlier released upstream charts (the Kata-era DaemonSets `-regular`/`-kata`)
/// that nicmon accepts and ignores, with a warning. Current upstream code has none of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetiredFlag {
    /// As given on the command line: `--counter-polling-interval`.
    pub flag: &'static str,
    /// The kind of value the chart passes with it.
    pub value_name: &'static str,
    /// The value may be left out (a Go boolean flag alone means true).
    pub value_optional: bool,
    /// Why it changes nothing now.
    pub why: &'static str,
}

/// The retired flags: the command line takes exactly these ([`RetiredFlags`]).
pub const RETIRED_FLAGS: &[RetiredFlag] = &[
    RetiredFlag {
        flag: "--counter-polling-interval",
        value_name: "DURATION",
        value_optional: false,
        why: "counters are evaluated at least every second",
    },
    RetiredFlag {
        flag: "--kata-enabled",
        value_name: "BOOL",
        value_optional: true,
        why: "the same DaemonSet serves Kata and regular nodes",
    },
];

impl RetiredFlag {
    fn long(&self) -> &'static str {
        self.flag.trim_start_matches('-')
    }

    fn arg(&self) -> clap::Arg {
        let arg = clap::Arg::new(self.long())
            .long(self.long())
            .value_name(self.value_name)
            .action(clap::ArgAction::Set)
            .help(format!(
                "Retired flag of NVSentinel's older charts: accepted and ignored, with a warning ({}).",
                self.why
            ));
        match self.value_optional {
            true => arg.num_args(0..=1).default_missing_value("true"),
            false => arg,
        }
    }
}

/// The [`RETIRED_FLAGS`] as command-line arguments (`#[command(flatten)]`): which were given.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetiredFlags {
    /// The retired flags given, in [`RETIRED_FLAGS`] order.
    pub given: Vec<&'static str>,
}

impl RetiredFlags {
    /// The one warning about them, or `None` when none was given.
    pub fn warning(&self) -> Option<String> {
        retired_warning(&self.given)
    }
}

impl clap::FromArgMatches for RetiredFlags {
    fn from_arg_matches(m: &clap::ArgMatches) -> Result<Self, clap::Error> {
        let given = RETIRED_FLAGS.iter().filter(|f| m.value_source(f.long()).is_some()).map(|f| f.flag).collect();
        Ok(RetiredFlags { given })
    }

    fn update_from_arg_matches(&mut self, m: &clap::ArgMatches) -> Result<(), clap::Error> {
        *self = RetiredFlags::from_arg_matches(m)?;
        Ok(())
    }
}

impl clap::Args for RetiredFlags {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        RETIRED_FLAGS.iter().fold(cmd, |cmd, f| cmd.arg(f.arg()))
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        RetiredFlags::augment_args(cmd)
    }
}

/// Tokens that make sense before a subcommand and must not be taken for `run`'s flags.
const TOP_LEVEL: &[&str] = &["-h", "--help", "-V", "--version"];
/// Global flags that may precede the (implicit) subcommand.
const GLOBAL: &[&str] = &["--log-json"];

/// `nicmon --flags…` (no subcommand, as upstream's chart invokes its binary) is
/// `nicmon run --flags…`. Anything else is returned unchanged: an explicit subcommand, the
/// top-level `--help`/`--version`, and no arguments at all (which prints the usage).
pub fn with_default_subcommand(mut args: Vec<OsString>) -> Vec<OsString> {
    let mut i = 1;
    while args.get(i).is_some_and(|a| GLOBAL.iter().any(|g| a == g)) {
        i += 1;
    }
    let Some(first) = args.get(i).and_then(|a| a.to_str()) else {
        return args;
    };
    if first.starts_with('-') && !TOP_LEVEL.contains(&first) {
        args.insert(i, OsString::from("run"));
    }
    args
}

/// The one warning for the retired flags given, or `None` when there are none.
pub fn retired_warning(given: &[&str]) -> Option<String> {
    if given.is_empty() {
        return None;
    }
    let why: Vec<String> =
        RETIRED_FLAGS.iter().filter(|f| given.contains(&f.flag)).map(|f| format!("{}: {}", f.flag, f.why)).collect();
    Some(format!("ignored retired NVSentinel flag(s) {} ({})", given.join(", "), why.join("; ")))
}

/// A value of upstream's flags or environment that does not parse the way Go parses it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GoValueError {
    #[error("invalid duration {value:?}: {why} (Go syntax, e.g. 1s, 500ms, 1m30s)")]
    Duration { value: String, why: String },
    #[error("invalid boolean {0:?}: expected true or false")]
    Bool(String),
}

/// A Go `time.ParseDuration` string (`1s`, `500ms`, `1m30s`, `1.5h`, `0`), as upstream's flags
/// and ConfigMap take them. Negative durations are refused: no setting of nicmon takes one.
pub fn go_duration(s: &str) -> Result<Duration, GoValueError> {
    let bad = |why: &str| GoValueError::Duration { value: s.to_string(), why: why.to_string() };
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    let mut rest = s.strip_prefix('+').unwrap_or(s);
    if rest.starts_with('-') {
        return Err(bad("must not be negative"));
    }
    if rest.is_empty() {
        return Err(bad("empty"));
    }
    let mut nanos: u128 = 0;
    while !rest.is_empty() {
        let int_end = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        let (int, r) = rest.split_at(int_end);
        let (frac, r) = match r.strip_prefix('.') {
            Some(r) => r.split_at(r.find(|c: char| !c.is_ascii_digit()).unwrap_or(r.len())),
            None => ("", r),
        };
        if int.is_empty() && frac.is_empty() {
            return Err(bad("expected a number"));
        }
        let unit_end = r.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(r.len());
        let (unit, r) = r.split_at(unit_end);
        let per: u128 = match unit {
            "ns" => 1,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "" => return Err(bad("missing unit")),
            _ => return Err(bad(&format!("unknown unit {unit:?}"))),
        };
        // More digits than any u64 of nanoseconds needs is an overflow anyway.
        if int.len() > 20 {
            return Err(bad("too large"));
        }
        let whole: u128 = if int.is_empty() { 0 } else { int.parse().map_err(|_| bad("too large"))? };
        let mut part = whole.checked_mul(per).ok_or_else(|| bad("too large"))?;
        // Fractions below a nanosecond are dropped, as Go does.
        let mut scale = per;
        for d in frac.bytes().take(20) {
            scale /= 10;
            part += u128::from(d - b'0') * scale;
        }
        nanos = nanos.checked_add(part).ok_or_else(|| bad("too large"))?;
        rest = r;
    }
    let nanos = u64::try_from(nanos).map_err(|_| bad("too large"))?;
    Ok(Duration::from_nanos(nanos))
}

/// A Go `strconv.ParseBool` string: `1 t T TRUE true True 0 f F FALSE false False`.
pub fn go_bool(s: &str) -> Result<bool, GoValueError> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(GoValueError::Bool(s.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn args(list: &[&str]) -> Vec<OsString> {
        list.iter().map(OsString::from).collect()
    }

    #[test]
    fn flags_without_a_subcommand_are_run() {
        let cases: &[(&[&str], &[&str])] = &[
            (&["nicmon", "--checks=InfiniBandStateCheck"], &["nicmon", "run", "--checks=InfiniBandStateCheck"]),
            (
                &["nicmon", "--log-json", "--metrics-port", "2112"],
                &["nicmon", "--log-json", "run", "--metrics-port", "2112"],
            ),
            (&["nicmon", "run", "--checks", "x"], &["nicmon", "run", "--checks", "x"]),
            (&["nicmon", "check", "--format", "json"], &["nicmon", "check", "--format", "json"]),
            (&["nicmon", "--help"], &["nicmon", "--help"]),
            (&["nicmon", "-V"], &["nicmon", "-V"]),
            (&["nicmon"], &["nicmon"]),
            (&["nicmon", "--log-json"], &["nicmon", "--log-json"]),
            (&["nicmon", "bogus"], &["nicmon", "bogus"]),
        ];
        for (given, want) in cases {
            assert_eq!(with_default_subcommand(args(given)), args(want), "{given:?}");
        }
    }

    #[test]
    fn retired_flags_get_one_warning_naming_them() {
        let w = retired_warning(&["--counter-polling-interval", "--kata-enabled"]).unwrap();
        assert!(
            w.starts_with("ignored retired NVSentinel flag(s) --counter-polling-interval, --kata-enabled ("),
            "{w}"
        );
        assert!(w.contains("--kata-enabled: the same DaemonSet"), "{w}");
        let w = retired_warning(&["--kata-enabled"]).unwrap();
        assert!(!w.contains("--counter-polling-interval"), "{w}");
        assert_eq!(retired_warning(&[]), None);
    }

    #[test]
    fn retired_flags_are_taken_from_the_one_table() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            retired: RetiredFlags,
        }
        let given = |list: &[&str]| {
            use clap::Parser;
            Cli::try_parse_from(args(list)).map(|c| c.retired.given).map_err(|e| e.to_string())
        };
        assert_eq!(given(&["nicmon"]), Ok(vec![]));
        assert_eq!(
            given(&["nicmon", "--kata-enabled", "--counter-polling-interval", "5s"]),
            Ok(vec!["--counter-polling-interval", "--kata-enabled"])
        );
        assert_eq!(given(&["nicmon", "--kata-enabled=false"]), Ok(vec!["--kata-enabled"]));
        assert!(given(&["nicmon", "--counter-polling-interval"]).is_err(), "a duration is expected");
    }

    #[test]
    fn go_durations() {
        let ok = [
            ("0", 0),
            ("0s", 0),
            ("1s", 1_000_000_000),
            ("500ms", 500_000_000),
            ("1m30s", 90_000_000_000),
            ("1.5h", 5_400_000_000_000),
            ("+2us", 2_000),
            ("3\u{b5}s", 3_000),
            ("10ns", 10),
            (".5s", 500_000_000),
            ("1.s", 1_000_000_000),
            ("2h45m0.5s", 9_900_500_000_000),
        ];
        for (s, n) in ok {
            assert_eq!(go_duration(s), Ok(Duration::from_nanos(n)), "{s}");
        }
        for bad in ["", "1", "s", "-1s", "1x", "1.2.3s", ".s", "5 s", "99999999999999999999999h", "1e3s"] {
            let e = go_duration(bad).unwrap_err().to_string();
            assert!(e.contains(&format!("{bad:?}")), "{bad}: {e}");
        }
    }

    #[test]
    fn go_bools() {
        for t in ["1", "t", "T", "TRUE", "true", "True"] {
            assert_eq!(go_bool(t), Ok(true));
        }
        for f in ["0", "f", "F", "FALSE", "false", "False"] {
            assert_eq!(go_bool(f), Ok(false));
        }
        assert!(go_bool("yes").unwrap_err().to_string().contains("\"yes\""));
    }

    proptest! {
        #[test]
        fn parsers_never_panic(s in "\\PC{0,24}") {
            let _ = go_duration(&s);
            let _ = go_bool(&s);
            let _ = with_default_subcommand(args(&["nicmon", &s]));
        }

        #[test]
        fn durations_add_up(h in 0u64..1000, m in 0u64..60, s in 0u64..60, ms in 0u64..1000) {
            let text = format!("{h}h{m}m{s}s{ms}ms");
            let want = Duration::from_millis(((h * 60 + m) * 60 + s) * 1000 + ms);
            prop_assert_eq!(go_duration(&text), Ok(want));
        }
    }
}
