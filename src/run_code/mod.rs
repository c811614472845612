//! `run_code`: one code-execution tool, offered to every session through
//! MCP (`zcode-acp mcp`), that runs each call in a fresh process under the
//! same sandbox as everything else zcode-acp starts.
//!
//! One call is one run, and nothing is kept: a fresh per-call directory
//! holds the source (a file, never `-c`), the declared input files and a
//! manifest, and receives the outputs the code leaves in its output
//! directory; it is removed afterwards, whatever happened. The code gets
//! an environment built from an allowlist, no stdin unless given, a
//! wall-clock and a memory ceiling that end its whole process tree, and
//! bounded output that says where it was cut. What confined a run is in
//! every result, and a run nothing confines is refused unless the user
//! accepted that in their config.
//!
//! Pure parts ([`request`], [`egress`], [`capture`]) are apart from what
//! touches processes and disk ([`stage`], [`tree`], [`confinement`],
//! [`runner`]); [`server`] is the MCP face, on [`stdio`].

pub mod capture;
pub mod confinement;
pub mod egress;
pub mod inject;
pub mod interpreters;
pub mod request;
pub mod result;
pub mod runner;
pub mod server;
pub mod settings;
pub mod stage;
pub mod stdio;
pub mod tools;
pub mod tree;

pub use request::Language;
