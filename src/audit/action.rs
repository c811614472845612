//! What the audit puts back or keeps: changes made outside the sandbox
//! (never through a symlinked directory), the snapshots they are made
//! from, and the agent's version as the user is shown it.

use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Files larger than this are not held in memory for "keep" (the stash
/// keeps them on disk).
const MAX_KEPT: u64 = 1 << 20;
/// At most this many entries of a new directory are held in memory.
const MAX_KEPT_ENTRIES: usize = 256;
/// How much of the agent's version a finding shows.
const SHOWN: usize = 2048;

/// One entry of a directory tree held in memory.
#[derive(Debug, Clone)]
pub enum Node {
    Dir,
    File(Vec<u8>, u32),
    Link(PathBuf),
}

/// A change made outside the sandbox, never through a symlinked directory.
#[derive(Debug, Clone)]
pub enum Action {
    /// Write these bytes (atomically, with this mode) at the path.
    Write(PathBuf, Vec<u8>, u32),
    /// Remove the path (a file, a symlink, or a directory with everything
    /// in it).
    Remove(PathBuf),
    /// Make a directory at the path (where nothing is).
    Dir(PathBuf),
    /// Make a symlink at the path, to this target.
    Link(PathBuf, PathBuf),
    /// Recreate a directory tree: (relative path, what it is).
    Tree(PathBuf, Vec<(PathBuf, Node)>),
    /// Move one path to another (the stash's: never across filesystems).
    Move(PathBuf, PathBuf),
    /// Several of these, in order.
    All(Vec<Action>),
}

/// Runs `act` on `path` with its directory pinned: on Linux the directory
/// is opened with no symlink anywhere on its path (`openat2`,
/// `RESOLVE_NO_SYMLINKS`) and `act` is given the path through that
/// descriptor, so no swap of a directory for a symlink (by a process the
/// agent left running) can redirect it; elsewhere the directory is checked
/// to be its own real path first.
fn at_real<T>(path: &Path, act: impl FnOnce(&Path) -> std::io::Result<T>) -> std::io::Result<T> {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(std::io::Error::other("no parent directory"));
    };
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let pinned = crate::linux::open_dir_without_symlinks(dir).map_err(|e| {
            std::io::Error::other(format!(
                "{} is reached through a symlink or cannot be opened ({e}); not followed",
                dir.display()
            ))
        })?;
        act(&Path::new(&format!("/proc/self/fd/{}", pinned.as_raw_fd())).join(name))
    }
    #[cfg(not(target_os = "linux"))]
    {
        if crate::policy::resolve_real(dir).ok().as_deref() != Some(dir) {
            return Err(std::io::Error::other(format!(
                "{} is reached through a symlink; not followed",
                dir.display()
            )));
        }
        act(&dir.join(name))
    }
}

/// The agent's version of `path`, for the user to see: a file's text (cut
/// at [`SHOWN`] bytes), a directory's listing, a symlink's target.
pub fn show(path: &Path) -> String {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return "(gone)".into();
    };
    if meta.file_type().is_symlink() {
        return match std::fs::read_link(path) {
            Ok(t) => format!("a symlink to {}", t.display()),
            Err(_) => "a symlink".into(),
        };
    }
    if meta.is_dir() {
        let mut names: Vec<String> = Vec::new();
        let mut stack = vec![(path.to_path_buf(), PathBuf::new())];
        while let Some((dir, rel)) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in entries.flatten() {
                let r = rel.join(e.file_name());
                if names.len() >= 40 {
                    names.push("…".into());
                    return names.join("\n");
                }
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    names.push(format!("{}/", r.display()));
                    stack.push((e.path(), r));
                } else {
                    names.push(r.display().to_string());
                }
            }
        }
        return if names.is_empty() {
            "an empty directory".into()
        } else {
            names.join("\n")
        };
    }
    if !meta.is_file() {
        return "a special file".into();
    }
    use std::io::Read;
    let mut head = Vec::new();
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(path);
    if let Ok(f) = opened {
        let _ = f.take(SHOWN as u64 + 1).read_to_end(&mut head);
    }
    if head.contains(&0) {
        return format!("binary, {} bytes", meta.len());
    }
    let mut text = String::from_utf8_lossy(&head[..head.len().min(SHOWN)]).into_owned();
    if meta.len() > SHOWN as u64 {
        text.push_str(&format!("\n… ({} bytes in all)", meta.len()));
    }
    text
}

/// What it takes to put `path` back as it is now, held in memory within
/// bounds (None past them: the stash keeps it on disk).
pub(super) fn snapshot(path: &Path) -> Option<Action> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::symlink_metadata(path).ok()?;
    if meta.file_type().is_symlink() {
        return std::fs::read_link(path)
            .ok()
            .map(|t| Action::Link(path.to_path_buf(), t));
    }
    if meta.is_file() {
        if meta.len() > MAX_KEPT {
            return None;
        }
        let mode = meta.permissions().mode() & 0o7777;
        return super::read(path).map(|b| Action::Write(path.to_path_buf(), b, mode));
    }
    if !meta.is_dir() {
        return None;
    }
    let mut entries = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = path.join(&rel);
        for e in std::fs::read_dir(&dir).ok()?.flatten() {
            if entries.len() >= MAX_KEPT_ENTRIES {
                return None;
            }
            let r = rel.join(e.file_name());
            let m = e.metadata().ok()?;
            if m.file_type().is_symlink() {
                entries.push((r, Node::Link(std::fs::read_link(e.path()).ok()?)));
            } else if m.is_dir() {
                entries.push((r.clone(), Node::Dir));
                stack.push(r);
            } else if m.is_file() {
                if m.len() > MAX_KEPT {
                    return None;
                }
                let mode = m.permissions().mode() & 0o7777;
                entries.push((r, Node::File(super::read(&e.path())?, mode)));
            } else {
                return None;
            }
        }
    }
    Some(Action::Tree(path.to_path_buf(), entries))
}

impl Action {
    /// Carries the action out (outside the sandbox): never through a
    /// symlinked directory, writes atomic.
    pub fn apply(&self) -> std::io::Result<()> {
        match self {
            Action::Write(path, bytes, mode) => at_real(path, |p| {
                crate::config::atomic::write_atomic(p, bytes, *mode)
            }),
            Action::Remove(path) => at_real(path, remove),
            Action::Dir(path) => at_real(path, |p| match std::fs::create_dir(p) {
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
                other => other,
            }),
            Action::Link(path, target) => at_real(path, |p| {
                remove(p)?;
                std::os::unix::fs::symlink(target, p)
            }),
            Action::Tree(path, entries) => {
                at_real(path, |p| {
                    remove(p)?;
                    std::fs::create_dir(p)
                })?;
                for (rel, node) in entries {
                    at_real(&path.join(rel), |p| match node {
                        Node::Dir => std::fs::create_dir(p),
                        Node::File(b, mode) => crate::config::atomic::write_atomic(p, b, *mode),
                        Node::Link(t) => std::os::unix::fs::symlink(t, p),
                    })?;
                }
                Ok(())
            }
            Action::Move(from, to) => at_real(from, |f| at_real(to, |t| std::fs::rename(f, t))),
            Action::All(actions) => actions.iter().try_for_each(Action::apply),
        }
    }

    /// Writes what this action would put back beneath `dir`, each path
    /// under its own file name (a copy kept where nothing runs it); whether
    /// it wrote anything (a removal keeps nothing).
    pub fn save_under(&self, dir: &Path) -> std::io::Result<bool> {
        use std::os::unix::fs::PermissionsExt;
        let name = |p: &Path| p.file_name().map(|n| n.to_owned()).unwrap_or_default();
        // Kept copies never run: no execute or set-id bits.
        let quiet = |mode: u32| mode & 0o666;
        match self {
            Action::Write(path, bytes, mode) => {
                crate::config::atomic::write_atomic(&dir.join(name(path)), bytes, quiet(*mode))?;
                Ok(true)
            }
            Action::Link(path, target) => {
                std::os::unix::fs::symlink(target, dir.join(name(path)))?;
                Ok(true)
            }
            Action::Remove(_) | Action::Dir(_) | Action::Move(..) => Ok(false),
            Action::Tree(path, entries) => {
                let top = dir.join(name(path));
                std::fs::create_dir(&top)?;
                // Relative paths the snapshot made itself, parents first.
                for (rel, node) in entries {
                    match node {
                        Node::Dir => std::fs::create_dir(top.join(rel))?,
                        Node::File(b, mode) => {
                            crate::config::atomic::write_atomic(&top.join(rel), b, quiet(*mode))?;
                            let _ = std::fs::set_permissions(
                                top.join(rel),
                                std::fs::Permissions::from_mode(quiet(*mode)),
                            );
                        }
                        Node::Link(t) => std::os::unix::fs::symlink(t, top.join(rel))?,
                    }
                }
                Ok(true)
            }
            Action::All(actions) => actions
                .iter()
                .try_fold(false, |wrote, a| Ok(a.save_under(dir)? || wrote)),
        }
    }
}

/// Removes a file, a symlink itself, or a directory tree (whose symlinks
/// are removed, never followed).
fn remove(path: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}
