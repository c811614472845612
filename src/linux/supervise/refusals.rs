//! What `zcode-acp run` says when the sandbox refused writes: the names a
//! command tried to make, replace or remove beyond everything the policy
//! lets it write, seen by the supervisor as the calls go by.
//!
//! Only noted, never decided here: each call is then let through to the
//! kernel, which refuses it on its own (the mounts and Landlock). The path
//! is the supervisor's copy, made absolute from the caller's working
//! directory or directory descriptor as `/proc` shows them while the call
//! waits, so a path another thread changes meanwhile is at worst
//! misreported, never mis-decided. Protected paths inside a root are left out: the audit
//! speaks for those, and `--allow` would not open them.

use std::collections::BTreeSet;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use super::decide::{Call, Dirfd};
use crate::policy::{Band, Op, Policy};

/// Distinct paths kept; past it, only counted.
pub const MAX_NOTED: usize = 64;

/// The refused paths noted so far.
#[derive(Debug, Default)]
pub struct Refusals {
    pub paths: BTreeSet<PathBuf>,
    /// Paths past [`MAX_NOTED`].
    pub more: usize,
}

/// When a refused call is a refusal a user would call one: a `mkdir` of
/// a directory that exists fails for that reason first, as does an
/// `unlink` of nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    Always,
    /// Only when the name does not exist (else: "exists").
    Absent,
    /// Only when the name exists (else: "no such file").
    Present,
}

/// Every name `call` makes, replaces or removes, with its directory
/// argument and when its refusal counts. (An open that neither creates
/// nor truncates makes none.)
pub fn written_names(call: &Call) -> Vec<(Dirfd, &[u8], When)> {
    match call {
        Call::Open {
            at, path, flags, ..
        } => {
            let makes = libc::O_CREAT | libc::O_TRUNC;
            if flags & makes == 0 || flags & libc::O_PATH != 0 {
                return Vec::new();
            }
            // Opened for writing (or emptied), it is refused whether or
            // not it exists; for reading, only the making of it is.
            let writes = flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0;
            vec![(*at, path, if writes { When::Always } else { When::Absent })]
        }
        Call::Mkdir { at, path, .. } | Call::Symlink { at, path, .. } => {
            vec![(*at, path, When::Absent)]
        }
        Call::Link { to_at, to, .. } => vec![(*to_at, to, When::Absent)],
        Call::Rmdir { at, path } | Call::Unlink { at, path } | Call::Utimens { at, path, .. } => {
            vec![(*at, path, When::Present)]
        }
        Call::Rename {
            from_at,
            from,
            to_at,
            to,
            ..
        } => vec![(*from_at, from, When::Present), (*to_at, to, When::Always)],
    }
}

/// `path` made absolute against `base` (the caller's directory), without
/// following links: `.` and `..` are taken by name.
pub fn absolute(base: &Path, path: &[u8]) -> PathBuf {
    let path = Path::new(std::ffi::OsStr::from_bytes(path));
    let joined = if path.is_absolute() {
        path.to_path_buf()
    } else {
        base.join(path)
    };
    let mut out = PathBuf::from("/");
    for c in joined.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}

impl Refusals {
    /// Notes `path` if the policy lets nothing write it: judged on the
    /// name first (cheap, and what nearly every write in a workspace
    /// passes), then on the real path, links followed, for a message that
    /// names where the write would have gone.
    pub fn note(&mut self, policy: &Policy, path: PathBuf) {
        if policy.evaluate_resolved(&path, Op::Write).allowed {
            return;
        }
        let (real, decision) = match policy.evaluate(&path, Op::Write) {
            Ok(d) => d,
            // A path that cannot be resolved is judged as written.
            Err(_) => (path.clone(), policy.evaluate_resolved(&path, Op::Write)),
        };
        if decision.allowed || decision.kind != Band::Outside || self.paths.contains(&real) {
            return;
        }
        if self.paths.len() >= MAX_NOTED {
            self.more += 1;
            return;
        }
        self.paths.insert(real);
    }

    /// The line `run` ends with, if anything was refused: the paths, and
    /// the `--allow` that would let a next run write them (the nearest
    /// existing directory of each; at most three).
    pub fn line(&self) -> Option<String> {
        if self.paths.is_empty() {
            return None;
        }
        let shown: Vec<String> = self
            .paths
            .iter()
            .take(5)
            .map(|p| p.display().to_string())
            .collect();
        let rest = self.paths.len().saturating_sub(shown.len()) + self.more;
        let mut dirs: BTreeSet<PathBuf> = BTreeSet::new();
        for p in &self.paths {
            let mut dir = p.parent().unwrap_or(Path::new("/"));
            while !dir.is_dir() {
                match dir.parent() {
                    Some(up) => dir = up,
                    None => break,
                }
            }
            dirs.insert(dir.to_path_buf());
        }
        // Never `/`: that would be no sandbox at all.
        dirs.remove(Path::new("/"));
        let allows: Vec<String> = dirs
            .iter()
            .take(3)
            .map(|d| format!("--allow {}", shell_word(d)))
            .collect();
        let more = if rest > 0 {
            format!(" and {rest} more")
        } else {
            String::new()
        };
        let how = if allows.is_empty() {
            "no --allow short of the whole filesystem opens them".to_owned()
        } else {
            format!(
                "to let a run write there: zcode-acp run {} -- COMMAND (each opens everything beneath it)",
                allows.join(" ")
            )
        };
        Some(format!(
            "zcode-acp: the sandbox refused writes to {}{more} (outside everything this run may write); {how}",
            shown.join(", ")
        ))
    }
}

/// `path` as one shell word.
fn shell_word(path: &Path) -> String {
    let text = path.display().to_string();
    if text
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"/._-+:@%".contains(&b))
    {
        text
    } else {
        format!("'{}'", text.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_made_absolute_without_following_links() {
        let base = Path::new("/w/src");
        assert_eq!(absolute(base, b"a.txt"), Path::new("/w/src/a.txt"));
        assert_eq!(absolute(base, b"../../etc/x"), Path::new("/etc/x"));
        assert_eq!(absolute(base, b"/h/./.x"), Path::new("/h/.x"));
        assert_eq!(absolute(base, b"/../../y"), Path::new("/y"));
    }

    #[test]
    fn only_names_a_call_writes_are_taken() {
        let open = |flags| Call::Open {
            at: libc::AT_FDCWD,
            path: b"x".to_vec(),
            flags,
            mode: 0,
        };
        assert!(written_names(&open(libc::O_RDONLY)).is_empty());
        assert_eq!(
            written_names(&open(libc::O_WRONLY | libc::O_CREAT))[0].2,
            When::Always
        );
        assert_eq!(
            written_names(&open(libc::O_RDONLY | libc::O_CREAT))[0].2,
            When::Absent
        );
        let rename = Call::Rename {
            from_at: 3,
            from: b"a".to_vec(),
            to_at: 4,
            to: b"b".to_vec(),
            flags: 0,
        };
        assert_eq!(
            written_names(&rename),
            vec![(3, &b"a"[..], When::Present), (4, &b"b"[..], When::Always)]
        );
    }

    #[test]
    fn the_line_names_the_paths_and_the_allow_that_opens_them() {
        let mut r = Refusals::default();
        assert!(r.line().is_none());
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("it's here");
        std::fs::create_dir(&dir).unwrap();
        r.paths.insert(dir.join("not/yet/x"));
        let line = r.line().unwrap();
        assert!(line.contains("not/yet/x"), "{line}");
        // The nearest directory that exists, quoted for the shell.
        assert!(
            line.contains(&format!("--allow {}", shell_word(&dir))),
            "{line}"
        );
        assert!(shell_word(&dir).ends_with(r"it'\''s here'"), "{line}");
        r.more = 3;
        assert!(r.line().unwrap().contains("and 3 more"));
        // Never `--allow /`.
        let mut top = Refusals::default();
        top.paths.insert(PathBuf::from("/nonexistent-zcode-dir/x"));
        let line = top.line().unwrap();
        assert!(!line.contains("--allow /"), "{line}");
        assert!(line.contains("no --allow"), "{line}");
    }
}
