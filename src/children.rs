//! Children of this process that some code waits for itself. The bridge
//! reaps the zombies its backends leave behind (`backend::procs`), which
//! would take the exit status a thread of its own is about to collect (the
//! post-turn audit runs git off the event loop): such a child is spawned
//! and registered under one lock, which the reaper holds while it looks,
//! so it never sees one unregistered.

use std::sync::{Mutex, MutexGuard};

static OWNED: Mutex<Vec<u32>> = Mutex::new(Vec::new());

fn owned() -> MutexGuard<'static, Vec<u32>> {
    OWNED.lock().unwrap_or_else(|p| p.into_inner())
}

/// Spawns `cmd` with its pid registered as waited for by its spawner,
/// until the [`Owned`] guard returned beside it is dropped (after the wait).
pub fn spawn_owned(
    cmd: &mut std::process::Command,
) -> std::io::Result<(std::process::Child, Owned)> {
    let mut list = owned();
    let child = cmd.spawn()?;
    let pid = child.id();
    list.push(pid);
    Ok((child, Owned(pid)))
}

/// A registered child: unregistered when dropped.
pub struct Owned(u32);

impl Drop for Owned {
    fn drop(&mut self) {
        owned().retain(|p| *p != self.0);
    }
}

/// Runs `reap` with the registered pids, none of which may be reaped by
/// it; no child is registered meanwhile.
pub fn with_owned<T>(reap: impl FnOnce(&[u32]) -> T) -> T {
    let list = owned();
    reap(&list)
}
