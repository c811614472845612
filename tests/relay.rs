//! The relay, driven through the real binary against a scripted backend.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};

fn read_log(editor: &Editor, name: &str) -> Vec<String> {
    std::fs::read_to_string(editor.home().join(name))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// SIGHUPs the bridge and waits until the new generation got its replayed
/// initialize: from then on, editor requests wait for the restore.
fn restart(ed: &Editor) {
    let count = || {
        read_log(ed, "received.log")
            .iter()
            .filter(|l| l.contains("\"initialize\""))
            .count()
    };
    let before = count();
    sighup(ed.pid());
    wait_until("the restarted backend is initialized", || count() > before);
}

fn error_code(r: &Value) -> i64 {
    r["error"]["code"]
        .as_i64()
        .unwrap_or_else(|| panic!("expected an error, got {r}"))
}

/// A session restored on a restarted agent gets its `mcpServers` as the
/// editor wrote them, byte for byte (unknown fields, spacing and the
/// spelling of numbers included), not as the bridge would write them.
#[test]
fn a_restore_replays_the_editors_mcp_servers_byte_for_byte() {
    let mut ed = Editor::start_with(Options::new(fake_agent()).env("FAKE_RESUME", "1"));
    ed.initialize();
    let ws = workspace(&ed, "w");
    let servers = r#"[ {"name":"m", "command":"c","args":[],"env":[],"future":1.50,"_meta":{"k":"\u00e9"}} ]"#;
    ed.send_raw(&format!(
        r#"{{"jsonrpc":"2.0","id":"new-1","method":"session/new","params":{{"cwd":{},"mcpServers":{servers}}}}}"#,
        serde_json::to_string(&ws).unwrap()
    ));
    let sid = ed.response(&json!("new-1"))["result"]["sessionId"]
        .as_str()
        .unwrap()
        .to_owned();
    restart(&ed);
    let (r, _) = ed.prompt(&sid, "pid");
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    let restored = read_log(&ed, "received.log")
        .into_iter()
        .find(|l| l.contains("\"session/resume\""))
        .expect("the session was restored");
    assert!(restored.contains(servers), "{restored}");
}

/// While the agent restarts, editor requests wait in a queue of bounded
/// length; one past it is answered at once with -32098, and every request
/// gets exactly one answer.
#[test]
fn a_full_restart_queue_answers_what_it_cannot_hold() {
    let gate = tempfile::NamedTempFile::new().unwrap();
    let mut ed = Editor::start_with(
        Options::new(fake_agent()).env("FAKE_WAIT_AT_START_IF", gate.path().to_str().unwrap()),
    );
    // The first generation starts at once; the gate holds the next one.
    let first = gate.path().to_path_buf();
    let held_open = first.with_extension("off");
    std::fs::rename(&first, &held_open).unwrap();
    ed.initialize();
    let sid = ed.new_session(&workspace(&ed, "w"));
    let (_, pid) = ed.prompt(&sid, "pid");
    let pid: i32 = pid.trim().parse().unwrap();
    std::fs::rename(&held_open, &first).unwrap();
    sighup(ed.pid());
    // Once the first agent is gone, the bridge waits for the next, which
    // the gate holds: from then on editor requests are queued.
    wait_until("the first agent is stopped", || {
        !std::path::Path::new(&format!("/proc/{pid}")).exists()
    });
    const QUEUE: usize = 1024;
    let sent: Vec<Value> = (0..QUEUE + 6)
        .map(|i| ed.request("_test/echo", json!({ "x": i })))
        .collect();
    // Past the queue: refused at once, while the agent is still starting.
    for id in &sent[QUEUE..] {
        assert_eq!(error_code(&ed.response(id)), -32098, "{id}");
    }
    std::fs::remove_file(&first).unwrap();
    for (i, id) in sent[..QUEUE].iter().enumerate() {
        let r = ed.response(id);
        assert_eq!(r["result"]["echo"]["x"], i, "{r}");
    }
    // Exactly one answer each.
    for id in &sent {
        let answers = ed.seen.iter().filter(|l| l.value["id"] == *id).count();
        assert_eq!(answers, 1, "{id}");
    }
}

#[test]
fn unknown_methods_fields_and_meta_arrive_byte_identical() {
    let mut ed = Editor::start(fake_agent());
    let init_id = ed.request(
        "initialize",
        json!({"protocolVersion": 1, "clientCapabilities": {}, "_meta": {"editor": "x"}}),
    );
    let init = ed.response(&init_id);
    // The legacy `models` field and `_meta` of the agent's answer survive.
    assert_eq!(init["result"]["models"]["legacy"], true);

    // A request with odd spacing, a string id, unknown fields and _meta.
    let sent = r#"{ "jsonrpc":"2.0", "id" : "str-1", "method":"_test/echo", "params":{"a":1,"_meta":{"trace":"t"},"unknownField":[true,null,"\u00e9"]} }"#;
    ed.send_raw(sent);
    let reply = ed.wait_for("the echo", |v| v["id"] == "str-1").raw;

    // What the backend got is what the editor sent, but for the id.
    let got = read_log(&ed, "received.log")
        .into_iter()
        .find(|l| l.contains("_test/echo"))
        .unwrap();
    let bridge_id = serde_json::from_str::<Value>(&got).unwrap()["id"].clone();
    assert!(
        bridge_id.is_u64(),
        "the bridge remaps editor ids to its own: {got}"
    );
    assert_eq!(got, sent.replace(r#""str-1""#, &bridge_id.to_string()));

    // What the editor got is what the backend wrote, but for the id.
    let wrote = read_log(&ed, "sent.log")
        .into_iter()
        .find(|l| l.contains("\"echo\""))
        .unwrap();
    assert_eq!(
        reply,
        wrote.replacen(&format!(r#""id" : {bridge_id}"#), r#""id" : "str-1""#, 1)
    );
    assert!(
        reply.contains(r#""_meta": {"k": "\u00e9"}"#) && reply.contains("2.50"),
        "{reply}"
    );

    // Notifications pass untouched both ways.
    let note =
        r#"{"jsonrpc":"2.0","method":"_test/notify","params":{"x":  [1, 2.0],"_meta":{"m":1}}}"#;
    ed.send_raw(note);
    let back = ed
        .wait_for("the notified echo", |v| v["method"] == "_test/notified")
        .raw;
    assert!(read_log(&ed, "received.log").iter().any(|l| l == note));
    let wrote = read_log(&ed, "sent.log")
        .into_iter()
        .find(|l| l.contains("_test/notified"))
        .unwrap();
    assert_eq!(back, wrote);
}

#[test]
fn backend_requests_get_collision_free_ids_across_restarts() {
    let mut ed = Editor::start_with(Options::new(fake_agent()).env("FAKE_RESUME", "1"));
    ed.initialize();
    let mut question_ids = Vec::new();
    for round in 0..2 {
        let ask = ed.request("_test/ask", json!({}));
        let q = ed
            .wait_for("the backend's question", |v| {
                v["method"] == "_test/question"
            })
            .value;
        question_ids.push(q["id"].clone());
        ed.send(&json!({"jsonrpc": "2.0", "id": q["id"], "result": {"answer": round}}));
        let r = ed.response(&ask);
        assert_eq!(r["result"]["editorSaid"]["answer"], round, "{r}");
        if round == 0 {
            restart(&ed);
        }
    }
    // Each backend generation numbers its requests from the start, but the
    // editor never sees the same id twice.
    assert_ne!(question_ids[0], question_ids[1]);
    // The replayed initialize was answered to the bridge, not the editor.
    let inits = ed
        .seen
        .iter()
        .filter(|l| l.value["result"]["protocolVersion"] == 1)
        .count();
    assert_eq!(inits, 1);
}

#[test]
fn frames_of_sixteen_mib_and_more_pass_both_ways() {
    let mut ed = Editor::start(fake_agent());
    ed.initialize();
    let size = 17 * 1024 * 1024;
    let pad = "p".repeat(size);
    let id = ed.request("_test/big", json!({"size": size, "pad": pad}));
    let r = ed.response(&id);
    assert_eq!(r["result"]["blob"].as_str().unwrap().len(), size);
    let got = read_log(&ed, "received.log")
        .into_iter()
        .find(|l| l.contains("_test/big"))
        .unwrap();
    assert!(got.len() > size);
}

/// The pipes the agent's frames cross (the agent's stdout, the bridge's
/// stdout) are widened to hold a 1 MiB frame whole once a large frame
/// crosses them, and not before (a 64 KiB pipe made each such frame
/// sixteen turns of writer and reader: issue 31's stream row; a wider one
/// costs the user's pipe allowance): asked of the pipes the processes hold.
#[cfg(target_os = "linux")]
#[test]
fn a_large_frame_widens_the_pipes_it_crosses_and_small_ones_do_not() {
    use std::os::unix::fs::OpenOptionsExt;
    let allowed: usize = std::fs::read_to_string("/proc/sys/fs/pipe-max-size")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let wide = (1usize << 20).min(allowed);
    let (default, widened) = {
        // Closed at once: it would hold a share of the user's allowance
        // for pipes that the bridge's own widening then lacks.
        let (_r, probe) = nix::unistd::pipe().unwrap();
        let default =
            nix::fcntl::fcntl(&probe, nix::fcntl::FcntlArg::F_GETPIPE_SZ).unwrap() as usize;
        let widened =
            nix::fcntl::fcntl(&probe, nix::fcntl::FcntlArg::F_SETPIPE_SZ(wide as i32)).is_ok();
        (default, widened)
    };
    if wide <= default || !widened {
        eprintln!("skipped: pipes cannot be widened past {default} bytes here");
        return;
    }
    let mut ed = Editor::start(fake_agent());
    ed.initialize();
    let sid = ed.new_session(&workspace(&ed, "w"));
    let (_, agent) = ed.prompt(&sid, "pid");
    let pipes = [
        ("the bridge's stdout (to the editor)", ed.pid().to_string()),
        (
            "the agent's stdout (to the bridge)",
            agent.trim().to_owned(),
        ),
    ];
    let size = |(whose, pid): &(&str, String)| {
        // The same pipe, opened anew: nothing is read from it.
        let pipe = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(format!("/proc/{pid}/fd/1"))
            .unwrap_or_else(|e| panic!("{whose}: {e}"));
        nix::fcntl::fcntl(&pipe, nix::fcntl::FcntlArg::F_GETPIPE_SZ).unwrap() as usize
    };
    for p in &pipes {
        assert!(size(p) < wide, "{} was widened before any large frame", p.0);
    }
    let id = ed.request("_test/big", json!({"size": 100 * 1024}));
    assert_eq!(
        ed.response(&id)["result"]["blob"].as_str().unwrap().len(),
        100 * 1024
    );
    for p in &pipes {
        let size = size(p);
        assert!(size >= wide, "{} holds {size} bytes, not {wide}", p.0);
    }
}

#[test]
fn oversize_frames_are_refused_with_a_clear_error() {
    let mut ed = Editor::start_with(
        Options::new(fake_agent())
            .arg("--max-frame-bytes")
            .arg("1MiB"),
    );
    ed.initialize();
    ed.send_raw(&format!(
        r#"{{"jsonrpc":"2.0","id":77,"method":"_test/echo","params":{{"pad":"{}"}}}}"#,
        "q".repeat(2 << 20)
    ));
    let r = ed.response(&json!(77));
    assert_eq!(error_code(&r), -32094);
    assert!(r["error"]["message"]
        .as_str()
        .unwrap()
        .contains("--max-frame-bytes"));

    // A too-large answer from the backend still answers the editor once.
    let id = ed.request("_test/big", json!({"size": 2 << 20}));
    let r = ed.response(&id);
    assert_eq!(error_code(&r), -32094, "{r}");

    let ok = ed.call("_test/echo", json!({"small": true}));
    assert_eq!(ok["echo"]["small"], true);

    // A too-large answer from the editor to the agent's question reaches
    // the agent as an error, and the editor hears nothing for it: no
    // stray answer to an id of the editor's own.
    let asked = ed.request("_test/ask", json!({}));
    let question = ed
        .wait_for("the question", |v| v["method"] == "_test/question")
        .value;
    let qid = question["id"].clone();
    ed.send_raw(&format!(
        r#"{{"jsonrpc":"2.0","id":{qid},"result":{{"pad":"{}"}}}}"#,
        "a".repeat(2 << 20)
    ));
    let r = ed.response(&asked);
    assert_eq!(r["result"]["editorSaid"]["code"], -32094, "{r}");
    ed.drain_for(Duration::from_millis(200));
    assert_eq!(
        ed.responses_to(&qid),
        0,
        "the editor got an answer to its own answer"
    );
    assert_eq!(ed.responses_to(&asked), 1);
}

#[test]
fn malformed_frames_from_either_side_leave_the_relay_running() {
    let mut ed = Editor::start(fake_agent());
    ed.initialize();
    ed.send_raw(r#"{"jsonrpc":"2.0","id":5,"method":"session/new","params":{"#);
    let r = ed.response(&json!(5));
    assert_eq!(error_code(&r), -32700);
    ed.send_raw(r#"{"jsonrpc":"2.0","id":6}"#);
    let r = ed.response(&json!(6));
    assert_eq!(error_code(&r), -32600);
    ed.send_raw("complete garbage");
    ed.send_raw("[1,2,3]");

    let r = ed.call("_test/garbage", json!({}));
    assert_eq!(r["ok"], true);
    let sid = ed.new_session(&workspace(&ed, "w"));
    let (r, text) = ed.prompt(&sid, "malformed");
    assert_eq!(r["result"]["stopReason"], "end_turn");
    assert_eq!(text, "after garbage");
}

#[test]
fn only_strict_json_rpc_crosses_the_bridge_and_every_refusal_is_answered() {
    let mut ed = Editor::start(fake_agent());
    ed.initialize();
    // A batch (an array) gets one error and never reaches the agent.
    ed.send_raw(r#"[201,"_test/echo",{"x":"batch"}]"#);
    let r = ed.wait_for("the batch's error", |v| {
        v["id"].is_null() && v["error"].is_object()
    });
    assert_eq!(error_code(&r.value), -32600);
    assert!(r.value["error"]["message"]
        .as_str()
        .unwrap()
        .contains("batch"));
    // Without a version (as Zed wrote frames until September 2025): taken,
    // and the agent gets it as JSON-RPC 2.0, nothing else changed.
    ed.send_raw(r#"{"id":7,"method":"_test/echo","params":{"x":"no-version"}}"#);
    assert_eq!(ed.response(&json!(7))["result"]["echo"]["x"], "no-version");
    let got = read_log(&ed, "received.log");
    let got = got.iter().find(|l| l.contains("no-version")).unwrap();
    assert!(
        got.starts_with(r#"{"jsonrpc":"2.0","id":"#)
            && got.ends_with(r#","method":"_test/echo","params":{"x":"no-version"}}"#),
        "{got}"
    );
    // Another version, with a readable id: answered, never forwarded.
    ed.send_raw(r#"{"jsonrpc":"1.0","id":"v1","method":"_test/echo","params":{"x":"v1"}}"#);
    assert_eq!(error_code(&ed.response(&json!("v1"))), -32600);
    // An id past 256 bytes: refused, answered to a null id.
    let long = "i".repeat(300);
    ed.send_raw(&format!(
        r#"{{"jsonrpc":"2.0","id":"{long}","method":"_test/echo","params":{{"x":"long-id"}}}}"#
    ));
    let r = ed.wait_for("the long id's refusal", |v| {
        v["id"].is_null()
            && v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.contains("batch"))
    });
    assert_eq!(error_code(&r.value), -32600);
    // Ids that are neither strings nor integers, and nesting past the bound:
    // never forwarded; a request whose id JSON-RPC does not allow (an
    // object, an array, a boolean, one too deep to read) is answered to a
    // null id, as JSON-RPC says.
    for bad in [r#"{"a":1}"#, "[7]", "true"] {
        ed.send_raw(&format!(
            r#"{{"jsonrpc":"2.0","id":{bad},"method":"_test/echo","params":{{"x":"object-id"}}}}"#
        ));
        let r = ed.wait_for("a null-id refusal", |v| {
            v["id"].is_null()
                && v["error"]["message"]
                    .as_str()
                    .is_some_and(|m| !m.contains("batch"))
        });
        assert_eq!(error_code(&r.value), -32600, "{bad}");
    }
    ed.send_raw(r#"{"jsonrpc":"2.0","id":1.5,"method":"_test/echo","params":{"x":"fraction-id"}}"#);
    // An id JSON-RPC allows but the bridge does not route by: refused, and
    // the refusal answered to it as written.
    assert_eq!(error_code(&ed.response(&json!(1.5))), -32600);
    ed.send_raw(&format!(
        r#"{{"jsonrpc":"2.0","id":{}1{},"method":"_test/echo","params":{{"x":"deep-id"}}}}"#,
        "[".repeat(100_000),
        "]".repeat(100_000)
    ));
    let r = ed.wait_for("the deep id's refusal", |v| {
        v["id"].is_null()
            && v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.contains("batch"))
    });
    assert_eq!(error_code(&r.value), -32600);
    ed.send_raw(
        &format!(
            r#"{{"jsonrpc":"2.0","id":9,"method":"_test/echo","params":{{"x":"deep",
        "y":{}0{}}}}}"#,
            "[".repeat(1100),
            "]".repeat(1100)
        )
        .replace('\n', ""),
    );
    assert_eq!(error_code(&ed.response(&json!(9))), -32600);

    // An answer the agent garbled reaches the editor as an error, never as
    // silence; a request of the agent's own that is no JSON-RPC 2.0 is
    // answered by the bridge and never shown to the editor.
    let id = ed.request("_test/garbled", json!({}));
    let r = ed.response(&id);
    assert_eq!(error_code(&r), -32603, "{r}");
    assert!(r["error"]["message"]
        .as_str()
        .unwrap()
        .contains("could not be read"));
    assert_eq!(ed.call("_test/bad-request", json!({}))["ok"], true);
    let r = ed.call("_test/echo", json!({"x": "after"}));
    assert_eq!(r["echo"]["x"], "after");
    wait_until("the agent got the bridge's answer", || {
        read_log(&ed, "received.log")
            .iter()
            .any(|l| l.contains("\"agent-1\"") && l.contains("-32600"))
    });
    assert!(!ed.seen.iter().any(|l| l.raw.contains("agent-1")));

    let received = read_log(&ed, "received.log").join("\n");
    for never in [
        "batch",
        "long-id",
        "\"v1\"",
        "object-id",
        "fraction-id",
        "deep-id",
        "\"deep\"",
    ] {
        assert!(!received.contains(never), "{never} reached the agent");
    }
}

#[test]
fn a_crash_mid_turn_answers_once_and_the_session_survives() {
    let mut ed = Editor::start_with(Options::new(fake_agent()).env("FAKE_RESUME", "1"));
    ed.initialize();
    let sid = ed.new_session(&workspace(&ed, "w"));
    let (_, pid_before) = ed.prompt(&sid, "pid");
    let id = ed.prompt_request(&sid, "crash");
    let r = ed.response(&id);
    assert_eq!(error_code(&r), -32090);
    assert!(r["error"]["message"].as_str().unwrap().contains("crashed"));

    let (r, pid_after) = ed.prompt(&sid, "pid");
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    assert_ne!(pid_before, pid_after, "a new backend generation answers");
    ed.drain_for(Duration::from_millis(200));
    assert_eq!(ed.responses_to(&id), 1);
    let restores = std::fs::read_to_string(ed.home().join("restores.log")).unwrap();
    assert!(restores.contains(&format!("session/resume {sid}")));
}

#[test]
fn an_answer_reaches_the_editor_before_the_agent_that_gave_it_is_stopped() {
    let mut ed = Editor::start_with(Options::new(fake_agent()).env("FAKE_RESUME", "1"));
    ed.initialize();
    let sid = ed.new_session(&workspace(&ed, "w"));
    let (_, pid) = ed.prompt(&sid, "pid");
    let pid: i32 = pid.trim().parse().unwrap();
    // A restart asked while the prompt runs waits for its answer, then
    // stops the agent, which ignores SIGTERM: the stop takes the grace
    // period (3 s). The answer must not wait for it.
    let id = ed.prompt_request(&sid, "answer-then-linger");
    wait_until("the agent has the prompt", || {
        read_log(&ed, "received.log")
            .iter()
            .any(|l| l.contains("answer-then-linger"))
    });
    sighup(ed.pid());
    let r = ed.response(&id);
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    // SAFETY: kill(2) with signal 0 only asks whether the process exists.
    let alive = unsafe { libc::kill(pid, 0) } == 0;
    assert!(
        alive,
        "the answer was held back until its agent was stopped (killed after the grace period)"
    );
}

#[test]
fn load_restores_without_showing_replayed_history() {
    let mut ed = Editor::start_with(Options::new(fake_agent()).env("FAKE_LOAD", "1"));
    ed.initialize();
    let sids: Vec<String> = (0..3)
        .map(|i| ed.new_session(&workspace(&ed, &format!("w{i}"))))
        .collect();
    restart(&ed);
    for sid in &sids {
        let (r, _) = ed.prompt(sid, "notify 2");
        assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    }
    let restores = std::fs::read_to_string(ed.home().join("restores.log")).unwrap();
    for sid in &sids {
        assert!(
            restores.contains(&format!("session/load {sid}")),
            "{restores}"
        );
    }
    assert!(!ed.seen.iter().any(|l| l.raw.contains("REPLAYED HISTORY")));
}

#[test]
fn a_refused_resume_falls_back_to_load_without_showing_the_replay() {
    let mut ed = Editor::start_with(
        Options::new(fake_agent())
            .env("FAKE_RESUME", "1")
            .env("FAKE_LOAD", "1")
            .env("FAKE_REFUSE_RESUME", "1"),
    );
    ed.initialize();
    let sid = ed.new_session(&workspace(&ed, "w"));
    restart(&ed);
    let (r, _) = ed.prompt(&sid, "notify 1");
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    let restores = std::fs::read_to_string(ed.home().join("restores.log")).unwrap();
    let resume = restores.find(&format!("session/resume {sid}"));
    let load = restores.find(&format!("session/load {sid}"));
    assert!(
        matches!((resume, load), (Some(a), Some(b)) if a < b),
        "resume first, then load: {restores}"
    );
    assert!(!ed.seen.iter().any(|l| l.raw.contains("REPLAYED HISTORY")));

    // Refused both ways: lost, and the message gives both reasons.
    let mut ed = Editor::start_with(
        Options::new(fake_agent())
            .env("FAKE_RESUME", "1")
            .env("FAKE_LOAD", "1")
            .env("FAKE_REFUSE_RESTORE", "1"),
    );
    ed.initialize();
    let sid = ed.new_session(&workspace(&ed, "w"));
    restart(&ed);
    let id = ed.prompt_request(&sid, "notify 1");
    let r = ed.response(&id);
    assert_eq!(error_code(&r), -32092, "{r}");
    let msg = r["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("refused session/resume") && msg.contains("refused session/load"),
        "{msg}"
    );
}

#[test]
fn a_session_that_cannot_be_restored_says_why_and_others_go_on() {
    for (env, why) in [
        (None, "neither session/resume nor session/load"),
        (Some("FAKE_REFUSE_RESTORE"), "refused"),
    ] {
        let mut opts =
            Options::new(fake_agent()).env("FAKE_LOAD", if env.is_some() { "1" } else { "0" });
        if let Some(k) = env {
            opts = opts.env(k, "1");
        }
        let mut ed = Editor::start_with(opts);
        ed.initialize();
        let sid = ed.new_session(&workspace(&ed, "w"));
        restart(&ed);
        let id = ed.prompt_request(&sid, "notify 1");
        let r = ed.response(&id);
        assert_eq!(error_code(&r), -32092, "{r}");
        let msg = r["error"]["message"].as_str().unwrap();
        assert!(msg.contains(why) && msg.contains(&sid), "{msg}");
        // A new session works.
        let other = ed.new_session(&workspace(&ed, "w2"));
        let (r, _) = ed.prompt(&other, "notify 1");
        assert_eq!(r["result"]["stopReason"], "end_turn");
    }
}

#[test]
fn a_backend_dead_at_start_answers_initialize_once_with_its_reason_and_is_retried_later() {
    let gate = tempfile::NamedTempFile::new().unwrap();
    let mut ed = Editor::start_with(
        Options::new(fake_agent())
            .env("FAKE_EXIT_AT_START_IF", gate.path().to_str().unwrap())
            .arg("--crash-cooldown-ms")
            .arg("1500"),
    );
    let init = json!({"protocolVersion": 1, "clientCapabilities": {}});
    let id = ed.request("initialize", init.clone());
    let r = ed.response(&id);
    assert_eq!(error_code(&r), -32091, "{r}");
    let msg = r["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("before it answered initialize (exit status: 3)")
            && msg.contains("fake agent: cannot start, as asked"),
        "{msg}"
    );
    // One answer, and no restart behind it: the agent ran once.
    ed.drain_for(Duration::from_millis(300));
    assert_eq!(ed.responses_to(&id), 1);
    let starts = || {
        std::fs::read_to_string(ed.home().join("received.log"))
            .unwrap_or_default()
            .len()
    };
    assert_eq!(starts(), 0, "the dead agent never got a frame");
    // During the cool-down, the same final reason at once.
    let id = ed.request("initialize", init.clone());
    assert_eq!(error_code(&ed.response(&id)), -32091);
    // Fixed, and after the cool-down: the next request starts it again.
    drop(gate);
    std::thread::sleep(Duration::from_millis(1600));
    let id = ed.request("initialize", init);
    let r = ed.response(&id);
    assert!(r["result"].is_object(), "{r}");
    assert!(
        ed.child.try_wait().unwrap().is_none(),
        "the bridge keeps the editor connection"
    );
}

#[test]
fn the_third_crash_says_it_gave_up_and_why_and_the_cool_down_ends_it() {
    let mut ed = Editor::start_with(
        Options::new(fake_agent())
            .env("FAKE_RESUME", "1")
            .arg("--crash-cooldown-ms")
            .arg("1500"),
    );
    ed.initialize();
    let sid = ed.new_session(&workspace(&ed, "w"));
    for n in 1..=3 {
        let id = ed.prompt_request(&sid, "crash");
        let r = ed.response(&id);
        let msg = r["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if n < 3 {
            assert_eq!(error_code(&r), -32090, "{r}");
            assert!(msg.contains("being restarted"), "{msg}");
        } else {
            // The truth: no restart is coming, and why.
            assert_eq!(error_code(&r), -32091, "{r}");
            assert!(
                msg.contains("failed 3 times")
                    && msg.contains("exit status: 9")
                    && msg.contains("fake agent: crashing as asked"),
                "{msg}"
            );
            assert!(!msg.contains("being restarted"), "{msg}");
        }
    }
    let id = ed.request("session/new", json!({"cwd": "/", "mcpServers": []}));
    assert_eq!(error_code(&ed.response(&id)), -32091);
    // After the cool-down the next request starts the agent again.
    std::thread::sleep(Duration::from_millis(1600));
    let r = ed.call("_test/echo", json!({"x": "back"}));
    assert_eq!(r["echo"]["x"], "back");
    ed.close_stdin();
    assert_eq!(ed.wait_exit(), Some(0));
}

#[test]
fn a_malformed_user_config_is_answered_to_the_editor_not_fatal() {
    // No backend but the one the broken config would name: every request
    // says what is wrong, where, and what is expected there.
    let home = tempfile::tempdir().unwrap();
    let config = home.path().join("config/zcode-acp");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(config.join("config.json"), "{\n  \"backend\": 5\n}\n").unwrap();
    let mut opts = Options::new(vec![]).env("ZCODE_ACP_BACKEND", "");
    opts.home_at = Some(home.path().to_path_buf());
    let mut ed = Editor::start_with(opts);
    let id = ed.request(
        "initialize",
        json!({"protocolVersion": 1, "clientCapabilities": {}}),
    );
    let r = ed.response(&id);
    assert_eq!(error_code(&r), -32091, "{r}");
    let msg = r["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("config.json is not valid at line 2")
            && msg.contains("expected a command, as a list of strings"),
        "{msg}"
    );
    assert!(!msg.contains("BackendSpec"), "{msg}");
    assert!(
        ed.child.try_wait().unwrap().is_none(),
        "the bridge stays up"
    );
}

#[test]
fn a_missing_backend_is_reported_to_the_editor() {
    let mut ed = Editor::start(vec!["/nonexistent/agent-binary".into()]);
    let id = ed.request(
        "initialize",
        json!({"protocolVersion": 1, "clientCapabilities": {}}),
    );
    let r = ed.response(&id);
    assert_eq!(error_code(&r), -32091);
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("/nonexistent/agent-binary"),
        "{r}"
    );
}

#[test]
fn no_backend_prints_the_zed_setup_and_exits_2() {
    let home = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(BIN)
        .env_remove("ZCODE_ACP_BACKEND")
        .env("HOME", home.path())
        .env("XDG_CONFIG_HOME", home.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty(), "nothing but ACP on stdout");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("agent_servers") && err.contains("\"type\": \"custom\""),
        "{err}"
    );
    // The block it offers turns the sandbox on: copied as it is, the
    // agent is sandboxed.
    assert!(
        err.contains("\"env\": { \"ZCODE_ACP_SANDBOX\": \"1\" }"),
        "{err}"
    );
    // And --help says how the sandbox is turned on.
    let help = std::process::Command::new(BIN)
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(
        help.contains("ZCODE_ACP_SANDBOX=1") && help.contains(".zcode/acp/sandbox.json"),
        "{help}"
    );
}

#[test]
fn the_backend_can_come_from_the_environment_or_the_user_config() {
    let home = tempfile::tempdir().unwrap();
    let cfg = home.path().join("zcode-acp");
    std::fs::create_dir_all(&cfg).unwrap();
    std::fs::write(
        cfg.join("config.json"),
        format!(r#"{{"backend": ["{BIN}", "shell-agent"]}}"#),
    )
    .unwrap();
    for env in [Some(format!("{BIN} shell-agent")), None] {
        let mut cmd = std::process::Command::new(BIN);
        cmd.env("HOME", home.path())
            .env("XDG_CONFIG_HOME", home.path())
            .env("ZCODE_SHELL_AGENT_HOME", home.path().join("sa"))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped());
        match &env {
            Some(v) => cmd.env("ZCODE_ACP_BACKEND", v),
            None => cmd.env_remove("ZCODE_ACP_BACKEND"),
        };
        let mut child = cmd.spawn().unwrap();
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{\"protocolVersion\":1}}\n")
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("zcode-acp-shell-agent"), "{env:?}: {text}");
        assert_eq!(out.status.code(), Some(0));
    }
}

/// What is announced is what is armed: a helper that finds it can arm
/// less than the bridge probed (namespaces gone in between) refuses rather
/// than run the agent at a lower level than the editor was told.
#[cfg(target_os = "linux")]
#[test]
fn a_sandbox_armed_at_less_than_announced_refuses() {
    if !common::require_kernel_features() {
        return;
    }
    // A home away from temp directories, so the system temp dir is one the
    // agent could write at the lower level (shared there, private at the
    // full one): it leaves its log there if it ever runs.
    let base = tempfile::tempdir_in(common::scratch_base()).unwrap();
    let home = std::fs::canonicalize(base.path()).unwrap();
    let marks = tempfile::tempdir_in("/tmp").unwrap();
    let state = marks.path().to_path_buf();
    let mut opts = Options::new(fake_agent())
        .env("ZCODE_ACP_SANDBOX", "1")
        .env("ZCODE_ACP_TEST_HELPER_NO_NAMESPACES", "1")
        .env("FAKE_AGENT_DIR", state.to_str().unwrap());
    opts.home_at = Some(home.clone());
    let mut ed = Editor::start_with(opts);
    // Each start is refused by the helper before anything of the agent's
    // runs, until the bridge gives up.
    let mut last = json!(null);
    for _ in 0..5 {
        let id = ed.request(
            "initialize",
            json!({"protocolVersion": 1, "clientCapabilities": {}}),
        );
        last = ed.response(&id);
        if error_code(&last) == -32091 {
            break;
        }
        assert_eq!(error_code(&last), -32090, "{last}");
    }
    assert_eq!(error_code(&last), -32091, "{last}");
    assert!(!state.join("received.log").exists(), "the agent never ran");
}

#[test]
fn a_requested_sandbox_that_cannot_be_armed_refuses_instead_of_running_unconfined() {
    // Globally requested where it cannot be armed: the agent never starts.
    let mut ed = Editor::start_with(
        Options::new(fake_agent())
            .env("ZCODE_ACP_SANDBOX", "1")
            .env("ZCODE_ACP_TEST_NO_LANDLOCK", "1")
            .env("ZCODE_ACP_TEST_NO_NAMESPACES", "1"),
    );
    let id = ed.request(
        "initialize",
        json!({"protocolVersion": 1, "clientCapabilities": {}}),
    );
    let r = ed.response(&id);
    assert_eq!(error_code(&r), -32091);
    let msg = r["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("ZCODE_ACP_SANDBOX=1") && msg.contains("--no-sandbox"),
        "{msg}"
    );
    if cfg!(target_os = "linux") {
        assert!(msg.contains("neither namespaces nor Landlock"), "{msg}");
    }
    assert!(
        !ed.home().join("received.log").exists(),
        "the agent never ran"
    );

    // Requested by the project where nothing can be armed: its sessions are
    // refused, others open.
    let mut ed = Editor::start_with(
        Options::new(fake_agent())
            .env("ZCODE_ACP_TEST_NO_LANDLOCK", "1")
            .env("ZCODE_ACP_TEST_NO_NAMESPACES", "1"),
    );
    ed.initialize();
    let ws = workspace(&ed, "armed");
    std::fs::create_dir_all(ws.join(".zcode/acp")).unwrap();
    std::fs::write(ws.join(".zcode/acp/sandbox.json"), r#"{"enabled": true}"#).unwrap();
    let id = ed.request("session/new", json!({"cwd": ws, "mcpServers": []}));
    let r = ed.response(&id);
    assert_eq!(error_code(&r), -32095, "{r}");
    assert!(r["error"]["message"]
        .as_str()
        .unwrap()
        .contains("sandbox.json"));
    let plain = workspace(&ed, "plain");
    ed.new_session(&plain);
    // The first session in a project creates its template, disarmed (off
    // the bridge's loop, so it may land just after the answer).
    let template = plain.join(".zcode/acp/sandbox.json");
    wait_until("the project's template", || template.exists());
    let text = std::fs::read_to_string(&template).unwrap();
    assert!(text.contains("\"enabled\": false"), "{text}");

    // --no-sandbox runs it unconfined on purpose.
    let mut ed = Editor::start_with(
        Options::new(fake_agent())
            .env("ZCODE_ACP_SANDBOX", "1")
            .arg("--no-sandbox"),
    );
    ed.initialize();
    ed.new_session(&ws);
}

#[test]
fn terminals_of_a_stopped_backend_are_released_toward_the_editor() {
    let mut ed = Editor::start_with(Options::new(fake_agent()).env("FAKE_RESUME", "1"));
    ed.initialize();
    let sid = ed.new_session(&workspace(&ed, "w"));
    // The test editor runs the terminal and names it term-0.
    let id = ed.prompt_request(&sid, "terminal");
    assert_eq!(ed.response(&id)["result"]["stopReason"], "end_turn");
    assert_eq!(ed.terminals.len(), 1);
    restart(&ed);
    let release = ed
        .wait_for("terminal/release", |v| v["method"] == "terminal/release")
        .value;
    assert_eq!(
        release["params"],
        json!({"sessionId": sid, "terminalId": "term-0"})
    );
    assert!(release["id"].is_u64(), "a request of the bridge's own");
}

#[test]
fn cancel_requests_are_rewritten_both_ways() {
    let mut ed = Editor::start(fake_agent());
    ed.initialize();
    let ask = ed.request("_test/ask", json!({}));
    let question = ed
        .wait_for("the question", |v| v["method"] == "_test/question")
        .value;
    let backend_id = read_log(&ed, "received.log")
        .iter()
        .find(|l| l.contains("_test/ask"))
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["id"].clone())
        .unwrap();

    // Editor -> agent: the id the editor names becomes the id the agent knows.
    ed.notify("$/cancel_request", json!({"requestId": ask}));
    wait_until("the agent got the cancel", || {
        std::fs::read_to_string(ed.home().join("restores.log"))
            .unwrap_or_default()
            .contains(&format!("cancel {backend_id}"))
    });
    // Agent -> editor: the agent's own id becomes the one the editor saw.
    ed.notify("_test/withdraw", json!({}));
    let cancel = ed
        .wait_for("the withdrawal", |v| v["method"] == "$/cancel_request")
        .value;
    assert_eq!(cancel["params"]["requestId"], question["id"]);
    ed.send(&json!({"jsonrpc": "2.0", "id": question["id"], "result": {}}));
    ed.response(&ask);
}

#[test]
fn authenticate_is_replayed_only_when_the_editor_called_it() {
    for call_it in [false, true] {
        let mut ed = Editor::start_with(Options::new(fake_agent()).env("FAKE_RESUME", "1"));
        ed.initialize();
        if call_it {
            ed.call("authenticate", json!({"methodId": "token"}));
        }
        let sid = ed.new_session(&workspace(&ed, "w"));
        restart(&ed);
        ed.prompt(&sid, "notify 1");
        let log = std::fs::read_to_string(ed.home().join("restores.log")).unwrap();
        let auths = log
            .lines()
            .filter(|l| l.starts_with("authenticate"))
            .count();
        assert_eq!(auths, if call_it { 2 } else { 0 }, "{log}");
    }
}

#[test]
fn a_session_that_needs_a_new_login_is_not_logged_in_by_the_bridge() {
    let mut ed = Editor::start_with(
        Options::new(fake_agent())
            .env("FAKE_RESUME", "1")
            .env("FAKE_AUTH_REQUIRED", "1"),
    );
    ed.initialize();
    let sid = ed.new_session(&workspace(&ed, "w"));
    restart(&ed);
    let id = ed.prompt_request(&sid, "notify 1");
    let r = ed.response(&id);
    assert_eq!(error_code(&r), -32092);
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("log in again"),
        "{r}"
    );
    let log = std::fs::read_to_string(ed.home().join("restores.log")).unwrap();
    assert!(
        !log.contains("authenticate"),
        "the bridge never logs in on its own"
    );
    // Closing the lost session is answered without troubling the agent.
    assert_eq!(
        ed.call("session/close", json!({"sessionId": sid})),
        json!({})
    );
}

#[test]
fn logs_go_to_stderr_and_the_log_file_never_to_stdout() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("bridge.log");
    let mut ed = Editor::start_with(
        Options::new(fake_agent())
            .env("FAKE_RESUME", "1")
            .arg("--log-file")
            .arg(log.to_str().unwrap()),
    );
    ed.initialize();
    let sid = ed.new_session(&workspace(&ed, "w"));
    ed.send_raw(r#"{"jsonrpc":"1.0","id":"v1","method":"_test/echo","params":{}}"#);
    assert_eq!(error_code(&ed.response(&json!("v1"))), -32600);
    restart(&ed);
    let (r, _) = ed.prompt(&sid, "pid");
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    ed.close_stdin();
    assert_eq!(ed.wait_exit(), Some(0));
    // Every stdout line parsed as JSON (the reader panics otherwise) and
    // is a JSON-RPC message.
    assert!(ed.seen.iter().all(|l| l.value["jsonrpc"] == "2.0"));
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("agent backend started") && text.contains("restarting the agent backend"),
        "{text}"
    );
    // What the log says is in words, not Rust's debug forms.
    assert!(
        text.contains("malformed frame") && text.contains("restoring live sessions"),
        "{text}"
    );
    for debug_form in ["RawId(", "Some(", "RestoreCaps", "None,", " { "] {
        assert!(
            !text.contains(debug_form),
            "{debug_form} in the log: {text}"
        );
    }
}

/// A generation that dies while `session/load` replays a session's
/// history, followed by one that cannot restore it: the session's later
/// updates (the editor's own load, its next prompts) reach the editor.
#[test]
fn a_crash_during_a_restore_never_hides_a_sessions_updates() {
    let mut ed = Editor::start_with(
        Options::new(fake_agent())
            .env("FAKE_LOAD", "1")
            .env("FAKE_CRASH_LOAD_ONCE", "1")
            .env("FAKE_REFUSE_AUTH_AFTER_CRASH", "1"),
    );
    ed.initialize();
    let _ = ed.call("authenticate", json!({"methodId": "x"}));
    let cwd = workspace(&ed, "w");
    let sid = ed.new_session(&cwd);
    sighup(ed.pid());
    wait_until("the restored agent refused the login", || {
        ed.home().join("refused_auth").exists()
    });
    // Lost: the editor loads it again itself, and sees the history.
    let start = ed.seen.len();
    let _ = ed.call(
        "session/load",
        json!({"sessionId": sid, "cwd": cwd, "mcpServers": []}),
    );
    assert!(
        ed.seen[start..]
            .iter()
            .any(|l| l.raw.contains("REPLAYED HISTORY")),
        "the editor's own load shows the history it asked for"
    );
    let (_, text) = ed.prompt(&sid, "notify 3");
    assert_eq!(text, "0\n1\n2\n", "the session's updates reach the editor");
}

#[test]
fn a_slow_editor_slows_the_agent_instead_of_growing_the_bridge() {
    slow_editor_holds_back("flood");
}

/// The same, with a frame the bridge drops (sending nothing on) after
/// every notification: the shares of the frames handed on before it must
/// stay in flight until they are written.
#[test]
fn frames_the_bridge_drops_do_not_let_a_slow_editor_grow_the_bridge() {
    slow_editor_holds_back("flood-dropped");
}

fn slow_editor_holds_back(flood: &str) {
    use std::io::{BufRead, Write};
    let home = tempfile::tempdir().unwrap();
    let (mut child, mut stdin, mut stdout) = raw_bridge(home.path(), &[]);
    let mut send = |v: Value| writeln!(stdin, "{v}").unwrap();
    let mut read_until = |pred: &dyn Fn(&Value) -> bool| -> Value {
        loop {
            let mut line = String::new();
            assert!(
                stdout.read_line(&mut line).unwrap() > 0,
                "the bridge closed stdout"
            );
            let v: Value = serde_json::from_str(&line).unwrap();
            if pred(&v) {
                return v;
            }
        }
    };
    send(json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                "params": {"protocolVersion": 1, "clientCapabilities": {}}}));
    read_until(&|v| v["id"] == 1);
    let ws = home.path().join("w");
    std::fs::create_dir_all(&ws).unwrap();
    send(json!({"jsonrpc": "2.0", "id": 2, "method": "session/new",
                "params": {"cwd": ws, "mcpServers": []}}));
    let sid = read_until(&|v| v["id"] == 2)["result"]["sessionId"]
        .as_str()
        .unwrap()
        .to_owned();
    const N: usize = 100_000;
    send(
        json!({"jsonrpc": "2.0", "id": 3, "method": "session/prompt",
                "params": {"sessionId": sid, "prompt": [{"type": "text", "text": format!("{flood} {N}")}]}}),
    );

    // The editor reads nothing now: the agent must block once the bounded
    // buffers on the way are full, far short of everything.
    let count = || -> usize {
        std::fs::read_to_string(home.path().join("flood.count"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    };
    let mut last = (count(), 0);
    while last.1 < 10 {
        std::thread::sleep(Duration::from_millis(200));
        let now = count();
        last = if now == last.0 {
            (now, last.1 + 1)
        } else {
            (now, 0)
        };
    }
    let stalled = last.0;
    let frame_bytes = r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"fake-000000-1","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"100000\n"}}}}"#.len();
    assert!(
        stalled < N,
        "the agent wrote all {N} notifications to an editor that reads nothing"
    );
    // What is in flight: the bridge's budget (4 MiB), its read buffer
    // (1 MiB) and the two pipes, with room to spare; never the backlog.
    assert!(
        stalled * frame_bytes < 8 << 20,
        "{stalled} notifications ({} MiB) went out before the agent was slowed",
        (stalled * frame_bytes) >> 20
    );

    // Reading again: every notification arrives, in order, then the answer.
    let mut next = 0usize;
    loop {
        let v = read_until(&|v| v["id"] == 3 || v["method"] == "session/update");
        if v["id"] == 3 {
            break;
        }
        if v["params"]["update"]["sessionUpdate"] == "agent_message_chunk" {
            let text = v["params"]["update"]["content"]["text"].as_str().unwrap();
            assert_eq!(text.trim().parse::<usize>().unwrap(), next);
            next += 1;
        }
    }
    assert_eq!(next, N);
    // The editor leaves: the bridge stops the agent and exits.
    drop(stdin);
    assert!(child.wait().unwrap().success());
}

#[test]
fn an_editor_that_hangs_up_ends_the_bridge_even_when_the_agent_stopped_reading() {
    use std::io::{BufRead, Write};
    let home = tempfile::tempdir().unwrap();
    let (mut child, mut stdin, mut stdout) = raw_bridge(home.path(), &["--stop-grace-ms", "300"]);
    let mut line = String::new();
    writeln!(
        stdin,
        r#"{{"jsonrpc":"2.0","id":1,"method":"_test/stop-reading"}}"#
    )
    .unwrap();
    stdout.read_line(&mut line).unwrap();
    assert!(line.contains(r#""ok":true"#), "{line}");
    // More than the bridge's budget toward an agent that reads nothing (the
    // reader then waits with the last frame in hand), then the editor
    // hangs up.
    let writer = std::thread::spawn(move || {
        let pad = "p".repeat(900 << 10);
        for i in 0..5 {
            let frame = format!(
                r#"{{"jsonrpc":"2.0","id":{},"method":"_test/echo","params":{{"pad":"{pad}"}}}}"#,
                10 + i
            );
            if writeln!(stdin, "{frame}").is_err() {
                return;
            }
        }
        // Dropping stdin here is the hang-up.
    });
    // The bridge ends: every request answered (shutting down), the hung
    // agent stopped, exit 0; the editor's side is read to the end.
    let mut answered = 0;
    loop {
        line.clear();
        if stdout.read_line(&mut line).unwrap() == 0 {
            break;
        }
        if line.contains("-32093") {
            answered += 1;
        }
    }
    writer.join().unwrap();
    assert!(child.wait().unwrap().success());
    assert_eq!(
        answered, 5,
        "every request the editor sent is answered once"
    );
}

#[test]
fn an_editor_that_stops_reading_for_good_ends_the_bridge_without_a_grace_period() {
    use std::io::{BufRead, Write};
    let home = tempfile::tempdir().unwrap();
    // A grace period far longer than the test's patience: only a bridge
    // that stops at once, without one, ends in time.
    let (mut child, mut stdin, mut stdout) =
        raw_bridge(home.path(), &["--stop-grace-ms", "600000"]);
    let mut line = String::new();
    let mut read_until = |stdout: &mut std::io::BufReader<_>, id: u64| loop {
        line.clear();
        assert!(stdout.read_line(&mut line).unwrap() > 0, "stdout closed");
        let v: Value = serde_json::from_str(&line).unwrap();
        if v["id"] == id {
            return v;
        }
    };
    writeln!(
        stdin,
        "{}",
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
               "params": {"protocolVersion": 1, "clientCapabilities": {}}})
    )
    .unwrap();
    read_until(&mut stdout, 1);
    let ws = home.path().join("w");
    std::fs::create_dir_all(&ws).unwrap();
    writeln!(
        stdin,
        "{}",
        json!({"jsonrpc": "2.0", "id": 2, "method": "session/new",
               "params": {"cwd": ws, "mcpServers": []}})
    )
    .unwrap();
    let sid = read_until(&mut stdout, 2)["result"]["sessionId"]
        .as_str()
        .unwrap()
        .to_owned();
    // An endless stream, and the editor's end of stdout closed under it
    // (stdin stays open: this is not the polite hang-up).
    const N: usize = 100_000_000;
    writeln!(
        stdin,
        "{}",
        json!({"jsonrpc": "2.0", "id": 3, "method": "session/prompt",
               "params": {"sessionId": sid, "prompt": [{"type": "text", "text": format!("flood {N}")}]}})
    )
    .unwrap();
    drop(stdout);
    let status = exit_within(
        &mut child,
        Duration::from_secs(30),
        "the bridge kept running after its writes to the editor failed",
    );
    assert!(status.success(), "{status:?}");
    // The agent was stopped with it, far short of its stream.
    let count = |dir: &std::path::Path| -> usize {
        std::fs::read_to_string(dir.join("flood.count"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    };
    let after_exit = count(home.path());
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(count(home.path()), after_exit, "the agent still writes");
    assert!(after_exit < N);
    drop(stdin);
}

/// The bridge in front of the scripted agent, driven by a raw editor: the
/// harness's always reads, and these tests need one that stops.
fn raw_bridge(
    home: &std::path::Path,
    args: &[&str],
) -> (
    std::process::Child,
    std::process::ChildStdin,
    std::io::BufReader<std::process::ChildStdout>,
) {
    let mut child = std::process::Command::new(BIN)
        .args(args)
        .arg("--")
        .args(fake_agent())
        .env("HOME", home)
        .env("FAKE_AGENT_DIR", home)
        .env("XDG_CONFIG_HOME", home.join("config"))
        .env("ZCODE_ACP_LOG", "warn")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdin = child.stdin.take().unwrap();
    let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    (child, stdin, stdout)
}

/// Opens a session whose `mcpServers` is `servers` (raw text), between
/// members the bridge does not know (before and after it, in that order);
/// returns its id and the line the agent received.
fn session_with_servers(ed: &mut Editor, ws: &std::path::Path, servers: &str) -> (String, String) {
    let cwd = serde_json::to_string(ws).unwrap();
    ed.send_raw(&format!(
        r#"{{"jsonrpc":"2.0","id":"new-1","method":"session/new","params":{{"_meta":{{"k": "v"}},"cwd":{cwd},"mcpServers":{servers}, "futureParam":[1.50]}}}}"#
    ));
    let r = ed.wait_for("the new session", |v| v["id"] == "new-1").value;
    let sid = r["result"]["sessionId"]
        .as_str()
        .expect("a session")
        .to_owned();
    let got = read_log(ed, "received.log")
        .into_iter()
        .find(|l| l.contains("\"session/new\""))
        .unwrap();
    (sid, got)
}

const EDITOR_SERVER: &str =
    r#"{"name":"zcode-run-code","command":"theirs","args":["-x"],"env":[],"futureField":1.50}"#;

#[test]
fn code_exec_offers_run_code_in_every_session_and_restore_keeping_the_editors_servers() {
    let mut ed = Editor::start_with(
        Options::new(fake_agent())
            .env("FAKE_LOAD", "1")
            .arg("--code-exec"),
    );
    ed.initialize();
    let ws = workspace(&ed, "w");
    let (sid, got) = session_with_servers(&mut ed, &ws, &format!("[ {EDITOR_SERVER} ]"));
    // The editor's entry arrives byte for byte, and its name is kept; so
    // does everything around the list (the splice touches only the list).
    assert!(got.contains(EDITOR_SERVER), "{got}");
    assert!(
        got.contains(r#""params":{"_meta":{"k": "v"},"cwd":"#),
        "{got}"
    );
    assert!(got.ends_with(r#"], "futureParam":[1.50]}}"#), "{got}");
    let servers = &serde_json::from_str::<Value>(&got).unwrap()["params"]["mcpServers"];
    let ours = |servers: &Value| -> Value {
        let list = servers.as_array().unwrap();
        assert_eq!(list.len(), 2, "{servers}");
        assert_eq!(list[0]["command"], "theirs");
        list[1].clone()
    };
    let entry = ours(servers);
    assert_eq!(entry["name"], "zcode-run-code-2");
    assert_eq!(
        std::fs::canonicalize(entry["command"].as_str().unwrap()).unwrap(),
        std::fs::canonicalize(BIN).unwrap()
    );
    assert_eq!(
        entry["args"].as_array().unwrap()[..3],
        json!(["mcp", "--workspace", ws]).as_array().unwrap()[..]
    );
    // The editor's servers reach the run_code server in a file only the
    // user can read (its entries can hold secrets), never in argv.
    assert_eq!(entry["args"][3], "--servers", "{entry}");
    let file = std::path::PathBuf::from(entry["args"][4].as_str().unwrap());
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let handed: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        assert_eq!(handed[0]["command"], "theirs", "{handed}");
        assert_eq!(handed[0]["futureField"], 1.5);
    }
    // Unarmed: the server arms its own sandbox, so nothing is claimed; its
    // one variable is the token of the editor's socket (code reads the
    // editor's files through the bridge; it may not write them unarmed).
    let env = entry["env"].as_array().unwrap();
    assert_eq!(env.len(), 1, "{entry}");
    assert_eq!(env[0]["name"], "ZCODE_ACP_EDITOR_TOKEN");
    assert_eq!(entry["args"][8], "read_text_file", "{entry}");

    // A restored session gets it again, once.
    restart(&ed);
    let (r, _) = ed.prompt(&sid, "notify 1");
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    let load = read_log(&ed, "received.log")
        .into_iter()
        .find(|l| l.contains("\"session/load\""))
        .expect("the session was restored with session/load");
    let servers = &serde_json::from_str::<Value>(&load).unwrap()["params"]["mcpServers"];
    assert_eq!(ours(servers)["args"], entry["args"]);
    drop(ed);
    assert!(!file.exists(), "the servers file outlived the bridge");
}

#[test]
fn without_code_exec_the_editors_servers_pass_byte_for_byte() {
    let mut ed = Editor::start(fake_agent());
    ed.initialize();
    let ws = workspace(&ed, "w");
    let servers = format!("[ {EDITOR_SERVER} ]");
    let (_, got) = session_with_servers(&mut ed, &ws, &servers);
    assert!(got.contains(&format!(r#""mcpServers":{servers}"#)), "{got}");
    assert!(!got.contains("\"mcp\""), "{got}");
}

#[test]
fn a_project_turns_code_exec_on_only_once_approved() {
    let mut ed = Editor::start(fake_agent());
    ed.initialize();
    let ws = workspace(&ed, "w");
    std::fs::create_dir_all(ws.join(".zcode/acp")).unwrap();
    std::fs::write(
        ws.join(".zcode/acp/sandbox.json"),
        r#"{"enabled": false, "allow": [], "deny": [], "codeExec": true}"#,
    )
    .unwrap();
    let (_, got) = session_with_servers(&mut ed, &ws, "[]");
    assert!(
        got.contains(r#""mcpServers":[]"#),
        "not approved, yet offered: {got}"
    );
    let status = std::process::Command::new(BIN)
        .arg("approve")
        .arg("--workspace")
        .arg(&ws)
        .env("HOME", ed.home())
        .status()
        .unwrap();
    assert!(status.success());
    ed.send_raw(&format!(
        r#"{{"jsonrpc":"2.0","id":"new-2","method":"session/new","params":{{"cwd":{},"mcpServers":[]}}}}"#,
        serde_json::to_string(&ws).unwrap()
    ));
    ed.wait_for("the second session", |v| v["id"] == "new-2");
    let got = read_log(&ed, "received.log")
        .into_iter()
        .filter(|l| l.contains("\"session/new\""))
        .nth(1)
        .unwrap();
    let servers = &serde_json::from_str::<Value>(&got).unwrap()["params"]["mcpServers"];
    assert_eq!(
        servers[0]["args"].as_array().unwrap()[..3],
        json!(["mcp", "--workspace", ws]).as_array().unwrap()[..],
        "{got}"
    );
    // The editor advertised its files: code reaches them through a
    // socket of the bridge's, bound to this session (reads only: this
    // bridge arms no sandbox, so nothing would judge a write).
    assert_eq!(servers[0]["args"][3], "--editor", "{got}");
    assert_eq!(servers[0]["args"][6], "read_text_file", "{got}");
    // A session elsewhere that only lists the project as an additional
    // directory is not that project's session.
    let elsewhere = workspace(&ed, "elsewhere");
    ed.send_raw(&format!(
        r#"{{"jsonrpc":"2.0","id":"new-3","method":"session/new","params":{{"cwd":{},"additionalDirectories":[{}],"mcpServers":[]}}}}"#,
        serde_json::to_string(&elsewhere).unwrap(),
        serde_json::to_string(&ws).unwrap()
    ));
    ed.wait_for("the third session", |v| v["id"] == "new-3");
    let got = read_log(&ed, "received.log")
        .into_iter()
        .filter(|l| l.contains("\"session/new\""))
        .nth(2)
        .unwrap();
    assert!(got.contains(r#""mcpServers":[]"#), "{got}");
}

/// The bridge's socket that gives run_code the editor's files takes no
/// slot for a connection until its first call shows the socket's token:
/// with many silent connections held, a call with the token is answered,
/// and the silent ones are closed after a short wait.
#[test]
fn silent_connections_to_the_editors_socket_take_none_of_its_slots() {
    use std::io::{BufRead, Read, Write};
    use std::os::unix::net::UnixStream;
    let mut ed = Editor::start_with(Options::new(fake_agent()).arg("--code-exec"));
    ed.initialize();
    let ws = workspace(&ed, "w");
    std::fs::write(ws.join("readme.txt"), "hello from the editor").unwrap();
    let (_sid, got) = session_with_servers(&mut ed, &ws, "[]");
    let servers = &serde_json::from_str::<Value>(&got).unwrap()["params"]["mcpServers"];
    let entry = servers.as_array().unwrap().last().unwrap().clone();
    let args: Vec<String> = entry["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect();
    let at = args.iter().position(|a| a == "--editor").expect("--editor");
    let socket = std::path::PathBuf::from(&args[at + 1]);
    let token = entry["env"][0]["value"].as_str().unwrap().to_owned();
    let held: Vec<UnixStream> = (0..40)
        .map(|_| UnixStream::connect(&socket).unwrap())
        .collect();
    let path = ws.join("readme.txt");
    let caller = std::thread::spawn(move || {
        let mut s = UnixStream::connect(&socket).unwrap();
        let call = json!({"id": 1, "token": token, "method": "fs/read_text_file", "params": {"path": path}});
        s.write_all(format!("{call}\n").as_bytes()).unwrap();
        let mut line = String::new();
        std::io::BufReader::new(s).read_line(&mut line).unwrap();
        line
    });
    let deadline = std::time::Instant::now() + TIMEOUT;
    while !caller.is_finished() {
        assert!(
            std::time::Instant::now() < deadline,
            "the call was not answered"
        );
        ed.drain_for(Duration::from_millis(50));
    }
    let answer = caller.join().unwrap();
    assert!(answer.contains("hello from the editor"), "{answer}");
    // Every silent connection is closed by the bridge (read: end of file).
    for mut s in held {
        s.set_read_timeout(Some(Duration::from_secs(8))).unwrap();
        let mut b = [0u8; 1];
        assert!(
            matches!(s.read(&mut b), Ok(0)),
            "a silent connection was kept open"
        );
    }
}

/// A home directory long enough that the editor's socket for run_code
/// passes what a socket address holds: the socket is still made (bound
/// through its directory's descriptor), and code reaches the editor's
/// files through it.
#[test]
fn a_long_home_still_gets_the_editors_socket() {
    use std::io::{BufRead, Write};
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;
    let base = tempfile::tempdir().unwrap();
    let home = std::fs::canonicalize(base.path())
        .unwrap()
        .join("a-rather-long-home-directory-name-as-some-corporate-setups-give-their-users-x");
    std::fs::create_dir_all(&home).unwrap();
    let mut opts = Options::new(fake_agent()).arg("--code-exec");
    opts.home_at = Some(home.clone());
    let mut ed = Editor::start_with(opts);
    ed.initialize();
    let ws = home.join("w");
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::write(ws.join("readme.txt"), "read through a long path").unwrap();
    let (_sid, got) = session_with_servers(&mut ed, &ws, "[]");
    let servers = &serde_json::from_str::<Value>(&got).unwrap()["params"]["mcpServers"];
    let entry = servers.as_array().unwrap().last().unwrap().clone();
    let args: Vec<String> = entry["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect();
    let at = args
        .iter()
        .position(|a| a == "--editor")
        .expect("the editor's socket is offered");
    let socket = std::path::PathBuf::from(&args[at + 1]);
    assert!(socket.as_os_str().len() > 107, "{}", socket.display());
    let token = entry["env"][0]["value"].as_str().unwrap().to_owned();
    let path = ws.join("readme.txt");
    let caller = std::thread::spawn(move || {
        let dir = std::fs::File::open(socket.parent().unwrap()).unwrap();
        let short = format!(
            "/proc/self/fd/{}/{}",
            dir.as_raw_fd(),
            socket.file_name().unwrap().to_str().unwrap()
        );
        let mut s = UnixStream::connect(short).unwrap();
        let call = json!({"id": 1, "token": token, "method": "fs/read_text_file", "params": {"path": path}});
        s.write_all(format!("{call}\n").as_bytes()).unwrap();
        let mut line = String::new();
        std::io::BufReader::new(s).read_line(&mut line).unwrap();
        line
    });
    let deadline = std::time::Instant::now() + TIMEOUT;
    while !caller.is_finished() {
        assert!(
            std::time::Instant::now() < deadline,
            "the call was not answered"
        );
        ed.drain_for(Duration::from_millis(50));
    }
    let answer = caller.join().unwrap();
    assert!(answer.contains("read through a long path"), "{answer}");
}

#[test]
fn a_mistyped_command_or_a_forgotten_double_dash_is_explained() {
    let run = |word: &str| {
        let out = std::process::Command::new(BIN).arg(word).output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = run("doctr");
    assert_eq!(code, Some(2));
    assert!(err.contains("did you mean `zcode-acp doctor`?"), "{err}");
    let (code, err) = run("codex-acp");
    assert_eq!(code, Some(2));
    assert!(err.contains("zcode-acp -- codex-acp"), "{err}");
}

/// A misspelled switch is named in the editor, with the key it meant: in a
/// project's sandbox.json (each project once, in its own session's
/// notice) and in the user config. Nothing else would say why the agent
/// runs unconfined.
#[test]
fn a_misspelled_setting_is_named_in_the_editor_with_the_key_it_meant() {
    let home = tempfile::tempdir().unwrap();
    let config = home.path().join("config/zcode-acp");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(
        config.join("config.json"),
        r#"{"sandbox": {"enable": true}}"#,
    )
    .unwrap();
    let mut opts = Options::new(fake_agent());
    opts.home_at = Some(home.path().to_path_buf());
    let mut ed = Editor::start_with(opts);
    ed.initialize();
    let first = workspace(&ed, "first");
    let second = workspace(&ed, "second");
    for (ws, text) in [
        (&first, r#"{"enable": true}"#),
        (&second, r#"{"enabled": false, "alow": ["build"]}"#),
    ] {
        std::fs::create_dir_all(ws.join(".zcode/acp")).unwrap();
        std::fs::write(ws.join(".zcode/acp/sandbox.json"), text).unwrap();
    }
    let notices = |ed: &Editor, sid: &str| -> String {
        ed.seen
            .iter()
            .filter(|l| l.value["params"]["sessionId"] == sid)
            .filter(|l| {
                l.value["params"]["update"]["toolCallId"]
                    .as_str()
                    .is_some_and(|t| t.starts_with("zcode-acp-sandbox"))
            })
            .map(|l| l.value["params"]["update"]["content"].to_string())
            .collect()
    };
    let a = ed.new_session(&first);
    let b = ed.new_session(&second);
    // The second session's notice follows its answer.
    ed.prompt(&b, "hello");
    let said = notices(&ed, &a);
    assert!(said.contains("runs unconfined"), "{said}");
    assert!(
        said.contains("`enable` (did you mean `enabled`?)") && said.contains("sandbox.json"),
        "{said}"
    );
    assert!(
        said.contains("`sandbox.enable` (did you mean `sandbox.enabled`?)"),
        "{said}"
    );
    assert!(!said.contains("alow"), "{said}");
    let said = notices(&ed, &b);
    assert!(said.contains("`alow` (did you mean `allow`?)"), "{said}");
    // Said once per project: a second session there hears nothing of it.
    let again = ed.new_session(&first);
    ed.prompt(&again, "hello");
    assert_eq!(notices(&ed, &again), "");
}
