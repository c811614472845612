//! Unix sockets: default-deny. A server listening outside the sandbox runs
//! what it is sent with its own rights (gpg-agent makes and deletes keys,
//! an editor's server opens files and runs tasks, tmux and screen type
//! commands, systemd's manager starts units, container engines mount any
//! host directory), and neither Landlock nor read-only mounts stop a
//! `connect()` to a path. So the sandbox reaches no socket but a short list
//! of services that only answer questions or take logs, and its own.
//!
//! One table serves both platforms: on Linux every listening pathname
//! socket seen when the sandbox is armed (`/proc/net/unix`), and the
//! well-known ones here, are covered except the allowed; on macOS Seatbelt
//! denies every unix-socket connect but the allowed. Pure: the caller reads
//! the machine.

use std::path::{Path, PathBuf};

/// Where an entry applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Os {
    Linux,
    MacOs,
}

/// A socket (or directory of sockets) the sandbox may still reach, and why.
pub struct Allowed {
    pub on: Os,
    pub path: &'static str,
    /// The whole directory, not one socket.
    pub dir: bool,
    pub why: &'static str,
}

/// Services that answer questions or take logs, and act on nothing: the
/// one list both platforms are generated from (Linux leaves them
/// uncovered, Seatbelt allows their connects).
pub const ALLOWED: &[Allowed] = &[
    Allowed {
        on: Os::Linux,
        path: "/run/nscd/socket",
        dir: false,
        why: "the name service cache (user, group and host lookups)",
    },
    Allowed {
        on: Os::Linux,
        path: "/var/run/nscd/socket",
        dir: false,
        why: "the name service cache (user, group and host lookups)",
    },
    Allowed {
        on: Os::Linux,
        path: "/run/systemd/userdb",
        dir: true,
        why: "systemd's user and group lookups",
    },
    Allowed {
        on: Os::Linux,
        path: "/run/systemd/resolve/io.systemd.Resolve",
        dir: false,
        why: "systemd-resolved's name lookups (DNS)",
    },
    Allowed {
        on: Os::Linux,
        path: "/run/systemd/journal/socket",
        dir: false,
        why: "the journal (log messages only)",
    },
    Allowed {
        on: Os::Linux,
        path: "/run/systemd/journal/stdout",
        dir: false,
        why: "the journal (log messages only)",
    },
    Allowed {
        on: Os::Linux,
        path: "/run/systemd/journal/dev-log",
        dir: false,
        why: "the journal's syslog socket (log messages only)",
    },
    Allowed {
        on: Os::Linux,
        path: "/dev/log",
        dir: false,
        why: "syslog (log messages only)",
    },
    Allowed {
        on: Os::MacOs,
        path: "/private/var/run/mDNSResponder",
        dir: false,
        why: "DNS (mDNSResponder): name lookups",
    },
    Allowed {
        on: Os::MacOs,
        path: "/private/var/run/syslog",
        dir: false,
        why: "syslog (log messages only)",
    },
];

/// The allowed services on `os`.
pub fn allowed_on(os: Os) -> impl Iterator<Item = &'static Allowed> {
    ALLOWED.iter().filter(move |a| a.on == os)
}

/// A kind of server that runs what it is sent, by where it listens on
/// each platform: the one list both platforms are generated from. Linux
/// covers each path even when nothing listens there yet (a directory: every
/// socket in it); Seatbelt denies connects matching each regex again after
/// the workspace roots allow theirs.
pub struct Escape {
    pub why: &'static str,
    /// Linux paths; `{uid}` stands for the user's id.
    pub linux: &'static [&'static str],
    /// macOS regexes (Seatbelt syntax) over real paths.
    pub macos: &'static [&'static str],
}

pub const ESCAPES: &[Escape] = &[
    Escape {
        why: "tmux servers run commands sent to them",
        linux: &["/tmp/tmux-{uid}"],
        macos: &[r"^/private/tmp/tmux-[0-9]+/"],
    },
    Escape {
        why: "screen servers run commands typed into them",
        linux: &["/run/screen", "/var/run/screen"],
        macos: &[r"^/private/tmp/\.screen/", r"^/private/tmp/uscreens/"],
    },
    Escape {
        why: "Docker: a container can write anywhere",
        linux: &["/run/docker.sock", "/var/run/docker.sock"],
        macos: &[r"/docker\.sock$"],
    },
    Escape {
        why: "Podman: a container can write anywhere",
        linux: &["/run/podman"],
        macos: &[r"/podman\.sock$"],
    },
    Escape {
        why: "containerd: a container can write anywhere",
        linux: &["/run/containerd"],
        macos: &[r"/containerd\.sock$"],
    },
    Escape {
        why: "the system D-Bus",
        linux: &["/run/dbus", "/var/run/dbus"],
        macos: &[],
    },
    Escape {
        why: "the systemd manager's private API: starts anything as root",
        linux: &["/run/systemd/private"],
        macos: &[],
    },
];

/// Well-known places of servers that run what they are sent, covered on
/// Linux even when nothing listens there at arming (a directory) and named
/// in the log.
pub struct Known {
    pub path: String,
    pub why: &'static str,
}

/// The well-known servers for a user on Linux: [`ESCAPES`], and those
/// named by `uid`, `$XDG_RUNTIME_DIR` and `$SSH_AUTH_SOCK`. The runtime
/// directory is covered whatever `XDG_RUNTIME_DIR` says: both
/// `/run/user/UID` and that value.
pub fn linux_known(
    uid: u32,
    xdg_runtime_dir: Option<&Path>,
    ssh_auth_sock: Option<&Path>,
) -> Vec<Known> {
    let mut out = vec![Known {
        path: format!("/run/user/{uid}"),
        why: "the user's runtime dir: the session D-Bus, the systemd user manager (systemd-run --user), gpg and other agents, editor and desktop servers",
    }];
    if let Some(x) = xdg_runtime_dir {
        out.push(Known {
            path: x.display().to_string(),
            why: "$XDG_RUNTIME_DIR: the session D-Bus, the systemd user manager, agents",
        });
    }
    for e in ESCAPES {
        for path in e.linux {
            out.push(Known {
                path: path.replace("{uid}", &uid.to_string()),
                why: e.why,
            });
        }
    }
    if let Some(s) = ssh_auth_sock {
        out.push(Known {
            path: s.display().to_string(),
            why: "the ssh agent signs for the caller",
        });
    }
    out
}

/// The regexes Seatbelt denies last on macOS, each with why.
pub fn macos_denied() -> impl Iterator<Item = (&'static str, &'static str)> {
    ESCAPES
        .iter()
        .flat_map(|e| e.macos.iter().map(move |re| (*re, e.why)))
}

/// Whether `path` is a socket the sandbox may still reach on Linux.
pub fn linux_allowed(path: &Path) -> Option<&'static str> {
    allowed_on(Os::Linux)
        .find(|a| {
            if a.dir {
                path.starts_with(a.path)
            } else {
                path == Path::new(a.path)
            }
        })
        .map(|a| a.why)
}

/// One bound socket of a `/proc/net/unix` listing: its socket inode and the
/// name it was bound to (absolute, or relative to the binder's directory
/// then).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bound {
    pub inode: u64,
    pub path: PathBuf,
}

/// The bound pathname sockets listed in a `/proc/net/unix` (listening
/// stream sockets and bound datagram ones; abstract names belong to a
/// network namespace, and the sandbox has its own), each once.
pub fn bound_in(proc_net_unix: &str) -> Vec<Bound> {
    let mut out: Vec<Bound> = Vec::new();
    for line in proc_net_unix.lines().skip(1) {
        let Some((inode, path)) = split_line(line) else {
            continue;
        };
        if path.starts_with('@') {
            continue;
        }
        let b = Bound {
            inode,
            path: PathBuf::from(path),
        };
        if !out.contains(&b) {
            out.push(b);
        }
    }
    out
}

/// `Num RefCount Protocol Flags Type St Inode Path`: the kernel pads the
/// inode to five columns (`%5lu`), so fields are split on runs of spaces,
/// and the path is everything after the one space that follows the inode
/// (a path may hold spaces of its own).
fn split_line(line: &str) -> Option<(u64, &str)> {
    let mut rest = line;
    let mut inode = None;
    for field in 0..7 {
        rest = rest.trim_start_matches(' ');
        let end = rest.find(' ').unwrap_or(rest.len());
        if field == 6 {
            inode = rest[..end].parse().ok();
        }
        rest = &rest[end..];
    }
    let path = rest.strip_prefix(' ')?;
    (!path.is_empty()).then_some((inode?, path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bound_sockets_are_read_from_proc_net_unix() {
        let text = "Num       RefCount Protocol Flags    Type St Inode Path\n\
ffff8881: 00000002 00000000 00010000 0001 01 12345 /run/systemd/private\n\
ffff8882: 00000002 00000000 00010000 0001 01 12346 @/tmp/.X11-unix/X0\n\
ffff8883: 00000003 00000000 00000000 0001 03 12347\n\
ffff8884: 00000002 00000000 00010000 0001 01 12348 /home/u/.gnupg/S.gpg-agent\n\
ffff8885: 00000003 00000000 00000000 0001 03 12349 /home/u/.gnupg/S.gpg-agent\n\
ffff8886: 00000002 00000000 00000000 0002 01 12350 /run/systemd/journal/dev-log\n\
ffff8887: 00000002 00000000 00010000 0001 01   927 /run/small inode\n\
ffff8888: 00000002 00000000 00010000 0001 01 12351 x.sock\n\
ffff8889: 00000002 00000000 00010000 0001 01    12  /a path with a leading space\n";
        let bound = bound_in(text);
        let got: Vec<(u64, &str)> = bound
            .iter()
            .map(|b| (b.inode, b.path.to_str().unwrap()))
            .collect();
        assert_eq!(
            got,
            [
                (12345, "/run/systemd/private"),
                (12348, "/home/u/.gnupg/S.gpg-agent"),
                (12349, "/home/u/.gnupg/S.gpg-agent"),
                (12350, "/run/systemd/journal/dev-log"),
                (927, "/run/small inode"),
                (12351, "x.sock"),
                (12, " /a path with a leading space"),
            ]
        );
    }

    #[test]
    fn only_services_that_act_on_nothing_are_reachable() {
        assert!(linux_allowed(Path::new("/run/systemd/journal/socket")).is_some());
        assert!(linux_allowed(Path::new("/run/systemd/userdb/io.systemd.Multiplexer")).is_some());
        for p in [
            "/run/systemd/private",
            "/run/systemd/journal",
            "/run/dbus/system_bus_socket",
            "/home/u/.gnupg/S.gpg-agent",
            "/run/systemd/notify",
        ] {
            assert!(linux_allowed(Path::new(p)).is_none(), "{p}");
        }
        let known = linux_known(1000, Some(Path::new("/run/custom")), None);
        let paths: Vec<&str> = known.iter().map(|k| k.path.as_str()).collect();
        assert!(paths.contains(&"/run/user/1000") && paths.contains(&"/run/custom"));
    }
}
