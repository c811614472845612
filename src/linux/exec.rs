//! Carrying out a [`Plan`]: the one setup path, in the order that makes
//! it safe. This runs in a freshly started, single-threaded process (the
//! `run` command, or the `__sandbox` helper stage the bridge re-executes),
//! never in a `pre_exec` closure and never in a process with threads
//! (unshare(CLONE_NEWUSER) refuses those).
//!
//! Order, and why:
//! 1. read the host's mount table first (which mounts were read-only for
//!    the user) and the current mount namespace;
//! 2. start the network proxy in the host's network (`net::start`), then
//!    unshare the user, mount, PID, IPC and (unless the table shares the
//!    host's network) network namespaces; a non-root user's user
//!    namespace maps the uid and gid to themselves, never to 0;
//! 3. check the mount namespace really is new before touching any mount:
//!    a mount in the host namespace would change the machine;
//! 4. the plan's mount operations, in the order the pure planner gives
//!    and explains ([`Plan::mount_ops`]), each carried out by one function
//!    (`apply`): `/` private before any other mount (or binds would
//!    propagate back to the host), everything read-only, the writable set
//!    (mounts that were read-only on the host stay so: as root, clearing
//!    those would give the agent more than the user has), the caches'
//!    copy-on-write layers, private tmpfs for /tmp and /var/tmp (writable
//!    trees inside carried over with open_tree/move_mount), pins, read-only
//!    islands, grants reopened, and last the covers over the sockets of
//!    services that would write for the caller. A failure names its
//!    [`Syscall`] and path.
//!    A command that joins its generation ([`super::join`]: an editor
//!    terminal) does steps 2-4 differently: it holds the generation's
//!    caches' slot, enters the generation's user, mount and IPC
//!    namespaces, whose mounts are already in place, then unshares a mount
//!    namespace (a copy of the generation's, for its own /proc) and a PID
//!    namespace, and checks that mount namespace is new against both the
//!    host's and the generation's before step 5 mounts;
//!    Then the network: checked to be new, its loopback up, the proxy
//!    handed its listeners (`net::arm`); a joined command uses the
//!    generation's;
//! 5. fork the PID namespace's init: it mounts a fresh read-only /proc,
//!    drops every capability (keeping CAP_SYS_ADMIN would let the agent
//!    clear read-only with mount_setattr), sets no_new_privs, enforces
//!    Landlock (it refuses mounts afterwards), then, where the plan has
//!    name-prefix grants, installs the supervisor's seccomp filter and hands
//!    the helper its listener (the helper opened its handles on the host's
//!    mounts before step 2; see `supervise`), and forks the command;
//! 6. the command: new session (an inherited tty allowed TIOCSTI input
//!    injection into the user's shell), inherited fds above stderr closed,
//!    the requested environment applied, exec.

use std::collections::BTreeSet;
use std::ffi::CString;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use landlock::{
    Access, AccessFs, BitFlags, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};
use nix::errno::Errno;
use nix::mount::{mount, MsFlags};
use nix::sched::{unshare, CloneFlags};
use nix::sys::signal::{kill, SigSet, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{fork, ForkResult, Pid};
use serde::{Deserialize, Serialize};

use super::plan::{MountOp, Plan};
use super::sys;

/// How much of the sandbox this machine lets us arm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Level {
    /// Namespaces and Landlock: everything in the plan.
    Full,
    /// No Landlock: read-only mounts only, so device nodes stay writable.
    MountsOnly,
    /// No namespaces (a non-root user without user namespaces, or root
    /// without CAP_SYS_ADMIN): Landlock only, so protected paths and islands
    /// inside the workspace are not enforced by the kernel (the approval
    /// ledger is what protects sandbox.json), and there is no PID namespace.
    LandlockOnly,
}

impl Level {
    /// What confines a command armed at this level, as `run_code` names it.
    pub fn confined_by(self) -> &'static str {
        match self {
            Level::Full => "linux namespaces+landlock",
            Level::MountsOnly => "linux namespaces (no landlock)",
            Level::LandlockOnly => "linux landlock",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Level::Full => "full (namespaces+Landlock)",
            Level::MountsOnly => "mounts-only (no Landlock: device nodes stay writable; install a kernel with Landlock, 5.13 or later, for the full sandbox)",
            Level::LandlockOnly => {
                "landlock-only (no namespaces: the Unix sockets of your session (D-Bus, ssh-agent, docker, tmux, X11) are NOT closed, so the agent can ask a service to run what it likes; /tmp and your caches are shared with it; protected paths and islands inside the workspace are not enforced by the kernel; there is no PID namespace. Allow unprivileged user namespaces (on Ubuntu: sysctl kernel.apparmor_restrict_unprivileged_userns=0; in a container: a seccomp profile that permits them) for the full sandbox)"
            }
        }
    }
}

/// Set in every confined command's environment: what confines it.
pub use crate::run_code::confinement::CONFINED_ENV;

/// This machine gives neither namespaces nor Landlock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "neither namespaces nor Landlock are available here, so the sandbox cannot be armed; \
     run the agent unconfined on purpose with --no-sandbox (or without zcode-acp)"
)]
pub struct NothingToArm;

/// The level for what the machine allows, or why nothing can be armed.
pub fn choose_level(namespaces: bool, landlock: bool) -> Result<Level, NothingToArm> {
    match (namespaces, landlock) {
        (true, true) => Ok(Level::Full),
        (true, false) => Ok(Level::MountsOnly),
        (false, true) => Ok(Level::LandlockOnly),
        (false, false) => Err(NothingToArm),
    }
}

/// Which namespaces this process could create: those the plan needs,
/// and with them a network namespace of the sandbox's own (probed in one
/// short-lived child, so nothing here changes; a machine that refuses only
/// the network keeps the rest of the sandbox, and says the network is not
/// confined).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Available {
    pub namespaces: bool,
    pub network: bool,
}

pub fn namespaces_available() -> Available {
    // SAFETY: the child only calls unshare and _exit.
    match unsafe { fork() } {
        Ok(ForkResult::Child) => {
            let code = if unshare(NAMESPACES | CloneFlags::CLONE_NEWNET).is_ok() {
                0
            } else if unshare(NAMESPACES).is_ok() {
                2
            } else {
                1
            };
            // SAFETY: leaves the child at once, without running destructors.
            unsafe { libc::_exit(code) }
        }
        Ok(ForkResult::Parent { child }) => match waitpid(child, None) {
            Ok(WaitStatus::Exited(_, 0)) => Available {
                namespaces: true,
                network: true,
            },
            Ok(WaitStatus::Exited(_, 2)) => Available {
                namespaces: true,
                network: false,
            },
            _ => Available {
                namespaces: false,
                network: false,
            },
        },
        Err(_) => Available {
            namespaces: false,
            network: false,
        },
    }
}

/// A file with other hard links inside an island could be changed through
/// one of them: refuse to arm, and say which file.
fn check_island_links(plan: &Plan) -> Result<(), LaunchError> {
    use std::os::unix::fs::MetadataExt;
    for step in plan
        .readonly
        .iter()
        .filter(|s| s.path.ends_with(".zcode/acp"))
    {
        let mut stack = vec![step.path.clone()];
        while let Some(dir) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in entries.flatten() {
                let Ok(meta) = e.path().symlink_metadata() else {
                    continue;
                };
                if meta.is_dir() {
                    stack.push(e.path());
                } else if meta.is_file() && meta.nlink() > 1 {
                    return Err(LaunchError::Refused(format!(
                        "{} has {} hard links: another link could change it from outside the sandbox; remove the extra links and try again",
                        e.path().display(),
                        meta.nlink()
                    )));
                }
            }
        }
    }
    Ok(())
}

/// The namespaces every sandbox gets: mounts, PIDs, System V IPC and POSIX
/// message queues (an outside process's shared memory would otherwise be
/// writable, and its queues removable), and a user namespace, root
/// included (its keyrings are then its own, and no capability it keeps
/// reaches the host's namespaces).
const NAMESPACES: CloneFlags = CloneFlags::CLONE_NEWNS
    .union(CloneFlags::CLONE_NEWPID)
    .union(CloneFlags::CLONE_NEWIPC)
    .union(CloneFlags::CLONE_NEWUSER);

/// The user namespace's maps: you stay who you are. A non-root user maps
/// only their own ids (never to 0).
fn own_id_map(id: u32) -> String {
    format!("{id} {id} 1")
}

/// Root maps every id that exists where it runs onto itself, so files of
/// other owners keep their owners (git's ownership checks still work)
/// rather than showing as nobody. `current` is this namespace's own map
/// (`/proc/self/uid_map`): on the host one line for the whole range, in a
/// container (rootless podman, unprivileged LXC) the ranges it was given,
/// which is all a child namespace may map.
fn identity_map(current: &str) -> Option<String> {
    let mut out = String::new();
    for line in current.lines().filter(|l| !l.trim().is_empty()) {
        let mut fields = line.split_whitespace().map(str::parse::<u64>);
        let (Some(Ok(inside)), Some(Ok(_outside)), Some(Ok(count))) =
            (fields.next(), fields.next(), fields.next())
        else {
            return None;
        };
        out.push_str(&format!("{inside} {inside} {count}\n"));
    }
    (!out.is_empty()).then_some(out)
}

/// A child forked before the helper enters its user namespace, which
/// writes the helper's full-range maps once told to (a process inside the
/// new namespace has no privilege over the parent to write them itself).
struct Mapper {
    pid: Pid,
    go: std::os::fd::OwnedFd,
    done: std::os::fd::OwnedFd,
}

impl Mapper {
    fn fork() -> Result<Mapper, LaunchError> {
        let maps = |file: &str| {
            std::fs::read_to_string(file)
                .ok()
                .and_then(|m| identity_map(&m))
                .ok_or_else(|| {
                    LaunchError::Refused(format!(
                        "cannot read {file}, which root's user namespace map is made from"
                    ))
                })
        };
        let (uid_map, gid_map) = (maps("/proc/self/uid_map")?, maps("/proc/self/gid_map")?);
        let (go_r, go_w) = sys(Syscall::Pipe, nix::unistd::pipe())?;
        let (done_r, done_w) = sys(Syscall::Pipe, nix::unistd::pipe())?;
        let parent = nix::unistd::getpid();
        // SAFETY: the helper is single-threaded (documented precondition of
        // `run`), so the child may allocate; it leaves with _exit.
        match sys(Syscall::ForkMapper, unsafe { fork() })? {
            ForkResult::Child => {
                drop((go_w, done_r));
                let mut byte = [0u8; 1];
                let ok = nix::unistd::read(&go_r, &mut byte) == Ok(1)
                    && std::fs::write(format!("/proc/{parent}/uid_map"), &uid_map).is_ok()
                    && std::fs::write(format!("/proc/{parent}/gid_map"), &gid_map).is_ok();
                let _ = nix::unistd::write(&done_w, if ok { b"1" } else { b"0" });
                // SAFETY: leaves the child at once, without running destructors.
                unsafe { libc::_exit(0) }
            }
            ForkResult::Parent { child } => Ok(Mapper {
                pid: child,
                go: go_w,
                done: done_r,
            }),
        }
    }

    /// Asks the mapper to write the maps of this (already unshared)
    /// process, and waits for it.
    fn map_parent(self) -> Result<(), LaunchError> {
        let _ = nix::unistd::write(&self.go, b"1");
        let mut byte = [0u8; 1];
        let ok = nix::unistd::read(&self.done, &mut byte) == Ok(1) && byte[0] == b'1';
        if ok {
            Ok(())
        } else {
            Err(LaunchError::Refused(
                "cannot map root's user namespace (the id mapper failed)".into(),
            ))
        }
    }
}

impl Drop for Mapper {
    fn drop(&mut self) {
        // Unblocks a mapper never told to go (its pipe closes), then reaps it.
        let _ = kill(self.pid, Signal::SIGKILL);
        let _ = waitpid(self.pid, None);
    }
}

/// Everything the helper needs: the plan and the command.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LaunchSpec {
    pub plan: Plan,
    pub argv: Vec<String>,
    /// Applied after the sandbox is armed (so nothing the caller sets can
    /// run code in the helper itself).
    #[serde(default)]
    pub env: Vec<(String, String)>,
    #[serde(default)]
    pub cwd: Option<PathBuf>,
    /// The policy, when the plan has supervised directories: the
    /// supervisor decides each name with it.
    #[serde(default)]
    pub policy: Option<crate::policy::Policy>,
    /// The level the caller decided and announced, and the Landlock ABI it
    /// probed: the helper arms exactly that, or refuses. `None` (`zcode-acp
    /// run`, where the helper is the caller): the helper decides itself.
    #[serde(default)]
    pub level: Option<Level>,
    #[serde(default)]
    pub landlock_abi: Option<i32>,
    /// The command gets `env` alone, not the helper's environment with
    /// `env` on top (`run_code`: an allowlist, never inherited).
    #[serde(default)]
    pub clear_env: bool,
    /// A generation's namespaces to enter instead of building new ones
    /// (an editor terminal of an armed bridge; see [`super::join`]).
    #[serde(default)]
    pub join: Option<super::join::Join>,
    /// The network table, when the sandbox gets a network of its own
    /// (see [`super::net`]); `None`: the host's network, as it is.
    #[serde(default)]
    pub network: Option<crate::policy::network::NetworkPolicy>,
    /// Where the proxy asks about the connections the table refuses (the
    /// bridge's abstract socket, see `network::asks`); none: refusals are
    /// final.
    #[serde(default)]
    pub network_asks: Option<String>,
    /// Where the helper says what it could not set up as planned (a
    /// file in the arming's private directory, which the bridge reads into
    /// the editor's notice); none: stderr only (`zcode-acp run`).
    #[serde(default)]
    pub report: Option<PathBuf>,
}

impl LaunchSpec {
    /// The launch of `argv` under `plan`, carrying `policy` where the
    /// supervisor needs it.
    pub fn new(
        plan: Plan,
        policy: &crate::policy::Policy,
        argv: Vec<String>,
        env: Vec<(String, String)>,
        cwd: Option<PathBuf>,
    ) -> LaunchSpec {
        let policy = (!plan.supervised.is_empty()).then(|| policy.clone());
        LaunchSpec {
            plan,
            argv,
            env,
            cwd,
            policy,
            level: None,
            landlock_abi: None,
            clear_env: false,
            join: None,
            network: None,
            network_asks: None,
            report: None,
        }
    }

    /// A network of its own under `table` where `own` (the table does not
    /// share the host's, and the machine allows it).
    pub fn with_network(
        mut self,
        table: &crate::policy::network::NetworkPolicy,
        own: bool,
    ) -> LaunchSpec {
        self.network = own.then(|| table.clone());
        self
    }

    /// The level decided (and announced) by the caller, with the Landlock
    /// ABI it probed: the helper arms exactly that, or refuses.
    pub fn armed_at(mut self, level: Level, landlock_abi: i32) -> LaunchSpec {
        self.level = Some(level);
        self.landlock_abi = Some(landlock_abi);
        self
    }
}

/// The system call of the launch that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Syscall {
    Pipe,
    ForkMapper,
    ReadNamespace,
    Unshare,
    MakePrivate,
    Bind,
    SetAttr,
    OpenTree,
    MoveMount,
    Tmpfs,
    Cover,
    SocketPair,
    Subreaper,
    ForkInit,
    BlockSignals,
    DropCapabilities,
    Signalfd,
    Poll,
    WaitForInit,
    Setns,
}

impl std::fmt::Display for Syscall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Syscall::Pipe => "pipe",
            Syscall::ForkMapper => "fork the id mapper",
            Syscall::ReadNamespace => "read /proc/self/ns/mnt",
            Syscall::Unshare => "unshare",
            Syscall::MakePrivate => "make / private",
            Syscall::Bind => "bind",
            Syscall::SetAttr => "mount_setattr",
            Syscall::OpenTree => "open_tree",
            Syscall::MoveMount => "move_mount",
            Syscall::Tmpfs => "tmpfs on",
            Syscall::Cover => "cover",
            Syscall::SocketPair => "socketpair for the supervisor",
            Syscall::Subreaper => "become the reaper of what the command leaves",
            Syscall::ForkInit => "fork the namespace's init",
            Syscall::BlockSignals => "block signals",
            Syscall::DropCapabilities => "drop the helper's capabilities",
            Syscall::Signalfd => "signalfd",
            Syscall::Poll => "poll",
            Syscall::WaitForInit => "wait for init",
            Syscall::Setns => "setns into the generation's namespaces",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("{step}{}: {errno}", on(.path))]
    Sys {
        step: Syscall,
        path: Option<PathBuf>,
        errno: Errno,
    },
    #[error("{0}")]
    Refused(String),
}

fn on(path: &Option<PathBuf>) -> String {
    path.as_ref()
        .map(|p| format!(" {}", p.display()))
        .unwrap_or_default()
}

fn sys<T>(step: Syscall, r: Result<T, Errno>) -> Result<T, LaunchError> {
    r.map_err(|errno| LaunchError::Sys {
        step,
        path: None,
        errno,
    })
}

/// As [`sys`], for a call on `path`.
fn sys_at<T>(step: Syscall, path: &Path, r: Result<T, Errno>) -> Result<T, LaunchError> {
    r.map_err(|errno| LaunchError::Sys {
        step,
        path: Some(path.to_path_buf()),
        errno,
    })
}

/// Mountpoints that are read-only in the current mount table.
fn readonly_mounts() -> BTreeSet<PathBuf> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    table
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let (point, opts) = (f.get(4)?, f.get(5)?);
            opts.split(',')
                .any(|o| o == "ro")
                .then(|| PathBuf::from(unescape(point)))
        })
        .collect()
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn bind(path: &Path) -> Result<(), LaunchError> {
    sys_at(
        Syscall::Bind,
        path,
        mount(
            Some(path),
            path,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None::<&str>,
        ),
    )
}

fn setattr(path: &Path, recursive: bool, set: u64, clear: u64) -> Result<(), LaunchError> {
    sys_at(
        Syscall::SetAttr,
        path,
        sys::mount_setattr(path, recursive, set, clear),
    )
}

/// Paths the command needs to see that a private tmpfs would hide: its own
/// executable, files named on its command line, and its working directory,
/// when they live in the host's /tmp. They are carried over read-only. A
/// file inside a `node_modules` tree brings the whole tree (the outermost
/// `node_modules`): an npm agent's script imports its packages from there,
/// and its launcher runs a native binary from a sibling package.
fn needed_visible(spec: &LaunchSpec) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let exe = &spec.argv[0];
    let exe_path = if exe.contains('/') {
        spec.cwd
            .as_ref()
            .map(|c| c.join(exe))
            .unwrap_or_else(|| PathBuf::from(exe))
    } else {
        let path = std::env::var_os("PATH").unwrap_or_default();
        match std::env::split_paths(&path)
            .map(|d| d.join(exe))
            .find(|p| p.is_file())
        {
            Some(p) => p,
            None => return out,
        }
    };
    out.push(exe_path);
    out.extend(spec.cwd.clone());
    // Scripts and files named on the command line (`python3 /tmp/x/agent.py`).
    out.extend(
        spec.argv[1..]
            .iter()
            .map(PathBuf::from)
            .filter(|p| p.is_absolute() && p.is_file()),
    );
    let out = out
        .into_iter()
        .filter_map(|p| std::fs::canonicalize(p).ok())
        .map(|p| outermost_node_modules(&p).unwrap_or(p))
        .filter(|p| {
            spec.plan
                .tmpfs
                .iter()
                .any(|t| p.starts_with(&t.path) && *p != t.path)
                && !spec.plan.writable.iter().any(|w| p.starts_with(&w.path))
        })
        .collect::<Vec<_>>();
    // A file inside a directory that is carried anyway needs nothing more.
    let mut kept: Vec<PathBuf> = Vec::new();
    let mut by_depth = out;
    by_depth.sort_by_key(|p| p.components().count());
    for p in by_depth {
        if !kept.iter().any(|k| p.starts_with(k)) {
            kept.push(p);
        }
    }
    kept
}

/// The outermost `node_modules` directory `p` lies in, if any.
fn outermost_node_modules(p: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in p.components() {
        out.push(c);
        if c.as_os_str() == "node_modules" {
            return Some(out);
        }
    }
    None
}

/// Steps 2-4: namespaces, then the plan's mount operations in the order
/// the planner gave them. Runs in the helper process.
fn arm_mounts(
    plan: &Plan,
    visible: &[PathBuf],
    layer: Option<&super::layers::Slot>,
    own_network: bool,
) -> Result<(), LaunchError> {
    let uid = nix::unistd::getuid();
    let gid = nix::unistd::getgid();
    let host_readonly = readonly_mounts();
    let host_ns = sys(Syscall::ReadNamespace, sys::ns_inode("/proc/self/ns/mnt"))?;

    let is_root = uid.is_root();
    // Root's full-range map must be written by a process that keeps its
    // privilege in the parent namespace: a helper of ours, forked now.
    let mapper = if is_root { Some(Mapper::fork()?) } else { None };
    if own_network {
        // Probed when the sandbox was announced: failing now (too many
        // network namespaces) refuses, never arms less than announced.
        unshare(NAMESPACES | CloneFlags::CLONE_NEWNET).map_err(|e| {
            LaunchError::Refused(format!(
                "cannot create the sandbox's namespaces, its network namespace included ({e}); `zcode-acp doctor` says what this machine allows"
            ))
        })?;
    } else {
        sys(Syscall::Unshare, unshare(NAMESPACES))?;
    }
    match mapper {
        Some(m) => m.map_parent()?,
        None => {
            // Unprivileged: only its own ids, and setgroups denied first
            // (the kernel requires it before a gid map).
            std::fs::write("/proc/self/setgroups", "deny")
                .and_then(|_| std::fs::write("/proc/self/uid_map", own_id_map(uid.as_raw())))
                .and_then(|_| std::fs::write("/proc/self/gid_map", own_id_map(gid.as_raw())))
                .map_err(|e| LaunchError::Refused(format!("cannot map the user namespace: {e}")))?;
        }
    }
    let ns = sys(Syscall::ReadNamespace, sys::ns_inode("/proc/self/ns/mnt"))?;
    if ns == host_ns {
        // Never mount in the namespace we started in.
        return Err(LaunchError::Refused(
            "the mount namespace did not change after unshare; refusing to mount anything".into(),
        ));
    }
    let at = MountContext {
        plan,
        host_readonly,
        visible,
        layer,
    };
    for op in plan.mount_ops() {
        apply(op, &at)?;
    }
    Ok(())
}

/// Steps 2-4 for a command joining its generation: the generation's
/// user, mount and IPC namespaces entered (its mounts are already in
/// place), then a mount namespace copied from the generation's (the init
/// mounts a /proc there for the command's PID namespace, which must not
/// reach the agent's) and a PID namespace of the command's own. `None`
/// when the first step was refused and so nothing changed: the caller
/// arms afresh. Otherwise whether the generation has a /proc of its own
/// (where the kernel refused it one, in a container that masks parts of
/// /proc, it kept the host's, and so does the command).
fn enter_generation(opened: super::join::Opened) -> Result<Option<bool>, LaunchError> {
    // The host's /proc, held open: once inside, `/proc` is the
    // generation's, where this process has no pid and `/proc/self` is
    // nothing.
    let host_proc = std::fs::File::open("/proc")
        .map_err(|e| LaunchError::Refused(format!("cannot open /proc: {e}")))?;
    let mount_ns = || {
        sys(
            Syscall::ReadNamespace,
            nix::sys::stat::fstatat(&host_proc, "self/ns/mnt", nix::fcntl::AtFlags::empty())
                .map(|st| st.st_ino),
        )
    };
    let host_ns = mount_ns()?;
    match opened.enter() {
        Ok(()) => {}
        Err(e) if !e.changed => {
            tracing::debug!(
                "cannot enter the generation's {} namespace ({}): arming afresh",
                e.kind,
                e.errno
            );
            return Ok(None);
        }
        Err(e) => {
            return Err(LaunchError::Sys {
                step: Syscall::Setns,
                path: Some(PathBuf::from(e.kind)),
                errno: e.errno,
            })
        }
    }
    let generation_ns = mount_ns()?;
    use std::os::unix::fs::MetadataExt;
    let host_proc_dev = host_proc.metadata().map(|m| m.dev()).ok();
    let own_proc = std::fs::metadata("/proc").map(|m| m.dev()).ok() != host_proc_dev;
    // Not `Syscall::Unshare`: that failure would read as "no namespaces
    // here", and the namespaces were already changed.
    unshare(CloneFlags::CLONE_NEWNS | CloneFlags::CLONE_NEWPID).map_err(|e| {
        LaunchError::Refused(format!(
            "cannot make the command's own namespaces inside the generation's: {e}"
        ))
    })?;
    let ns = mount_ns()?;
    if ns == host_ns || ns == generation_ns {
        // The init's /proc must land in a namespace of this command alone.
        return Err(LaunchError::Refused(
            "the mount namespace did not change after unshare; refusing to mount anything".into(),
        ));
    }
    Ok(Some(own_proc))
}

/// What carrying out a mount operation needs beyond the operation.
struct MountContext<'a> {
    plan: &'a Plan,
    /// Mountpoints read-only on the host: they stay so inside writable
    /// binds (as root, clearing those would give the agent more than the
    /// user has).
    host_readonly: BTreeSet<PathBuf>,
    /// What the command must see beneath a private tmpfs.
    visible: &'a [PathBuf],
    /// The copy-on-write slot this launch holds, if it took one.
    layer: Option<&'a super::layers::Slot>,
}

/// Carries out one mount operation. Every mount the launch makes before
/// the namespace's init (which mounts its own /proc) goes through here.
fn apply(op: MountOp<'_>, at: &MountContext<'_>) -> Result<(), LaunchError> {
    let root = Path::new("/");
    match op {
        MountOp::PrivateRoot => sys(
            Syscall::MakePrivate,
            mount(
                None::<&str>,
                root,
                None::<&str>,
                MsFlags::MS_REC | MsFlags::MS_PRIVATE,
                None::<&str>,
            ),
        ),
        MountOp::ReadOnlyRoot => setattr(root, true, sys::MOUNT_ATTR_RDONLY, 0),
        MountOp::Writable(path) => {
            bind(path)?;
            // Writable, and nosuid: nothing there runs with its owner's
            // rights inside the sandbox (the seccomp filter keeps setuid
            // bits off disk).
            setattr(path, true, sys::MOUNT_ATTR_NOSUID, sys::MOUNT_ATTR_RDONLY)?;
            for ro in at.host_readonly.iter().filter(|m| m.starts_with(path)) {
                setattr(ro, false, sys::MOUNT_ATTR_RDONLY, 0)?;
            }
            Ok(())
        }
        // The slot is bound writable first (overlayfs keeps a private clone
        // of the upper mount, so the read-only bind of the managed root
        // later leaves it as it is).
        MountOp::LayerSlot => match at.layer {
            Some(slot) => {
                bind(&slot.dir)?;
                setattr(
                    &slot.dir,
                    true,
                    sys::MOUNT_ATTR_NOSUID,
                    sys::MOUNT_ATTR_RDONLY,
                )
            }
            None => Ok(()),
        },
        MountOp::Layer(path) => match at.layer {
            Some(slot) => overlay(path, slot),
            None => Ok(()),
        },
        MountOp::PrivateTmp(path) => private_tmp(path, at),
        MountOp::Pin(path) => bind(path),
        MountOp::PinLink(path) => {
            let link = sys_at(Syscall::OpenTree, path, sys::open_tree_link(path))?;
            sys_at(Syscall::MoveMount, path, sys::move_mount_to(&link, path))
        }
        MountOp::ReadOnly(path) => {
            bind(path)?;
            setattr(path, true, sys::MOUNT_ATTR_RDONLY, 0)
        }
        MountOp::Reopen(path) => {
            bind(path)?;
            setattr(path, true, 0, sys::MOUNT_ATTR_RDONLY)
        }
        MountOp::Hide(path) => hide(path, at.plan),
    }
}

/// A shared cache, copy-on-write: the user's cache (read-only by now) is
/// the lower layer, the slot this launch holds the upper; `userxattr`
/// because this is a user namespace. Where overlayfs cannot be mounted
/// (a filesystem without user xattrs, an old kernel, a path overlayfs's
/// options cannot name: `,` `:` `\\`), the cache is the slot's own
/// directory instead: private and empty, so builds fetch again, and
/// nothing the agent writes there reaches yours. Said as a degradation.
fn overlay(path: &Path, slot: &super::layers::Slot) -> Result<(), LaunchError> {
    let (upper, work) = slot.layer_for(path);
    let nameable = [path, upper.as_path(), work.as_path()].iter().all(|p| {
        p.to_str()
            .is_some_and(|s| !s.contains([',', ':', '\\', '\n']))
    });
    let mounted = if nameable {
        let options = format!(
            "lowerdir={},upperdir={},workdir={},userxattr",
            path.display(),
            upper.display(),
            work.display()
        );
        mount(
            Some("overlay"),
            path,
            Some("overlay"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some(options.as_str()),
        )
        .map_err(|e| e.to_string())
    } else {
        Err("its path holds a character overlayfs's options cannot name".to_owned())
    };
    if let Err(e) = mounted {
        degraded(&format!(
                "the cache {} has no copy-on-write layer ({e}): the agent gets a private, empty one instead (builds fetch again; nothing it writes there reaches your own)",
                path.display()
            ));
        // The slot's own directory stands for the cache.
        let private: &Path = &upper;
        let opened = sys::open_tree_clone(private).map_err(|errno| LaunchError::Sys {
            step: Syscall::OpenTree,
            path: Some(private.to_path_buf()),
            errno,
        })?;
        sys::move_mount_to(&opened, path).map_err(|errno| LaunchError::Sys {
            step: Syscall::MoveMount,
            path: Some(path.to_path_buf()),
            errno,
        })?;
        setattr(path, true, sys::MOUNT_ATTR_NOSUID, sys::MOUNT_ATTR_RDONLY)?;
    }
    Ok(())
}

/// A fresh tmpfs over `path`, with the writable trees beneath it carried
/// over as they are, and what the command must see there, read-only.
fn private_tmp(path: &Path, at: &MountContext<'_>) -> Result<(), LaunchError> {
    let mut carried = Vec::new();
    for w in at
        .plan
        .writable
        .iter()
        .filter(|w| w.path.starts_with(path) && w.path != path)
    {
        let tree = sys_at(Syscall::OpenTree, &w.path, sys::open_tree_clone(&w.path))?;
        carried.push((w.path.clone(), tree));
    }
    let mut shown = Vec::new();
    for v in at.visible.iter().filter(|v| v.starts_with(path)) {
        let tree = sys_at(Syscall::OpenTree, v, sys::open_tree_clone(v))?;
        shown.push((v.clone(), v.is_dir(), tree));
    }
    sys_at(
        Syscall::Tmpfs,
        path,
        mount(
            Some("tmpfs"),
            path,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some("mode=1777"),
        ),
    )?;
    for (tree_path, tree) in carried {
        std::fs::create_dir_all(&tree_path).map_err(|e| {
            LaunchError::Refused(format!("cannot recreate {}: {e}", tree_path.display()))
        })?;
        sys_at(
            Syscall::MoveMount,
            &tree_path,
            sys::move_mount_to(&tree, &tree_path),
        )?;
    }
    for (shown_path, is_dir, tree) in shown {
        let made = if is_dir {
            std::fs::create_dir_all(&shown_path)
        } else {
            shown_path
                .parent()
                .map_or(Ok(()), std::fs::create_dir_all)
                .and_then(|_| std::fs::File::create(&shown_path).map(drop))
        };
        made.map_err(|e| {
            LaunchError::Refused(format!("cannot show {}: {e}", shown_path.display()))
        })?;
        sys_at(
            Syscall::MoveMount,
            &shown_path,
            sys::move_mount_to(&tree, &shown_path),
        )?;
        setattr(&shown_path, true, sys::MOUNT_ATTR_RDONLY, 0)?;
    }
    Ok(())
}

/// Covers `path`: a directory by an empty, inaccessible tmpfs, anything
/// else by /dev/null, read-only.
fn hide(path: &Path, plan: &Plan) -> Result<(), LaunchError> {
    let meta = std::fs::symlink_metadata(path);
    if meta.is_err() && plan.tmpfs.iter().any(|t| path.starts_with(&t.path)) {
        // Under a private tmpfs and not carried over: out of reach.
        return Ok(());
    }
    // Gone since the plan was made (a socket listed in /proc/net/unix then
    // unlinked, as a run's tools socket is when its run ends): nothing is
    // left to reach by that path, and what is bound there from now on is
    // bound after the arming, like any other later socket.
    let gone = |e: &std::io::Error| e.kind() == std::io::ErrorKind::NotFound;
    if meta.as_ref().is_err_and(gone) {
        return Ok(());
    }
    if meta.is_ok_and(|m| m.is_dir()) {
        return sys_at(
            Syscall::Cover,
            path,
            mount(
                Some("tmpfs"),
                path,
                Some("tmpfs"),
                MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
                Some("size=4k,mode=000"),
            ),
        );
    }
    let covered = mount(
        Some("/dev/null"),
        path,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    );
    if covered == Err(nix::errno::Errno::ENOENT)
        && std::fs::symlink_metadata(path).is_err_and(|e| gone(&e))
    {
        return Ok(());
    }
    sys_at(Syscall::Cover, path, covered)?;
    setattr(path, false, sys::MOUNT_ATTR_RDONLY, 0)
}

/// Landlock: write rights only beneath the writable set and on the needed
/// devices; signals and abstract sockets scoped to the sandbox.
fn enforce_landlock(plan: &Plan, abi: i32) -> Result<String, LaunchError> {
    let abi = ABI::from(abi);
    if abi == ABI::Unsupported {
        return Err(LaunchError::Refused(
            "Landlock is not available in this kernel".into(),
        ));
    }
    let write = AccessFs::from_write(abi);
    let file_rights: BitFlags<AccessFs> = write & AccessFs::from_file(abi);
    let err = |e: landlock::RulesetError| LaunchError::Refused(format!("Landlock: {e}"));
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(write)
        .map_err(err)?;
    if Scope::from_all(abi) != BitFlags::EMPTY {
        ruleset = ruleset.scope(Scope::from_all(abi)).map_err(err)?;
    }
    let mut created = ruleset.create().map_err(err)?;
    for dir in &plan.landlock_dirs {
        if let Ok(fd) = PathFd::new(dir) {
            created = created.add_rule(PathBeneath::new(fd, write)).map_err(err)?;
        }
    }
    for file in &plan.landlock_files {
        if let Ok(fd) = PathFd::new(file) {
            created = created
                .add_rule(PathBeneath::new(fd, file_rights))
                .map_err(err)?;
        }
    }
    let status = created.restrict_self().map_err(err)?;
    match status.ruleset {
        RulesetStatus::FullyEnforced => Ok(format!("Landlock ABI {}", abi as i32)),
        RulesetStatus::PartiallyEnforced => {
            Ok(format!("Landlock ABI {} (partially enforced)", abi as i32))
        }
        RulesetStatus::NotEnforced => Err(LaunchError::Refused("Landlock was not enforced".into())),
    }
}

/// Where this launch says what it set up less than planned: opened at
/// the start (the arming's directory is read-only once the mounts are in
/// place), and inherited by the forks that confine the command.
static REPORT: std::sync::Mutex<Option<std::fs::File>> = std::sync::Mutex::new(None);

fn open_report(path: Option<&Path>) {
    use std::os::unix::fs::OpenOptionsExt;
    let opened = path.and_then(|p| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
            .open(p)
            .ok()
    });
    if let Ok(mut r) = REPORT.lock() {
        *r = opened;
    }
}

/// A layer set up less than planned (stricter, never wider): said in the
/// log at WARN, and written to the launch's report for the bridge, which
/// names it in the editor's notice.
pub(crate) fn degraded(what: &str) {
    tracing::warn!("{what}");
    if let Ok(mut r) = REPORT.lock() {
        if let Some(f) = r.as_mut() {
            use std::io::Write;
            let _ = f.write_all(format!("{}\n", what.replace('\n', " ")).as_bytes());
        }
    }
}

fn die(what: &str, e: impl std::fmt::Display) -> ! {
    eprintln!("zcode-acp sandbox: {what}: {e}");
    std::process::exit(126);
}

/// The number of threads of this process.
pub(crate) fn threads() -> Option<u32> {
    std::fs::read_to_string("/proc/self/status")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Arms the sandbox and runs the command; returns the exit code to use.
/// Must be called from a single-threaded process.
pub fn run(spec: &LaunchSpec) -> Result<i32, LaunchError> {
    if spec.argv.is_empty() {
        return Err(LaunchError::Refused("no command to run".into()));
    }
    // A user namespace cannot be entered by a process with threads (the
    // kernel says EINVAL), which must never read as "no namespaces here"
    // and quietly arm less.
    if threads() != Some(1) {
        return Err(LaunchError::Refused(
            "the launcher has more than one thread, so it cannot set the sandbox up (a bug in zcode-acp: please report it)".into(),
        ));
    }
    // The working directory is re-entered by path once the mounts are in
    // place: the old handle still points into the read-only tree beneath.
    let mut spec = spec.clone();
    if spec.cwd.is_none() {
        spec.cwd = std::env::current_dir().ok();
    }
    // Probed here when the caller did not; every later step reads it.
    let abi = *spec.landlock_abi.get_or_insert_with(sys::landlock_abi);
    let spec = &spec;
    check_island_links(&spec.plan)?;
    let landlock = abi >= 1 && spec.level != Some(Level::MountsOnly);
    let visible = needed_visible(spec);
    open_report(spec.report.as_deref());
    // The supervisor's handles on the host's mounts must be opened before
    // the mount namespace changes (see `supervise`).
    let mut supervisor = prepare_supervisor(spec);
    // The test knob stands for a helper that finds less than the caller
    // probed (a policy changed in between): it only ever takes away.
    let lost_namespaces = std::env::var_os("ZCODE_ACP_TEST_HELPER_NO_NAMESPACES").is_some();
    // The generation's namespaces, when the spec names them, they are
    // still its, and its view holds what the command needs to see;
    // otherwise a set of our own, as for any other launch. Its caches'
    // slot is held for as long as this runs (see `layers`), taken before
    // the generation is checked.
    let (joined, own_proc, _slot_held) = match &spec.join {
        Some(join) if spec.level != Some(Level::LandlockOnly) && !lost_namespaces => {
            let held = match &join.slot {
                Some(lock) => super::layers::Joined::hold(lock).map(Some),
                None => Ok(None),
            };
            match (held, join.open()) {
                (Ok(held), Ok(opened)) if opened.sees(&visible) => {
                    match enter_generation(opened)? {
                        Some(own_proc) => (true, own_proc, held),
                        None => (false, false, None),
                    }
                }
                (Ok(_), Ok(_)) => {
                    tracing::debug!(
                        "the generation's view lacks what this command needs: arming afresh"
                    );
                    (false, false, None)
                }
                (Err(why), _) => {
                    tracing::debug!("cannot hold the generation's caches ({why}): arming afresh");
                    (false, false, None)
                }
                (_, Err(why)) => {
                    tracing::debug!(
                        "not joining the generation's namespaces ({why}): arming afresh"
                    );
                    (false, false, None)
                }
            }
        }
        _ => (false, false, None),
    };
    // The sandbox's network (see `net`): started before the namespaces,
    // armed once they exist.
    let mut network: Option<super::net::Started> = None;
    // A copy-on-write layer for the shared caches: the first slot of this
    // project no other sandbox holds, taken (and its directories made)
    // before the namespaces, as you. A joined generation has its own.
    let layer = match &spec.plan.layers {
        Some(base) if !spec.plan.layered.is_empty() && !joined => Some(
            super::layers::Slot::take(base, &spec.plan.layered).map_err(|e| {
                LaunchError::Refused(format!("cannot prepare the caches' layer: {e}"))
            })?,
        ),
        _ => None,
    };
    let mounts = if spec.level == Some(Level::LandlockOnly) {
        Err(LaunchError::Refused("no namespaces at this level".into()))
    } else if lost_namespaces {
        Err(LaunchError::Sys {
            step: Syscall::Unshare,
            path: None,
            errno: Errno::EPERM,
        })
    } else if joined {
        Ok(())
    } else {
        // The proxy starts in the host's network, before the namespaces.
        if spec.network.is_some() {
            network = Some(super::net::start()?);
        }
        arm_mounts(&spec.plan, &visible, layer.as_ref(), network.is_some())
    };
    let namespaces = match mounts {
        Ok(()) => true,
        Err(_) if spec.level == Some(Level::LandlockOnly) => false,
        // Nothing was changed yet: decide on a lower level, and say so.
        Err(LaunchError::Sys {
            step: Syscall::Unshare,
            errno,
            ..
        }) if matches!(
            errno,
            Errno::EPERM | Errno::EINVAL | Errno::ENOSPC | Errno::EUSERS | Errno::EACCES
        ) =>
        {
            tracing::warn!("cannot create namespaces here ({errno})");
            false
        }
        Err(e) => return Err(e),
    };
    let level =
        choose_level(namespaces, landlock).map_err(|e| LaunchError::Refused(e.to_string()))?;
    if let Some(announced) = spec.level.filter(|l| *l != level) {
        // What the caller announced is what runs, or nothing does.
        return Err(LaunchError::Refused(format!(
            "the sandbox was to be armed at the level {}, but only {} is possible now",
            announced.name(),
            level.name()
        )));
    }
    if level != Level::Full {
        tracing::warn!("the sandbox is armed at a lower level: {}", level.name());
    }
    // Its one way out, once the namespaces exist; a joined generation's
    // proxy already serves its namespace, at the same fixed port.
    let proxy = match (network, &spec.network) {
        (Some(started), Some(policy)) if namespaces => Some(super::net::arm(
            started,
            policy,
            spec.network_asks.as_deref(),
        )?),
        (_, Some(_)) if joined => {
            for (k, v) in super::net::proxy_env() {
                // Single-threaded: set_var is safe.
                std::env::set_var(k, v);
            }
            None
        }
        (_, Some(_)) => {
            tracing::warn!(
                "the network is not confined at this level: the command reaches the host's loopback and network directly"
            );
            None
        }
        _ => None,
    };
    // A command that gets a cleared environment keeps the proxy variables
    // (see `command`) only where they are this sandbox's own.
    if spec.clear_env && proxy.is_none() && !(joined && spec.network.is_some()) {
        for name in super::net::PROXY_VARS {
            // Single-threaded: remove_var is safe.
            std::env::remove_var(name);
        }
    }
    // What confines the command, for a tool inside that confines its own
    // runs (`run_code`): it reads this together with facts no process can
    // undo (see `run_code::confinement`). Single-threaded: set_var is safe.
    std::env::set_var(CONFINED_ENV, level.confined_by());
    let is_root = nix::unistd::getuid().is_root();

    // Signals the init forwards; blocked before forking so none is lost.
    let mut forwarded = SigSet::empty();
    forwarded.add(Signal::SIGTERM);
    forwarded.add(Signal::SIGINT);
    forwarded.add(Signal::SIGQUIT);
    forwarded.add(Signal::SIGHUP);
    forwarded.add(Signal::SIGCHLD);

    // The sandbox's first process hands the supervisor its listener here.
    let channel = match &supervisor {
        Some(_) => Some(sys(
            Syscall::SocketPair,
            nix::sys::socket::socketpair(
                nix::sys::socket::AddressFamily::Unix,
                nix::sys::socket::SockType::Stream,
                None,
                nix::sys::socket::SockFlag::SOCK_CLOEXEC,
            ),
        )?),
        None => None,
    };

    // Without a PID namespace nothing ends what the command leaves behind
    // (a daemon it `setsid`s, a runaway grandchild): the helper becomes
    // their reaper, so they stay in its tree, and ends them when the
    // command exits, as the end of a PID namespace would.
    let reaper = level == Level::LandlockOnly;
    if reaper {
        sys(
            Syscall::Subreaper,
            nix::sys::prctl::set_child_subreaper(true),
        )?;
    }

    // SAFETY: single-threaded process (documented precondition), so fork
    // cannot leave a lock held by another thread.
    match sys(Syscall::ForkInit, unsafe { fork() })? {
        ForkResult::Parent { child } => {
            // The helper stays outside the PID namespace and waits, passing
            // on the signals it gets (an editor's terminal/kill signals this
            // process alone, not its group), and supervising.
            if let Err(e) = forwarded.thread_block() {
                return Err(LaunchError::Sys {
                    step: Syscall::BlockSignals,
                    path: None,
                    errno: e,
                });
            }
            if let (Some(sup), Some((ours, theirs))) = (supervisor.as_mut(), channel) {
                // With their end closed here, a child that dies before
                // sending leaves us an end-of-file, not a wait forever.
                drop(theirs);
                sup.receive_listener(ours.as_fd());
            }
            // The helper needs no privilege from here on (it waits, forwards
            // signals, and acts for the supervisor with your own rights:
            // as root, or over a user namespace it owns, it would otherwise
            // override file permissions you have outside the sandbox).
            sys(
                Syscall::DropCapabilities,
                sys::drop_all_capabilities(is_root),
            )?;
            let code = wait_for_init(child, &forwarded, supervisor, proxy.as_ref().map(|p| p.pid))?;
            if reaper {
                end_leftovers();
            }
            Ok(code)
        }
        // Without a PID namespace there is no init to hold: the child is
        // the command (still in a new session, so not the caller's group).
        ForkResult::Child if level == Level::LandlockOnly => {
            // The helper holds no namespace that would end the command with
            // it: it goes when the helper does.
            if let Err(e) = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL) {
                die("parent-death signal", e);
            }
            drop(supervisor);
            confine(spec, is_root, true, channel.map(|(_, theirs)| theirs));
            command(spec, SigSet::empty())
        }
        ForkResult::Child => {
            drop(supervisor);
            let theirs = channel.map(|(_, theirs)| theirs);
            init(
                spec,
                is_root,
                level == Level::Full,
                forwarded,
                theirs,
                own_proc,
            )
        }
    }
}

/// The supervisor for the plan's supervised directories, if any and if it
/// can be prepared (else those names stay as armed, and the log says so).
fn prepare_supervisor(spec: &LaunchSpec) -> Option<super::supervise::Supervisor> {
    if spec.plan.supervised.is_empty() {
        return None;
    }
    let policy = spec.policy.clone()?;
    match super::supervise::Supervisor::prepare(&spec.plan.supervised, policy) {
        Ok(s) => Some(s),
        Err(e) => {
            degraded(&format!("the agent cannot save the files its profile grants by name (such as ~/.claude.json) this session: their supervisor could not start ({e})"));
            None
        }
    }
}

/// The helper's loop: waits for the init to exit (returning its code),
/// forwards the signals it gets, and serves the supervisor's calls.
fn wait_for_init(
    child: Pid,
    forwarded: &SigSet,
    mut supervisor: Option<super::supervise::Supervisor>,
    proxy: Option<Pid>,
) -> Result<i32, LaunchError> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use nix::sys::signalfd::{SfdFlags, SignalFd};
    let signals = sys(
        Syscall::Signalfd,
        SignalFd::with_flags(forwarded, SfdFlags::SFD_CLOEXEC),
    )?;
    // Checked first, then again at each SIGCHLD: a child that exited
    // before the signal mask was set is not missed.
    let mut check_child = true;
    loop {
        if check_child {
            // Every child is reaped: as a subreaper the helper also adopts
            // what the command left behind.
            loop {
                match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                    Ok(WaitStatus::Exited(pid, code)) if pid == child => return Ok(code),
                    Ok(WaitStatus::Signaled(pid, sig, _)) if pid == child => {
                        return Ok(128 + sig as i32)
                    }
                    Ok(WaitStatus::StillAlive) | Err(Errno::EINTR) => break,
                    // Ended on purpose: the sandbox is being stopped.
                    Ok(WaitStatus::Signaled(pid, Signal::SIGTERM, _)) if Some(pid) == proxy => {
                        continue
                    }
                    Ok(status) if proxy.is_some() && status.pid() == proxy => {
                        // The sandbox lives on with no way out: said, so a
                        // broken network is not taken for a policy.
                        tracing::error!(
                            ?status,
                            "the sandbox's network proxy ended: nothing inside can reach the network until the sandbox is started again (restart the agent or the session)"
                        );
                        continue;
                    }
                    Ok(_) => continue,
                    Err(e) => {
                        return Err(LaunchError::Sys {
                            step: Syscall::WaitForInit,
                            path: None,
                            errno: e,
                        })
                    }
                }
            }
            check_child = false;
        }
        let listener = supervisor.as_ref().and_then(|s| s.listener());
        let mut fds = [
            PollFd::new(signals.as_fd(), PollFlags::POLLIN),
            PollFd::new(listener.unwrap_or(signals.as_fd()), PollFlags::POLLIN),
        ];
        let watched = if listener.is_some() { 2 } else { 1 };
        match poll(&mut fds[..watched], PollTimeout::NONE) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(e) => {
                return Err(LaunchError::Sys {
                    step: Syscall::Poll,
                    path: None,
                    errno: e,
                })
            }
        }
        let signalled = fds[0]
            .revents()
            .is_some_and(|r| r.contains(PollFlags::POLLIN));
        let (call, hung_up) = match fds[1].revents().filter(|_| watched == 2) {
            Some(r) => (
                r.contains(PollFlags::POLLIN),
                r.intersects(PollFlags::POLLHUP | PollFlags::POLLERR),
            ),
            None => (false, false),
        };
        if call {
            if let Some(s) = &supervisor {
                s.handle_one();
            }
        } else if hung_up {
            // Every supervised process is gone.
            if let Some(s) = supervisor.as_mut() {
                s.close();
            }
        }
        if signalled {
            if let Ok(Some(info)) = signals.read_signal() {
                match Signal::try_from(info.ssi_signo as i32) {
                    Ok(Signal::SIGCHLD) => check_child = true,
                    Ok(sig) => {
                        let _ = kill(child, sig);
                    }
                    Err(_) => {}
                }
            }
        }
    }
}

/// Ends every process the helper adopted (see `reaper` in [`run`]) and
/// reaps them, until it has no child left.
fn end_leftovers() {
    loop {
        for p in crate::backend::procs::my_descendants() {
            let _ = kill(Pid::from_raw(p.pid), Signal::SIGKILL);
        }
        match waitpid(Pid::from_raw(-1), None) {
            Ok(_) | Err(Errno::EINTR) => continue,
            // ECHILD: nothing is left.
            Err(_) => return,
        }
    }
}

/// The last steps before running anything of the agent's: a session
/// keyring of its own, every capability gone (keeping CAP_SYS_ADMIN would let it clear read-only with
/// mount_setattr), no_new_privs, Landlock (it refuses mounts afterwards),
/// and then the seccomp filter (`seccomp`), with the supervisor's listener
/// handed to the helper where the plan has name-prefix grants.
fn confine(
    spec: &LaunchSpec,
    is_root: bool,
    landlock: bool,
    supervisor: Option<std::os::fd::OwnedFd>,
) {
    // The user namespace made `@u` private; the session keyring is
    // inherited, so a new one replaces it.
    if let Err(e) = sys::join_new_session_keyring() {
        die("a session keyring of its own", e);
    }
    if let Err(e) = sys::drop_all_capabilities(is_root) {
        die("drop capabilities", e);
    }
    if let Err(e) = nix::sys::prctl::set_no_new_privs() {
        die("no_new_privs", e);
    }
    if landlock {
        match enforce_landlock(&spec.plan, spec.landlock_abi.unwrap_or(0)) {
            Err(e) => die("Landlock", e),
            Ok(status) if status.contains("partially") => degraded(&format!(
                "{status}: this kernel's Landlock cannot restrict every write right zcode-acp asks for"
            )),
            Ok(_) => {}
        }
    }
    if let Err(e) = super::supervise::install_filter(supervisor.as_ref().map(|s| s.as_fd())) {
        die("seccomp filter", e);
    }
}

/// PID 1 of the sandbox. `own_proc`: the /proc beneath is a joined
/// generation's own (showing the agent's processes), so this one must
/// mount its own; elsewhere a refused mount leaves the host's read-only
/// /proc, as in a container that masks parts of it.
fn init(
    spec: &LaunchSpec,
    is_root: bool,
    landlock: bool,
    forwarded: SigSet,
    supervisor: Option<std::os::fd::OwnedFd>,
    own_proc: bool,
) -> ! {
    if let Err(e) = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL) {
        die("parent-death signal", e);
    }
    // Not dumpable: a process of the sandbox (the same user and Landlock
    // domain, no capabilities) could otherwise ptrace its init, stop it
    // (the sandbox would never end) or use its descriptors (the caches'
    // slot lock). The command's exec makes itself dumpable again.
    if let Err(e) = nix::sys::prctl::set_dumpable(false) {
        die("not dumpable", e);
    }
    // Out of the caller's process group: a terminal's Ctrl-C reaches the
    // helper, which passes it on, and not this process a second time. In
    // a background group, a write to the terminal under `stty tostop`
    // raises SIGTTOU, which the kernel drops for a namespace's init and
    // the write then retries for ever: blocked here, so it goes through
    // (and unblocked for the command, in `command`).
    let _ = tty_stops().thread_block();
    let _ = nix::unistd::setpgid(Pid::from_raw(0), Pid::from_raw(0));
    // A /proc for this PID namespace: ps shows the sandbox, not the host.
    // If the kernel refuses, the host's (read-only) /proc stays.
    let proc = mount(
        Some("proc"),
        "/proc",
        Some("proc"),
        MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None::<&str>,
    );
    match (proc, own_proc) {
        (Err(e), true) => die("mount a /proc of its own", e),
        // Without Landlock, the host's /proc would let a process reach
        // outside through /proc/PID/root: refused.
        (Err(e), false) if !landlock => die(
            "mount a /proc of its own (without Landlock, the host's would open a way out)",
            e,
        ),
        (Err(e), false) => degraded(&format!("the sandbox has no /proc of its own ({e}; a container masks parts of it): the host's processes are listed inside, read-only")),
        (Ok(()), _) => {}
    }
    confine(spec, is_root, landlock, supervisor);
    if let Err(e) = forwarded.thread_block() {
        die("block signals", e);
    }
    // SAFETY: still single-threaded.
    let child = match unsafe { fork() } {
        Ok(ForkResult::Child) => command(spec, forwarded),
        Ok(ForkResult::Parent { child }) => child,
        Err(e) => die("fork the command", e),
    };
    // Signals go to the command's process group (it has its own session).
    forward_until_exit(child, &forwarded, Pid::from_raw(-child.as_raw()))
}

/// The signals a terminal sends a background process group that writes
/// to it or reads from it.
fn tty_stops() -> SigSet {
    let mut set = SigSet::empty();
    set.add(Signal::SIGTTOU);
    set.add(Signal::SIGTTIN);
    set
}

/// Reaps every child, passes the signals it gets on to `target`, and
/// exits as `child` did once it is gone.
fn forward_until_exit(child: Pid, forwarded: &SigSet, target: Pid) -> ! {
    loop {
        let sig = match forwarded.wait() {
            Ok(s) => s,
            Err(_) => continue,
        };
        if sig == Signal::SIGCHLD {
            // Reap everything; leave when the child itself is gone.
            loop {
                match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                    Ok(WaitStatus::Exited(pid, code)) if pid == child => std::process::exit(code),
                    Ok(WaitStatus::Signaled(pid, s, _)) if pid == child => {
                        std::process::exit(128 + s as i32)
                    }
                    Ok(WaitStatus::StillAlive) | Err(_) => break,
                    Ok(_) => continue,
                }
            }
        } else {
            let _ = kill(target, sig);
        }
    }
}

/// Makes `dir` the working directory, reached with no symlink on the way;
/// the error, and whether something is there at all.
fn enter_without_symlinks(dir: &Path) -> Result<(), (Errno, bool)> {
    match super::open_dir_without_symlinks(dir) {
        Ok(fd) => nix::unistd::fchdir(&fd).map_err(|e| (e, true)),
        Err(e) => Err((e, dir.exists())),
    }
}

/// The command itself: last steps, then exec.
fn command(spec: &LaunchSpec, forwarded: SigSet) -> ! {
    if let Err(e) = forwarded.thread_unblock() {
        die("unblock signals", e);
    }
    // Rust ignores SIGPIPE in its own processes, and an ignored signal
    // stays ignored across exec: the command (a `yes | head`) gets the
    // default back, as anything a shell starts does.
    // SAFETY: a disposition set to the default, in the single-threaded
    // process about to exec.
    if let Err(e) =
        unsafe { nix::sys::signal::signal(Signal::SIGPIPE, nix::sys::signal::SigHandler::SigDfl) }
    {
        die("reset SIGPIPE", e);
    }
    if let Err(e) = tty_stops().thread_unblock() {
        die("unblock signals", e);
    }
    if let Err(e) = nix::unistd::setsid() {
        die("setsid", e);
    }
    if let Err(e) = sys::close_from(3) {
        die("close inherited fds", e);
    }
    if spec.clear_env {
        let names: Vec<_> = std::env::vars_os()
            .map(|(k, _)| k)
            // What the helper itself set: what confines the command, and
            // the way out of its network (`net::arm`).
            .filter(|k| k != CONFINED_ENV && !super::net::PROXY_VARS.iter().any(|p| k == p))
            .collect();
        for k in names {
            std::env::remove_var(k);
        }
    }
    for (k, v) in &spec.env {
        std::env::set_var(k, v);
    }
    if let Some(cwd) = &spec.cwd {
        // Entered with no symlink on the way: the working directory is the
        // real path that was judged (an editor terminal's, resolved by the
        // bridge), and a directory on it swapped for a symlink since is
        // refused, not followed. The directory may not exist in the
        // sandbox's view (it was in the host's /tmp, which is private
        // here): then the nearest one that does.
        let mut entered = None;
        for dir in cwd.ancestors() {
            match enter_without_symlinks(dir) {
                Ok(()) => {
                    entered = Some(dir);
                    break;
                }
                // There, but not reached without a symlink: refused.
                Err((Errno::ENOTDIR | Errno::ELOOP | Errno::EXDEV, true)) => die(
                    &format!("cd {}", cwd.display()),
                    format!(
                        "{} is now reached through a symlink, so it is not the directory that was judged; not run",
                        dir.display()
                    ),
                ),
                Err(_) => continue,
            }
        }
        match entered {
            Some(dir) if dir != cwd.as_path() => eprintln!(
                "zcode-acp sandbox: {} is not visible inside the sandbox (the sandbox's /tmp is private); running in {}",
                cwd.display(),
                dir.display()
            ),
            Some(_) => {}
            None => die(&format!("cd {}", cwd.display()), "no part of it is visible"),
        }
    }
    let args: Vec<CString> = spec
        .argv
        .iter()
        .map(|a| CString::new(a.as_bytes()).unwrap_or_default())
        .collect();
    let e = nix::unistd::execvp(&args[0], &args).unwrap_err();
    die(&format!("run {}", spec.argv[0]), e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_maps_what_exists_where_it_runs() {
        // The host: the whole range.
        assert_eq!(
            identity_map("         0          0 4294967295\n").as_deref(),
            Some("0 0 4294967295\n")
        );
        // Rootless podman: root is the user, the rest a subordinate range.
        assert_eq!(
            identity_map("         0       1000          1\n         1     100000      65536\n")
                .as_deref(),
            Some("0 0 1\n1 1 65536\n")
        );
        assert_eq!(identity_map(""), None);
        assert_eq!(identity_map("0 x 1"), None);
        assert_eq!(own_id_map(1000), "1000 1000 1");
    }

    #[test]
    fn levels_follow_what_the_machine_allows() {
        assert_eq!(choose_level(true, true), Ok(Level::Full));
        assert_eq!(choose_level(true, false), Ok(Level::MountsOnly));
        assert_eq!(choose_level(false, true), Ok(Level::LandlockOnly));
        let refusal = choose_level(false, false).unwrap_err().to_string();
        assert!(refusal.contains("--no-sandbox"), "{refusal}");
    }

    #[test]
    fn an_npm_script_brings_its_node_modules_tree() {
        assert_eq!(
            outermost_node_modules(Path::new(
                "/tmp/c/tests/agents/node_modules/@a/b/node_modules/c/dist/index.js"
            )),
            Some(PathBuf::from("/tmp/c/tests/agents/node_modules"))
        );
        assert_eq!(outermost_node_modules(Path::new("/tmp/x/agent.py")), None);
    }

    #[test]
    fn mountinfo_escapes_are_read() {
        assert_eq!(unescape(r"/a\040b"), "/a b");
        assert_eq!(unescape(r"/x\134y"), r"/x\y");
        assert_eq!(unescape("/plain"), "/plain");
    }
}
