//! The terminal commands that inspect and change a project's sandbox:
//! `profile --check`, `allow`, `deny`, `approve`, run as a user would.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{exit_within, BIN};

struct Home {
    dir: tempfile::TempDir,
    ws: PathBuf,
}

fn home() -> Home {
    let dir = tempfile::tempdir().unwrap();
    let ws = std::fs::canonicalize(dir.path()).unwrap().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    Home { dir, ws }
}

fn zcode(h: &Home, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("HOME", h.dir.path())
        .env("XDG_CONFIG_HOME", h.dir.path().join("config"))
        .env_remove("ZCODE_ACP_BACKEND")
        .output()
        .unwrap()
}

/// A run that must have succeeded (its stderr is shown when it did not).
fn ok(out: Output) -> Output {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `zcode-acp allow|deny PATH --workspace WS`.
fn record(h: &Home, verb: &str, path: &Path) -> Output {
    zcode(
        h,
        &[
            verb,
            path.to_str().unwrap(),
            "--workspace",
            h.ws.to_str().unwrap(),
        ],
    )
}

fn check(h: &Home, path: &Path) -> String {
    let out = ok(zcode(
        h,
        &[
            "profile",
            "--target",
            "macos",
            "--workspace",
            h.ws.to_str().unwrap(),
            "--check",
            path.to_str().unwrap(),
        ],
    ));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned()
}

fn sandbox_json(h: &Home) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(h.ws.join(".zcode/acp/sandbox.json")).unwrap())
        .unwrap()
}

#[test]
fn allow_records_approves_and_takes_effect() {
    let h = home();
    let shared = h.dir.path().join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    let shared = std::fs::canonicalize(&shared).unwrap();
    // A hand-added entry is ignored until approved...
    std::fs::create_dir_all(h.ws.join(".zcode/acp")).unwrap();
    std::fs::write(
        h.ws.join(".zcode/acp/sandbox.json"),
        format!(
            r#"{{"enabled": true, "allow": ["{}"], "mine": 1}}"#,
            shared.display()
        ),
    )
    .unwrap();
    assert!(check(&h, &shared.join("f")).contains("denied (outside)"));
    // ...and `allow` approves it (deduped, unknown keys kept).
    ok(record(&h, "allow", &shared));
    let v = sandbox_json(&h);
    assert_eq!(v["allow"].as_array().unwrap().len(), 1);
    assert_eq!(v["mine"], 1);
    assert!(
        check(&h, &shared.join("f")).contains("allowed (allow)"),
        "{}",
        check(&h, &shared.join("f"))
    );
}

#[test]
fn deny_records_a_path_that_is_never_allowed() {
    let h = home();
    let secrets = h.ws.join("secrets");
    ok(record(&h, "deny", &secrets));
    assert_eq!(sandbox_json(&h)["deny"][0], secrets.to_str().unwrap());
    let line = check(&h, &secrets.join("key"));
    assert!(
        line.contains("denied (protected)") && line.contains("never allowed"),
        "{line}"
    );
}

/// A workspace opened through a symlink (the config is read with no
/// symlink followed below the root, but the root's own path may have one)
/// still has its sandbox.json: its deny entry holds there (in the sandbox
/// too: linux_sandbox's a_workspace_opened_through_a_symlink_...).
#[test]
fn a_workspace_opened_through_a_symlink_keeps_its_config() {
    let h = home_like_a_user();
    let secrets = h.ws.join("secrets");
    std::fs::create_dir_all(&secrets).unwrap();
    ok(record(&h, "deny", &secrets));
    let link = h.ws.parent().unwrap().join("ws-link");
    std::os::unix::fs::symlink(&h.ws, &link).unwrap();
    let check_via = |p: &Path| {
        let out = ok(zcode(
            &h,
            &[
                "profile",
                "--workspace",
                link.to_str().unwrap(),
                "--check",
                p.to_str().unwrap(),
            ],
        ));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let denied = check_via(&link.join("secrets/key"));
    assert!(denied.contains("denied (protected)"), "{denied}");
    let allowed = check_via(&link.join("notes.txt"));
    assert!(allowed.contains("allowed"), "{allowed}");
}

#[test]
fn the_sandboxs_own_configuration_and_the_whole_home_cannot_be_allowed() {
    let h = home();
    for target in [
        h.ws.join(".zcode/acp"),
        h.dir.path().to_path_buf(),
        PathBuf::from("/"),
    ] {
        let out = record(&h, "allow", &target);
        assert_eq!(out.status.code(), Some(1), "{}", target.display());
        assert!(String::from_utf8_lossy(&out.stderr).contains("refusing to allow"));
    }
    let json = h.ws.join(".zcode/acp/sandbox.json");
    if json.exists() {
        assert_eq!(sandbox_json(&h)["allow"], serde_json::json!([]));
    }
}

#[test]
fn approve_accepts_a_hand_edit() {
    let h = home();
    std::fs::create_dir_all(h.ws.join(".zcode/acp")).unwrap();
    let file = h.ws.join(".zcode/acp/sandbox.json");
    std::fs::write(&file, r#"{"enabled": true, "strictGit": true}"#).unwrap();
    std::fs::create_dir_all(h.ws.join(".git")).unwrap();
    // Approved once with strictGit on (recorded in the ledger)...
    ok(zcode(
        &h,
        &["approve", "--workspace", h.ws.to_str().unwrap()],
    ));
    assert!(check(&h, &h.ws.join(".git/objects/x")).contains("protected"));
    // ...a hand edit turning strictGit off is ignored until approved.
    std::fs::write(&file, r#"{"enabled": true, "strictGit": false}"#).unwrap();
    assert!(check(&h, &h.ws.join(".git/objects/x")).contains("protected"));
    ok(zcode(
        &h,
        &["approve", "--workspace", h.ws.to_str().unwrap()],
    ));
    assert!(
        check(&h, &h.ws.join(".git/objects/x")).contains("allowed"),
        "{}",
        check(&h, &h.ws.join(".git/objects/x"))
    );
}

/// The last stage of a macOS terminal (`__exec-env`), which needs no
/// sandbox to test: the agent's environment reaches the command, the
/// command is found on the agent's `PATH`, and its exit status is kept.
#[test]
fn exec_env_applies_the_environment_and_becomes_the_command() {
    use std::os::unix::fs::PermissionsExt;
    let h = home();
    let bin = h.dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let tool = bin.join("agent-tool");
    std::fs::write(
        &tool,
        "#!/bin/sh\necho \"mark=$MARK pid=$$ args=$*\"\nexit 7\n",
    )
    .unwrap();
    std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!("PATH={}:/usr/bin:/bin", bin.display());
    let child = Command::new(BIN)
        .args([
            "__exec-env",
            "--env=MARK=a=b",
            &format!("--env={path}"),
            "--",
        ])
        .args(["agent-tool", "--env=not-ours", "-x"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(7));
    // The same process: the editor's kill reaches the command directly.
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("mark=a=b pid={pid} args=--env=not-ours -x\n")
    );
    let bad = zcode(&h, &["__exec-env", "--env=novalue", "--", "true"]);
    assert_eq!(bad.status.code(), Some(127));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("NAME=VALUE"));
}

/// A sandbox.json that is a FIFO, or a symlink to /dev/zero, must neither
/// hang the launcher nor grow its memory: it fails closed (the project is
/// armed, without its entries), quickly.
#[test]
fn a_fifo_or_device_as_sandbox_json_fails_closed_without_hanging() {
    for kind in ["fifo", "zero"] {
        let h = home();
        let dir = h.ws.join(".zcode/acp");
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("sandbox.json");
        match kind {
            "fifo" => {
                nix::unistd::mkfifo(&file, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap()
            }
            _ => std::os::unix::fs::symlink("/dev/zero", &file).unwrap(),
        }
        let mut child = Command::new(BIN)
            .args(["profile", "--workspace", h.ws.to_str().unwrap(), "--check"])
            .arg(h.dir.path().join("elsewhere"))
            .env("HOME", h.dir.path())
            .env("XDG_CONFIG_HOME", h.dir.path().join("config"))
            .env_remove("ZCODE_ACP_BACKEND")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let status = exit_within(
            &mut child,
            std::time::Duration::from_secs(10),
            &format!("{kind}: the launcher hung on a {kind} sandbox.json"),
        );
        let out = child.wait_with_output().unwrap();
        assert!(
            status.success(),
            "{kind}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains("denied"), "{kind}: {stdout}");
    }
}

/// A home where a user's is (never a temp directory, whose writes are
/// allowed by design and would hide a grant).
fn home_like_a_user() -> Home {
    let dir = common::home_like_a_users("zcode-commands-");
    let ws = std::fs::canonicalize(dir.path()).unwrap().join("src/ws");
    std::fs::create_dir_all(&ws).unwrap();
    Home { dir, ws }
}

/// The bridge never offers `~/.ssh` (policy::offerable); the terminal must
/// not open it either, neither by `allow` nor by an approved hand edit.
#[test]
fn ssh_keys_are_never_granted_from_a_terminal_either() {
    let h = home_like_a_user();
    let ssh = std::fs::canonicalize(h.dir.path()).unwrap().join(".ssh");
    std::fs::create_dir_all(&ssh).unwrap();
    let keys = ssh.join("authorized_keys");
    for target in [&ssh, &keys] {
        let out = record(&h, "allow", target);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{}: {err}", target.display());
        assert!(
            err.contains("refusing to allow") && err.contains("ssh keys"),
            "{err}"
        );
    }
    // A hand edit, approved: the entry is ignored, and said so.
    std::fs::create_dir_all(h.ws.join(".zcode/acp")).unwrap();
    std::fs::write(
        h.ws.join(".zcode/acp/sandbox.json"),
        format!(r#"{{"enabled": true, "allow": ["{}"]}}"#, ssh.display()),
    )
    .unwrap();
    ok(zcode(
        &h,
        &["approve", "--workspace", h.ws.to_str().unwrap()],
    ));
    let verdict = check(&h, &keys);
    assert!(verdict.contains("denied"), "{verdict}");
    // Writable paths beside it still are.
    assert!(check(&h, &h.ws.join("src/main.rs")).contains("allowed"));
}

/// A repository the agent made with a FIFO as its git config (or a config
/// that includes one) would block git, and arming with it: discovery never
/// waits on it for long.
#[test]
fn a_fifo_git_config_never_hangs_arming() {
    let h = home();
    let git = |dir: &Path| {
        let ok = Command::new("git")
            .args(["init", "-q"])
            .arg(dir)
            .status()
            .unwrap()
            .success();
        assert!(ok, "git init {}", dir.display());
    };
    git(&h.ws);
    let fifo_mode = nix::sys::stat::Mode::from_bits_truncate(0o600);
    // A nested repository whose config is a FIFO...
    let nested = h.ws.join("vendor/planted");
    git(&nested);
    std::fs::remove_file(nested.join(".git/config")).unwrap();
    nix::unistd::mkfifo(&nested.join(".git/config"), fifo_mode).unwrap();
    // ...and one whose config includes a FIFO.
    let including = h.ws.join("vendor/including");
    git(&including);
    nix::unistd::mkfifo(&including.join(".git/extra"), fifo_mode).unwrap();
    let mut config = std::fs::OpenOptions::new()
        .append(true)
        .open(including.join(".git/config"))
        .unwrap();
    std::io::Write::write_all(&mut config, b"[include]\n\tpath = extra\n").unwrap();

    let started = std::time::Instant::now();
    let mut child = Command::new(BIN)
        .args(["profile", "--workspace", h.ws.to_str().unwrap()])
        .env("HOME", h.dir.path())
        .env("XDG_CONFIG_HOME", h.dir.path().join("config"))
        .env_remove("ZCODE_ACP_BACKEND")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let status = exit_within(
        &mut child,
        std::time::Duration::from_secs(20).saturating_sub(started.elapsed()),
        "arming hung on a FIFO git config",
    );
    let out = child.wait_with_output().unwrap();
    assert!(status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// A `core.hooksPath` whose directory does not exist yet is protected all
/// the same: the agent must not be the one to create the hooks git will
/// run on the user's next commit.
#[test]
fn a_hooks_path_that_does_not_exist_yet_is_protected() {
    let h = home_like_a_user();
    for args in [
        &["init", "-q"][..],
        &["config", "core.hooksPath", ".githooks"][..],
    ] {
        let ok = Command::new("git")
            .args(args)
            .current_dir(&h.ws)
            .status()
            .unwrap()
            .success();
        assert!(ok, "git {args:?}");
    }
    assert!(!h.ws.join(".githooks").exists());
    let verdict = check(&h, &h.ws.join(".githooks/pre-commit"));
    assert!(verdict.contains("protected"), "{verdict}");
    assert!(check(&h, &h.ws.join("src/main.rs")).contains("allowed"));
}

/// Every bad input gets a message that says what to do, once, in the
/// user's terms.
#[test]
fn bad_input_gets_a_message_a_user_can_act_on() {
    let h = home();
    let stderr = |out: &Output| String::from_utf8_lossy(&out.stderr).into_owned();
    let stdout = |out: &Output| String::from_utf8_lossy(&out.stdout).into_owned();
    // A workspace that does not exist is named, for every command.
    let missing = h.ws.join("no-such-dir");
    for cmd in [
        vec!["profile", "--workspace", missing.to_str().unwrap()],
        vec!["doctor", "--workspace", missing.to_str().unwrap()],
        vec![
            "run",
            "--workspace",
            missing.to_str().unwrap(),
            "--",
            "true",
        ],
    ] {
        let out = zcode(&h, &cmd);
        assert!(!out.status.success(), "{cmd:?}");
        let e = stderr(&out);
        assert!(
            e.contains(&format!(
                "the workspace {} does not exist",
                missing.display()
            )),
            "{cmd:?}: {e}"
        );
    }
    // A relative path is the workspace's, not the terminal's.
    std::fs::create_dir_all(h.ws.join("build")).unwrap();
    let out = ok(Command::new(BIN)
        .args(["allow", "build", "--workspace", h.ws.to_str().unwrap()])
        .current_dir("/")
        .env("HOME", h.dir.path())
        .env("XDG_CONFIG_HOME", h.dir.path().join("config"))
        .output()
        .unwrap());
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&h.ws.join("build").display().to_string()),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // And for deny.
    std::fs::create_dir_all(h.ws.join("secrets")).unwrap();
    let out = ok(Command::new(BIN)
        .args(["deny", "secrets", "--workspace", h.ws.to_str().unwrap()])
        .current_dir("/")
        .env("HOME", h.dir.path())
        .env("XDG_CONFIG_HOME", h.dir.path().join("config"))
        .output()
        .unwrap());
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains(&h.ws.join("secrets").display().to_string()),
        "{said}"
    );
    let config = std::fs::read_to_string(h.ws.join(".zcode/acp/sandbox.json")).unwrap();
    assert!(
        config.contains(&h.ws.join("secrets").display().to_string()),
        "{config}"
    );
    // A malformed sandbox.json: said once that nothing changed, and why.
    std::fs::write(h.ws.join(".zcode/acp/sandbox.json"), "{\"enabled\": tru").unwrap();
    let out = record(&h, "allow", &h.ws.join("other"));
    let e = stderr(&out);
    assert!(!out.status.success());
    assert!(
        e.contains("malformed") && e.contains("nothing was changed"),
        "{e}"
    );
    assert!(!e.contains("holds for this session"), "{e}");
    assert_eq!(e.matches("nothing was changed").count(), 1, "{e}");
    // What profile and doctor say of it is in words, not Rust's debug forms.
    for args in [
        vec!["profile", "--workspace", h.ws.to_str().unwrap()],
        vec!["doctor", "--workspace", h.ws.to_str().unwrap()],
    ] {
        let out = zcode(&h, &args);
        let said = format!("{}{}", stdout(&out), stderr(&out));
        assert!(
            args[0] == "profile" || said.contains("sandbox.json malformed"),
            "{args:?}: {said}"
        );
        no_rust_names(&said);
    }
    // Negative sizes are refused plainly, not taken for a backend.
    for (flag, value) in [("--max-frame-bytes", "-5"), ("--stop-grace-ms", "-5")] {
        let out = zcode(&h, &[flag, value, "--", "true"]);
        assert_eq!(out.status.code(), Some(2));
        let e = stderr(&out);
        assert!(e.contains("is negative") && !e.contains("-- -5"), "{e}");
    }
    // No Rust type names in what the user config's errors say.
    std::fs::create_dir_all(h.dir.path().join("config/zcode-acp")).unwrap();
    std::fs::write(
        h.dir.path().join("config/zcode-acp/config.json"),
        "{\n  \"backend\": 5\n}\n",
    )
    .unwrap();
    let out = zcode(&h, &["profile", "--workspace", h.ws.to_str().unwrap()]);
    let e = stderr(&out);
    assert!(
        e.contains("config.json is not valid at line 2")
            && e.contains("expected a command, as a list of strings"),
        "{e}"
    );
    no_rust_names(&e);
}

/// A message names no Rust type or debug form (`untagged enum
/// BackendSpec`, `Malformed("…")`, `Missing`, `Some(…)`).
fn no_rust_names(said: &str) {
    for form in [
        "BackendSpec",
        "untagged",
        "Malformed(",
        "Missing",
        "Some(",
        "None)",
        "Err(",
        "Ok(",
    ] {
        assert!(!said.contains(form), "{form}: {said}");
    }
}

/// `run` reads its arguments with a parser of its own (it starts at every
/// step an agent takes); what that parser does not take is read by the
/// whole command line's, as before: its help, the global `--log-file`, and
/// mistakes, which are said and run nothing.
#[test]
fn run_reads_its_own_arguments_and_leaves_the_rest_to_the_whole_parser() {
    let h = home();
    let ws = h.ws.to_str().unwrap();
    let help = zcode(&h, &["run", "--help"]);
    assert!(help.status.success());
    let said = String::from_utf8_lossy(&help.stdout);
    assert!(said.contains("Usage: zcode-acp run"), "{said}");

    let marker = h.ws.join("ran");
    let touch = format!("touch {}", marker.display());
    let out = zcode(&h, &["run", "--workspace", ws, "sh", "-c", &touch]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    // The whole parser's message, with the usage it names `run` by.
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Usage: zcode-acp run"),
        "{out:?}"
    );
    assert!(!marker.exists(), "a command given without `--` was run");

    let log = h.dir.path().join("run.log");
    let out = zcode(
        &h,
        &[
            "run",
            "--log-file",
            log.to_str().unwrap(),
            "--workspace",
            ws,
            "--",
            "sh",
            "-c",
            "true",
        ],
    );
    assert!(log.is_file(), "--log-file was not taken: {out:?}");
}

/// A helper started ahead of its arming (`__sandbox --args-on-stdin`, as
/// the bridge starts each generation's) runs only the command line it is
/// handed as stdin's first line: a closed stdin (an arming that did not
/// come) ends it without a word, and a line it does not take is refused,
/// never run some other way.
#[test]
#[cfg(target_os = "linux")]
fn a_helper_started_ahead_runs_only_the_command_line_it_is_handed() {
    let h = home();
    let handed = |stdin: &[u8]| {
        let mut child = Command::new(BIN)
            .args(["__sandbox", "--args-on-stdin"])
            .env("HOME", h.dir.path())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), stdin).unwrap();
        child.wait_with_output().unwrap()
    };
    let out = handed(b"");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(out.stdout.is_empty() && out.stderr.is_empty(), "{out:?}");
    let missing = h.dir.path().join("no-such-spec.json");
    let line = serde_json::json!(["__sandbox", "--spec", missing]).to_string();
    let out = handed(format!("{line}\n{{\"jsonrpc\":\"2.0\"}}\n").as_bytes());
    assert_eq!(out.status.code(), Some(126), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no-such-spec.json"),
        "{out:?}"
    );
    for refused in [
        &b"[\"__sandbox\", \"--args-on-stdin\"]\n"[..],
        b"[\"run\", \"--\", \"sh\", \"-c\", \"true\"]\n",
        b"not json\n",
        b"[\"__sandbox\", \"--spec\"",
    ] {
        let out = handed(refused);
        assert_eq!(out.status.code(), Some(126), "{out:?}");
        assert!(out.stdout.is_empty(), "{out:?}");
    }
}

/// The sandbox helper reads its arguments with its own parser (it starts
/// every generation and terminal); what that parser does not take goes to
/// the whole one, which says what is wrong as before.
#[test]
#[cfg(target_os = "linux")]
fn the_helper_reads_its_own_arguments_and_leaves_the_rest_to_the_whole_parser() {
    let h = home();
    let missing = h.dir.path().join("no-such-spec.json");
    let spec = missing.to_str().unwrap();
    // Its own parser: a spec that cannot be read is the helper's refusal.
    let out = zcode(&h, &["__sandbox", "--spec", spec, "--consume"]);
    assert_eq!(out.status.code(), Some(126), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no-such-spec.json"),
        "{out:?}"
    );
    // Neither a spec nor a descriptor: the whole parser's usage error.
    let out = zcode(&h, &["__sandbox", "--consume"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--spec"),
        "{out:?}"
    );
    // A global option it does not take: the whole parser, then the helper.
    let log = h.dir.path().join("helper.log");
    let out = zcode(
        &h,
        &[
            "__sandbox",
            "--log-file",
            log.to_str().unwrap(),
            "--spec",
            spec,
        ],
    );
    assert_eq!(out.status.code(), Some(126), "{out:?}");
    assert!(log.is_file(), "--log-file was not taken: {out:?}");
}
