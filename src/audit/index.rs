//! Gitlinks in a git index, read without running git. A gitlink (mode
//! 160000) makes `git status` in the parent run `git status` in the linked
//! directory, whose own config (a `core.fsmonitor`) then runs. The audit
//! looks for repositories by walking the roots, but not into
//! `node_modules` and the like: a repository made there and linked into a
//! parent's index is found here instead.
//!
//! The index is the agent's to write, so it is parsed, never handed to git:
//! versions 2, 3 and 4 of the format, SHA-1 or SHA-256 names.

use std::path::PathBuf;

const GITLINK: u32 = 0o160000;
const MODE_TYPE: u32 = 0o170000;
/// The longest path an entry may name (git's own limit is PATH_MAX): a
/// version-4 index builds each path on the last, and an agent could make
/// them grow without end.
const MAX_PATH: usize = 4096;
/// The most gitlinks read from one index.
pub const MAX_GITLINKS: usize = 100_000;

/// The paths of the gitlinks in `index` (the bytes of `.git/index`), for
/// SHA-1 or SHA-256 names, whichever parses; None where the bytes are no
/// index this reader knows, or pass its bounds.
pub fn gitlinks_any_hash(index: &[u8]) -> Option<Vec<PathBuf>> {
    gitlinks(index, 20).or_else(|| gitlinks(index, 32))
}

/// The paths of the gitlinks in `index` with names of `hash_len` bytes,
/// or None where the bytes are not an index this reader knows (a path
/// past [`MAX_PATH`], more than [`MAX_GITLINKS`] gitlinks).
pub fn gitlinks(index: &[u8], hash_len: usize) -> Option<Vec<PathBuf>> {
    let mut r = Reader {
        bytes: index,
        at: 0,
    };
    if r.take(4)? != b"DIRC" {
        return None;
    }
    let version = r.u32()?;
    if !(2..=4).contains(&version) {
        return None;
    }
    let count = r.u32()?;
    let mut out = Vec::new();
    let mut previous: Vec<u8> = Vec::new();
    for _ in 0..count {
        let start = r.at;
        r.take(24)?; // ctime, mtime, dev, ino
        let mode = r.u32()?;
        r.take(12)?; // uid, gid, size
        r.take(hash_len)?;
        let flags = u16::from_be_bytes(r.take(2)?.try_into().ok()?);
        if version >= 3 && flags & 0x4000 != 0 {
            r.take(2)?; // extended flags
        }
        let path = if version == 4 {
            // The previous path, less its last N bytes, plus a suffix.
            let strip = r.varint()?;
            let keep = previous.len().checked_sub(usize::try_from(strip).ok()?)?;
            let mut path = previous[..keep].to_vec();
            path.extend_from_slice(r.until_nul()?);
            path
        } else {
            let path = r.until_nul()?.to_vec();
            // NUL padding to a multiple of eight bytes, the name's own NUL
            // counted.
            let len = r.at - start;
            let padded = len.div_ceil(8) * 8;
            r.take(padded - len)?;
            path
        };
        // The previous path is at most this long, so no path grows past
        // it by more than what the index itself holds.
        if path.len() > MAX_PATH {
            return None;
        }
        if mode & MODE_TYPE == GITLINK {
            use std::os::unix::ffi::OsStringExt;
            if out.len() == MAX_GITLINKS {
                return None;
            }
            out.push(PathBuf::from(std::ffi::OsString::from_vec(path.clone())));
        }
        previous = path;
    }
    // Then extensions (a signature, a size, the data), then the checksum,
    // `hash_len` bytes: what is left must be exactly that, or this was no
    // index of names that long.
    loop {
        let left = r.bytes.len() - r.at;
        if left == hash_len {
            return Some(out);
        }
        if left < 8 + hash_len {
            return None;
        }
        // A split index keeps most entries in a shared file ("link"):
        // what is here is not all, so none of it is taken for all.
        if r.take(4)? == b"link" {
            return None;
        }
        let size = usize::try_from(r.u32()?).ok()?;
        r.take(size)?;
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.at.checked_add(n)?;
        let s = self.bytes.get(self.at..end)?;
        self.at = end;
        Some(s)
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }

    /// A NUL-terminated string, without its NUL (which is consumed).
    fn until_nul(&mut self) -> Option<&'a [u8]> {
        let rest = self.bytes.get(self.at..)?;
        let n = memchr::memchr(0, rest)?;
        self.at += n + 1;
        Some(&rest[..n])
    }

    /// Git's offset varint (`varint.c`): 7 bits a byte, high bit "more",
    /// each continuation adding one before the shift.
    fn varint(&mut self) -> Option<u64> {
        let mut byte = self.take(1)?[0];
        let mut value = u64::from(byte & 0x7f);
        while byte & 0x80 != 0 {
            byte = self.take(1)?[0];
            value = value.checked_add(1)?.checked_mul(128)? | u64::from(byte & 0x7f);
        }
        Some(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;
    use std::process::Command;

    fn git(dir: &Path, args: &[&str]) -> String {
        let out = Command::new("git")
            .args(["-c", "user.email=t@e", "-c", "user.name=t"])
            .args(args)
            .current_dir(dir)
            .output()
            .expect("git");
        assert!(out.status.success(), "git {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// A repository with files and two gitlinks (one deep, as a repository
    /// made in `node_modules` and linked in would be), in index `version`.
    fn repo(format: &str, version: &str) -> (tempfile::TempDir, Vec<u8>) {
        let dir = tempfile::tempdir().unwrap();
        let w = dir.path();
        git(w, &["init", "-q", &format!("--object-format={format}")]);
        for f in ["a.txt", "src/lib.rs", "src/lib/deeper/name with space.rs"] {
            std::fs::create_dir_all(w.join(f).parent().unwrap()).unwrap();
            std::fs::write(w.join(f), "x\n").unwrap();
        }
        git(w, &["add", "."]);
        git(w, &["commit", "-q", "-m", "x"]);
        let head = git(w, &["rev-parse", "HEAD"]);
        for link in ["node_modules/evil", "vendor/lib"] {
            git(
                w,
                &[
                    "update-index",
                    "--add",
                    "--cacheinfo",
                    &format!("160000,{head},{link}"),
                ],
            );
        }
        git(w, &["update-index", "--index-version", version]);
        let bytes = std::fs::read(w.join(".git/index")).unwrap();
        (dir, bytes)
    }

    #[test]
    fn gitlinks_are_read_from_every_index_version_and_hash() {
        for format in ["sha1", "sha256"] {
            for version in ["2", "3", "4"] {
                let (_dir, bytes) = repo(format, version);
                assert_eq!(
                    gitlinks_any_hash(&bytes),
                    Some(vec![
                        PathBuf::from("node_modules/evil"),
                        PathBuf::from("vendor/lib")
                    ]),
                    "{format} v{version}"
                );
            }
        }
    }

    /// A version-4 index can grow each path on the last: an agent's may not
    /// make the reader allocate without end.
    #[test]
    fn an_index_past_its_bounds_is_none() {
        let mut bytes = b"DIRC".to_vec();
        bytes.extend_from_slice(&4u32.to_be_bytes());
        bytes.extend_from_slice(&3u32.to_be_bytes());
        let entry = |suffix: &[u8]| {
            let mut e = vec![0u8; 24];
            e.extend_from_slice(&0o160000u32.to_be_bytes());
            e.extend_from_slice(&[0u8; 12]);
            e.extend_from_slice(&[0u8; 20]);
            e.extend_from_slice(&0u16.to_be_bytes());
            e.push(0); // strip nothing from the previous path
            e.extend_from_slice(suffix);
            e.push(0);
            e
        };
        for _ in 0..3 {
            bytes.extend(entry(&[b'a'; 2000]));
        }
        let checksum = [0u8; 20];
        // Two such entries are within bounds; three are not.
        let mut two = bytes[..12].to_vec();
        two[8..12].copy_from_slice(&2u32.to_be_bytes());
        two.extend(entry(&[b'a'; 2000]));
        two.extend(entry(&[b'a'; 2000]));
        two.extend_from_slice(&checksum);
        assert_eq!(gitlinks(&two, 20).map(|l| l.len()), Some(2));
        bytes.extend_from_slice(&checksum);
        assert_eq!(gitlinks(&bytes, 20), None);
    }

    /// A split index holds only part of the entries: it is no index this
    /// reader takes (the audit says so), not one without gitlinks.
    #[test]
    fn a_split_index_is_none() {
        let (dir, _) = repo("sha1", "2");
        git(dir.path(), &["update-index", "--split-index"]);
        let bytes = std::fs::read(dir.path().join(".git/index")).unwrap();
        assert_eq!(gitlinks_any_hash(&bytes), None);
    }

    #[test]
    fn what_is_not_an_index_is_said_to_be_none() {
        let (_dir, bytes) = repo("sha1", "2");
        assert_eq!(gitlinks(b"not an index", 20), None);
        assert_eq!(gitlinks(&bytes[..bytes.len() / 2], 20), None);
        // An entry count far beyond the bytes.
        let mut lying = bytes[..12].to_vec();
        lying[8..12].copy_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(gitlinks(&lying, 20), None);
    }
}
