//! Waiting for a command as a shell does, for `zcode-acp run`: Ctrl-C and
//! Ctrl-\ reach the command from the terminal (its own process group gets
//! them) and are not acted on here; SIGTERM and SIGHUP sent to `run` are
//! passed on to it; and none of them cuts short what `run` does once the
//! command ended (its audit), since they stay blocked until the shield is
//! dropped.

use nix::sys::signal::{kill, SigSet, SigmaskHow, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

pub struct Shield {
    /// The mask before: the command gets it back, and so does `run` when
    /// the shield goes.
    pub old: SigSet,
    held: SigSet,
}

impl Shield {
    /// Blocks the signals `run` waits on. Before any child is started.
    pub fn raise() -> nix::Result<Shield> {
        // An inherited SIG_IGN for SIGCHLD would have children reaped
        // unseen, and the wait below would never end.
        // SAFETY: a disposition set to the default; no handler runs.
        unsafe {
            nix::sys::signal::signal(Signal::SIGCHLD, nix::sys::signal::SigHandler::SigDfl)?;
        }
        let held: SigSet = [
            Signal::SIGCHLD,
            Signal::SIGINT,
            Signal::SIGQUIT,
            Signal::SIGTERM,
            Signal::SIGHUP,
        ]
        .into_iter()
        .collect();
        let old = held.thread_swap_mask(SigmaskHow::SIG_BLOCK)?;
        Ok(Shield { old, held })
    }

    /// Waits for `child` to end, passing SIGTERM and SIGHUP on to it: its
    /// exit code, or 128 + the signal that ended it.
    pub fn wait(&self, child: Pid) -> anyhow::Result<i32> {
        loop {
            match self.held.wait()? {
                Signal::SIGCHLD => match waitpid(child, Some(WaitPidFlag::WNOHANG)) {
                    Ok(WaitStatus::Exited(_, code)) => return Ok(code),
                    Ok(WaitStatus::Signaled(_, sig, _)) => return Ok(128 + sig as i32),
                    Ok(_) => {}
                    Err(e) => anyhow::bail!("cannot wait for the sandbox: {e}"),
                },
                sig @ (Signal::SIGTERM | Signal::SIGHUP) => {
                    let _ = kill(child, sig);
                }
                // SIGINT, SIGQUIT: the terminal sent them to the command.
                _ => {}
            }
        }
    }
}

impl Drop for Shield {
    fn drop(&mut self) {
        let _ = self.old.thread_set_mask();
    }
}
