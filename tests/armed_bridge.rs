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
    let mut ed = start_shell_agent(true);
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
    // Which backend profile chose the agent's writable state, and why.
    assert!(
        state
            .to_string()
            .contains("Its own state is chosen by the backend profile: zcode ("),
        "{state}"
    );
    // The network, in one line.
    assert!(
        state.to_string().contains("Network: a network of its own; out through the sandbox's proxy: host loopback denied, LAN denied, public egress to the agent's API and the package registries (")
            && state.to_string().contains("any other public host is asked"),
        "{state}"
    );
    // A missing kind is `other`, the schema's default (the schema types
    // leave it out).
    assert_eq!(
        (
            update["kind"].as_str().or(Some("other")),
            update["status"].as_str()
        ),
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
    let (mut ed, ws, sid, outside) = armed_editor();

    // Inside: forwarded to the editor, with the real path.
    let (_, text) = ed.prompt(&sid, "/write notes.txt inside");
    assert!(text.starts_with("wrote "), "{text}");
    assert_eq!(
        std::fs::read_to_string(ws.join("notes.txt")).unwrap(),
        "inside"
    );

    // The island: refused at once, never asked.
    let start = ed.seen.len();
    let (_, text) = ed.prompt(
        &sid,
        &format!(
            "/write {} forged",
            ws.join(".zcode/acp/sandbox.json").display()
        ),
    );
    assert!(
        text.contains("zcode-acp denied writing") && text.contains("(island)"),
        "{text}"
    );
    assert!(!ed.seen[start..]
        .iter()
        .any(|l| l.value["method"] == "session/request_permission"));
    assert_ne!(
        std::fs::read_to_string(ws.join(".zcode/acp/sandbox.json")).unwrap(),
        "forged"
    );

    // Outside, directly and through a symlink: asked, refused, never written.
    std::os::unix::fs::symlink(outside.join("via-link"), ws.join("link")).unwrap();
    for (named, real) in [
        (outside.join("outside.txt"), outside.join("outside.txt")),
        (ws.join("link"), outside.join("via-link")),
    ] {
        let start = ed.seen.len();
        let (req, text) = prompt_answering(
            &mut ed,
            &sid,
            &format!("/write {} forged", named.display()),
            "reject-once",
        );
        assert_eq!(req["params"]["sessionId"], sid.as_str());
        let title = req["params"]["toolCall"]["title"].as_str().unwrap();
        assert!(
            title.contains(real.to_str().unwrap()),
            "the prompt names the real path: {title}"
        );
        assert!(text.contains("did not allow"), "{text}");
        assert!(!ed.seen[start..]
            .iter()
            .any(|l| l.value["method"] == "fs/write_text_file"));
        assert!(!real.exists());
    }
}

#[test]
fn the_allow_flow_remembers_each_answer_as_chosen() {
    if !require_kernel_features() {
        return;
    }
    let (mut ed, ws, sid, outside) = armed_editor();
    let config = || std::fs::read_to_string(ws.join(".zcode/acp/sandbox.json")).unwrap();
    let prompts = |ed: &Editor, from: usize| {
        ed.seen[from..]
            .iter()
            .filter(|l| l.value["method"] == "session/request_permission")
            .count()
    };

    // Allow once: written now, and again without asking; not recorded.
    let once = outside.join("once.txt");
    let (_, text) = prompt_answering(
        &mut ed,
        &sid,
        &format!("/write {} one", once.display()),
        "allow-once",
    );
    assert!(text.starts_with("wrote"), "{text}");
    let start = ed.seen.len();
    let (_, text) = ed.prompt(&sid, &format!("/write {} two", once.display()));
    assert!(
        text.starts_with("wrote") && prompts(&ed, start) == 0,
        "{text}"
    );
    assert_eq!(std::fs::read_to_string(&once).unwrap(), "two");
    assert!(!config().contains("once.txt"));

    // Always: written and recorded in sandbox.json.
    let always = outside.join("always.txt");
    let (_, text) = prompt_answering(
        &mut ed,
        &sid,
        &format!("/write {} yes", always.display()),
        "allow-always",
    );
    assert!(text.starts_with("wrote"), "{text}");
    // Recorded off the bridge's loop: it lands moments after the answer.
    wait_until("the grant recorded in sandbox.json", || {
        config().contains(always.to_str().unwrap())
    });

    // Don't: refused, and asked again next time.
    let dont = outside.join("dont.txt");
    let (_, text) = prompt_answering(
        &mut ed,
        &sid,
        &format!("/write {} no", dont.display()),
        "reject-once",
    );
    assert!(text.contains("did not allow"), "{text}");
    let (_, text) = prompt_answering(
        &mut ed,
        &sid,
        &format!("/write {} no", dont.display()),
        "reject-once",
    );
    assert!(text.contains("did not allow"), "{text}");

    // Never: refused, recorded as a deny entry, never asked again.
    let never = outside.join("never.txt");
    let (_, text) = prompt_answering(
        &mut ed,
        &sid,
        &format!("/write {} no", never.display()),
        "reject-always",
    );
    assert!(text.contains("did not allow"), "{text}");
    wait_until("the deny entry recorded in sandbox.json", || {
        config().contains("\"deny\"") && config().contains(never.to_str().unwrap())
    });
    let start = ed.seen.len();
    let (_, text) = ed.prompt(&sid, &format!("/write {} no", never.display()));
    assert!(
        text.contains("never to allow") && prompts(&ed, start) == 0,
        "{text}"
    );
    assert!(!never.exists() && !dont.exists());

    // A protected path is asked; a start-up file is never offered.
    let (_, text) = prompt_answering(
        &mut ed,
        &sid,
        &format!("/write {} export X=1", ws.join(".envrc").display()),
        "reject-once",
    );
    assert!(text.contains("did not allow"), "{text}");
    let start = ed.seen.len();
    let bashrc = std::fs::canonicalize(ed.home()).unwrap().join(".bashrc");
    let (_, text) = ed.prompt(&sid, &format!("/write {} evil", bashrc.display()));
    assert!(
        text.contains("never offers") && prompts(&ed, start) == 0,
        "{text}"
    );
    assert!(!bashrc.exists());
    // Nor ~/.ssh, which `zcode-acp allow` refuses as well (tests/commands.rs):
    // both ask policy::offerable.
    let ssh = std::fs::canonicalize(ed.home()).unwrap().join(".ssh");
    std::fs::create_dir_all(&ssh).unwrap();
    let keys = ssh.join("authorized_keys");
    let start = ed.seen.len();
    let (_, text) = ed.prompt(
        &sid,
        &format!("/write {} ssh-ed25519 AAAA evil", keys.display()),
    );
    assert!(
        text.contains("never offers") && text.contains("ssh keys") && prompts(&ed, start) == 0,
        "{text}"
    );
    assert!(!keys.exists());
}

#[test]
fn a_burst_of_denials_of_one_path_is_one_prompt() {
    if !require_kernel_features() {
        return;
    }
    let (mut ed, ws, first, outside) = armed_editor();
    let mut sids = vec![first];
    // Twenty sessions write the same outside path at once.
    for _ in 0..19 {
        sids.push(ed.new_session(&ws));
    }
    let target = outside.join("burst.txt");
    let start = ed.seen.len();
    let ids: Vec<serde_json::Value> = sids
        .iter()
        .map(|sid| ed.prompt_request(sid, &format!("/write {} same", target.display())))
        .collect();
    answer_prompt(&mut ed, "allow-once");
    for id in &ids {
        assert_eq!(ed.response(id)["result"]["stopReason"], "end_turn");
    }
    ed.drain_for(std::time::Duration::from_millis(300));
    let prompts = ed.seen[start..]
        .iter()
        .filter(|l| l.value["method"] == "session/request_permission")
        .count();
    assert_eq!(prompts, 1, "one prompt for the burst");
    for sid in &sids {
        assert!(
            ed.agent_text_since(start, sid).starts_with("wrote"),
            "{sid}"
        );
    }
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "same");
}

#[test]
fn an_agent_refused_in_many_places_opens_a_few_prompts_at_a_time() {
    if !require_kernel_features() {
        return;
    }
    let (mut ed, _ws, sid, outside) = armed_editor();
    let dirs: Vec<_> = ["a", "b", "c", "d", "e"]
        .iter()
        .map(|d| {
            let p = outside.join(d);
            std::fs::create_dir_all(&p).unwrap();
            p
        })
        .collect();
    let writes = |dirs: &[std::path::PathBuf]| {
        dirs.iter()
            .map(|d| format!("echo x > {}/f", d.display()))
            .collect::<Vec<_>>()
            .join("; ")
    };
    let count = |ed: &Editor, start: usize| {
        ed.seen[start..]
            .iter()
            .filter(|l| l.value["method"] == "session/request_permission")
            .count()
    };
    // Three refusals in one turn: three prompts, left open.
    let start = ed.seen.len();
    ed.prompt(&sid, &format!("{}; echo done", writes(&dirs[..3])));
    ed.drain_for(std::time::Duration::from_millis(300));
    assert_eq!(count(&ed, start), 3);
    // Two more in the next turn, while those are open: none.
    let later = ed.seen.len();
    ed.prompt(&sid, &format!("{}; echo done", writes(&dirs[3..])));
    ed.drain_for(std::time::Duration::from_millis(300));
    assert_eq!(count(&ed, later), 0, "the open prompts are capped");
    for d in &dirs {
        assert!(!d.join("f").exists());
    }
}

/// An agent that writes thousands of distinct places outside through the
/// editor, all at once, gets at most three questions open at a time and
/// ten in its turn; the rest are refused without asking and summed up in
/// one notice before the turn's end reaches the editor.
#[test]
fn a_flood_of_writes_outside_asks_a_few_questions_and_sums_up_the_rest() {
    if !require_kernel_features() {
        return;
    }
    let (mut ed, _ws, sid, outside) = armed_editor();
    let start = ed.seen.len();
    let id = ed.prompt_request(&sid, &format!("/write-many 3000 {}/f x", outside.display()));
    let mut answered: std::collections::HashSet<String> = Default::default();
    let mut asked = 0;
    loop {
        ed.drain_for(Duration::from_millis(300));
        let open: Vec<serde_json::Value> = ed.seen[start..]
            .iter()
            .filter(|l| l.value["method"] == "session/request_permission")
            .map(|l| l.value["id"].clone())
            .filter(|id| !answered.contains(&id.to_string()))
            .collect();
        assert!(open.len() <= 3, "{} questions open at once", open.len());
        for q in &open {
            ed.send(&serde_json::json!({"jsonrpc": "2.0", "id": q, "result": {"outcome": {"outcome": "selected", "optionId": "reject-once"}}}));
            answered.insert(q.to_string());
            asked += 1;
        }
        if ed.responses_to(&id) > 0 {
            break;
        }
    }
    assert!(asked <= 10, "{asked} questions in one turn");
    let text = ed.agent_text_since(start, &sid);
    assert!(text.contains("writes: ok=0 refused=3000"), "{text}");
    // One summary, before the turn's end.
    let end = ed.seen[start..]
        .iter()
        .position(|l| l.value.get("id") == Some(&id) && l.value.get("method").is_none())
        .unwrap();
    let summaries: Vec<usize> = ed.seen[start..]
        .iter()
        .enumerate()
        .filter(|(_, l)| {
            l.value["params"]["update"]["title"]
                .as_str()
                .is_some_and(|t| t.contains("writes refused without asking"))
        })
        .map(|(i, _)| i)
        .collect();
    assert_eq!(summaries.len(), 1, "one summary");
    assert!(summaries[0] < end, "the summary comes before the turn ends");
    let title = ed.seen[start + summaries[0]].value["params"]["update"]["title"].to_string();
    assert!(
        title.contains(&format!("{} writes", 3000 - asked)),
        "{title}"
    );
    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
    // The next turn may ask again.
    let again = outside.join("again");
    let id = ed.prompt_request(&sid, &format!("/write {} x", again.display()));
    let q = ed.wait_for("the next turn's question", |v| {
        v["method"] == "session/request_permission"
            && v["params"]["toolCall"]["title"]
                .as_str()
                .is_some_and(|t| t.contains("again"))
    });
    ed.send(&serde_json::json!({"jsonrpc": "2.0", "id": q.value["id"], "result": {"outcome": {"outcome": "selected", "optionId": "allow-once"}}}));
    ed.response(&id);
    assert_eq!(std::fs::read_to_string(outside.join("again")).unwrap(), "x");
}

#[test]
fn a_project_that_turns_the_sandbox_on_arms_a_running_bridge() {
    if !require_kernel_features() {
        return;
    }
    // No global switch: the bridge starts unconfined.
    let mut ed = start_shell_agent(false);
    ed.initialize();
    let outside = std::fs::canonicalize(ed.home()).unwrap().join("outside");
    std::fs::create_dir_all(&outside).unwrap();

    // A plain project: unconfined, and the agent can write outside.
    let plain = workspace(&ed, "plain");
    let first = ed.new_session(&plain);
    let (_, text) = ed.prompt(
        &first,
        &format!("echo x > {}/free.txt && echo ok", outside.display()),
    );
    assert_eq!(text, "ok\n");

    // A project that opts in: the bridge arms before its session opens.
    let armed = workspace(&ed, "armed");
    std::fs::create_dir_all(armed.join(".zcode/acp")).unwrap();
    std::fs::write(
        armed.join(".zcode/acp/sandbox.json"),
        r#"{"enabled": true}"#,
    )
    .unwrap();
    let sid = ed.new_session(&armed);
    let (_, text) = ed.prompt(
        &sid,
        &format!("echo x > {}/caught.txt; echo rc=$?", outside.display()),
    );
    assert!(text.contains("rc=2"), "{text}");
    assert!(
        !outside.join("caught.txt").exists(),
        "the opted-in project ran unconfined"
    );
    // The other live session was restarted under the sandbox and told so.
    let told = ed
        .wait_for("the re-arm announcement", |v| {
            v["params"]["sessionId"] == first.as_str()
                && v["params"]["update"]["title"].as_str().is_some_and(|t| {
                    t.contains("namespaces+Landlock") && t.ends_with("(restarted)")
                })
        })
        .value;
    assert!(told["params"]["update"]["content"][0]["content"]["text"]
        .as_str()
        .unwrap()
        .contains("turns the sandbox on"));
}

#[test]
fn editor_terminals_run_inside_the_sandbox() {
    if !require_kernel_features() {
        return;
    }
    let (mut ed, ws, sid, outside) = armed_editor();
    let req = &terminal_writes_inside_only(&mut ed, &ws, &sid, &outside);
    // What the editor was asked to run: this binary's sandbox helper, no env.
    assert_eq!(req["command"], BIN, "{req}");
    assert_eq!(req["args"][0], "__sandbox");
    assert_eq!(req["env"], serde_json::json!([]));
    // The spec was written in the generation's own directory, and read once.
    let spec = std::path::Path::new(req["args"][2].as_str().unwrap());
    assert!(
        spec.starts_with(ed.home().join(".zcode-acp/sandbox")),
        "{spec:?}"
    );
    assert!(!spec.exists(), "the helper consumes its spec");
}

#[test]
fn an_editor_terminal_runs_in_its_agents_sandbox_and_ends_whole() {
    if !require_kernel_features() {
        return;
    }
    let (mut ed, _ws, sid, _outside) = armed_editor();
    terminal_joins_its_generation(&mut ed, &sid);

    // A script in your own /tmp is not in the agent's view (its /tmp is
    // private): that terminal arms a sandbox of its own, which carries the
    // script over, and runs it.
    let own_tmp = tempfile::tempdir_in("/tmp").unwrap();
    let script = own_tmp.path().join("script.sh");
    std::fs::write(&script, "#!/bin/sh\necho ran-from-your-tmp\n").unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let (_, text) = ed.prompt(&sid, &format!("/terminal {}", script.display()));
    assert!(text.contains("ran-from-your-tmp"), "{text}");

    // A socket bound after the generation was armed (a service of this
    // test's own, which nothing talks to) is covered by a fresh arming: a
    // terminal started after that arms afresh rather than take the
    // generation's older view, where the socket is within reach.
    let sock = ed.home().join("late.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let (_, text) = ed.prompt(
        &sid,
        &format!(
            // Quoted apart, so only the command's output (never a refusal
            // quoting the command) holds the words.
            "/terminal test -S {} && echo with''in-reach || echo cov''ered",
            sock.display()
        ),
    );
    assert!(
        text.contains("covered") && !text.contains("within-reach"),
        "{text}"
    );
}

#[test]
fn a_terminal_joins_a_generation_that_kept_the_hosts_proc() {
    if !require_kernel_features() {
        return;
    }
    // As in a container that masks parts of /proc: the kernel refuses a
    // fresh /proc to the sandbox, which keeps the host's, read-only.
    let mut opts = Options::new(shell_agent())
        .env("ZCODE_SHELL_AGENT_HOME", "")
        .env("ZCODE_ACP_SANDBOX", "1");
    opts.outer_ns = true;
    opts.home_in = Some(scratch_base());
    opts.masked_proc = Some(c"/proc/timer_list");
    if !std::path::Path::new("/proc/timer_list").exists() {
        skip("this kernel has no /proc/timer_list to mask");
        return;
    }
    let mut ed = Editor::start_with(opts);
    ed.initialize();
    let ws = workspace(&ed, "w");
    let sid = ed.new_session(&ws);
    let (procs, _) = processes_in_proc(&mut ed, &sid, "");
    if procs < 20 {
        skip("the kernel gave the sandbox a /proc of its own despite the mask");
        return;
    }
    let (_, text) = ed.prompt(&sid, "echo from-the-agent > /tmp/kept-proc; echo ok");
    assert!(text.contains("ok"), "{text}");
    let (_, text) = ed.prompt(&sid, "/terminal cat /tmp/kept-proc; echo rc=$?");
    assert!(
        text.contains("from-the-agent") && text.contains("rc=0"),
        "{text}"
    );
}

#[test]
fn a_terminals_env_cannot_take_over_the_process_the_editor_starts() {
    if !require_kernel_features() {
        return;
    }
    if !common::require_tool("gcc", "apt install gcc libc6-dev") {
        return;
    }
    // A library that, once loaded anywhere, writes a marker outside.
    let outside = tempfile::tempdir_in(scratch_base()).unwrap();
    let outside = std::fs::canonicalize(outside.path()).unwrap();
    let marker = outside.join("preloaded");
    std::fs::write(
        outside.join("evil.c"),
        format!(
            "#include <fcntl.h>\n__attribute__((constructor)) static void pwn(void) {{ creat(\"{}\", 0644); }}\n",
            marker.display()
        ),
    )
    .unwrap();
    let built = std::process::Command::new("gcc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(outside.join("evil.so"))
        .arg(outside.join("evil.c"))
        .status()
        .expect("gcc (install it: CI does)");
    assert!(built.success());
    // Control: the library does what it says when nothing stops it.
    std::process::Command::new("/bin/true")
        .env("LD_PRELOAD", outside.join("evil.so"))
        .status()
        .unwrap();
    assert!(marker.exists(), "the test library works");
    std::fs::remove_file(&marker).unwrap();

    let mut opts = Options::new(fake_agent())
        .env("ZCODE_ACP_SANDBOX", "1")
        .env("FAKE_AGENT_DIR", "/tmp/zcode-acp-fake-agent")
        .env("FAKE_PRELOAD", outside.join("evil.so").to_str().unwrap());
    opts.outer_ns = true;
    opts.home_in = Some(scratch_base());
    let mut ed = Editor::start_with(opts);
    ed.initialize();
    let ws = workspace(&ed, "w");
    let sid = ed.new_session(&ws);
    let (r, _) = ed.prompt(&sid, "terminal-env echo mark=$FAKE_TERMINAL_MARK");
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    assert_eq!(ed.terminals.len(), 1, "the editor ran the terminal");
    // The agent's env still reaches the command, applied inside.
    assert!(
        ed.terminals[0].0.contains("mark=inside"),
        "{:?}",
        ed.terminals[0]
    );
    assert_eq!(
        ed.terminal_requests[0]["params"]["env"],
        serde_json::json!([])
    );
    assert!(
        !marker.exists(),
        "LD_PRELOAD from the agent ran code outside the sandbox"
    );
}

#[test]
fn a_hand_added_allow_entry_is_ignored_until_accepted() {
    if !require_kernel_features() {
        return;
    }
    let mut ed = start_shell_agent(true);
    let extra = std::fs::canonicalize(ed.home()).unwrap().join("extra");
    std::fs::create_dir_all(&extra).unwrap();
    let ws = workspace(&ed, "w");
    std::fs::create_dir_all(ws.join(".zcode/acp")).unwrap();
    std::fs::write(
        ws.join(".zcode/acp/sandbox.json"),
        format!(r#"{{"enabled": true, "allow": ["{}"]}}"#, extra.display()),
    )
    .unwrap();
    ed.initialize();
    let sid = ed.new_session(&ws);
    let ask = ed
        .wait_for("the confirmation", |v| {
            v["method"] == "session/request_permission"
                && v["params"]["toolCall"]["title"]
                    .as_str()
                    .is_some_and(|t| t.contains("sandbox.json changed"))
        })
        .value;
    let text = ask["params"]["toolCall"]["content"][0]["content"]["text"]
        .as_str()
        .unwrap();
    assert!(text.contains(extra.to_str().unwrap()), "{text}");
    // Not yet accepted: ignored.
    let (_, out) = ed.prompt(
        &sid,
        &format!("echo x > {}/before.txt; echo rc=$?", extra.display()),
    );
    assert!(out.contains("rc=2"), "{out}");
    // Accepted: the bridge re-arms and the entry counts.
    ed.send(&serde_json::json!({"jsonrpc": "2.0", "id": ask["id"], "result": {"outcome": {"outcome": "selected", "optionId": "accept-config"}}}));
    ed.wait_for("the re-arm", |v| {
        v["params"]["update"]["title"]
            .as_str()
            .is_some_and(|t| t.ends_with("(restarted)"))
    });
    let (_, out) = ed.prompt(
        &sid,
        &format!("echo x > {}/after.txt; echo rc=$?", extra.display()),
    );
    assert!(out.contains("rc=0"), "{out}");
    assert!(extra.join("after.txt").exists() && !extra.join("before.txt").exists());
}

#[test]
fn a_refused_direct_write_is_offered_and_the_grant_takes_effect_from_the_next_prompt() {
    if !require_kernel_features() {
        return;
    }
    let (mut ed, _ws, sid, outside) = armed_editor();
    let dir = outside.join("notes");
    std::fs::create_dir_all(&dir).unwrap();
    let target = dir.join("todo.txt");
    // The agent writes by itself (no ACP request): the kernel refuses.
    let id = ed.prompt_request(&sid, &format!("echo first > {}", target.display()));
    let ask = answer_prompt(&mut ed, "allow-once");
    let title = ask["params"]["toolCall"]["title"].as_str().unwrap();
    assert!(
        title.contains(&format!("in {}", dir.display())),
        "the folder is granted, for atomic saves: {title}"
    );
    ed.response(&id);
    assert!(!target.exists(), "the refused write stays refused");
    // Re-armed at the end of the turn; the next prompt may write there.
    ed.wait_for("the re-arm", |v| {
        v["params"]["update"]["title"]
            .as_str()
            .is_some_and(|t| t.ends_with("(restarted)"))
    });
    let (_, text) = ed.prompt(
        &sid,
        &format!(
            "echo second > {t}.tmp && mv {t}.tmp {t} && cat {t}",
            t = target.display()
        ),
    );
    assert_eq!(text, "second\n");
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "second\n");
    // Text in the agent's output is only a hint: a path the policy allows,
    // or one it never offers, starts no prompt.
    let start = ed.seen.len();
    let bashrc = std::fs::canonicalize(ed.home()).unwrap().join(".bashrc");
    let (_, _) = ed.prompt(
        &sid,
        &format!(
            "echo 'cannot create {}: Read-only file system'",
            bashrc.display()
        ),
    );
    assert!(!ed.seen[start..]
        .iter()
        .any(|l| l.value["method"] == "session/request_permission"));
}

#[test]
fn a_malformed_project_config_arms_the_bridge() {
    if !require_kernel_features() {
        return;
    }
    // A half-saved edit (not valid JSON), a FIFO (read, it would block the
    // bridge), a symlink to /dev/zero (read, it would grow without end):
    // each counts as "on", is left as it is, and never hangs the bridge.
    for kind in ["half-saved", "fifo", "zero"] {
        let mut ed = start_shell_agent(false);
        ed.initialize();
        let outside = std::fs::canonicalize(ed.home()).unwrap().join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        let ws = workspace(&ed, "w");
        std::fs::create_dir_all(ws.join(".zcode/acp")).unwrap();
        let file = ws.join(".zcode/acp/sandbox.json");
        let half = r#"{"enabled": false, "allow": ["/"#;
        match kind {
            "half-saved" => std::fs::write(&file, half).unwrap(),
            "fifo" => {
                nix::unistd::mkfifo(&file, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap()
            }
            _ => std::os::unix::fs::symlink("/dev/zero", &file).unwrap(),
        }
        // Never held past 10 s on the file: opening the session and the
        // turn each get that long (a deadline, not a speed).
        let deadline = std::mem::replace(&mut ed.timeout, Duration::from_secs(10));
        let sid = ed.new_session(&ws);
        let (_, text) = ed.prompt(
            &sid,
            &format!("echo x > {}/x.txt; echo rc=$?", outside.display()),
        );
        ed.timeout = deadline;
        assert!(text.contains("rc=2"), "{kind}: {text}");
        assert!(!outside.join("x.txt").exists(), "{kind}");
        let meta = std::fs::symlink_metadata(&file).unwrap();
        match kind {
            "half-saved" => assert_eq!(std::fs::read_to_string(&file).unwrap(), half),
            "fifo" => assert!(std::os::unix::fs::FileTypeExt::is_fifo(&meta.file_type())),
            _ => assert!(meta.file_type().is_symlink()),
        }
    }
}

#[test]
fn a_grant_for_a_protected_path_opens_it_for_direct_writes() {
    if !require_kernel_features() {
        return;
    }
    let (mut ed, ws, sid, _outside) = armed_editor();
    // A repository in the workspace: its hooks are protected.
    let (_, _) = ed.prompt(&sid, "git init -q . && mkdir -p .git/hooks");
    // Re-arm so the new repository's hooks are known to the policy.
    sighup(ed.pid());
    ed.wait_for("the re-arm", |v| {
        v["params"]["update"]["title"]
            .as_str()
            .is_some_and(|t| t.ends_with("(restarted)"))
    });
    let hook = ws.join(".git/hooks/pre-commit");
    let id = ed.prompt_request(&sid, &format!("echo '#!/bin/sh' > {}", hook.display()));
    let ask = answer_prompt(&mut ed, "allow-once");
    assert!(ask["params"]["toolCall"]["title"]
        .as_str()
        .unwrap()
        .contains(".git/hooks"));
    ed.response(&id);
    assert!(!hook.exists());
    ed.wait_for("the re-arm after the grant", |v| {
        v["params"]["update"]["title"]
            .as_str()
            .is_some_and(|t| t.ends_with("(restarted)"))
            && v["params"]["update"]["content"][0]["content"]["text"]
                .as_str()
                .is_some_and(|t| t.contains("you allowed"))
    });
    let (_, text) = ed.prompt(
        &sid,
        &format!("echo '#!/bin/sh' > {} && echo hooked", hook.display()),
    );
    assert_eq!(text, "hooked\n");
    assert!(hook.exists());
    // The rest of the repository's protection stands.
    let (_, text) = ed.prompt(
        &sid,
        &format!("echo x >> {}; echo rc=$?", ws.join(".git/config").display()),
    );
    assert!(text.contains("rc=2"), "{text}");
}

/// Answers the audit's "keep?" prompt about `path` with `option`, and
/// returns the prompt.
/// What the agent leaves that the user's own tools would run is reverted
/// when the turn ends and put to the user: a protected path that did not
/// exist when the sandbox was armed (editor tasks), a repository made
/// during the turn with an fsmonitor, and a new agent hook in the
/// workspace's settings. Keep puts the agent's version back.
#[test]
fn the_post_turn_audit_reverts_what_would_run_and_the_user_may_keep_it() {
    if !require_kernel_features() {
        return;
    }
    let (mut ed, ws, sid, outside) = armed_editor();
    let tasks = ws.join(".vscode/tasks.json");
    // The editor sees a turn end only after its audit: what would run is
    // already reverted on disk and put to the user by then.
    let asked_before_the_end = |ed: &Editor, start: usize, path: &std::path::Path| {
        ed.seen[start..].iter().any(|l| {
            l.raw.contains("zcode-acp-audit-")
                && l.value["params"]["toolCall"]["locations"][0]["path"] == path.to_str().unwrap()
        })
    };
    let start = ed.seen.len();
    let (r, _) = ed.prompt(
        &sid,
        &format!(
            "mkdir .vscode && echo '{{\"tasks\":[{{\"command\":\"touch {o}/pwned\",\"runOptions\":{{\"runOn\":\"folderOpen\"}}}}]}}' > .vscode/tasks.json; echo planted",
            o = outside.display()
        ),
    );
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    assert!(!tasks.exists(), "the planted tasks file outlived its turn");
    assert!(
        asked_before_the_end(&ed, start, &ws.join(".vscode")),
        "the turn ended before the audit's question"
    );
    let req = answer_audit(&mut ed, &ws.join(".vscode"), "revert");
    assert!(!tasks.exists(), "the planted tasks file is still there");
    assert!(req["params"]["toolCall"]["content"][0]["content"]["text"]
        .as_str()
        .unwrap()
        .contains("VS Code"));

    // A nested repository with an fsmonitor: reverted by the turn's end,
    // then kept on purpose.
    let start = ed.seen.len();
    let (r, _) = ed.prompt(
        &sid,
        &format!(
            "mkdir sub && cd sub && git init -q && git config core.fsmonitor 'touch {o}/fsmonitor' && echo made",
            o = outside.display()
        ),
    );
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    let config = ws.join("sub/.git/config");
    assert!(
        std::fs::read_to_string(&config).map_or(true, |c| !c.contains("fsmonitor")),
        "the nested repository's fsmonitor outlived its turn"
    );
    assert!(
        asked_before_the_end(&ed, start, &config),
        "the turn ended before the audit's question"
    );
    answer_audit(&mut ed, &config, "keep");
    common::wait_until("the agent's version is back", || {
        std::fs::read_to_string(&config).is_ok_and(|c| c.contains("fsmonitor"))
    });
    // Kept: the next turn does not ask again.
    let start = ed.seen.len();
    ed.prompt(&sid, "true");
    ed.drain_for(Duration::from_millis(300));
    assert!(!ed.seen[start..]
        .iter()
        .any(|l| l.raw.contains("zcode-acp-audit-")));

    // A hook in the workspace's agent settings: the file stays (permission
    // rules live there), the hook goes.
    let settings = ws.join(".claude/settings.local.json");
    ed.prompt(
        &sid,
        "mkdir -p .claude && echo '{\"permissions\":{\"allow\":[\"Bash(ls)\"]},\"hooks\":{\"Stop\":[{\"hooks\":[{\"type\":\"command\",\"command\":\"evil\"}]}]}}' > .claude/settings.local.json",
    );
    answer_audit(&mut ed, &settings, "revert");
    let now: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&settings).unwrap()).unwrap();
    assert!(now.get("hooks").is_none(), "{now}");
    assert_eq!(now["permissions"]["allow"][0], "Bash(ls)");
    assert!(!outside.join("pwned").exists() && !outside.join("fsmonitor").exists());
}

#[test]
fn a_malformed_user_config_arms_the_bridge_and_says_why() {
    if !require_kernel_features() {
        return;
    }
    // The config may have asked for the sandbox; unreadable, the bridge
    // arms it as if it had (fail closed) and tells the user why.
    let home = tempfile::tempdir_in(scratch_base()).unwrap();
    let config = home.path().join("config/zcode-acp");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(
        config.join("config.json"),
        "{\n  \"sandbox\": {\"enabled\": tru\n}\n",
    )
    .unwrap();
    let mut opts = Options::new(shell_agent()).env("ZCODE_SHELL_AGENT_HOME", "");
    opts.outer_ns = true;
    opts.home_at = Some(home.path().to_path_buf());
    let mut ed = Editor::start_with(opts);
    ed.initialize();
    let ws = workspace(&ed, "w");
    let sid = ed.new_session(&ws);
    let state = ed
        .wait_for("the sandbox state", |v| {
            v["params"]["update"]["sessionUpdate"] == "tool_call"
        })
        .value;
    let update = &state["params"]["update"];
    assert_eq!(state["params"]["sessionId"], sid.as_str());
    assert!(
        update["title"]
            .as_str()
            .unwrap()
            .starts_with("Sandbox: Linux namespaces+Landlock"),
        "{state}"
    );
    let text = update["content"].to_string();
    assert!(
        text.contains("config.json is not valid at line 3")
            && text.contains("not valid JSON")
            && text.contains("arms it as if it were enabled"),
        "{text}"
    );
    // It may have held an egress list: no network, not the internet.
    assert!(
        text.contains("reaches no network") && text.contains("no public egress"),
        "{text}"
    );
}

/// A user network table that cannot be read may have been an egress
/// list: the sandbox fails closed (no network at all, not the defaults'
/// whole internet), and the editor is told why.
#[test]
fn a_network_table_that_cannot_be_read_closes_the_network_and_says_why() {
    if !require_kernel_features() {
        return;
    }
    let home = tempfile::tempdir_in(scratch_base()).unwrap();
    let config = home.path().join("config/zcode-acp");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(
        config.join("config.json"),
        r#"{"sandbox": {"enabled": true}, "network": {"egress": ["api.example.com", "not a host"]}}"#,
    )
    .unwrap();
    let mut opts = Options::new(shell_agent()).env("ZCODE_SHELL_AGENT_HOME", "");
    opts.outer_ns = true;
    opts.home_at = Some(home.path().to_path_buf());
    let mut ed = Editor::start_with(opts);
    ed.initialize();
    let ws = workspace(&ed, "w");
    ed.new_session(&ws);
    let state = ed
        .wait_for("the sandbox state", |v| {
            v["params"]["update"]["sessionUpdate"] == "tool_call"
        })
        .value;
    let text = state["params"]["update"]["content"].to_string();
    assert!(
        text.contains("network table cannot be read")
            && text.contains("not a host")
            && text.contains("reaches no network")
            && text.contains("no public egress"),
        "{text}"
    );
}

#[test]
fn a_refused_connection_is_put_to_the_user_and_each_answer_holds() {
    if !require_kernel_features() {
        return;
    }
    let (mut ed, ws, sid, _outside) = armed_editor();
    refused_connections_are_put_to_the_user(&mut ed, &ws, &sid);
}

/// A terminal runs in the directory that was judged: one the agent swaps
/// for a symlink between the bridge's look and the editor's start of the
/// terminal is refused there, not followed.
#[test]
fn a_terminals_directory_swapped_for_a_symlink_is_refused_not_followed() {
    if !require_kernel_features() {
        return;
    }
    let (text, code) = terminal_after_its_directory_changed(|sub, outside| {
        std::fs::rename(sub, sub.with_file_name("sub.real")).unwrap();
        std::os::unix::fs::symlink(outside, sub).unwrap();
    });
    assert!(
        text.contains("not the directory that was judged"),
        "the terminal ran where the link leads: {text}"
    );
    assert!(!text.contains("ran in"), "{text}");
    assert_ne!(code, Some(0));
}

/// One the agent moves away meanwhile is refused too: a command meant for
/// a subdirectory never runs in its parent instead.
#[test]
fn a_terminals_directory_moved_away_is_refused_not_replaced_by_its_parent() {
    if !require_kernel_features() {
        return;
    }
    let (text, code) = terminal_after_its_directory_changed(|sub, _| {
        std::fs::rename(sub, sub.with_file_name("sub.moved")).unwrap();
    });
    assert!(text.contains("does not exist any more"), "{text}");
    assert!(!text.contains("ran in"), "{text}");
    assert_ne!(code, Some(0));
}

/// Has the armed agent ask for a terminal in the workspace's `sub`, calls
/// `change(sub, outside)` before the editor starts it, starts it as the
/// editor would, and returns what it printed and its exit code. The
/// session is in the workspace's root: a link on the way to a session's
/// own root would be reverted by the audit's watcher too, at a moment of
/// its own (it acts whatever the agent is doing), and the test is of the
/// terminal.
fn terminal_after_its_directory_changed(
    change: impl Fn(&std::path::Path, &std::path::Path),
) -> (String, Option<i32>) {
    let mut ed = start_shell_agent(true);
    ed.initialize();
    let ws = workspace(&ed, "w");
    let sub = ws.join("sub");
    std::fs::create_dir_all(&sub).unwrap();
    let sid = ed.new_session(&ws);
    let outside = std::fs::canonicalize(ed.home()).unwrap().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    ed.manual.push("terminal/create");
    let id = ed.prompt_request(&sid, "/terminal-in sub echo ran in $(pwd)");
    let req = ed
        .wait_for("terminal/create", |v| v["method"] == "terminal/create")
        .value;
    // The agent wins the race.
    change(&sub, &outside);
    let p = &req["params"];
    let out = std::process::Command::new(p["command"].as_str().unwrap())
        .args(
            p["args"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a.as_str().unwrap()),
        )
        // Where the directory is gone, as an editor that started the
        // terminal just before the agent moved it: the sandbox enters the
        // judged directory itself in any case.
        .current_dir(
            Some(std::path::Path::new(p["cwd"].as_str().unwrap()))
                .filter(|d| d.exists())
                .unwrap_or(&ws),
        )
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    ed.terminals.push((text.clone(), out.status.code()));
    let n = ed.terminals.len() - 1;
    ed.send(&serde_json::json!({"jsonrpc": "2.0", "id": req["id"], "result": {"terminalId": format!("term-{n}")}}));
    ed.response(&id);
    (text, out.status.code())
}

/// No window after the turn (see `common::plants_after_the_turn_are_reverted`).
#[test]
fn a_plant_made_after_the_turn_ended_is_reverted_at_once_in_every_root() {
    if !require_kernel_features() {
        return;
    }
    let (mut ed, ws, sid, outside) = armed_editor();
    let ws2 = workspace(&ed, "second");
    common::plants_after_the_turn_are_reverted(&mut ed, &ws, &sid, &ws2, &outside);
}

/// The editor writes where it was judged (see
/// `common::editor_writes_land_where_judged`).
#[test]
fn the_editor_writes_exactly_where_it_was_judged_while_the_agent_races_the_path() {
    if !require_kernel_features() {
        return;
    }
    let (mut ed, ws, sid, outside) = armed_editor();
    common::editor_writes_land_where_judged(&mut ed, &ws, &sid, &outside);
}

/// A write the editor does not answer holds the agent only until the user
/// cancels the turn: the write is withdrawn (`$/cancel_request`) and the
/// agent told, and since the editor may still make it, the agent's
/// processes are ended, not let go (a racer waiting to swap the directory
/// never runs), and the agent comes back for the next prompt. A FIFO,
/// which the editor would block on, is never sent to it at all.
#[test]
fn a_held_write_the_editor_never_answers_is_withdrawn_when_the_user_cancels() {
    if !require_kernel_features() {
        return;
    }
    let (mut ed, ws, sid, outside) = armed_editor();
    ed.prompt(
        &sid,
        &format!(
            "mkfifo p && mkdir d && nohup sh -c 'while [ ! -e go ]; do date +%s%N > ticks.tmp && mv ticks.tmp ticks; sleep 0.02; done; mv d d.old && ln -s {} d' > /dev/null 2>&1 & while [ ! -e ticks ]; do sleep 0.01; done; echo started",
            outside.display()
        ),
    );
    ed.manual.push("fs/write_text_file");
    let (_, text) = ed.prompt(&sid, "/write p x");
    assert!(text.contains("not a regular file"), "{text}");
    let ticks = || std::fs::read_to_string(ws.join("ticks")).unwrap_or_default();
    let start = ed.seen.len();
    let id = ed.prompt_request(&sid, "/write d/f x");
    let write = ed
        .wait_for("the write at the editor", |v| {
            v["method"] == "fs/write_text_file"
        })
        .value;
    // The racer is told to swap now: held, it cannot.
    std::fs::write(ws.join("go"), "").unwrap();
    let before = ticks();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        ticks(),
        before,
        "the agent's processes ran while the editor wrote"
    );
    ed.notify("session/cancel", serde_json::json!({ "sessionId": sid }));
    ed.wait_for("the write withdrawn", |v| {
        v["method"] == "$/cancel_request" && v["params"]["requestId"] == write["id"]
    });
    // The turn ends with the agent's processes: said as zcode-acp's doing.
    let r = ed.response(&id);
    assert!(
        r.to_string().contains("ended the agent's processes"),
        "{r} {}",
        ed.agent_text_since(start, &sid)
    );
    // The editor makes the write late anyway: it lands where it was judged.
    let path = write["params"]["path"].as_str().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    std::fs::write(path, "late").unwrap();
    ed.send(&serde_json::json!({"jsonrpc": "2.0", "id": write["id"], "result": {}}));
    assert!(!outside.join("f").exists(), "the late write landed outside");
    assert_eq!(std::fs::read_to_string(ws.join("d/f")).unwrap(), "late");
    assert!(
        !ws.join("d.old").exists(),
        "the racer ran after the withdrawal"
    );
    // The agent is back for the next prompt.
    ed.manual.clear();
    let (_, text) = ed.prompt(&sid, "echo back");
    assert!(text.contains("back"), "{text}");
}

/// The same in the home directory: a hook planted in the agent's own
/// settings, and an MCP server in `~/.claude.json` (saved as Claude saves
/// it, through a temporary file), by a process it left running, after its
/// turn, are reverted at once (the agent here keeps Claude's state, so it
/// may write there).
#[test]
fn a_hook_planted_in_the_agents_settings_after_the_turn_is_reverted_at_once() {
    if !require_kernel_features() {
        return;
    }
    let home_dir = tempfile::tempdir_in(scratch_base()).unwrap();
    let home = std::fs::canonicalize(home_dir.path()).unwrap();
    // Its transcripts where Claude's profile lets it write.
    let transcripts = home.join(".claude/shell-agent");
    let mut opts = Options::new(shell_agent())
        .env("ZCODE_SHELL_AGENT_HOME", transcripts.to_str().unwrap())
        .env("ZCODE_ACP_SANDBOX", "1")
        .arg("--backend-profile")
        .arg("claude");
    opts.outer_ns = true;
    opts.home_at = Some(home.clone());
    let mut ed = Editor::start_with(opts);
    ed.initialize();
    let ws = workspace(&ed, "w");
    let sid = ed.new_session(&ws);
    let settings = home.join(".claude/settings.json");
    let state = home.join(".claude.json");
    let (r, _) = ed.prompt(
        &sid,
        &format!(
            "(sleep 2; echo '{{\"hooks\":{{\"Stop\":[{{\"hooks\":[{{\"type\":\"command\",\"command\":\"evil\"}}]}}]}}}}' > {s}; \
              (set -C; echo '{{\"mcpServers\":{{\"x\":{{\"command\":\"evil\"}}}}}}' > {c}.tmp.1) && mv {c}.tmp.1 {c}) > /dev/null 2>&1 & echo left",
            s = settings.display(),
            c = state.display()
        ),
    );
    assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    answer_audit(&mut ed, &settings, "revert");
    answer_audit(&mut ed, &state, "revert");
    let read = |p: &std::path::Path| std::fs::read_to_string(p).unwrap_or_default();
    assert!(!read(&settings).contains("evil"), "{}", read(&settings));
    assert!(!read(&state).contains("evil"), "{}", read(&state));
}

/// A home whose path overlayfs's options cannot name (a `,` and a `:` in
/// it) gets no copy-on-write layer over its caches: the agent gets a
/// private cache of its own instead (never the user's, written directly),
/// and the editor's notice says so.
#[test]
fn a_cache_that_cannot_be_layered_is_private_and_said() {
    if !require_kernel_features() {
        return;
    }
    let base = tempfile::tempdir_in(scratch_base()).unwrap();
    let home = std::fs::canonicalize(base.path())
        .unwrap()
        .join("odd,home:x");
    std::fs::create_dir_all(home.join(".npm")).unwrap();
    std::fs::write(home.join(".npm/mine"), "the user's own").unwrap();
    let mut opts = Options::new(shell_agent())
        .env("ZCODE_SHELL_AGENT_HOME", "")
        .env("ZCODE_ACP_SANDBOX", "1");
    opts.outer_ns = true;
    opts.home_at = Some(home.clone());
    let mut ed = Editor::start_with(opts);
    ed.initialize();
    let ws = home.join("w");
    std::fs::create_dir_all(&ws).unwrap();
    let start = ed.seen.len();
    let sid = ed.new_session(&ws);
    let (_, text) = ed.prompt(
        &sid,
        "ls ~/.npm; echo poisoned > ~/.npm/planted && cat ~/.npm/planted",
    );
    assert!(
        text.contains("poisoned"),
        "the private cache is not writable: {text}"
    );
    assert!(
        !text.contains("mine"),
        "the user's cache shows inside: {text}"
    );
    assert!(
        !home.join(".npm/planted").exists(),
        "the plant reached the user's cache"
    );
    assert_eq!(
        std::fs::read_to_string(home.join(".npm/mine")).unwrap(),
        "the user's own"
    );
    let notice = ed.seen[start..]
        .iter()
        .find(|l| l.raw.contains("less than planned"))
        .map(|l| l.raw.clone())
        .unwrap_or_else(|| panic!("no notice says the cache is private"));
    assert!(notice.contains("a private one of its own"), "{notice}");
}

/// An agent no profile knows keeps its state in `~/.newagent`: its first
/// refused save becomes one question in the editor; after "Allow for this
/// agent, always" its saves land (from its next prompt), the place is in
/// the user config under the agent's name, and a second bridge on another
/// project lets it save without a question. Checked on disk.
#[test]
fn an_agent_nobody_profiled_is_asked_about_its_state_once_and_remembered() {
    if !require_kernel_features() {
        return;
    }
    // A user's home (not a temp dir), the agent installed in it as a
    // script run by python3, as a user would launch it.
    let base = home_like_a_users("zcode-newagent");
    let home = std::fs::canonicalize(base.path()).unwrap();
    let script = home.join("bin/newagent.py");
    std::fs::create_dir_all(script.parent().unwrap()).unwrap();
    std::fs::copy(
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/newagent.py"),
        &script,
    )
    .unwrap();
    let (p1, p2) = (home.join("p1"), home.join("p2"));
    for p in [&p1, &p2] {
        std::fs::create_dir_all(p).unwrap();
    }
    let start = || {
        let mut opts = Options::new(vec!["python3".into(), script.display().to_string()])
            .env("ZCODE_ACP_SANDBOX", "1");
        opts.home_at = Some(home.clone());
        opts.outer_ns = true;
        let mut ed = Editor::start_with(opts);
        ed.initialize();
        ed
    };
    let questions = |ed: &Editor| {
        ed.seen
            .iter()
            .filter(|l| l.value["method"] == "session/request_permission")
            .count()
    };
    let state = home.join(".newagent/state.json");

    let mut ed = start();
    let sid = ed.new_session(&p1);
    let before = ed.seen.len();
    let id = ed.prompt_request(&sid, "save");
    let asked = ed
        .wait_for("the question about its state", |v| {
            v["method"] == "session/request_permission"
        })
        .value;
    // Answered only once the turn is over and a moment has passed: the
    // refusals it makes up, printed right behind the real one, reach the
    // bridge while the question is open, and none is asked (one question
    // at a time). Answered at once, a line a loaded machine delivers after
    // the answer could be.
    ed.response(&id);
    ed.drain_for(Duration::from_millis(300));
    ed.send(&serde_json::json!({"jsonrpc": "2.0", "id": asked["id"], "result": {"outcome": {"outcome": "selected", "optionId": "state-always"}}}));
    let title = asked["params"]["toolCall"]["title"]
        .as_str()
        .unwrap_or_default();
    assert!(
        title.contains("newagent") && title.contains("~/.newagent"),
        "{asked}"
    );
    assert_eq!(ed.agent_text_since(before, &sid), "not saved");
    assert!(!state.exists());
    // From its next prompt (the sandbox re-armed when the turn ended).
    let (_, text) = ed.prompt(&sid, "save");
    assert_eq!(text, "saved");
    assert!(state.exists());
    let (_, text) = ed.prompt(&sid, "save");
    assert_eq!(text, "saved");
    assert_eq!(questions(&ed), 1, "asked once");
    let config = std::fs::read_to_string(home.join("config/zcode-acp/config.json")).unwrap();
    assert!(
        config.contains("agentState") && config.contains("~/.newagent"),
        "{config}"
    );
    drop(ed);

    // Another bridge, another project: remembered, no question.
    let mut ed = start();
    let sid = ed.new_session(&p2);
    let (_, text) = ed.prompt(&sid, "save");
    assert_eq!(text, "saved");
    assert_eq!(questions(&ed), 0);
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&state).unwrap()).unwrap();
    assert_eq!(saved["prompts"], 3);
}

/// What a turn sent through the sandbox's proxy is said when the turn
/// ends, in one notice, with the byte counts the other end received; a
/// turn that sent nothing says nothing.
#[test]
fn what_a_turn_sent_is_said_when_it_ends() {
    if !require_kernel_features() {
        return;
    }
    let (mut ed, ws, sid, _outside) = armed_editor();
    let svc = LoopbackService::start();
    let size = 1_500_000usize;
    std::fs::write(ws.join("up.bin"), vec![b'x'; size]).unwrap();
    let start = ed.seen.len();
    let upload = format!(
        "curl -s -m 60 --noproxy '' -T up.bin http://127.0.0.1:{}/up; echo; echo done",
        svc.port
    );
    let (_, text) = prompt_answering(&mut ed, &sid, &upload, "allow-once");
    assert!(text.contains(&format!("got {size}")), "{text}");
    let notices: Vec<&serde_json::Value> = ed.seen[start..]
        .iter()
        .map(|l| &l.value)
        .filter(|v| {
            v["params"]["update"]["title"]
                .as_str()
                .is_some_and(|t| t.starts_with("Network: this turn sent"))
        })
        .collect();
    assert_eq!(notices.len(), 1, "one notice per turn");
    let title = notices[0]["params"]["update"]["title"].as_str().unwrap();
    assert!(title.contains("1.5 MB to 127.0.0.1"), "{title}");
    let content = notices[0]["params"]["update"]["content"].to_string();
    assert!(content.contains("a large upload"), "{content}");
    // The exact count: the body the service received, and the request's
    // head.
    let sent: usize = content
        .split(" bytes)")
        .next()
        .and_then(|s| s.rsplit('(').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no byte count: {content}"));
    assert!(
        (size..size + 2048).contains(&sent),
        "the proxy counted {sent} bytes sent; the service received {size}"
    );
    // A turn that sent nothing through the proxy says nothing.
    let start = ed.seen.len();
    ed.prompt(&sid, "true");
    assert!(
        !ed.seen[start..]
            .iter()
            .any(|l| l.value["params"]["update"]["title"]
                .as_str()
                .is_some_and(|t| t.starts_with("Network:"))),
        "a notice for a turn that sent nothing"
    );
}
