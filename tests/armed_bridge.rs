//! The bridge with the sandbox armed (Linux): every backend generation runs
//! under the launcher, a new workspace root re-arms it, and a SIGKILL from
//! inside takes the whole generation with it.
#![cfg(target_os = "linux")]

mod common;

use std::time::Duration;

use common::*;

#[test]
fn an_armed_bridge_confines_the_agent_and_survives_a_kill_from_inside() {
    if !require_kernel_features() {
        return;
    }
    let host_mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let outside = tempfile::tempdir_in(scratch_base()).unwrap();
    let outside = std::fs::canonicalize(outside.path()).unwrap();
    let mut opts = Options::new(shell_agent())
        .env("ZCODE_ACP_SANDBOX", "1")
        // The shell agent keeps its transcripts in ~/.zcode-shell-agent, which
        // the zcode backend profile keeps writable across generations.
        .env("ZCODE_SHELL_AGENT_HOME", "");
    opts.outer_ns = true;
    // A home outside /tmp: the sandbox's /tmp is private.
    opts.home_in = Some(scratch_base());
    let mut ed = Editor::start_with(opts);
    std::fs::create_dir_all(ed.home().join(".zcode-shell-agent")).unwrap();
    ed.initialize();
    let ws = workspace(&ed, "w");
    let sid = ed.new_session(&ws);
    // The editor is told, in a tool call of the bridge's own.
    let state = ed
        .wait_for("the sandbox state", |v| {
            v["params"]["update"]["sessionUpdate"] == "tool_call"
        })
        .value;
    let update = &state["params"]["update"];
    assert_eq!(state["params"]["sessionId"], sid.as_str());
    assert_eq!(
        update["title"], "Sandbox: Linux namespaces+Landlock, 1 root writable",
        "{state}"
    );
    assert_eq!(
        (update["kind"].as_str(), update["status"].as_str()),
        (Some("other"), Some("completed"))
    );

    let target = outside.join("escaped.txt");
    let (r, text) = ed.prompt(
        &sid,
        &format!(
            "echo inside > inside.txt && cat inside.txt; echo out > {}; echo rc=$?",
            target.display()
        ),
    );
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    assert!(text.contains("inside") && text.contains("rc=2"), "{text}");
    assert_eq!(
        std::fs::read_to_string(ws.join("inside.txt")).unwrap(),
        "inside\n"
    );
    assert!(
        !target.exists(),
        "the armed agent wrote outside its workspace"
    );

    // SIGKILL the agent from inside, with a background process pending.
    let id = ed.prompt_request(
        &sid,
        "(sleep 2; touch late) & sleep 0.2; kill -9 $PPID; sleep 5",
    );
    let r = ed.response(&id);
    assert_eq!(r["error"]["code"], -32090, "{r}");
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        !ws.join("late").exists(),
        "a process of the killed generation survived"
    );
    let (r, text) = ed.prompt(&sid, "cat inside.txt");
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    assert_eq!(text, "inside\n");
    // The restart was announced, with what it cost.
    let restarted = ed
        .wait_for("the restart announcement", |v| {
            v["params"]["update"]["title"]
                .as_str()
                .is_some_and(|t| t.ends_with("(restarted)"))
        })
        .value;
    let said = restarted["params"]["update"]["content"][0]["content"]["text"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        said.contains("crashed") && said.contains("were stopped"),
        "{said}"
    );

    ed.close_stdin();
    assert_eq!(ed.wait_exit(), Some(0));
    assert_eq!(
        std::fs::read_to_string("/proc/self/mountinfo").unwrap(),
        host_mounts
    );
}

#[test]
fn an_armed_bridge_judges_what_the_agent_asks_the_editor_to_do() {
    if !require_kernel_features() {
        return;
    }
    let outside = tempfile::tempdir_in(scratch_base()).unwrap();
    let outside = std::fs::canonicalize(outside.path()).unwrap();
    let mut opts = Options::new(shell_agent())
        .env("ZCODE_ACP_SANDBOX", "1")
        .env("ZCODE_SHELL_AGENT_HOME", "");
    opts.outer_ns = true;
    opts.home_in = Some(scratch_base());
    let mut ed = Editor::start_with(opts);
    std::fs::create_dir_all(ed.home().join(".zcode-shell-agent")).unwrap();
    ed.initialize();
    let ws = workspace(&ed, "w");
    let sid = ed.new_session(&ws);

    // Inside: forwarded to the editor, with the real path.
    let (_, text) = ed.prompt(&sid, "/write notes.txt inside");
    assert!(text.starts_with("wrote "), "{text}");
    assert_eq!(
        std::fs::read_to_string(ws.join("notes.txt")).unwrap(),
        "inside"
    );

    // Outside, the island, and through a symlink: never reach the editor.
    std::os::unix::fs::symlink(outside.join("via-link"), ws.join("link")).unwrap();
    for (target, why) in [
        (outside.join("outside.txt"), "(outside)"),
        (ws.join(".zcode/acp/sandbox.json"), "(island)"),
        (ws.join("link"), "(outside)"),
    ] {
        let start = ed.seen.len();
        let (_, text) = ed.prompt(&sid, &format!("/write {} forged", target.display()));
        assert!(
            text.contains("zcode-acp denied writing") && text.contains(why),
            "{text}"
        );
        let reached = ed.seen[start..]
            .iter()
            .any(|l| l.value["method"] == "fs/write_text_file");
        assert!(
            !reached,
            "an fs/write_text_file for {} reached the editor",
            target.display()
        );
    }
    assert!(!outside.join("outside.txt").exists() && !outside.join("via-link").exists());
    assert_ne!(
        std::fs::read_to_string(ws.join(".zcode/acp/sandbox.json")).unwrap(),
        "forged"
    );

    // The editor would run a terminal outside the sandbox: refused.
    let start = ed.seen.len();
    let (_, text) = ed.prompt(
        &sid,
        &format!("/terminal touch {}", outside.join("via-terminal").display()),
    );
    assert!(text.contains("refused terminal/create"), "{text}");
    assert!(!ed.seen[start..]
        .iter()
        .any(|l| l.value["method"] == "terminal/create"));
    assert!(!outside.join("via-terminal").exists());
}
