//! The kept listings, saved between processes.
//!
//! Each `zcode-acp run` is a process of its own, so what one run kept
//! would be read again by the next: in a repository of 20,000 files that
//! is most of the run's time. The listings are saved when the run ends
//! (`~/.zcode-acp/listings/`, which no sandbox can write) and loaded when
//! the next one starts, then reused under the same rules as in one process
//! (see the module above): a directory's stamp is asked afresh each time.
//!
//! What a saved file may not carry over:
//! - another boot's listings (device numbers and the clock start anew):
//!   the file names the boot it was written in, and is dropped in another;
//! - a clock set back since: the file keeps how far the wall clock was
//!   ahead of the time since boot; a file written when it was ahead by
//!   more than [`STEP_BACK`] more than now, or whose latest listing is
//!   ahead of the clock, is dropped whole, and removed (so a clock that
//!   later passes it again does not revive it);
//! - whole-second stamps (an ext4 inode of 128 bytes): a change made in
//!   the same second once the clock came back to it would carry the same
//!   stamp, so those are kept in one process only, as are the listings of
//!   a file system with no device of its own (tmpfs: its device number is
//!   given again to the next one mounted);
//! - a torn file: the file ends with a checksum of the rest (against
//!   accidents, not forgery: the file is trusted as much as the directory
//!   it is in, `~/.zcode-acp`, which must be yours, mode 0600, and no
//!   symlink), and every entry's name is checked as a listing would give
//!   it (no `/`, no NUL, not `.` or `..`); anything else drops the file.
//!
//! Nothing is synced to disk: a file lost in a crash only costs the next
//! run its reading.

use std::io::Write;

use std::os::unix::fs::OpenOptionsExt;

use super::*;

const MAGIC: &[u8] = b"zcode-acp listings 3\n";

/// A checksum of `bytes`, eight at a time: enough to find a torn or
/// truncated file, or a changed byte (against accidents, not forgery; see
/// the module's header). Each step is a bijection of the running value for
/// a given word, and of the word for a given running value (a rotation,
/// an xor, a multiplication by an odd constant), so a change within one
/// aligned 8-byte word always changes the sum; one across words is caught
/// but for one chance in 2^64. The length goes into the seed, so a tail
/// padded with zeros is not another file's. (Byte-at-a-time FNV-1a took
/// 0.28 ms of a run's start for a repository of 20,000 files; this 0.045.)
fn checksum(bytes: &[u8]) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let step = |h: u64, word: u64| (h.rotate_left(23) ^ word).wrapping_mul(K);
    let mut words = bytes.chunks_exact(8);
    let mut h = 0xcbf2_9ce4_8422_2325 ^ bytes.len() as u64;
    for w in &mut words {
        h = step(h, u64::from_le_bytes(w.try_into().unwrap_or_default()));
    }
    let mut tail = [0u8; 8];
    tail[..words.remainder().len()].copy_from_slice(words.remainder());
    step(h, u64::from_le_bytes(tail))
}

/// How far the wall clock is ahead of the time since boot, in nanoseconds:
/// it shrinks when the clock is set back.
#[cfg(target_os = "linux")]
// A timespec's fields are narrower on some architectures.
#[allow(clippy::useless_conversion)]
fn clock_offset() -> i64 {
    let read = |clock| {
        let mut t = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `t` is a valid timespec for the call to fill.
        unsafe { libc::clock_gettime(clock, &mut t) };
        i64::from(t.tv_sec) * 1_000_000_000 + i64::from(t.tv_nsec)
    };
    read(libc::CLOCK_REALTIME) - read(libc::CLOCK_BOOTTIME)
}

#[cfg(not(target_os = "linux"))]
fn clock_offset() -> i64 {
    0
}

/// Whether a listing with `stamp` may outlive this process (see the
/// module's header).
fn may_be_saved(stamp: &Stamp) -> bool {
    stamp.ctime.1 != 0 && rustix::fs::major(stamp.dev as _) != 0
}

/// This boot's id, as the kernel gives it (`None` where it gives none).
pub fn this_boot() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|id| id.trim().to_owned())
        .filter(|id| !id.is_empty())
}

fn put(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
}

/// What is kept, as a file's bytes; `None` when nothing new was kept since
/// the process started (or loaded), or this boot cannot be named.
fn encode(kept: &Kept, boot: &[u8], offset: i64) -> Option<Vec<u8>> {
    if !kept.changed {
        return None;
    }
    let latest = kept.latest?.duration_since(SystemTime::UNIX_EPOCH).ok()?;
    let mut out = MAGIC.to_vec();
    put(&mut out, boot);
    out.extend_from_slice(&offset.to_le_bytes());
    out.extend_from_slice(&latest.as_secs().to_le_bytes());
    out.extend_from_slice(&latest.subsec_nanos().to_le_bytes());
    let saved: Vec<_> = kept
        .by_dir
        .iter()
        .filter(|(_, (stamp, _))| may_be_saved(stamp))
        .collect();
    out.extend_from_slice(&(saved.len() as u32).to_le_bytes());
    for (dir, (stamp, entries)) in saved {
        put(&mut out, dir.as_os_str().as_bytes());
        for n in [stamp.dev, stamp.ino] {
            out.extend_from_slice(&n.to_le_bytes());
        }
        for n in [stamp.ctime.0, stamp.ctime.1] {
            out.extend_from_slice(&n.to_le_bytes());
        }
        put(&mut out, &entries.names);
        let kinds: Vec<u8> = entries.kinds.iter().map(|k| *k as u8).collect();
        put(&mut out, &kinds);
    }
    let sum = checksum(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    Some(out)
}

/// Reads a saved file's bytes, front to back.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    fn sized(&mut self) -> Option<&'a [u8]> {
        let n = self.u32()? as usize;
        self.take(n)
    }
}

/// Whether a directory's listing could give `name`.
fn listable(name: &[u8]) -> bool {
    !name.is_empty() && name != b"." && name != b".." && !name.contains(&b'/')
}

/// A listing as a saved file holds it, if it is one a directory could
/// have given.
fn listing(names: &[u8], kinds: &[u8]) -> Option<Listing> {
    let kinds: Vec<Kind> = kinds
        .iter()
        .map(|k| match k {
            0 => Some(Kind::File),
            1 => Some(Kind::Dir),
            2 => Some(Kind::Symlink),
            3 => Some(Kind::Other),
            _ => None,
        })
        .collect::<Option<_>>()?;
    if kinds.len() > MAX_PER_DIR || names.last().is_some_and(|b| *b != 0) {
        return None;
    }
    let mut count = 0;
    if !names.is_empty() {
        for name in names[..names.len() - 1].split(|b| *b == 0) {
            if !listable(name) {
                return None;
            }
            count += 1;
        }
    }
    (count == kinds.len()).then(|| Listing {
        names: names.to_vec(),
        kinds,
    })
}

/// One directory's listing as saved: its path, its stamp, its entries.
type Saved = (PathBuf, Stamp, Listing);

/// The listings a saved file holds, with the latest time one was read; `None`
/// for a file of another boot, one written before the clock was set back
/// (`offset` is the clock's now), or one torn.
fn decode(bytes: &[u8], boot: &[u8], offset: i64) -> Option<(SystemTime, Vec<Saved>)> {
    let (body, sum) = bytes.split_at_checked(bytes.len().checked_sub(8)?)?;
    if checksum(body) != u64::from_le_bytes(sum.try_into().ok()?) {
        return None;
    }
    let mut at = Cursor(body);
    if at.take(MAGIC.len())? != MAGIC {
        return None;
    }
    // Another boot's device numbers and clock are not this one's.
    if at.sized()? != boot {
        return None;
    }
    let then = at.u64()? as i64;
    if then.saturating_sub(offset) > STEP_BACK.as_nanos() as i64 {
        return None;
    }
    let secs = at.u64()?;
    let nanos = at.u32()?;
    if nanos >= 1_000_000_000 {
        return None;
    }
    let latest = SystemTime::UNIX_EPOCH.checked_add(Duration::new(secs, nanos))?;
    let count = at.u32()? as usize;
    let mut out = Vec::new();
    for _ in 0..count {
        let dir = PathBuf::from(OsStr::from_bytes(at.sized()?));
        let stamp = Stamp {
            dev: at.u64()?,
            ino: at.u64()?,
            ctime: (at.u64()? as i64, at.u64()? as i64),
        };
        let names = at.sized()?;
        let kinds = at.sized()?;
        if !dir.is_absolute() || !may_be_saved(&stamp) {
            return None;
        }
        out.push((dir, stamp, listing(names, kinds)?));
    }
    at.0.is_empty().then_some((latest, out))
}

/// Takes in the listings saved at `path` (see the module's header for what
/// is not taken); a missing or unreadable file is no listing.
pub fn load(path: &Path) {
    let Some(boot) = this_boot() else { return };
    let Some(bytes) = read_own(path) else {
        return;
    };
    let taken = decode(&bytes, boot.as_bytes(), clock_offset())
        .filter(|(latest, _)| not_ahead(*latest))
        .map(|(latest, listings)| with_kept(|kept| take(kept, latest, listings)));
    if taken.is_none() {
        // Another boot's, torn, or from before the clock was set back:
        // gone, so that it never counts again.
        let _ = std::fs::remove_file(path);
    }
}

/// Whether a listing read at `latest` is not ahead of the clock (by more
/// than a step two walks' threads may take in either order).
fn not_ahead(latest: SystemTime) -> bool {
    latest <= now() + STEP_BACK
}

/// A saved file's bytes, if it is a plain file of this user's that no one
/// else may write, and no larger than what is kept at most could make.
fn read_own(path: &Path) -> Option<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .ok()?;
    let meta = file.metadata().ok()?;
    let own = meta.is_file()
        && meta.uid() == nix::unistd::geteuid().as_raw()
        && (meta.mode() & 0o022) == 0;
    if !own {
        return None;
    }
    let mut bytes = Vec::new();
    file.take(2 * MAX_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .ok()?;
    (bytes.len() <= 2 * MAX_BYTES).then_some(bytes)
}

/// Takes in what a saved file holds, within the bound on what is kept.
fn take(kept: &mut Kept, latest: SystemTime, listings: Vec<Saved>) {
    kept.latest = kept.latest.max(Some(latest));
    kept.by_dir.reserve(listings.len());
    for (dir, stamp, listing) in listings {
        let size = dir.as_os_str().len() + listing.size() + PER_DIR;
        if kept.bytes + size > MAX_BYTES {
            break;
        }
        kept.bytes += size;
        kept.by_dir.insert(dir, (stamp, listing.done()));
    }
}

/// Saves what is kept at `path`, when something new was kept: a fresh file
/// beside it, renamed over it (a run that ends at the same time leaves its
/// own whole file, or this one).
pub fn save(path: &Path) -> std::io::Result<()> {
    let Some(boot) = this_boot() else {
        return Ok(());
    };
    let Some(bytes) = with_kept(|kept| encode(kept, boot.as_bytes(), clock_offset())).flatten()
    else {
        return Ok(());
    };
    let tmp = path.with_extension(format!("{:016x}.tmp", rand::random::<u64>()));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)?;
    // Only the file made here is removed if it cannot be put in place.
    let written = file
        .write_all(&bytes)
        .and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listing_of(names: &[&str]) -> Listing {
        let mut list = Listing::default();
        for n in names {
            list.push(OsStr::new(n), Kind::Dir);
        }
        list
    }

    /// A stamp of a disk's directory, with a ctime of nanoseconds.
    fn disk_stamp() -> Stamp {
        Stamp {
            dev: rustix::fs::makedev(8, 1) as u64,
            ino: 2,
            ctime: (3, 4),
        }
    }

    fn kept_one(dir: &str, names: &[&str]) -> Kept {
        let mut kept = Kept {
            latest: Some(SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000)),
            changed: true,
            ..Kept::default()
        };
        kept.by_dir
            .insert(dir.into(), (disk_stamp(), listing_of(names).done()));
        kept
    }

    #[test]
    fn a_saved_file_gives_back_what_was_kept() {
        let kept = kept_one("/w/src", &["a", "b c"]);
        let bytes = encode(&kept, b"boot", 7).unwrap();
        let (latest, back) = decode(&bytes, b"boot", 7).unwrap();
        assert_eq!(Some(latest), kept.latest);
        assert_eq!(back.len(), 1);
        let (dir, stamp, list) = &back[0];
        assert_eq!(dir, Path::new("/w/src"));
        assert_eq!(
            Some((*stamp, list)),
            kept.by_dir.get(dir).map(|(s, e)| (*s, &**e))
        );
        // Nothing new kept: nothing to save.
        let unchanged = Kept {
            changed: false,
            ..kept_one("/w", &[])
        };
        assert!(encode(&unchanged, b"boot", 7).is_none());
    }

    /// Whole-second stamps, and a file system with no device of its own,
    /// stay in the process that read them.
    #[test]
    fn whole_second_stamps_and_deviceless_file_systems_are_not_saved() {
        for stamp in [
            Stamp {
                ctime: (3, 0),
                ..disk_stamp()
            },
            Stamp {
                dev: rustix::fs::makedev(0, 40) as u64,
                ..disk_stamp()
            },
        ] {
            let mut kept = kept_one("/w/src", &["a"]);
            kept.by_dir
                .insert("/w/other".into(), (stamp, listing_of(&["b"]).done()));
            let bytes = encode(&kept, b"boot", 7).unwrap();
            let (_, back) = decode(&bytes, b"boot", 7).unwrap();
            let dirs: Vec<_> = back.iter().map(|(d, _, _)| d.clone()).collect();
            assert_eq!(dirs, [PathBuf::from("/w/src")]);
        }
    }

    /// Another boot's file, a torn one, one changed byte, a name no
    /// directory gives, or a clock set back since: the whole file is
    /// dropped.
    #[test]
    fn a_saved_file_of_another_boot_or_torn_or_changed_is_dropped() {
        let bytes = encode(&kept_one("/w/src", &["a", "b"]), b"boot", 7).unwrap();
        assert!(decode(&bytes, b"other", 7).is_none());
        assert!(decode(&bytes[..bytes.len() - 1], b"boot", 7).is_none());
        for i in MAGIC.len()..bytes.len() - 8 {
            let mut changed = bytes.clone();
            changed[i] ^= 1;
            assert!(decode(&changed, b"boot", 7).is_none(), "byte {i}");
        }
        for bad in [&["a/b"][..], &[".."], &[""], &["."]] {
            let bytes = encode(&kept_one("/w/src", bad), b"boot", 7).unwrap();
            assert!(decode(&bytes, b"boot", 7).is_none(), "{bad:?}");
        }
        let relative = encode(&kept_one("w/src", &["a"]), b"boot", 7).unwrap();
        assert!(decode(&relative, b"boot", 7).is_none());
        // The wall clock set back (against the time since boot) by more
        // than the step allowed, since the file was written.
        let back = STEP_BACK.as_nanos() as i64 + 1;
        assert!(decode(&bytes, b"boot", 7 - back).is_none());
        assert!(decode(&bytes, b"boot", 7 - back + 2).is_some());
        assert!(decode(&bytes, b"boot", 7 + back).is_some());
    }

    /// Saved by one process and loaded by the next, a listing is reused
    /// only while its directory is unchanged; a file from before the clock
    /// was set back is dropped and removed; a file others may write is not
    /// read.
    #[test]
    fn a_listing_saved_by_one_run_is_reused_by_the_next_while_unchanged() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        if !crate::listing::tests::keeps_listings(t.path()) || this_boot().is_none() {
            return;
        }
        let dir = std::fs::canonicalize(t.path()).unwrap();
        std::fs::write(dir.join("a"), "").unwrap();
        let r = Reading::open(&dir).unwrap();
        if !r.stamp.is_some_and(|s| may_be_saved(&s)) {
            println!("skipped: listings of {} are not saved here", dir.display());
            return;
        }
        // Saved elsewhere: a file made in the directory would change it.
        let elsewhere = tempfile::tempdir().unwrap();
        let file = elsewhere.path().join("saved");
        let later = now() + RACY * 2;
        keep(&dir, &r, later, &listing_of(&["a"]).done());
        save(&file).unwrap();
        // The next process: nothing kept yet, then the file.
        with_kept(|k| *k = Kept::default());
        clock_ahead(RACY * 2);
        load(&file);
        let meta = std::fs::metadata(&dir).unwrap();
        assert!(reuse(&dir, &crate::listing::DirStat::of(&meta), now()).is_some());
        // Nothing new kept since it was loaded: not written again.
        std::fs::remove_file(&file).unwrap();
        save(&file).unwrap();
        assert!(!file.exists());
        // One others may write is not read.
        let r = Reading::open(&dir).unwrap();
        keep(&dir, &r, later, &listing_of(&["a"]).done());
        save(&file).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).unwrap();
        with_kept(|k| *k = Kept::default());
        load(&file);
        assert!(with_kept(|k| k.by_dir.is_empty()).unwrap());
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        // Changed since: read afresh.
        std::fs::write(dir.join("b"), "").unwrap();
        load(&file);
        let meta = std::fs::metadata(&dir).unwrap();
        assert!(reuse(&dir, &crate::listing::DirStat::of(&meta), now()).is_none());
        // A clock behind the file's latest listing: nothing is taken, and
        // the file is gone.
        with_kept(|k| *k = Kept::default());
        clock_ahead(Duration::ZERO);
        load(&file);
        assert!(with_kept(|k| k.by_dir.is_empty()).unwrap());
        assert!(!file.exists());
    }
}
