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
//! - a clock set back since: a file whose latest listing is ahead of the
//!   clock by more than [`STEP_BACK`] is dropped whole;
//! - a torn or changed file: the file ends with a checksum of the rest,
//!   and every entry's name is checked as a listing would give it (no `/`,
//!   no NUL, not `.` or `..`); anything else drops the whole file.
//!
//! Nothing is synced to disk: a file lost in a crash only costs the next
//! run its reading.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;

use super::*;

const MAGIC: &[u8] = b"zcode-acp listings 1\n";

/// This boot's identity, where the kernel gives one.
fn boot_id() -> Option<Vec<u8>> {
    let id = std::fs::read("/proc/sys/kernel/random/boot_id").ok()?;
    (!id.is_empty()).then_some(id)
}

/// FNV-1a: enough to find a torn or truncated file.
fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn put(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
}

/// What is kept, as a file's bytes; `None` when nothing new was kept since
/// the process started (or loaded), or this boot cannot be named.
fn encode(kept: &Kept, boot: &[u8]) -> Option<Vec<u8>> {
    if !kept.changed {
        return None;
    }
    let latest = kept.latest?.duration_since(SystemTime::UNIX_EPOCH).ok()?;
    let mut out = MAGIC.to_vec();
    put(&mut out, boot);
    out.extend_from_slice(&latest.as_secs().to_le_bytes());
    out.extend_from_slice(&latest.subsec_nanos().to_le_bytes());
    out.extend_from_slice(&(kept.by_dir.len() as u32).to_le_bytes());
    for (dir, (stamp, entries)) in &kept.by_dir {
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
/// for a file of another boot, or one torn or changed.
fn decode(bytes: &[u8], boot: &[u8]) -> Option<(SystemTime, Vec<Saved>)> {
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
    let secs = at.u64()?;
    let nanos = at.u32()?;
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
        if !dir.is_absolute() {
            return None;
        }
        out.push((dir, stamp, listing(names, kinds)?));
    }
    at.0.is_empty().then_some((latest, out))
}

/// Takes in the listings saved at `path` (see the module's header for what
/// is not taken); a missing or unreadable file is no listing.
pub fn load(path: &Path) {
    let Some(boot) = boot_id() else { return };
    let Ok(bytes) = std::fs::read(path) else {
        return;
    };
    if bytes.len() > 2 * MAX_BYTES {
        return;
    }
    let Some((latest, listings)) = decode(&bytes, &boot) else {
        return;
    };
    with_kept(|kept| {
        if latest > now() + STEP_BACK {
            // Written before the clock was set back.
            return;
        }
        kept.latest = kept.latest.max(Some(latest));
        for (dir, stamp, listing) in listings {
            let size = dir.as_os_str().len() + listing.size() + PER_DIR;
            if kept.bytes + size > MAX_BYTES {
                break;
            }
            kept.bytes += size;
            kept.by_dir.insert(dir, (stamp, listing.done()));
        }
    });
}

/// Saves what is kept at `path`, when something new was kept: a fresh file
/// beside it, renamed over it (a run that ends at the same time leaves its
/// own whole file, or this one).
pub fn save(path: &Path) -> std::io::Result<()> {
    let Some(boot) = boot_id() else { return Ok(()) };
    let Some(bytes) = with_kept(|kept| encode(kept, &boot)).flatten() else {
        return Ok(());
    };
    let tmp = path.with_extension(format!("{}.tmp", std::process::id()));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| f.write_all(&bytes))
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

    fn kept_one(dir: &str, names: &[&str]) -> Kept {
        let mut kept = Kept {
            latest: Some(SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000)),
            changed: true,
            ..Kept::default()
        };
        let stamp = Stamp {
            dev: 1,
            ino: 2,
            ctime: (3, 4),
        };
        kept.by_dir
            .insert(dir.into(), (stamp, listing_of(names).done()));
        kept
    }

    #[test]
    fn a_saved_file_gives_back_what_was_kept() {
        let kept = kept_one("/w/src", &["a", "b c"]);
        let bytes = encode(&kept, b"boot").unwrap();
        let (latest, back) = decode(&bytes, b"boot").unwrap();
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
        assert!(encode(&unchanged, b"boot").is_none());
    }

    /// Another boot's file, a torn one, one changed byte, or a name no
    /// directory gives: the whole file is dropped.
    #[test]
    fn a_saved_file_of_another_boot_or_torn_or_changed_is_dropped() {
        let bytes = encode(&kept_one("/w/src", &["a", "b"]), b"boot").unwrap();
        assert!(decode(&bytes, b"other").is_none());
        assert!(decode(&bytes[..bytes.len() - 1], b"boot").is_none());
        for i in MAGIC.len()..bytes.len() - 8 {
            let mut changed = bytes.clone();
            changed[i] ^= 1;
            assert!(decode(&changed, b"boot").is_none(), "byte {i}");
        }
        for bad in [&["a/b"][..], &[".."], &[""], &["."]] {
            let bytes = encode(&kept_one("/w/src", bad), b"boot").unwrap();
            assert!(decode(&bytes, b"boot").is_none(), "{bad:?}");
        }
        let relative = encode(&kept_one("w/src", &["a"]), b"boot").unwrap();
        assert!(decode(&relative, b"boot").is_none());
    }

    /// Saved by one process and loaded by the next, a listing is reused
    /// only while its directory is unchanged; a clock set back since drops
    /// the file.
    #[test]
    fn a_listing_saved_by_one_run_is_reused_by_the_next_while_unchanged() {
        let t = tempfile::tempdir().unwrap();
        if !crate::listing::tests::keeps_listings(t.path()) || boot_id().is_none() {
            return;
        }
        let dir = std::fs::canonicalize(t.path()).unwrap();
        std::fs::write(dir.join("a"), "").unwrap();
        // Saved elsewhere: a file made in the directory would change it.
        let elsewhere = tempfile::tempdir().unwrap();
        let file = elsewhere.path().join("saved");
        let later = now() + RACY * 2;
        let r = Reading::open(&dir).unwrap();
        keep(&dir, &r, later, &listing_of(&["a"]).done());
        save(&file).unwrap();
        // The next process: nothing kept yet, then the file.
        with_kept(|k| *k = Kept::default());
        clock_ahead(RACY * 2);
        load(&file);
        let meta = std::fs::metadata(&dir).unwrap();
        assert!(reuse(&dir, &meta, now()).is_some());
        // Nothing new kept since it was loaded: not written again.
        std::fs::remove_file(&file).unwrap();
        save(&file).unwrap();
        assert!(!file.exists());
        // Changed since: read afresh.
        let r = Reading::open(&dir).unwrap();
        keep(&dir, &r, later, &listing_of(&["a"]).done());
        save(&file).unwrap();
        std::fs::write(dir.join("b"), "").unwrap();
        with_kept(|k| *k = Kept::default());
        load(&file);
        let meta = std::fs::metadata(&dir).unwrap();
        assert!(reuse(&dir, &meta, now()).is_none());
        // A clock behind the file's latest listing: nothing is taken.
        with_kept(|k| *k = Kept::default());
        clock_ahead(Duration::ZERO);
        load(&file);
        assert!(with_kept(|k| k.by_dir.is_empty()).unwrap());
    }
}
