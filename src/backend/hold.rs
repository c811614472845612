//! Holding the agent's processes still while the editor writes for it
//! (see `bridge::hold`): every process of the armed generation, and of the
//! editor terminals it runs, is stopped, and continued once the editor
//! answered. On Linux that is `linux::hold` (the generation's user
//! namespace and those nested below it, and the terminals' own); on macOS
//! it is the generation's process and its descendants, found through
//! libproc's parent links (terminals the editor started are not its
//! descendants, and are not held there).

use std::path::PathBuf;
use std::time::Duration;

/// How long the processes get to be seen stopped.
pub const WITHIN: Duration = Duration::from_secs(2);

/// Whose processes to hold: the generation's helper (Linux; on macOS the
/// agent's own process) and its private directory.
#[derive(Debug, Clone)]
pub struct World {
    pub holder: i32,
    pub generation_dir: Option<PathBuf>,
}

/// The held processes; continued when released or dropped.
#[derive(Debug)]
pub struct Held {
    #[cfg(target_os = "linux")]
    inner: crate::linux::hold::Held,
    #[cfg(not(target_os = "linux"))]
    pids: Vec<i32>,
}

impl Held {
    /// Nothing held (nothing of the agent runs).
    pub fn empty() -> Held {
        #[cfg(target_os = "linux")]
        return Held {
            inner: Default::default(),
        };
        #[cfg(not(target_os = "linux"))]
        return Held { pids: Vec::new() };
    }

    /// How many processes are held.
    pub fn len(&self) -> usize {
        #[cfg(target_os = "linux")]
        return self.inner.len();
        #[cfg(not(target_os = "linux"))]
        return self.pids.len();
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Continues every held process.
    pub fn release(self) {
        drop(self);
    }

    /// Ends every held process instead (they must not go on while a write
    /// may still be made for them).
    pub fn kill(mut self) {
        #[cfg(target_os = "linux")]
        std::mem::take(&mut self.inner).kill();
        #[cfg(not(target_os = "linux"))]
        for pid in self.pids.drain(..) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

#[cfg(not(target_os = "linux"))]
impl Drop for Held {
    fn drop(&mut self) {
        for pid in self.pids.drain(..) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGCONT,
            );
        }
    }
}

/// Stops the world's processes; why not, in words, when they cannot all be
/// seen stopped in time (nothing is left stopped then).
pub fn hold(world: &World) -> Result<Held, String> {
    #[cfg(target_os = "linux")]
    {
        let w = crate::linux::hold::World {
            holder: world.holder,
            generation_dir: world.generation_dir.clone(),
        };
        crate::linux::hold::hold(&w, WITHIN)
            .map(|inner| Held { inner })
            .map_err(|e| e.to_string())
    }
    #[cfg(not(target_os = "linux"))]
    {
        hold_descendants(world.holder)
    }
}

/// The agent and its descendants, stopped until a scan finds none running.
#[cfg(not(target_os = "linux"))]
fn hold_descendants(agent: i32) -> Result<Held, String> {
    use crate::procs::{descendants_in, snapshot};
    let deadline = std::time::Instant::now() + WITHIN;
    let mut held = Held { pids: Vec::new() };
    loop {
        let procs = snapshot();
        let mut world = descendants_in(&procs, agent);
        if let Some(me) = procs.iter().find(|p| p.pid == agent) {
            world.push(*me);
        }
        let mut new = 0;
        for p in world.iter().filter(|p| !p.is_gone()) {
            if !held.pids.contains(&p.pid) {
                let stopped = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(p.pid),
                    nix::sys::signal::Signal::SIGSTOP,
                );
                if stopped.is_ok() {
                    held.pids.push(p.pid);
                    new += 1;
                }
            }
        }
        let running = snapshot()
            .iter()
            .filter(|p| held.pids.contains(&p.pid) && !matches!(p.state, 'T' | 'Z'))
            .count();
        if new == 0 && running == 0 {
            return Ok(held);
        }
        if std::time::Instant::now() >= deadline {
            return Err(format!(
                "{running} of the agent's processes did not stop within {WITHIN:?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}
