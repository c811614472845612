//! Steps 5 and 6 of the launch (see `exec`): the PID namespace's init
//! (its /proc, capabilities dropped, no_new_privs, Landlock, the seccomp
//! filter) and the command itself; and what a launch says when it sets a
//! layer up less than planned.

use std::ffi::CString;
use std::os::fd::AsFd;
use std::path::Path;

use landlock::{
    Access, AccessFs, BitFlags, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};
use nix::errno::Errno;
use nix::mount::{mount, MsFlags};
use nix::sys::signal::{kill, SigSet, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{fork, ForkResult, Pid};

use super::error::LaunchError;
use super::plan::Plan;
use super::spec::LaunchSpec;
use super::sys;
use crate::confine::CONFINED_ENV;

/// Landlock: write rights only beneath the writable set and on the needed
/// devices; signals and abstract sockets scoped to the sandbox.
pub(super) fn enforce_landlock(plan: &Plan, abi: i32) -> Result<String, LaunchError> {
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
pub(super) static REPORT: std::sync::Mutex<Option<std::fs::File>> = std::sync::Mutex::new(None);

pub(super) fn open_report(path: Option<&Path>) {
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

pub(super) fn die(what: &str, e: impl std::fmt::Display) -> ! {
    eprintln!("zcode-acp sandbox: {what}: {e}");
    std::process::exit(126);
}

/// The last steps before running anything of the agent's: a session
/// keyring of its own, every capability gone (keeping CAP_SYS_ADMIN would let it clear read-only with
/// mount_setattr), no_new_privs, Landlock (it refuses mounts afterwards),
/// and then the seccomp filter (`seccomp`), with the supervisor's listener
/// handed to the helper where the plan has name-prefix grants.
pub(super) fn confine(
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
pub(super) fn init(
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
pub(super) fn tty_stops() -> SigSet {
    let mut set = SigSet::empty();
    set.add(Signal::SIGTTOU);
    set.add(Signal::SIGTTIN);
    set
}

/// Reaps every child, passes the signals it gets on to `target`, and
/// exits as `child` did once it is gone.
pub(super) fn forward_until_exit(child: Pid, forwarded: &SigSet, target: Pid) -> ! {
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

/// Makes `dir` the working directory, reached with no symlink on the way
/// (ENOENT: nothing is there; ELOOP: a symlink is on the way).
pub(super) fn enter_without_symlinks(dir: &Path) -> Result<(), Errno> {
    let fd = super::open_dir_without_symlinks(dir)?;
    nix::unistd::fchdir(&fd)
}

/// The command itself: last steps, then exec.
pub(super) fn command(spec: &LaunchSpec, forwarded: SigSet) -> ! {
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
            .filter(|k| k != CONFINED_ENV && !crate::network::PROXY_VARS.iter().any(|p| k == p))
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
        // here): then the nearest one that does. Anywhere else, one that
        // is gone (removed, or moved away since it was judged) is refused
        // too: a command meant for a subdirectory never runs in its parent.
        let privately = |dir: &Path| {
            super::plan::PRIVATE_TMP
                .iter()
                .chain(&["/dev/shm"])
                .any(|t| dir.starts_with(t) && dir != Path::new(t))
        };
        let mut entered = None;
        for dir in cwd.ancestors() {
            match enter_without_symlinks(dir) {
                Ok(()) => {
                    entered = Some(dir);
                    break;
                }
                // Not there at all, where the sandbox's private /tmp (or
                // /var/tmp, /dev/shm) hides a host directory: the nearest
                // one that is.
                Err(Errno::ENOENT) if privately(dir) => continue,
                Err(Errno::ENOENT) => die(
                    &format!("cd {}", cwd.display()),
                    format!(
                        "{} does not exist any more (removed or moved since it was judged); not run",
                        dir.display()
                    ),
                ),
                // There, but not reached without a symlink (a dangling one
                // included): refused.
                Err(Errno::ENOTDIR | Errno::ELOOP | Errno::EXDEV) => die(
                    &format!("cd {}", cwd.display()),
                    format!(
                        "{} is now reached through a symlink, so it is not the directory that was judged; not run",
                        dir.display()
                    ),
                ),
                Err(e) => die(
                    &format!("cd {}", cwd.display()),
                    format!("{} cannot be entered ({e}); not run", dir.display()),
                ),
            }
        }
        match entered {
            Some(dir) if dir != cwd.as_path() => eprintln!(
                "zcode-acp sandbox: {} is not visible inside the sandbox (its temp directories are private); running in {}",
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
