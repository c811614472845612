//! The bridge with the embedded shell agent: restarts, crashes, ordering,
//! and shutdown, all through the real binary.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};

fn stop_reason(r: &Value) -> &str {
    r["result"]["stopReason"]
        .as_str()
        .unwrap_or_else(|| panic!("no stopReason in {r}"))
}

fn restart_with_ten_sessions(opts: Options) {
    let mut ed = Editor::start_with(opts);
    ed.initialize();
    let sids: Vec<String> = (0..10)
        .map(|i| ed.new_session(&workspace(&ed, &format!("w{i}"))))
        .collect();
    ed.call(
        "session/set_mode",
        json!({"sessionId": sids[3], "modeId": "dry-run"}),
    );
    let (_, old_pid) = ed.prompt(&sids[0], "echo $PPID");

    // A turn is running when the restart is asked for: it must finish.
    let long = ed.prompt_request(&sids[1], "sleep 1; echo finished-before-restart");
    std::thread::sleep(Duration::from_millis(200));
    sighup(ed.pid());
    std::thread::sleep(Duration::from_millis(200));
    let start = ed.seen.len();
    let queued: Vec<Value> = sids
        .iter()
        .map(|sid| ed.prompt_request(sid, "echo $PPID"))
        .collect();

    let r = ed.response(&long);
    assert_eq!(
        stop_reason(&r),
        "end_turn",
        "the running turn was not killed: {r}"
    );
    for (i, id) in queued.iter().enumerate() {
        let r = ed.response(id);
        assert_eq!(stop_reason(&r), "end_turn", "queued prompt {i}: {r}");
    }
    ed.drain_for(Duration::from_millis(300));
    for id in queued.iter().chain([&long]) {
        assert_eq!(ed.responses_to(id), 1, "exactly one response to {id}");
    }
    for (i, sid) in sids.iter().enumerate() {
        let text = ed.agent_text_since(start, sid);
        if i == 3 {
            assert_eq!(
                text, "dry-run: would run `echo $PPID`",
                "the mode survived the restart"
            );
        } else {
            let pid = text.trim();
            assert!(
                !pid.is_empty() && pid != old_pid.trim(),
                "session {i} ran on the new backend: {pid} vs {old_pid}"
            );
        }
    }
    // The restore never shows the editor history it already has.
    let replays = ed.seen[start..]
        .iter()
        .filter(|l| l.value["params"]["update"]["sessionUpdate"] == "user_message_chunk")
        .count();
    assert_eq!(replays, 0);
    // The restored sessions keep working in order.
    let (r, text) = ed.prompt(&sids[9], "echo still-here");
    assert_eq!(stop_reason(&r), "end_turn");
    assert_eq!(text, "still-here\n");
}

#[test]
fn a_restart_with_ten_sessions_and_queued_prompts_loses_nothing_via_resume() {
    restart_with_ten_sessions(Options::new(shell_agent()));
}

#[test]
fn a_restart_with_ten_sessions_and_queued_prompts_loses_nothing_via_load() {
    restart_with_ten_sessions(Options::new(shell_agent()).env("ZCODE_SHELL_AGENT_NO_RESUME", "1"));
}

#[test]
fn notifications_of_each_session_keep_their_order() {
    let mut ed = Editor::start(shell_agent());
    ed.initialize();
    let a = ed.new_session(&workspace(&ed, "a"));
    let b = ed.new_session(&workspace(&ed, "b"));
    let start = ed.seen.len();
    let ra = ed.prompt_request(&a, "seq 1 3000");
    let rb = ed.prompt_request(&b, "seq 5001 8000");
    ed.response(&ra);
    ed.response(&rb);
    let expect = |from: u32, to: u32| (from..=to).map(|i| format!("{i}\n")).collect::<String>();
    assert_eq!(ed.agent_text_since(start, &a), expect(1, 3000));
    assert_eq!(ed.agent_text_since(start, &b), expect(5001, 8000));
}

#[test]
fn a_sigkill_from_inside_mid_turn_yields_one_error_and_leaves_nothing_behind() {
    let mut ed = Editor::start(shell_agent());
    ed.initialize();
    let ws = workspace(&ed, "w");
    let sid = ed.new_session(&ws);
    // The command kills its own agent with SIGKILL and keeps running: the
    // bridge must answer the turn once and kill what the dead agent left.
    let id = ed.prompt_request(&sid, "echo $$ > shell.pid; kill -9 $PPID; sleep 60");
    let r = ed.response(&id);
    assert_eq!(r["error"]["code"], -32090, "{r}");
    let leftover: i32 = std::fs::read_to_string(ws.join("shell.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    wait_until("the old generation's shell is gone", || !alive(leftover));

    let (r, text) = ed.prompt(&sid, "echo alive");
    assert_eq!(stop_reason(&r), "end_turn", "{r}");
    assert_eq!(text, "alive\n");
    ed.drain_for(Duration::from_millis(200));
    assert_eq!(ed.responses_to(&id), 1);
}

fn leave_a_daemon(ed: &mut Editor) -> (i32, i32) {
    let ws = workspace(ed, "w");
    let sid = ed.new_session(&ws);
    let (r, _) = ed.prompt(
        &sid,
        "echo $PPID > agent.pid; setsid sh -c 'echo $$ > daemon.pid; exec sleep 300' >/dev/null 2>&1 </dev/null & sleep 0.3",
    );
    assert_eq!(stop_reason(&r), "end_turn");
    let read = |f: &str| -> i32 {
        std::fs::read_to_string(ws.join(f))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let (agent, daemon) = (read("agent.pid"), read("daemon.pid"));
    assert!(alive(agent) && alive(daemon));
    (agent, daemon)
}

#[test]
fn editor_eof_stops_the_backend_and_everything_it_started() {
    let mut ed = Editor::start(shell_agent());
    ed.initialize();
    let (agent, daemon) = leave_a_daemon(&mut ed);
    ed.close_stdin();
    assert_eq!(ed.wait_exit(), Some(0));
    assert!(!alive(agent), "the agent outlived the bridge");
    assert!(
        !alive(daemon),
        "a setsid daemon of the agent outlived the bridge"
    );
}

#[test]
fn sigterm_stops_the_backend_and_everything_it_started() {
    let mut ed = Editor::start(shell_agent());
    ed.initialize();
    let (agent, daemon) = leave_a_daemon(&mut ed);
    // SAFETY: kill(2) on the bridge this test started.
    unsafe { libc::kill(ed.pid(), libc::SIGTERM) };
    assert_eq!(ed.wait_exit(), Some(0));
    assert!(!alive(agent) && !alive(daemon));
}

#[test]
fn a_restart_kills_what_the_old_generation_left_running() {
    let mut ed = Editor::start(shell_agent());
    ed.initialize();
    let (agent, daemon) = leave_a_daemon(&mut ed);
    sighup(ed.pid());
    wait_until("the old generation is gone", || {
        !alive(agent) && !alive(daemon)
    });
    assert!(ed.child.try_wait().unwrap().is_none());
}

#[test]
fn cancel_stops_the_running_command() {
    let mut ed = Editor::start(shell_agent());
    ed.initialize();
    let sid = ed.new_session(&workspace(&ed, "w"));
    let id = ed.prompt_request(&sid, "sleep 60");
    ed.wait_for("the agent's tool call", |v| {
        v["params"]["update"]["sessionUpdate"] == "tool_call"
            && v["params"]["update"]["toolCallId"]
                .as_str()
                .is_some_and(|t| t.starts_with("sh-"))
    });
    ed.notify("session/cancel", json!({"sessionId": sid}));
    let r = ed.response(&id);
    assert_eq!(stop_reason(&r), "cancelled");
}

#[test]
fn write_prompts_go_through_the_editor() {
    let mut ed = Editor::start(shell_agent());
    ed.initialize();
    let ws = workspace(&ed, "w");
    let sid = ed.new_session(&ws);
    let (r, text) = ed.prompt(&sid, "/write notes.txt hello from the agent");
    assert_eq!(stop_reason(&r), "end_turn");
    assert!(text.starts_with("wrote "), "{text}");
    assert_eq!(
        std::fs::read_to_string(ws.join("notes.txt")).unwrap(),
        "hello from the agent"
    );
}

/// The official TypeScript SDK as the editor. `.ci/run` installs it; a
/// developer without it sees the skip reason (and CI refuses to skip).
#[test]
fn the_official_typescript_sdk_works_as_the_editor() {
    let sdk = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk");
    if !sdk.join("node_modules/@agentclientprotocol/sdk").is_dir() {
        skip("the ACP TypeScript SDK is not installed (run: npm ci --prefix tests/sdk)");
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let ws = home.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let out = std::process::Command::new("node")
        .arg(sdk.join("editor.mjs"))
        .arg(BIN)
        .arg(&ws)
        .env("ZCODE_SHELL_AGENT_HOME", home.path().join("sa"))
        .output()
        .expect("run node");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("all checks passed"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The README's first command.
#[test]
fn the_demo_runs_end_to_end() {
    let home = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(BIN)
        .arg("demo")
        .env("HOME", home.path())
        .env("XDG_CONFIG_HOME", home.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for expected in [
        "| hello from the agent",
        "| same session, new agent pid:",
        "the agent asks the editor to write",
        "<- bridge exited: exit status: 0",
        "files in the workspace: hello.txt, notes.txt",
    ] {
        assert!(
            stdout.contains(expected),
            "missing `{expected}` in:\n{stdout}"
        );
    }
    // The demo waits for the restart: the next prompt meets a new agent,
    // announced before it.
    let pid_after = |marker: &str| {
        stdout
            .lines()
            .find_map(|l| l.split(marker).nth(1))
            .map(|p| p.trim().to_owned())
            .unwrap_or_else(|| panic!("no `{marker}` in:\n{stdout}"))
    };
    let (old, new) = (pid_after("| agent pid:"), pid_after("new agent pid:"));
    assert_ne!(
        old, new,
        "the prompt after the restart met the old agent:\n{stdout}"
    );
    let restarted = stdout.find("(restarted)").expect("the restart notice");
    assert!(
        restarted < stdout.find("new agent pid:").unwrap(),
        "{stdout}"
    );
    assert!(stdout.contains("legend:"), "{stdout}");
}

#[test]
fn the_first_session_is_told_the_agent_runs_unconfined() {
    let mut ed = Editor::start(shell_agent());
    ed.initialize();
    let first = ed.new_session(&workspace(&ed, "a"));
    let second = ed.new_session(&workspace(&ed, "b"));
    ed.prompt(&second, "true");
    let states: Vec<&Line> = ed
        .seen
        .iter()
        .filter(|l| {
            l.value["params"]["update"]["toolCallId"]
                .as_str()
                .is_some_and(|t| t.starts_with("zcode-acp-sandbox"))
        })
        .collect();
    assert_eq!(states.len(), 1, "once per bridge");
    assert_eq!(states[0].value["params"]["sessionId"], first.as_str());
    assert_eq!(
        states[0].value["params"]["update"]["title"],
        "Sandbox: unconfined (no sandbox)"
    );
}

#[test]
fn a_sigkilled_unconfined_bridge_leaves_nothing_of_the_agents_tree_alive() {
    let mut ed = Editor::start(shell_agent());
    ed.initialize();
    let ws = workspace(&ed, "w");
    let sid = ed.new_session(&ws);
    // A command still running when the bridge dies, and a setsid daemon
    // that left the agent's process group.
    let _turn = ed.prompt_request(
        &sid,
        "echo $PPID > agent.pid; setsid sh -c 'echo $$ > daemon.pid; exec sleep 300' >/dev/null 2>&1 </dev/null & echo $$ > command.pid; sleep 300",
    );
    let read = |f: &str| -> Option<i32> {
        std::fs::read_to_string(ws.join(f))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    // The three the shell names, and everything below the agent (the
    // command's own `sleep` too), as /proc lists each process's children.
    let walk = || -> Vec<i32> {
        let mut tree: Vec<i32> = ["agent.pid", "daemon.pid", "command.pid"]
            .iter()
            .filter_map(|f| read(f))
            .collect();
        let mut i = 0;
        while i < tree.len() {
            let pid = tree[i];
            let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
                .unwrap_or_default();
            for child in children.split_whitespace().filter_map(|c| c.parse().ok()) {
                if !tree.contains(&child) {
                    tree.push(child);
                }
            }
            i += 1;
        }
        tree
    };
    wait_until(
        "the agent's tree is running, the command's sleep too",
        || {
            ["agent.pid", "daemon.pid", "command.pid"]
                .iter()
                .all(|f| read(f).is_some())
                && walk().len() > 3
        },
    );
    let tree = walk();
    assert!(tree.iter().all(|p| alive(*p)), "{tree:?}");
    // SAFETY: kill(2) on the bridge this test started.
    unsafe { libc::kill(ed.pid(), libc::SIGKILL) };
    ed.wait_exit();
    wait_until("nothing of the agent's tree is alive", || {
        tree.iter().all(|p| !alive(*p))
    });
}
