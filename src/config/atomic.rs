//! File writes that can neither be redirected nor half-done: the bridge
//! writes sandbox.json and the ledger on the user's behalf, next to paths an
//! agent may have been able to touch.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The largest configuration or spec file read: more is refused, so a
/// file (or what an agent made of it) cannot grow memory without bound.
pub const MAX_READ: u64 = 16 << 20;

/// Reads a regular file without following a symlink at its last component.
/// Never blocks (a FIFO is opened non-blocking and refused) and never reads
/// more than [`MAX_READ`].
pub fn read_nofollow(path: &Path) -> std::io::Result<Vec<u8>> {
    read_regular(path, false)
}

/// Reads a regular file, following symlinks only if `follow`: opened
/// non-blocking (a FIFO would otherwise hang the reader), its type checked
/// on the open file before anything is read (a device such as /dev/zero is
/// refused), and refused above [`MAX_READ`].
pub fn read_regular(path: &Path, follow: bool) -> std::io::Result<Vec<u8>> {
    let mut flags = nix::libc::O_NONBLOCK | nix::libc::O_NOCTTY;
    if !follow {
        flags |= nix::libc::O_NOFOLLOW;
    }
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(flags)
        .open(path)?;
    let meta = f.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::other(format!(
            "{} is not a regular file",
            path.display()
        )));
    }
    if meta.len() > MAX_READ {
        return Err(std::io::Error::other(format!(
            "{} is larger than {MAX_READ} bytes",
            path.display()
        )));
    }
    let mut out = Vec::new();
    // The size is checked again while reading: the file may grow.
    f.take(MAX_READ + 1).read_to_end(&mut out)?;
    if out.len() as u64 > MAX_READ {
        return Err(std::io::Error::other(format!(
            "{} is larger than {MAX_READ} bytes",
            path.display()
        )));
    }
    Ok(out)
}

/// A file created exclusively, never through a symlink (a planted file or
/// link makes it fail).
fn open_new(path: &Path, mode: u32) -> std::io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)
}

/// The name of a temporary file zcode-acp writes beside a target.
pub fn temp_name() -> String {
    format!(".zcode-acp-{:016x}.tmp", rand::random::<u64>())
}

/// Whether `name` is one of [`temp_name`]'s.
pub fn is_temp_name(name: &std::ffi::OsStr) -> bool {
    let name = name.as_encoded_bytes();
    name.len() == ".zcode-acp-".len() + 16 + ".tmp".len()
        && name.starts_with(b".zcode-acp-")
        && name.ends_with(b".tmp")
        && name[11..27].iter().all(u8::is_ascii_hexdigit)
}

/// `bytes` written and fsynced into a fresh temp file beside `path`; its
/// directory and path.
fn temp_beside<'p>(
    path: &'p Path,
    bytes: &[u8],
    mode: u32,
) -> std::io::Result<(&'p Path, PathBuf)> {
    let dir = path
        .parent()
        .ok_or_else(|| std::io::Error::other("no parent directory"))?;
    if path.file_name().is_none() {
        return Err(std::io::Error::other("no file name"));
    }
    // A short name of zcode-acp's own, whatever the target's: a long one
    // plus a suffix would pass the filesystem's limit on names (the audit
    // also knows this pattern for what it is: nothing runs it).
    let tmp = dir.join(temp_name());
    let written = open_new(&tmp, mode).and_then(|mut f| {
        f.write_all(bytes)?;
        f.sync_all()
    });
    match written {
        Ok(()) => Ok((dir, tmp)),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// Writes `bytes` to `path` atomically: a fresh temp file in the same
/// directory (created exclusively, so a planted file or symlink makes it
/// fail), fsynced, renamed over the target (rename replaces a symlink
/// rather than following it), then the directory fsynced.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    let (dir, tmp) = temp_beside(path, bytes, mode)?;
    let placed = std::fs::rename(&tmp, path).and_then(|()| File::open(dir)?.sync_all());
    if placed.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    placed
}

/// Creates `path` with `bytes`, never replacing anything there, and so
/// that no reader ever sees it partly written: a fresh temp file beside
/// it, fsynced, renamed into place only if nothing is there yet
/// (`renameat2(RENAME_NOREPLACE)`, macOS `renamex_np(RENAME_EXCL)`).
/// Where the filesystem cannot rename that way, the file is created
/// exclusively and written in place. Fails with `AlreadyExists` when
/// something is there.
pub fn create_atomic(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    let (dir, tmp) = temp_beside(path, bytes, mode)?;
    match rename_noreplace(&tmp, path) {
        Ok(()) => File::open(dir)?.sync_all(),
        Err(e)
            if e.raw_os_error() == Some(nix::libc::EINVAL)
                || e.raw_os_error() == Some(nix::libc::ENOTSUP) =>
        {
            let _ = std::fs::remove_file(&tmp);
            let mut f = open_new(path, mode)?;
            f.write_all(bytes)?;
            f.sync_all()
        }
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// Renames `from` to `to` unless something is at `to` (EEXIST then).
fn rename_noreplace(from: &Path, to: &Path) -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        use nix::fcntl::{renameat2, RenameFlags, AT_FDCWD};
        renameat2(AT_FDCWD, from, AT_FDCWD, to, RenameFlags::RENAME_NOREPLACE)
            .map_err(std::io::Error::from)
    }
    #[cfg(target_os = "macos")]
    {
        use std::os::unix::ffi::OsStrExt;
        let c = |p: &Path| {
            std::ffi::CString::new(p.as_os_str().as_bytes())
                .map_err(|_| std::io::Error::other("a path with a NUL byte"))
        };
        let (from, to) = (c(from)?, c(to)?);
        // SAFETY: both pointers are to NUL-terminated strings that live
        // until the call returns; renamex_np reads them and keeps nothing.
        let rc =
            unsafe { nix::libc::renamex_np(from.as_ptr(), to.as_ptr(), nix::libc::RENAME_EXCL) };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }
}

/// Creates `rel` beneath `base` as real directories (missing ones with
/// `mode`), refusing to go through a symlink anywhere below `base`. The walk
/// holds a descriptor of each directory and creates the next one relative
/// to it, so nothing can be swapped for a symlink between a check and the
/// step that relies on it.
pub fn create_real_dirs(
    base: &Path,
    rel: &[&str],
    mode: u32,
) -> std::io::Result<std::path::PathBuf> {
    use nix::fcntl::{open, openat, OFlag};
    use nix::sys::stat::{mkdirat, Mode};
    // A handle to walk through, not to read: O_PATH where there is one
    // (it needs no read permission on the directory).
    #[cfg(target_os = "linux")]
    let handle = OFlag::O_PATH;
    #[cfg(not(target_os = "linux"))]
    let handle = OFlag::O_RDONLY;
    let dir_flags = handle | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let mut fd = open(base, dir_flags, Mode::empty())?;
    let mut cur = base.to_path_buf();
    for part in rel {
        if part.is_empty() || *part == "." || *part == ".." || part.contains('/') {
            return Err(std::io::Error::other(format!(
                "`{part}` is not a directory name"
            )));
        }
        cur.push(part);
        let next = || openat(&fd, *part, dir_flags | OFlag::O_NOFOLLOW, Mode::empty());
        let opened = match next() {
            Err(nix::errno::Errno::ENOENT) => {
                match mkdirat(&fd, *part, Mode::from_bits_truncate(mode as _)) {
                    // Someone else created it meanwhile: fine if it is a
                    // real directory, which the open below checks.
                    Ok(()) | Err(nix::errno::Errno::EEXIST) => next(),
                    Err(e) => Err(e),
                }
            }
            other => other,
        };
        fd = opened.map_err(|e| match e {
            nix::errno::Errno::ELOOP | nix::errno::Errno::ENOTDIR => {
                std::io::Error::other(format!("{} is a symlink or not a directory", cur.display()))
            }
            e => std::io::Error::other(format!("cannot create {}: {e}", cur.display())),
        })?;
    }
    Ok(cur)
}

/// Creates the absolute directory `dir` and its missing parents as real
/// directories (missing ones with `mode`), never through a symlink. Meant
/// for paths already resolved with `resolve_real`, whose existing part is
/// real.
pub fn create_real_dir_path(dir: &Path, mode: u32) -> std::io::Result<()> {
    let parts: Vec<String> = dir
        .components()
        .filter_map(|c| match c {
            std::path::Component::Normal(n) => Some(n.to_string_lossy().into_owned()),
            _ => None,
        })
        .collect();
    if !dir.is_absolute() {
        return Err(std::io::Error::other(format!(
            "{} is not an absolute path",
            dir.display()
        )));
    }
    let refs: Vec<&str> = parts.iter().map(String::as_str).collect();
    create_real_dirs(Path::new("/"), &refs, mode).map(drop)
}

/// Whether `path` is a regular file with one link (not a symlink, not
/// hardlinked elsewhere). `Ok(None)` when it does not exist.
pub fn plain_file(path: &Path) -> std::io::Result<Option<bool>> {
    match std::fs::symlink_metadata(path) {
        Ok(m) => Ok(Some(m.file_type().is_file() && m.nlink() == 1)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_writes_replace_symlinks_instead_of_following_them() {
        let d = tempfile::tempdir().unwrap();
        let victim = d.path().join("victim");
        std::fs::write(&victim, "keep").unwrap();
        let target = d.path().join("config.json");
        std::os::unix::fs::symlink(&victim, &target).unwrap();
        write_atomic(&target, b"new", 0o644).unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "new");
        assert!(!std::fs::symlink_metadata(&target)
            .unwrap()
            .file_type()
            .is_symlink());
        // No temp file is left behind.
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 2);
    }

    #[test]
    fn reads_refuse_fifos_devices_and_huge_files_without_blocking() {
        let d = tempfile::tempdir().unwrap();
        let fifo = d.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        assert!(read_regular(&fifo, true).is_err());
        std::os::unix::fs::symlink("/dev/zero", d.path().join("zero")).unwrap();
        assert!(read_regular(&d.path().join("zero"), true).is_err());
        let big = d.path().join("big");
        std::fs::File::create(&big)
            .unwrap()
            .set_len(MAX_READ + 1)
            .unwrap();
        assert!(read_regular(&big, true).is_err());
        std::fs::write(d.path().join("ok"), "{}").unwrap();
        assert_eq!(read_regular(&d.path().join("ok"), true).unwrap(), b"{}");
    }

    #[test]
    fn created_files_appear_whole_and_never_replace_anything() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("sandbox.json");
        create_atomic(&path, b"{\"enabled\": false}\n", 0o644).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"{\"enabled\": false}\n");
        // Something there (a user's file, a symlink) is never replaced.
        std::fs::write(&path, b"mine").unwrap();
        let e = create_atomic(&path, b"template", 0o644).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read(&path).unwrap(), b"mine");
        let link = d.path().join("link");
        std::os::unix::fs::symlink("/nonexistent-target", &link).unwrap();
        assert!(create_atomic(&link, b"x", 0o644).is_err());
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        // No temp file is left behind either way.
        let names: Vec<_> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
    }

    #[test]
    fn nofollow_reads_refuse_symlinks() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("a"), "x").unwrap();
        std::os::unix::fs::symlink(d.path().join("a"), d.path().join("b")).unwrap();
        assert!(read_nofollow(&d.path().join("a")).is_ok());
        assert!(read_nofollow(&d.path().join("b")).is_err());
    }

    #[test]
    fn real_dirs_are_created_but_never_through_a_symlink() {
        let d = tempfile::tempdir().unwrap();
        let made = create_real_dirs(d.path(), &[".zcode", "acp"], 0o755).unwrap();
        assert!(made.is_dir());
        let e = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(d.path(), e.path().join(".zcode")).unwrap();
        assert!(create_real_dirs(e.path(), &[".zcode", "acp"], 0o755).is_err());
        // A symlink higher up is refused too, and nothing is made beyond it.
        let f = tempfile::tempdir().unwrap();
        std::fs::create_dir(f.path().join("real")).unwrap();
        std::os::unix::fs::symlink(f.path().join("real"), f.path().join("link")).unwrap();
        assert!(create_real_dir_path(&f.path().join("link/a/b"), 0o700).is_err());
        assert!(!f.path().join("real/a").exists());
        let made = f.path().join("real/a/b");
        create_real_dir_path(&made, 0o700).unwrap();
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&made).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode & !0o700, 0, "{mode:o}");
    }
}
