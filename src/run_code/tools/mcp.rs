//! The session's MCP servers as tools a run may call: their definitions
//! come in a file only the user can read (`--servers FILE`; written by the
//! bridge from the editor's `mcpServers`, which can hold secrets in their
//! environment or headers, so never in argv or the environment), and this
//! server connects to each, on first use, as an MCP client.
//!
//! What it starts is started where this server runs: inside the agent's
//! sandbox when the bridge armed one, as the agent starts the same servers.

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::RunningService;
use rmcp::transport::TokioChildProcess;
use rmcp::{RoleClient, ServiceExt};
use serde_json::Value;

use super::rpc::Caller;
use super::{ToolFailure, ToolSpec};

/// How long a server may take to start and answer `initialize`.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);

/// One server the editor gave the session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerDef {
    Stdio {
        name: String,
        command: String,
        args: Vec<String>,
        env: Vec<(String, String)>,
    },
    /// Known but not reachable from here (HTTP and SSE servers, for now).
    Unsupported { name: String, why: String },
}

impl ServerDef {
    pub fn name(&self) -> &str {
        match self {
            ServerDef::Stdio { name, .. } | ServerDef::Unsupported { name, .. } => name,
        }
    }
}

/// Reads the definitions (ACP's `McpServer` list, as JSON).
pub fn parse_servers(text: &str) -> Result<Vec<ServerDef>, String> {
    let list: Vec<Value> =
        serde_json::from_str(text).map_err(|e| format!("not a JSON list of MCP servers: {e}"))?;
    let mut out = Vec::new();
    for entry in list {
        let Some(name) = entry.get("name").and_then(Value::as_str) else {
            return Err("an MCP server entry has no name".into());
        };
        let kind = entry.get("type").and_then(Value::as_str).unwrap_or("stdio");
        if kind != "stdio" {
            out.push(ServerDef::Unsupported {
                name: name.to_owned(),
                why: format!(
                    "{kind} MCP servers cannot be reached from run_code yet; only stdio ones"
                ),
            });
            continue;
        }
        let Some(command) = entry.get("command").and_then(Value::as_str) else {
            return Err(format!("the MCP server {name:?} has no command"));
        };
        let strings = |v: Option<&Value>| -> Vec<String> {
            v.and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_str)
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default()
        };
        let env = entry
            .get("env")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|e| {
                        Some((
                            e.get("name")?.as_str()?.to_owned(),
                            e.get("value")?.as_str()?.to_owned(),
                        ))
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.push(ServerDef::Stdio {
            name: name.to_owned(),
            command: command.to_owned(),
            args: strings(entry.get("args")),
            env,
        });
    }
    Ok(out)
}

/// Reads the definitions file; warns when others could read it.
pub fn load(path: &Path) -> anyhow::Result<Vec<ServerDef>> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path)
        .map_err(|e| anyhow::anyhow!("cannot read the MCP servers file {}: {e}", path.display()))?;
    if meta.mode() & 0o077 != 0 {
        tracing::warn!(
            "{} can be read by others than you, and MCP server definitions can hold secrets: chmod 600 it",
            path.display()
        );
    }
    let text = std::fs::read_to_string(path)?;
    parse_servers(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

struct Connection {
    client: RunningService<RoleClient, ()>,
    tools: Vec<ToolSpec>,
}

/// A server's connection, once made.
type ServerCell = tokio::sync::Mutex<Option<Arc<Connection>>>;

/// The servers, connected on first use and kept for this server's life.
pub struct McpTools {
    servers: Vec<ServerDef>,
    workspace: PathBuf,
    /// One cell per server: connecting to a slow one holds up only the
    /// runs that use it.
    connected: std::sync::Mutex<HashMap<String, Arc<ServerCell>>>,
}

impl McpTools {
    pub fn new(servers: Vec<ServerDef>, workspace: PathBuf) -> McpTools {
        McpTools {
            servers,
            workspace,
            connected: Default::default(),
        }
    }

    pub fn server_names(&self) -> Vec<&str> {
        self.servers.iter().map(ServerDef::name).collect()
    }

    async fn connection(&self, server: &str) -> Result<Arc<Connection>, String> {
        let cell = self
            .connected
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(server.to_owned())
            .or_default()
            .clone();
        let mut cell = cell.lock().await;
        if let Some(c) = cell.as_ref() {
            if !c.client.is_transport_closed() {
                return Ok(c.clone());
            }
        }
        // Starting, initializing and listing, under one clock: a server
        // that hangs fails the call, not the server's other runs.
        let c = tokio::time::timeout(CONNECT_TIMEOUT, self.connect(server))
            .await
            .map_err(|_| {
                format!(
                    "the MCP server {server} did not start and list its tools within {} s",
                    CONNECT_TIMEOUT.as_secs()
                )
            })??;
        *cell = Some(c.clone());
        Ok(c)
    }

    async fn connect(&self, server: &str) -> Result<Arc<Connection>, String> {
        let def = self
            .servers
            .iter()
            .find(|s| s.name() == server)
            .ok_or_else(|| {
                format!(
                    "the session has no MCP server {server:?} (it has: {})",
                    self.server_names().join(", ")
                )
            })?;
        let ServerDef::Stdio {
            command, args, env, ..
        } = def
        else {
            let ServerDef::Unsupported { why, .. } = def else {
                unreachable!()
            };
            return Err(format!("{server}: {why}"));
        };
        let mut cmd = tokio::process::Command::new(command);
        // This server's environment, as the agent would give it, but never
        // the editor's token (taken out of the environment at start; here
        // too, should it have come back).
        cmd.args(args)
            .env_remove(super::editor::TOKEN_ENV)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .current_dir(&self.workspace)
            .kill_on_drop(true);
        let transport = TokioChildProcess::new(cmd)
            .map_err(|e| format!("cannot start the MCP server {server} ({command}): {e}"))?;
        let client = ()
            .serve(transport)
            .await
            .map_err(|e| format!("the MCP server {server} did not initialize: {e}"))?;
        let listed = client
            .list_all_tools()
            .await
            .map_err(|e| format!("the MCP server {server} did not list its tools: {e}"))?;
        let tools = listed
            .into_iter()
            .map(|t| ToolSpec {
                name: format!("{server}.{}", t.name),
                description: t.description.as_deref().unwrap_or("").to_owned(),
                input_schema: Value::Object((*t.input_schema).clone()),
            })
            .collect();
        Ok(Arc::new(Connection { client, tools }))
    }

    /// The specs of `names` (`server.tool` each), connecting the servers
    /// they name; an error names what is unknown and what there is.
    pub async fn specs(&self, names: &[String]) -> Result<Vec<ToolSpec>, String> {
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            let Some((server, _)) = name.split_once('.') else {
                return Err(format!(
                    "{name:?} is not a tool name; tools are named server.tool (see which_tools)"
                ));
            };
            let c = self.connection(server).await?;
            match c.tools.iter().find(|t| &t.name == name) {
                Some(t) => out.push(t.clone()),
                None => {
                    return Err(format!(
                        "the MCP server {server} has no tool {name:?} (it has: {})",
                        c.tools
                            .iter()
                            .map(|t| t.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ))
                }
            }
        }
        Ok(out)
    }

    /// Every server's tools, and why any server's could not be listed.
    pub async fn all(&self) -> (Vec<ToolSpec>, Vec<String>) {
        let (mut tools, mut failed) = (Vec::new(), Vec::new());
        for name in self.server_names() {
            match self.connection(name).await {
                Ok(c) => tools.extend(c.tools.iter().cloned()),
                Err(e) => failed.push(e),
            }
        }
        (tools, failed)
    }
}

/// What a tool answered, as the script gets it: its structured content
/// when it gave one; otherwise its text (one block: a string; several: a
/// list), with any other block as its JSON.
pub fn answer_value(r: CallToolResult) -> Result<Value, ToolFailure> {
    let texts: Vec<Option<String>> = r
        .content
        .iter()
        .map(|c| c.as_text().map(|t| t.text.clone()))
        .collect();
    if r.is_error == Some(true) {
        let why: Vec<String> = texts.into_iter().flatten().collect();
        return Err(ToolFailure::new("tool_error", why.join("\n")));
    }
    if let Some(v) = r.structured_content {
        return Ok(v);
    }
    let mut items: Vec<Value> = r
        .content
        .iter()
        .zip(texts)
        .map(|(c, t)| match t {
            Some(t) => Value::String(t),
            None => serde_json::to_value(c).unwrap_or(Value::Null),
        })
        .collect();
    Ok(match items.len() {
        0 => Value::Null,
        1 => items.remove(0),
        _ => Value::Array(items),
    })
}

impl Caller for McpTools {
    fn call<'a>(
        &'a self,
        tool: &'a str,
        args: Value,
    ) -> Pin<Box<dyn Future<Output = Result<Value, ToolFailure>> + Send + 'a>> {
        Box::pin(async move {
            let (server, name) = tool.split_once('.').ok_or_else(|| {
                ToolFailure::new("bad_request", format!("{tool:?} names no server"))
            })?;
            let c = self
                .connection(server)
                .await
                .map_err(|e| ToolFailure::new("unavailable", e))?;
            let Value::Object(args) = args else {
                return Err(ToolFailure::new(
                    "bad_request",
                    "arguments must be an object",
                ));
            };
            let params = CallToolRequestParams::new(name.to_owned()).with_arguments(args);
            let r = c
                .client
                .call_tool(params)
                .await
                .map_err(|e| ToolFailure::new("unavailable", format!("{tool}: {e}")))?;
            answer_value(r)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acp_server_entries_are_read_and_remote_ones_said_unsupported() {
        let defs = parse_servers(
            r#"[{"name":"fs","command":"/bin/fs","args":["-v"],"env":[{"name":"TOKEN","value":"s"}]},
                {"type":"http","name":"web","url":"https://x","headers":[]}]"#,
        )
        .unwrap();
        assert_eq!(
            defs[0],
            ServerDef::Stdio {
                name: "fs".into(),
                command: "/bin/fs".into(),
                args: vec!["-v".into()],
                env: vec![("TOKEN".into(), "s".into())]
            }
        );
        assert!(matches!(&defs[1], ServerDef::Unsupported { why, .. } if why.contains("http")));
        assert!(parse_servers(r#"[{"command":"x"}]"#).is_err());
        assert!(parse_servers("{}").is_err());
    }
}
