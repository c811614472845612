//! The keeper of an unconfined backend (Linux): `zcode-acp __keeper
//! --bridge PID -- AGENT...`.
//!
//! A sandboxed generation lives in a PID namespace of its own, so nothing
//! of it survives its init. An unconfined one has no such boundary, and a
//! bridge that is SIGKILLed cannot kill what the agent started (a command
//! still running, a `setsid` daemon). The keeper is that boundary without a
//! namespace: a child subreaper between the bridge and the agent, so every
//! process of the agent's tree that loses its parent comes to it; when the
//! bridge disappears (its parent-death signal), it kills the whole tree
//! and goes. When the agent exits, the keeper exits the same way, and what
//! is left of the tree passes to the bridge, which stops it as before.
//!
//! Single-threaded, no async runtime: it waits for signals and nothing else.

use std::ffi::CString;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, sigprocmask, SigSet, SigmaskHow, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{fork, getpid, getppid, ForkResult, Pid};

pub use crate::confine::keeper_argv as wrap;

/// Runs the keeper; returns only if the agent cannot be started (the exit
/// code to use). Must run before any thread.
pub fn run(bridge: i32, argv: &[String]) -> i32 {
    if argv.is_empty() {
        eprintln!("zcode-acp keeper: no command to run");
        return 127;
    }
    // Orphans of the agent's tree are re-parented here, not to init.
    if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
        eprintln!(
            "zcode-acp keeper: cannot become a child subreaper ({e}); the agent runs without one"
        );
    }
    // Every signal the keeper acts on is taken from a mask, in order.
    let waited: SigSet = [
        Signal::SIGCHLD,
        Signal::SIGUSR1,
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
    ]
    .into_iter()
    .collect();
    let mut old = SigSet::empty();
    if let Err(e) = sigprocmask(SigmaskHow::SIG_BLOCK, Some(&waited), Some(&mut old)) {
        eprintln!("zcode-acp keeper: cannot block signals ({e})");
        return 127;
    }
    // The bridge's death arrives as SIGUSR1; if it died before this was
    // set, it is already gone.
    let bridge_gone = nix::sys::prctl::set_pdeathsig(Signal::SIGUSR1).is_err()
        || getppid() != Pid::from_raw(bridge);
    // SAFETY: single-threaded (documented precondition), so the child may
    // allocate before exec; it execs or leaves with _exit.
    let agent = match unsafe { fork() } {
        Ok(ForkResult::Child) => exec_agent(argv, &old),
        Ok(ForkResult::Parent { child }) => child,
        Err(e) => {
            eprintln!("zcode-acp keeper: cannot start the agent ({e})");
            return 127;
        }
    };
    // The agent's pipes are the agent's: the bridge sees end-of-file on its
    // stdout when the agent is gone, not when the keeper is.
    for fd in [0, 1] {
        // SAFETY: closing this process's own stdin and stdout, which
        // nothing here uses again.
        unsafe { nix::libc::close(fd) };
    }
    if bridge_gone {
        end_the_tree();
        return 1;
    }
    loop {
        let signal = match waited.wait() {
            Ok(s) => s,
            Err(_) => continue,
        };
        match signal {
            Signal::SIGCHLD => {
                if let Some(status) = reap(agent) {
                    // Nothing of the agent outlives it, whoever is there
                    // to clean up after.
                    end_the_tree();
                    exit_like(status);
                }
            }
            Signal::SIGUSR1 => {
                end_the_tree();
                return 1;
            }
            // The bridge signals the whole process group: the agent got it
            // too, and the keeper leaves with it.
            _ => {}
        }
    }
}

/// In the forked child: the signal mask it had, then the agent.
fn exec_agent(argv: &[String], mask: &SigSet) -> ! {
    // Rust ignores SIGPIPE in its own processes; the agent (and the shell
    // pipelines it runs) get the default back, as any spawned command does.
    // SAFETY: resetting a disposition to the default in a single-threaded
    // child before exec.
    let _ =
        unsafe { nix::sys::signal::signal(Signal::SIGPIPE, nix::sys::signal::SigHandler::SigDfl) };
    let _ = sigprocmask(SigmaskHow::SIG_SETMASK, Some(mask), None);
    let _ = nix::sys::prctl::set_pdeathsig(None);
    let args: Vec<CString> = argv
        .iter()
        .map(|a| CString::new(a.as_bytes()).unwrap_or_default())
        .collect();
    let e = nix::unistd::execvp(&args[0], &args).unwrap_err();
    eprintln!("zcode-acp keeper: cannot run {}: {e}", argv[0]);
    // SAFETY: leaves the child at once, without running the parent's
    // destructors.
    unsafe { nix::libc::_exit(127) }
}

/// Reaps every child that has exited; the agent's status once it has.
fn reap(agent: Pid) -> Option<WaitStatus> {
    let mut agent_status = None;
    loop {
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(_) => return agent_status,
            Ok(status) if status.pid() == Some(agent) => agent_status = Some(status),
            Ok(_) => {}
        }
    }
}

/// Leaves as the agent left: its exit code, or its signal (raised on the
/// keeper itself, so the bridge reads the same status it would have).
fn exit_like(status: WaitStatus) -> ! {
    match status {
        WaitStatus::Exited(_, code) => std::process::exit(code),
        WaitStatus::Signaled(_, signal, _) => {
            // Raised again for its status only: no core dump of the keeper.
            let _ = nix::sys::prctl::set_dumpable(false);
            // SAFETY: resetting a disposition to the default.
            let _ =
                unsafe { nix::sys::signal::signal(signal, nix::sys::signal::SigHandler::SigDfl) };
            let mut only = SigSet::empty();
            only.add(signal);
            let _ = sigprocmask(SigmaskHow::SIG_UNBLOCK, Some(&only), None);
            let _ = kill(getpid(), signal);
            std::process::exit(128 + signal as i32)
        }
        _ => std::process::exit(1),
    }
}

/// The bridge is gone: every process below the keeper is killed (orphans
/// come here, so that is the agent's whole tree), until none is left or
/// three seconds have passed.
fn end_the_tree() {
    let give_up = Instant::now() + Duration::from_secs(3);
    let me = getpid().as_raw();
    loop {
        let _ = reap(Pid::from_raw(0));
        let procs = crate::procs::snapshot();
        let alive: Vec<i32> = crate::procs::descendants_in(&procs, me)
            .iter()
            .filter(|p| !p.is_gone())
            .map(|p| p.pid)
            .collect();
        if alive.is_empty() || Instant::now() > give_up {
            return;
        }
        for pid in alive {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_keeper_stands_between_the_bridge_and_the_agent() {
        let argv = wrap("/bin/zcode-acp", &["node".into(), "agent.js".into()]);
        assert_eq!(argv[..3], ["/bin/zcode-acp", "__keeper", "--bridge"]);
        assert_eq!(argv[3], std::process::id().to_string());
        assert_eq!(argv[4..], ["--", "node", "agent.js"]);
    }
}
