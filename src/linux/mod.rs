//! Linux enforcement: user+mount namespaces, a PID namespace with an init
//! of ours, and Landlock, built from the same policy as everything else.

pub mod enforce;
pub mod error;
pub mod exec;
pub mod helper;
pub mod hold;
mod idmap;
pub mod join;
pub mod layers;
mod level;
pub mod listening;
mod mounts;
pub mod net;
pub mod plan;
pub mod seccomp;
mod spec;
mod stages;
pub mod supervise;
mod sys;

pub use sys::{landlock_abi, open_dir_without_symlinks};
