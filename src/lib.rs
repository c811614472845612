//! zcode-acp: an ACP bridge that sits between an editor and an agent
//! backend, relays every message both ways, and keeps the editor connection
//! alive while backend generations are restarted (to re-arm a sandbox, or
//! after a crash).

pub mod audit;
pub mod backend;
pub mod bridge;
pub mod children;
pub mod commands;
pub mod config;
pub mod confine;
pub mod demo;
#[cfg(target_os = "linux")]
pub mod linux;
pub mod listing;
pub mod logging;
pub mod network;
pub mod policy;
pub mod procs;
pub mod relay;
pub mod run_code;
pub mod seatbelt;
pub mod session;
pub mod shell_agent;
