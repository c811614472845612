//! Relay overhead, measured against the same agent spoken to directly.
//!
//! Each figure is a ratio against a baseline measured in the same run:
//! the embedded shell agent driven directly over its stdio (baseline) and
//! through `zcode-acp -- zcode-acp shell-agent` (bridged). Run with
//! `bash scripts/bench`, which writes BENCHMARKS.md.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_zcode-acp");

#[cfg(target_os = "linux")]
#[path = "support/builds.rs"]
mod builds;
#[path = "support/goals.rs"]
mod goals;

#[cfg(target_os = "linux")]
#[path = "support/network.rs"]
mod network;
#[cfg(target_os = "linux")]
#[path = "support/spawns.rs"]
mod spawns;

struct Peer {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    next: u64,
    line: String,
}

impl Peer {
    fn start(bridged: bool, state: &std::path::Path) -> Peer {
        let mut cmd = Command::new(BIN);
        if bridged {
            cmd.args(["--max-frame-bytes", "64MiB", "--", BIN, "shell-agent"]);
        } else {
            cmd.arg("shell-agent");
        }
        let mut child = cmd
            .env("ZCODE_SHELL_AGENT_HOME", state)
            .env(
                "ZCODE_ACP_LOG",
                std::env::var("ZCODE_ACP_BENCH_LOG").unwrap_or("error".into()),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::with_capacity(1 << 20, child.stdout.take().unwrap());
        let mut p = Peer {
            child,
            stdin,
            stdout,
            next: 0,
            line: String::new(),
        };
        p.round_trip(
            "initialize",
            r#"{"protocolVersion":1,"clientCapabilities":{}}"#,
        );
        p
    }

    /// One request and its answer (the agent answers unknown methods with
    /// an error at once, so this measures the transport).
    fn round_trip(&mut self, method: &str, params: &str) -> usize {
        self.next += 1;
        let frame = format!(
            r#"{{"jsonrpc":"2.0","id":{},"method":"{method}","params":{params}}}"#,
            self.next
        );
        self.stdin.write_all(frame.as_bytes()).unwrap();
        self.stdin.write_all(b"\n").unwrap();
        self.stdin.flush().unwrap();
        self.line.clear();
        self.stdout.read_line(&mut self.line).unwrap();
        assert!(
            self.line.contains(&format!(r#""id":{}"#, self.next)),
            "unexpected: {:.200}",
            self.line
        );
        self.line.len()
    }

    /// Peak resident memory of the process we started, in KiB.
    fn peak_rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default();
        status
            .lines()
            .find(|l| l.starts_with("VmHWM:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }

    fn agent_pid(&self) -> Option<u32> {
        // The bridge's only child is the agent, or the keeper in front of
        // an unconfined one (Linux), whose only child is the agent.
        let only_child = |pid: u32| -> Option<u32> {
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
                .ok()?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        };
        let child = only_child(self.child.id())?;
        let cmdline = std::fs::read(format!("/proc/{child}/cmdline")).unwrap_or_default();
        if cmdline.split(|b| *b == 0).any(|a| a == b"__keeper") {
            return only_child(child);
        }
        Some(child)
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The bridge's memory while the agent streams `n` small notifications
/// spread over `sessions` sessions (one prompt each, in turn), to an
/// editor that reads as fast as it can or, `slow`, pauses for a
/// millisecond every 500 lines (the agent is then held back by the
/// bridge's bounded buffers). Against the bound the bridge promises: 15 MB
/// plus twice the largest frame in flight; the resident size half-way and
/// at the end show whether it stays flat.
fn streamed_notifications(n: usize, sessions: usize, slow: bool) -> String {
    let dir = tempfile::tempdir().unwrap();
    let agent = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/fake_agent.py");
    let mut b = Bridged::start(dir.path(), &[agent], &[("FAKE_AGENT_DIR", dir.path())]);
    let ws = dir.path().join("w");
    let mut sids = vec![b.handshake(&ws)];
    for i in 1..sessions {
        sids.push(b.new_session(&ws, 100 + i as u64));
    }
    let rss = |field: &str| -> u64 {
        std::fs::read_to_string(format!("/proc/{}/status", b.child.id()))
            .unwrap_or_default()
            .lines()
            .find(|l| l.starts_with(field))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    for (i, sid) in sids.iter().enumerate() {
        writeln!(
            b.stdin,
            r#"{{"jsonrpc":"2.0","id":{},"method":"session/prompt","params":{{"sessionId":"{sid}","prompt":[{{"type":"text","text":"flood {}"}}]}}}}"#,
            10_000 + i,
            n / sessions
        )
        .unwrap();
    }
    b.stdin.flush().unwrap();
    let result = memchr::memmem::Finder::new(br#""result""#);
    let method = memchr::memmem::Finder::new(br#""method""#);
    let (mut lines, mut answers, mut half) = (0usize, 0usize, 0u64);
    while answers < sessions {
        b.line.clear();
        let k = b.stdout.read_until(b'\n', &mut b.line).unwrap();
        assert!(k > 0, "the bridge closed stdout");
        b.largest = b.largest.max(k);
        lines += 1;
        if result.find(&b.line).is_some() && method.find(&b.line).is_none() {
            answers += 1;
        }
        if lines == n / 2 {
            half = rss("VmRSS:");
        }
        if slow && lines % 500 == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let (end, peak) = (rss("VmRSS:"), rss("VmHWM:"));
    let largest = b.largest;
    b.stop();
    let bound_kib = (15_000_000 + 2 * largest as u64) / 1024;
    let editor = if slow { "a slow" } else { "a fast" };
    // Where nothing could be read (no /proc), there is nothing to hold.
    if peak > 0 {
        goals::at_most(
            &format!(
                "the bridge's peak memory, {n} notifications to {editor} editor, vs its bound"
            ),
            peak as f64 / bound_kib as f64,
            1.0,
        );
    }
    format!(
        "| peak RSS of the bridge while the agent streams {n} notifications over {sessions} sessions to {editor} editor (resident half-way {half} KiB, at the end {end} KiB), vs the bound (15 MB + 2 x the largest frame) | {bound_kib} KiB (bound) | {peak} KiB (bridge) | {:.2}x |",
        peak as f64 / bound_kib as f64
    )
}

/// The bridge (no sandbox) in front of a python fixture agent, driven as
/// an editor drives it: a frame sent, lines read up to its answer.
struct Bridged {
    child: Child,
    /// The agent, when `child` is a plain relay (`cat`) in front of it.
    relayed: Option<Child>,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    line: Vec<u8>,
    /// The longest line read so far.
    largest: usize,
}

impl Bridged {
    fn start(home: &std::path::Path, agent: &[&str], env: &[(&str, &std::path::Path)]) -> Bridged {
        let mut argv = vec![python()];
        argv.extend(agent);
        Self::start_command(home, &argv, env, None)
    }

    /// The bridge in front of `argv`, started in `cwd` (else here).
    fn start_command(
        home: &std::path::Path,
        argv: &[&str],
        env: &[(&str, &std::path::Path)],
        cwd: Option<&std::path::Path>,
    ) -> Bridged {
        let mut cmd = Command::new(BIN);
        if let Some(cwd) = cwd {
            cmd.current_dir(cwd);
        }
        cmd.arg("--")
            .args(argv)
            .env("HOME", home)
            .env("XDG_CONFIG_HOME", home.join("config"))
            .env(
                "ZCODE_ACP_LOG",
                std::env::var("ZCODE_ACP_BENCH_LOG").unwrap_or("error".into()),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        Bridged {
            stdin: child.stdin.take().unwrap(),
            stdout: BufReader::with_capacity(1 << 20, child.stdout.take().unwrap()),
            child,
            relayed: None,
            line: Vec::new(),
            largest: 0,
        }
    }

    /// Sends `frame`, then reads up to the answer to `id`; returns that
    /// answer and every byte read on the way (its own included).
    fn until_answer(&mut self, frame: &str, id: u64) -> (String, usize) {
        writeln!(self.stdin, "{frame}").unwrap();
        self.stdin.flush().unwrap();
        let (bytes, largest) = read_to_answer(&mut self.stdout, &mut self.line, id);
        self.largest = self.largest.max(largest);
        (String::from_utf8_lossy(&self.line).into_owned(), bytes)
    }

    /// `initialize`, then a session in `ws`; its id.
    fn handshake(&mut self, ws: &std::path::Path) -> String {
        self.until_answer(
            r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{}}}"#,
            1,
        );
        std::fs::create_dir_all(ws).unwrap();
        self.new_session(ws, 2)
    }

    /// A session in `ws`, asked for as request `id`; its id.
    fn new_session(&mut self, ws: &std::path::Path, id: u64) -> String {
        let (answer, _) = self.until_answer(
            &format!(
                r#"{{"jsonrpc":"2.0","id":{id},"method":"session/new","params":{{"cwd":"{}","mcpServers":[]}}}}"#,
                ws.display()
            ),
            id,
        );
        session_id(&answer)
    }

    /// Closes the bridge's stdin and waits for it to end.
    /// The baseline: the same agent, its stdout relayed to the editor by
    /// `cat` where the bridge would stand (the editor writes to the agent
    /// directly).
    /// `wide`: both pipes as wide as the bridge makes its own once large
    /// frames cross them (see `relay::pipes`), from the start.
    fn through_cat(agent: &[&str], wide: bool) -> Bridged {
        let mut agent = Command::new(python())
            .args(agent)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut cat = Command::new("cat")
            .stdin(Stdio::from(agent.stdout.take().unwrap()))
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        #[cfg(target_os = "linux")]
        if wide {
            // The agent's end is cat's stdin now, still the same pipe.
            let cat_in = format!("/proc/{}/fd/1", agent.id());
            let into_cat = std::fs::File::open(cat_in).unwrap();
            zcode_acp::relay::pipes::widen(&into_cat).unwrap();
            zcode_acp::relay::pipes::widen(cat.stdout.as_ref().unwrap()).unwrap();
        }
        #[cfg(not(target_os = "linux"))]
        let _ = wide;
        Bridged {
            stdin: agent.stdin.take().unwrap(),
            stdout: BufReader::with_capacity(1 << 20, cat.stdout.take().unwrap()),
            child: cat,
            relayed: Some(agent),
            line: Vec::new(),
            largest: 0,
        }
    }

    fn stop(mut self) {
        drop(self.stdin);
        if let Some(mut agent) = self.relayed.take() {
            let _ = agent.wait();
        }
        let _ = self.child.wait();
    }
}

/// The `sessionId` in a `session/new` answer.
fn session_id(answer: &str) -> String {
    answer
        .split(r#""sessionId":""#)
        .nth(1)
        .and_then(|r| r.split('"').next())
        .unwrap_or_else(|| panic!("no session id in the answer: {answer}"))
        .to_owned()
}

/// Reads lines as an editor does, up to the answer to `id` (left in
/// `line`); returns the bytes read and the longest line. The streaming rows
/// read their `cat` baseline with it too, so both pay the same reader.
fn read_to_answer(r: &mut impl BufRead, line: &mut Vec<u8>, id: u64) -> (usize, usize) {
    let tag = format!(r#""id":{id}"#);
    let tag = memchr::memmem::Finder::new(tag.as_bytes());
    let method = memchr::memmem::Finder::new(br#""method""#);
    let (mut bytes, mut largest) = (0usize, 0usize);
    loop {
        line.clear();
        let k = r.read_until(b'\n', line).unwrap();
        assert!(k > 0, "the stream ended before the answer to {id}");
        bytes += k;
        largest = largest.max(k);
        if tag.find(line).is_some() && method.find(line).is_none() {
            return (bytes, largest);
        }
    }
}

fn time<F: FnMut()>(mut f: F) -> Duration {
    let start = Instant::now();
    f();
    start.elapsed()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// `n` notifications of `size` bytes streamed from the agent to the editor
/// through the bridge, against `cat` relaying the same bytes (from the
/// same file) in the same run: throughput, and its ratio to `cat`'s.
fn stream_vs_cat(n: usize, size: usize, runs: usize) -> String {
    let dir = tempfile::tempdir().unwrap();
    let frames = dir.path().join("frames.jsonl");
    {
        let head = r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":""#;
        let tail = "\"}}}}\n";
        let text = "x".repeat(size.saturating_sub(head.len() + tail.len()));
        let mut f = std::io::BufWriter::new(std::fs::File::create(&frames).unwrap());
        for _ in 0..n {
            f.write_all(head.as_bytes()).unwrap();
            f.write_all(text.as_bytes()).unwrap();
            f.write_all(tail.as_bytes()).unwrap();
        }
    }
    let total = std::fs::metadata(&frames).unwrap().len() as f64;
    let agent = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/stream_agent.py"
    );
    // One turn: the prompt sent, the notifications and the answer read, by
    // the same reader; the relay and the agent started before the clock.
    let turn = |mut b: Bridged| -> Duration {
        let sid = b.handshake(&dir.path().join("w"));
        let started = Instant::now();
        let (_, bytes) = b.until_answer(
            &format!(r#"{{"jsonrpc":"2.0","id":3,"method":"session/prompt","params":{{"sessionId":"{sid}","prompt":[]}}}}"#),
            3,
        );
        let took = started.elapsed();
        b.stop();
        assert!(
            bytes as f64 >= total,
            "the stream did not arrive whole: {bytes} of {total}"
        );
        took
    };
    let (mut cat_times, mut bridge_times) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        cat_times.push(turn(Bridged::through_cat(
            &[agent, frames.to_str().unwrap()],
            size >= zcode_acp::relay::pipes::LARGE,
        )));
        bridge_times.push(turn(Bridged::start(
            dir.path(),
            &[agent, frames.to_str().unwrap()],
            &[],
        )));
    }
    let (cat_time, bridge_time) = (median(cat_times), median(bridge_times));
    let mbs = |d: Duration| total / d.as_secs_f64() / 1e6;
    let goal = if size >= 1 << 20 { "0.8" } else { "0.5" };
    let label = if size >= 1 << 20 {
        format!("{} MiB", size >> 20)
    } else {
        format!("{} KiB", size >> 10)
    };
    goals::at_least(
        &format!("stream of {label} notifications: the bridge's throughput vs `cat`'s"),
        mbs(bridge_time) / mbs(cat_time),
        goal.parse().unwrap(),
    );
    format!(
        "| stream of {n} notifications of {label}, agent to editor, median of {runs}: `cat` relaying the same bytes vs the bridge (throughput; higher is better; goal: {goal}x at least) | {:.0} MB/s | {:.0} MB/s | {:.2}x |",
        mbs(cat_time),
        mbs(bridge_time),
        mbs(bridge_time) / mbs(cat_time)
    )
}

/// One `run_code` call of `pass` in python through a running `zcode-acp
/// mcp` (JSON-RPC over its stdio, as an agent calls it: staging, arming
/// the sandbox, the run, collecting outputs, removing its directory)
/// against running the same interpreter bare with `-c pass`.
fn run_code_call(n: usize, tool_calls: usize) -> String {
    let Some(python) = Some(python()).filter(|p| p.starts_with('/')) else {
        return "| `run_code` of `pass` (python) vs bare `python3 -c pass` | skipped: no python3 | | |".into();
    };
    let ws = scratch_dir();
    let home = scratch_dir();
    let config = home.path().join(".config/zcode-acp");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(
        config.join("config.json"),
        serde_json::json!({"runCode": {"interpreters": {"python": [&python]}}}).to_string(),
    )
    .unwrap();
    // The test's own MCP server (two tools), handed over as the bridge
    // hands a session's servers.
    let servers = home.path().join("servers.json");
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/mcp_tools.py");
    std::fs::write(
        &servers,
        serde_json::json!([{"name": "fs", "command": &python, "args": [fixture], "env": []}])
            .to_string(),
    )
    .unwrap();
    let mut child = Command::new(BIN)
        .args(["mcp", "--workspace", ws.path().to_str().unwrap()])
        .arg("--servers")
        .arg(&servers)
        .env("HOME", home.path())
        .env("XDG_CONFIG_HOME", home.path().join(".config"))
        .env(
            "ZCODE_ACP_LOG",
            std::env::var("ZCODE_ACP_BENCH_LOG").unwrap_or("error".into()),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    let mut call = |id: u64, method: &str, params: serde_json::Value| -> serde_json::Value {
        if id == u64::MAX {
            let msg = serde_json::json!({"jsonrpc": "2.0", "method": method});
            writeln!(stdin, "{msg}").unwrap();
            return serde_json::Value::Null;
        }
        let msg =
            serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        writeln!(stdin, "{msg}").unwrap();
        loop {
            line.clear();
            assert!(
                stdout.read_line(&mut line).unwrap() > 0,
                "zcode-acp mcp exited"
            );
            let v: serde_json::Value = serde_json::from_str(&line).unwrap();
            if v["id"] == id {
                return v;
            }
        }
    };
    call(
        0,
        "initialize",
        serde_json::json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}),
    );
    // A notification through the same closure: its answer is never awaited.
    call(u64::MAX, "notifications/initialized", serde_json::json!({}));
    let args = serde_json::json!({"name": "run_code", "arguments": {"language": "python", "source": "pass"}});
    // The first call probes the interpreters: not timed.
    let first = call(1, "tools/call", args.clone());
    assert_eq!(
        first["result"]["structuredContent"]["ok"], true,
        "run_code failed: {first}"
    );
    let timed: Vec<Duration> = (0..n)
        .map(|i| {
            let start = Instant::now();
            let r = call(2 + i as u64, "tools/call", args.clone());
            let took = start.elapsed();
            assert_eq!(r["result"]["structuredContent"]["ok"], true, "{r}");
            took
        })
        .collect();
    // Tool calls: N from one script, against N run_code calls of one
    // each (what a model would do without tools in its code). The first
    // call starts the MCP server: not timed.
    let one = serde_json::json!({"name": "run_code", "arguments": {"language": "python",
        "source": "import zcode_tools as t\nt.fs.echo(text='x')", "tools": ["fs.echo"]}});
    let warm = call(1_000_000, "tools/call", one.clone());
    assert_eq!(
        warm["result"]["structuredContent"]["ok"], true,
        "run_code with a tool failed: {warm}"
    );
    let start = Instant::now();
    for i in 0..tool_calls {
        let r = call(1_000_001 + i as u64, "tools/call", one.clone());
        assert_eq!(r["result"]["structuredContent"]["toolCalls"], 1, "{r}");
    }
    let separate = start.elapsed();
    let looped = serde_json::json!({"name": "run_code", "arguments": {"language": "python",
        "source": format!("import zcode_tools as t\nfor i in range({tool_calls}):\n    t.fs.echo(text='x')"),
        "tools": ["fs.echo"]}});
    let start = Instant::now();
    let r = call(2_000_000, "tools/call", looped);
    let in_one = start.elapsed();
    assert_eq!(
        r["result"]["structuredContent"]["toolCalls"], tool_calls,
        "{r}"
    );
    drop(stdin);
    let _ = child.wait();
    let bare: Vec<Duration> = (0..n)
        .map(|_| {
            let start = Instant::now();
            let status = Command::new(python).args(["-c", "pass"]).status().unwrap();
            assert!(status.success());
            start.elapsed()
        })
        .collect();
    let (bare, via) = (median(bare), median(timed));
    goals::at_most(
        "`run_code` call of `pass` vs bare python",
        via.as_secs_f64() / bare.as_secs_f64(),
        2.0,
    );
    goals::at_most(
        &format!("{tool_calls} MCP tool calls: one `run_code` call per tool call vs one for all"),
        in_one.as_secs_f64() / separate.as_secs_f64(),
        0.1,
    );
    format!(
        "| `run_code` call of `pass` (python, through `zcode-acp mcp`, sandboxed) vs bare `python3 -c pass` ({n} each; goal: 2x at most) | {:.1} ms | {:.1} ms | {:.2}x |\n\
         | {tool_calls} MCP tool calls (`fs.echo` of the bench's own stdio server): {tool_calls} `run_code` calls of one call each vs one `run_code` call whose python loop makes them all (goal: 0.1x at most, 10x faster) | {:.1} ms | {:.1} ms | {:.3}x |",
        bare.as_secs_f64() * 1e3,
        via.as_secs_f64() * 1e3,
        via.as_secs_f64() / bare.as_secs_f64(),
        separate.as_secs_f64() * 1e3,
        in_one.as_secs_f64() * 1e3,
        in_one.as_secs_f64() / separate.as_secs_f64()
    )
}

/// Writes the agent asks the editor to make (`fs/write_text_file`, from
/// the shell agent's `/write`), through a bridge without the sandbox and
/// through an armed one, which resolves and judges each path against the
/// policy before the editor sees it. Both bridges run the same agent; the
/// ratio is what judging costs per write, turn included.
fn judged_writes(n: usize) -> String {
    let ws = scratch_dir();
    let ws = std::fs::canonicalize(ws.path()).unwrap();
    let run = |armed: bool| -> Duration {
        let home = scratch_dir();
        let mut cmd = Command::new(BIN);
        cmd.args(["--", BIN, "shell-agent"])
            .env("HOME", home.path())
            // The agent's default state dir, which the armed sandbox makes
            // and keeps writable (the backend profile).
            .env("ZCODE_SHELL_AGENT_HOME", "")
            .env(
                "ZCODE_ACP_LOG",
                std::env::var("ZCODE_ACP_BENCH_LOG").unwrap_or("error".into()),
            )
            .env_remove("ZCODE_ACP_SANDBOX");
        if armed {
            cmd.env("ZCODE_ACP_SANDBOX", "1");
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut send = |v: serde_json::Value| {
            stdin.write_all(v.to_string().as_bytes()).unwrap();
            stdin.write_all(b"\n").unwrap();
            stdin.flush().unwrap();
        };
        // Reads until the answer to `id`, acting as the editor meanwhile.
        let mut answer = |id: u64, send: &mut dyn FnMut(serde_json::Value)| -> serde_json::Value {
            loop {
                let mut line = String::new();
                assert!(
                    stdout.read_line(&mut line).unwrap() > 0,
                    "the bridge exited"
                );
                let v: serde_json::Value = serde_json::from_str(&line).unwrap();
                if v["method"] == "fs/write_text_file" {
                    let p = &v["params"];
                    std::fs::write(p["path"].as_str().unwrap(), p["content"].as_str().unwrap())
                        .unwrap();
                    send(serde_json::json!({"jsonrpc": "2.0", "id": v["id"], "result": {}}));
                } else if v.get("method").is_none() && v["id"] == id {
                    return v;
                }
            }
        };
        send(
            serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": 1, "clientCapabilities": {"fs": {"writeTextFile": true}}}}),
        );
        answer(1, &mut send);
        send(
            serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "session/new",
            "params": {"cwd": ws, "mcpServers": []}}),
        );
        let created = answer(2, &mut send);
        let sid = created["result"]["sessionId"].clone();
        assert!(sid.is_string(), "{created}");
        let took = time(|| {
            for i in 0..n {
                let id = 3 + i as u64;
                let path = ws.join(format!("f{i}.txt"));
                send(
                    serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "session/prompt",
                    "params": {"sessionId": sid, "prompt": [{"type": "text",
                        "text": format!("/write {} written", path.display())}]}}),
                );
                let r = answer(id, &mut send);
                assert!(r.get("result").is_some(), "{r}");
                assert!(path.exists(), "the write was not made");
            }
        });
        let _ = child.kill();
        let _ = child.wait();
        took / n as u32
    };
    let plain = median((0..3).map(|_| run(false)).collect());
    let armed = median((0..3).map(|_| run(true)).collect());
    format!(
        "| `fs/write_text_file` turn, armed bridge (judged) vs unarmed ({n} sequential) | {:.2} ms | {:.2} ms | {:.2}x |",
        plain.as_secs_f64() * 1e3,
        armed.as_secs_f64() * 1e3,
        armed.as_secs_f64() / plain.as_secs_f64()
    )
}

/// The Python interpreter by its own path, as editors start an agent
/// (`node <prefix>/<package>/dist/index.js`), not through a version
/// manager's shim: pyenv's runs a shell script and `pyenv exec` first,
/// tens of milliseconds that the sandbox slows unevenly, which would be
/// timed as the bridge's.
pub fn python() -> &'static str {
    static PYTHON: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PYTHON.get_or_init(|| {
        Command::new("python3")
            .args(["-c", "import sys; print(sys.executable)"])
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "python3".into())
    })
}

/// Why a tmpfs row cannot run here (a mount namespace without a user
/// namespace needs root), if it cannot.
#[cfg(target_os = "linux")]
fn no_tmpfs_here() -> Option<&'static str> {
    (!nix::unistd::geteuid().is_root()).then_some("skipped: a tmpfs of the bench's own needs root")
}

/// File-heavy work in the workspace (a clone of a 3,000-file repository,
/// then its removal) under the sandbox with Claude's backend profile, whose
/// `~/.claude.json*` grant brings the supervisor's seccomp filter, against
/// the same sandbox with codex's profile, which has none. The ratio is what
/// the supervisor costs work that never touches the names it serves. Once
/// on this machine's disk, and once on a tmpfs (made in a mount namespace
/// of the benchmark's own), where nothing else hides the cost. Linux only:
/// Seatbelt expresses name prefixes itself.
/// Runs `cmd` in a mount namespace of its own with a tmpfs over `ws` (its
/// working directory), so the disk hides nothing. The tmpfs is mounted only
/// after the child is checked to be in a mount namespace other than
/// `parent_ns` (this process's).
#[cfg(target_os = "linux")]
fn on_a_tmpfs(cmd: &mut Command, ws: &std::path::Path, parent_ns: u64) {
    let ws = std::ffi::CString::new(ws.to_str().unwrap()).unwrap();
    // SAFETY: runs in the forked child before exec; system calls
    // only. The tmpfs is mounted only after the child is checked to
    // be in a mount namespace of its own.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(cmd, move || {
            if libc::unshare(libc::CLONE_NEWNS) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let mut st: libc::stat = std::mem::zeroed();
            if libc::stat(c"/proc/self/ns/mnt".as_ptr(), &mut st) != 0 || st.st_ino == parent_ns {
                return Err(std::io::Error::other("not in a mount namespace of its own"));
            }
            if libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ) != 0
                || libc::mount(
                    c"tmpfs".as_ptr(),
                    ws.as_ptr(),
                    c"tmpfs".as_ptr(),
                    0,
                    std::ptr::null(),
                ) != 0
                || libc::chdir(ws.as_ptr()) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

#[cfg(target_os = "linux")]
fn supervised_file_work(runs: usize, files: usize) -> Vec<String> {
    let base = scratch_dir();
    let base = std::fs::canonicalize(base.path()).unwrap();
    let (home, ws, src) = (base.join("home"), base.join("ws"), base.join("src"));
    for d in [&home, &ws, &src] {
        std::fs::create_dir_all(d).unwrap();
    }
    for i in 0..files {
        let dir = src.join(format!("d{}", i / 100));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("f{i}.txt")), format!("file {i}\n")).unwrap();
    }
    let git = |args: &[&str], dir: &std::path::Path| {
        let ok = Command::new("git")
            .args(["-c", "user.email=b@e", "-c", "user.name=bench"])
            .args(args)
            .current_dir(dir)
            .stdout(Stdio::null())
            .status()
            .unwrap()
            .success();
        assert!(ok, "git {args:?}");
    };
    git(&["init", "-q"], &src);
    git(&["add", "-A"], &src);
    git(&["commit", "-qm", "bench"], &src);
    let job = format!("git clone -q {} dst && rm -rf dst", src.display());
    let parent_ns = std::fs::metadata("/proc/self/ns/mnt")
        .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
        .unwrap();
    let run = |profile: &str, tmpfs: bool| -> Duration {
        let mut cmd = Command::new(BIN);
        cmd.args(["run", "--backend-profile", profile, "--workspace"])
            .arg(&ws)
            .args(["--", "sh", "-c", &job])
            .current_dir(&ws)
            .env("HOME", &home)
            .env(
                "ZCODE_ACP_LOG",
                std::env::var("ZCODE_ACP_BENCH_LOG").unwrap_or("error".into()),
            );
        if tmpfs {
            on_a_tmpfs(&mut cmd, &ws, parent_ns);
        }
        let start = Instant::now();
        let status = cmd.status().unwrap();
        let took = start.elapsed();
        assert!(status.success(), "the sandboxed git clone failed");
        took
    };
    let mut rows = Vec::new();
    for (tmpfs, place) in [(false, "this machine's disk"), (true, "a tmpfs")] {
        if let Some(why) = no_tmpfs_here().filter(|_| tmpfs) {
            println!("bench: the git clone row on a tmpfs is {why}");
            rows.push(format!(
                "| `git clone` + `rm -rf` of {files} files in the workspace on {place} | {why} | | |"
            ));
            continue;
        }
        let mut plain = Vec::new();
        let mut supervised = Vec::new();
        for _ in 0..runs {
            plain.push(run("codex", tmpfs));
            supervised.push(run("claude", tmpfs));
        }
        let (p, s) = (median(plain), median(supervised));
        goals::at_most(
            &format!("`git clone` + `rm -rf` on {place}: supervised (Claude's profile) vs not"),
            s.as_secs_f64() / p.as_secs_f64(),
            1.10,
        );
        rows.push(format!(
            "| `git clone` + `rm -rf` of {files} files in the workspace on {place}: supervised (Claude's profile) vs not (codex's), {runs} each (goal: 1.10x at most) | {:.0} ms | {:.0} ms | {:.2}x |",
            p.as_secs_f64() * 1e3,
            s.as_secs_f64() * 1e3,
            s.as_secs_f64() / p.as_secs_f64()
        ));
    }
    rows
}

#[cfg(not(target_os = "linux"))]
fn supervised_file_work(_runs: usize, _files: usize) -> Vec<String> {
    Vec::new()
}

/// A fresh directory for the bench's files where a sandbox sees them as
/// they are on disk: never under /tmp or /var/tmp (a sandbox's own are
/// private), wherever the checkout is (a clone under /tmp included).
pub fn scratch_dir() -> tempfile::TempDir {
    let candidates = [
        Some(std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))),
        std::env::var_os("HOME").map(std::path::PathBuf::from),
        Some(std::path::PathBuf::from("/var/lib")),
    ];
    for c in candidates.into_iter().flatten() {
        let Ok(real) = std::fs::canonicalize(&c) else {
            continue;
        };
        if real.starts_with("/tmp") || real.starts_with("/var/tmp") {
            continue;
        }
        if let Ok(dir) = tempfile::tempdir_in(&real) {
            return dir;
        }
    }
    panic!("no scratch directory outside /tmp and /var/tmp is writable");
}

fn main() {
    // cargo points the dynamic loader at its own library directories; an
    // editor does not, and every timed start would pay for searching them.
    // Single-threaded here, before anything is started.
    std::env::remove_var("LD_LIBRARY_PATH");
    let state = scratch_dir();
    // `cargo bench` passes --bench; `cargo test` runs this once, small, so
    // a broken benchmark is noticed without paying for a real run.
    let full = std::env::args().any(|a| a == "--bench");
    let (rounds, small_n, big_n) = if full { (5, 3000, 8) } else { (1, 20, 1) };
    let big = format!(r#"{{"blob":"{}"}}"#, "b".repeat(16 << 20));

    let mut rows = Vec::new();
    // `ZCODE_ACP_BENCH_ONLY=stream,spawn` runs only the rows whose names
    // are given (while working on one figure); every row runs otherwise.
    let only = std::env::var("ZCODE_ACP_BENCH_ONLY").ok();
    let wants = |row: &str| {
        only.as_deref()
            .is_none_or(|o| o.split(',').any(|w| w == row))
    };
    let mut direct_small = Vec::new();
    let mut bridged_small = Vec::new();
    let mut direct_big = Vec::new();
    let mut bridged_big = Vec::new();
    let mut rss = (0u64, 0u64);
    let rounds = if wants("roundtrip") { rounds } else { 0 };
    for _ in 0..rounds {
        for bridged in [false, true] {
            let mut p = Peer::start(bridged, state.path());
            let small: Vec<Duration> = (0..small_n)
                .map(|_| time(|| _ = p.round_trip("_bench/ping", "{}")))
                .collect();
            let large = time(|| {
                for _ in 0..big_n {
                    p.round_trip("_bench/big", &big);
                }
            });
            if bridged {
                bridged_small.extend(small);
                bridged_big.push(large);
                let agent_rss = p
                    .agent_pid()
                    .and_then(|pid| std::fs::read_to_string(format!("/proc/{pid}/status")).ok())
                    .and_then(|s| {
                        s.lines()
                            .find(|l| l.starts_with("VmHWM:"))
                            .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
                    })
                    .unwrap_or(0);
                rss = (p.peak_rss_kib(), agent_rss);
            } else {
                direct_small.extend(small);
                direct_big.push(large);
            }
        }
    }
    let per = |d: Duration, n: u32| d / n;
    if rounds > 0 {
        let (ds, bs) = (median(direct_small), median(bridged_small));
        let (db, bb) = (median(direct_big), median(bridged_big));
        let added_us = (bs.as_secs_f64() - ds.as_secs_f64()) * 1e6;
        goals::record(
            "small request round trip: what the bridge adds",
            format!("{added_us:.1} µs"),
            "50 µs at most",
            added_us <= 50.0,
        );
        rows.push(format!(
            "| small request round trip, median of {} ({small_n} sequential per round); the bridge adds {added_us:.0} µs (goal: 50 µs at most) | {:.1} µs | {:.1} µs | {:.2}x |",
            small_n as usize * rounds,
            ds.as_secs_f64() * 1e6,
            bs.as_secs_f64() * 1e6,
            bs.as_secs_f64() / ds.as_secs_f64()
        ));
        rows.push(format!(
            "| 16 MiB request round trip ({big_n} sequential) | {:.1} ms | {:.1} ms | {:.2}x |",
            per(db, big_n).as_secs_f64() * 1e3,
            per(bb, big_n).as_secs_f64() * 1e3,
            bb.as_secs_f64() / db.as_secs_f64()
        ));
        rows.push(format!(
        "| peak RSS after the 16 MiB frames: bridge vs the agent behind it | {} KiB (agent) | {} KiB (bridge) | {:.2}x |",
        rss.1,
        rss.0,
        rss.0 as f64 / rss.1.max(1) as f64
    ));
    }
    if wants("memory") {
        let n = if full { 1_000_000 } else { 1000 };
        rows.push(streamed_notifications(n, 10, false));
        rows.push(streamed_notifications(n, 10, true));
    }
    if wants("stream") {
        // A turn takes a tenth of a second: eleven of each, alternating, so
        // a slow spell of the machine's falls on both alike.
        let runs = if full { 11 } else { 1 };
        rows.push(stream_vs_cat(
            if full { 100_000 } else { 100 },
            1 << 10,
            runs,
        ));
        rows.push(stream_vs_cat(if full { 200 } else { 2 }, 1 << 20, runs));
    }
    if wants("spawn") {
        #[cfg(target_os = "linux")]
        {
            let n = if full { 30 } else { 2 };
            rows.push(spawns::spawn(
                n,
                &["/bin/true"],
                "spawn `/bin/true` under `zcode-acp run` vs bare",
            ));
            rows.push(spawns::spawn(
                n,
                &["sh", "-c", "true"],
                "`sh -c true` under `zcode-acp run` vs bare (goal: 2x at most)",
            ));
            rows.push(spawns::spawn_in(
                n,
                &["sh", "-c", "true"],
                "`sh -c true` under `zcode-acp run` vs bare, in a repository of 20000 files, its directories unchanged for 3.5 s, the runs after the first (which saves what it listed)",
                if full { 20_000 } else { 200 },
            ));
            rows.push(spawns::terminal_spawn(if full { 30 } else { 2 }));
            rows.push(spawns::turn_end_in(
                if full { 30 } else { 2 },
                if full { 20_000 } else { 200 },
            ));
            rows.push(spawns::initialize_answer(if full { 15 } else { 1 }));
        }
    }
    #[cfg(target_os = "linux")]
    if wants("rearm") {
        rows.push(spawns::rearm(10, if full { 7 } else { 1 }));
    }
    #[cfg(target_os = "linux")]
    if wants("files") {
        rows.extend(spawns::file_heavy(
            if full { 20_000 } else { 200 },
            if full { 5 } else { 1 },
        ));
    }
    #[cfg(target_os = "linux")]
    if wants("network") {
        rows.extend(network::rows(
            if full { 9 } else { 1 },
            if full { 51 } else { 2 },
        ));
    }
    if wants("run_code") {
        rows.push(run_code_call(
            if full { 30 } else { 2 },
            if full { 100 } else { 10 },
        ));
    }
    if wants("writes") {
        rows.push(judged_writes(if full { 200 } else { 2 }));
    }
    if wants("files") || wants("supervised") {
        rows.extend(supervised_file_work(
            if full { 9 } else { 1 },
            if full { 3000 } else { 100 },
        ));
    }
    #[cfg(target_os = "linux")]
    if full && wants("builds") {
        rows.extend(builds::cache_builds(5));
    }
    // The goals first: what a reader looks for.
    let goals = goals::table();
    if !goals.is_empty() {
        println!("{goals}");
    }
    println!("| measurement | baseline (direct) | through zcode-acp | ratio |");
    println!("|---|---|---|---|");
    for r in rows {
        println!("{r}");
    }
    println!();
    let build = if full {
        "release build"
    } else {
        "smoke run under cargo test"
    };
    println!(
        "medians of {rounds} rounds; {build}; the agent is `zcode-acp shell-agent` in both columns"
    );
}
