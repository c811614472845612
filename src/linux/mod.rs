//! Linux enforcement: user+mount namespaces, a PID namespace with an init
//! of ours, and Landlock, built from the same policy as everything else.

pub mod enforce;
pub mod exec;
pub mod helper;
pub mod hold;
pub mod join;
pub mod layers;
pub mod listening;
pub mod net;
pub mod plan;
pub mod seccomp;
pub mod supervise;
mod sys;

pub use sys::{landlock_abi, open_dir_without_symlinks};
