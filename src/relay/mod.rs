//! Framing, the JSON-RPC envelope, and the bridge's error codes.

pub mod budget;
pub mod codes;
pub mod envelope;
pub mod framing;
pub mod splice;

pub use envelope::{Frame, FrameKind, RawId};
