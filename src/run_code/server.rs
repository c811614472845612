//! `zcode-acp mcp`: the `run_code` and `which_languages` tools as an MCP
//! server on stdio, built on the official Rust MCP SDK (`rmcp`). Usable
//! through the bridge (which adds it to every session's `mcpServers` when
//! code execution is turned on) and on its own, by any MCP client.

use std::path::PathBuf;
use std::sync::Arc;

use base64::Engine;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ResourceContents, ServerCapabilities, ServerConfig,
    Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::{json, Value};

use super::result::{ErrorCode, RunResult};
use super::runner::Runner;

/// The server: one runner for one workspace.
#[derive(Clone)]
pub struct CodeServer {
    runner: Arc<Runner>,
}

#[derive(Debug, clap::Args)]
pub struct McpArgs {
    /// The session's workspace: the code's working directory, and where it
    /// may write (default: the current directory).
    #[arg(long, value_name = "DIR")]
    pub workspace: Option<PathBuf>,
    /// The session's MCP servers (ACP's `mcpServers` list, as JSON, in a
    /// file only you can read): their tools become callable from code
    /// (run_code's `tools`). The bridge writes this file for each session.
    #[arg(long, value_name = "FILE")]
    pub servers: Option<PathBuf>,
    /// The bridge's socket for this session's editor (written by the
    /// bridge): code can read and write the editor's files through it.
    #[arg(long, value_name = "SOCKET", hide = true)]
    pub editor: Option<PathBuf>,
    /// What the editor offers through that socket (`read_text_file`,
    /// `write_text_file`).
    #[arg(long, value_name = "WHAT", value_delimiter = ',', hide = true)]
    pub editor_can: Vec<String>,
}

/// Decides the confinement (it forks to probe the kernel, so this runs
/// before the async runtime's threads exist) and builds the runner.
pub fn prepare(args: &McpArgs) -> anyhow::Result<Runner> {
    // First, before anything is started: nothing this server starts may
    // inherit the editor's token.
    let editor_token = super::tools::editor::take_token();
    let workspace = match &args.workspace {
        Some(w) => crate::policy::gather::workspaces(std::slice::from_ref(w))?.remove(0),
        None => std::env::current_dir()?,
    };
    let user = crate::config::load_user_config()?;
    let settings = super::settings::RunCodeSettings::from_user_config(&user)?;
    let confiner = super::confinement::Confiner::detect(&workspace, settings.allow_unconfined);
    if let Some(why) = confiner.refusal() {
        tracing::warn!("run_code cannot confine runs here, so every run is refused: {why}");
    }
    let limits = settings.tool_limits();
    let runner = Runner::new(workspace.clone(), settings, confiner);
    let mut toolbox = super::tools::Toolbox::default();
    if let Some(file) = &args.servers {
        // A file that cannot be read costs its tools, not the server.
        match super::tools::mcp::load(file) {
            Ok(servers) => {
                toolbox.mcp = Some(super::tools::mcp::McpTools::new(servers, workspace.clone()))
            }
            Err(e) => tracing::warn!("{e:#}; runs get no MCP tools"),
        }
    }
    if let Some(socket) = &args.editor {
        toolbox.editor = Some(super::tools::editor::EditorLink::new(
            socket.clone(),
            workspace,
            &args.editor_can,
            editor_token,
        ));
    }
    Ok(if toolbox.mcp.is_some() || toolbox.editor.is_some() {
        runner.with_tools(toolbox, limits)
    } else {
        runner
    })
}

/// Serves MCP on stdin/stdout until the client goes. A request longer
/// than the SDK reads is answered too (see [`super::stdio`]).
pub async fn serve(runner: Runner) -> anyhow::Result<()> {
    let confinement = runner.confinement();
    let server = CodeServer {
        runner: Arc::new(runner),
    };
    let (input, output, written) = super::stdio::guard(
        Box::pin(tokio::io::stdin()),
        Box::pin(tokio::io::stdout()),
        move |over| oversized_answer(&over, &confinement),
    );
    let transport = rmcp::transport::async_rw::AsyncRwTransport::new_server(input, output)
        .with_max_line_length(super::stdio::MAX_LINE);
    let running = server
        .serve(transport)
        .await
        .map_err(|e| anyhow::anyhow!("the MCP client did not initialize: {e}"))?;
    running.waiting().await?;
    // The last frames the SDK wrote reach stdout (the SDK has let go of
    // its end by now; bounded all the same, so that exiting never hangs).
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), written).await;
    Ok(())
}

/// The answer to a request too long to be read: for a tool call, a
/// refusal the model reads (`bad_request`), as every other one; for any
/// other request, a JSON-RPC error. None for a notification (no id).
fn oversized_answer(over: &super::stdio::Oversized, confinement: &str) -> Option<Vec<u8>> {
    let id = over.id.clone()?;
    let message = format!(
        "the request is {} bytes as sent, more than the {} this server reads; send less: the source up to {} bytes, stdin up to {}, the files up to {} in all, and all of it as sent (JSON escaping included: a newline is sent as 2 bytes, another control character as 6); larger data is better left in the workspace for the code to read",
        over.bytes,
        super::stdio::MAX_LINE,
        super::request::MAX_SOURCE_BYTES,
        super::request::MAX_STDIN_BYTES,
        super::request::MAX_FILES_BYTES,
    );
    let frame = if over.method.as_deref() == Some("tools/call") {
        let result = RunResult::refused("", confinement.to_owned(), ErrorCode::BadRequest, message);
        let mut out = CallToolResult::error(vec![ContentBlock::text(result.text())]);
        out.structured_content = serde_json::to_value(&result).ok();
        json!({"jsonrpc": "2.0", "id": id, "result": out})
    } else {
        json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32600, "message": message}})
    };
    serde_json::to_vec(&frame).ok()
}

impl CodeServer {
    fn tools(&self) -> Vec<Tool> {
        let limits = self.runner.limits();
        let run_code = json!({
            "type": "object",
            "properties": {
                "language": {
                    "type": "string",
                    "enum": ["python", "node", "typescript", "bash", "sh"],
                    "description": "The language of `source`."
                },
                "source": {
                    "type": "string",
                    "description": "The program, run from a file (no quoting needed)."
                },
                "timeoutMs": {
                    "type": "integer", "minimum": 1, "maximum": limits.max_timeout_ms,
                    "description": format!("Wall-clock ceiling in milliseconds (default {}).", limits.default_timeout_ms)
                },
                "stdin": {"type": "string", "description": "Given to the program on stdin (default: none)."},
                "tools": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "Tools the code may call, by full name (server.tool; see which_tools). Python: `import zcode_tools`; node/typescript: `import ... from \"zcode-tools\"`. Each tool is a function of its server's group (zcode_tools.fs.list_files({...})), plus result(value) and log(level, message)."
                },
                "files": {
                    "type": "array",
                    "description": "Input files, staged in $ZCODE_RUN_INPUTS and listed in the manifest at $ZCODE_RUN_MANIFEST.",
                    "items": {
                        "type": "object",
                        "properties": {
                            "path": {"type": "string", "description": "Relative path inside the input directory."},
                            "content": {"type": "string"}
                        },
                        "required": ["path", "content"],
                        "additionalProperties": false
                    }
                }
            },
            "required": ["language", "source"],
            "additionalProperties": false
        });
        let description = format!(
            "Run a short program (python, node, typescript, bash or sh) in a fresh process and get back its stdout, stderr, exit code and output files. \
             Nothing is kept between calls: to keep state, write a file. The working directory is the workspace {ws}; \
             files written to $ZCODE_RUN_OUTPUTS are returned (at most {file} bytes each, {total} in all). \
             Limits: {timeout} ms by default, {mem} MiB of memory for the whole process tree, {out} bytes kept of each output stream. \
             Confinement: {conf}. \
             The environment holds only PATH, LANG, TZ and the names the user configured. \
             {tools}",
            ws = self.runner.workspace().display(),
            file = limits.output_file_bytes,
            total = limits.outputs_total_bytes,
            timeout = limits.default_timeout_ms,
            mem = limits.memory_bytes >> 20,
            out = limits.output_bytes,
            tools = match self.runner.tools() {
                Some(t) => {
                    let l = self.runner.tool_limits();
                    format!(
                        "Code can call the tools of this session's MCP servers ({}) in a loop, instead of one model turn per call: list them in `tools` (which_tools lists them); result(value) sets this call's `result` and log(level, message) adds to its `logs`. At most {} tool calls per run, {} bytes per argument or answer, {} ms per call, {} at once; each breach raises a ToolError the code can catch.",
                        t.sources().join(", "), l.max_calls, l.max_bytes, l.call_timeout_ms, l.concurrent
                    )
                }
                None => "No tools are given to this server.".to_owned(),
            },
            conf = match self.runner.confinement().as_str() {
                "none" => "none: nothing confines the code (the user accepted unconfined runs)".to_owned(),
                label => format!("{label}: writes outside the workspace and the run's own directory are refused"),
            },
        );
        vec![
            Tool::new("run_code", description, as_object(run_code)),
            Tool::new(
                "which_tools",
                "The tools code can call from run_code (list them in its `tools`), with their descriptions and input schemas.",
                as_object(json!({"type": "object", "properties": {}, "additionalProperties": false})),
            ),
            Tool::new(
                "which_languages",
                "Which languages run_code can run here, with which interpreter and version (probed once).",
                as_object(json!({"type": "object", "properties": {}, "additionalProperties": false})),
            ),
        ]
    }

    async fn run_code(&self, args: Value) -> CallToolResult {
        let result = self.runner.run(&args).await;
        let mut content = vec![ContentBlock::text(result.text())];
        // Text files are in the text above (and the structured result);
        // other files travel as resources with their MIME type.
        for o in result.outputs.iter().flatten().filter(|o| o.returned) {
            let Some(data) = &o.data else { continue };
            let contents = ResourceContents::blob(
                base64::engine::general_purpose::STANDARD.encode(data),
                format!("run-output:///{}", uri_path(&o.path)),
            );
            content.push(ContentBlock::resource(
                contents.with_mime_type(&o.mime_type),
            ));
        }
        let ok = result.ok;
        let mut out = if ok {
            CallToolResult::success(content)
        } else {
            CallToolResult::error(content)
        };
        out.structured_content = serde_json::to_value(&result).ok();
        out
    }

    async fn which_tools(&self) -> CallToolResult {
        let (tools, failed) = match self.runner.tools() {
            Some(t) => t.all().await,
            None => (Vec::new(), Vec::new()),
        };
        let mut text = String::new();
        for t in &tools {
            text.push_str(&format!(
                "{}: {}\n",
                t.name,
                t.description.lines().next().unwrap_or("")
            ));
        }
        for f in &failed {
            text.push_str(&format!("unavailable: {f}\n"));
        }
        if tools.is_empty() && failed.is_empty() {
            text.push_str("no tools: this session's MCP servers were not given to run_code\n");
        }
        let mut out = CallToolResult::success(vec![ContentBlock::text(text)]);
        out.structured_content = Some(json!({"tools": tools, "unavailable": failed}));
        out
    }

    async fn which_languages(&self) -> CallToolResult {
        let languages: Vec<_> = self.runner.languages().await.values().cloned().collect();
        let mut text = format!("confinement: {}\n", self.runner.confinement());
        for l in &languages {
            if l.available {
                text.push_str(&format!(
                    "{}: {}{}\n",
                    l.language,
                    l.interpreter.join(" "),
                    l.version
                        .as_deref()
                        .map(|v| format!(" ({v})"))
                        .unwrap_or_default()
                ));
            } else {
                text.push_str(&format!(
                    "{}: not available: {}\n",
                    l.language,
                    l.reason.as_deref().unwrap_or("unknown")
                ));
            }
        }
        let mut out = CallToolResult::success(vec![ContentBlock::text(text)]);
        out.structured_content = Some(json!({
            "confinement": self.runner.confinement(),
            "languages": languages,
        }));
        out
    }
}

/// `path` with every byte outside RFC 3986's unreserved set (and `/`)
/// percent-encoded.
fn uri_path(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for b in path.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn as_object(v: Value) -> serde_json::Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => serde_json::Map::new(),
    }
}

impl ServerHandler for CodeServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("zcode-acp-run-code", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "run_code runs one short program per call in a fresh, sandboxed process; which_languages says what can run.",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = Value::Object(request.arguments.clone().unwrap_or_default());
        let result = match request.name.as_ref() {
            // A cancelled call drops its run, which ends the run's tree.
            "run_code" => tokio::select! {
                result = self.run_code(args) => result,
                _ = context.ct.cancelled() => {
                    return Err(ErrorData::internal_error("the call was cancelled; its run was ended", None));
                }
            },
            "which_languages" => self.which_languages().await,
            "which_tools" => self.which_tools().await,
            other => {
                return Err(ErrorData::invalid_params(
                    format!("no tool named {other:?}; the tools are run_code, which_tools and which_languages"),
                    None,
                ))
            }
        };
        Ok(result.into())
    }
}
