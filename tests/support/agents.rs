//! The agents `tests/real_agents.rs` drives, as Zed launches them, and
//! how each is pointed at the mock model: its command, its environment,
//! and what differs from agent to agent.

use std::path::Path;
use std::process::Command;

use serde_json::json;

/// The pinned npm agents (scripts/test installs them).
pub const AGENTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/agents/node_modules");
/// Mistral Vibe's virtual environment (scripts/test makes it).
pub const VIBE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/agents/vibe");
/// The copy of its Python scripts/test makes when the original is out of
/// other users' reach (pyenv's under /root).
const VIBE_PYTHON: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/agents/vibe-python");

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Agent {
    Codex,
    Claude,
    /// `@zed-industries/claude-code-acp` 0.16.2, the adapter Zed installed
    /// before the rename (still on many machines): Claude Code 2.1.44, run
    /// as `node .../claude-agent-sdk/cli.js`, which saves `~/.claude.json`
    /// through a temporary file opened with `O_CREAT|O_TRUNC`.
    ClaudeLegacy,
    Gemini,
    /// Qwen Code 0.15.10, the last release that runs on Node 20.
    Qwen,
    /// OpenCode, a native binary (no `node` launch form).
    OpenCode,
    /// Mistral Vibe 2.26.1, a Python package (3.0 pins a certifi the
    /// registry does not have).
    Vibe,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Launch {
    /// The package's bin name, found on PATH (an npm `.bin` shim).
    BinName,
    /// `node <prefix>/<package>/<script>`, as editors start npm agents.
    NodeScript,
}

/// The backend command as the README's `agent_servers` blocks give it.
/// Codex's own sandbox is turned off: it cannot nest inside ours, and ours
/// is the one that holds.
pub fn readme_backend(agent: Agent, launch: Launch) -> Vec<String> {
    let mut argv: Vec<String> = match (agent, launch) {
        (Agent::Codex, Launch::BinName) => vec!["codex-acp".into()],
        (Agent::Codex, Launch::NodeScript) => vec![
            "node".into(),
            format!("{AGENTS}/@zed-industries/codex-acp/bin/codex-acp.js"),
        ],
        (Agent::Claude, Launch::BinName) => vec!["claude-agent-acp".into()],
        (Agent::Claude, Launch::NodeScript) => vec![
            "node".into(),
            format!("{AGENTS}/@agentclientprotocol/claude-agent-acp/dist/index.js"),
        ],
        (Agent::Gemini, Launch::BinName) => vec!["gemini".into(), "--acp".into()],
        (Agent::Gemini, Launch::NodeScript) => vec![
            "node".into(),
            format!("{AGENTS}/@google/gemini-cli/bundle/gemini.js"),
            "--acp".into(),
        ],
        (Agent::Vibe, Launch::BinName) => vec!["vibe-acp".into()],
        // Its script by its interpreter, as `uv run` or an editor starts it.
        (Agent::Vibe, Launch::NodeScript) => vec![
            format!("{VIBE}/bin/python3"),
            format!("{VIBE}/bin/vibe-acp"),
        ],
        (Agent::OpenCode, Launch::BinName) => vec!["opencode".into(), "acp".into()],
        // Its binary by its path, as a release download is started.
        (Agent::OpenCode, Launch::NodeScript) => vec![
            format!("{AGENTS}/opencode-ai/bin/opencode.exe"),
            "acp".into(),
        ],
        (Agent::Qwen, Launch::BinName) => vec!["qwen".into(), "--acp".into()],
        (Agent::Qwen, Launch::NodeScript) => vec![
            "node".into(),
            format!("{AGENTS}/@qwen-code/qwen-code/cli.js"),
            "--acp".into(),
        ],
        (Agent::ClaudeLegacy, Launch::BinName) => vec!["claude-code-acp".into()],
        (Agent::ClaudeLegacy, Launch::NodeScript) => vec![
            "node".into(),
            format!("{AGENTS}/@zed-industries/claude-code-acp/dist/index.js"),
        ],
    };
    if agent == Agent::Codex {
        argv.extend(["-c".into(), "sandbox_mode=\"danger-full-access\"".into()]);
    }
    argv
}

/// The backend command for a test: the README's, pointed at the mock
/// model (codex is told through `-c`, so its state directory need not
/// exist before its first run).
pub fn backend(agent: Agent, launch: Launch, model_url: &str) -> Vec<String> {
    let mut argv = readme_backend(agent, launch);
    if agent == Agent::Qwen {
        // Its OpenAI-compatible provider, as `qwen auth` would choose it.
        argv.extend(["--auth-type".into(), "openai".into()]);
    }
    if agent == Agent::Codex {
        for c in [
            "model=\"gpt-5.2-codex\"".to_owned(),
            "model_provider=\"mock\"".to_owned(),
            format!(
                "model_providers.mock={{name=\"mock\",base_url=\"{}/v1\",wire_api=\"responses\",env_key=\"MOCK_API_KEY\"}}",
                model_url
            ),
            "approval_policy=\"never\"".to_owned(),
        ] {
            argv.extend(["-c".into(), c]);
        }
    }
    argv
}

/// The agent's environment: only what a user's editor would pass, with
/// the test's home and a dummy key for the mock.
pub fn agent_env(agent: Agent, home: &Path, model_url: &str) -> Vec<(String, String)> {
    let node_dir = Path::new(&which("node")).parent().unwrap().to_owned();
    let mut env = vec![(
        "PATH".to_owned(),
        format!(
            "{AGENTS}/.bin:{}:/usr/local/bin:/usr/bin:/bin",
            node_dir.display()
        ),
    )];
    if agent == Agent::Vibe {
        // Where `uv tool install` would put `vibe-acp`; for Vibe only (its
        // `python3` must not become the others').
        env[0].1 = format!("{VIBE}/bin:{}", env[0].1);
    }
    match agent {
        Agent::Codex => {
            env.push((
                "CODEX_HOME".into(),
                home.join(".codex").display().to_string(),
            ));
            env.push(("MOCK_API_KEY".into(), "dummy".into()));
        }
        Agent::Vibe => {
            env.push(("MISTRAL_API_KEY".into(), "dummy".into()));
            // The copied Python's run path names the original's library,
            // which another user cannot reach.
            let lib = Path::new(VIBE_PYTHON).join("lib");
            if lib.is_dir() {
                env.push(("LD_LIBRARY_PATH".into(), lib.display().to_string()));
            }
            // Its Mistral provider pointed at the mock, by its settings'
            // environment layer, so that its first run has no config file.
            let providers = json!([{
                "name": "mistral",
                "api_base": format!("{}/v1", model_url),
                "api_key_env_var": "MISTRAL_API_KEY",
                "backend": "mistral",
            }]);
            env.push(("VIBE_PROVIDERS".into(), providers.to_string()));
            // Its own service (managed config, sessions) at the mock too,
            // and no telemetry or experiments: nothing leaves here.
            for key in ["VIBE_VIBE_BASE_URL", "VIBE_VIBE_CODE_SESSIONS_BASE_URL"] {
                env.push((key.into(), model_url.to_owned()));
            }
            env.push(("VIBE_ENABLE_TELEMETRY".into(), "false".into()));
        }
        Agent::OpenCode => {
            // The mock as an OpenAI-compatible provider, given inline so
            // that its first run has no config file.
            let config = json!({
                "model": "mock/mock-model",
                "autoupdate": false,
                "share": "disabled",
                "provider": {"mock": {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": "Mock",
                    "options": {"baseURL": format!("{}/v1", model_url), "apiKey": "dummy"},
                    "models": {"mock-model": {"name": "Mock", "tool_call": true}},
                }},
            });
            env.push(("OPENCODE_CONFIG_CONTENT".into(), config.to_string()));
            env.push(("OPENCODE_DISABLE_MODELS_FETCH".into(), "1".into()));
            env.push(("OPENCODE_DISABLE_AUTOUPDATE".into(), "1".into()));
            env.push(("OPENCODE_DISABLE_DEFAULT_PLUGINS".into(), "1".into()));
            env.push(("OPENCODE_DISABLE_LSP_DOWNLOAD".into(), "1".into()));
            // It installs its plugin package with npm at start: from the
            // cache only, and from no registry, so nothing leaves here.
            env.push(("npm_config_offline".into(), "true".into()));
            env.push(("npm_config_registry".into(), "http://127.0.0.1:9/".into()));
        }
        Agent::Qwen => {
            env.push(("OPENAI_BASE_URL".into(), format!("{}/v1", model_url)));
            env.push(("OPENAI_API_KEY".into(), "dummy".into()));
            env.push(("OPENAI_MODEL".into(), "qwen3-coder-plus".into()));
            // Its usage statistics go to a host of Alibaba's RUM service,
            // which the sandbox asks about (docs/agents.md); off here, from
            // the system settings, so that its first run has no state.
            env.push(system_settings(
                home,
                "QWEN_CODE_SYSTEM_SETTINGS_PATH",
                "qwen-system-settings.json",
            ));
        }
        Agent::Gemini => {
            env.push(("GOOGLE_GEMINI_BASE_URL".into(), model_url.to_owned()));
            env.push(("GEMINI_API_KEY".into(), "dummy".into()));
            // Its usage statistics go to play.googleapis.com, which the
            // sandbox asks about (docs/agents.md); off here, from the system
            // settings, so that its first run has no state.
            env.push(system_settings(
                home,
                "GEMINI_CLI_SYSTEM_SETTINGS_PATH",
                "gemini-system-settings.json",
            ));
        }
        Agent::Claude | Agent::ClaudeLegacy => {
            env.push(("ANTHROPIC_BASE_URL".into(), model_url.to_owned()));
            env.push(("ANTHROPIC_API_KEY".into(), "dummy".into()));
            env.push((
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC".into(),
                "1".into(),
            ));
            // Claude refuses to run as root unless told it is sandboxed.
            env.push(("IS_SANDBOX".into(), "1".into()));
        }
    }
    env
}

/// A system settings file (of Gemini CLI's kind) that turns usage
/// statistics off, and the variable that names it.
fn system_settings(home: &Path, variable: &str, name: &str) -> (String, String) {
    let settings = home.join(name);
    std::fs::write(
        &settings,
        r#"{"privacy": {"usageStatisticsEnabled": false}}"#,
    )
    .unwrap();
    (variable.to_owned(), settings.display().to_string())
}

pub fn which(program: &str) -> String {
    let out = Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

impl Agent {
    /// Every agent the tests drive.
    pub const ALL: [Agent; 7] = [
        Agent::Codex,
        Agent::Claude,
        Agent::ClaudeLegacy,
        Agent::Gemini,
        Agent::Qwen,
        Agent::OpenCode,
        Agent::Vibe,
    ];

    /// Where the agent keeps its state (made on its first run).
    pub fn state_dir(self) -> &'static str {
        match self {
            Agent::Codex => ".codex",
            Agent::Claude | Agent::ClaudeLegacy => ".claude",
            Agent::Gemini => ".gemini",
            Agent::Qwen => ".qwen",
            Agent::OpenCode => ".local/share/opencode",
            Agent::Vibe => ".vibe",
        }
    }

    /// Whether the tests point the agent at the mock with a base-URL
    /// variable its profile names (`policy::agents`), which the default
    /// list reaches with no question.
    pub fn model_url_in_its_env(self) -> bool {
        matches!(
            self,
            Agent::Claude | Agent::ClaudeLegacy | Agent::Gemini | Agent::Qwen
        )
    }

    /// Whether the agent's shell tool shows the editor nothing of what a
    /// command printed (its profile's `quiet_shell`): Gemini CLI 0.61.
    pub fn quiet_shell(self) -> bool {
        self == Agent::Gemini
    }

    /// Whether the agent restores every session it saved (`session/load`),
    /// as a re-arm needs. Gemini CLI 0.61 does not when the load comes in
    /// the same clock minute as the session began: it names a session's
    /// file by that minute and the session's id, and on load records the
    /// session anew (into that very file) before it reads it back, so the
    /// conversation it reads is empty ("No previous sessions found").
    pub fn reloads_its_sessions(self) -> bool {
        self != Agent::Gemini
    }

    /// Whether the agent's own edit tool writes outside its workspace when
    /// the sandbox lets it. Gemini CLI 0.61 never does ("Path not in
    /// workspace"), sandbox or not.
    pub fn edits_outside_the_workspace(self) -> bool {
        self != Agent::Gemini
    }

    /// Whether the agent can make a new file through an editor that
    /// answers a read of a missing file with an error. Gemini CLI 0.61
    /// cannot: it tells a missing file from other errors by the error's
    /// class, which a JSON-RPC error object never has ("Error checking
    /// existing file"), so its tests offer it no editor writes.
    pub fn creates_through_the_editor(self) -> bool {
        self != Agent::Gemini
    }
}
