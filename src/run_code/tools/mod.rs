//! Code that calls tools: a `run_code` call that lists `tools` gets a
//! per-call JSON-RPC server on a Unix socket in its own directory
//! ([`rpc`]), a generated stub module for its language ([`stubs`]), and
//! exactly the tools it listed, proxied to the session's MCP servers
//! ([`mcp`]). The server, the socket and the stubs end with the run.

mod budget;
mod calls;
pub mod editor;
pub mod mcp;
pub mod rpc;
pub(crate) mod secret;
pub mod stubs;

use std::future::Future;
use std::path::Path;
use std::pin::Pin;

use serde::Serialize;
use serde_json::Value;

use super::Language;

/// The variable that tells the code where its tools socket is.
pub const SOCKET_ENV: &str = "ZCODE_TOOLS_SOCKET";
/// The variable holding the run's own token, which every request on its
/// socket must carry: the socket is on disk where another run of the same
/// agent can reach it, the token only in this run's environment.
pub const TOKEN_ENV: &str = "ZCODE_TOOLS_TOKEN";
/// The socket's name in the call directory (short: see
/// [`rpc::MAX_SOCKET_PATH`]).
pub const SOCKET_NAME: &str = "tools.sock";

/// A tool a run may list: its full name (`server.tool`), what it does and
/// its input schema, as its server described it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    pub input_schema: Value,
}

/// A refused or failed call, as the script's `ToolError` carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolFailure {
    /// `not_allowed`, `call_limit`, `too_large`, `timeout`,
    /// `too_many_at_once`, `tool_error`, `unavailable`, `bad_request`,
    /// `bad_token`.
    pub code: &'static str,
    pub message: String,
}

impl ToolFailure {
    pub fn new(code: &'static str, message: impl Into<String>) -> ToolFailure {
        ToolFailure {
            code,
            message: message.into(),
        }
    }
}

/// The bounds of one run's tool calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToolLimits {
    /// Calls one run may make.
    pub max_calls: u32,
    /// The largest argument object, tool answer or `result()` value, as
    /// JSON bytes.
    pub max_bytes: usize,
    /// How long one call may take.
    pub call_timeout_ms: u64,
    /// Calls in flight at once.
    pub concurrent: usize,
    /// Entries kept in `logs`, and the longest message.
    pub max_logs: usize,
    pub max_log_bytes: usize,
}

impl Default for ToolLimits {
    fn default() -> ToolLimits {
        ToolLimits {
            max_calls: 1000,
            max_bytes: 1 << 20,
            call_timeout_ms: 30_000,
            concurrent: 8,
            max_logs: 1000,
            max_log_bytes: 4096,
        }
    }
}

/// Writes the stub module for `language` into the call directory `dir`.
/// Shells get none: they reach the socket with any client (`nc -U`,
/// `socat`), one JSON-RPC object per line carrying `"token":
/// "$ZCODE_TOOLS_TOKEN"`.
pub fn write_stubs(dir: &Path, language: Language, specs: &[ToolSpec]) -> std::io::Result<()> {
    match language {
        Language::Python => std::fs::write(
            dir.join(format!("{}.py", stubs::PYTHON_MODULE)),
            stubs::python(specs, SOCKET_ENV, TOKEN_ENV),
        ),
        Language::Node | Language::Typescript => {
            let pkg = dir.join("node_modules").join(stubs::NODE_PACKAGE);
            std::fs::create_dir_all(&pkg)?;
            std::fs::write(pkg.join("package.json"), stubs::node_package())?;
            std::fs::write(
                pkg.join("index.mjs"),
                stubs::node_esm(specs, SOCKET_ENV, TOKEN_ENV),
            )?;
            std::fs::write(
                pkg.join("index.cjs"),
                stubs::node_cjs(specs, SOCKET_ENV, TOKEN_ENV),
            )?;
            std::fs::write(pkg.join("index.d.ts"), stubs::node_types(specs))
        }
        Language::Bash | Language::Sh => Ok(()),
    }
}

/// Every tool a run may list: the session's MCP servers' and the editor's.
#[derive(Default)]
pub struct Toolbox {
    pub mcp: Option<mcp::McpTools>,
    pub editor: Option<editor::EditorLink>,
}

impl Toolbox {
    /// Where tools come from, for the tool's description.
    pub fn sources(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .mcp
            .iter()
            .flat_map(|m| m.server_names())
            .map(str::to_owned)
            .collect();
        if self.editor.is_some() {
            out.push("editor".into());
        }
        out
    }

    /// The specs of `names`, in order; an error names what is unknown.
    pub async fn specs(&self, names: &[String]) -> Result<Vec<ToolSpec>, String> {
        let editor = self
            .editor
            .as_ref()
            .map(editor::EditorLink::specs)
            .unwrap_or_default();
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            // With the editor's tools on, `editor.` is theirs (an MCP
            // server called `editor` is then out of reach, and listed so).
            if name.starts_with("editor.") && self.editor.is_some() {
                match editor.iter().find(|s| &s.name == name) {
                    Some(s) => out.push(s.clone()),
                    None => {
                        return Err(format!(
                            "{name:?} is not offered: the editor tools here are {}",
                            if editor.is_empty() {
                                "none (the editor advertised no file access, or run_code was not started by zcode-acp's bridge)".to_owned()
                            } else {
                                editor
                                    .iter()
                                    .map(|s| s.name.as_str())
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            }
                        ))
                    }
                }
                continue;
            }
            let mcp_editor = self
                .mcp
                .as_ref()
                .is_some_and(|m| m.server_names().contains(&"editor"));
            if name.starts_with("editor.") && !mcp_editor {
                return Err(format!(
                    "{name:?} is not offered here: the editor's files reach run_code only through zcode-acp's bridge, where the editor advertised them (and writes only where the bridge arms a sandbox)"
                ));
            }
            let Some(mcp) = &self.mcp else {
                return Err(format!(
                    "{name:?}: this session's MCP servers were not given to run_code"
                ));
            };
            out.extend(mcp.specs(std::slice::from_ref(name)).await?);
        }
        Ok(out)
    }

    /// Every tool, and why any server's could not be listed.
    pub async fn all(&self) -> (Vec<ToolSpec>, Vec<String>) {
        let (mut tools, failed) = match &self.mcp {
            Some(m) => m.all().await,
            None => (Vec::new(), Vec::new()),
        };
        let mut failed = failed;
        if let Some(e) = &self.editor {
            if tools.iter().any(|t| t.name.starts_with("editor.")) {
                failed.push("the MCP server named editor: its tools are out of reach while the editor's own files are offered as editor.*".into());
                tools.retain(|t| !t.name.starts_with("editor."));
            }
            tools.extend(e.specs());
        }
        (tools, failed)
    }
}

impl rpc::Caller for Toolbox {
    fn call<'a>(
        &'a self,
        tool: &'a str,
        args: Value,
    ) -> Pin<Box<dyn Future<Output = Result<Value, ToolFailure>> + Send + 'a>> {
        Box::pin(async move {
            match (&self.editor, &self.mcp) {
                (Some(e), _) if tool.starts_with("editor.") => e.call(tool, args).await,
                (_, Some(m)) => m.call(tool, args).await,
                _ => Err(ToolFailure::new(
                    "unavailable",
                    format!("no source offers {tool}"),
                )),
            }
        })
    }
}

/// A Unix socket at `path`, whatever its length: a path longer than a
/// socket address holds (108 bytes on Linux) is bound through its
/// directory's descriptor (`/proc/self/fd/N/NAME`, which the kernel
/// resolves to the same place); elsewhere such a path is refused, saying
/// so.
pub fn bind_socket(path: &std::path::Path) -> std::io::Result<tokio::net::UnixListener> {
    through_dir(path, |p| tokio::net::UnixListener::bind(p))
}

/// Connects to the socket at `path`, a long path as [`bind_socket`] binds
/// it.
pub async fn connect_socket(path: &std::path::Path) -> std::io::Result<tokio::net::UnixStream> {
    if path.as_os_str().len() <= rpc::MAX_SOCKET_PATH {
        return tokio::net::UnixStream::connect(path).await;
    }
    let (short, _dir) = shortened(path)?;
    tokio::net::UnixStream::connect(short).await
}

fn through_dir<T>(
    path: &std::path::Path,
    act: impl FnOnce(&std::path::Path) -> std::io::Result<T>,
) -> std::io::Result<T> {
    if path.as_os_str().len() <= rpc::MAX_SOCKET_PATH {
        return act(path);
    }
    let (short, _dir) = shortened(path)?;
    act(&short)
}

/// `path` as `/proc/self/fd/N/NAME`, with the directory's descriptor that
/// keeps it valid (Linux).
fn shortened(
    path: &std::path::Path,
) -> std::io::Result<(std::path::PathBuf, std::os::fd::OwnedFd)> {
    let too_long = || {
        std::io::Error::other(format!(
            "the socket's path {} is {} bytes, more than a Unix socket takes ({}); give zcode-acp a shorter home directory",
            path.display(),
            path.as_os_str().len(),
            rpc::MAX_SOCKET_PATH
        ))
    };
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
            return Err(too_long());
        };
        let fd = nix::fcntl::open(
            dir,
            nix::fcntl::OFlag::O_PATH
                | nix::fcntl::OFlag::O_DIRECTORY
                | nix::fcntl::OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        )
        .map_err(std::io::Error::from)?;
        let short = std::path::Path::new(&format!("/proc/self/fd/{}", fd.as_raw_fd())).join(name);
        if short.as_os_str().len() > rpc::MAX_SOCKET_PATH {
            return Err(too_long());
        }
        Ok((short, fd))
    }
    #[cfg(not(target_os = "linux"))]
    {
        Err(too_long())
    }
}
