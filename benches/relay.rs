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
            .env("ZCODE_ACP_LOG", "error")
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

/// The bridge's peak memory while the agent streams `n` small
/// notifications to an editor that reads them as fast as it can, against
/// the bound the bridge promises: 15 MB plus twice the largest frame in
/// flight.
fn streamed_notifications(n: usize) -> String {
    let dir = tempfile::tempdir().unwrap();
    let agent = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/fake_agent.py");
    let mut b = Bridged::start(dir.path(), &[agent], &[("FAKE_AGENT_DIR", dir.path())]);
    let sid = b.handshake(&dir.path().join("w"));
    b.until_answer(
        &format!(
            r#"{{"jsonrpc":"2.0","id":3,"method":"session/prompt","params":{{"sessionId":"{sid}","prompt":[{{"type":"text","text":"flood {n}"}}]}}}}"#
        ),
        3,
    );
    let peak = std::fs::read_to_string(format!("/proc/{}/status", b.child.id()))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    let largest = b.largest;
    b.stop();
    let bound_kib = (15_000_000 + 2 * largest as u64) / 1024;
    format!(
        "| peak RSS of the bridge while the agent streams {n} notifications to a reading editor, vs the bound (15 MB + 2 x the largest frame) | {bound_kib} KiB (bound) | {peak} KiB (bridge) | {:.2}x |",
        peak as f64 / bound_kib as f64
    )
}

/// The bridge (no sandbox) in front of a python fixture agent, driven as
/// an editor drives it: a frame sent, lines read up to its answer.
struct Bridged {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    line: Vec<u8>,
    /// The longest line read so far.
    largest: usize,
}

impl Bridged {
    fn start(home: &std::path::Path, agent: &[&str], env: &[(&str, &std::path::Path)]) -> Bridged {
        let mut cmd = Command::new(BIN);
        cmd.args(["--", "python3"])
            .args(agent)
            .env("HOME", home)
            .env("XDG_CONFIG_HOME", home.join("config"))
            .env("ZCODE_ACP_LOG", "error")
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
            line: Vec::new(),
            largest: 0,
        }
    }

    /// Sends `frame`, then reads up to the answer to `id`; returns that
    /// answer and every byte read on the way (its own included).
    fn until_answer(&mut self, frame: &str, id: u64) -> (String, usize) {
        writeln!(self.stdin, "{frame}").unwrap();
        self.stdin.flush().unwrap();
        let tag = format!(r#""id":{id}"#);
        let mut bytes = 0usize;
        loop {
            self.line.clear();
            let k = self.stdout.read_until(b'\n', &mut self.line).unwrap();
            assert!(k > 0, "the bridge closed stdout");
            bytes += k;
            self.largest = self.largest.max(k);
            let line = &self.line;
            let has = |pat: &[u8]| line.windows(pat.len()).any(|w| w == pat);
            if has(tag.as_bytes()) && !has(br#""method""#) {
                return (String::from_utf8_lossy(line).into_owned(), bytes);
            }
        }
    }

    /// `initialize`, then a session in `ws`; its id.
    fn handshake(&mut self, ws: &std::path::Path) -> String {
        self.until_answer(
            r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{}}}"#,
            1,
        );
        std::fs::create_dir_all(ws).unwrap();
        let (answer, _) = self.until_answer(
            &format!(
                r#"{{"jsonrpc":"2.0","id":2,"method":"session/new","params":{{"cwd":"{}","mcpServers":[]}}}}"#,
                ws.display()
            ),
            2,
        );
        answer
            .split(r#""sessionId":""#)
            .nth(1)
            .and_then(|r| r.split('"').next())
            .unwrap()
            .to_owned()
    }

    /// Closes the bridge's stdin and waits for it to end.
    fn stop(mut self) {
        drop(self.stdin);
        let _ = self.child.wait();
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

/// `zcode-acp run -- /bin/true` (policy discovery, namespaces, mounts,
/// Landlock, the PID namespace's init) against spawning /bin/true bare.
fn sandboxed_spawn(n: usize) -> String {
    let ws = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let home = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let run = |sandboxed: bool| -> Duration {
        let mut cmd = if sandboxed {
            let mut c = Command::new(BIN);
            c.args([
                "run",
                "--workspace",
                ws.path().to_str().unwrap(),
                "--",
                "/bin/true",
            ]);
            c
        } else {
            Command::new("/bin/true")
        };
        cmd.env("HOME", home.path()).env("ZCODE_ACP_LOG", "error");
        let start = Instant::now();
        let status = cmd.status().unwrap();
        let took = start.elapsed();
        assert!(
            status.success(),
            "the sandboxed spawn failed (needs root or user namespaces, and Landlock)"
        );
        took
    };
    let bare = median((0..n).map(|_| run(false)).collect());
    let sandboxed = median((0..n).map(|_| run(true)).collect());
    format!(
        "| spawn `/bin/true` under `zcode-acp run` vs bare ({n} each) | {:.2} ms | {:.2} ms | {:.1}x |",
        bare.as_secs_f64() * 1e3,
        sandboxed.as_secs_f64() * 1e3,
        sandboxed.as_secs_f64() / bare.as_secs_f64()
    )
}

/// `n` notifications of `size` bytes streamed from the agent to the editor
/// through the bridge, against `cat` relaying the same bytes (from the
/// same file) in the same run: throughput, and its ratio to `cat`'s.
fn stream_vs_cat(n: usize, size: usize) -> String {
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
    let drain = |r: &mut dyn std::io::Read| {
        let mut buf = vec![0u8; 1 << 20];
        let mut got = 0usize;
        loop {
            match r.read(&mut buf).unwrap() {
                0 => return got,
                k => got += k,
            }
        }
    };
    // Baseline: cat from the file to this process.
    let started = Instant::now();
    let mut cat = Command::new("cat")
        .arg(&frames)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let got = drain(cat.stdout.as_mut().unwrap());
    let cat_time = started.elapsed();
    let _ = cat.wait();
    assert_eq!(got as f64, total);
    // Through the bridge: the prompt's notifications, then its answer.
    let agent = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/stream_agent.py"
    );
    let mut b = Bridged::start(dir.path(), &[agent, frames.to_str().unwrap()], &[]);
    let sid = b.handshake(&dir.path().join("w"));
    let started = Instant::now();
    let (_, bytes) = b.until_answer(
        &format!(r#"{{"jsonrpc":"2.0","id":3,"method":"session/prompt","params":{{"sessionId":"{sid}","prompt":[]}}}}"#),
        3,
    );
    let bridge_time = started.elapsed();
    b.stop();
    assert!(
        bytes as f64 >= total,
        "the stream did not arrive whole: {bytes} of {total}"
    );
    let mbs = |d: Duration| total / d.as_secs_f64() / 1e6;
    let label = if size >= 1 << 20 {
        format!("{} MiB", size >> 20)
    } else {
        format!("{} KiB", size >> 10)
    };
    format!(
        "| stream of {n} notifications of {label}, agent to editor: `cat` relaying the same bytes vs the bridge (throughput; higher is better) | {:.0} MB/s | {:.0} MB/s | {:.2}x |",
        mbs(cat_time),
        mbs(bridge_time),
        mbs(bridge_time) / mbs(cat_time)
    )
}

/// One `run_code` call of `pass` in python through a running `zcode-acp
/// mcp` (JSON-RPC over its stdio, as an agent calls it: staging, arming
/// the sandbox, the run, collecting outputs, removing its directory)
/// against running the same interpreter bare with `-c pass`.
fn run_code_call(n: usize) -> String {
    let python = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty());
    let Some(python) = python else {
        return "| `run_code` of `pass` (python) vs bare `python3 -c pass` | skipped: no python3 | | |".into();
    };
    let ws = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let home = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let config = home.path().join(".config/zcode-acp");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(
        config.join("config.json"),
        serde_json::json!({"runCode": {"interpreters": {"python": [&python]}}}).to_string(),
    )
    .unwrap();
    let mut child = Command::new(BIN)
        .args(["mcp", "--workspace", ws.path().to_str().unwrap()])
        .env("HOME", home.path())
        .env("XDG_CONFIG_HOME", home.path().join(".config"))
        .env("ZCODE_ACP_LOG", "error")
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
    drop(stdin);
    let _ = child.wait();
    let bare: Vec<Duration> = (0..n)
        .map(|_| {
            let start = Instant::now();
            let status = Command::new(&python).args(["-c", "pass"]).status().unwrap();
            assert!(status.success());
            start.elapsed()
        })
        .collect();
    let (bare, via) = (median(bare), median(timed));
    format!(
        "| `run_code` call of `pass` (python, through `zcode-acp mcp`, sandboxed) vs bare `python3 -c pass` ({n} each) | {:.1} ms | {:.1} ms | {:.2}x |",
        bare.as_secs_f64() * 1e3,
        via.as_secs_f64() * 1e3,
        via.as_secs_f64() / bare.as_secs_f64()
    )
}

/// Writes the agent asks the editor to make (`fs/write_text_file`, from
/// the shell agent's `/write`), through a bridge without the sandbox and
/// through an armed one, which resolves and judges each path against the
/// policy before the editor sees it. Both bridges run the same agent; the
/// ratio is what judging costs per write, turn included.
fn judged_writes(n: usize) -> String {
    let ws = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let ws = std::fs::canonicalize(ws.path()).unwrap();
    let run = |armed: bool| -> Duration {
        let home = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let mut cmd = Command::new(BIN);
        cmd.args(["--", BIN, "shell-agent"])
            .env("HOME", home.path())
            // The agent's default state dir, which the armed sandbox makes
            // and keeps writable (the backend profile).
            .env("ZCODE_SHELL_AGENT_HOME", "")
            .env("ZCODE_ACP_LOG", "error")
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

/// File-heavy work in the workspace (a clone of a 3,000-file repository,
/// then its removal) under the sandbox with Claude's backend profile, whose
/// `~/.claude.json*` grant brings the supervisor's seccomp filter, against
/// the same sandbox with codex's profile, which has none. The ratio is what
/// the supervisor costs work that never touches the names it serves. Once
/// on this machine's disk, and once on a tmpfs (made in a mount namespace
/// of the benchmark's own), where nothing else hides the cost. Linux only:
/// Seatbelt expresses name prefixes itself.
#[cfg(target_os = "linux")]
fn supervised_file_work(runs: usize, files: usize) -> Vec<String> {
    let base = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
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
            .env("ZCODE_ACP_LOG", "error");
        if tmpfs {
            let ws = std::ffi::CString::new(ws.to_str().unwrap()).unwrap();
            // SAFETY: runs in the forked child before exec; system calls
            // only. The tmpfs is mounted only after the child is checked to
            // be in a mount namespace of its own.
            unsafe {
                std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
                    if libc::unshare(libc::CLONE_NEWNS) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    let mut st: libc::stat = std::mem::zeroed();
                    if libc::stat(c"/proc/self/ns/mnt".as_ptr(), &mut st) != 0
                        || st.st_ino == parent_ns
                    {
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
        let start = Instant::now();
        let status = cmd.status().unwrap();
        let took = start.elapsed();
        assert!(status.success(), "the sandboxed git clone failed");
        took
    };
    let mut rows = Vec::new();
    for (tmpfs, place) in [(false, "this machine's disk"), (true, "a tmpfs")] {
        let mut plain = Vec::new();
        let mut supervised = Vec::new();
        for _ in 0..runs {
            plain.push(run("codex", tmpfs));
            supervised.push(run("claude", tmpfs));
        }
        let (p, s) = (median(plain), median(supervised));
        rows.push(format!(
            "| `git clone` + `rm -rf` of {files} files in the workspace on {place}: supervised (Claude's profile) vs not (codex's), {runs} each | {:.0} ms | {:.0} ms | {:.2}x |",
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

fn main() {
    let state = tempfile::tempdir().unwrap();
    // `cargo bench` passes --bench; `cargo test` runs this once, small, so
    // a broken benchmark is noticed without paying for a real run.
    let full = std::env::args().any(|a| a == "--bench");
    let (rounds, small_n, big_n) = if full { (5, 3000, 8) } else { (1, 20, 1) };
    let big = format!(r#"{{"blob":"{}"}}"#, "b".repeat(16 << 20));

    let mut rows = Vec::new();
    let mut direct_small = Vec::new();
    let mut bridged_small = Vec::new();
    let mut direct_big = Vec::new();
    let mut bridged_big = Vec::new();
    let mut rss = (0u64, 0u64);
    for _ in 0..rounds {
        for bridged in [false, true] {
            let mut p = Peer::start(bridged, state.path());
            let small = time(|| {
                for _ in 0..small_n {
                    p.round_trip("_bench/ping", "{}");
                }
            });
            let large = time(|| {
                for _ in 0..big_n {
                    p.round_trip("_bench/big", &big);
                }
            });
            if bridged {
                bridged_small.push(small);
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
                direct_small.push(small);
                direct_big.push(large);
            }
        }
    }
    let per = |d: Duration, n: u32| d / n;
    let (ds, bs) = (median(direct_small), median(bridged_small));
    let (db, bb) = (median(direct_big), median(bridged_big));
    rows.push(format!(
        "| small request round trip ({small_n} sequential) | {:.1} µs | {:.1} µs | {:.2}x |",
        per(ds, small_n).as_secs_f64() * 1e6,
        per(bs, small_n).as_secs_f64() * 1e6,
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
    rows.push(streamed_notifications(if full { 1_000_000 } else { 1000 }));
    rows.push(stream_vs_cat(if full { 100_000 } else { 100 }, 1 << 10));
    rows.push(stream_vs_cat(if full { 200 } else { 2 }, 1 << 20));
    rows.push(sandboxed_spawn(if full { 30 } else { 2 }));
    rows.push(run_code_call(if full { 30 } else { 2 }));
    rows.push(judged_writes(if full { 200 } else { 2 }));
    rows.extend(supervised_file_work(
        if full { 9 } else { 1 },
        if full { 3000 } else { 100 },
    ));
    #[cfg(target_os = "linux")]
    if full {
        rows.extend(builds::cache_builds(5));
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
