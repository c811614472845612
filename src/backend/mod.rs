//! Backend processes: how a generation is spawned, watched and stopped.

pub mod generation;
pub mod hold;
#[cfg(target_os = "linux")]
pub mod keeper;

pub mod spawn;

pub use generation::{BackendEvent, EventSender, Generation};
pub use spawn::{PreparedCommand, SpawnError};

/// Makes this process a child subreaper (Linux), so processes an old
/// generation double-forked or `setsid`-ed away are re-parented to the
/// bridge, where it can still find and kill them. Elsewhere the process
/// group is the best the bridge can do.
pub fn become_subreaper() {
    #[cfg(target_os = "linux")]
    if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
        tracing::warn!("could not become a child subreaper ({e}); processes that leave the backend's process group may outlive it");
    }
}
