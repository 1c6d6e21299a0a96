//! Structured logs (`tracing`) to stderr, text or JSON; level from `RUST_LOG` (default info).
use tracing_subscriber::EnvFilter;

/// `e` and its causes on one line: `outer: cause: cause's cause`.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    push_causes(&mut s, e);
    s
}

/// Append the causes of `e` (not `e` itself) to `s`, each after `": "`.
pub fn push_causes(s: &mut String, e: &dyn std::error::Error) {
    let mut source = e.source();
    while let Some(inner) = source {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        source = inner.source();
    }
}

pub fn init(json: bool) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    let _ = if json { builder.json().try_init() } else { builder.try_init() };
}
