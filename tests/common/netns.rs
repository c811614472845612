//! Network namespaces of a test's own (Linux, root): a stand-in for the
//! user's machine, and an "internet" beyond a router, so that a test can
//! put a server where the sandbox reaches it as it reaches a real host.
//! Each is made by `unshare` in a shell that first checks that
//! `/proc/self/ns/net` (and `mnt`, where it makes one) is not this
//! process's; processes enter one with `setns` and check the same before
//! running. Nothing here touches this machine's own network or mounts.

use std::io::{BufRead, BufReader};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdout, Command, Stdio};

pub fn ns_of(pid: &str, kind: &str) -> u64 {
    std::fs::metadata(format!("/proc/{pid}/ns/{kind}"))
        .unwrap()
        .ino()
}

/// A process of the test's own in a network namespace it made; ended by
/// pid when dropped.
pub struct Netns {
    pub holder: Child,
    pub out: BufReader<ChildStdout>,
}

impl Netns {
    /// `unshare --net` (and `--mount`, if `mount`), the checks, `setup`,
    /// then `exec last` (which must print "ready" once it serves).
    pub fn spawn(mount: bool, setup: &str, last: &str) -> Netns {
        let check = r#"[ "$(stat -Lc %i /proc/self/ns/net)" != "$ZC_OUTER_NET" ] || { echo "the network namespace did not change: refusing to configure it" >&2; exit 99; }
[ "$ZC_OUTER_MNT" = none ] || [ "$(stat -Lc %i /proc/self/ns/mnt)" != "$ZC_OUTER_MNT" ] || { echo "the mount namespace did not change: refusing to mount" >&2; exit 99; }"#;
        let outer_mnt = if mount {
            ns_of("self", "mnt").to_string()
        } else {
            "none".to_owned()
        };
        let mut holder = Command::new("unshare")
            .arg("--net")
            .args(mount.then_some("--mount"))
            .args(["--", "sh", "-euc"])
            .arg(format!("{check}\necho unshared\n{setup}\nexec {last}"))
            .env("ZC_OUTER_NET", ns_of("self", "net").to_string())
            .env("ZC_OUTER_MNT", outer_mnt)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("unshare");
        let out = BufReader::new(holder.stdout.take().unwrap());
        Netns { holder, out }
    }

    pub fn pid(&self) -> u32 {
        self.holder.id()
    }

    /// Until the holder has said `word` (it says "unshared" once its
    /// namespaces are its own and checked, then "ready").
    fn wait_for(&mut self, word: &str) {
        loop {
            let mut line = String::new();
            let n = self.out.read_line(&mut line).unwrap();
            assert!(n > 0, "a namespace of the test's world did not start");
            if line.starts_with(word) {
                return;
            }
        }
    }

    /// Until the namespace is the holder's own: before that, a link moved
    /// "into" it would land in this machine's namespace.
    pub fn wait_unshared(&mut self) {
        self.wait_for("unshared");
    }

    pub fn wait_ready(&mut self) {
        self.wait_for("ready");
    }

    /// `cmd` runs in this namespace, and in its mount namespace if it made
    /// one (as `ids`, if given, after entering them).
    pub fn enter(&self, cmd: &mut Command, ids: Option<(u32, u32)>) -> Vec<std::fs::File> {
        enter(self.pid(), cmd, ids)
    }
}

/// `cmd` runs in the namespaces of the test's process `pid`, as
/// [`Netns::enter`] says.
pub fn enter(pid: u32, cmd: &mut Command, ids: Option<(u32, u32)>) -> Vec<std::fs::File> {
    let open = |kind: &str| {
        let ns = std::fs::File::open(format!("/proc/{pid}/ns/{kind}")).unwrap();
        let ino = ns.metadata().unwrap().ino();
        (ns, ino)
    };
    let (net, want_net) = open("net");
    let (mnt, want_mnt) = open("mnt");
    let own_mnt = want_mnt != ns_of("self", "mnt");
    let (net_fd, mnt_fd) = (net.as_raw_fd(), mnt.as_raw_fd());
    // Entering a mount namespace moves to its root: the command's own
    // directory is entered again after it.
    let cwd = cmd.get_current_dir().map(|d| {
        std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(d.as_os_str())).unwrap()
    });
    // SAFETY: runs in the forked child before exec; system calls only.
    unsafe {
        cmd.pre_exec(move || {
            let is = |path: &std::ffi::CStr, want: u64| {
                let mut st: libc::stat = std::mem::zeroed();
                libc::stat(path.as_ptr(), &mut st) == 0 && st.st_ino == want
            };
            if own_mnt {
                if libc::setns(mnt_fd, libc::CLONE_NEWNS) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if !is(c"/proc/self/ns/mnt", want_mnt) {
                    return Err(std::io::Error::other("not in the test's mount namespace"));
                }
                if let Some(cwd) = &cwd {
                    if libc::chdir(cwd.as_ptr()) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
            }
            if libc::setns(net_fd, libc::CLONE_NEWNET) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if !is(c"/proc/self/ns/net", want_net) {
                return Err(std::io::Error::other("not in the test's network namespace"));
            }
            match ids {
                Some((uid, gid)) => super::become_user(uid, gid),
                None => Ok(()),
            }
        });
    }
    // Kept open by the caller until the command is spawned.
    vec![net, mnt]
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = self.holder.kill();
        let _ = self.holder.wait();
    }
}

/// Whether `tools` (what a test's network world is made with) are all on
/// PATH; else a printed skip naming those missing.
pub fn have_tools(tools: &[&str]) -> bool {
    let missing: Vec<&str> = tools
        .iter()
        .copied()
        .filter(|tool| {
            !Command::new("sh")
                .args(["-c", &format!("command -v {tool}")])
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .collect();
    missing.is_empty()
        || super::skip(&format!(
            "the test's network world needs {}",
            missing.join(", ")
        ))
}

/// The least world in which a sandbox reaches a host as it reaches the
/// internet: "the host" (where the test's command starts), and beyond a
/// router a namespace holding 198.51.100.2 (a documentation address, so
/// nothing real). Returns (host, internet); the caller starts its servers
/// in the internet with [`Netns::enter`].
pub fn a_host_beyond_a_router() -> (Netns, Netns) {
    let mut internet = Netns::spawn(
        false,
        "ip link set lo up
         n=0; while ! ip link show vb >/dev/null 2>&1; do n=$((n+1)); [ $n -lt 500 ] || exit 98; sleep 0.02; done
         ip addr add 10.77.0.2/24 dev vb
         ip addr add 198.51.100.2/24 dev vb
         ip link set vb up
         echo ready",
        "sleep 100000",
    );
    internet.wait_unshared();
    let mut host = Netns::spawn(
        false,
        &format!(
            "ip link set lo up
             ip link add va type veth peer name vb netns {}
             ip addr add 10.77.0.1/24 dev va
             ip link set va up
             ip route add 198.51.100.0/24 via 10.77.0.2
             echo ready",
            internet.pid()
        ),
        "sleep 100000",
    );
    host.wait_ready();
    internet.wait_ready();
    (host, internet)
}

/// A network namespace with nothing but its loopback: what a test runs in
/// when nothing it starts may reach beyond this machine.
pub fn only_a_loopback() -> Netns {
    let mut ns = Netns::spawn(false, "ip link set lo up\necho ready", "sleep 100000");
    ns.wait_ready();
    ns
}
