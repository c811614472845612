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

    ed.close_stdin();
    assert_eq!(ed.wait_exit(), Some(0));
    assert_eq!(
        std::fs::read_to_string("/proc/self/mountinfo").unwrap(),
        host_mounts
    );
}
