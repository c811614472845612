//! What the supervisor does with one call: pure. The paths come as the
//! supervisor's own copies (read once from the caller); the decision is
//! made on those copies, and an operation it takes on is carried out on
//! exactly them (see `act`), so the agent cannot change the path between
//! the check and the act.
//!
//! The supervisor only ever widens what the kernel allows, and only for
//! one kind of name: an entry directly in a supervised directory (the home
//! directory) whose name starts with a granted prefix (`.claude.json`,
//! `.zcode`), where the policy allows it. Everything else continues to the
//! kernel, where the mounts and Landlock decide as if the supervisor were
//! not there; continuing widens nothing, which is why it is safe on a path
//! the caller can still change.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// A directory that stays read-only but whose entries of the granted
/// prefixes are made by the supervisor: `~/.claude.json*`, `~/.zcode*`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Supervised {
    /// The real path.
    pub dir: PathBuf,
    /// Other spellings the sandboxed programs may use for it (`$HOME` as
    /// set, when it goes through a symlink).
    #[serde(default)]
    pub spellings: Vec<PathBuf>,
    pub prefixes: Vec<String>,
}

use crate::policy::{Op, Policy};

/// A directory argument: `AT_FDCWD` or an fd of the caller.
pub type Dirfd = i32;

/// A call the filter handed over, its paths copied from the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    Open {
        at: Dirfd,
        path: Vec<u8>,
        flags: i32,
        mode: u32,
    },
    Mkdir {
        at: Dirfd,
        path: Vec<u8>,
        mode: u32,
    },
    /// `rmdir`, or `unlinkat` with AT_REMOVEDIR.
    Rmdir {
        at: Dirfd,
        path: Vec<u8>,
    },
    /// `unlink`, or `unlinkat` without AT_REMOVEDIR.
    Unlink {
        at: Dirfd,
        path: Vec<u8>,
    },
    /// `link`/`linkat`: a new name `to` for `from`.
    Link {
        from_at: Dirfd,
        from: Vec<u8>,
        to_at: Dirfd,
        to: Vec<u8>,
        flags: i32,
    },
    /// `symlink`/`symlinkat`: a link at `path` holding `target`.
    Symlink {
        target: Vec<u8>,
        at: Dirfd,
        path: Vec<u8>,
    },
    Rename {
        from_at: Dirfd,
        from: Vec<u8>,
        to_at: Dirfd,
        to: Vec<u8>,
        flags: u32,
    },
    /// `utimensat` on a path; `times` is the caller's address of the two
    /// timespecs (0 for "now"), read only if the call is taken on.
    Utimens {
        at: Dirfd,
        path: Vec<u8>,
        times: u64,
        flags: i32,
    },
}

/// Reads the call the filter handed over. `read` copies a NUL-terminated
/// string from the caller's memory. None: not a call the supervisor knows
/// (or its path could not be read): it continues to the kernel.
pub fn decode(
    nr: u32,
    args: [u64; 6],
    read: &mut dyn FnMut(u64) -> Option<Vec<u8>>,
) -> Option<Call> {
    let fd = |a: u64| a as i32;
    let at_cwd = libc::AT_FDCWD;
    #[cfg(target_arch = "x86_64")]
    {
        let nr = nr as libc::c_long;
        match nr {
            libc::SYS_open => {
                return Some(Call::Open {
                    at: at_cwd,
                    path: read(args[0])?,
                    flags: args[1] as i32,
                    mode: args[2] as u32,
                })
            }
            libc::SYS_mkdir => {
                return Some(Call::Mkdir {
                    at: at_cwd,
                    path: read(args[0])?,
                    mode: args[1] as u32,
                })
            }
            libc::SYS_rmdir => {
                return Some(Call::Rmdir {
                    at: at_cwd,
                    path: read(args[0])?,
                })
            }
            libc::SYS_unlink => {
                return Some(Call::Unlink {
                    at: at_cwd,
                    path: read(args[0])?,
                })
            }
            // creat(path, mode) is open(path, O_CREAT|O_WRONLY|O_TRUNC, mode).
            libc::SYS_creat => {
                return Some(Call::Open {
                    at: at_cwd,
                    path: read(args[0])?,
                    flags: libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC,
                    mode: args[1] as u32,
                })
            }
            libc::SYS_link => {
                return Some(Call::Link {
                    from_at: at_cwd,
                    from: read(args[0])?,
                    to_at: at_cwd,
                    to: read(args[1])?,
                    flags: 0,
                })
            }
            libc::SYS_symlink => {
                return Some(Call::Symlink {
                    target: read(args[0])?,
                    at: at_cwd,
                    path: read(args[1])?,
                })
            }
            libc::SYS_rename => {
                return Some(Call::Rename {
                    from_at: at_cwd,
                    from: read(args[0])?,
                    to_at: at_cwd,
                    to: read(args[1])?,
                    flags: 0,
                })
            }
            _ => {}
        }
    }
    let _ = at_cwd;
    let nr = nr as libc::c_long;
    match nr {
        libc::SYS_openat => Some(Call::Open {
            at: fd(args[0]),
            path: read(args[1])?,
            flags: args[2] as i32,
            mode: args[3] as u32,
        }),
        libc::SYS_mkdirat => Some(Call::Mkdir {
            at: fd(args[0]),
            path: read(args[1])?,
            mode: args[2] as u32,
        }),
        libc::SYS_unlinkat if args[2] as i32 & libc::AT_REMOVEDIR != 0 => Some(Call::Rmdir {
            at: fd(args[0]),
            path: read(args[1])?,
        }),
        libc::SYS_unlinkat if args[2] as i32 == 0 => Some(Call::Unlink {
            at: fd(args[0]),
            path: read(args[1])?,
        }),
        libc::SYS_linkat => Some(Call::Link {
            from_at: fd(args[0]),
            from: read(args[1])?,
            to_at: fd(args[2]),
            to: read(args[3])?,
            flags: args[4] as i32,
        }),
        libc::SYS_symlinkat => Some(Call::Symlink {
            target: read(args[0])?,
            at: fd(args[1]),
            path: read(args[2])?,
        }),
        libc::SYS_renameat2 => Some(Call::Rename {
            from_at: fd(args[0]),
            from: read(args[1])?,
            to_at: fd(args[2]),
            to: read(args[3])?,
            flags: args[4] as u32,
        }),
        libc::SYS_utimensat => Some(Call::Utimens {
            at: fd(args[0]),
            path: read(args[1])?,
            times: args[2],
            flags: args[3] as i32,
        }),
        n if n == renameat() => Some(Call::Rename {
            from_at: fd(args[0]),
            from: read(args[1])?,
            to_at: fd(args[2]),
            to: read(args[3])?,
            flags: 0,
        }),
        _ => None,
    }
}

#[cfg(target_arch = "x86_64")]
fn renameat() -> libc::c_long {
    libc::SYS_renameat
}
#[cfg(target_arch = "aarch64")]
fn renameat() -> libc::c_long {
    crate::linux::seccomp::SYS_RENAMEAT_GENERIC as libc::c_long
}

/// An operation the supervisor carries out itself, beneath the descriptor
/// of supervised directory `dir` (an index into the plan's list).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Act {
    Open {
        dir: usize,
        name: OsString,
        flags: i32,
        mode: u32,
    },
    Mkdir {
        dir: usize,
        name: OsString,
        mode: u32,
    },
    Rmdir {
        dir: usize,
        name: OsString,
    },
    Unlink {
        dir: usize,
        name: OsString,
    },
    Link {
        dir: usize,
        from: OsString,
        to: OsString,
    },
    /// `target` is one plain name: another granted name, or a lock's note.
    Symlink {
        dir: usize,
        target: OsString,
        name: OsString,
    },
    Rename {
        dir: usize,
        from: OsString,
        to: OsString,
        flags: u32,
    },
    Utimens {
        dir: usize,
        name: OsString,
        times: u64,
    },
}

impl std::fmt::Display for Act {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Act::Open { name, .. } => write!(f, "create {}", name.to_string_lossy()),
            Act::Mkdir { name, .. } => write!(f, "mkdir {}", name.to_string_lossy()),
            Act::Rmdir { name, .. } => write!(f, "rmdir {}", name.to_string_lossy()),
            Act::Unlink { name, .. } => write!(f, "unlink {}", name.to_string_lossy()),
            Act::Link { from, to, .. } => write!(
                f,
                "link {} as {}",
                from.to_string_lossy(),
                to.to_string_lossy()
            ),
            Act::Symlink { target, name, .. } => write!(
                f,
                "symlink {} to {}",
                name.to_string_lossy(),
                target.to_string_lossy()
            ),
            Act::Rename { from, to, .. } => write!(
                f,
                "rename {} to {}",
                from.to_string_lossy(),
                to.to_string_lossy()
            ),
            Act::Utimens { name, .. } => write!(f, "set the times of {}", name.to_string_lossy()),
        }
    }
}

/// A supervised entry named by a call: (directory index, name).
type Entry = (usize, OsString);

/// Decides. `dir_is` answers whether the caller's directory argument
/// (`AT_FDCWD`: its working directory) is supervised directory `i`; it is
/// asked only for a relative single name that matches a prefix.
pub fn decide(
    call: &Call,
    dirs: &[Supervised],
    policy: &Policy,
    dir_is: &mut dyn FnMut(Dirfd, usize) -> bool,
) -> Option<Act> {
    let mut entry = |at: Dirfd, path: &[u8]| entry(at, path, dirs, dir_is);
    let allows = |(dir, name): &Entry, op: Op| {
        policy
            .evaluate_resolved(&dirs[*dir].dir.join(name), op)
            .allowed
    };
    match call {
        Call::Open {
            at,
            path,
            flags,
            mode,
        } => {
            // An open that makes or empties a file, whatever its other
            // flags; never O_TMPFILE or O_PATH.
            let makes = libc::O_CREAT | libc::O_TRUNC;
            if flags & makes == 0 || flags & (libc::O_TMPFILE | libc::O_PATH) != 0 {
                return None;
            }
            let e = entry(*at, path)?;
            allows(&e, Op::Write).then_some(Act::Open {
                dir: e.0,
                name: e.1,
                flags: *flags,
                mode: *mode,
            })
        }
        Call::Mkdir { at, path, mode } => {
            let e = entry(*at, path)?;
            allows(&e, Op::Write).then_some(Act::Mkdir {
                dir: e.0,
                name: e.1,
                mode: *mode,
            })
        }
        Call::Rmdir { at, path } => {
            let e = entry(*at, path)?;
            allows(&e, Op::Remove).then_some(Act::Rmdir {
                dir: e.0,
                name: e.1,
            })
        }
        Call::Unlink { at, path } => {
            let e = entry(*at, path)?;
            allows(&e, Op::Remove).then_some(Act::Unlink {
                dir: e.0,
                name: e.1,
            })
        }
        Call::Link {
            from_at,
            from,
            to_at,
            to,
            flags,
        } => {
            // AT_SYMLINK_FOLLOW and AT_EMPTY_PATH name a file by what a
            // link or a descriptor leads to: the kernel's.
            if *flags != 0 {
                return None;
            }
            // Both names granted, in one directory: a granted name never
            // becomes a second name of a file of yours.
            let a = entry(*from_at, from)?;
            let b = entry(*to_at, to)?;
            let ok = a.0 == b.0 && allows(&a, Op::Write) && allows(&b, Op::Write);
            ok.then_some(Act::Link {
                dir: a.0,
                from: a.1,
                to: b.1,
            })
        }
        Call::Symlink { target, at, path } => {
            // A granted name must not lead a tool that writes it later,
            // outside the sandbox, to a file of yours: the link may hold
            // only another granted name, or a lock's note (`host:pid`,
            // `user@host.pid`: not hidden, with a `:` or an `@`), which no
            // file of yours is called. Never a hidden name that does not
            // exist yet (`.bash_profile`): a save from outside would
            // create it.
            if !valid_name(target) {
                return None;
            }
            let e = entry(*at, path)?;
            let granted_target = dirs[e.0]
                .prefixes
                .iter()
                .any(|p| target.starts_with(p.as_bytes()))
                && allows(&(e.0, OsStr::from_bytes(target).to_owned()), Op::Write);
            let note = !target.starts_with(b".") && target.iter().any(|b| matches!(b, b':' | b'@'));
            let leads_nowhere_of_yours = granted_target || note;
            if !leads_nowhere_of_yours {
                return None;
            }
            allows(&e, Op::Write).then_some(Act::Symlink {
                dir: e.0,
                target: OsStr::from_bytes(target).to_owned(),
                name: e.1,
            })
        }
        Call::Rename {
            from_at,
            from,
            to_at,
            to,
            flags,
        } => {
            // RENAME_WHITEOUT is for overlay filesystems, not agents.
            if flags & !(libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE) != 0 {
                return None;
            }
            let a = entry(*from_at, from)?;
            let b = entry(*to_at, to)?;
            // Both ends in one supervised directory: a rename from anywhere
            // else is the kernel's (and it refuses across mounts).
            let ok = a.0 == b.0
                && allows(&a, Op::Remove)
                && allows(&b, Op::Write)
                && allows(&b, Op::Remove);
            ok.then_some(Act::Rename {
                dir: a.0,
                from: a.1,
                to: b.1,
                flags: *flags,
            })
        }
        Call::Utimens {
            at,
            path,
            times,
            flags,
        } => {
            if flags & !libc::AT_SYMLINK_NOFOLLOW != 0 {
                return None;
            }
            let e = entry(*at, path)?;
            allows(&e, Op::Write).then_some(Act::Utimens {
                dir: e.0,
                name: e.1,
                times: *times,
            })
        }
    }
}

/// The supervised entry a path names: a single name directly in a
/// supervised directory that starts with one of its prefixes. An absolute
/// path must spell the directory exactly as the plan knows it (no `..`, no
/// `//`, no trailing `/`): anything fancier is the kernel's.
fn entry(
    at: Dirfd,
    path: &[u8],
    dirs: &[Supervised],
    dir_is: &mut dyn FnMut(Dirfd, usize) -> bool,
) -> Option<Entry> {
    let granted = |i: usize, name: &[u8]| {
        valid_name(name)
            && dirs[i]
                .prefixes
                .iter()
                .any(|p| name.starts_with(p.as_bytes()))
    };
    if path.first() == Some(&b'/') {
        for (i, d) in dirs.iter().enumerate() {
            for spelling in std::iter::once(&d.dir).chain(&d.spellings) {
                let s = spelling.as_os_str().as_bytes();
                if let Some(rest) = path.strip_prefix(s).and_then(|r| r.strip_prefix(b"/")) {
                    if granted(i, rest) {
                        return Some((i, OsStr::from_bytes(rest).to_owned()));
                    }
                }
            }
        }
        return None;
    }
    (0..dirs.len())
        .find(|&i| granted(i, path) && dir_is(at, i))
        .map(|i| (i, OsStr::from_bytes(path).to_owned()))
}

/// One plain directory entry name.
fn valid_name(name: &[u8]) -> bool {
    !name.is_empty() && name != b"." && name != b".." && !name.contains(&b'/')
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
