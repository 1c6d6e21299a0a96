//! The metric names a PromQL expression selects, so that a test can tell whether the alert
//! rules and the dashboard name only series nicmon exports. A scanner, not a parser: it
//! knows where PromQL puts names that are not metric names (label matchers, grouping
//! lists, function and aggregation names, keywords, strings, durations). Prometheus itself
//! says whether an expression is valid; this only reads valid ones, and never panics.
use std::collections::BTreeSet;

/// Keywords that are never metric names.
const KEYWORDS: [&str; 14] = [
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "offset",
    "and",
    "or",
    "unless",
    "atan2",
    "inf",
    "nan",
];
/// Keywords followed by a parenthesised list of label names.
const LABEL_LISTS: [&str; 6] = ["by", "without", "on", "ignoring", "group_left", "group_right"];
/// Aggregations, which may be followed by `by (...)`/`without (...)` before their `(`.
const AGGREGATIONS: [&str; 14] = [
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
];

fn is_name_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':'
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

struct Scanner {
    chars: Vec<char>,
    at: usize,
}

impl Scanner {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.at).copied()
    }

    fn skip_space(&mut self) {
        while self.peek().is_some_and(char::is_whitespace) {
            self.at += 1;
        }
    }

    /// The next non-space character, without consuming it.
    fn next_non_space(&self) -> Option<char> {
        self.chars[self.at.min(self.chars.len())..].iter().copied().find(|c| !c.is_whitespace())
    }

    fn word(&mut self) -> String {
        let start = self.at;
        while self.peek().is_some_and(is_name_char) {
            self.at += 1;
        }
        self.chars[start..self.at].iter().collect()
    }

    /// The next word after spaces, without consuming anything.
    fn next_word(&self) -> String {
        let rest = &self.chars[self.at.min(self.chars.len())..];
        rest.iter().copied().skip_while(|c| c.is_whitespace()).take_while(|c| is_name_char(*c)).collect()
    }

    /// A quoted string starting at the current quote; returns its raw content.
    fn string(&mut self) -> Result<String, String> {
        let quote = self.peek().ok_or("string expected")?;
        let start = self.at;
        self.at += 1;
        let mut out = String::new();
        while let Some(c) = self.peek() {
            self.at += 1;
            match c {
                '\\' if quote != '`' => {
                    if let Some(n) = self.peek() {
                        out.push(n);
                        self.at += 1;
                    }
                }
                c if c == quote => return Ok(out),
                c => out.push(c),
            }
        }
        Err(format!("unterminated string at offset {start}"))
    }

    /// Skips from an opening bracket to its matching closing one (strings inside skipped).
    fn skip_group(&mut self, open: char, close: char) -> Result<(), String> {
        let start = self.at;
        let mut depth = 0usize;
        while let Some(c) = self.peek() {
            match c {
                '"' | '\'' | '`' => {
                    self.string()?;
                    continue;
                }
                c if c == open => depth += 1,
                c if c == close => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        self.at += 1;
                        return Ok(());
                    }
                }
                _ => {}
            }
            self.at += 1;
        }
        Err(format!("unbalanced {open:?} at offset {start}"))
    }

    /// A label matcher list `{...}`: metric names given as `__name__="..."`.
    fn matchers(&mut self, names: &mut BTreeSet<String>) -> Result<(), String> {
        let start = self.at;
        self.at += 1;
        loop {
            self.skip_space();
            match self.peek() {
                None => return Err(format!("unbalanced '{{' at offset {start}")),
                Some('}') => {
                    self.at += 1;
                    return Ok(());
                }
                Some(',') => self.at += 1,
                Some('"' | '\'' | '`') => {
                    // A quoted label name (Prometheus 3), then its matcher.
                    let label = self.string()?;
                    self.matcher_value(&label, names)?;
                }
                Some(c) if is_name_start(c) => {
                    let label = self.word();
                    self.matcher_value(&label, names)?;
                }
                Some(c) => return Err(format!("unexpected {c:?} in label matchers at offset {}", self.at)),
            }
        }
    }

    fn matcher_value(&mut self, label: &str, names: &mut BTreeSet<String>) -> Result<(), String> {
        self.skip_space();
        let op: String = std::iter::from_fn(|| {
            let c = self.peek().filter(|c| matches!(c, '=' | '!' | '~'))?;
            self.at += 1;
            Some(c)
        })
        .collect();
        self.skip_space();
        if op.is_empty() {
            // `{"metric"}`: a quoted metric name on its own.
            names.insert(label.to_string());
            return Ok(());
        }
        let value = self.string()?;
        if label == "__name__" {
            if op != "=" {
                return Err(format!("__name__{op}{value:?}: a name matcher other than = names no single metric"));
            }
            names.insert(value);
        }
        Ok(())
    }
}

/// The metric names `expr` selects (including recording-rule names such as
/// `instance:foo:sum`). `Err` for what it cannot read: an unterminated string, unbalanced
/// brackets, or a `__name__` matcher other than `=`.
pub fn metric_names(expr: &str) -> Result<BTreeSet<String>, String> {
    let mut s = Scanner { chars: expr.chars().collect(), at: 0 };
    let mut names = BTreeSet::new();
    while let Some(c) = s.peek() {
        match c {
            '"' | '\'' | '`' => {
                s.string()?;
            }
            '{' => s.matchers(&mut names)?,
            '[' => s.skip_group('[', ']')?,
            c if c.is_ascii_digit() || (c == '.' && s.chars.get(s.at + 1).is_some_and(char::is_ascii_digit)) => {
                // A number or a duration (1e-3, 0x1f, 5m, 1h30m).
                while let Some(c) = s.peek() {
                    let exponent_sign = matches!(c, '+' | '-') && matches!(s.chars.get(s.at - 1), Some('e' | 'E'));
                    if !(c.is_ascii_alphanumeric() || c == '.' || c == '_' || exponent_sign) {
                        break;
                    }
                    s.at += 1;
                }
            }
            c if is_name_start(c) => {
                let word = s.word();
                let next = s.next_non_space();
                if LABEL_LISTS.contains(&word.as_str()) {
                    s.skip_space();
                    if s.peek() == Some('(') {
                        s.skip_group('(', ')')?;
                    }
                } else if next == Some('(') || KEYWORDS.contains(&word.as_str()) {
                    // A function or aggregation call, or a keyword.
                } else if AGGREGATIONS.contains(&word.as_str()) && matches!(s.next_word().as_str(), "by" | "without") {
                    // `sum by (...) (...)`: the list is skipped as the next word.
                } else {
                    names.insert(word);
                }
            }
            _ => s.at += 1,
        }
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(expr: &str) -> Vec<String> {
        metric_names(expr).unwrap_or_else(|e| panic!("{expr}: {e}")).into_iter().collect()
    }

    #[test]
    fn finds_the_metric_names_and_nothing_else() {
        let cases: [(&str, &[&str]); 12] = [
            ("nicmon_port_healthy == 0", &["nicmon_port_healthy"]),
            (
                r#"sum by (instance, node, check) (increase(nic_health_monitor_health_events_sent_total{is_fatal="true"}[10m])) > 0"#,
                &["nic_health_monitor_health_events_sent_total"],
            ),
            (
                "sum by (instance) (increase(a_total[10m])) > 0 and sum by (instance) (increase(b_total[10m])) == 0",
                &["a_total", "b_total"],
            ),
            ("sum(rate(x[5m])) by (job)", &["x"]),
            ("histogram_quantile(0.99, sum by (instance, le) (rate(h_bucket[5m])))", &["h_bucket"]),
            ("time() - max by (instance, node) (ts{category=\"state\"}) > 30", &["ts"]),
            ("a == on (instance, device, port) group_left (node) b", &["a", "b"]),
            ("count by (instance) (max_over_time(x[1h])) unless count by (instance) (x offset 5m)", &["x"]),
            ("instance:nicmon_ports_unhealthy:sum", &["instance:nicmon_ports_unhealthy:sum"]),
            (r#"{__name__="up", job="a"} + 1e-3 * 0x1f"#, &["up"]),
            (r#"label_replace(x, "dst", "$1", "src", "(.*)")"#, &["x"]),
            ("max_over_time(rate(x_total[5m])[30m:1m]) > bool 2", &["x_total"]),
        ];
        for (expr, want) in cases {
            assert_eq!(names(expr), want.iter().map(|s| s.to_string()).collect::<Vec<_>>(), "{expr}");
        }
        // Label names, label values and function names are not metric names.
        assert_eq!(names(r#"sum without (sum) (count{count="sum", by="x"})"#), ["count"]);
    }

    #[test]
    fn what_it_cannot_read_is_an_error() {
        assert!(metric_names(r#"x{a="b}"#).is_err());
        assert!(metric_names("sum(rate(x[5m])").is_ok(), "unbalanced parentheses are Prometheus' to reject");
        assert!(metric_names("x[5m").is_err());
        assert!(metric_names(r#"{__name__=~"nicmon_.*"}"#).is_err());
    }

    /// Every prefix of the expressions it reads (cut anywhere, even inside a string or a
    /// character) is read without a panic.
    #[test]
    fn never_panics_on_a_cut_expression() {
        let exprs = [
            r#"sum by (a) (rate(x{b="c\"d",e=~'f'}[5m] offset 1m)) / on (a) group_left (g) {__name__="y"} > bool 1e-3"#,
            "histogram_quantile(0.99, sum by (le) (rate(h_bucket[$__rate_interval])))[1h:5m] @ end()",
            "`raw`  {\"quoted\"} ✓ 0x1F .5",
        ];
        for expr in exprs {
            for (i, _) in expr.char_indices() {
                let _ = metric_names(&expr[..i]);
                let _ = metric_names(&expr[i..]);
            }
        }
    }
}
