//! Reading refused writes out of what an agent shows: the error text of a
//! tool call. Pure, and only a hint: the agent controls the text, and the
//! policy decides whether a path may be offered at all.
//!
//! A refusal names its path right before the error (`sh: 1: cannot create
//! /p: Read-only file system`, `/bin/bash: line 1: /p: …`, `touch: cannot
//! touch '/p': …`, ``failed to create file `/p`: …``) or right after it
//! (Node's `EROFS: read-only file system, open '/p'`, Python's `[Errno 30]
//! Read-only file system: '/p'`). Only those two places count: other
//! paths on the line (the shell that printed it, `/bin/bash`) are not what
//! was refused. Some tools say only that they failed: codex's `apply_patch`
//! reports `Failed to write file /p`; those phrases name the path right
//! after them.

use std::path::PathBuf;

/// The errors of a write the kernel refused, lower case.
const MARKERS: &[&str] = &[
    "read-only file system",
    "permission denied",
    "operation not permitted",
];

/// Failures that name their path right after them, lower case (codex's
/// apply_patch).
const FAILED_TO: &[&str] = &[
    "failed to write file ",
    "failed to create parent directories for ",
    "failed to delete file ",
];

/// Whether a raw frame may carry a refusal (a cheap first look).
pub fn may_contain(raw: &str) -> bool {
    // The usual spellings, without lowercasing every streamed frame.
    [
        "Read-only file system",
        "read-only file system",
        "Permission denied",
        "permission denied",
        "Operation not permitted",
        "operation not permitted",
        "Failed to write file",
        "Failed to create parent directories",
        "Failed to delete file",
    ]
    .iter()
    .any(|m| raw.contains(m))
}

/// The paths `text` reports as refused.
pub fn refused_paths(text: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    for line in text.lines() {
        let lower = line.to_ascii_lowercase();
        for marker in MARKERS {
            for (at, _) in lower.match_indices(marker) {
                let found = [
                    path_before(&line[..at]),
                    path_after(&line[at + marker.len()..]),
                ];
                for p in found.into_iter().flatten() {
                    if !out.contains(&p) {
                        out.push(p);
                    }
                }
            }
        }
        for phrase in FAILED_TO {
            for (at, _) in lower.match_indices(phrase) {
                let rest = &line[at + phrase.len()..];
                let p = quoted_at_start(rest).or_else(|| {
                    absolute(
                        rest.split(char::is_whitespace)
                            .next()?
                            .trim_end_matches(':'),
                    )
                });
                if let Some(p) = p.filter(|p| !out.contains(p)) {
                    out.push(p);
                }
            }
        }
    }
    out
}

/// The path that ends where the error begins: `… /p: ` or `… '/p': `.
fn path_before(before: &str) -> Option<PathBuf> {
    let s = before.trim_end();
    let s = s.strip_suffix(':')?.trim_end();
    let s = s.strip_suffix(" (os error 30)").unwrap_or(s);
    quoted_at_end(s).or_else(|| {
        let token = s.rsplit(char::is_whitespace).next()?;
        absolute(token)
    })
}

/// The path right after the error: `, open '/p'`, `: '/p'`, `: /p`.
fn path_after(after: &str) -> Option<PathBuf> {
    let mut s = after;
    if let Some(rest) = s.strip_prefix(", ") {
        // Node: `, open '/p'`, `, mkdir '/p'`, `, rename '/a' -> '/b'`.
        s = rest.split_once(' ').map(|(_, r)| r)?;
    } else if let Some(rest) = s.strip_prefix(':') {
        s = rest.trim_start();
    } else {
        return None;
    }
    quoted_at_start(s).or_else(|| {
        let token = s.split(|c: char| c.is_whitespace() || c == ',').next()?;
        absolute(token)
    })
}

fn absolute(token: &str) -> Option<PathBuf> {
    (token.starts_with('/') && token.len() > 1).then(|| PathBuf::from(token))
}

/// Quote pairs (open, close): ASCII, GNU's `x' and its UTF-8 ‘x’.
const QUOTES: &[(char, char)] = &[
    ('\'', '\''),
    ('"', '"'),
    ('`', '`'),
    ('`', '\''),
    ('‘', '’'),
];

/// A quoted absolute path ending `s`.
fn quoted_at_end(s: &str) -> Option<PathBuf> {
    let close = s.chars().next_back()?;
    let inner = &s[..s.len() - close.len_utf8()];
    QUOTES
        .iter()
        .filter(|(_, c)| *c == close)
        .find_map(|(open, _)| {
            inner
                .rfind(*open)
                .and_then(|at| absolute(&inner[at + open.len_utf8()..]))
        })
}

/// A quoted absolute path starting `s`.
fn quoted_at_start(s: &str) -> Option<PathBuf> {
    let open = s.chars().next()?;
    let inner = &s[open.len_utf8()..];
    QUOTES
        .iter()
        .filter(|(o, _)| *o == open)
        .find_map(|(_, close)| inner.find(*close).and_then(|at| absolute(&inner[..at])))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(text: &str) -> Vec<String> {
        refused_paths(text)
            .into_iter()
            .map(|p| p.display().to_string())
            .collect()
    }

    #[test]
    fn the_refused_path_is_read_from_the_usual_messages() {
        for (text, want) in [
            (
                "sh: 1: cannot create /home/u/out/x.txt: Read-only file system",
                "/home/u/out/x.txt",
            ),
            (
                "/bin/bash: line 1: /home/u/out/o.txt: Read-only file system",
                "/home/u/out/o.txt",
            ),
            (
                "touch: cannot touch '/srv/a b': Permission denied",
                "/srv/a b",
            ),
            (
                "mkdir: cannot create directory ‘/srv/d’: Read-only file system",
                "/srv/d",
            ),
            (
                "mkdir: cannot create directory '/srv/d': Read-only file system",
                "/srv/d",
            ),
            (
                "EROFS: read-only file system, open '/home/u/out/b.txt'",
                "/home/u/out/b.txt",
            ),
            ("EACCES: permission denied, mkdir '/opt/x'", "/opt/x"),
            (
                "PermissionError: [Errno 13] Permission denied: '/etc/x'",
                "/etc/x",
            ),
            (
                "OSError: [Errno 30] Read-only file system: '/srv/y'",
                "/srv/y",
            ),
            (
                "failed to create file `/srv/z`: Read-only file system (os error 30)",
                "/srv/z",
            ),
            (
                "fatal: Unable to create '/r/.git/index.lock': Read-only file system",
                "/r/.git/index.lock",
            ),
            (
                "Failed to write file /home/u/out/c.txt",
                "/home/u/out/c.txt",
            ),
            (
                "Failed to create parent directories for /o/d/e.txt: x",
                "/o/d/e.txt",
            ),
        ] {
            assert_eq!(paths(text), vec![want], "{text}");
        }
    }

    #[test]
    fn other_paths_on_the_line_are_not_what_was_refused() {
        assert!(paths("/bin/bash: line 1: cd: /nope: No such file or directory").is_empty());
        assert!(paths("Permission denied (see /docs)").is_empty());
        assert_eq!(
            paths("touch: cannot touch '/srv/a': Permission denied (see /docs)"),
            vec!["/srv/a"]
        );
        assert!(paths("echo hi > /w/a.txt").is_empty());
        // Each line on its own.
        assert_eq!(
            paths("/w/ok.txt written\n/bin/sh: 1: cannot create /o/x: Read-only file system"),
            vec!["/o/x"]
        );
        assert!(may_contain("EROFS: read-only file system, open"));
        assert!(!may_contain("all good"));
    }
}
