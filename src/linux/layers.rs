//! Copy-on-write layers for the caches shared with your own builds
//! (`~/.cargo/registry`, `~/.cargo/git`, `~/.cache`, `~/.npm`). cargo does
//! not re-check sources it has extracted, so a `build.rs` an agent planted
//! in the shared registry would run in the next build of another project,
//! unconfined. The sandbox reads the user's caches, but what it writes
//! there goes into a layer of its own: an overlay whose lower layer is the
//! user's cache and whose upper directory is a slot under
//! `~/.zcode-acp/layers/PROJECT/`, which survives restarts (a re-arm does
//! not download everything again) and no other project sees.
//!
//! Each launch holds its slot with a lock (`N.lock`) while its helper
//! runs: two sandboxes never share an upper (overlayfs forbids it), so the
//! second takes the next slot. An editor terminal that joins its agent's
//! generation works in the generation's slot, and holds `N.join` shared
//! for as long as it runs: a terminal may outlive its generation, and the
//! next sandbox must not mount the slot it still uses, so a slot is taken
//! only when nobody holds either lock. A slot that has grown past [`CAP`]
//! is emptied before use.
//!
//! The overlays are mounted `volatile`: overlayfs then skips syncing the
//! whole upper filesystem when a sandbox ends (about 0.2 ms per cache on
//! every launch, and more on a busy disk). What the sandbox wrote is still
//! written back as any file is, but a volatile upper is only whole if the
//! machine did not crash, so a slot last mounted in another boot (`N.boot`
//! holds the boot's id) starts empty: after any reboot the agent's caches
//! fill again from yours and the network. Where the boot cannot be told,
//! the overlays are mounted as before.

use std::fs::File;
use std::path::{Path, PathBuf};

use super::plan::Step;

/// A slot larger than this is emptied before it is used again.
pub const CAP: u64 = 8 << 30;
/// Slots per project (sandboxes of one project running at once).
const SLOTS: usize = 16;

/// Why no copy-on-write slot could be taken.
#[derive(Debug, thiserror::Error)]
pub enum LayerError {
    #[error("cannot prepare {path}: {source}")]
    Dir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "all {SLOTS} slots under {0} are in use (as many sandboxes of this project are running)"
    )]
    Full(PathBuf),
}

/// Opens (making it if needed, never through a symlink) one of a slot's
/// lock files.
fn lock_file(path: &Path) -> Result<File, LayerError> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(dir_error(path))
}

/// The lock file joiners of slot `N` hold: `N.join` beside `N.lock`.
fn join_lock_of(slot_lock: &Path) -> PathBuf {
    slot_lock.with_extension("join")
}

/// The lock file (`BASE/N.lock`) of the slot process `pid` holds, read
/// from its open descriptors (only the process's owner can).
pub fn held_by(pid: i32, base: &Path) -> Option<PathBuf> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .ok()?
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .find(|target| {
            target.parent() == Some(base)
                && target.extension().is_some_and(|e| e == "lock")
                && target
                    .file_stem()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.parse::<usize>().is_ok_and(|n| n < SLOTS))
        })
}

/// A joiner's hold on a slot its generation took (see the module's doc).
pub struct Joined {
    _lock: nix::fcntl::Flock<File>,
}

impl Joined {
    /// Holds the slot whose lock file is `slot_lock` (`BASE/N.lock`) for
    /// as long as this value lives. Taken before the generation is checked
    /// to be alive and still holding `N.lock` ([`super::join::Join::open`]):
    /// then no later sandbox can have taken the slot in between.
    pub fn hold(slot_lock: &Path) -> Result<Joined, LayerError> {
        let path = join_lock_of(slot_lock);
        let file = lock_file(&path)?;
        let lock =
            nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockShared).map_err(|(_, e)| {
                LayerError::Dir {
                    path,
                    source: e.into(),
                }
            })?;
        Ok(Joined { _lock: lock })
    }
}

fn dir_error(path: &Path) -> impl FnOnce(std::io::Error) -> LayerError + '_ {
    move |source| LayerError::Dir {
        path: path.to_path_buf(),
        source,
    }
}

/// The slot a launch holds.
pub struct Slot {
    pub dir: PathBuf,
    /// Whether its overlays are mounted `volatile` (see the module's doc):
    /// it was emptied, or last mounted, in this boot.
    pub volatile: bool,
    /// The lock, held while the launch runs (its descriptor is closed on
    /// exec, and released when the slot is dropped).
    _lock: nix::fcntl::Flock<File>,
}

impl Slot {
    /// Takes the first free slot below `base`, with an upper and a work
    /// directory for each of `layered`. Runs as you, before any namespace.
    pub fn take(base: &Path, layered: &[Step]) -> Result<Slot, LayerError> {
        crate::config::atomic::create_real_dir_path(base, 0o700).map_err(dir_error(base))?;
        for n in 0..SLOTS {
            let lock_path = base.join(format!("{n}.lock"));
            let Ok(lock) = nix::fcntl::Flock::lock(
                lock_file(&lock_path)?,
                nix::fcntl::FlockArg::LockExclusiveNonblock,
            ) else {
                continue;
            };
            // A terminal of an ended generation may still work in it.
            let joiners = lock_file(&join_lock_of(&lock_path))?;
            if nix::fcntl::Flock::lock(joiners, nix::fcntl::FlockArg::LockExclusiveNonblock)
                .is_err()
            {
                continue;
            }
            let dir = base.join(n.to_string());
            crate::config::atomic::create_real_dir_path(&dir, 0o700).map_err(dir_error(&dir))?;
            // Before measuring: a slot of another boot is emptied anyway.
            let volatile = of_this_boot(base, n, &dir)?;
            if due_for_measuring(base, n) {
                if grown_past(&dir, CAP) {
                    tracing::warn!(slot = %dir.display(), "the caches' layer grew past {} GiB; it starts empty", CAP >> 30);
                    empty(&dir).map_err(dir_error(&dir))?;
                }
                // Stamped once measured (and emptied where it had to be).
                stamp_measured(base, n);
            }
            let slot = Slot {
                dir,
                volatile,
                _lock: lock,
            };
            // Beneath the slot's directory, made real above: walked from
            // there, not from `/` (this runs at every launch).
            for l in layered {
                let key = crate::config::managed::project_key(&l.path);
                for d in ["upper", "work"] {
                    crate::config::atomic::create_real_dirs(&slot.dir, &[&key, d], 0o700)
                        .map_err(dir_error(&slot.dir.join(&key).join(d)))?;
                }
            }
            return Ok(slot);
        }
        Err(LayerError::Full(base.to_path_buf()))
    }

    /// The upper and work directories for the cache at `target`.
    /// (Kept in step with [`Slot::take`], which makes them.)
    pub fn layer_for(&self, target: &Path) -> (PathBuf, PathBuf) {
        let d = self.dir.join(crate::config::managed::project_key(target));
        (d.join("upper"), d.join("work"))
    }
}

/// Whether slot `n` (at `dir`) may be mounted `volatile`: it is of this
/// boot, or emptied now because it was last used in another (its last
/// volatile mount may not have reached the disk whole: a crash). `false`
/// where the boot cannot be told (a slot stamped in some boot is emptied
/// first: a volatile upper may be torn) or the stamp cannot be written.
fn of_this_boot(base: &Path, n: usize, dir: &Path) -> Result<bool, LayerError> {
    let stamp = base.join(format!("{n}.boot"));
    let last = crate::config::atomic::read_nofollow(&stamp).ok();
    let boot = crate::listing::this_boot();
    if boot.is_some() && last == boot.as_ref().map(|b| b.as_bytes().to_vec()) {
        return Ok(true);
    }
    if last.is_some() || boot.is_some() {
        empty(dir).map_err(dir_error(dir))?;
    }
    let Some(boot) = boot else {
        // Mounted as before from now on; a stamp left would say a boot
        // this slot no longer knows.
        let _ = std::fs::remove_file(&stamp);
        return Ok(false);
    };
    // Unstamped, the emptied slot is mounted as before.
    Ok(crate::config::atomic::write_atomic(&stamp, boot.as_bytes(), 0o600).is_ok())
}

/// Lets a `volatile` overlay be mounted again on `work`: overlayfs leaves
/// `work/incompat/volatile` behind and refuses the next mount while it
/// exists, since after a crash the upper would not be whole. Only called
/// for a slot of this boot ([`Slot::volatile`]), whose upper is whole.
/// Inside the launch's user namespace (the directory is overlayfs's, mode
/// 000); what is left makes the mount fail, which is then said.
pub(super) fn clear_volatile_mark(work: &Path) {
    let mark = work.join("work/incompat/volatile");
    // Its one entry (`dirty`), then itself: two calls where removing the
    // tree would take a dozen, on every launch.
    let _ = std::fs::remove_file(mark.join("dirty"));
    if let Err(e) = std::fs::remove_dir(&mark) {
        if e.kind() != std::io::ErrorKind::NotFound {
            let _ = std::fs::remove_dir_all(&mark);
        }
    }
}

/// Measuring a slot walks all of it (tens of thousands of files after a
/// few builds), which every launch, editor terminals included, would pay:
/// a slot is measured at most every ten minutes, stamped beside its lock.
fn due_for_measuring(base: &Path, n: usize) -> bool {
    let recent = std::fs::symlink_metadata(base.join(format!("{n}.measured")))
        .ok()
        .filter(|m| m.file_type().is_file())
        .and_then(|m| m.modified().ok())
        .and_then(|t| t.elapsed().ok())
        .is_some_and(|age| age < std::time::Duration::from_secs(600));
    !recent
}

/// Made anew (never through a symlink): its mtime is the stamp.
fn stamp_measured(base: &Path, n: usize) {
    use std::os::unix::fs::OpenOptionsExt;
    let stamp = base.join(format!("{n}.measured"));
    let _ = std::fs::remove_file(&stamp);
    let _ = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&stamp);
}

/// Whether the tree at `dir` holds more than `cap` bytes (walked only as
/// far as needed to tell).
fn grown_past(dir: &Path, cap: u64) -> bool {
    let mut total = 0u64;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(m) = e.path().symlink_metadata() else {
                continue;
            };
            if m.is_dir() {
                stack.push(e.path());
            } else {
                total += m.len();
                if total > cap {
                    return true;
                }
            }
        }
    }
    false
}

/// Removes everything in `dir` (the work directories overlayfs leaves are
/// mode 000, and so is what a `volatile` mount leaves in them: each is
/// made searchable before it is listed).
fn empty(dir: &Path) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)?.flatten() {
        let p = e.path();
        if e.file_type()?.is_dir() {
            open_up(&p);
            std::fs::remove_dir_all(&p)?;
        } else {
            std::fs::remove_file(&p)?;
        }
    }
    Ok(())
}

/// Makes every directory of the tree at `root` yours to list and empty,
/// each before it is listed (its subdirectories are found only then).
/// Never through a symlink: only what `read_dir` says is a directory.
fn open_up(root: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        let _ = std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700));
        if let Ok(entries) = std::fs::read_dir(&d) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(e.path());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_launches_never_share_a_slot_and_a_slot_is_reused_once_free() {
        let t = tempfile::tempdir().unwrap();
        let layered = vec![Step {
            path: "/home/u/.cache".into(),
            why: "cache".into(),
        }];
        let a = Slot::take(t.path(), &layered).unwrap();
        let b = Slot::take(t.path(), &layered).unwrap();
        assert_ne!(a.dir, b.dir);
        let (upper, work) = a.layer_for(Path::new("/home/u/.cache"));
        assert!(upper.is_dir() && work.is_dir());
        let first = a.dir.clone();
        drop(a);
        let c = Slot::take(t.path(), &layered).unwrap();
        assert_eq!(c.dir, first, "a freed slot (and its layer) is used again");
        drop((b, c));
        assert!(!grown_past(t.path(), 1 << 20));
        std::fs::write(first.join("big"), vec![0u8; 4096]).unwrap();
        assert!(grown_past(t.path(), 1024));
        empty(&first).unwrap();
        assert_eq!(std::fs::read_dir(&first).unwrap().count(), 0);
    }

    #[test]
    fn a_slot_a_terminal_still_works_in_is_not_taken() {
        let t = tempfile::tempdir().unwrap();
        let first = Slot::take(t.path(), &[]).unwrap();
        let lock = held_by(std::process::id() as i32, t.path()).expect("this process holds it");
        assert_eq!(lock, t.path().join("0.lock"));
        // Its generation ends while a terminal that joined it still runs.
        let terminal = Joined::hold(&lock).unwrap();
        drop(first);
        let next = Slot::take(t.path(), &[]).unwrap();
        assert_eq!(next.dir, t.path().join("1"), "the joined slot is skipped");
        drop((next, terminal));
        let again = Slot::take(t.path(), &[]).unwrap();
        assert_eq!(
            again.dir,
            t.path().join("0"),
            "free again once the terminal ends"
        );
    }

    #[test]
    fn a_slot_is_measured_at_most_every_ten_minutes() {
        let t = tempfile::tempdir().unwrap();
        assert!(due_for_measuring(t.path(), 0));
        stamp_measured(t.path(), 0);
        assert!(!due_for_measuring(t.path(), 0));
        assert!(
            due_for_measuring(t.path(), 1),
            "each slot has its own stamp"
        );
        let stamp = std::fs::File::options()
            .write(true)
            .open(t.path().join("0.measured"))
            .unwrap();
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(601);
        stamp.set_modified(old).unwrap();
        assert!(due_for_measuring(t.path(), 0));
    }
}
