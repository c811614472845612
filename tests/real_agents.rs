//! Real third-party agents behind the armed bridge, launched the way
//! editors launch them, in a world laid out as a user's: a home directory
//! under /home (not a temp directory), a project in it, and an "outside"
//! folder in the home that the agent must not write. The model is our own
//! mock on 127.0.0.1 (tests/fixtures/mock_model.py), which answers with real
//! tool calls, so each agent runs its own shell and edit tools. Every run
//! starts from an empty environment with the test's own home.
//!
//! The seven agents (tests/support/agents.rs) are pinned in
//! tests/agents/package.json and tests/agents/vibe-requirements.txt and
//! installed by scripts/test. One scenario puts the model on a host beyond
//! a router, in network namespaces of the test's own
//! (tests/common/netns.rs), which the agent reaches through the sandbox's
//! proxy.
#![cfg(target_os = "linux")]

#[path = "support/agents.rs"]
mod agents;
mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use agents::{agent_env, backend, readme_backend, Agent, Launch, AGENTS, VIBE};
use common::{Editor, Options, BIN};
use serde_json::{json, Value};

/// The model's address in the proxy scenario (`netns::a_host_beyond_a_router`).
const BEYOND_A_ROUTER: &str = "198.51.100.2";
const MOCK: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/mock_model.py");
/// Real agents start slower than the fixtures, and CI shares two cores.
const SLOW: Duration = Duration::from_secs(90);

/// Whether the pinned agents are installed and the sandbox can run.
fn ready() -> bool {
    if !common::require_kernel_features() {
        return false;
    }
    if !Path::new(AGENTS).join(".bin/codex-acp").exists() {
        return common::skip(
            "the real agents are not installed (run: npm ci --prefix tests/agents)",
        );
    }
    true
}

// ---- The model

/// Our mock model server, ended (by pid) with the test.
struct Model {
    child: Child,
    address: &'static str,
    port: u16,
    log: PathBuf,
}

impl Model {
    /// In the network namespace of the test's process `ns` (see
    /// `netns`), on its loopback, or on the host beyond a router.
    fn start_at(dir: &Path, ns: u32, beyond: bool) -> Model {
        let log = dir.join("model-requests.jsonl");
        let address = if beyond { BEYOND_A_ROUTER } else { "127.0.0.1" };
        let mut cmd = Command::new("python3");
        cmd.arg(MOCK)
            .arg(&log)
            .arg("600")
            .arg(address)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        let _entered = common::netns::enter(ns, &mut cmd, None);
        let mut child = cmd.spawn().expect("start the mock model");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line.trim().parse().expect("the mock model's port");
        Model {
            child,
            address,
            port,
            log,
        }
    }

    fn url(&self) -> String {
        format!("http://{}:{}", self.address, self.port)
    }

    /// How many model requests carried a directive containing `tag`.
    fn requests_mentioning(&self, tag: &str) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(tag))
            .count()
    }
}

impl Drop for Model {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---- The world

/// A user's machine for one test: the home under /home, a project in it,
/// a second project, and a folder outside every project.
struct World {
    /// Where the bridge and the model run when the test names no other
    /// network: a namespace with only a loopback, so that nothing an
    /// agent tries (telemetry, an update check) leaves this machine.
    net: Option<common::netns::Netns>,
    _dir: tempfile::TempDir,
    home: PathBuf,
    ws: PathBuf,
    other: PathBuf,
    outside: PathBuf,
    model: Model,
}

impl World {
    fn new() -> World {
        World::with_model_at(None)
    }

    /// As [`World::new`], the model on this machine's loopback, or beyond a
    /// router (see [`Model::start_at`]), where the sandbox reaches it through
    /// its proxy. There the user config is only what the agent needs: none
    /// when its model's address is in a base-URL variable of its profile's
    /// (the default list reaches it), else the address in the egress list,
    /// as a user with a custom provider writes it.
    fn with_model_at(beyond: Option<(u32, Agent)>) -> World {
        World::made(beyond, None)
    }

    /// As [`World::new`], for a user the test made: their home in their
    /// directory, theirs.
    fn for_user(user: &common::TestUser) -> World {
        World::made(None, Some(user))
    }

    fn made(beyond: Option<(u32, Agent)>, user: Option<&common::TestUser>) -> World {
        let Some(user) = user else {
            return World::made_in(beyond, common::home_like_a_users("zcode-agents-"));
        };
        let dir = tempfile::Builder::new()
            .prefix("home-")
            .tempdir_in(&user.base)
            .unwrap();
        let w = World::made_in(beyond, dir);
        user.own(&w.home);
        w
    }

    fn made_in(beyond: Option<(u32, Agent)>, dir: tempfile::TempDir) -> World {
        // A user's home is not a temp directory: temp is writable by
        // design, so an "outside" there would prove nothing.
        let home = std::fs::canonicalize(dir.path()).unwrap();
        assert!(!home.starts_with("/tmp") && !home.starts_with("/var/tmp"));
        let ws = home.join("src/project");
        let other = home.join("src/other");
        let outside = home.join("notes");
        for d in [&ws, &other, &outside] {
            std::fs::create_dir_all(d).unwrap();
        }
        let net = beyond.is_none().then(common::netns::only_a_loopback);
        let model = match (&net, beyond) {
            (Some(net), _) => Model::start_at(&home, net.pid(), false),
            (None, Some((internet, _))) => Model::start_at(&home, internet, true),
            (None, None) => unreachable!("a world has a network"),
        };
        // The mock model listens on the host's loopback, which the sandbox
        // closes by default: allowed the way a user allows a local model
        // server, with one line of the user config.
        let config = home.join(".config/zcode-acp");
        std::fs::create_dir_all(&config).unwrap();
        let network = match beyond {
            None => Some(json!({"hostLoopback": [model.port]})),
            Some((_, agent)) if agent.model_url_in_its_env() => None,
            Some(_) => Some(json!({"egress": [BEYOND_A_ROUTER]})),
        };
        if let Some(network) = network {
            std::fs::write(
                config.join("config.json"),
                format!("{}\n", json!({ "network": network })),
            )
            .unwrap();
        }
        World {
            net,
            _dir: dir,
            home,
            ws,
            other,
            outside,
            model,
        }
    }
}

/// The README's quick-start `agent_servers` blocks for codex and Claude
/// are the commands these tests run (read from the README itself, so the
/// two cannot drift apart).
#[test]
fn the_readmes_zed_blocks_are_the_ones_tested() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let section = &readme[readme.find("## Quick start").expect("the quick start")..];
    let start = section.find("```json\n").expect("a json block") + "```json\n".len();
    let block = &section[start..start + section[start..].find("```").unwrap()];
    let servers: Value = serde_json::from_str(&format!("{{{block}}}")).expect("the block is JSON");
    for (name, agent) in [
        ("Codex (sandboxed)", Agent::Codex),
        ("Claude (sandboxed)", Agent::Claude),
    ] {
        let entry = &servers["agent_servers"][name];
        assert_eq!(entry["command"], "zcode-acp", "{name}");
        assert_eq!(entry["env"]["ZCODE_ACP_SANDBOX"], "1", "{name}");
        let mut args = vec!["--".to_owned()];
        args.extend(readme_backend(agent, Launch::BinName));
        assert_eq!(entry["args"], json!(args), "{name}");
    }
}

struct Run {
    agent: Agent,
    launch: Launch,
    sandbox: bool,
    /// Whether the editor advertises `fs.writeTextFile` (an agent may route
    /// its edits through the editor when it can).
    editor_writes: bool,
    extra_env: Vec<(String, String)>,
    /// Options for the bridge itself (`--code-exec`).
    bridge_args: Vec<String>,
    /// The bridge starts in the network namespace of this test process
    /// (`netns::a_host_beyond_a_router`'s host).
    host_ns: Option<u32>,
    /// The bridge runs as this user (uid, gid), with this copy of the
    /// binary.
    run_as: Option<(u32, u32, PathBuf)>,
}

impl Run {
    fn new(agent: Agent, launch: Launch) -> Run {
        Run {
            agent,
            launch,
            sandbox: true,
            editor_writes: agent.creates_through_the_editor(),
            extra_env: Vec::new(),
            bridge_args: Vec::new(),
            host_ns: None,
            run_as: None,
        }
    }

    fn start(&self, w: &World) -> Editor {
        let mut opts = Options::new(backend(self.agent, self.launch, &w.model.url()));
        opts.clear_env = true;
        opts.home_at = Some(w.home.clone());
        // As Zed starts an agent: in the project's root (Gemini CLI
        // restores a session only in the project it was started in).
        opts.cwd = Some(w.ws.clone());
        // (A mount namespace of its own is made after the switch to a
        // user, which may not: a user's bridge starts in this one.)
        opts.outer_ns = self.run_as.is_none();
        opts.timeout = SLOW;
        for (k, v) in agent_env(self.agent, &w.home, &w.model.url())
            .into_iter()
            .chain(self.extra_env.clone())
        {
            opts.env.push((k, v));
        }
        if self.sandbox {
            opts = opts.env("ZCODE_ACP_SANDBOX", "1");
        }
        // The bridge's own shutdown ends the agent (codex-acp ignores a
        // closed stdin, so it gets SIGTERM after this grace).
        opts = opts.arg("--stop-grace-ms").arg("1000");
        for a in &self.bridge_args {
            opts = opts.arg(a);
        }
        opts.run_as = self.run_as.clone();
        let ns = self.host_ns.or(w.net.as_ref().map(|n| n.pid()));
        let ids = self.run_as.as_ref().map(|u| (u.0, u.1));
        if let Some(pid) = ns {
            // With a user, the switch to them comes after entering.
            opts.prepare = Some(Box::new(move |cmd| common::netns::enter(pid, cmd, ids)));
        }
        let mut ed = Editor::start_with(opts);
        ed.drop_grace = Duration::from_secs(20);
        ed.call(
            "initialize",
            json!({"protocolVersion": 1, "clientCapabilities": {
                "fs": {"readTextFile": self.editor_writes, "writeTextFile": self.editor_writes},
                "terminal": false}}),
        );
        ed
    }
}

// ---- Turns

/// What one prompt did: the response, and the bridge's own permission
/// prompts (title, the option chosen).
struct Turn {
    response: Value,
    bridge_prompts: Vec<String>,
    text: String,
}

/// Runs a prompt scripted for the mock model. The agent's own permission
/// requests are allowed once; the bridge's are answered `bridge_answer`.
fn turn(ed: &mut Editor, sid: &str, steps: Value, bridge_answer: &str) -> Turn {
    let start = ed.seen.len();
    let text = format!("Please do this.\nzcode-mock: {steps}");
    let id = ed.prompt_request(sid, &text);
    let mut bridge_prompts = Vec::new();
    loop {
        let id2 = id.clone();
        let line = ed.wait_for("the prompt's end or a permission request", move |v| {
            (v.get("id") == Some(&id2) && v.get("method").is_none())
                || v["method"] == "session/request_permission"
        });
        let v = line.value;
        if v.get("method").is_none() {
            let text = ed.agent_text_since(start, sid);
            return Turn {
                response: v,
                bridge_prompts,
                text,
            };
        }
        let call = &v["params"]["toolCall"];
        let option = if call["toolCallId"]
            .as_str()
            .is_some_and(|t| t.starts_with("zcode-acp-"))
        {
            bridge_prompts.push(call["title"].as_str().unwrap_or("").to_owned());
            // A connection is never allowed here, whatever the turn's
            // answer: nothing may leave this machine (and the question
            // itself fails the scenario).
            if call["toolCallId"]
                .as_str()
                .is_some_and(|t| t.starts_with("zcode-acp-network-"))
            {
                "reject-once".to_owned()
            } else {
                bridge_answer.to_owned()
            }
        } else {
            v["params"]["options"]
                .as_array()
                .unwrap()
                .iter()
                .find(|o| o["kind"] == "allow_once")
                .unwrap()["optionId"]
                .as_str()
                .unwrap()
                .to_owned()
        };
        ed.send(&json!({"jsonrpc": "2.0", "id": v["id"], "result": {"outcome": {"outcome": "selected", "optionId": option}}}));
    }
}

fn shell(command: String) -> Value {
    json!({"tool": "shell", "command": command})
}

fn write(path: &Path, content: &str) -> Value {
    json!({"tool": "write", "path": path, "content": content})
}

/// The writes one scenario makes: with the shell tool and the edit tool,
/// each once inside the project and once outside.
struct Writes {
    shell_in: PathBuf,
    shell_out: PathBuf,
    edit_in: PathBuf,
    edit_out: PathBuf,
}

impl Writes {
    fn new(w: &World, tag: &str) -> Writes {
        Writes {
            shell_in: w.ws.join(format!("shell-in-{tag}.txt")),
            shell_out: w.outside.join(format!("shell-out-{tag}.txt")),
            edit_in: w.ws.join(format!("edit-in-{tag}.txt")),
            edit_out: w.outside.join(format!("edit-out-{tag}.txt")),
        }
    }

    fn steps(&self) -> Value {
        json!([
            shell(format!(
                "echo shell-in > {}; echo shell-out > {}",
                self.shell_in.display(),
                self.shell_out.display()
            )),
            write(&self.edit_in, "edit-in"),
            write(&self.edit_out, "edit-out"),
        ])
    }

    /// Checks the disk: inside written, outside not (but the outside edit
    /// when `edit_out_allowed`: the user allowed it once as it was made).
    /// Err says what broke.
    fn inside_only(&self, edit_out_allowed: bool) -> Result<(), String> {
        let mut problems = Vec::new();
        let mut wanted = vec![(&self.shell_in, "shell-in"), (&self.edit_in, "edit-in")];
        if edit_out_allowed {
            wanted.push((&self.edit_out, "edit-out"));
        }
        for (p, want) in wanted {
            match std::fs::read_to_string(p) {
                Ok(t) if t.trim() == want => {}
                Ok(t) => problems.push(format!("{} holds {t:?}", p.display())),
                Err(e) => problems.push(format!("{} was not written: {e}", p.display())),
            }
        }
        for p in [&self.shell_out, &self.edit_out] {
            if p.exists() && !(edit_out_allowed && p == &self.edit_out) {
                problems.push(format!("{} was written outside the project", p.display()));
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("; "))
        }
    }

    fn all_written(&self) -> bool {
        [
            &self.shell_in,
            &self.shell_out,
            &self.edit_in,
            &self.edit_out,
        ]
        .iter()
        .all(|p| p.exists())
    }
}

/// The armed scenario: inside written, outside refused and offered, and
/// after "Allow once" the same write succeeds in the next prompt.
fn armed_scenario(w: &World, run: &Run, tag: &str) {
    let mut ed = run.start(w);
    let sid = ed.new_session(&w.ws);
    let writes = Writes::new(w, tag);
    let start = ed.seen.len();
    let t = turn(&mut ed, &sid, writes.steps(), "allow-once");
    let through_editor: Vec<String> = ed.seen[start..]
        .iter()
        .filter(|l| l.value["method"] == "fs/write_text_file")
        .map(|l| l.value["params"]["path"].to_string())
        .collect();
    // An editor that does not offer its writes is never asked to make one.
    // (Offered, the pinned codex and Claude still write with their own
    // tools, so both variants check those; the editor's writes are judged in
    // code_run_by_codex_writes_through_the_editor_judged_like_the_agent.)
    assert!(
        run.editor_writes || through_editor.is_empty(),
        "{:?}/{:?} {tag}: the editor was asked to write though it offers no writes: {through_editor:?}",
        run.agent,
        run.launch
    );
    assert_eq!(
        t.response["result"]["stopReason"], "end_turn",
        "{}",
        t.response
    );
    // An agent that routes its edits through the editor (the legacy
    // adapter does when the editor offers writes) has its outside edit
    // judged as it is made: after the one question about that directory,
    // answered "Allow once", that write lands (the shell's, refused by the
    // kernel, waits for the next prompt).
    let edit_out = json!(writes.edit_out).to_string();
    let edited_by_editor = through_editor.contains(&edit_out);
    assert_eq!(
        w.model.requests_mentioning("no-such-tool"),
        0,
        "{:?}/{:?} {tag}: the mock asked for a tool the agent does not offer",
        run.agent,
        run.launch
    );
    if let Err(e) = writes.inside_only(edited_by_editor) {
        panic!(
            "{:?}/{:?} {tag}: {e}\nagent said: {}\nthe bridge asked: {:?}",
            run.agent, run.launch, t.text, t.bridge_prompts
        );
    }
    // An agent whose shell shows nothing has its refusals said by the
    // supervisor, which a kernel before 5.14 (or a listener already
    // above) does not allow: then nothing is offered, as the log says.
    if run.agent.quiet_shell() && !zcode_acp::linux::supervise::available() {
        assert_eq!(t.bridge_prompts, Vec::<String>::new());
        eprintln!(
            "{:?}: no supervisor here, so its refused shell write is not offered",
            run.agent
        );
        return;
    }
    let offered = format!("Allow the agent to write in {}?", w.outside.display());
    assert_eq!(
        t.bridge_prompts,
        vec![offered],
        "{:?}/{:?} {tag}: the refusal is offered, and nothing else\nagent said: {}",
        run.agent,
        run.launch,
        t.text
    );
    // Allowed once: from the next prompt the agent may write there, with
    // its shell tool and with its edit tool.
    let again = w.outside.join(format!("after-allow-{tag}.txt"));
    let edited = w.outside.join(format!("after-allow-edit-{tag}.txt"));
    let steps = json!([
        shell(format!("echo allowed > {}", again.display())),
        write(&edited, "edit-allowed"),
    ]);
    let mut t = turn(&mut ed, &sid, steps.clone(), "reject-once");
    if !run.agent.reloads_its_sessions() && t.response["error"]["code"] == -32092 {
        // The session could not be carried over the re-arm (Gemini CLI
        // 0.61, see `reloads_its_sessions`): the editor is told so, and
        // the grant holds in a new session.
        let said = t.response["error"]["message"].as_str().unwrap_or("");
        assert!(said.contains("Open a new session"), "{said}");
        let sid = ed.new_session(&w.ws);
        t = turn(&mut ed, &sid, steps, "reject-once");
    }
    assert_eq!(
        t.response["result"]["stopReason"], "end_turn",
        "{:?}/{:?} {tag}: the turn after the grant: {}",
        run.agent, run.launch, t.response
    );
    // Gemini CLI keeps its own edit tool inside the workspace, allowed or
    // not: its shell's write is the one the grant lets through.
    let mut allowed = vec![(&again, "allowed")];
    if run.agent.edits_outside_the_workspace() {
        allowed.push((&edited, "edit-allowed"));
    } else {
        assert!(
            !edited.exists(),
            "{:?}: its edit tool wrote outside",
            run.agent
        );
    }
    for (path, want) in allowed {
        assert_eq!(
            std::fs::read_to_string(path).unwrap_or_default().trim(),
            want,
            "{:?}/{:?} {tag}: the write allowed once did not land in {}\nagent said: {}",
            run.agent,
            run.launch,
            path.display(),
            t.text
        );
    }
    // "Allow once" is not remembered in the project's file.
    let cfg = std::fs::read_to_string(w.ws.join(".zcode/acp/sandbox.json")).unwrap();
    assert!(!cfg.contains(&w.outside.display().to_string()), "{cfg}");
}

/// First run (no state directory of the agent yet), then a later run on
/// the same home, one per launch form, the editor advertising its own
/// writes on one and not on the other.
/// The agent saved its state during its first run: something of its own
/// is in its state directory (the bridge makes the directory itself, empty,
/// so that it can be writable). Returns what is there.
fn assert_state_saved(w: &World, agent: Agent, state_dir: &str) -> Vec<PathBuf> {
    let saved: Vec<PathBuf> = std::fs::read_dir(w.home.join(state_dir))
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(
        !saved.is_empty(),
        "{agent:?}: nothing of its own in {state_dir} after its first run"
    );
    saved
}

fn first_and_later_runs(agent: Agent, state_dir: &str) {
    for (first, later) in [
        (Launch::BinName, Launch::NodeScript),
        (Launch::NodeScript, Launch::BinName),
    ] {
        let w = World::new();
        assert!(!w.home.join(state_dir).exists());
        let run = Run::new(agent, first);
        armed_scenario(&w, &run, "first");
        assert_state_saved(&w, agent, state_dir);
        let mut run = Run::new(agent, later);
        run.editor_writes = false;
        armed_scenario(&w, &run, "later");
    }
}

#[test]
fn codex_works_armed_on_its_first_run_and_later() {
    if !ready() {
        return;
    }
    first_and_later_runs(Agent::Codex, ".codex");
}

#[test]
fn claude_works_armed_on_its_first_run_and_later() {
    if !ready() {
        return;
    }
    first_and_later_runs(Agent::Claude, ".claude");
}

/// The adapter Zed installed before the rename: its Claude Code saves
/// `~/.claude.json` through `O_CREAT|O_TRUNC`, which the name-prefix
/// grant serves whatever the open's flags.
#[test]
fn legacy_claude_code_acp_works_armed_on_its_first_run_and_later() {
    if !ready() {
        return;
    }
    first_and_later_runs(Agent::ClaudeLegacy, ".claude");
}

#[test]
fn qwen_works_armed_on_its_first_run_and_later() {
    if !ready() {
        return;
    }
    first_and_later_runs(Agent::Qwen, ".qwen");
}

#[test]
fn vibe_works_armed_on_its_first_run_and_later() {
    if !ready() || !vibe_ready() {
        return;
    }
    first_and_later_runs(Agent::Vibe, ".vibe");
}

/// Every agent reaches its model as it reaches its real API: through the
/// sandbox's proxy, to a host beyond a router (a network world of the
/// test's own; no packet leaves this machine), with no question beyond the
/// refused write, on its first run.
#[test]
fn every_agent_reaches_its_model_through_the_sandboxs_proxy() {
    if !ready() || !common::netns::have_tools(&["ip", "unshare"]) {
        return;
    }
    for agent in Agent::ALL
        .into_iter()
        .filter(|a| *a != Agent::Vibe || vibe_ready())
    {
        let (host, internet) = common::netns::a_host_beyond_a_router();
        let w = World::with_model_at(Some((internet.pid(), agent)));
        let mut run = Run::new(agent, Launch::BinName);
        run.host_ns = Some(host.pid());
        armed_scenario(&w, &run, "proxy");
        // The proxy was the way: straight to the model's host, around it,
        // nothing arrives.
        let mut ed = run.start(&w);
        let sid = ed.new_session(&w.ws);
        let direct = format!(
            "curl -s -m 5 --noproxy '*' http://{BEYOND_A_ROUTER}:{}/direct-probe; echo direct=$?",
            w.model.port
        );
        let t = turn(&mut ed, &sid, json!([shell(direct)]), "reject-once");
        assert_eq!(t.response["result"]["stopReason"], "end_turn");
        drop(ed);
        assert_eq!(
            w.model.requests_mentioning("\"path\": \"/direct-probe\""),
            0,
            "{agent:?}: the agent reached its model's host around the proxy"
        );
        assert!(t.text.contains("direct="), "{agent:?}: {}", t.text);
    }
}

/// Each agent's first run for a user who is not root: their own home, the
/// bridge and the agent run as them, the same scenario.
#[test]
fn every_agent_works_armed_on_its_first_run_as_an_unprivileged_user() {
    if !ready() {
        return;
    }
    let user = common::TestUser::create();
    for agent in Agent::ALL {
        if agent == Agent::Vibe && !(vibe_ready() && vibe_runs_as(&user)) {
            continue;
        }
        let w = World::for_user(&user);
        assert!(!w.home.join(agent.state_dir()).exists());
        let mut run = Run::new(agent, Launch::BinName);
        run.run_as = Some((user.uid, user.gid, user.base.join("bin/zcode-acp")));
        armed_scenario(&w, &run, "first");
        // Theirs: the agent ran as them.
        use std::os::unix::fs::MetadataExt;
        for made in assert_state_saved(&w, agent, agent.state_dir())
            .iter()
            .chain([&Writes::new(&w, "first").shell_in])
        {
            let owner = std::fs::symlink_metadata(made).unwrap().uid();
            assert_eq!(
                owner,
                user.uid,
                "{agent:?}: {} is not theirs",
                made.display()
            );
        }
    }
}

/// Whether the user can run Mistral Vibe's Python (scripts/test copies
/// one they could not reach, such as pyenv's under /root).
fn vibe_runs_as(user: &common::TestUser) -> bool {
    use std::os::unix::process::CommandExt;
    let status = Command::new(Path::new(VIBE).join("bin/python3"))
        .args(["-c", "import vibe"])
        .env_clear()
        .envs(agent_env(Agent::Vibe, &user.base, "http://127.0.0.1:9"))
        .current_dir("/")
        .uid(user.uid)
        .gid(user.gid)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    status.is_ok_and(|s| s.success())
        || common::skip("Mistral Vibe's Python cannot be run by another user here (scripts/test copies one others cannot reach to tests/agents/vibe-python when it runs as root)")
}

/// Whether scripts/test could install Mistral Vibe (it needs Python 3.12).
fn vibe_ready() -> bool {
    let runs = Command::new(Path::new(VIBE).join("bin/python3"))
        .args(["-c", "import vibe"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    (runs && Path::new(VIBE).join("bin/vibe-acp").exists())
        || common::skip("Mistral Vibe is not installed (scripts/test installs it when a Python 3.12 or later is on PATH or in pyenv)")
}

#[test]
fn opencode_works_armed_on_its_first_run_and_later() {
    if !ready() {
        return;
    }
    first_and_later_runs(Agent::OpenCode, ".local/share/opencode");
}

#[test]
fn gemini_works_armed_on_its_first_run_and_later() {
    if !ready() {
        return;
    }
    first_and_later_runs(Agent::Gemini, ".gemini");
}

#[test]
fn without_the_sandbox_both_writes_land() {
    if !ready() {
        return;
    }
    for agent in Agent::ALL
        .into_iter()
        .filter(|a| *a != Agent::Vibe || vibe_ready())
    {
        let w = World::new();
        // Codex refuses a CODEX_HOME that does not exist; unarmed, nothing
        // makes it, so this is a user's later run.
        std::fs::create_dir_all(w.home.join(".codex")).unwrap();
        let mut run = Run::new(agent, Launch::BinName);
        run.sandbox = false;
        let mut ed = run.start(&w);
        let sid = ed.new_session(&w.ws);
        let writes = Writes::new(&w, "unarmed");
        let t = turn(&mut ed, &sid, writes.steps(), "reject-once");
        // Gemini CLI keeps its own edit tool inside the workspace, sandbox
        // or not: its shell is the difference.
        let landed = if !agent.edits_outside_the_workspace() {
            [&writes.shell_in, &writes.shell_out, &writes.edit_in]
                .iter()
                .all(|p| p.exists())
                && !writes.edit_out.exists()
        } else {
            writes.all_written()
        };
        assert!(
            landed,
            "{agent:?}: unarmed, every write lands: the sandbox is what made the difference\n{}",
            t.text
        );
        assert!(t.bridge_prompts.is_empty());
    }
}

#[test]
fn a_widened_policy_makes_the_outside_checks_fail() {
    if !ready() {
        return;
    }
    // The outside folder whitelisted on purpose, as a user would.
    let w = World::new();
    let status = Command::new(BIN)
        .env_clear()
        .env("HOME", &w.home)
        .arg("allow")
        .arg(&w.outside)
        .arg("--workspace")
        .arg(&w.ws)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let mut ed = Run::new(Agent::Codex, Launch::BinName).start(&w);
    let sid = ed.new_session(&w.ws);
    let writes = Writes::new(&w, "widened");
    turn(&mut ed, &sid, writes.steps(), "reject-once");
    let verdict = writes.inside_only(false);
    assert!(
        verdict
            .as_ref()
            .is_err_and(|e| e.contains("was written outside the project")),
        "the outside checks must catch a widened policy: {verdict:?}"
    );
}

/// A second session in a new root re-arms the agent; the first session's
/// next prompt works, and no history is replayed to the editor.
fn rearm_keeps_the_first_session(agent: Agent) {
    let w = World::new();
    let mut ed = Run::new(agent, Launch::NodeScript).start(&w);
    let first = ed.new_session(&w.ws);
    let a = w.ws.join("before-rearm.txt");
    turn(
        &mut ed,
        &first,
        json!([shell(format!("echo one > {}", a.display()))]),
        "reject-once",
    );
    assert!(a.exists());
    let restarts_before = ed.seen.len();
    let second = ed.new_session(&w.other);
    assert_ne!(first, second);
    let b = w.ws.join("after-rearm.txt");
    let t = turn(
        &mut ed,
        &first,
        json!([shell(format!("echo two > {}", b.display()))]),
        "reject-once",
    );
    assert_eq!(
        t.response["result"]["stopReason"], "end_turn",
        "{}",
        t.response
    );
    assert_eq!(
        std::fs::read_to_string(&b).unwrap_or_default(),
        "two\n",
        "{agent:?}: {}",
        t.text
    );
    let c = w.other.join("in-other.txt");
    turn(
        &mut ed,
        &second,
        json!([shell(format!("echo three > {}", c.display()))]),
        "reject-once",
    );
    assert!(
        c.exists(),
        "{agent:?}: the second root is writable after the re-arm"
    );
    // The restart happened, and put the first session back without
    // replaying its history.
    let after = &ed.seen[restarts_before..];
    assert!(
        after.iter().any(|l| l.raw.contains("(restarted)")),
        "{agent:?}: the agent was re-armed for the new root"
    );
    let replayed = after.iter().any(|l| {
        l.value["params"]["sessionId"] == first.as_str()
            && l.value["params"]["update"]["sessionUpdate"] == "user_message_chunk"
    });
    assert!(!replayed, "{agent:?}: history was replayed to the editor");
}

#[test]
fn codex_keeps_its_session_across_a_rearm() {
    if !ready() {
        return;
    }
    rearm_keeps_the_first_session(Agent::Codex);
}

#[test]
fn claude_keeps_its_session_across_a_rearm() {
    if !ready() {
        return;
    }
    rearm_keeps_the_first_session(Agent::Claude);
}

#[test]
fn claude_saves_its_settings_file_during_an_armed_turn() {
    if !ready() {
        return;
    }
    let w = World::new();
    let settings = w.home.join(".claude.json");
    // First run: Claude creates ~/.claude.json inside the sandbox.
    let mut ed = Run::new(Agent::Claude, Launch::BinName).start(&w);
    let sid = ed.new_session(&w.ws);
    turn(&mut ed, &sid, json!([shell("true".into())]), "reject-once");
    drop(ed);
    let saved: Value = serde_json::from_slice(&std::fs::read(&settings).unwrap()).unwrap();
    assert!(saved["userID"].is_string(), "{saved}");
    // A later run: a change Claude makes (it restores a missing userID and
    // runs a pending migration) is on disk afterwards, and what it does not
    // touch survives.
    let mut edited = saved.clone();
    edited.as_object_mut().unwrap().remove("userID");
    edited["migrationVersion"] = json!(1);
    edited["zcodeAcpKeep"] = json!("kept");
    std::fs::write(&settings, edited.to_string()).unwrap();
    let mut ed = Run::new(Agent::Claude, Launch::NodeScript).start(&w);
    let sid = ed.new_session(&w.ws);
    turn(&mut ed, &sid, json!([shell("true".into())]), "reject-once");
    drop(ed);
    let after: Value = serde_json::from_slice(&std::fs::read(&settings).unwrap()).unwrap();
    assert!(after["userID"].is_string(), "{after}");
    assert_ne!(after["migrationVersion"], json!(1), "{after}");
    assert_eq!(after["zcodeAcpKeep"], "kept");
    assert!(std::fs::symlink_metadata(&settings).unwrap().is_file());
    // Nothing else appeared in the home directory beside it.
    let strays: Vec<String> = std::fs::read_dir(&w.home)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".claude.json."))
        .collect();
    assert!(strays.is_empty(), "{strays:?}");
}

/// Claude's own settings stay writable (it saves permission rules there),
/// but a hook its shell plants in ~/.claude/settings.json would run
/// unconfined the next time you start Claude outside the bridge: by the
/// time the turn ends it is reverted, and the user was asked whether to
/// keep it.
#[test]
fn a_hook_claude_plants_in_its_own_settings_is_reverted_by_the_turns_end() {
    if !ready() {
        return;
    }
    let w = World::new();
    let settings = w.home.join(".claude/settings.json");
    let mut ed = Run::new(Agent::Claude, Launch::NodeScript).start(&w);
    let sid = ed.new_session(&w.ws);
    // A first turn: Claude has made its state, the audit's baseline holds it.
    turn(&mut ed, &sid, json!([shell("true".into())]), "reject-once");
    let planted = format!(
        "mkdir -p {d} && printf '%s' '{{\"permissions\":{{\"allow\":[\"Bash(ls)\"]}},\"hooks\":{{\"Stop\":[{{\"hooks\":[{{\"type\":\"command\",\"command\":\"touch {o}/hooked\"}}]}}]}}}}' > {s}",
        d = settings.parent().unwrap().display(),
        o = w.outside.display(),
        s = settings.display()
    );
    // The bridge's question is answered "Revert".
    let t = turn(&mut ed, &sid, json!([shell(planted)]), "revert");
    assert_eq!(t.response["result"]["stopReason"], "end_turn", "{}", t.text);
    let now: Value = serde_json::from_slice(&std::fs::read(&settings).unwrap()).unwrap();
    assert!(
        now.get("hooks").is_none(),
        "the hook outlived the turn: {now}"
    );
    assert_eq!(now["permissions"]["allow"][0], "Bash(ls)", "{now}");
    assert!(
        t.bridge_prompts
            .iter()
            .any(|p| p.contains(&settings.display().to_string())),
        "the user was not asked before the turn ended: {:?}",
        t.bridge_prompts
    );
    drop(ed);
    assert!(!w.outside.join("hooked").exists());
}

#[test]
fn claude_with_its_config_dir_set_works_on_its_first_run() {
    if !ready() {
        return;
    }
    let w = World::new();
    let cfg = w.home.join(".config/claude-test");
    let mut run = Run::new(Agent::Claude, Launch::BinName);
    run.extra_env
        .push(("CLAUDE_CONFIG_DIR".into(), cfg.display().to_string()));
    armed_scenario(&w, &run, "configdir");
    assert!(cfg.join(".claude.json").is_file());
    assert!(!w.home.join(".claude.json").exists());
    assert!(!w.home.join(".claude").exists());
}

// ---- Other clients in front of the bridge

/// A Node client (it starts the armed bridge itself) with the environment
/// an editor would give it: the test's home and the agent's variables.
fn client(agent: Agent, w: &World) -> Command {
    let mut cmd = Command::new("node");
    cmd.env_clear()
        .env("HOME", &w.home)
        .env("ZCODE_ACP_SANDBOX", "1");
    for (k, v) in agent_env(agent, &w.home, &w.model.url()) {
        cmd.env(k, v);
    }
    cmd
}

/// Runs `cmd` to its end in the world's network.
fn output_in(w: &World, mut cmd: Command) -> std::process::Output {
    let net = w.net.as_ref().expect("the world's own network");
    let _entered = net.enter(&mut cmd, None);
    cmd.output().unwrap()
}

#[test]
fn acpx_as_the_client_in_front_of_the_armed_bridge() {
    if !ready() {
        return;
    }
    for agent in [Agent::Codex, Agent::Claude] {
        let w = World::new();
        let writes = Writes::new(&w, "acpx");
        let mut line = vec![BIN.to_owned(), "--".to_owned()];
        line.extend(backend(agent, Launch::BinName, &w.model.url()));
        // acpx splits --agent as a shell would: an argument with spaces or
        // double quotes (codex's TOML values) goes in single quotes.
        let agent_line = line
            .iter()
            .map(|a| {
                if a.contains([' ', '"']) {
                    format!("'{a}'")
                } else {
                    a.clone()
                }
            })
            .collect::<Vec<_>>()
            .join(" ");
        let mut cmd = client(agent, &w);
        cmd.current_dir(&w.ws)
            .arg(format!("{AGENTS}/acpx/dist/cli.js"))
            .args(["--agent", &agent_line, "--cwd"])
            .arg(&w.ws)
            .args([
                "--format",
                "json",
                "--approve-all",
                "--verbose",
                "--timeout",
                "120",
                "exec",
            ])
            .arg(format!("zcode-mock: {}", writes.steps()));
        let out = output_in(&w, cmd);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{agent:?}: acpx failed: {}\n{stdout:.3000}",
            String::from_utf8_lossy(&out.stderr)
        );
        if let Err(e) = writes.inside_only(false) {
            panic!("{agent:?} under acpx: {e}\n{stdout:.3000}");
        }
        // --approve-all also answers the bridge's prompt: it must have
        // picked "Allow once", so nothing was persisted.
        let frames: Vec<Value> = stdout
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        let asked: Vec<&Value> = frames
            .iter()
            .filter(|f| {
                f["method"] == "session/request_permission"
                    && f["params"]["toolCall"]["toolCallId"]
                        .as_str()
                        .is_some_and(|t| t.starts_with("zcode-acp-allow"))
            })
            .collect();
        assert_eq!(asked.len(), 1, "{agent:?}: {stdout:.3000}");
        // No connection was put to it (its --approve-all would allow it).
        assert!(
            !stdout.contains("zcode-acp-network-"),
            "{agent:?}: a connection was asked: {stdout:.3000}"
        );
        let answer = frames
            .iter()
            .find(|f| {
                f.get("method").is_none() && f["id"] == asked[0]["id"] && f.get("result").is_some()
            })
            .unwrap_or_else(|| panic!("acpx answered the bridge's prompt: {stdout:.3000}"));
        assert_eq!(
            answer["result"]["outcome"]["optionId"], "allow-once",
            "{answer}"
        );
        let cfg = std::fs::read_to_string(w.ws.join(".zcode/acp/sandbox.json")).unwrap();
        assert!(!cfg.contains(&w.outside.display().to_string()), "{cfg}");
        assert!(w.model.requests_mentioning("shell-in-acpx") > 0);
    }
}

#[test]
fn the_official_typescript_sdk_as_the_client_of_armed_claude() {
    if !ready() {
        return;
    }
    let sdk = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk");
    if !sdk.join("node_modules/@agentclientprotocol/sdk").is_dir() {
        common::skip("the ACP TypeScript SDK is not installed (run: npm ci --prefix tests/sdk)");
        return;
    }
    let w = World::new();
    let writes = Writes::new(&w, "sdk");
    let mut argv = vec![BIN.to_owned(), "--".to_owned()];
    argv.extend(backend(Agent::Claude, Launch::NodeScript, &w.model.url()));
    let mut cmd = client(Agent::Claude, &w);
    cmd.arg(sdk.join("real_agent.mjs"))
        .arg(&w.ws)
        .arg(format!("zcode-mock: {}", writes.steps()))
        .args(&argv);
    let out = output_in(&w, cmd);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the SDK client failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    if let Err(e) = writes.inside_only(false) {
        panic!("Claude under the SDK client: {e}\n{stdout}");
    }
    let summary: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(summary["stopReason"], "end_turn", "{summary}");
    let offered = format!("Allow the agent to write in {}?", w.outside.display());
    assert_eq!(summary["bridgePrompts"], json!([offered]), "{summary}");
}

/// With `--code-exec`, codex (armed, on its first run) gets the run_code
/// server in its session, its mocked model calls the tool, and the code
/// runs inside the agent's sandbox with its own layer: the write inside
/// lands, the one outside does not, and the result says what confined it.
#[test]
fn codex_calls_run_code_through_the_bridge() {
    if !ready() {
        return;
    }
    let w = World::new();
    let mut run = Run::new(Agent::Codex, Launch::NodeScript);
    run.bridge_args = vec!["--code-exec".into()];
    // A key in the bridge's (and so the agent's) environment. Codex hands
    // its MCP servers a few variables of its own choosing, so this shows
    // the whole chain keeps it out, not which link does: run_code's own
    // filter (an allowlist, with a key that does pass) is shown by
    // tests/run_code.rs, the_code_gets_an_allowlisted_environment...
    run.extra_env = vec![("ZCODE_TEST_SECRET".into(), "s3cr3t-value".into())];
    let mut ed = run.start(&w);
    let sid = ed.new_session(&w.ws);
    let source = format!(
        "open('from-run-code.txt', 'w').write('hi')\ntry:\n    open('{}/rc.txt', 'w')\nexcept OSError as e:\n    print('refused', e.errno)\nimport os\nprint('secret:', os.environ.get('ZCODE_TEST_SECRET'))\nprint('RUN' + '_CODE_DONE')",
        w.outside.display()
    );
    let t = turn(
        &mut ed,
        &sid,
        json!([{"tool": "mcp", "name": "run_code", "arguments": {"language": "python", "source": source}}]),
        "reject-once",
    );
    assert_eq!(t.response["result"]["stopReason"], "end_turn", "{}", t.text);
    let log = std::fs::read_to_string(&w.model.log).unwrap();
    let offered = tools_offered(&log);
    assert!(
        offered.iter().any(|t| t.contains("run_code")),
        "the model was not offered run_code: {offered:?}"
    );
    // What the tool returned, as the agent handed it to the model (the
    // tool's description is in every request too, so the log as a whole
    // proves nothing about the result).
    let results = tool_outputs(&log);
    let result = results
        .iter()
        .find(|r| r.contains("RUN_CODE_DONE"))
        .unwrap_or_else(|| {
            panic!(
                "the tool's result never reached the model: {}\n(offered: {offered:?}; outputs: {results:?})",
                t.text
            )
        });
    assert!(
        result.contains("secret: None") && !log.contains("s3cr3t-value"),
        "the bridge's environment reached the code: {result}"
    );
    assert!(
        // Codex hands the model the structured result when there is one.
        result.contains(r#""confinement":"inherited: linux namespaces+landlock""#)
            || result.contains("confinement: inherited: linux namespaces+landlock"),
        "the result does not say what confined the run: {result}"
    );
    assert_eq!(
        std::fs::read_to_string(w.ws.join("from-run-code.txt")).unwrap(),
        "hi"
    );
    assert!(
        !w.outside.join("rc.txt").exists(),
        "run_code wrote outside the project"
    );
}

/// Codex behind the armed bridge with `--code-exec`, and a session the
/// editor gives the test's own MCP server (`fs`, two tools).
fn codex_with_a_tool_server(w: &World) -> (Editor, String) {
    let mut run = Run::new(Agent::Codex, Launch::NodeScript);
    run.bridge_args = vec!["--code-exec".into()];
    let mut ed = run.start(w);
    // In the user's home, not in the checkout: a checkout under /tmp cannot
    // be read from a sandbox, whose /tmp is its own.
    let fixture = w.home.join("mcp_tools.py");
    std::fs::copy(
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/mcp_tools.py"),
        &fixture,
    )
    .unwrap();
    let r = ed.call(
        "session/new",
        json!({"cwd": w.ws, "mcpServers": [{"name": "fs", "command": "python3", "args": [fixture], "env": []}]}),
    );
    let sid = r["sessionId"].as_str().unwrap().to_owned();
    (ed, sid)
}

/// The editor gives the session an MCP server of its own; code run
/// through run_code calls its tools in a loop (the server's definition
/// reached the run_code server inside the sandbox through the bridge's
/// servers file) and returns a structured result.
#[test]
fn code_run_by_codex_calls_the_sessions_mcp_tools_through_the_bridge() {
    if !ready() {
        return;
    }
    let w = World::new();
    let (mut ed, sid) = codex_with_a_tool_server(&w);
    std::fs::write(w.ws.join("notes.txt"), "n").unwrap();
    let source = "import zcode_tools as t\nn = sum(len(t.fs.echo(text='ab', times=i)) for i in range(20))\nfiles = t.fs.list_files(dir='.')['files']\nt.result({'echoed': n, 'notes': 'notes.txt' in files})\nprint('TOOLS' + '_DONE')";
    let t = turn(
        &mut ed,
        &sid,
        json!([{"tool": "mcp", "name": "run_code", "arguments": {"language": "python", "source": source, "tools": ["fs.echo", "fs.list_files"]}}]),
        "reject-once",
    );
    assert_eq!(t.response["result"]["stopReason"], "end_turn", "{}", t.text);
    let log = std::fs::read_to_string(&w.model.log).unwrap();
    let results = tool_outputs(&log);
    let result = results
        .iter()
        .find(|r| r.contains("TOOLS_DONE"))
        .unwrap_or_else(|| {
            panic!(
                "the run's result never reached the model: {results:?}\n{}",
                t.text
            )
        });
    assert!(
        result.contains(r#""result":{"echoed":380,"notes":true}"#)
            || result.contains(r#"result: {"echoed":380,"notes":true}"#),
        "{result}"
    );
    assert!(
        result.contains(r#""toolCalls":21"#) || result.contains("tool calls: 21"),
        "{result}"
    );
}

/// Code lists files through an MCP tool and writes a summary through the
/// editor: inside the workspace the write lands; outside it goes through
/// the allow flow, refused without consent and written after "Allow
/// once"; what the code reads back comes from the editor (this test's
/// editor answers from disk; a real one answers from its buffers).
#[test]
fn code_run_by_codex_writes_through_the_editor_judged_like_the_agent() {
    if !ready() {
        return;
    }
    let w = World::new();
    let (mut ed, sid) = codex_with_a_tool_server(&w);
    for name in ["a.rs", "b.rs", "c.md"] {
        std::fs::write(w.ws.join(name), "x").unwrap();
    }
    let outside = w.outside.join("summary.txt");
    let source = format!(
        "import zcode_tools as t\n\
         rs = [n for n in t.fs.list_files(dir='.')['files'] if n.endswith('.rs')]\n\
         t.editor.write_text_file(path='summary.txt', content=', '.join(rs))\n\
         back = t.editor.read_text_file(path='summary.txt')\n\
         try:\n    t.editor.write_text_file(path='{o}', content='out')\n    out = 'written'\n\
         except t.ToolError as e:\n    out = e.code\n\
         t.result({{'back': back, 'outside': out}})\nprint('EDITOR' + '_DONE')",
        o = outside.display()
    );
    let call = json!([{"tool": "mcp", "name": "run_code", "arguments": {"language": "python", "source": source,
        "tools": ["fs.list_files", "editor.write_text_file", "editor.read_text_file"]}}]);
    let result_of = |w: &World| -> String {
        let log = std::fs::read_to_string(&w.model.log).unwrap();
        tool_outputs(&log)
            .into_iter()
            .rfind(|r| r.contains("EDITOR_DONE"))
            .unwrap_or_else(|| panic!("the run's result never reached the model: {log}"))
    };
    // Refused without consent.
    let t = turn(&mut ed, &sid, call.clone(), "reject-once");
    assert_eq!(t.response["result"]["stopReason"], "end_turn", "{}", t.text);
    assert_eq!(
        std::fs::read_to_string(w.ws.join("summary.txt")).unwrap(),
        "a.rs, b.rs"
    );
    let result = result_of(&w);
    assert!(
        result.contains(r#""back":"a.rs, b.rs""#) || result.contains(r#""back": "a.rs, b.rs""#),
        "{result}"
    );
    assert!(result.contains("tool_error"), "{result}");
    assert!(!outside.exists(), "written outside without consent");
    assert!(
        t.bridge_prompts.iter().any(|p| p.contains("summary.txt")),
        "the write outside was not put to the user: {:?}",
        t.bridge_prompts
    );
    // Written after "Allow once".
    let t = turn(&mut ed, &sid, call, "allow-once");
    assert_eq!(t.response["result"]["stopReason"], "end_turn", "{}", t.text);
    assert_eq!(std::fs::read_to_string(&outside).unwrap(), "out");
    assert!(result_of(&w).contains("written"), "{}", result_of(&w));
    // A re-armed agent (its sandbox made anew, covering the sockets bound
    // before it) still reaches the editor from code.
    // The next turn must reach the new generation: sent before the bridge
    // took the signal, it would run in the old sandbox and prove nothing.
    // (No restart was announced yet, so the one waited for is this one.)
    assert!(!ed.seen.iter().any(|l| l.raw.contains("(restarted)")));
    common::sighup(ed.pid());
    ed.wait_for("the re-arm", |v| {
        v["params"]["update"]["title"]
            .as_str()
            .is_some_and(|t| t.ends_with("(restarted)"))
    });
    // And code that finds the bridge's sockets on disk cannot use them:
    // every call must carry the token only the run_code server holds.
    let source = format!(
        "import glob, json, socket\n\
         import zcode_tools as t\n\
         for p in glob.glob('{home}/.zcode-acp/run-code/servers-*/e*.sock'):\n    \
             s = socket.socket(socket.AF_UNIX); s.connect(p)\n    \
             s.sendall(json.dumps({{'id': 1, 'method': 'fs/write_text_file', 'params': {{'path': '{ws}/direct.txt', 'content': 'x'}}}}).encode() + b'\\n')\n    \
             print('direct=' + s.makefile().readline().strip())\n\
         t.result(t.editor.read_text_file(path='summary.txt'))\nprint('AFTER' + '_REARM')",
        home = w.home.display(),
        ws = w.ws.display()
    );
    let t = turn(
        &mut ed,
        &sid,
        json!([{"tool": "mcp", "name": "run_code", "arguments": {"language": "python", "source": source,
            "tools": ["editor.read_text_file"]}}]),
        "reject-once",
    );
    assert_eq!(t.response["result"]["stopReason"], "end_turn", "{}", t.text);
    let log = std::fs::read_to_string(&w.model.log).unwrap();
    let after = tool_outputs(&log)
        .into_iter()
        .rfind(|r| r.contains("AFTER_REARM"))
        .unwrap_or_else(|| panic!("no result after the re-arm: {}", t.text));
    assert!(after.contains("a.rs, b.rs"), "{after}");
    assert!(after.contains("direct="), "no socket was tried: {after}");
    assert!(after.contains("not this socket's token"), "{after}");
    assert!(!w.ws.join("direct.txt").exists());
}

/// The outputs of tool calls the agent sent back to its model.
fn tool_outputs(log: &str) -> Vec<String> {
    let mut outputs = Vec::new();
    for line in log.lines() {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let body = v.get("body").unwrap_or(&v);
        for item in body["input"].as_array().into_iter().flatten() {
            if item["type"] == "function_call_output" {
                let out = &item["output"];
                outputs.push(
                    out.as_str()
                        .map(str::to_owned)
                        .unwrap_or_else(|| out.to_string()),
                );
            }
        }
    }
    outputs
}

/// The names of the tools the agent offered its model, in every request.
fn tools_offered(log: &str) -> Vec<String> {
    let mut names = Vec::new();
    for line in log.lines() {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let body = v.get("body").unwrap_or(&v);
        for t in body["tools"].as_array().into_iter().flatten() {
            let name = t["name"].as_str().or(t["function"]["name"].as_str());
            if let Some(n) = name.filter(|n| !names.iter().any(|m| m == n)) {
                names.push(n.to_owned());
            }
        }
    }
    names
}

/// Without the opt-in, the editor's mcpServers reach the agent as sent.
#[test]
fn without_code_exec_the_agent_gets_no_run_code() {
    if !ready() {
        return;
    }
    let w = World::new();
    let mut ed = Run::new(Agent::Codex, Launch::NodeScript).start(&w);
    let sid = ed.new_session(&w.ws);
    turn(&mut ed, &sid, json!([shell("true".into())]), "reject-once");
    let log = std::fs::read_to_string(&w.model.log).unwrap();
    let offered = tools_offered(&log);
    assert!(
        !offered.is_empty(),
        "no tools were seen: the check would prove nothing"
    );
    assert!(
        !offered.iter().any(|t| t.contains("run_code")),
        "run_code was offered without the opt-in: {offered:?}"
    );
}
