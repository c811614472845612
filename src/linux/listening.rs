//! The Unix sockets bound on this machine when a sandbox is armed, by the
//! paths a `connect()` from inside would use. `/proc/net/unix` alone tells
//! too little: it lists only the sockets of the reader's own network
//! namespace (a pathname socket is reached through the filesystem whatever
//! namespace its server is in), and it gives the name a socket was bound
//! to, which for a relative bind is relative to a directory it does not
//! name. (A socket bound under a temporary name and then renamed or linked
//! into place, as OpenSSH's ControlMaster does, is found by the plan, which
//! looks at every socket beside a bound one.)
//!
//! Everything here only reads `/proc`; what it cannot read (another user's
//! processes, for an unprivileged user) it leaves out, and the plan's gaps
//! say so.

use std::path::PathBuf;

use crate::policy::sockets::{self, Bound};

/// At most this many other network namespaces are read: a machine with
/// more (a host of many containers) keeps arming bounded, and the rest are
/// named in the log.
const MAX_OTHER_NAMESPACES: usize = 256;
/// At most this many descriptors are looked at to find where relative
/// binds live.
const MAX_DESCRIPTORS: usize = 200_000;

/// A scan [`prefetch`] started, and when.
type Prefetched = (std::time::Instant, std::thread::JoinHandle<Vec<String>>);
/// The scan [`prefetch`] started, taken by the next [`bound_sockets`].
static PREFETCHED: std::sync::Mutex<Option<Prefetched>> = std::sync::Mutex::new(None);
/// A prefetched scan that started longer ago than this is not taken, and
/// the namespaces are read afresh: a socket bound since would be missed
/// (one left by an arming that failed, or by a long arming of large
/// workspaces, must not stand for the machine now).
const FRESH_FOR: std::time::Duration = std::time::Duration::from_secs(2);

/// Starts reading the other network namespaces' sockets on a thread of
/// its own, for the next [`bound_sockets`] to take: finding them reads a
/// link of every process (a few microseconds each, milliseconds on a
/// machine of hundreds), which then overlaps the policy's reading instead
/// of following it. This namespace's own listing, where the sockets a
/// command is likeliest to reach live, is still read when the plan is
/// made. Whoever calls this joins the thread (the next `bound_sockets`)
/// before it needs to be single-threaded again (see
/// [`super::exec::wait_until_single_threaded`]).
pub fn prefetch() {
    let started = std::time::Instant::now();
    let scan = std::thread::Builder::new()
        .name("socket-scan".into())
        .spawn(other_namespaces_listings);
    if let (Ok(handle), Ok(mut slot)) = (scan, PREFETCHED.lock()) {
        *slot = Some((started, handle));
    }
}

/// Every bound pathname socket this process can learn of, absolute, each
/// once (the other namespaces' as [`prefetch`] read them, if it did).
pub fn bound_sockets() -> Vec<PathBuf> {
    bound_sockets_within(FRESH_FOR)
}

/// [`bound_sockets`], taking a prefetched scan only if it started at most
/// `fresh_for` ago.
fn bound_sockets_within(fresh_for: std::time::Duration) -> Vec<PathBuf> {
    let mut listings = vec![std::fs::read_to_string("/proc/self/net/unix").unwrap_or_default()];
    let prefetched = PREFETCHED.lock().ok().and_then(|mut slot| slot.take());
    // Too old, it is not waited for: its thread ends by itself.
    let fresh = prefetched.and_then(|(started, scan)| {
        let young = started.elapsed() <= fresh_for;
        young.then(|| scan.join().ok()).flatten()
    });
    match fresh {
        Some(others) => listings.extend(others),
        None => listings.extend(other_namespaces_listings()),
    }
    let mut out: Vec<PathBuf> = Vec::new();
    let mut relative: Vec<Bound> = Vec::new();
    for b in listings.iter().flat_map(|l| sockets::bound_in(l)) {
        if b.path.is_absolute() {
            if !out.contains(&b.path) {
                out.push(b.path);
            }
        } else if !relative.contains(&b) {
            relative.push(b);
        }
    }
    for p in where_relative_binds_live(&relative) {
        if !out.contains(&p) {
            out.push(p);
        }
    }
    out
}

/// The numeric entries of `/proc`.
fn pids() -> impl Iterator<Item = u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
}

/// `/proc/PID/net/unix` of one process in each network namespace other
/// than ours.
fn other_namespaces_listings() -> Vec<String> {
    let mut seen: Vec<PathBuf> = std::fs::read_link("/proc/self/ns/net")
        .into_iter()
        .collect();
    let mut out = Vec::new();
    // Each process's link read relative to `/proc`, held open: one path
    // walk fewer per process, of hundreds.
    let Ok(proc) = std::fs::File::open("/proc") else {
        return out;
    };
    for pid in pids() {
        let Ok(ns) = nix::fcntl::readlinkat(&proc, format!("{pid}/ns/net").as_str()) else {
            continue; // another user's, or gone
        };
        let ns = PathBuf::from(ns);
        if seen.contains(&ns) {
            continue;
        }
        if out.len() == MAX_OTHER_NAMESPACES {
            tracing::info!(
                "more than {MAX_OTHER_NAMESPACES} network namespaces: the sockets of the rest are covered only if the plan finds them beside others"
            );
            break;
        }
        seen.push(ns);
        if let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/net/unix")) {
            out.push(text);
        }
    }
    out
}

/// A relative bind names a path from its binder's working directory: each
/// is looked for from the working directory of a process holding it now
/// (where the binder usually still is).
fn where_relative_binds_live(relative: &[Bound]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if relative.is_empty() {
        return out;
    }
    let mut left: Vec<&Bound> = relative.iter().collect();
    let mut budget = MAX_DESCRIPTORS;
    'pids: for pid in pids() {
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if budget == 0 {
                break 'pids;
            }
            budget -= 1;
            let Some(inode) = std::fs::read_link(fd.path())
                .ok()
                .as_deref()
                .and_then(socket_inode)
            else {
                continue;
            };
            let (found, rest): (Vec<&Bound>, Vec<&Bound>) =
                left.into_iter().partition(|b| b.inode == inode);
            left = rest;
            if !found.is_empty() {
                if let Ok(cwd) = std::fs::read_link(format!("/proc/{pid}/cwd")) {
                    out.extend(found.iter().map(|b| cwd.join(&b.path)));
                }
            }
            if left.is_empty() {
                break 'pids;
            }
        }
    }
    for b in left {
        tracing::info!(
            socket = %b.path.display(),
            "a Unix socket bound by a relative name whose holder this user cannot see: not covered"
        );
    }
    out
}

/// The inode of a `socket:[N]` descriptor link.
fn socket_inode(link: &std::path::Path) -> Option<u64> {
    link.to_str()?
        .strip_prefix("socket:[")?
        .strip_suffix(']')?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    #[test]
    fn a_socket_bound_by_a_relative_name_is_found_where_it_lives() {
        // A child binds by a relative name from its own directory, as a
        // server started there would; this process's directory differs.
        let dir = tempfile::tempdir().unwrap();
        let dir = std::fs::canonicalize(dir.path()).unwrap();
        let mut child = std::process::Command::new("python3")
            .args([
                "-c",
                "import socket,sys; s=socket.socket(socket.AF_UNIX); s.bind('rel.sock'); s.listen(); print('up', flush=True); sys.stdin.read()",
            ])
            .current_dir(&dir)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3");
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        let found = bound_sockets();
        drop(child.stdin.take());
        let _ = child.wait();
        assert!(found.contains(&dir.join("rel.sock")), "{found:?}");
    }

    #[test]
    fn sockets_of_this_namespace_are_listed_by_their_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = std::fs::canonicalize(dir.path()).unwrap().join("abs.sock");
        let _l = UnixListener::bind(&path).unwrap();
        assert!(bound_sockets().contains(&path));
    }

    #[test]
    fn a_prefetched_scan_too_old_is_read_again() {
        // A scan started, then a server binds in a network namespace of its
        // own: a scan older than allowed must not stand for the machine.
        let dir = tempfile::tempdir().unwrap();
        let path = std::fs::canonicalize(dir.path()).unwrap().join("late.sock");
        prefetch();
        let server = std::process::Command::new("unshare")
            .args(["--user", "--map-root-user", "--net", "python3", "-c"])
            .arg("import socket,sys; s=socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(); print('up', flush=True); sys.stdin.read()")
            .arg(&path)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn();
        let Ok(mut server) = server else {
            eprintln!("skipped: `unshare` (util-linux) is not installed");
            return;
        };
        let mut line = String::new();
        let _ = std::io::BufRead::read_line(
            &mut std::io::BufReader::new(server.stdout.take().unwrap()),
            &mut line,
        );
        if line.trim() != "up" {
            drop(server.stdin.take());
            let _ = server.wait();
            eprintln!("skipped: no network namespace can be made here for the server");
            return;
        }
        let found = bound_sockets_within(std::time::Duration::ZERO);
        drop(server.stdin.take());
        let _ = server.wait();
        assert!(found.contains(&path), "{found:?}");
    }

    #[test]
    fn descriptor_links_name_their_socket_inode() {
        assert_eq!(socket_inode("socket:[4711]".as_ref()), Some(4711));
        assert_eq!(socket_inode("pipe:[4711]".as_ref()), None);
        assert_eq!(socket_inode("/dev/null".as_ref()), None);
    }
}
