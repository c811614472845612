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
//!    namespace maps the uid and gid to themselves, never to 0. With no
//!    level announced (`zcode-acp run`, which does not probe), a machine
//!    that refuses the network namespace gets the others and a warning,
//!    and one that refuses them all gets Landlock alone; either way the
//!    caller is told on its pipe that the command shares the host's
//!    network (`LaunchSpec::says_its_network`);
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

use std::os::fd::AsFd;
use std::path::PathBuf;

use nix::errno::Errno;
use nix::sched::{unshare, CloneFlags};
use nix::sys::signal::{kill, SigSet, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{fork, ForkResult, Pid};

use super::error::sys;
pub use super::error::{LaunchError, Syscall};
pub use super::level::{choose_level, namespaces_available, Available, Level, NothingToArm};
use super::mounts::{arm_mounts, check_island_links, needed_visible};
pub use super::spec::{LaunchSpec, OWN_NETWORK};
pub(crate) use super::stages::degraded;
use super::stages::{command, confine, die, init, open_report};
use super::sys;

/// Set in every confined command's environment: what confines it.
pub use crate::confine::CONFINED_ENV;

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

/// The number of threads of this process.
pub(crate) fn threads() -> Option<u32> {
    std::fs::read_to_string("/proc/self/status")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Waits (half a second at most) until this process has one thread: a
/// thread just joined is still leaving the kernel's books for a moment.
/// Whether it has.
pub(crate) fn wait_until_single_threaded() -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(500);
    loop {
        if threads() == Some(1) {
            return true;
        }
        if std::time::Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_micros(50));
    }
}

/// Waits for `run`'s one byte on `fd` (see [`LaunchSpec::waits_for_go`]),
/// and closes it: an end of file or an error refuses the launch.
fn wait_for_go(fd: std::os::fd::RawFd) -> Result<(), LaunchError> {
    use std::os::fd::FromRawFd;
    // SAFETY: `run` handed this launcher the read end, which nothing else
    // owns here; it is closed when the handle drops.
    let go = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    let mut byte = [0u8; 1];
    loop {
        match nix::unistd::read(&go, &mut byte) {
            Ok(1) => return Ok(()),
            Err(Errno::EINTR) => continue,
            _ => {
                return Err(LaunchError::Refused(
                    "zcode-acp run ended before the command could start".into(),
                ))
            }
        }
    }
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
    // An editor terminal waits here while the agent is held, and holds
    // the next hold off until its first process exists (then found in the
    // world): it never starts unseen by a hold (see `hold`).
    let hold_lock = match &spec.hold_lock {
        Some(path) => Some(super::hold::wait_for_no_hold(path).map_err(|e| {
            LaunchError::Refused(format!(
                "cannot take the agent's hold lock {} ({e})",
                path.display()
            ))
        })?),
        None => None,
    };
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
        let own_network = network.is_some();
        arm_mounts(
            &spec.plan,
            &visible,
            layer.as_ref(),
            own_network,
            spec.level.is_none(),
        )
        .map(|networked| {
            if !networked {
                // Its channel closed: the proxy ends, having served nothing.
                network = None;
            }
        })
    };
    let namespaces = match mounts {
        Ok(()) => true,
        Err(_) if spec.level == Some(Level::LandlockOnly) => false,
        // Nothing was changed yet: decide on a lower level, and say so.
        Err(LaunchError::Sys {
            step: Syscall::Unshare,
            errno,
            ..
        }) if super::mounts::refused_by_the_machine(errno) => {
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
            spec.network_ledger.as_deref(),
        )?),
        (_, Some(_)) if joined => {
            for (k, v) in super::net::proxy_env() {
                // Single-threaded: set_var is safe.
                std::env::set_var(k, v);
            }
            None
        }
        // (With the namespaces but none for the network, `arm_mounts`
        // said so.)
        (_, Some(_)) if !namespaces => {
            tracing::warn!(
                "the network is not confined at this level: the command reaches the host's loopback and network directly"
            );
            None
        }
        _ => None,
    };
    // `run` says what the command sent only where the command cannot
    // reach the count socket itself.
    if let Some(fd) = spec.says_its_network {
        let said = if proxy.is_some() {
            super::spec::OWN_NETWORK
        } else {
            b'h'
        };
        // SAFETY: writes one byte of ours to the pipe `run` handed over.
        unsafe { libc::write(fd, [said].as_ptr().cast(), 1) };
    }
    // A command that gets a cleared environment keeps the proxy variables
    // (see `command`) only where they are this sandbox's own.
    if spec.clear_env && proxy.is_none() && !(joined && spec.network.is_some()) {
        for name in crate::network::PROXY_VARS {
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

    // Nothing of the command's starts before `run`'s audit has its
    // baseline: what the command leaves is found against it.
    if let Some(fd) = spec.waits_for_go {
        wait_for_go(fd)?;
    }
    // SAFETY: single-threaded process (documented precondition), so fork
    // cannot leave a lock held by another thread.
    match sys(Syscall::ForkInit, unsafe { fork() })? {
        ForkResult::Parent { child } => {
            // The command's first process exists: a hold finds it now.
            drop(hold_lock);
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
            let noted = supervisor.as_ref().and_then(|s| s.refusals());
            let code = wait_for_init(
                child,
                &forwarded,
                &mut supervisor,
                proxy.as_ref().map(|p| p.pid),
            )?;
            if reaper {
                end_leftovers();
            }
            // `run`'s last line (an agent's refusals were said as they came).
            if let Some(line) = noted.filter(|_| !spec.announce_refusals).and_then(|n| {
                n.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .line(dirs::home_dir().as_deref())
            }) {
                eprintln!("{line}");
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
    if spec.plan.supervised.is_empty() && !spec.note_refusals {
        return None;
    }
    let policy = spec.policy.clone()?;
    match super::supervise::Supervisor::prepare(
        &spec.plan.supervised,
        policy,
        spec.note_refusals,
        spec.announce_refusals,
    ) {
        Err(e) if spec.plan.supervised.is_empty() => {
            // Only the refused writes' line is lost.
            tracing::debug!("cannot watch for refused writes ({e})");
            None
        }
        Ok(s) => Some(s),
        Err(e) => {
            degraded(&format!("the agent cannot save the files its profile grants by name (such as ~/.claude.json) this session: their supervisor could not start ({e})"));
            None
        }
    }
}

/// The helper's loop: waits for the init to exit (returning its code),
/// forwards the signals it gets, and serves the supervisor's calls, at
/// every level: a helper that made a PID namespace for its children can
/// start no thread (clone(CLONE_THREAD) is EINVAL), so none serves them.
fn wait_for_init(
    child: Pid,
    forwarded: &SigSet,
    supervisor: &mut Option<super::supervise::Supervisor>,
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
            if let Some(s) = supervisor.as_mut() {
                if !s.serve_one() {
                    // Closing it fails the calls it would have served: none
                    // waits, and this loop does not spin on it.
                    if !hung_up {
                        tracing::error!("the sandbox's supervisor stopped: the names its profile grants (such as ~/.claude.json) cannot be written until the sandbox is started again");
                    }
                    s.close();
                }
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
        for p in crate::procs::my_descendants() {
            let _ = kill(Pid::from_raw(p.pid), Signal::SIGKILL);
        }
        match waitpid(Pid::from_raw(-1), None) {
            Ok(_) | Err(Errno::EINTR) => continue,
            // ECHILD: nothing is left.
            Err(_) => return,
        }
    }
}
