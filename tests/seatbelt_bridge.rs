//! The armed bridge on macOS: generations under `sandbox-exec`, the
//! editor's terminals under the same profile with the agent's environment
//! applied inside, and refused direct writes read from the system log and
//! offered in the editor. macOS only (the GitHub Actions workflow runs it on
//! a macOS runner); the Linux side of the same behaviour is in
//! tests/armed_bridge.rs.
#![cfg(target_os = "macos")]

mod common;

use common::*;

#[test]
fn an_armed_bridge_confines_the_agent_under_seatbelt() {
    if !require_seatbelt() {
        return;
    }
    let (mut ed, ws, sid, outside) = armed_editor();
    let state = ed
        .wait_for("the sandbox state", |v| {
            v["params"]["update"]["sessionUpdate"] == "tool_call"
        })
        .value;
    assert_eq!(
        state["params"]["update"]["title"], "Sandbox: macOS Seatbelt, 1 root writable",
        "{state}"
    );
    let (_, text) = ed.prompt(
        &sid,
        &format!(
            "echo in > {}/inside.txt; echo out > {}/escaped.txt; echo done",
            ws.display(),
            outside.display()
        ),
    );
    assert!(text.contains("done"), "{text}");
    assert_eq!(
        std::fs::read_to_string(ws.join("inside.txt")).unwrap(),
        "in\n"
    );
    assert!(
        !outside.join("escaped.txt").exists(),
        "the agent wrote outside its workspace"
    );
}

#[test]
fn editor_terminals_run_under_the_same_profile() {
    if !require_seatbelt() {
        return;
    }
    let (mut ed, ws, sid, outside) = armed_editor();
    let req = &terminal_writes_inside_only(&mut ed, &ws, &sid, &outside);
    assert_eq!(req["command"], "/usr/bin/sandbox-exec", "{req}");
    assert_eq!(req["args"][0], "-f");
    assert!(req["args"][1]
        .as_str()
        .unwrap()
        .contains("/.zcode-acp/sandbox/"));
    assert_eq!(req["args"][3], BIN);
    assert_eq!(req["args"][4], "__exec-env");
    assert_eq!(req["env"], serde_json::json!([]));
}

/// `cc` a file in `dir` (the runner has the command line tools).
fn cc(dir: &std::path::Path, name: &str, source: &str, extra: &[&str]) -> std::path::PathBuf {
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, source).unwrap();
    let out = dir.join(name);
    let built = std::process::Command::new("cc")
        .args(extra)
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .status()
        .expect("cc");
    assert!(built.success(), "cc {name}");
    out
}

#[test]
fn a_terminals_env_is_applied_only_inside_the_sandbox() {
    if !require_seatbelt() {
        return;
    }
    let scratch = tempfile::tempdir_in(scratch_base()).unwrap();
    let scratch = std::fs::canonicalize(scratch.path()).unwrap();
    let outside_marker = scratch.join("injected");

    // The fake agent logs what it sees: somewhere writable inside ($TMPDIR).
    let agent_dir = tempfile::tempdir().unwrap();
    let mut opts = Options::new(fake_agent())
        .env("ZCODE_ACP_SANDBOX", "1")
        .env("FAKE_AGENT_DIR", agent_dir.path().to_str().unwrap())
        .env("FAKE_PRELOAD_VAR", "DYLD_INSERT_LIBRARIES")
        .env("FAKE_PRELOAD", scratch.join("evil.dylib").to_str().unwrap());
    opts.home_in = Some(scratch_base());
    let mut ed = Editor::start_with(opts);
    ed.initialize();
    let ws = workspace(&ed, "w");
    let ws = std::fs::canonicalize(ws).unwrap();
    let inside_marker = ws.join("loaded");
    // A library that, once loaded, writes one marker outside the workspace
    // and one inside, and a program that keeps DYLD_* (Apple's own strip it).
    cc(
        &scratch,
        "evil.dylib",
        &format!(
            "#include <fcntl.h>\n__attribute__((constructor)) static void pwn(void) {{ creat(\"{}\", 0644); creat(\"{}\", 0644); }}\n",
            outside_marker.display(),
            inside_marker.display()
        ),
        &["-dynamiclib"],
    );
    let victim = cc(&scratch, "victim", "int main(void) { return 0; }\n", &[]);
    // Control: the injection works when nothing stops it.
    std::process::Command::new(&victim)
        .env("DYLD_INSERT_LIBRARIES", scratch.join("evil.dylib"))
        .status()
        .unwrap();
    assert!(
        outside_marker.exists(),
        "the test library loads into the victim"
    );
    std::fs::remove_file(&outside_marker).unwrap();
    std::fs::remove_file(&inside_marker).unwrap();

    let sid = ed.new_session(&ws);
    // An argument, so the command runs directly, not through Apple's /bin/sh.
    let (r, _) = ed.prompt(&sid, &format!("terminal-exec-env {} x", victim.display()));
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    assert_eq!(ed.terminals.len(), 1, "the editor ran the terminal");
    assert_eq!(
        ed.terminal_requests[0]["params"]["env"],
        serde_json::json!([])
    );
    // The agent's DYLD_INSERT_LIBRARIES was applied, inside the sandbox.
    assert!(inside_marker.exists(), "{:?}", ed.terminals[0]);
    assert!(
        !outside_marker.exists(),
        "DYLD_INSERT_LIBRARIES from the agent wrote outside the sandbox"
    );
}

#[test]
fn a_write_refused_silently_is_read_from_the_log_and_offered() {
    if !require_seatbelt() {
        return;
    }
    let (mut ed, _ws, sid, outside) = armed_editor();
    let dir = outside.join("notes");
    std::fs::create_dir_all(&dir).unwrap();
    let target = dir.join("todo.txt");
    // The agent hides the error: only the sandbox's log says what happened.
    let id = ed.prompt_request(
        &sid,
        &format!(
            "echo first > {} 2>/dev/null; sleep 3; true",
            target.display()
        ),
    );
    let ask = answer_prompt(&mut ed, "allow-once");
    let title = ask["params"]["toolCall"]["title"].as_str().unwrap();
    assert!(title.contains(&format!("in {}", dir.display())), "{title}");
    ed.response(&id);
    assert!(!target.exists(), "the refused write stays refused");
    ed.wait_for("the re-arm", |v| {
        v["params"]["update"]["title"]
            .as_str()
            .is_some_and(|t| t.ends_with("(restarted)"))
    });
    let (_, text) = ed.prompt(
        &sid,
        &format!("echo second > {t} && cat {t}", t = target.display()),
    );
    assert_eq!(text, "second\n");
}
