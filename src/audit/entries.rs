//! The audit's general rule: every hidden file or directory in the roots
//! (and every file named as a tool's configuration, `super::walk`) that the
//! agent created, changed or removed is a finding, whatever tool would
//! read it. The known names (git's, the agents' settings) are refinements
//! made elsewhere; this rule does not depend on knowing them.
//!
//! To put a changed file back, its content when the sandbox was armed is
//! kept in memory: files up to [`KEEP_FILE`] bytes, [`KEEP_TOTAL`] in all.
//! A larger one is remembered by a keyed hash only; changed, it is moved
//! aside (reverted to nothing) and the user is told the original could not
//! be kept.

use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hasher};
use std::path::{Path, PathBuf};

use super::walk::{Kind, Seen, Walked, Why};
use super::{Action, Finding};

/// Files larger than this are remembered by hash, not kept.
pub const KEEP_FILE: u64 = 256 << 10;
/// The most kept across every file of a baseline.
pub const KEEP_TOTAL: u64 = 32 << 20;
/// Files larger than this are not even hashed (a sparse file of many
/// gigabytes would make every look read it): their size, change time and
/// inode stand for their content.
pub const HASH_FILE: u64 = 64 << 20;

/// What was there when the sandbox was armed.
#[derive(Debug, Clone)]
pub enum Was {
    File {
        bytes: Kept,
        mode: u32,
    },
    Dir,
    /// A symlink (its target as written), and the regular file it leads
    /// to, as it was: a tool reading the hidden name reads that file, so
    /// a change there is a change of the hidden entry.
    Symlink(PathBuf, Option<Box<LinkedFile>>),
    Other,
}

/// The regular file a hidden symlink leads to.
#[derive(Debug, Clone)]
pub struct LinkedFile {
    pub real: PathBuf,
    pub seen: Seen,
    pub bytes: Kept,
}

/// A file's content as remembered.
#[derive(Debug, Clone)]
pub enum Kept {
    Bytes(Vec<u8>),
    /// Too large to keep, or past the total: a hash keyed for this baseline.
    Hash(u64),
    /// Could not be read.
    Unread,
}

/// The entries of a baseline, and how to hash what was not kept.
#[derive(Debug, Clone)]
pub struct Entries {
    pub seen: BTreeMap<PathBuf, (Seen, Why, Was)>,
    hasher: std::collections::hash_map::RandomState,
}

impl Entries {
    /// What `walked` found, with the content of its files (within bounds).
    pub fn take(walked: &Walked) -> Entries {
        let hasher = std::collections::hash_map::RandomState::new();
        let mut total = 0u64;
        let mut seen = BTreeMap::new();
        for (path, (s, why)) in &walked.entries {
            let was = match s.kind {
                Kind::File => {
                    let bytes = if s.len <= KEEP_FILE && total + s.len <= KEEP_TOTAL {
                        match super::read(path) {
                            Some(b) => {
                                total += b.len() as u64;
                                Kept::Bytes(b)
                            }
                            None => Kept::Unread,
                        }
                    } else if s.len <= HASH_FILE {
                        hash_of(&hasher, path).map_or(Kept::Unread, Kept::Hash)
                    } else {
                        // Too large to hash at each look: its size, times
                        // and inode stand for it.
                        Kept::Unread
                    };
                    Was::File {
                        bytes,
                        mode: s.mode,
                    }
                }
                Kind::Dir => Was::Dir,
                Kind::Symlink => match std::fs::read_link(path) {
                    Ok(target) => Was::Symlink(target, linked_file(&hasher, path, &mut total)),
                    Err(_) => Was::Other,
                },
                Kind::Other => Was::Other,
            };
            seen.insert(path.clone(), (*s, *why, was));
        }
        Entries { seen, hasher }
    }

    /// The findings between this baseline and `now` (a walk of the same
    /// roots). Paths in `covered` are another rule's (a settings file, whose
    /// saved permissions are no finding): neither they nor a new directory
    /// holding one is a finding here, though what else is new in it is.
    pub fn compare(
        &self,
        now: &Walked,
        covered: &[PathBuf],
        dirty: &[(PathBuf, Why)],
    ) -> Vec<Finding> {
        let mut out: Vec<Finding> = Vec::new();
        // New entries: what the walk found, and what the watcher saw
        // change (past where a walk stopped too). One finding for the
        // topmost new one (a new directory carries what is in it).
        let mut candidates: Vec<(PathBuf, Seen, Why)> = now
            .entries
            .iter()
            .map(|(p, (s, w))| (p.clone(), *s, *w))
            .collect();
        for (p, why) in dirty {
            if !now.entries.contains_key(p) {
                if let Some(s) = Seen::at(p) {
                    candidates.push((p.clone(), s, *why));
                }
            }
        }
        candidates.sort_by(|a, b| a.0.cmp(&b.0));
        let mut new_tops: Vec<PathBuf> = Vec::new();
        for (path, s, why) in &candidates {
            if self.seen.contains_key(path) || new_tops.iter().any(|t| path.starts_with(t)) {
                continue;
            }
            if covered.iter().any(|c| c.starts_with(path)) {
                continue;
            }
            new_tops.push(path.clone());
            out.push(Finding {
                path: path.clone(),
                what: format!(
                    "{} {} did not exist when the sandbox was armed",
                    what_of(s.kind),
                    described(*why)
                ),
                shown: super::show(path),
                revert: Some(Action::Remove(path.clone())),
                keep: super::snapshot(path),
                blind: false,
            });
        }
        // What was there: looked at where it is, not through the walk, so
        // a walk that stopped short (its bound filled on purpose) misses
        // none of it.
        for (path, (then, why, was)) in &self.seen {
            if covered.iter().any(|c| c == path) {
                continue;
            }
            if let Some(f) = self.changed(path, then, Seen::at(path), *why, was) {
                out.push(f);
            }
        }
        out
    }

    /// A finding for `path`, when it is not as it was.
    fn changed(
        &self,
        path: &Path,
        then: &Seen,
        now: Option<Seen>,
        why: Why,
        was: &Was,
    ) -> Option<Finding> {
        match (was, now) {
            (Was::Dir, Some(n)) if n.kind == Kind::Dir => None,
            (Was::Dir, _) => Some(Finding {
                path: path.to_path_buf(),
                what: format!("the directory {} was removed or replaced", described(why)),
                shown: super::show(path),
                revert: Some(Action::All(vec![
                    Action::Remove(path.to_path_buf()),
                    Action::Dir(path.to_path_buf()),
                ])),
                keep: None,
                blind: false,
            }),
            (Was::File { bytes, mode }, Some(n)) if n.kind == Kind::File => {
                if n.len == then.len
                    && n.ctime == then.ctime
                    && n.ino == then.ino
                    && n.mode == *mode
                {
                    return None;
                }
                if n.mode == *mode && n.len == then.len && self.same_content(path, bytes) {
                    return None;
                }
                let mut what = format!("the {} was changed", described_file(why));
                if n.mode != *mode {
                    what.push_str(&format!(" (mode {:o}, was {:o})", n.mode, mode));
                }
                if !matches!(bytes, Kept::Bytes(_)) {
                    what.push_str(&format!(
                        "; its version from before could not be kept (over {} KiB), so it is removed until you keep the agent's",
                        KEEP_FILE >> 10
                    ));
                }
                Some(Finding {
                    path: path.to_path_buf(),
                    what,
                    shown: super::show(path),
                    revert: Some(match bytes {
                        Kept::Bytes(b) => Action::Write(path.to_path_buf(), b.clone(), *mode),
                        // The original is not kept: the agent's version goes
                        // aside, and the user is told.
                        _ => Action::Remove(path.to_path_buf()),
                    }),
                    keep: super::snapshot(path),
                    blind: false,
                })
            }
            (Was::File { bytes, mode }, now) => Some(Finding {
                path: path.to_path_buf(),
                what: match now {
                    None => format!("the {} was removed", described_file(why)),
                    Some(n) => format!(
                        "the {} was replaced by a {}",
                        described_file(why),
                        what_of(n.kind)
                    ),
                },
                shown: super::show(path),
                revert: match bytes {
                    Kept::Bytes(b) => Some(Action::All(vec![
                        Action::Remove(path.to_path_buf()),
                        Action::Write(path.to_path_buf(), b.clone(), *mode),
                    ])),
                    // Its content was not kept (a large file): what the agent
                    // put there goes, and the finding says the rest.
                    _ if now.is_some() => Some(Action::Remove(path.to_path_buf())),
                    _ => None,
                },
                keep: if now.is_some() {
                    super::snapshot(path)
                } else {
                    Some(Action::Remove(path.to_path_buf()))
                },
                blind: false,
            }),
            (Was::Symlink(target, linked), Some(n))
                if n.kind == Kind::Symlink
                    && std::fs::read_link(path).ok().as_ref() == Some(target) =>
            {
                self.linked_changed(path, linked.as_deref(), why)
            }
            (Was::Symlink(target, _), _) => Some(Finding {
                path: path.to_path_buf(),
                what: format!(
                    "the symlink {} (to {}) was removed or repointed",
                    described(why),
                    target.display()
                ),
                shown: super::show(path),
                revert: Some(Action::All(vec![
                    Action::Remove(path.to_path_buf()),
                    Action::Link(path.to_path_buf(), target.clone()),
                ])),
                keep: super::snapshot(path),
                blind: false,
            }),
            (Was::Other, _) => None,
        }
    }

    /// A finding when the file a hidden symlink leads to is not as it was
    /// (put back there, the link left as it is).
    fn linked_changed(
        &self,
        link: &Path,
        linked: Option<&LinkedFile>,
        why: Why,
    ) -> Option<Finding> {
        let linked = linked?;
        let now = Seen::at(&linked.real);
        if now.is_some_and(|n| {
            n.len == linked.seen.len
                && n.ctime == linked.seen.ctime
                && n.ino == linked.seen.ino
                && n.mode == linked.seen.mode
        }) {
            return None;
        }
        if now.is_some_and(|n| {
            n.kind == Kind::File && n.len == linked.seen.len && n.mode == linked.seen.mode
        }) && self.same_content(&linked.real, &linked.bytes)
        {
            return None;
        }
        let Kept::Bytes(b) = &linked.bytes else {
            // Not kept: said, not undone (the file is reached by another
            // name, and may be yours).
            return Some(Finding {
                path: linked.real.clone(),
                what: format!(
                    "the file the {} symlink {} leads to was changed; its version from before was not kept (over {} KiB)",
                    described_link(why),
                    link.display(),
                    KEEP_FILE >> 10
                ),
                shown: super::show(&linked.real),
                revert: None,
                keep: None,
                blind: false,
            });
        };
        Some(Finding {
            path: linked.real.clone(),
            what: format!(
                "the file the {} symlink {} leads to was changed",
                described_link(why),
                link.display()
            ),
            shown: super::show(&linked.real),
            revert: Some(Action::All(vec![
                Action::Remove(linked.real.clone()),
                Action::Write(linked.real.clone(), b.clone(), linked.seen.mode),
            ])),
            keep: super::snapshot(&linked.real),
            blind: false,
        })
    }

    fn same_content(&self, path: &Path, kept: &Kept) -> bool {
        match kept {
            Kept::Bytes(b) => super::read(path).as_deref() == Some(b.as_slice()),
            Kept::Hash(h) => hash_of(&self.hasher, path) == Some(*h),
            Kept::Unread => false,
        }
    }

    /// The user kept the agent's version of `path`: it is the baseline
    /// from now on (with what is beneath it).
    pub fn accept(&mut self, path: &Path, now: &Walked) {
        self.seen.retain(|p, _| !p.starts_with(path));
        let under: Walked = Walked {
            entries: now
                .entries
                .iter()
                .filter(|(p, _)| p.starts_with(path))
                .map(|(p, v)| (p.clone(), *v))
                .collect(),
            ..Default::default()
        };
        let taken = Entries::take(&under);
        for (p, (s, why, was)) in taken.seen {
            // Hashes are keyed per baseline: taken again with this one's.
            let was = match was {
                Was::File {
                    bytes: Kept::Hash(_),
                    mode,
                } => Was::File {
                    bytes: hash_of(&self.hasher, &p).map_or(Kept::Unread, Kept::Hash),
                    mode,
                },
                other => other,
            };
            self.seen.insert(p, (s, why, was));
        }
    }
}

/// The regular file a symlink leads to, remembered as a file of the
/// baseline is (within the same bounds).
fn linked_file(
    hasher: &std::collections::hash_map::RandomState,
    link: &Path,
    total: &mut u64,
) -> Option<Box<LinkedFile>> {
    let real = crate::policy::resolve_real(link).ok()?;
    let seen = Seen::at(&real)?;
    if seen.kind != Kind::File {
        return None;
    }
    let bytes = if seen.len <= KEEP_FILE && *total + seen.len <= KEEP_TOTAL {
        match super::read(&real) {
            Some(b) => {
                *total += b.len() as u64;
                Kept::Bytes(b)
            }
            None => Kept::Unread,
        }
    } else if seen.len <= HASH_FILE {
        hash_of(hasher, &real).map_or(Kept::Unread, Kept::Hash)
    } else {
        Kept::Unread
    };
    Some(Box::new(LinkedFile { real, seen, bytes }))
}

fn described_link(why: Why) -> &'static str {
    match why {
        Why::Hidden => "hidden",
        Why::NamedConfig => "configuration",
    }
}

fn hash_of(hasher: &std::collections::hash_map::RandomState, path: &Path) -> Option<u64> {
    use std::io::Read;
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags_nofollow()
        .open(path)
        .ok()?;
    let mut h = hasher.build_hasher();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        match f.read(&mut buf) {
            Ok(0) => return Some(h.finish()),
            Ok(n) => h.write(&buf[..n]),
            Err(_) => return None,
        }
    }
}

trait NoFollow {
    fn custom_flags_nofollow(&mut self) -> &mut Self;
}

impl NoFollow for std::fs::OpenOptions {
    fn custom_flags_nofollow(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
    }
}

fn what_of(kind: Kind) -> &'static str {
    match kind {
        Kind::File => "file",
        Kind::Dir => "directory",
        Kind::Symlink => "symlink",
        Kind::Other => "special file",
    }
}

fn described(why: Why) -> &'static str {
    match why {
        Why::Hidden => "(hidden: a tool may read it on its own)",
        Why::NamedConfig => "(a configuration a tool obeys on its own)",
    }
}

fn described_file(why: Why) -> &'static str {
    match why {
        Why::Hidden => "hidden file",
        Why::NamedConfig => "configuration file",
    }
}
