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
        // The filter hands over only unlinkat(AT_REMOVEDIR); a file's
        // unlink stays the kernel's.
        libc::SYS_unlinkat if args[2] as i32 & libc::AT_REMOVEDIR != 0 => Some(Call::Rmdir {
            at: fd(args[0]),
            path: read(args[1])?,
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
            // Only an exclusive create (what the filter hands over); never
            // O_TMPFILE or O_PATH.
            let exclusive = libc::O_CREAT | libc::O_EXCL;
            if flags & exclusive != exclusive || flags & (libc::O_TMPFILE | libc::O_PATH) != 0 {
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
mod tests {
    use super::*;
    use crate::policy::build::{Platform, PolicyInput, Writable};
    use crate::policy::Matcher;
    use std::path::PathBuf;

    fn setup() -> (Vec<Supervised>, Policy) {
        let home = PathBuf::from("/home/u");
        let policy = Policy::build(&PolicyInput {
            links: Vec::new(),
            platform: Platform::Linux,
            home: home.clone(),
            roots: vec![],
            backend_state: vec![
                Writable {
                    matcher: Matcher::NamePrefix {
                        dir: home.clone(),
                        prefix: ".claude.json".into(),
                    },
                    why: "claude".into(),
                    layered: false,
                },
                Writable {
                    matcher: Matcher::NamePrefix {
                        dir: home.clone(),
                        prefix: ".zcode".into(),
                    },
                    why: "zcode".into(),
                    layered: false,
                },
            ],
            temp_and_caches: vec![],
            once_allows: vec![],
            profile_dir: None,
            managed_root: home.join(".zcode-acp"),
            network: Default::default(),
        });
        let dirs = vec![Supervised {
            dir: home,
            spellings: vec!["/users/u".into()],
            prefixes: vec![".claude.json".into(), ".zcode".into()],
        }];
        (dirs, policy)
    }

    fn open(path: &str, flags: i32) -> Call {
        Call::Open {
            at: libc::AT_FDCWD,
            path: path.as_bytes().to_vec(),
            flags,
            mode: 0o666,
        }
    }

    fn decide_with_cwd(call: &Call, cwd_is_home: bool) -> Option<Act> {
        let (dirs, policy) = setup();
        decide(call, &dirs, &policy, &mut |_, _| cwd_is_home)
    }

    #[test]
    fn claude_saves_its_settings_through_the_supervisor() {
        let w = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL;
        let act = decide_with_cwd(&open("/home/u/.claude.json.tmp.42.abc", w), false);
        assert_eq!(
            act,
            Some(Act::Open {
                dir: 0,
                name: ".claude.json.tmp.42.abc".into(),
                flags: w,
                mode: 0o666
            })
        );
        // The lock directory and the rename over the file.
        assert!(matches!(
            decide_with_cwd(
                &Call::Mkdir {
                    at: libc::AT_FDCWD,
                    path: b"/home/u/.claude.json.lock".to_vec(),
                    mode: 0o777
                },
                false
            ),
            Some(Act::Mkdir { .. })
        ));
        let rename = Call::Rename {
            from_at: libc::AT_FDCWD,
            from: b"/home/u/.claude.json.tmp.42.abc".to_vec(),
            to_at: libc::AT_FDCWD,
            to: b"/home/u/.claude.json".to_vec(),
            flags: 0,
        };
        assert!(matches!(
            decide_with_cwd(&rename, false),
            Some(Act::Rename { .. })
        ));
        // Spelled through the other name of the home directory.
        assert!(decide_with_cwd(&open("/users/u/.zcode-x", w), false).is_some());
    }

    #[test]
    fn nothing_else_in_home_is_taken_on() {
        let w = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL;
        // A truncating write is never taken on, even for a granted name.
        assert_eq!(
            decide_with_cwd(
                &open("/home/u/.claude.json", libc::O_WRONLY | libc::O_TRUNC),
                false
            ),
            None
        );
        for path in [
            "/home/u/.bashrc",
            "/home/u/.profile",
            "/home/u/.bash_profile",
            "/home/u/.claude.jso",
            "/home/u/x/.claude.json",
            "/home/u/.zcode-shell-agent/t.jsonl",
            "/home/u/../u/.claude.json",
            "/home/u//.claude.json",
            "/home/u/.claude.json/",
            "/home/uu/.claude.json",
            "/home/u",
            "/etc/passwd",
            // The managed root matches the prefix; its island takes it back.
            "/home/u/.zcode-acp",
        ] {
            assert_eq!(decide_with_cwd(&open(path, w), true), None, "{path}");
        }
        // O_TMPFILE / O_PATH are never ours.
        assert_eq!(
            decide_with_cwd(
                &open(
                    "/home/u/.zcode-x",
                    libc::O_TMPFILE | libc::O_RDWR | libc::O_EXCL
                ),
                false
            ),
            None
        );
        // A rename that brings something in from elsewhere, or takes a
        // granted entry out, is the kernel's.
        for (from, to) in [
            ("/home/u/w/evil", "/home/u/.zcode-x"),
            ("/home/u/.zcode-x", "/home/u/.bashrc"),
            ("/home/u/.zcode-acp", "/home/u/.zcode-y"),
        ] {
            let r = Call::Rename {
                from_at: libc::AT_FDCWD,
                from: from.as_bytes().to_vec(),
                to_at: libc::AT_FDCWD,
                to: to.as_bytes().to_vec(),
                flags: 0,
            };
            assert_eq!(decide_with_cwd(&r, false), None, "{from} -> {to}");
        }
    }

    #[test]
    fn a_relative_name_counts_only_where_the_caller_is_in_the_directory() {
        let w = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL;
        assert!(decide_with_cwd(&open(".zcode-notes", w), true).is_some());
        assert_eq!(decide_with_cwd(&open(".zcode-notes", w), false), None);
        assert_eq!(decide_with_cwd(&open("./.zcode-notes", w), true), None);
        assert_eq!(decide_with_cwd(&open(".bashrc", w), true), None);
    }

    #[test]
    fn calls_are_decoded_from_their_arguments() {
        let mut mem = |addr: u64| Some(format!("/p{addr}").into_bytes());
        let c = decode(
            libc::SYS_renameat2 as u32,
            [
                3,
                1,
                libc::AT_FDCWD as u64,
                2,
                libc::RENAME_NOREPLACE as u64,
                0,
            ],
            &mut mem,
        );
        assert_eq!(
            c,
            Some(Call::Rename {
                from_at: 3,
                from: b"/p1".to_vec(),
                to_at: libc::AT_FDCWD,
                to: b"/p2".to_vec(),
                flags: libc::RENAME_NOREPLACE
            })
        );
        let c = decode(
            libc::SYS_unlinkat as u32,
            [3, 7, libc::AT_REMOVEDIR as u64, 0, 0, 0],
            &mut mem,
        );
        assert!(matches!(c, Some(Call::Rmdir { at: 3, .. })));
        let c = decode(libc::SYS_unlinkat as u32, [3, 7, 0, 0, 0, 0], &mut mem);
        assert_eq!(c, None, "a file's unlink is the kernel's");
        // An unreadable path: not ours.
        let mut none = |_: u64| None;
        assert_eq!(decode(libc::SYS_openat as u32, [0; 6], &mut none), None);
    }
}
