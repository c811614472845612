//! What a directory holds, read once and reused while the directory says
//! it has not changed since.
//!
//! Every `run` walks the same tree three times (the policy's search for
//! nested repositories, the audit's walk before the command and after it),
//! and the bridge's audit walks it after every turn. Reading a directory
//! costs five calls and, on ext4, hashing each name; asking whether it
//! changed costs one `statx`, which the audit's walk makes anyway.
//!
//! A listing is reused only when all of these hold:
//! - the directory is the same inode on the same device, with the same
//!   ctime to the nanosecond;
//! - that ctime was older than [`RACY`] when the listing was read;
//! - the file system is a local one that stamps a directory's ctime at
//!   every change to its entries (ext2-4, xfs, btrfs, tmpfs);
//! - the clock has not gone back since the listing was read.
//!
//! Why that is enough: creating, removing, renaming or linking an entry,
//! and changing the directory's mode or owner, set the directory's ctime
//! to the time of the change, and no process chooses a ctime (`utimensat`
//! sets atime and mtime only). A change made after the listing was read is
//! stamped at least `listed_at - RACY`, so it can never carry the old ctime.
//! The margin covers stamps coarser than the clock: the kernel stamps with
//! the time of its last tick, and an ext4 inode of 128 bytes keeps whole
//! seconds. A network or FUSE file system's times are its server's, so
//! there every directory is read afresh.
//!
//! Entries' kinds are kept too: an entry cannot change kind without being
//! removed and made again, which changes the directory. Where a symlink
//! leads, and what a file holds, are not kept: the walks ask each time.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
#[cfg(not(test))]
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

/// How much older than the listing a directory's ctime must be for the
/// listing to be kept (timestamps of whole seconds, plus the tick).
pub const RACY: Duration = Duration::from_secs(2);

/// Names kept at most, over every directory: past it the listings kept so
/// far are dropped and kept again from then on (about 4 MB).
const MAX_NAMES: usize = 100_000;

/// What an entry is, from its directory's listing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    Other,
}

impl Kind {
    pub fn of(t: std::fs::FileType) -> Kind {
        if t.is_symlink() {
            Kind::Symlink
        } else if t.is_dir() {
            Kind::Dir
        } else if t.is_file() {
            Kind::File
        } else {
            Kind::Other
        }
    }
}

/// A directory's entries: names and kinds.
pub type Entries = Arc<[(OsString, Kind)]>;

/// Which directory, as it was when listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    ctime: (i64, i64),
}

impl Stamp {
    fn of(meta: &std::fs::Metadata) -> Stamp {
        use std::os::unix::fs::MetadataExt;
        Stamp {
            dev: meta.dev(),
            ino: meta.ino(),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }

    /// Whether the directory was last changed before `t`.
    fn changed_before(&self, t: SystemTime) -> bool {
        let Ok(since_epoch) = t.duration_since(SystemTime::UNIX_EPOCH) else {
            return false;
        };
        let (s, ns) = self.ctime;
        (s, ns)
            < (
                since_epoch.as_secs() as i64,
                i64::from(since_epoch.subsec_nanos()),
            )
    }
}

#[derive(Default)]
struct Kept {
    by_dir: HashMap<PathBuf, (Stamp, Entries)>,
    names: usize,
    /// Whether a device's file system stamps ctimes as above (asked once).
    trusted: HashMap<u64, bool>,
    /// The latest time a listing was read: a clock behind it has gone back.
    latest: Option<SystemTime>,
}

/// What is kept, for the whole process.
#[cfg(not(test))]
static KEPT: Mutex<Option<Kept>> = Mutex::new(None);

#[cfg(not(test))]
fn with_kept<T>(f: impl FnOnce(&mut Kept) -> T) -> Option<T> {
    let mut kept = KEPT.lock().ok()?;
    Some(f(kept.get_or_insert_with(Kept::default)))
}

#[cfg(test)]
thread_local! {
    /// How far this test's clock is ahead (so that a directory it just
    /// made counts as old enough to keep).
    static AHEAD: std::cell::Cell<Duration> = const { std::cell::Cell::new(Duration::ZERO) };
    /// What is kept, for this test's thread alone (tests run side by side
    /// with clocks set apart).
    static KEPT: std::cell::RefCell<Kept> = std::cell::RefCell::default();
    /// How many listings this thread reused.
    static REUSED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// How many listings this test's thread has reused so far.
#[cfg(test)]
pub fn reused() -> usize {
    REUSED.with(|r| r.get())
}

#[cfg(test)]
fn with_kept<T>(f: impl FnOnce(&mut Kept) -> T) -> Option<T> {
    KEPT.with(|k| Some(f(&mut k.borrow_mut())))
}

/// Sets this thread's clock ahead by `by`, for tests of kept listings.
#[cfg(test)]
pub fn clock_ahead(by: Duration) {
    AHEAD.with(|a| a.set(by));
}

/// The time a listing is read at: taken before the directory's `statx`.
pub fn now() -> SystemTime {
    let now = SystemTime::now();
    #[cfg(test)]
    let now = now + AHEAD.with(|a| a.get());
    now
}

/// The entries kept for `dir`, if it is the directory `meta` (asked after
/// `now`) describes and has not changed since they were read.
pub fn reuse(dir: &Path, meta: &std::fs::Metadata, now: SystemTime) -> Option<Entries> {
    with_kept(|kept| {
        if kept.latest > Some(now) {
            // The clock went back: no stamp can be trusted to be old.
            *kept = Kept::default();
            return None;
        }
        let (stamp, entries) = kept.by_dir.get(dir)?;
        if *stamp != Stamp::of(meta) {
            return None;
        }
        #[cfg(test)]
        REUSED.with(|r| r.set(r.get() + 1));
        Some(entries.clone())
    })
    .flatten()
}

/// Keeps `entries`, the whole listing of `dir` read after `meta` was asked
/// at `listed_at`, where they may be reused.
pub fn keep(dir: &Path, meta: &std::fs::Metadata, listed_at: SystemTime, entries: &Entries) {
    let stamp = Stamp::of(meta);
    let Some(old_enough) = listed_at.checked_sub(RACY) else {
        return;
    };
    if !stamp.changed_before(old_enough) {
        return;
    }
    with_kept(|kept| {
        let trusted = *kept
            .trusted
            .entry(stamp.dev)
            .or_insert_with(|| stamps_every_change(dir));
        if !trusted {
            return;
        }
        if kept.names + entries.len() > MAX_NAMES {
            let trusted = std::mem::take(&mut kept.trusted);
            *kept = Kept {
                trusted,
                ..Kept::default()
            };
        }
        kept.latest = kept.latest.max(Some(listed_at));
        kept.names += entries.len();
        if let Some((_, old)) = kept
            .by_dir
            .insert(dir.to_path_buf(), (stamp, entries.clone()))
        {
            kept.names -= old.len();
        }
    });
}

/// Whether `dir`'s file system is a local one that stamps a directory's
/// ctime at every change to it.
#[cfg(target_os = "linux")]
fn stamps_every_change(dir: &Path) -> bool {
    use nix::sys::statfs::{
        statfs, BTRFS_SUPER_MAGIC, EXT4_SUPER_MAGIC, TMPFS_MAGIC, XFS_SUPER_MAGIC,
    };
    let Ok(fs) = statfs(dir) else { return false };
    let local = [
        EXT4_SUPER_MAGIC,
        XFS_SUPER_MAGIC,
        BTRFS_SUPER_MAGIC,
        TMPFS_MAGIC,
    ];
    local.contains(&fs.filesystem_type())
}

/// Elsewhere, every directory is read afresh.
#[cfg(not(target_os = "linux"))]
fn stamps_every_change(_dir: &Path) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(names: &[&str]) -> Entries {
        names
            .iter()
            .map(|n| (OsString::from(n), Kind::File))
            .collect::<Vec<_>>()
            .into()
    }

    /// A listing is kept for a directory unchanged since, and never for
    /// one changed after it was read, or changed just before.
    #[test]
    fn a_listing_is_reused_only_while_the_directory_is_unchanged() {
        let t = tempfile::tempdir().unwrap();
        let dir = std::fs::canonicalize(t.path()).unwrap();
        std::fs::write(dir.join("a"), "").unwrap();
        // Read just now: its ctime is within the margin, so not kept.
        let at = now();
        let meta = std::fs::metadata(&dir).unwrap();
        keep(&dir, &meta, at, &entries(&["a"]));
        assert!(reuse(&dir, &meta, now()).is_none());
        // Read (as the clock says) long after its last change: kept.
        let later = at + RACY * 2;
        keep(&dir, &meta, later, &entries(&["a"]));
        assert_eq!(
            reuse(&dir, &meta, later).as_deref(),
            Some(&entries(&["a"])[..])
        );
        // Every change to its entries, or to its mode, gives it another
        // ctime: read afresh.
        let changes: [&dyn Fn(&Path); 4] = [
            &|d| std::fs::write(d.join("b"), "").unwrap(),
            &|d| std::fs::rename(d.join("b"), d.join("c")).unwrap(),
            &|d| std::fs::remove_file(d.join("c")).unwrap(),
            &|d| {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700)).unwrap()
            },
        ];
        for change in changes {
            let before = std::fs::metadata(&dir).unwrap();
            keep(&dir, &before, later, &entries(&["a"]));
            assert!(reuse(&dir, &before, later).is_some());
            change(&dir);
            let after = std::fs::metadata(&dir).unwrap();
            assert!(reuse(&dir, &after, later).is_none());
        }
        // A clock gone back drops what was kept.
        keep(
            &dir,
            &std::fs::metadata(&dir).unwrap(),
            later,
            &entries(&["a"]),
        );
        let meta = std::fs::metadata(&dir).unwrap();
        assert!(reuse(&dir, &meta, at).is_none());
        assert!(reuse(&dir, &meta, later).is_none());
    }

    /// Only a local file system's stamps are trusted: never procfs's, a
    /// network's or FUSE's.
    #[test]
    #[cfg(target_os = "linux")]
    fn only_local_file_systems_keep_listings() {
        let t = tempfile::tempdir().unwrap();
        assert!(stamps_every_change(t.path()));
        assert!(!stamps_every_change(Path::new("/proc/self")));
        assert!(!stamps_every_change(Path::new("/nonexistent")));
    }
}
