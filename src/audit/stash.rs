//! Keeping what the audit undoes: a finding is always undone, and the
//! agent's version is kept where it can be, so choosing "keep" (or reading
//! it later) loses nothing. What is small enough is held in memory by the
//! finding itself; what is not is moved aside, into a directory of its own
//! under `~/.zcode-acp/reverted/` where nothing runs it, numbered, with an
//! `index.txt` saying which number is what. What cannot be kept at all (the
//! disk is full) is undone all the same, and said.

use std::path::{Path, PathBuf};

use super::{Action, Finding};
use crate::config::managed::ManagedRoot;

/// One bridge's or run's directory of kept versions, made on first use.
#[derive(Debug)]
pub struct Stash {
    base: Result<PathBuf, String>,
    label: String,
    dir: Option<PathBuf>,
    next: usize,
}

/// What undoing a finding did.
#[derive(Debug)]
pub struct Undone {
    /// Put back as it was when the sandbox was armed, or why not.
    pub reverted: Result<(), String>,
    /// Puts the agent's version back (from memory, or from the stash).
    pub keep: Option<Action>,
    /// Where the agent's version is kept on disk.
    pub kept_at: Option<PathBuf>,
    /// Why the agent's version could not be kept.
    pub not_kept: Option<String>,
}

impl Stash {
    /// A stash under `managed`'s `reverted/`, named after `label`.
    pub fn new(managed: &ManagedRoot, label: &str) -> Stash {
        Stash {
            base: managed.dir("reverted").map_err(|e| e.to_string()),
            label: label.to_owned(),
            dir: None,
            next: 0,
        }
    }

    /// The directory of this stash, made now if it is not yet.
    pub fn dir(&mut self) -> Result<&Path, String> {
        if self.dir.is_none() {
            let base = self.base.clone()?;
            let dir = base.join(&self.label);
            std::fs::create_dir_all(&dir)
                .map_err(|e| format!("cannot make {}: {e}", dir.display()))?;
            self.dir = Some(dir);
        }
        Ok(self.dir.as_deref().expect("made above"))
    }

    /// A fresh numbered directory for one finding, with its line in the
    /// index.
    fn slot(&mut self, f: &Finding) -> Result<PathBuf, String> {
        let n = self.next;
        self.next += 1;
        let dir = self.dir()?.to_path_buf();
        let slot = dir.join(n.to_string());
        std::fs::create_dir(&slot).map_err(|e| format!("cannot make {}: {e}", slot.display()))?;
        use std::io::Write;
        let line = format!("{n}: {}: {}\n", f.path.display(), f.what);
        let _ = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("index.txt"))
            .and_then(|mut i| i.write_all(line.as_bytes()));
        Ok(slot)
    }

    /// Undoes `f` (it has a revert), keeping the agent's version: in
    /// memory where the finding holds it (and, with `on_disk`, a copy in
    /// the stash as well), else moved into the stash.
    pub fn undo(&mut self, f: &Finding, on_disk: bool) -> Undone {
        let Some(revert) = &f.revert else {
            return Undone {
                reverted: Err("nothing of it is the agent's alone to undo".into()),
                keep: None,
                kept_at: None,
                not_kept: None,
            };
        };
        let mut keep = f.keep.clone();
        let mut kept_at = None;
        let mut not_kept = None;
        let present = std::fs::symlink_metadata(&f.path).is_ok();
        if let (Some(copy), true) = (&f.keep, on_disk) {
            match self.slot(f) {
                Ok(slot) => match copy.save_under(&slot) {
                    Ok(true) => kept_at = Some(slot),
                    Ok(false) => {
                        let _ = remove_all(&slot);
                    }
                    Err(e) => {
                        let _ = remove_all(&slot);
                        not_kept = Some(format!("its copy could not be written ({e})"));
                    }
                },
                Err(e) => not_kept = Some(e),
            }
        } else if f.keep.is_none() && present {
            match self.slot(f) {
                Ok(slot) => {
                    let name = f
                        .path
                        .file_name()
                        .map(|n| n.to_owned())
                        .unwrap_or_else(|| "kept".into());
                    let to = slot.join(name);
                    match move_aside(&f.path, &to) {
                        Ok(()) => {
                            keep = Some(Action::Move(to, f.path.clone()));
                            kept_at = Some(slot);
                        }
                        Err(e) => {
                            let _ = remove_all(&slot);
                            not_kept = Some(format!("it could not be moved aside ({e})"));
                        }
                    }
                }
                Err(e) => not_kept = Some(e),
            }
        }
        let reverted = revert.apply().map_err(|e| e.to_string());
        Undone {
            reverted,
            keep,
            kept_at,
            not_kept,
        }
    }
}

/// Moves `from` to `to`: a rename, or where they are on different
/// filesystems, a copy (never through a symlink) and then the original
/// removed; a copy that fails is removed, and the original left.
fn move_aside(from: &Path, to: &Path) -> std::io::Result<()> {
    match Action::Move(from.to_path_buf(), to.to_path_buf()).apply() {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(nix::libc::EXDEV) => {
            if let Err(e) = copy_tree(from, to) {
                let _ = remove_all(to);
                return Err(e);
            }
            Action::Remove(from.to_path_buf()).apply()
        }
        Err(e) => Err(e),
    }
}

/// The most a move across filesystems copies before giving up (the
/// original is then undone all the same, and not kept).
const MAX_COPY: u64 = 1 << 30;

fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    let mut budget = MAX_COPY;
    copy_within(from, to, &mut budget)
}

fn copy_within(from: &Path, to: &Path, budget: &mut u64) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::symlink_metadata(from)?;
    if meta.file_type().is_symlink() {
        return std::os::unix::fs::symlink(std::fs::read_link(from)?, to);
    }
    if meta.is_dir() {
        std::fs::create_dir(to)?;
        for e in std::fs::read_dir(from)? {
            let e = e?;
            copy_within(&e.path(), &to.join(e.file_name()), budget)?;
        }
        return Ok(());
    }
    if meta.is_file() {
        if meta.len() > *budget {
            return Err(std::io::Error::other(format!(
                "more than {} MiB would have to be copied",
                MAX_COPY >> 20
            )));
        }
        *budget -= meta.len();
        let mut src = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
            .open(from)?;
        let mut dst = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(meta.permissions().mode() & 0o666)
            .open(to)?;
        std::io::copy(&mut src, &mut dst)?;
        return Ok(());
    }
    Ok(()) // a device or FIFO: not copied
}

use std::os::unix::fs::OpenOptionsExt;

fn remove_all(p: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(p),
        Ok(_) => std::fs::remove_file(p),
        Err(_) => Ok(()),
    }
}
