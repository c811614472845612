//! Framing, the JSON-RPC envelope, and the bridge's error codes.

pub mod budget;
pub mod codes;
pub mod envelope;
pub mod framing;
pub mod pipes;
#[cfg(target_os = "linux")]
pub mod polled;
pub mod splice;
pub mod writer;

pub use envelope::{Frame, FrameKind, RawId};
