//! Which names a call writes, for `zcode-acp run`'s line about refused
//! writes (`policy::refused`): the names a command tried to make, replace
//! or remove, seen by the supervisor as the calls go by.
//!
//! Only noted, never decided here: each call is then let through to the
//! kernel, which refuses it on its own (the mounts and Landlock). The path
//! is the supervisor's copy, made absolute from the caller's working
//! directory or directory descriptor as `/proc` shows them while the call
//! waits, so a path another thread changes meanwhile is at worst
//! misreported, never mis-decided. Protected paths inside a root are left out: the audit
//! speaks for those, and `--allow` would not open them.

use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use super::decide::{Call, Dirfd};

/// When a refused call is a refusal a user would call one: a `mkdir` of
/// a directory that exists fails for that reason first, as does an
/// `unlink` of nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    Always,
    /// Only when the name does not exist (else: "exists").
    Absent,
    /// Only when the name exists (else: "no such file").
    Present,
}

/// Every name `call` makes, replaces or removes, with its directory
/// argument and when its refusal counts. (An open that neither creates
/// nor truncates makes none.)
pub fn written_names(call: &Call) -> Vec<(Dirfd, &[u8], When)> {
    match call {
        Call::Open {
            at, path, flags, ..
        } => {
            let makes = libc::O_CREAT | libc::O_TRUNC;
            if flags & makes == 0 || flags & libc::O_PATH != 0 {
                return Vec::new();
            }
            // Opened for writing (or emptied), it is refused whether or
            // not it exists; for reading, only the making of it is.
            let writes = flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0;
            vec![(*at, path, if writes { When::Always } else { When::Absent })]
        }
        Call::Mkdir { at, path, .. } | Call::Symlink { at, path, .. } => {
            vec![(*at, path, When::Absent)]
        }
        Call::Link { to_at, to, .. } => vec![(*to_at, to, When::Absent)],
        Call::Rmdir { at, path } | Call::Unlink { at, path } | Call::Utimens { at, path, .. } => {
            vec![(*at, path, When::Present)]
        }
        Call::Rename {
            from_at,
            from,
            to_at,
            to,
            ..
        } => vec![(*from_at, from, When::Present), (*to_at, to, When::Always)],
    }
}

/// `path` made absolute against `base` (the caller's directory), without
/// following links: `.` and `..` are taken by name.
pub fn absolute(base: &Path, path: &[u8]) -> PathBuf {
    let path = Path::new(std::ffi::OsStr::from_bytes(path));
    let joined = if path.is_absolute() {
        path.to_path_buf()
    } else {
        base.join(path)
    };
    let mut out = PathBuf::from("/");
    for c in joined.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_made_absolute_without_following_links() {
        let base = Path::new("/w/src");
        assert_eq!(absolute(base, b"a.txt"), Path::new("/w/src/a.txt"));
        assert_eq!(absolute(base, b"../../etc/x"), Path::new("/etc/x"));
        assert_eq!(absolute(base, b"/h/./.x"), Path::new("/h/.x"));
        assert_eq!(absolute(base, b"/../../y"), Path::new("/y"));
    }

    #[test]
    fn only_names_a_call_writes_are_taken() {
        let open = |flags| Call::Open {
            at: libc::AT_FDCWD,
            path: b"x".to_vec(),
            flags,
            mode: 0,
        };
        assert!(written_names(&open(libc::O_RDONLY)).is_empty());
        assert_eq!(
            written_names(&open(libc::O_WRONLY | libc::O_CREAT))[0].2,
            When::Always
        );
        assert_eq!(
            written_names(&open(libc::O_RDONLY | libc::O_CREAT))[0].2,
            When::Absent
        );
        let rename = Call::Rename {
            from_at: 3,
            from: b"a".to_vec(),
            to_at: 4,
            to: b"b".to_vec(),
            flags: 0,
        };
        assert_eq!(
            written_names(&rename),
            vec![(3, &b"a"[..], When::Present), (4, &b"b"[..], When::Always)]
        );
    }
}
