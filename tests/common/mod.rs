//! A scripted editor for integration tests: drives the real `zcode-acp`
//! binary over pipes and records every frame it writes.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

#[cfg(target_os = "linux")]
pub mod netns;

pub const BIN: &str = env!("CARGO_BIN_EXE_zcode-acp");

/// Generous: CI machines are small and share their cores.
pub const TIMEOUT: Duration = Duration::from_secs(30);

pub fn fake_agent() -> Vec<String> {
    vec![
        "python3".into(),
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/fake_agent.py").into(),
    ]
}

pub fn shell_agent() -> Vec<String> {
    vec![BIN.into(), "shell-agent".into()]
}

/// One line the bridge wrote to stdout, raw and parsed.
#[derive(Debug, Clone)]
pub struct Line {
    pub raw: String,
    pub value: Value,
}

pub struct Editor {
    pub child: Child,
    stdin: Option<ChildStdin>,
    rx: mpsc::Receiver<Option<Line>>,
    /// Every frame received so far, in order.
    pub seen: Vec<Line>,
    /// Frames up to here were looked at for auto-answering.
    cursor: usize,
    /// Frames already returned by `wait_for`.
    taken: std::collections::HashSet<usize>,
    /// Terminals this editor ran: (output, exit code), and their requests.
    pub terminals: Vec<(String, Option<i32>)>,
    pub terminal_requests: Vec<Value>,
    next_id: u64,
    pub home: Home,
    /// How long `wait_for` waits for one frame.
    pub timeout: Duration,
    /// How long dropping waits for the bridge to exit after its stdin is
    /// closed, before killing it.
    pub drop_grace: Duration,
    /// Who runs the terminals (see [`Options::run_as`]).
    run_as: Option<(u32, u32)>,
    /// Requests of these methods are left for the test to answer.
    pub manual: Vec<&'static str>,
    /// How long this editor takes between reading a write request and
    /// making it (a real editor opens a buffer first): the window a racing
    /// agent would use.
    pub write_delay: Duration,
}

/// The bridge's home directory: a fresh temporary one, or one the test
/// made (a real agent's world).
pub enum Home {
    Temp(tempfile::TempDir),
    At(PathBuf),
}

impl Home {
    pub fn path(&self) -> &Path {
        match self {
            Home::Temp(t) => t.path(),
            Home::At(p) => p,
        }
    }
}

pub struct Options {
    pub backend: Vec<String>,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Start the bridge in a new mount namespace whose `/` is shared, so a
    /// sandbox that forgot to make its mounts private would leak into it.
    pub outer_ns: bool,
    /// Where the temporary home goes (default: the system temp dir).
    pub home_in: Option<PathBuf>,
    /// A home the test made, used as it is (instead of a temporary one).
    pub home_at: Option<PathBuf>,
    /// Start from an empty environment: only HOME, the log level and `env`
    /// (a real agent must never see the developer's own keys or state).
    pub clear_env: bool,
    pub timeout: Duration,
    /// With `outer_ns`: a file in /proc masked there, as a container does
    /// (see [`in_outer_mount_ns_masking`]).
    #[cfg(target_os = "linux")]
    pub masked_proc: Option<&'static std::ffi::CStr>,
    /// Run the bridge, and the terminals this editor runs for it, as this
    /// user (uid, gid), with this copy of the binary (one the user can run).
    pub run_as: Option<(u32, u32, PathBuf)>,
    /// Prepares the bridge's command before it starts (such as entering a
    /// network namespace of the test's, see `netns`); what it returns is
    /// kept open until the bridge has started. With `run_as`, it must
    /// switch to that user itself.
    pub prepare: Option<Prepare>,
    /// Where the bridge starts (Zed starts an agent in the project's
    /// root); by default, the test's own directory.
    pub cwd: Option<PathBuf>,
}

/// See [`Options::prepare`].
pub type Prepare = Box<dyn FnOnce(&mut Command) -> Vec<std::fs::File>>;

impl Options {
    pub fn new(backend: Vec<String>) -> Self {
        Options {
            backend,
            args: Vec::new(),
            env: Vec::new(),
            outer_ns: false,
            home_in: None,
            home_at: None,
            clear_env: false,
            timeout: TIMEOUT,
            #[cfg(target_os = "linux")]
            masked_proc: None,
            run_as: None,
            prepare: None,
            cwd: None,
        }
    }
    pub fn env(mut self, k: &str, v: &str) -> Self {
        self.env.push((k.into(), v.into()));
        self
    }
    pub fn arg(mut self, a: &str) -> Self {
        self.args.push(a.into());
        self
    }
}

impl Editor {
    pub fn start(backend: Vec<String>) -> Editor {
        Self::start_with(Options::new(backend))
    }

    pub fn start_with(mut opts: Options) -> Editor {
        let home = match (&opts.home_at, &opts.home_in) {
            (Some(at), _) => Home::At(at.clone()),
            (None, Some(dir)) => Home::Temp(tempfile::tempdir_in(dir).unwrap()),
            (None, None) => Home::Temp(tempfile::tempdir().unwrap()),
        };
        let mut cmd = Command::new(opts.run_as.as_ref().map_or(Path::new(BIN), |u| &u.2));
        cmd.args(&opts.args).arg("--").args(&opts.backend);
        // With `prepare`, the switch to the user is its own (it may need
        // root first: entering a namespace).
        if let (Some((uid, gid, _)), None) = (&opts.run_as, &opts.prepare) {
            std::os::unix::process::CommandExt::uid(&mut cmd, *uid);
            std::os::unix::process::CommandExt::gid(&mut cmd, *gid);
        }
        if opts.clear_env {
            cmd.env_clear();
        } else {
            cmd.env("ZCODE_SHELL_AGENT_HOME", home.path().join("shell-agent"))
                .env("FAKE_AGENT_DIR", home.path())
                .env("XDG_CONFIG_HOME", home.path().join("config"));
        }
        cmd.env("ZCODE_ACP_LOG", "debug")
            .env("HOME", home.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if let Some(dir) = &opts.cwd {
            cmd.current_dir(dir);
        }
        for (k, v) in &opts.env {
            cmd.env(k, v);
        }
        #[cfg(target_os = "linux")]
        if opts.outer_ns {
            in_outer_mount_ns_masking(&mut cmd, opts.masked_proc);
        }
        #[cfg(not(target_os = "linux"))]
        if opts.outer_ns {
            in_outer_mount_ns(&mut cmd);
        }
        let kept = opts.prepare.take().map(|prepare| prepare(&mut cmd));
        let mut child = cmd.spawn().expect("start zcode-acp");
        drop(kept);
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::with_capacity(1 << 20, stdout);
            loop {
                let mut raw = String::new();
                match reader.read_line(&mut raw) {
                    Ok(0) | Err(_) => {
                        let _ = tx.send(None);
                        return;
                    }
                    Ok(_) => {
                        let raw = raw.trim_end_matches('\n').to_owned();
                        let value = serde_json::from_str(&raw).unwrap_or_else(|e| {
                            panic!("the bridge wrote a non-JSON line to stdout ({e}): {raw:.200}")
                        });
                        if tx.send(Some(Line { raw, value })).is_err() {
                            return;
                        }
                    }
                }
            }
        });
        Editor {
            child,
            stdin,
            rx,
            seen: Vec::new(),
            cursor: 0,
            taken: Default::default(),
            terminals: Vec::new(),
            terminal_requests: Vec::new(),
            next_id: 1000,
            home,
            timeout: opts.timeout,
            drop_grace: Duration::ZERO,
            run_as: opts.run_as.as_ref().map(|u| (u.0, u.1)),
            manual: Vec::new(),
            write_delay: Duration::ZERO,
        }
    }

    pub fn home(&self) -> &Path {
        self.home.path()
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn send_raw(&mut self, raw: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(raw.as_bytes()).unwrap();
        stdin.write_all(b"\n").unwrap();
        stdin.flush().unwrap();
    }

    pub fn send(&mut self, v: &Value) {
        self.send_raw(&v.to_string());
    }

    /// Sends a request and returns its id.
    pub fn request(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = json!(self.next_id);
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        id
    }

    pub fn notify(&mut self, method: &str, params: Value) {
        self.send(&json!({"jsonrpc": "2.0", "method": method, "params": params}));
    }

    pub fn close_stdin(&mut self) {
        self.stdin.take();
    }

    /// Pulls one more frame; None on EOF or timeout.
    fn pull(&mut self, deadline: Instant) -> Option<Line> {
        let left = deadline.saturating_duration_since(Instant::now());
        match self.rx.recv_timeout(left) {
            Ok(Some(line)) => {
                self.seen.push(line.clone());
                Some(line)
            }
            _ => None,
        }
    }

    /// Waits for a frame matching `pred` that has not been returned before
    /// (looking at everything received so far, in order), answering
    /// requests from the bridge meanwhile.
    pub fn wait_for(&mut self, what: &str, pred: impl Fn(&Value) -> bool) -> Line {
        let deadline = Instant::now() + self.timeout;
        loop {
            while self.cursor < self.seen.len() {
                let v = self.seen[self.cursor].value.clone();
                self.cursor += 1;
                self.auto_answer(&v);
            }
            if let Some(i) =
                (0..self.seen.len()).find(|i| !self.taken.contains(i) && pred(&self.seen[*i].value))
            {
                self.taken.insert(i);
                return self.seen[i].clone();
            }
            if self.pull(deadline).is_none() {
                panic!(
                    "timed out waiting for {what}; last seen: {:#?}",
                    self.seen
                        .iter()
                        .rev()
                        .take(10)
                        .map(|l| &l.raw)
                        .collect::<Vec<_>>()
                );
            }
        }
    }

    /// The response to request `id`.
    pub fn response(&mut self, id: &Value) -> Value {
        let id = id.clone();
        self.wait_for(&format!("the response to {id}"), move |v| {
            v.get("id") == Some(&id) && v.get("method").is_none()
        })
        .value
    }

    /// Sends a request and waits for its successful result.
    pub fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.request(method, params);
        let r = self.response(&id);
        match r.get("result") {
            Some(result) => result.clone(),
            None => panic!("{method} failed: {r}"),
        }
    }

    /// Collects frames for `d` (answering bridge requests meanwhile).
    pub fn drain_for(&mut self, d: Duration) {
        let deadline = Instant::now() + d;
        loop {
            // Requests are answered as they come, as an editor does.
            while self.cursor < self.seen.len() {
                let v = self.seen[self.cursor].value.clone();
                self.cursor += 1;
                self.auto_answer(&v);
            }
            if self.pull(deadline).is_none() {
                break;
            }
        }
    }

    /// What an editor does with requests from the agent, minimally.
    fn auto_answer(&mut self, v: &Value) {
        let (Some(method), Some(id)) = (v.get("method").and_then(Value::as_str), v.get("id"))
        else {
            return;
        };
        if self.manual.contains(&method) {
            return;
        }
        let id = id.clone();
        let result = match method {
            "fs/write_text_file" => {
                let p = &v["params"];
                std::thread::sleep(self.write_delay);
                std::fs::write(p["path"].as_str().unwrap(), p["content"].as_str().unwrap())
                    .unwrap();
                json!({})
            }
            "fs/read_text_file" => {
                match std::fs::read_to_string(v["params"]["path"].as_str().unwrap()) {
                    Ok(content) => json!({ "content": content }),
                    Err(e) => {
                        self.send(&json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32002, "message": e.to_string()}}));
                        return;
                    }
                }
            }
            "terminal/create" => {
                // As an editor does: run `command` with `args`, applying the
                // request's env and cwd to the process it starts.
                let p = &v["params"];
                let mut cmd = Command::new(p["command"].as_str().unwrap());
                if let Some(args) = p["args"].as_array() {
                    cmd.args(args.iter().map(|a| a.as_str().unwrap()));
                }
                for e in p["env"].as_array().into_iter().flatten() {
                    cmd.env(e["name"].as_str().unwrap(), e["value"].as_str().unwrap());
                }
                if let Some(cwd) = p["cwd"].as_str() {
                    cmd.current_dir(cwd);
                }
                if let Some((uid, gid)) = self.run_as {
                    std::os::unix::process::CommandExt::uid(&mut cmd, uid);
                    std::os::unix::process::CommandExt::gid(&mut cmd, gid);
                }
                let out = cmd.stdin(Stdio::null()).output().unwrap();
                let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
                text.push_str(&String::from_utf8_lossy(&out.stderr));
                self.terminals.push((text, out.status.code()));
                self.terminal_requests.push(v.clone());
                json!({"terminalId": format!("term-{}", self.terminals.len() - 1)})
            }
            "terminal/wait_for_exit" | "terminal/output" => {
                let n: usize = v["params"]["terminalId"].as_str().unwrap()[5..]
                    .parse()
                    .unwrap();
                let (output, code) = self.terminals[n].clone();
                if method == "terminal/output" {
                    json!({"output": output, "truncated": false, "exitStatus": {"exitCode": code}})
                } else {
                    json!({"exitCode": code})
                }
            }
            "terminal/release" | "terminal/kill" => json!({}),
            _ => return,
        };
        self.send(&json!({"jsonrpc": "2.0", "id": id, "result": result}));
    }

    pub fn initialize(&mut self) -> Value {
        self.call(
            "initialize",
            json!({"protocolVersion": 1, "clientCapabilities": {"fs": {"readTextFile": true, "writeTextFile": true}, "terminal": true}}),
        )
    }

    pub fn new_session(&mut self, cwd: &Path) -> String {
        let r = self.call("session/new", json!({"cwd": cwd, "mcpServers": []}));
        r["sessionId"].as_str().unwrap().to_owned()
    }

    pub fn prompt_request(&mut self, sid: &str, text: &str) -> Value {
        self.request(
            "session/prompt",
            json!({"sessionId": sid, "prompt": [{"type": "text", "text": text}]}),
        )
    }

    /// Runs a prompt and returns (response, text of the agent's chunks).
    pub fn prompt(&mut self, sid: &str, text: &str) -> (Value, String) {
        let start = self.seen.len();
        let id = self.prompt_request(sid, text);
        let r = self.response(&id);
        (r, self.agent_text_since(start, sid))
    }

    pub fn agent_text_since(&self, start: usize, sid: &str) -> String {
        self.seen[start..]
            .iter()
            .filter(|l| {
                l.value["method"] == "session/update" && l.value["params"]["sessionId"] == sid
            })
            .filter(|l| l.value["params"]["update"]["sessionUpdate"] == "agent_message_chunk")
            .map(|l| {
                l.value["params"]["update"]["content"]["text"]
                    .as_str()
                    .unwrap_or("")
                    .to_owned()
            })
            .collect()
    }

    /// Frames received that answer request `id` (to check "exactly one").
    pub fn responses_to(&self, id: &Value) -> usize {
        self.seen
            .iter()
            .filter(|l| l.value.get("id") == Some(id) && l.value.get("method").is_none())
            .count()
    }

    /// Waits for the bridge to exit; returns its exit code.
    pub fn wait_exit(&mut self) -> Option<i32> {
        exit_within(&mut self.child, TIMEOUT, "zcode-acp did not exit").code()
    }
}

/// Waits up to `limit` for `child` to exit; past it, kills it and fails
/// the test with `hung`.
pub fn exit_within(child: &mut Child, limit: Duration, hung: &str) -> std::process::ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{hung}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Drop for Editor {
    fn drop(&mut self) {
        self.stdin.take();
        // Let the bridge stop its agent as it does for an editor that
        // leaves (a SIGKILL would leave what the agent started to the
        // parent-death signal alone).
        let deadline = Instant::now() + self.drop_grace;
        while Instant::now() < deadline && self.child.try_wait().ok().flatten().is_none() {
            std::thread::sleep(Duration::from_millis(20));
        }
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A fresh workspace directory.
pub fn workspace(editor: &Editor, name: &str) -> PathBuf {
    let p = editor.home().join(name);
    std::fs::create_dir_all(&p).unwrap();
    p
}

#[cfg(target_os = "linux")]
pub fn alive(pid: i32) -> bool {
    // Zombies count as gone: they run nothing.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat
                .rsplit(')')
                .next()
                .and_then(|r| r.split_whitespace().next());
            !matches!(state, Some("Z" | "X"))
        }
        Err(_) => false,
    }
}

/// No `/proc` here: the same question put to libproc.
#[cfg(not(target_os = "linux"))]
pub fn alive(pid: i32) -> bool {
    zcode_acp::procs::snapshot()
        .iter()
        .any(|p| p.pid == pid && !p.is_zombie())
}

pub fn wait_until(what: &str, f: impl Fn() -> bool) {
    let deadline = Instant::now() + TIMEOUT;
    while !f() {
        if Instant::now() > deadline {
            panic!("timed out waiting until {what}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn sighup(pid: i32) {
    // SAFETY: kill(2) with a pid this test started.
    unsafe {
        libc::kill(pid, libc::SIGHUP);
    }
}

/// A home where a user's is, under `/home` (or the scratch base where
/// there is none): never a temp directory, which is writable by design
/// and would hide what the sandbox refuses.
pub fn home_like_a_users(prefix: &str) -> tempfile::TempDir {
    // A contributor who is not root cannot make one in /home: the scratch
    // base then (inside the checkout, never a temp directory).
    if Path::new("/home").is_dir() {
        if let Ok(dir) = tempfile::Builder::new().prefix(prefix).tempdir_in("/home") {
            return dir;
        }
    }
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(scratch_base())
        .unwrap()
}

/// A directory for scratch files that the sandbox sees as they are on disk:
/// not under /tmp or /var/tmp (the sandbox's are private), wherever the
/// repository happens to be cloned.
pub fn scratch_base() -> PathBuf {
    let candidates = [
        Some(PathBuf::from(env!("CARGO_TARGET_TMPDIR"))),
        std::env::var_os("HOME").map(PathBuf::from),
        Some(PathBuf::from("/var/lib")),
    ];
    for c in candidates.into_iter().flatten() {
        let Ok(real) = std::fs::canonicalize(&c) else {
            continue;
        };
        if real.starts_with("/tmp") || real.starts_with("/var/tmp") {
            continue;
        }
        if tempfile::tempdir_in(&real).is_ok() {
            return real;
        }
    }
    panic!("no scratch directory outside /tmp and /var/tmp is writable");
}

/// Whether the sandbox tests can run here (root and Landlock). Where CI
/// requires every test (`ZCODE_ACP_REQUIRE_ALL_TESTS`), a skip is a failure;
/// elsewhere the reason is printed.
#[cfg(target_os = "linux")]
pub fn require_kernel_features() -> bool {
    let landlock = zcode_acp::linux::landlock_abi();
    let root = nix::unistd::getuid().is_root();
    if landlock < 1 || !root {
        return skip(&format!(
            "needs root and Landlock (landlock ABI {landlock}, root {root})"
        ));
    }
    true
}

/// Whether the Seatbelt tests can run here (the real sandbox-exec), with
/// the same rule for skipping.
#[cfg(target_os = "macos")]
pub fn require_seatbelt() -> bool {
    if Path::new("/usr/bin/sandbox-exec").is_file() {
        return true;
    }
    skip("needs /usr/bin/sandbox-exec")
}

/// Whether `program` is on PATH; else says why the test does not run
/// (see [`skip`]): an optional tool missing is a printed skip, never a
/// failure, except where CI requires every test.
pub fn require_tool(program: &str, how: &str) -> bool {
    let found = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()));
    found || skip(&format!("needs {program} ({how})"))
}

/// Says why a test does not run (false), or fails it where CI requires
/// every test. The reason is written to the real stderr, past the test
/// harness's capture, so `cargo test` shows it beside the `ok`.
pub fn skip(reason: &str) -> bool {
    let test = std::thread::current().name().unwrap_or("a test").to_owned();
    if std::env::var_os("ZCODE_ACP_REQUIRE_ALL_TESTS").is_some() {
        panic!("{test} would be skipped (ZCODE_ACP_REQUIRE_ALL_TESTS is set): {reason}");
    }
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {reason}");
    false
}

// ---- An armed bridge in front of the shell agent.

/// The bridge in front of the shell agent, in an outer mount namespace (Linux),
/// with a home outside /tmp (the sandbox's /tmp is private) and the shell
/// agent's transcripts in ~/.zcode-shell-agent, which the zcode backend
/// profile keeps writable across generations. Nothing is prepared in the
/// home directory: the first sandboxed session of a new user must work.
/// `global`: ZCODE_ACP_SANDBOX=1.
pub fn start_shell_agent(global: bool) -> Editor {
    let mut opts = Options::new(shell_agent()).env("ZCODE_SHELL_AGENT_HOME", "");
    if global {
        opts = opts.env("ZCODE_ACP_SANDBOX", "1");
    }
    opts.outer_ns = true;
    opts.home_in = Some(scratch_base());
    Editor::start_with(opts)
}

pub fn armed_editor() -> (Editor, std::path::PathBuf, String, std::path::PathBuf) {
    let mut ed = start_shell_agent(true);
    ed.initialize();
    let ws = workspace(&ed, "w");
    let sid = ed.new_session(&ws);
    let outside = std::fs::canonicalize(ed.home()).unwrap().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    (ed, ws, sid, outside)
}

/// Waits for the bridge's permission prompt and answers it.
pub fn answer_prompt(ed: &mut Editor, option: &str) -> serde_json::Value {
    let req = ed
        .wait_for("a permission prompt", |v| {
            v["method"] == "session/request_permission"
        })
        .value;
    ed.send(&serde_json::json!({"jsonrpc": "2.0", "id": req["id"], "result": {"outcome": {"outcome": "selected", "optionId": option}}}));
    req
}

/// Runs a prompt whose write is put to the user, answering `option`.
pub fn prompt_answering(
    ed: &mut Editor,
    sid: &str,
    text: &str,
    option: &str,
) -> (serde_json::Value, String) {
    let start = ed.seen.len();
    let id = ed.prompt_request(sid, text);
    let req = answer_prompt(ed, option);
    ed.response(&id);
    (req, ed.agent_text_since(start, sid))
}

/// Has the armed agent ask the editor, through `/terminal`, to write once
/// outside and once in the workspace; checks on disk that only the inside
/// write happened, and returns what the editor was asked to run.
pub fn terminal_writes_inside_only(
    ed: &mut Editor,
    ws: &Path,
    sid: &str,
    outside: &Path,
) -> serde_json::Value {
    let (_, text) = ed.prompt(
        sid,
        &format!(
            "/terminal touch {}/via-terminal; echo in > {}/term.txt; echo finished",
            outside.display(),
            ws.display()
        ),
    );
    assert!(text.contains("finished"), "{text}");
    assert!(
        !outside.join("via-terminal").exists(),
        "the editor's terminal wrote outside"
    );
    assert_eq!(
        std::fs::read_to_string(ws.join("term.txt")).unwrap(),
        "in\n"
    );
    ed.terminal_requests[0]["params"].clone()
}

/// Runs the bridge in a mount namespace of its own (shared propagation
/// inside it), so whatever its sandbox helpers mount never reaches this
/// machine's mount table. macOS has no mount namespaces and its sandbox
/// mounts nothing, so there this is nothing to do.
#[cfg(target_os = "linux")]
pub fn in_outer_mount_ns(cmd: &mut Command) {
    in_outer_mount_ns_masking(cmd, None)
}

#[cfg(not(target_os = "linux"))]
pub fn in_outer_mount_ns(_cmd: &mut Command) {}

/// As [`in_outer_mount_ns`], and covers `masked` (a file in /proc) with
/// /dev/null in that namespace, as container engines mask parts of /proc
/// (the kernel then refuses a fresh /proc to a user namespace).
#[cfg(target_os = "linux")]
pub fn in_outer_mount_ns_masking(cmd: &mut Command, masked: Option<&'static std::ffi::CStr>) {
    let parent_ns = std::fs::metadata("/proc/self/ns/mnt")
        .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
        .unwrap();
    // SAFETY: runs in the forked child before exec; system calls only.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(cmd, move || {
            if libc::unshare(libc::CLONE_NEWNS) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let mut st: libc::stat = std::mem::zeroed();
            if libc::stat(c"/proc/self/ns/mnt".as_ptr(), &mut st) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if st.st_ino == parent_ns {
                return Err(std::io::Error::other(
                    "the mount namespace did not change; refusing to mount",
                ));
            }
            if libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_SHARED,
                std::ptr::null(),
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            if let Some(file) = masked {
                if libc::mount(
                    c"/dev/null".as_ptr(),
                    file.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND,
                    std::ptr::null(),
                ) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}

/// How many processes `/proc` lists, as seen by the agent (`how` empty)
/// or by a terminal it asks the editor for (`how` = "/terminal "); with
/// the agent's text.
#[cfg(target_os = "linux")]
pub fn processes_in_proc(ed: &mut Editor, sid: &str, how: &str) -> (usize, String) {
    let (_, text) = ed.prompt(
        sid,
        &format!("{how}echo procs=$(ls /proc | grep -c '^[0-9]')"),
    );
    let procs = text
        .split("procs=")
        .nth(1)
        .and_then(|t| t.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{text}"));
    (procs, text)
}

/// Has the armed agent write a file into its private /tmp, then asks the
/// editor, through `/terminal`, to read it back and to leave a process
/// behind. Checks that the terminal ran in the agent's sandbox (it sees
/// that file, which the host's /tmp does not have), in a PID namespace of
/// its own (its shell is the second process there), and that what it left
/// behind ended with it.
#[cfg(target_os = "linux")]
pub fn terminal_joins_its_generation(ed: &mut Editor, sid: &str) {
    let tag = 700_000 + std::process::id() % 100_000;
    let name = format!("zcode-acp-joined-{tag}");
    let agents_view = "readlink /proc/self >/dev/null && echo proc-ok; echo mounts=$(wc -l < /proc/self/mountinfo)";
    let (_, before) = ed.prompt(
        sid,
        &format!("echo from-the-agent > /tmp/{name}; {agents_view}"),
    );
    assert!(before.contains("proc-ok"), "{before}");
    assert!(
        !Path::new("/tmp").join(&name).exists(),
        "the agent's /tmp is its own"
    );
    let (_, text) = ed.prompt(
        sid,
        &format!("/terminal cat /tmp/{name}; sleep {tag} >/dev/null 2>&1 & echo shell=$$"),
    );
    assert!(
        text.contains("from-the-agent"),
        "the terminal does not see the agent's /tmp: {text}"
    );
    assert!(
        text.contains("shell=2"),
        "the terminal has no PID namespace of its own: {text}"
    );
    // Its /proc is its own, and was mounted in a mount namespace of its
    // own: the agent's view is as it was.
    let (procs, text) = processes_in_proc(ed, sid, "/terminal ");
    // Its init, its shell, the command substitution's subshell, `ls` and
    // `grep`; the agent's /proc would add at least the generation's init,
    // the agent and the terminal's first process.
    assert!(
        procs <= 5,
        "the terminal sees processes not its own: {text}"
    );
    let (_, after) = ed.prompt(sid, agents_view);
    assert!(
        after.contains("proc-ok"),
        "the terminal changed the agent's /proc: {after}"
    );
    assert_eq!(
        before.split("mounts=").nth(1),
        after.split("mounts=").nth(1),
        "the terminal's mounts reached the agent"
    );
    // The network too: a server the agent started on its loopback
    // answers the terminal, which is pointed at the generation's proxy.
    let port = 20_000 + tag % 10_000;
    let (_, text) = ed.prompt(
        sid,
        &format!(
            "python3 -m http.server {port} --bind 127.0.0.1 >/dev/null 2>&1 & \
             for _ in $(seq 200); do curl -s -m 1 http://127.0.0.1:{port}/ >/dev/null && break; sleep 0.05; done; echo server-up"
        ),
    );
    assert!(text.contains("server-up"), "{text}");
    let (_, text) = ed.prompt(
        sid,
        &format!(
            "/terminal curl -s -m 5 -o /dev/null -w 'code=%{{http_code}} ' http://127.0.0.1:{port}/; echo proxy=$HTTPS_PROXY"
        ),
    );
    assert!(
        text.contains("code=200"),
        "the terminal does not share the agent's network: {text}"
    );
    assert!(text.contains("proxy=http://127.0.0.1:3128"), "{text}");
    let wanted = format!("sleep\0{tag}\0");
    let left: Vec<_> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| std::fs::read(e.path().join("cmdline")).is_ok_and(|c| c == wanted.as_bytes()))
        .map(|e| e.file_name())
        .collect();
    assert!(
        left.is_empty(),
        "the terminal's process outlived it: {left:?}"
    );
}

/// Switches this process to the user `uid`, `gid` with no supplementary
/// groups. Only system calls: for a `pre_exec` hook, after what needs root.
#[cfg(target_os = "linux")]
pub fn become_user(uid: u32, gid: u32) -> std::io::Result<()> {
    // SAFETY: plain system calls on integers and a null list.
    let failed = unsafe {
        libc::setgroups(0, std::ptr::null()) != 0
            || libc::setgid(gid) != 0
            || libc::setuid(uid) != 0
    };
    if failed {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// A user the test creates, and removes when dropped, with a directory of
/// its own (outside /tmp) holding a home, a workspace, an outside folder it
/// may normally write, and copies of the binary and the ops script.
#[cfg(target_os = "linux")]
pub struct TestUser {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub base: PathBuf,
}

#[cfg(target_os = "linux")]
impl TestUser {
    pub fn create() -> TestUser {
        let name = format!("zcacp{:06x}", rand_u32() & 0xff_ffff);
        let base = PathBuf::from(format!("/var/lib/zcode-acp-test-{name}"));
        std::fs::create_dir_all(&base).unwrap();
        let status = Command::new("useradd")
            .args(["--no-create-home", "--home-dir"])
            .arg(base.join("home"))
            .args(["--shell", "/bin/sh", &name])
            .status()
            .expect("useradd");
        assert!(status.success(), "useradd failed");
        let user = nix::unistd::User::from_name(&name).unwrap().unwrap();
        let u = TestUser {
            name,
            uid: user.uid.as_raw(),
            gid: user.gid.as_raw(),
            base,
        };
        std::fs::create_dir_all(u.base.join("bin")).unwrap();
        std::fs::copy(BIN, u.base.join("bin/zcode-acp")).unwrap();
        std::fs::copy(
            concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/ops.py"),
            u.base.join("bin/ops.py"),
        )
        .unwrap();
        for d in ["home", "ws", "outside"] {
            std::fs::create_dir_all(u.base.join(d)).unwrap();
        }
        // A user's home is theirs.
        u.own(&u.base.join("home"));
        u
    }

    /// Hands everything below `dir` to the user.
    pub fn own(&self, dir: &Path) {
        let status = Command::new("chown")
            .arg("-R")
            .arg(format!("{}:{}", self.uid, self.gid))
            .arg(dir)
            .status()
            .unwrap();
        assert!(status.success());
    }
}

#[cfg(target_os = "linux")]
impl Drop for TestUser {
    fn drop(&mut self) {
        // Processes the test started as this user are ended by their own
        // guards first (userdel refuses a user that still runs something);
        // what they started may take a moment more to go (a sandbox's
        // proxy ends when its sandbox's last process has), so userdel is
        // tried again for a few seconds.
        let mut last = None;
        for _ in 0..50 {
            match Command::new("userdel").arg(&self.name).status() {
                Ok(s) if s.success() => {
                    last = None;
                    break;
                }
                other => last = Some(other),
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        if let Some(other) = last {
            eprintln!(
                "WARNING: could not remove the test user {}: {other:?}",
                self.name
            );
        }
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

pub fn rand_u32() -> u32 {
    let mut b = [0u8; 4];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
        .unwrap();
    u32::from_ne_bytes(b)
}

#[cfg(target_os = "linux")]
/// A service of the test's own on this machine's loopback (an ephemeral
/// port), recording the path of every request that reaches it; ended by
/// pid when dropped.
pub struct LoopbackService {
    child: std::process::Child,
    pub port: u16,
    record: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

#[cfg(target_os = "linux")]
impl LoopbackService {
    pub fn start() -> LoopbackService {
        use std::io::BufRead;
        let dir = tempfile::tempdir_in(scratch_base()).unwrap();
        let record = dir.path().join("record");
        let mut child = std::process::Command::new("python3")
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/fixtures/net_service.py"
            ))
            .args(["127.0.0.1", "0"])
            .arg(&record)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line.trim().strip_prefix("ready ").unwrap().parse().unwrap();
        LoopbackService {
            child,
            port,
            record,
            _dir: dir,
        }
    }

    pub fn recorded(&self) -> String {
        std::fs::read_to_string(&self.record).unwrap_or_default()
    }
}

#[cfg(target_os = "linux")]
impl Drop for LoopbackService {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The one entry named `name` in a subdirectory of `dir`.
fn glob_one(dir: &Path, name: &str) -> PathBuf {
    let found: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path().join(name))
        .filter(|p| p.exists())
        .collect();
    assert_eq!(found.len(), 1, "{found:?}");
    found.into_iter().next().unwrap()
}

/// Has the armed agent connect, through the sandbox's proxy, to services
/// of the test's own on this machine's loopback, and answers the prompts
/// each way: checks what reached the services, what the project's
/// sandbox.json records, and that a question sent from inside the sandbox
/// reaches no one.
#[cfg(target_os = "linux")]
pub fn refused_connections_are_put_to_the_user(ed: &mut Editor, ws: &Path, sid: &str) {
    let once = LoopbackService::start();
    let always = LoopbackService::start();
    // Through the sandbox's proxy (`--noproxy ''`: curl would otherwise go
    // straight to the sandbox's own loopback, where nothing listens).
    let fetch = |host: &str, port: u16, path: &str| {
        format!("curl -s -m 60 --noproxy '' http://{host}:{port}/{path}; echo; echo done")
    };

    // Allow once: this connection, and the same destination for the rest
    // of the bridge's life, without asking again.
    let (ask, text) = prompt_answering(
        ed,
        sid,
        &fetch("127.0.0.1", once.port, "once"),
        "allow-once",
    );
    let title = ask["params"]["toolCall"]["title"].as_str().unwrap();
    assert!(
        title.contains(&format!("connect to 127.0.0.1:{}", once.port)),
        "{title}"
    );
    assert!(text.contains("hello from 127.0.0.1"), "{text}");
    let (_, text) = ed.prompt(sid, &fetch("127.0.0.1", once.port, "again"));
    assert!(text.contains("hello from 127.0.0.1"), "{text}");
    assert_eq!(once.recorded(), "/once\n/again\n");

    // Don't allow: refused, and nothing reached the service.
    let (_, text) = prompt_answering(
        ed,
        sid,
        &fetch("localhost", once.port, "refused"),
        "reject-once",
    );
    assert!(text.contains("refuses this connection"), "{text}");
    assert_eq!(once.recorded(), "/once\n/again\n");

    // Always allow: recorded in the project's table and approved, and
    // from the next prompt (re-armed) reached directly too.
    let (_, text) = prompt_answering(
        ed,
        sid,
        &fetch("127.0.0.1", always.port, "always"),
        "allow-always",
    );
    assert!(text.contains("hello from 127.0.0.1"), "{text}");
    ed.wait_for("the re-arm", |v| {
        v["params"]["update"]["title"]
            .as_str()
            .is_some_and(|t| t.ends_with("(restarted)"))
    });
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(ws.join(".zcode/acp/sandbox.json")).unwrap())
            .unwrap();
    assert_eq!(
        config["network"],
        serde_json::json!({"hostLoopback": [always.port]})
    );
    let (_, text) = ed.prompt(
        sid,
        &format!(
            "curl -s -m 20 http://127.0.0.1:{}/direct; echo; echo done",
            always.port
        ),
    );
    assert!(text.contains("hello from 127.0.0.1"), "{text}");
    assert_eq!(always.recorded(), "/always\n/direct\n");

    // The question socket's name is in the generation's launch spec,
    // which the agent can read; but abstract socket names belong to a
    // network namespace, and the sandbox has its own: a question from
    // inside reaches no one.
    let start = ed.seen.len();
    let spec = glob_one(
        &std::fs::canonicalize(ed.home())
            .unwrap()
            .join(".zcode-acp/sandbox"),
        "launch.json",
    );
    let forged = format!(
        r#"python3 -c "
import json, socket
name = json.load(open('{}'))['network_asks']
s = socket.socket(socket.AF_UNIX)
s.settimeout(5)
try:
    s.connect(chr(0) + name)
    s.sendall(json.dumps(dict(host='forged.example', port=443, addr='1.2.3.4', zone='Public', why='forged')).encode() + b'\\n')
    print('answered', s.recv(100))
except OSError as e:
    print('no answer:', e)
""#,
        spec.display()
    );
    let (_, text) = ed.prompt(sid, &forged);
    assert!(
        text.contains("no answer: [Errno 111] Connection refused"),
        "{text}"
    );
    assert!(
        !ed.seen[start..]
            .iter()
            .any(|l| l.value["method"] == "session/request_permission"),
        "a forged question reached the editor"
    );
}

// ---- What an agent that fights back is kept from, root or not.

/// Waits for the audit's question about `path` and answers it.
pub fn answer_audit(ed: &mut Editor, path: &std::path::Path, option: &str) -> serde_json::Value {
    let p = path.display().to_string();
    let req = ed
        .wait_for("the audit's question", move |v| {
            v["method"] == "session/request_permission"
                && v["params"]["toolCall"]["toolCallId"]
                    .as_str()
                    .is_some_and(|t| t.starts_with("zcode-acp-audit-"))
                && v["params"]["toolCall"]["locations"][0]["path"] == p.as_str()
        })
        .value;
    ed.send(&serde_json::json!({"jsonrpc": "2.0", "id": req["id"], "result": {"outcome": {"outcome": "selected", "optionId": option}}}));
    req
}

/// An agent process that keeps swapping a workspace directory with a
/// symlink to a folder outside, while the agent asks the editor for
/// thousands of writes into that directory: every write the editor makes
/// lands where it was judged (the agent is held still meanwhile), none
/// outside; writes judged outside are put to the user (and refused here).
pub fn editor_writes_land_where_judged(ed: &mut Editor, ws: &Path, sid: &str, outside: &Path) {
    // Made by the agent itself, so they are its user's whoever runs it.
    ed.prompt(
        sid,
        &format!("mkdir d && ln -s {} l && echo made", outside.display()),
    );
    let racer = r#"
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
open("racing", "w").close()
while True:
    libc.renameat2(-100, b"d", -100, b"l", 2)  # RENAME_EXCHANGE
"#;
    ed.prompt(
        sid,
        &format!("nohup python3 -c '{racer}' > /dev/null 2>&1 & while [ ! -e racing ]; do sleep 0.01; done; echo started"),
    );
    // An editor that takes a moment to write, as real ones do: without
    // the hold, the racer has that long to swap the directory.
    ed.write_delay = Duration::from_millis(1);
    let start = ed.seen.len();
    let id = ed.prompt_request(sid, "/write-seq 2000 d/f x");
    let mut answered: std::collections::HashSet<String> = Default::default();
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    while ed.responses_to(&id) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the writes did not end"
        );
        ed.drain_for(Duration::from_millis(100));
        let open: Vec<serde_json::Value> = ed.seen[start..]
            .iter()
            .filter(|l| l.value["method"] == "session/request_permission")
            .map(|l| l.value["id"].clone())
            .filter(|id| !answered.contains(&id.to_string()))
            .collect();
        for q in open {
            ed.send(&serde_json::json!({"jsonrpc": "2.0", "id": q, "result": {"outcome": {"outcome": "selected", "optionId": "reject-once"}}}));
            answered.insert(q.to_string());
        }
    }
    let text = ed.agent_text_since(start, sid);
    // The racer's swaps stop with the bridge; what landed is counted after.
    ed.prompt(sid, "pkill -f renameat2; echo stopped");
    let landed = std::fs::read_dir(outside).unwrap().count();
    assert_eq!(landed, 0, "{landed} writes landed outside: {text}");
    let inside = ["d", "l"]
        .iter()
        .filter_map(|n| std::fs::read_dir(ws.join(n)).ok())
        .map(|d| d.count())
        .sum::<usize>();
    assert!(
        inside > 100,
        "too few writes landed inside ({inside}): {text}"
    );
    assert!(text.contains("writes: ok="), "{text}");
}

/// No window after the turn: a process the agent left running plants, two
/// seconds after the turn ended, editor tasks in one live root and a
/// nested repository with an fsmonitor in another. With the bridge idle
/// and no prompt sent, each is reverted and put to the session whose root
/// holds it, within the watcher's bound.
pub fn plants_after_the_turn_are_reverted(
    ed: &mut Editor,
    ws: &Path,
    sid: &str,
    ws2: &Path,
    outside: &Path,
) {
    let sid2 = ed.new_session(ws2);
    // The second root re-arms the agent: wait until it is back.
    ed.prompt(&sid2, "true");
    let script = format!(
        "(sleep 2; mkdir -p {a}/.vscode; echo '{{\"tasks\":[{{\"command\":\"touch {o}/pwned\",\"runOptions\":{{\"runOn\":\"folderOpen\"}}}}]}}' > {a}/.vscode/tasks.json; \
          mkdir -p {b}/sub && cd {b}/sub && git init -q && git config core.fsmonitor 'touch {o}/fsmonitor') > /dev/null 2>&1 & echo left",
        a = ws.display(),
        b = ws2.display(),
        o = outside.display()
    );
    let (r, text) = ed.prompt(sid, &script);
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    assert!(text.contains("left"), "{text}");
    // Nothing planted yet when the turn ended.
    assert!(!ws.join(".vscode").exists());
    let ended = std::time::Instant::now();
    // The questions come without any prompt: the plant is seen as made.
    let tasks_q = answer_audit(ed, &ws.join(".vscode"), "revert");
    assert_eq!(tasks_q["params"]["sessionId"], sid, "{tasks_q}");
    let config = ws2.join("sub/.git/config");
    let repo_q = answer_audit(ed, &config, "revert");
    assert_eq!(repo_q["params"]["sessionId"], sid2.as_str(), "{repo_q}");
    let took = ended.elapsed();
    assert!(!ws.join(".vscode").exists(), "the tasks are still there");
    assert!(
        !std::fs::read_to_string(&config)
            .unwrap_or_default()
            .contains("fsmonitor"),
        "the fsmonitor is still there"
    );
    // What was shown is the agent's version.
    assert!(
        tasks_q["params"]["toolCall"]["content"][0]["content"]["text"]
            .as_str()
            .unwrap()
            .contains("VS Code"),
        "{tasks_q}"
    );
    eprintln!("planted 2 s after the turn's end; both reverted and asked {took:?} after it");

    // A loop that plants again as soon as it is reverted, for two seconds:
    // once it stops, what it planted last is gone too, and it was asked
    // about once, not once per plant.
    let envrc = ws.join(".envrc");
    let start = ed.seen.len();
    let (r, _) = ed.prompt(
        sid,
        &format!(
            "(for i in $(seq 40); do echo evil > {e}; sleep 0.05; done; touch {w}/loop-done) > /dev/null 2>&1 & echo looping",
            e = envrc.display(),
            w = ws.display()
        ),
    );
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    wait_until("the loop ends", || ws.join("loop-done").exists());
    wait_until("the last plant is reverted", || !envrc.exists());
    ed.drain_for(Duration::from_millis(500));
    assert!(!envrc.exists(), "the loop's last plant stayed");
    let asked = ed.seen[start..]
        .iter()
        .filter(|l| {
            l.value["method"] == "session/request_permission"
                && l.value["params"]["toolCall"]["locations"][0]["path"] == envrc.to_str().unwrap()
        })
        .count();
    assert_eq!(asked, 1, "the same plant was asked about {asked} times");
}
