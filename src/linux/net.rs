//! The sandbox's network namespace and its one way out.
//!
//! A sandbox armed with namespaces gets a network namespace of its own:
//! only a loopback, so nothing inside reaches the host's loopback (the
//! user's Jupyter, databases, editor servers), the LAN or the internet
//! directly. Servers the agent starts listen on that loopback and work
//! as usual. The way out is the proxy (`network::proxy`), which runs in
//! the host's network and judges each destination by the network table.
//!
//! Order, and why:
//! 1. before the namespaces ([`start`]): the proxy is forked, a child
//!    that stays in the host's network (and dies with the helper), with
//!    one end of a socket pair. It is this program already (no exec of
//!    its large binary), and it sets up nothing until the first
//!    connection arrives: a command that never connects pays one fork;
//! 2. after `unshare` ([`arm`]): the network namespace is checked to be
//!    new (never configure the host's), its loopback brought up, and the
//!    listeners made on it: the proxy's port and one per allowed host
//!    loopback port (a mirror). They go to the proxy over the socket pair,
//!    with the table in a sealed memfd (a message is bounded by the
//!    socket's send buffer; a table of long host names is not), and the
//!    launch goes on meanwhile: a connection waits on its listener
//!    until the proxy takes it, and a proxy that fails closes them (then
//!    connections are refused at once) and the helper says so;
//! 3. the command's environment names the proxy (`HTTP_PROXY` and the
//!    rest), with the sandbox's own loopback left direct (`NO_PROXY`).
//!
//! What does not get out: programs that ignore the proxy variables (Node's
//! built-in `fetch`, unless `NODE_USE_ENV_PROXY=1` is set, Node 24 too;
//! `ssh` remotes without a ProxyCommand),
//! UDP, and name lookups made inside (the proxy resolves names itself).

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::socket::{
    recvmsg, sendmsg, socketpair, AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags,
    SockFlag, SockType,
};
use serde::{Deserialize, Serialize};

use super::error::LaunchError;
use crate::policy::network::{NetworkPolicy, PROXY_PORT};

/// The proxy's environment for the command: the same in every process of
/// a generation, since the proxy's port is fixed.
pub fn proxy_env() -> Vec<(String, String)> {
    crate::network::proxy_env(PROXY_PORT, None)
}

/// Whether this process is in a sandbox's network of its own (only a
/// loopback): its proxy is then at the fixed port, whatever an agent left
/// of the environment it gave the process (codex filters what its MCP
/// servers get).
pub fn in_a_sandbox_network() -> bool {
    let Ok(dev) = std::fs::read_to_string("/proc/net/dev") else {
        return false;
    };
    let interfaces: Vec<&str> = dev
        .lines()
        .skip(2)
        .filter_map(|l| l.split(':').next())
        .map(str::trim)
        .collect();
    interfaces == ["lo"]
}

/// What the helper hands the proxy with the listeners.
#[derive(Debug, Serialize, Deserialize)]
struct Handover {
    policy: NetworkPolicy,
    /// The host loopback port each listener after the first mirrors.
    mirrors: Vec<u16>,
    /// The bridge's socket for questions about refused connections.
    asks: Option<String>,
    /// Where what the connections carried is counted.
    #[serde(default)]
    ledger: Option<String>,
}

/// The proxy, started and waiting for its listeners. Dropped unused (the
/// launch failed or armed less), its channel closes and it exits.
pub struct Started {
    pid: nix::unistd::Pid,
    channel: OwnedFd,
    host_net: u64,
}

/// The running proxy's channel: the proxy serves until every copy is
/// closed (the helper and the sandbox's init hold one; neither execs), so
/// it ends with the sandbox without a pid to signal, which the helper's
/// reaping could have let the system reuse.
pub struct Running {
    _channel: OwnedFd,
    /// The proxy, for the helper to say so if it ends before the sandbox.
    pub pid: nix::unistd::Pid,
}

fn refused(what: &str, e: impl std::fmt::Display) -> LaunchError {
    LaunchError::Refused(format!("cannot give the sandbox its network: {what}: {e}"))
}

/// Step 1: the proxy process, in the host's network, forked from the
/// helper. Single-threaded caller (the helper): the child may do whatever
/// a process may, allocating and starting threads included.
pub fn start() -> Result<Started, LaunchError> {
    let host_net = super::sys::ns_inode("/proc/self/ns/net")
        .map_err(|e| refused("read /proc/self/ns/net", e))?;
    let (ours, theirs) = socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(|e| refused("socketpair", e))?;
    let helper = nix::unistd::getpid();
    // SAFETY: the helper is single-threaded, so the child inherits no
    // lock another thread held; it leaves by `_exit` only.
    match unsafe { nix::unistd::fork() } {
        Ok(nix::unistd::ForkResult::Child) => {
            drop(ours);
            let code = match forked_proxy(theirs, helper) {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("zcode-acp network proxy: {e}");
                    1
                }
            };
            // SAFETY: leaves without running the helper's destructors
            // (its files and children are the helper's).
            unsafe { libc::_exit(code) }
        }
        Ok(nix::unistd::ForkResult::Parent { child }) => {
            drop(theirs);
            Ok(Started {
                pid: child,
                channel: ours,
                host_net,
            })
        }
        Err(e) => Err(refused("start its proxy", e)),
    }
}

/// The forked proxy's first steps: it dies with the helper, keeps only
/// its channel and stderr (stdout may be the agent's protocol pipe, never
/// written here), then serves.
fn forked_proxy(channel: OwnedFd, helper: nix::unistd::Pid) -> Result<(), String> {
    // SAFETY: prctl with an integer argument.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) } != 0 {
        return Err(format!(
            "PR_SET_PDEATHSIG: {}",
            std::io::Error::last_os_error()
        ));
    }
    if nix::unistd::getppid() != helper {
        // The helper ended before the signal was asked for.
        return Ok(());
    }
    // As a spawned process starts: no signal blocked (the helper may
    // block those it forwards), each one's default action, but SIGPIPE's
    // ignored as in any Rust program (a client gone is an error to read,
    // not the proxy's end).
    use nix::sys::signal::{signal, SigHandler, SigSet, Signal};
    SigSet::empty()
        .thread_set_mask()
        .map_err(|e| format!("cannot unblock signals: {e}"))?;
    for sig in Signal::iterator().filter(|s| !matches!(s, Signal::SIGKILL | Signal::SIGSTOP)) {
        let action = if sig == Signal::SIGPIPE {
            SigHandler::SigIgn
        } else {
            SigHandler::SigDfl
        };
        // SAFETY: a default or ignore disposition runs no handler code.
        let _ = unsafe { signal(sig, action) };
    }
    // The helper's log file (`--log-file`) is the helper's: its number is
    // closed or reused below, and no line of this process may go there.
    crate::logging::let_go_of_the_log_file();
    // Its own process group: a ^C or ^Z at the terminal is for the command
    // (which the helper forwards it to), never for its way out.
    let _ = nix::unistd::setpgid(nix::unistd::Pid::from_raw(0), nix::unistd::Pid::from_raw(0));
    // The channel to fd 3 first, so /dev/null (opened next) cannot take it,
    // and its old number closed (a standard one, where the helper had one
    // closed).
    let old = channel.as_raw_fd();
    if old != 3 {
        // SAFETY: dup2 onto fd 3, which this process owns from here on;
        // `old` is the channel's other number, closed once.
        unsafe {
            if libc::dup2(old, 3) < 0 {
                return Err(format!("dup2: {}", std::io::Error::last_os_error()));
            }
            libc::close(old);
        }
    }
    std::mem::forget(channel);
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
        .map_err(|e| format!("cannot open /dev/null: {e}"))?;
    // SAFETY: dup2 onto the standard descriptors; stderr only where it
    // is not open (it is the helper's, and where its messages go).
    unsafe {
        if libc::dup2(null.as_raw_fd(), 0) < 0
            || libc::dup2(null.as_raw_fd(), 1) < 0
            || (libc::fcntl(2, libc::F_GETFD) < 0 && libc::dup2(null.as_raw_fd(), 2) < 0)
        {
            return Err(format!("dup2: {}", std::io::Error::last_os_error()));
        }
    }
    // Nothing else the helper held goes with it (the generation's files,
    // the spec, the agent's pipes), /dev/null's own number included.
    std::mem::forget(null);
    super::sys::close_from(4).map_err(|e| format!("cannot close the helper's descriptors: {e}"))?;
    // SAFETY: fd 3 is the channel, owned here alone now.
    serve(unsafe { OwnedFd::from_raw_fd(3) })
}

/// The one byte of the handover message (its descriptors are what it
/// carries); a message without it is the channel closing.
const HANDOVER: &[u8] = b"h";
/// The largest handover the proxy reads: a table at its limits (a thousand
/// hosts of 253 characters, a hundred ports) is about a quarter of it.
const MAX_HANDOVER: u64 = 4 << 20;

/// A memfd holding `bytes`, sealed: what the proxy reads is what was
/// written here.
fn sealed_memfd(bytes: &[u8]) -> std::io::Result<OwnedFd> {
    use nix::sys::memfd::{memfd_create, MFdFlags};
    use std::io::Write;
    let fd = memfd_create(
        c"zcode-acp-network-table",
        MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING,
    )?;
    let mut file = std::fs::File::from(fd);
    file.write_all(bytes)?;
    let seals = libc::F_SEAL_SEAL | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE;
    // SAFETY: fcntl on a descriptor this function owns.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(file.into())
}

/// Reads the handover's table from the memfd `fd`, from its start.
fn read_table(fd: OwnedFd) -> Result<Handover, String> {
    use std::io::{Read, Seek};
    let mut file = std::fs::File::from(fd);
    let mut bytes = Vec::new();
    file.seek(std::io::SeekFrom::Start(0))
        .and_then(|_| (&mut file).take(MAX_HANDOVER + 1).read_to_end(&mut bytes))
        .map_err(|e| format!("cannot read the network table: {e}"))?;
    if bytes.len() as u64 > MAX_HANDOVER {
        return Err("the network table handed over is too large".into());
    }
    serde_json::from_slice(&bytes).map_err(|e| format!("cannot read the handover: {e}"))
}

/// Brings the loopback up (the one interface of a new namespace).
fn loopback_up() -> std::io::Result<()> {
    // SAFETY: a plain socket for the ioctls, owned at once.
    let sock = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if sock < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `sock` is a new descriptor nothing else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(sock) };
    // SAFETY: an all-zero ifreq is valid; the name fits (3 bytes of 16).
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS and SIOCSIFFLAGS read and write `req`, a valid
    // ifreq naming `lo`.
    unsafe {
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Steps 2 and 3, in the helper after `unshare`: the namespace checked,
/// its loopback up, the listeners handed over, the environment set.
pub fn arm(
    started: Started,
    policy: &NetworkPolicy,
    asks: Option<&str>,
    ledger: Option<&str>,
) -> Result<Running, LaunchError> {
    let Started {
        pid,
        channel,
        host_net,
    } = started;
    let now = super::sys::ns_inode("/proc/self/ns/net")
        .map_err(|e| refused("read /proc/self/ns/net", e))?;
    if now == host_net {
        // Never configure the network namespace we started in.
        return Err(LaunchError::Refused(
            "the network namespace did not change after unshare; refusing to configure it".into(),
        ));
    }
    loopback_up().map_err(|e| refused("bring the loopback up", e))?;
    let mut listeners = vec![std::net::TcpListener::bind(("127.0.0.1", PROXY_PORT))
        .map_err(|e| refused("listen for the proxy", e))?];
    let mut mirrors = Vec::new();
    for port in policy.mirrored_ports() {
        let l = std::net::TcpListener::bind(("127.0.0.1", port))
            .map_err(|e| refused(&format!("mirror port {port}"), e))?;
        listeners.push(l);
        mirrors.push(port);
        // Clients that try ::1 first (`localhost`) find it there too.
        if let Ok(l6) = std::net::TcpListener::bind(("::1", port)) {
            listeners.push(l6);
            mirrors.push(port);
        }
    }
    let handover = serde_json::to_vec(&Handover {
        policy: policy.clone(),
        mirrors,
        asks: asks.map(str::to_owned),
        ledger: ledger.map(str::to_owned),
    })
    .map_err(|e| refused("describe the listeners", e))?;
    let table = sealed_memfd(&handover).map_err(|e| refused("write the network table", e))?;
    // The table first, then the proxy's listener and the mirrors'.
    let fds: Vec<RawFd> = std::iter::once(table.as_raw_fd())
        .chain(listeners.iter().map(|l| l.as_raw_fd()))
        .collect();
    sendmsg::<()>(
        channel.as_raw_fd(),
        &[IoSlice::new(HANDOVER)],
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::empty(),
        None,
    )
    .map_err(|e| refused("hand the proxy its listeners", e))?;
    drop(listeners);
    drop(table);
    // Not waited for: connections queue on the listeners until the proxy
    // takes them, and a proxy that fails takes the listeners with it
    // (connections are then refused at once, never hang) and is reported
    // by the helper when it ends (`exec::wait_for_init`).
    for (k, v) in proxy_env() {
        // The helper is single-threaded: set_var is safe.
        std::env::set_var(k, v);
    }
    Ok(Running {
        _channel: channel,
        pid,
    })
}

/// The proxy's life: receives the listeners on `channel`, waits for the
/// first connection (a command that never connects costs nothing more),
/// confines itself (no file writes, no privilege) and serves until its
/// helper ends.
fn serve(channel: OwnedFd) -> Result<(), String> {
    // One byte, and the descriptors (the table's memfd and at most 201
    // listeners: 253 is what one message can carry).
    let mut buf = [0u8; 16];
    let mut space = nix::cmsg_space!([RawFd; 256]);
    let fds = {
        let mut iov = [IoSliceMut::new(&mut buf)];
        let msg = recvmsg::<()>(
            channel.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )
        .map_err(|e| format!("cannot receive the listeners: {e}"))?;
        if msg.bytes == 0 {
            // The launch ended (or armed less) before handing any over.
            return Ok(());
        }
        if msg
            .flags
            .intersects(MsgFlags::MSG_TRUNC | MsgFlags::MSG_CTRUNC)
        {
            return Err("the handover was cut short".into());
        }
        let mut fds = Vec::new();
        for c in msg.cmsgs().map_err(|e| e.to_string())? {
            if let ControlMessageOwned::ScmRights(r) = c {
                fds.extend(r);
            }
        }
        fds
    };
    // SAFETY: each descriptor arrived in this message and is owned here.
    let mut fds = fds
        .into_iter()
        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) });
    let handover = read_table(fds.next().ok_or("no network table was handed over")?)?;
    let mut listeners = fds.map(std::net::TcpListener::from);
    let proxy = listeners.next().ok_or("no listener was handed over")?;
    let mirrors: Vec<(u16, std::net::TcpListener)> =
        handover.mirrors.iter().copied().zip(listeners).collect();
    if !first_connection(&channel, &proxy, &mirrors)? {
        return Ok(());
    }
    confine_self()?;
    // As many descriptors as this user may have: each connection takes
    // two (see `proxy::connection_slots`).
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((_, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    runtime.block_on(async move {
        let to_tokio = |l: std::net::TcpListener| {
            l.set_nonblocking(true)?;
            tokio::net::TcpListener::from_std(l)
        };
        let proxy = to_tokio(proxy).map_err(|e| e.to_string())?;
        let mut served = Vec::new();
        for (port, l) in mirrors {
            served.push((port, to_tokio(l).map_err(|e| e.to_string())?));
        }
        // Served until the sandbox ends: its last copy of the channel
        // closing reads as end-of-file here.
        std::thread::spawn(move || {
            let mut b = [0u8; 1];
            loop {
                match nix::unistd::read(&channel, &mut b) {
                    Ok(n) if n > 0 => continue,
                    Err(nix::errno::Errno::EINTR) => continue,
                    _ => std::process::exit(0),
                }
            }
        });
        let judge = crate::network::proxy::Judge::new(
            handover.policy,
            handover.asks,
            handover.ledger.as_deref(),
        );
        crate::network::proxy::serve(judge, vec![proxy], served).await;
        Ok(())
    })
}

/// Waits until a connection arrives on any listener (true) or the sandbox
/// ended, its channel hung up (false). The connection waits in its
/// listener's queue meanwhile.
fn first_connection(
    channel: &OwnedFd,
    proxy: &std::net::TcpListener,
    mirrors: &[(u16, std::net::TcpListener)],
) -> Result<bool, String> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    let mut fds = vec![
        PollFd::new(channel.as_fd(), PollFlags::POLLIN),
        PollFd::new(proxy.as_fd(), PollFlags::POLLIN),
    ];
    fds.extend(
        mirrors
            .iter()
            .map(|(_, l)| PollFd::new(l.as_fd(), PollFlags::POLLIN)),
    );
    loop {
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(format!("cannot wait for connections: {e}")),
        }
        let ready = |f: &PollFd| f.revents().is_some_and(|r| !r.is_empty());
        if fds[1..].iter().any(ready) {
            return Ok(true);
        }
        if ready(&fds[0]) {
            // Only ever closed (nothing more is sent): the sandbox ended.
            return Ok(false);
        }
    }
}

/// The proxy parses what sandboxed code sends it: it keeps no privilege
/// and may write no file (it needs neither; it only connects).
fn confine_self() -> Result<(), String> {
    use landlock::{AccessFs, Ruleset, RulesetAttr, RulesetStatus, ABI};
    // A user's process holds no capability to drop (and may not touch
    // the bounding set); root's are all dropped, the securebits locked.
    if nix::unistd::getuid().is_root() {
        super::sys::drop_all_capabilities(true)
            .map_err(|e| format!("cannot drop capabilities: {e}"))?;
    }
    nix::sys::prctl::set_no_new_privs().map_err(|e| format!("no_new_privs: {e}"))?;
    // It stays dumpable: the bridge reads its /proc/PID/ns/net to tell it
    // from a process inside a sandbox (`network::asks`), which the kernel
    // refuses for a process that is not dumpable. Nothing inside can name
    // it (it is outside their PID namespace) or trace it (Landlock keeps
    // a sandboxed process from tracing one outside its domain).
    let writes = AccessFs::from_write(ABI::V5);
    let status = Ruleset::default()
        .handle_access(writes)
        .and_then(|r| r.create())
        .and_then(|r| r.restrict_self())
        .map_err(|e| format!("cannot confine the proxy with Landlock: {e}"))?;
    if status.ruleset == RulesetStatus::NotEnforced {
        tracing::debug!("Landlock is not available: the proxy runs without it");
    }
    Ok(())
}
