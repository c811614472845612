//! JSON-RPC error codes the bridge answers with.
//!
//! The standard codes come from JSON-RPC 2.0 and ACP. The bridge's own codes
//! sit in the implementation-defined server range (-32000..=-32099), away
//! from the codes ACP itself assigns (-32000 auth required, -32002 resource
//! not found), so an editor can tell the bridge's answers from the agent's.

pub const PARSE_ERROR: i64 = -32700;
pub const INVALID_REQUEST: i64 = -32600;
/// JSON-RPC's own: the bridge could not handle what it was given.
pub const INTERNAL_ERROR: i64 = -32603;
/// ACP's code for a request cancelled through `$/cancel_request`.
pub const REQUEST_CANCELLED: i64 = -32800;
/// ACP's code for "authentication required".
pub const AUTH_REQUIRED: i64 = -32000;

/// The agent backend exited while this request was in flight. The bridge
/// restarts it and restores the sessions; the request itself is not retried
/// (it may have had side effects), so the editor may send it again.
pub const BACKEND_CRASHED: i64 = -32090;
/// The agent backend crashed repeatedly and the bridge stopped restarting
/// it (until its cool-down is over), or it could not be started at all.
pub const BACKEND_UNAVAILABLE: i64 = -32091;
/// The session could not be carried over to a restarted backend.
pub const SESSION_NOT_RESTORED: i64 = -32092;
/// The bridge is shutting down.
pub const SHUTTING_DOWN: i64 = -32093;
/// A frame exceeded `--max-frame-bytes`.
pub const FRAME_TOO_LARGE: i64 = -32094;
/// The session's project asks for the sandbox, which cannot be armed.
pub const SANDBOX_UNAVAILABLE: i64 = -32095;
/// The sandbox policy denies what the agent asked the editor to write.
pub const WRITE_DENIED: i64 = -32096;
/// The agent is being restarted and the queue of what waits for it is full.
pub const QUEUE_FULL: i64 = -32098;
/// The agent asked the editor to do something that would run outside the
/// sandbox, which the armed bridge does not allow (yet).
pub const NOT_WHILE_ARMED: i64 = -32097;
