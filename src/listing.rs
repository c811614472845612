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
//!   every change to its entries, and has no subvolumes (ext2-4, xfs,
//!   tmpfs: on btrfs a snapshot's root has its origin's inode and ctime);
//! - the clock has not gone back more than [`STEP_BACK`] since.
//!
//! A listing is kept from one open file ([`Reading`]): the stamp, the file
//! system and the entries are all asked of it, so a path swapped between
//! one question and the next cannot pair one directory's stamp with
//! another's entries.
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
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
#[cfg(not(test))]
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

mod saved;
pub use saved::{load, save, this_boot};

/// How much older than the listing a directory's ctime must be for the
/// listing to be kept: timestamps of whole seconds, the tick, and a clock
/// set back by up to [`STEP_BACK`].
pub const RACY: Duration = Duration::from_secs(3);

/// A clock behind the latest listing by more than this has been set back:
/// everything kept is dropped. (Less is allowed for: two threads' walks
/// keep and reuse in either order.)
const STEP_BACK: Duration = Duration::from_secs(1);

/// A directory of more entries than this is read afresh by every walk.
pub const MAX_PER_DIR: usize = 10_000;

/// Bytes kept at most, over every directory: each one's path, names and
/// kinds, and [`PER_DIR`] for the rest (about 100,000 entries of a
/// workspace). Past it the listings kept so far are dropped, and kept
/// again from then on.
const MAX_BYTES: usize = 2 << 20;
const PER_DIR: usize = 200;

/// What an entry is, from its directory's listing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    Other,
}

impl Kind {
    /// What a listing or a `stat` says an entry is.
    fn of_type(t: rustix::fs::FileType) -> Kind {
        use rustix::fs::FileType;
        match t {
            FileType::Directory => Kind::Dir,
            FileType::RegularFile => Kind::File,
            FileType::Symlink => Kind::Symlink,
            _ => Kind::Other,
        }
    }

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

/// A directory's entries, names and kinds, packed: a name never holds a
/// NUL, so the names are kept one after another, each ended by one (a
/// listing of 20 entries is two allocations, not 20).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Listing {
    names: Vec<u8>,
    kinds: Vec<Kind>,
}

impl Listing {
    pub fn push(&mut self, name: &OsStr, kind: Kind) {
        self.names.extend_from_slice(name.as_bytes());
        self.names.push(0);
        self.kinds.push(kind);
    }

    pub fn len(&self) -> usize {
        self.kinds.len()
    }

    pub fn is_empty(&self) -> bool {
        self.kinds.is_empty()
    }

    /// Its entries, in the order they were listed.
    pub fn iter(&self) -> impl Iterator<Item = (&OsStr, Kind)> {
        self.names
            .split(|b| *b == 0)
            .map(OsStr::from_bytes)
            .zip(self.kinds.iter().copied())
    }

    /// Done listing: held as small as it is, to be shared.
    pub fn done(mut self) -> Entries {
        self.names.shrink_to_fit();
        self.kinds.shrink_to_fit();
        Arc::new(self)
    }

    /// Bytes it holds.
    fn size(&self) -> usize {
        self.names.len() + self.kinds.len()
    }
}

/// A listing once read, shared by the walks that reuse it.
pub type Entries = Arc<Listing>;

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

    // The fields' types differ between architectures and systems.
    #[allow(clippy::unnecessary_cast)]
    fn of_stat(st: &rustix::fs::Stat) -> Stamp {
        Stamp {
            dev: st.st_dev as u64,
            ino: st.st_ino as u64,
            ctime: (st.st_ctime as i64, st.st_ctime_nsec as i64),
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
    bytes: usize,
    /// The latest time a listing was read: a clock behind it has gone back.
    latest: Option<SystemTime>,
    /// Whether a listing was kept since the process started (or loaded
    /// what was saved): only then is it saved again.
    changed: bool,
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

/// The time a listing is read at: taken before the directory is asked
/// what it is.
pub fn now() -> SystemTime {
    let now = SystemTime::now();
    #[cfg(test)]
    let now = now + AHEAD.with(|a| a.get());
    now
}

/// What a directory is when a walk comes to it: which one (its device and
/// inode: a walk meets each once), its owner and mode, and its stamp.
#[derive(Debug, Clone, Copy)]
pub struct DirStat {
    pub dev: u64,
    pub ino: u64,
    pub uid: u32,
    pub mode: u32,
    stamp: Stamp,
}

impl DirStat {
    pub fn of(meta: &std::fs::Metadata) -> DirStat {
        use std::os::unix::fs::MetadataExt;
        let stamp = Stamp::of(meta);
        DirStat {
            dev: stamp.dev,
            ino: stamp.ino,
            uid: meta.uid(),
            mode: meta.mode(),
            stamp,
        }
    }
}

/// A walk's top directory, held open: each directory beneath it is asked
/// about relative to it, so the kernel walks only the components below it
/// (asked by its whole path, a directory costs a lookup of every component
/// of that path, most of a walk's time in a large workspace). Its answers
/// are the held directory's: a walk asks [`Anchor::moved`] when it is done
/// and walks again by whole paths where another directory took its place.
pub struct Anchor {
    path: PathBuf,
    fd: rustix::fd::OwnedFd,
}

impl Anchor {
    /// `path` opened, following a symlink as the walk does; `None` where it
    /// cannot be (then every directory is asked about by its whole path).
    pub fn open(path: &Path) -> Option<Anchor> {
        use rustix::fs::{Mode, OFlags};
        // Only looked up from, never read: a top directory whose read
        // permission was taken away is still held.
        #[cfg(any(target_os = "linux", target_os = "android"))]
        let how = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
        #[cfg(not(any(target_os = "linux", target_os = "android")))]
        let how = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let fd = rustix::fs::open(path, how, Mode::empty()).ok()?;
        Some(Anchor {
            path: path.to_path_buf(),
            fd,
        })
    }

    /// Whether its path no longer leads to the directory held: renamed,
    /// removed, or another put in its place since it was opened (by the
    /// agent, between a walk's first look and its last). A walk that
    /// finds so walks again by whole paths.
    pub fn moved(&self) -> bool {
        match (rustix::fs::fstat(&self.fd), rustix::fs::stat(&self.path)) {
            (Ok(held), Ok(now)) => (held.st_dev, held.st_ino) != (now.st_dev, now.st_ino),
            _ => true,
        }
    }
}

/// Runs `walk` with `top` held open, and once more by whole paths (no
/// anchor) where another directory took `top`'s place meanwhile (see
/// [`Anchor::moved`]): the answer of the walk that stands.
pub fn walk_anchored<T>(top: &Path, mut walk: impl FnMut(Option<&Anchor>) -> T) -> T {
    let anchor = Anchor::open(top);
    let walked = walk(anchor.as_ref());
    if anchor.as_ref().is_some_and(Anchor::moved) {
        return walk(None);
    }
    walked
}

/// What `dir` is now, following a symlink as `std::fs::metadata` does:
/// asked relative to `anchor` where `dir` lies beneath it.
pub fn stat_dir(anchor: Option<&Anchor>, dir: &Path) -> Option<DirStat> {
    let below = anchor.and_then(|a| dir.strip_prefix(&a.path).ok().map(|rel| (a, rel)));
    let st = match below {
        Some((a, rel)) if rel.as_os_str().is_empty() => rustix::fs::fstat(&a.fd),
        Some((a, rel)) => rustix::fs::statat(&a.fd, rel, rustix::fs::AtFlags::empty()),
        None => rustix::fs::stat(dir),
    }
    .ok()?;
    let stamp = Stamp::of_stat(&st);
    // The fields' types differ between architectures and systems.
    #[allow(clippy::unnecessary_cast)]
    Some(DirStat {
        dev: stamp.dev,
        ino: stamp.ino,
        uid: st.st_uid as u32,
        mode: st.st_mode as u32,
        stamp,
    })
}

/// The entries kept for `dir`, if it is the directory `stat` (asked after
/// `now`) describes and has not changed since they were read.
pub fn reuse(dir: &Path, stat: &DirStat, now: SystemTime) -> Option<Entries> {
    with_kept(|kept| {
        if kept.latest > Some(now + STEP_BACK) {
            // The clock went back: no stamp can be trusted to be old.
            *kept = Kept::default();
            return None;
        }
        let (stamp, entries) = kept.by_dir.get(dir)?;
        if *stamp != stat.stamp {
            return None;
        }
        #[cfg(test)]
        REUSED.with(|r| r.set(r.get() + 1));
        Some(entries.clone())
    })
    .flatten()
}

/// A directory open to be read: what it is, and what it holds, are asked
/// of this one open file.
pub struct Reading {
    dir: rustix::fs::Dir,
    /// Asked before the first entry was read.
    stamp: Option<Stamp>,
}

impl Reading {
    /// Opens `path` (following a symlink, as listing it by path would).
    pub fn open(path: &Path) -> std::io::Result<Reading> {
        use rustix::fs::{Mode, OFlags};
        let fd = rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let stamp = rustix::fs::fstat(&fd).ok().map(|st| Stamp::of_stat(&st));
        Ok(Reading {
            dir: rustix::fs::Dir::new(fd)?,
            stamp,
        })
    }
}

impl Iterator for Reading {
    /// An entry's name and its kind (asked where the listing does not say
    /// it), or why the listing stopped.
    type Item = std::io::Result<(std::ffi::OsString, std::io::Result<Kind>)>;

    fn next(&mut self) -> Option<Self::Item> {
        use rustix::fs::FileType;
        loop {
            let entry = match self.dir.read()? {
                Ok(entry) => entry,
                Err(e) => return Some(Err(e.into())),
            };
            let name = entry.file_name();
            if matches!(name.to_bytes(), b"." | b"..") {
                continue;
            }
            let kind = match entry.file_type() {
                FileType::Unknown => self
                    .dir
                    .fd()
                    .and_then(|fd| {
                        rustix::fs::statat(fd, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
                    })
                    .map(|st| Kind::of_type(FileType::from_raw_mode(st.st_mode as _)))
                    .map_err(Into::into),
                listed => Ok(Kind::of_type(listed)),
            };
            return Some(Ok((
                OsStr::from_bytes(name.to_bytes()).to_os_string(),
                kind,
            )));
        }
    }
}

/// Keeps `entries`, the whole listing of `dir` read through `read` after
/// `listed_at`, where they may be reused.
pub fn keep(dir: &Path, read: &Reading, listed_at: SystemTime, entries: &Entries) {
    let Some(stamp) = read.stamp else { return };
    let Some(old_enough) = listed_at.checked_sub(RACY) else {
        return;
    };
    if !stamp.changed_before(old_enough) {
        return;
    }
    if entries.len() > MAX_PER_DIR {
        return;
    }
    // Asked of the same open file, and before the lock (a slow file system
    // holds up no other walk).
    if !read.dir.fd().is_ok_and(stamps_every_change) {
        return;
    }
    let size = dir.as_os_str().len() + entries.size() + PER_DIR;
    if size > MAX_BYTES {
        return;
    }
    with_kept(|kept| {
        if kept.bytes + size > MAX_BYTES {
            *kept = Kept::default();
        }
        kept.latest = kept.latest.max(Some(listed_at));
        kept.changed = true;
        kept.bytes += size;
        if let Some((_, old)) = kept
            .by_dir
            .insert(dir.to_path_buf(), (stamp, entries.clone()))
        {
            kept.bytes -= size - entries.size() + old.size();
        }
    });
}

/// Whether the file system `fd` is on is a local one that stamps a
/// directory's ctime at every change to it, and has no subvolumes.
#[cfg(target_os = "linux")]
fn stamps_every_change(fd: rustix::fd::BorrowedFd<'_>) -> bool {
    const EXT4: i64 = 0xEF53;
    const XFS: i64 = 0x5846_5342;
    const TMPFS: i64 = 0x0102_1994;
    let Ok(fs) = rustix::fs::fstatfs(fd) else {
        return false;
    };
    let local = [EXT4, XFS, TMPFS];
    #[allow(clippy::unnecessary_cast)]
    local.contains(&(fs.f_type as i64))
}

/// Elsewhere, every directory is read afresh.
#[cfg(not(target_os = "linux"))]
fn stamps_every_change(_fd: rustix::fd::BorrowedFd<'_>) -> bool {
    false
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn entries(names: &[&str]) -> Entries {
        let mut list = Listing::default();
        for n in names {
            list.push(OsStr::new(n), Kind::File);
        }
        list.done()
    }

    #[test]
    fn a_listing_gives_back_what_it_was_given() {
        let mut list = Listing::default();
        let names = ["a", "", "b c", ".x"].map(OsStr::new);
        for (i, n) in names.iter().enumerate() {
            list.push(n, [Kind::File, Kind::Dir, Kind::Symlink, Kind::Other][i]);
        }
        let back: Vec<_> = list.iter().collect();
        assert_eq!(
            back,
            names
                .iter()
                .copied()
                .zip([Kind::File, Kind::Dir, Kind::Symlink, Kind::Other])
                .collect::<Vec<_>>()
        );
        assert_eq!(Listing::default().iter().count(), 0);
    }

    /// A listing is kept for a directory unchanged since, and never for
    /// one changed after it was read, or changed just before.
    #[test]
    fn an_anchor_knows_when_another_directory_took_its_place() {
        let t = tempfile::tempdir().unwrap();
        let top = std::fs::canonicalize(t.path()).unwrap().join("top");
        std::fs::create_dir_all(top.join("x")).unwrap();
        let anchor = Anchor::open(&top).unwrap();
        assert!(!anchor.moved());
        let held_x = stat_dir(Some(&anchor), &top.join("x")).unwrap();
        // Another `top` put in its place: the anchor still answers for the
        // one it holds, and says it moved.
        std::fs::rename(&top, t.path().join("top.old")).unwrap();
        std::fs::create_dir_all(top.join("x")).unwrap();
        let new_x = stat_dir(None, &top.join("x")).unwrap();
        assert_eq!(
            stat_dir(Some(&anchor), &top.join("x")).map(|s| (s.dev, s.ino)),
            Some((held_x.dev, held_x.ino))
        );
        assert_ne!((new_x.dev, new_x.ino), (held_x.dev, held_x.ino));
        assert!(anchor.moved());
        // Gone altogether: moved too.
        std::fs::remove_dir_all(&top).unwrap();
        assert!(anchor.moved());
    }

    #[test]
    fn a_listing_is_reused_only_while_the_directory_is_unchanged() {
        let t = tempfile::tempdir().unwrap();
        if !keeps_listings(t.path()) {
            return;
        }
        // In a directory of its own, whose stamp nothing else changes.
        let dir = std::fs::canonicalize(t.path()).unwrap().join("d");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("a"), "").unwrap();
        // What it holds, read through one open file.
        let read = |d: &Path| {
            let mut r = Reading::open(d).unwrap();
            let names: Vec<_> = r.by_ref().map(|e| e.unwrap().0).collect();
            (r, names)
        };
        let (r, names) = read(&dir);
        assert_eq!(names, ["a"]);
        // Read just now: its ctime is within the margin, so not kept.
        let at = now();
        keep(&dir, &r, at, &entries(&["a"]));
        // Asked relative to a walk's top directory (its parent here), as
        // by its whole path: the same directory, the same stamp.
        let parent = dir.parent().unwrap();
        let anchor = Anchor::open(parent).unwrap();
        let stat = |d: &Path| {
            let anchored = stat_dir(Some(&anchor), d).unwrap();
            let whole = stat_dir(None, d).unwrap();
            assert_eq!(
                (
                    anchored.dev,
                    anchored.ino,
                    anchored.uid,
                    anchored.mode,
                    anchored.stamp
                ),
                (whole.dev, whole.ino, whole.uid, whole.mode, whole.stamp)
            );
            anchored
        };
        let top = stat_dir(Some(&anchor), parent).unwrap();
        assert_eq!(
            top.stamp,
            DirStat::of(&std::fs::metadata(parent).unwrap()).stamp
        );
        let meta = stat(&dir);
        assert!(reuse(&dir, &meta, now()).is_none());
        // Read (as the clock says) long after its last change: kept, and
        // the open file's stamp is the path's.
        let later = at + RACY * 2;
        keep(&dir, &r, later, &entries(&["a"]));
        assert_eq!(
            reuse(&dir, &meta, later).as_deref(),
            Some(&*entries(&["a"]))
        );
        // Every change to its entries, or to its mode, gives it another
        // ctime: read afresh.
        let changes: [&dyn Fn(&Path); 4] = [
            &|d| std::fs::write(d.join("b"), "").unwrap(),
            &|d| std::fs::rename(d.join("b"), d.join("c")).unwrap(),
            &|d| std::fs::remove_file(d.join("c")).unwrap(),
            &|d| {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o750)).unwrap()
            },
        ];
        for change in changes {
            let (r, _) = read(&dir);
            keep(&dir, &r, later, &entries(&["a"]));
            let before = stat(&dir);
            assert!(reuse(&dir, &before, later).is_some());
            change(&dir);
            let after = stat(&dir);
            assert!(reuse(&dir, &after, later).is_none());
        }
        // A clock gone back drops what was kept.
        let (r, _) = read(&dir);
        keep(&dir, &r, later, &entries(&["a"]));
        let meta = stat(&dir);
        assert!(reuse(&dir, &meta, later).is_some());
        assert!(reuse(&dir, &meta, later - STEP_BACK * 2).is_none());
        assert!(reuse(&dir, &meta, later).is_none());
    }

    /// Whether listings of `dir` may be kept here (a temp directory on
    /// overlayfs or btrfs, or macOS, keeps none: the tests of reuse then
    /// say they are skipped).
    pub(crate) fn keeps_listings(dir: &Path) -> bool {
        let kept = Reading::open(dir).is_ok_and(|r| r.dir.fd().is_ok_and(stamps_every_change));
        if !kept {
            println!(
                "skipped: listings are not kept on the file system of {}",
                dir.display()
            );
        }
        kept
    }

    /// Only a local file system's stamps are trusted: never procfs's, a
    /// network's or FUSE's.
    #[test]
    #[cfg(target_os = "linux")]
    fn only_local_file_systems_keep_listings() {
        use rustix::fd::AsFd;
        use rustix::fs::{Mode, OFlags};
        let open = |p: &Path| {
            rustix::fs::open(p, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap()
        };
        let t = tempfile::tempdir().unwrap();
        if !keeps_listings(t.path()) {
            return;
        }
        assert!(stamps_every_change(open(t.path()).as_fd()));
        assert!(!stamps_every_change(open(Path::new("/proc/self")).as_fd()));
    }

    /// An entry's kind comes from the listing, or is asked.
    #[test]
    fn a_reading_gives_every_entry_and_its_kind() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir(t.path().join("d")).unwrap();
        std::fs::write(t.path().join("f"), "").unwrap();
        std::os::unix::fs::symlink("f", t.path().join("l")).unwrap();
        let mut got: Vec<_> = Reading::open(t.path())
            .unwrap()
            .map(|e| {
                let (name, kind) = e.unwrap();
                (name.into_string().unwrap(), kind.unwrap())
            })
            .collect();
        got.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            got,
            [
                ("d".to_string(), Kind::Dir),
                ("f".into(), Kind::File),
                ("l".into(), Kind::Symlink)
            ]
        );
    }
}
