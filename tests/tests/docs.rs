//! The documents a user reads first: the README stays short and starts with the two
//! commands, and the links of the README and docs/ lead somewhere (a file, and a heading
//! of it when the link names one).
use std::path::Path;

use nicmon_tests::deploy::repo_root;

const README_MAX_LINES: usize = 200;

#[test]
fn the_readme_is_short_and_starts_with_the_two_commands() {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(lines <= README_MAX_LINES, "README.md has {lines} lines (at most {README_MAX_LINES})");
    let first_section = readme.lines().find(|l| l.starts_with("## ")).unwrap();
    assert_eq!(first_section, "## The two commands");
    let blocks: Vec<&str> = readme.split("```").skip(1).step_by(2).take(2).map(str::trim).collect();
    assert_eq!(blocks, ["cargo xtask demo", "cargo xtask test"]);
}

/// GitHub's anchor for a heading: lower case, punctuation but `-` and `_` dropped, spaces
/// to `-`.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(markdown: &str) -> Vec<String> {
    let mut in_code = false;
    let mut out = Vec::new();
    for line in markdown.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
        } else if !in_code && line.starts_with('#') {
            out.push(anchor(line.trim_start_matches('#')));
        }
    }
    out
}

/// The `](target)` links of a Markdown text, outside code blocks.
fn links(markdown: &str) -> Vec<String> {
    let mut in_code = false;
    let mut out = Vec::new();
    for line in markdown.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        for part in line.split("](").skip(1) {
            if let Some(end) = part.find(')') {
                out.push(part[..end].to_string());
            }
        }
    }
    out
}

#[test]
fn the_links_of_the_readme_and_docs_lead_somewhere() {
    let root = repo_root();
    let mut docs = vec![root.join("README.md")];
    for e in std::fs::read_dir(root.join("docs")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "md") {
            docs.push(p);
        }
    }
    let mut broken = Vec::new();
    let mut checked = 0;
    for doc in &docs {
        let text = std::fs::read_to_string(doc).unwrap();
        for link in links(&text) {
            if link.contains("://") {
                continue;
            }
            let (file, frag) = link.split_once('#').unwrap_or((link.as_str(), ""));
            let target = if file.is_empty() { doc.clone() } else { doc.parent().unwrap().join(file) };
            checked += 1;
            if !target.exists() {
                broken.push(format!("{}: {link}: no such file", rel(&root, doc)));
            } else if !frag.is_empty() && target.extension().is_some_and(|x| x == "md") {
                let headings = anchors(&std::fs::read_to_string(&target).unwrap());
                if !headings.iter().any(|h| h == frag) {
                    broken.push(format!("{}: {link}: no such heading", rel(&root, doc)));
                }
            }
        }
    }
    assert!(checked > 20, "{checked} links");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

fn rel(root: &Path, p: &Path) -> String {
    p.strip_prefix(root).unwrap_or(p).display().to_string()
}

#[test]
fn anchors_are_githubs() {
    assert_eq!(anchor(" Poll-stall watchdog (`NICPollStallCheck`)"), "poll-stall-watchdog-nicpollstallcheck");
    assert_eq!(anchor(" Events: what they mean and what to do"), "events-what-they-mean-and-what-to-do");
    assert_eq!(anchor(" What it sees: `nicmon check`"), "what-it-sees-nicmon-check");
    assert_eq!(anchor(" Direct publishing (`HEALTH_PUBLISH_TARGET`)"), "direct-publishing-health_publish_target");
}
