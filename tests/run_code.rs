//! `zcode-acp mcp`: the real server over stdio, driven by the official
//! Rust MCP SDK's client, running real interpreters under the real
//! sandbox. Every write is checked on disk, in a home where a user's is
//! (never a temp directory, which is writable by design).
#![cfg(target_os = "linux")]

mod common;

use std::path::PathBuf;
use std::process::Stdio;

use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::RunningService;
use rmcp::transport::TokioChildProcess;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{json, Value};

use common::{home_like_a_users, require_kernel_features, BIN};

const AGENTS_BIN: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/agents/node_modules/.bin"
);

/// Whether a TypeScript runner is here (tsx, from `npm ci --prefix
/// tests/agents`); else the TypeScript part of a test is a printed skip.
fn typescript_here() -> bool {
    std::path::Path::new(AGENTS_BIN).join("tsx").exists()
        || common::skip("typescript needs tsx: npm ci --prefix tests/agents")
}

/// A user's world: a home (not under a temp directory), a project in it,
/// an "outside" folder beside the project, and the user config.
struct World {
    home: tempfile::TempDir,
}

impl World {
    fn new(config: Value) -> World {
        let home = home_like_a_users("zcode-runcode-");
        let w = World { home };
        std::fs::create_dir_all(w.workspace()).unwrap();
        std::fs::create_dir_all(w.outside()).unwrap();
        let cfg = w.path().join(".config/zcode-acp");
        std::fs::create_dir_all(&cfg).unwrap();
        std::fs::write(cfg.join("config.json"), config.to_string()).unwrap();
        w
    }

    fn path(&self) -> PathBuf {
        std::fs::canonicalize(self.home.path()).unwrap()
    }

    fn workspace(&self) -> PathBuf {
        self.path().join("project")
    }

    fn outside(&self) -> PathBuf {
        self.path().join("outside")
    }

    /// The server as an MCP client starts it: a cleared environment with
    /// this home, a PATH that has tsx, and a secret it must not pass on.
    async fn server(&self, extra_env: &[(&str, &str)]) -> Server {
        self.server_with(extra_env, &[]).await
    }

    async fn server_with(&self, extra_env: &[(&str, &str)], args: &[&str]) -> Server {
        let mut cmd = std::process::Command::new(BIN);
        cmd.arg("mcp")
            .arg("--workspace")
            .arg(self.workspace())
            .args(args)
            .env_clear()
            .env("HOME", self.path())
            .env("XDG_CONFIG_HOME", self.path().join(".config"))
            .env("PATH", format!("{AGENTS_BIN}:/usr/local/bin:/usr/bin:/bin"))
            .env("LANG", "C.UTF-8")
            .env("ZCODE_TEST_SECRET", "hunter2")
            .env("ZCODE_TEST_ALLOWED", "shared-on-purpose")
            .stderr(Stdio::inherit());
        for (k, v) in extra_env {
            cmd.env(k, v);
        }
        common::in_outer_mount_ns(&mut cmd);
        let transport = TokioChildProcess::new(tokio::process::Command::from(cmd))
            .expect("start zcode-acp mcp");
        let pid = transport.id();
        let client = ().serve(transport).await.expect("MCP initialize");
        Server { client, pid }
    }

    /// The server under `zcode-acp run`, as inside an armed agent: its
    /// runs share the sandbox's private `/tmp`.
    async fn server_in_a_sandbox(&self, args: &[&str]) -> Server {
        let ws = self.workspace();
        let mut cmd = std::process::Command::new(BIN);
        cmd.arg("run")
            .arg("--workspace")
            .arg(&ws)
            .arg("--backend-profile")
            .arg("none")
            .arg("--")
            .arg(BIN)
            .arg("mcp")
            .arg("--workspace")
            .arg(&ws)
            .args(args)
            .env_clear()
            .env("HOME", self.path())
            .env("XDG_CONFIG_HOME", self.path().join(".config"))
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .current_dir(&ws)
            .stderr(Stdio::inherit());
        common::in_outer_mount_ns(&mut cmd);
        let transport = TokioChildProcess::new(tokio::process::Command::from(cmd)).unwrap();
        Server {
            pid: transport.id(),
            client: ().serve(transport).await.expect("initialize"),
        }
    }
}

struct Server {
    client: RunningService<RoleClient, ()>,
    /// The process the test started (under `zcode-acp run`, that one).
    pid: Option<u32>,
}

impl Server {
    async fn call(&self, tool: &'static str, args: Value) -> CallToolResult {
        let Value::Object(args) = args else {
            panic!("arguments must be an object")
        };
        self.client
            .call_tool(CallToolRequestParams::new(tool).with_arguments(args))
            .await
            .expect("tools/call")
    }

    /// Runs code; returns the structured result and the text the model reads.
    async fn run(&self, args: Value) -> (Value, String) {
        let r = self.call("run_code", args).await;
        let text = r
            .content
            .iter()
            .find_map(|c| c.as_text().map(|t| t.text.clone()))
            .unwrap_or_default();
        (
            r.structured_content.clone().expect("a structured result"),
            text,
        )
    }
}

/// The most memory process `pid` has held resident (VmHWM), in bytes.
fn peak_resident(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmHWM in /proc/PID/status");
    kb * 1024
}

/// A line of a run's stderr that zcode-acp wrote, not the code: its
/// sandbox helper's messages and its log lines (a timestamp, then the
/// level).
fn zcode_noise(stderr: &str) -> Option<&str> {
    let logged = regex::Regex::new(r"^\d{4}-\d\d-\d\dT\S+\s+(ERROR|WARN|INFO)\b").unwrap();
    stderr
        .lines()
        .find(|l| l.contains("zcode-acp") || l.contains("network proxy") || logged.is_match(l))
}

/// Processes on this machine whose command line holds `marker`.
fn processes_with(marker: &str) -> Vec<String> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        let state = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        let zombie = state
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'));
        if cmdline.contains(marker) && !zombie {
            found.push(format!("{name}: {cmdline}"));
        }
    }
    found
}

#[tokio::test]
async fn every_language_runs_where_its_interpreter_exists_and_says_which() {
    if !require_kernel_features() {
        return;
    }
    let world = World::new(json!({}));
    let server = world.server(&[]).await;
    let langs = server.call("which_languages", json!({})).await;
    let langs = langs.structured_content.unwrap();
    assert_eq!(
        langs["confinement"], "linux: namespaces+landlock",
        "{langs}"
    );
    let programs = [
        (
            "python",
            "import sys\nprint('hello from', 'python', sys.version_info[0])",
        ),
        ("node", "console.log('hello from', 'node', typeof require)"),
        (
            "typescript",
            "const who: string = 'typescript';\nconsole.log('hello from', who)",
        ),
        ("bash", "declare -a a=(hello from bash); echo \"${a[@]}\""),
        ("sh", "echo hello from sh"),
    ];
    for (language, source) in programs {
        if language == "typescript" && !typescript_here() {
            continue;
        }
        let entry = langs["languages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["language"] == language)
            .unwrap_or_else(|| panic!("{language} is not listed: {langs}"));
        // CI installs every interpreter (tsx for typescript): here each must run.
        assert_eq!(entry["available"], true, "{language}: {entry}");
        let (r, text) = server
            .run(json!({"language": language, "source": source}))
            .await;
        assert_eq!(r["ok"], true, "{language}: {r}");
        assert_eq!(r["exitCode"], 0);
        assert!(
            r["stdout"]
                .as_str()
                .unwrap()
                .starts_with(&format!("hello from {language}")),
            "{language}: {r}"
        );
        assert_eq!(r["interpreter"], entry["interpreter"]);
        assert_eq!(r["confinement"], "linux: namespaces+landlock");
        assert!(
            text.contains("confinement: linux: namespaces+landlock"),
            "{text}"
        );
    }
    // An ES module and a CommonJS one both run as node.
    let (r, _) = server
        .run(json!({"language": "node", "source": "import os from 'node:os';\nconsole.log(typeof os.cpus)"}))
        .await;
    assert_eq!(r["stdout"], "function\n", "{r}");
}

#[tokio::test]
async fn a_run_writes_in_the_workspace_and_its_own_directory_and_nowhere_else() {
    if !require_kernel_features() {
        return;
    }
    let world = World::new(json!({}));
    let server = world.server(&[]).await;
    let outside = world.outside();
    let home = world.path();
    let source = format!(
        r#"
import os
open("made-by-run.txt", "w").write("inside")
for target in ["{o}/py.txt", "{h}/.bashrc-planted"]:
    try:
        open(target, "w").write("escaped")
        print("WROTE", target)
    except OSError as e:
        print("refused", e.errno)
"#,
        o = outside.display(),
        h = home.display()
    );
    let (r, _) = server
        .run(json!({"language": "python", "source": source}))
        .await;
    assert_eq!(r["ok"], true, "{r}");
    assert!(!r["stdout"].as_str().unwrap().contains("WROTE"), "{r}");
    assert_eq!(
        std::fs::read_to_string(world.workspace().join("made-by-run.txt")).unwrap(),
        "inside"
    );
    assert!(!outside.join("py.txt").exists(), "python wrote outside");
    assert!(
        !home.join(".bashrc-planted").exists(),
        "python wrote in the home"
    );
    let (r, _) = server
        .run(json!({"language": "bash", "source": format!("echo x > {}/sh.txt; touch {}/t2; echo done", outside.display(), outside.display())}))
        .await;
    assert_eq!(r["stdout"], "done\n", "{r}");
    assert!(!outside.join("sh.txt").exists() && !outside.join("t2").exists());
}

#[tokio::test]
async fn staged_files_go_in_outputs_come_back_bounded_and_the_call_directory_goes() {
    if !require_kernel_features() {
        return;
    }
    let world =
        World::new(json!({"runCode": {"maxOutputFileBytes": 4096, "maxOutputsTotalBytes": 6000}}));
    let server = world.server(&[]).await;
    let source = r#"
import json, os
m = json.load(open(os.environ["ZCODE_RUN_MANIFEST"]))
rows = open(m["inputs"][0]["absolutePath"]).read().split()
print(os.environ["ZCODE_RUN_DIR"])
print(len(rows), open(os.path.join(os.environ["ZCODE_RUN_INPUTS"], "data/b.txt")).read())
out = os.environ["ZCODE_RUN_OUTPUTS"]
open(os.path.join(out, "sum.txt"), "w").write(str(sum(map(int, rows))))
open(os.path.join(out, "pixel.png"), "wb").write(b"\x89PNG\r\n\x1a\n\x00\x00")
open(os.path.join(out, "huge.log"), "w").write("x" * 5000)
os.makedirs(os.path.join(out, "sub"))
open(os.path.join(out, "sub", "late.txt"), "w").write("y" * 3000)
os.symlink("/etc/hostname", os.path.join(out, "link"))
"#;
    let (r, text) = server
        .run(json!({"language": "python", "source": source, "files": [
            {"path": "data/a.txt", "content": "1 2 3 4"},
            {"path": "data/b.txt", "content": "bee"}
        ]}))
        .await;
    assert_eq!(r["ok"], true, "{r}");
    let stdout = r["stdout"].as_str().unwrap();
    let mut lines = stdout.lines();
    let call_dir = PathBuf::from(lines.next().unwrap());
    assert_eq!(lines.next(), Some("4 bee"), "{r}");
    assert!(
        !call_dir.exists(),
        "the call directory {} is still there",
        call_dir.display()
    );
    let outputs = r["outputs"].as_array().unwrap();
    let by = |p: &str| {
        outputs
            .iter()
            .find(|o| o["path"] == p)
            .unwrap_or_else(|| panic!("{p} not listed: {r}"))
    };
    assert_eq!(by("sum.txt")["text"], "10");
    assert_eq!(by("pixel.png")["returned"], true);
    assert_eq!(by("pixel.png")["mimeType"], "image/png");
    assert_eq!(by("huge.log")["returned"], false);
    assert_eq!(by("huge.log")["bytes"], 5000);
    assert!(by("huge.log")["skipped"].as_str().unwrap().contains("4096"));
    // 2 + 10 bytes returned before it: 3000 more would pass 6000? No: the
    // total cap is reached only with both; "sub/late.txt" fits (12 + 3000).
    assert_eq!(by("sub/late.txt")["returned"], true);
    assert_eq!(by("link")["returned"], false);
    assert!(
        text.contains("huge.log (5000 bytes): NOT RETURNED"),
        "{text}"
    );
    // The binary file is MCP resource content with its MIME type.
    let res = server
        .call("run_code", json!({"language": "python", "source": "import os\nopen(os.environ['ZCODE_RUN_OUTPUTS']+'/p.png','wb').write(bytes([137,80,78,71,0,1]))"}))
        .await;
    let blob = res
        .content
        .iter()
        .find_map(|c| c.as_resource())
        .expect("a resource");
    let blob = serde_json::to_value(&blob.resource).unwrap();
    assert_eq!(blob["mimeType"], "image/png", "{blob}");
    assert_eq!(blob["blob"], "iVBORwAB", "{blob}");
    // No output files: said, not pretended.
    let (r, text) = server
        .run(json!({"language": "sh", "source": "true"}))
        .await;
    assert_eq!(r["outputs"], json!([]));
    assert!(text.contains("outputs: none"), "{text}");
}

#[tokio::test]
async fn the_clock_ends_the_whole_tree_grandchildren_and_setsid_children_too() {
    if !require_kernel_features() {
        return;
    }
    let world = World::new(json!({}));
    let server = world.server(&[]).await;
    let marker = format!(
        "{}.{}",
        4000 + std::process::id() % 1000,
        std::process::id()
    );
    let source = format!(
        "sleep {marker}1 &\nsetsid sleep {marker}2 &\n(sleep {marker}3 &)\nsh -c 'sleep {marker}4' &\nsleep 0.3\necho started\nsleep {marker}5\n"
    );
    let (r, text) = server
        .run(json!({"language": "bash", "source": source, "timeoutMs": 1500}))
        .await;
    assert_eq!(r["timedOut"], true, "{r}");
    assert_eq!(r["error"]["code"], "timeout");
    assert_eq!(r["exitCode"], Value::Null);
    assert_eq!(r["stdout"], "started\n");
    assert_eq!(r["stderr"], "", "only what the code wrote: {r}");
    assert!(text.contains("error: timeout"), "{text}");
    common::wait_until("every process of the run to be gone", || {
        processes_with(&marker).is_empty()
    });
    // What a run leaves behind when it ends on its own goes too.
    let (r, _) = server
        .run(json!({"language": "bash", "source": format!("setsid sleep {marker}6 &\n(sleep {marker}7 &)\necho bye")}))
        .await;
    assert_eq!(r["ok"], true, "{r}");
    common::wait_until("the run's leftovers to be gone", || {
        processes_with(&marker).is_empty()
    });
}

#[tokio::test]
async fn the_memory_ceiling_stops_python_a_node_array_and_node_buffers() {
    if !require_kernel_features() {
        return;
    }
    // 256 MiB; each runaway stops by 4 GiB at the latest.
    let world = World::new(json!({"runCode": {"memoryMb": 256}}));
    let server = world.server(&[]).await;
    for (language, source) in [
        ("python", "a = []\nfor i in range(256):\n    a.append(bytearray(16 << 20))\nprint('survived')"),
        ("node", "const a = [];\nfor (let i = 0; i < 4096; i++) a.push(new Array(131072).fill(i + 0.5));\nconsole.log('survived')"),
        ("node", "const a = [];\nfor (let i = 0; i < 256; i++) a.push(Buffer.alloc(16 << 20, 1));\nconsole.log('survived')"),
        ("typescript", "const a: Buffer[] = [];\nfor (let i = 0; i < 256; i++) a.push(Buffer.alloc(16 << 20, 1));\nconsole.log('survived')"),
    ] {
        if language == "typescript" && !typescript_here() {
            continue;
        }
        let (r, text) = server.run(json!({"language": language, "source": source})).await;
        assert_eq!(r["ok"], false, "{language}: {r}");
        assert_eq!(r["error"]["code"], "memory", "{language}: {r}");
        let stderr = r["stderr"].as_str().unwrap();
        assert_eq!(zcode_noise(stderr), None, "{language}: {stderr}");
        assert!(!r["stdout"].as_str().unwrap().contains("survived"), "{r}");
        assert!(text.contains("error: memory"), "{text}");
    }
    // A modest program runs under the same ceiling.
    let (r, _) = server
        .run(json!({"language": "node", "source": "console.log(Buffer.alloc(32 << 20).length)"}))
        .await;
    assert_eq!(r["ok"], true, "{r}");
}

#[tokio::test]
async fn cut_output_is_flagged_and_visible() {
    if !require_kernel_features() {
        return;
    }
    let world = World::new(json!({"runCode": {"maxOutputBytes": 1000}}));
    let server = world.server(&[]).await;
    let (r, text) = server
        .run(json!({"language": "python", "source": "import sys\nprint('a' * 100000)\nsys.stderr.write('e' * 10)"}))
        .await;
    assert_eq!(r["truncated"], true, "{r}");
    let stdout = r["stdout"].as_str().unwrap();
    assert!(
        stdout.contains("stdout truncated: the first 1000 of 100001 bytes"),
        "{stdout}"
    );
    assert!(text.contains("stdout truncated"), "{text}");
    assert_eq!(r["stderr"], "eeeeeeeeee");
    let (r, _) = server
        .run(json!({"language": "sh", "source": "echo short"}))
        .await;
    assert_eq!(r["truncated"], false);
}

#[tokio::test]
async fn the_code_gets_an_allowlisted_environment_and_stdin_only_when_given() {
    if !require_kernel_features() {
        return;
    }
    let world = World::new(json!({"runCode": {"env": ["ZCODE_TEST_ALLOWED"]}}));
    let server = world.server(&[]).await;
    let (r, _) = server
        .run(json!({"language": "python", "source": "import os, sys\nprint(os.environ.get('ZCODE_TEST_SECRET'), os.environ.get('ZCODE_TEST_ALLOWED'), os.environ.get('HOME'), os.environ.get('LANG'))\nprint(repr(sys.stdin.read()))"}))
        .await;
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(
        r["stdout"], "None shared-on-purpose None C.UTF-8\n''\n",
        "{r}"
    );
    let (r, _) = server
        .run(json!({"language": "sh", "source": "env; cat", "stdin": "from stdin"}))
        .await;
    let out = r["stdout"].as_str().unwrap();
    assert!(!out.contains("hunter2"), "{out}");
    assert!(out.ends_with("from stdin"), "{out}");
}

#[tokio::test]
async fn egress_verbs_disabled_languages_and_bad_calls_are_refused_before_running() {
    if !require_kernel_features() {
        return;
    }
    let world = World::new(json!({"runCode": {"disable": ["node"]}}));
    let server = world.server(&[]).await;
    let ws = world.workspace();
    for source in [
        "touch ran-1; git push origin main",
        "touch ran-2 && /usr/bin/git remote add x y",
        "touch ran-3; env GIT_TRACE=1 command gh pr create",
        "(touch ran-4; npm publish)",
        "touch ran-5; bash <<< 'git push origin main'",
        "touch ran-6; echo 'git push' | sh",
        "touch ran-7; coproc git push",
        "touch ran-8; npm publ",
    ] {
        let (r, text) = server
            .run(json!({"language": "bash", "source": source}))
            .await;
        assert_eq!(r["error"]["code"], "egress_denied", "{source}: {r}");
        assert_eq!(r["ok"], false);
        assert!(text.contains("egress_denied"), "{text}");
    }
    for i in 1..=8 {
        assert!(!ws.join(format!("ran-{i}")).exists(), "a refused run ran");
    }
    let (r, _) = server.run(json!({"language": "node", "source": "1"})).await;
    assert_eq!(r["error"]["code"], "language_disabled", "{r}");
    let (r, _) = server.run(json!({"language": "ruby", "source": "1"})).await;
    assert_eq!(r["error"]["code"], "bad_request", "{r}");
    let (r, _) = server
        .run(json!({"language": "sh", "source": "true", "files": [{"path": "../../x", "content": ""}]}))
        .await;
    assert_eq!(r["error"]["code"], "bad_request", "{r}");
}

#[tokio::test]
async fn where_nothing_can_be_armed_runs_are_refused_unless_the_user_accepts_unconfined() {
    if !require_kernel_features() {
        return;
    }
    let nothing = [
        ("ZCODE_ACP_TEST_NO_LANDLOCK", "1"),
        ("ZCODE_ACP_TEST_NO_NAMESPACES", "1"),
    ];
    let world = World::new(json!({}));
    let server = world.server(&nothing).await;
    let (r, _) = server
        .run(json!({"language": "sh", "source": "touch ran"}))
        .await;
    assert_eq!(r["error"]["code"], "no_confinement", "{r}");
    assert_eq!(r["confinement"], "none");
    assert!(!world.workspace().join("ran").exists());

    let world = World::new(json!({"runCode": {"allowUnconfined": true}}));
    let server = world.server(&nothing).await;
    let (r, text) = server
        .run(json!({"language": "sh", "source": "echo ran"}))
        .await;
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(r["confinement"], "none");
    assert!(
        r["warning"].as_str().unwrap().starts_with("UNCONFINED"),
        "{r}"
    );
    assert!(text.starts_with("UNCONFINED"), "{text}");
}

#[tokio::test]
async fn inside_an_armed_sandbox_a_run_keeps_it_adds_its_own_layer_and_says_so() {
    if !require_kernel_features() {
        return;
    }
    let world = World::new(json!({}));
    let ws = world.workspace();
    // The server itself under `zcode-acp run`, as inside an armed agent.
    let server = world.server_in_a_sandbox(&[]).await;
    let outside = world.outside();
    let marker = format!(
        "{}.{}",
        5000 + std::process::id() % 1000,
        std::process::id()
    );
    let (r, text) = server
        .run(json!({"language": "bash", "source": format!(
            "touch {o}/nested; echo in > inner.txt; setsid sleep {marker} & echo ok", o = outside.display())}))
        .await;
    assert_eq!(
        r["confinement"], "inherited: linux namespaces+landlock",
        "{r}"
    );
    assert!(
        text.contains("confinement: inherited: linux namespaces+landlock"),
        "{text}"
    );
    assert_eq!(r["ok"], true, "{r}");
    assert!(
        !outside.join("nested").exists(),
        "a nested run wrote outside"
    );
    assert_eq!(
        std::fs::read_to_string(ws.join("inner.txt")).unwrap(),
        "in\n"
    );
    common::wait_until("the nested run's setsid child to be gone", || {
        processes_with(&marker).is_empty()
    });
    let (r, _) = server
        .run(json!({"language": "bash", "source": format!("setsid sleep {marker}9 & sleep 100"), "timeoutMs": 800}))
        .await;
    assert_eq!(r["error"]["code"], "timeout", "{r}");
    common::wait_until("the nested run's tree to be gone after its timeout", || {
        processes_with(&marker).is_empty()
    });
    // A call the client cancels mid-run takes its whole tree along (the
    // server, and the sandbox it runs in, stay).
    let Value::Object(args) = json!({"language": "bash", "source": format!(
        "setsid sleep {marker}7 & (sleep {marker}8 &); sleep {marker}6"), "timeoutMs": 600000})
    else {
        unreachable!()
    };
    let request = rmcp::model::ClientRequest::CallToolRequest(rmcp::model::Request::new(
        CallToolRequestParams::new("run_code").with_arguments(args),
    ));
    let handle = server
        .client
        .peer()
        .send_cancellable_request(request, rmcp::service::PeerRequestOptions::no_options())
        .await
        .unwrap();
    wait_async("the cancelled run to start", || {
        processes_with(&marker).len() >= 3
    })
    .await;
    handle
        .cancel(Some("the test cancels it".into()))
        .await
        .unwrap();
    wait_async("the cancelled run's tree to be gone", || {
        processes_with(&marker).is_empty()
    })
    .await;
    // The server still runs calls.
    let (r, _) = server
        .run(json!({"language": "sh", "source": "echo still"}))
        .await;
    assert_eq!(r["stdout"], "still\n", "{r}");
}

/// Waits (without blocking the runtime) until `f` holds.
async fn wait_async(what: &str, f: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + common::TIMEOUT;
    while !f() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting until {what}: {:?}",
            ()
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn memory_kept_in_memfds_and_temp_files_counts_toward_the_ceiling() {
    if !require_kernel_features() {
        return;
    }
    let world = World::new(json!({"runCode": {"memoryMb": 256}}));
    let server = world.server(&[]).await;
    for source in [
        "import os\nfd = os.memfd_create('x')\nfor i in range(256):\n    os.write(fd, b'm' * (16 << 20))\nprint('survived')",
        "for i in range(256):\n    open('/tmp/big-%d' % i, 'wb').write(b't' * (16 << 20))\nprint('survived')",
    ] {
        let (r, _) = server.run(json!({"language": "python", "source": source})).await;
        assert_eq!(r["error"]["code"], "memory", "{r}");
        assert!(!r["stdout"].as_str().unwrap().contains("survived"), "{r}");
    }
}

#[tokio::test]
async fn an_output_directory_swapped_for_a_symlink_is_not_followed() {
    if !require_kernel_features() {
        return;
    }
    let world = World::new(json!({}));
    let outside = world.outside();
    std::fs::write(outside.join("private.txt"), "not for the model").unwrap();
    let server = world.server(&[]).await;
    for target in ["/proc/self".to_owned(), outside.display().to_string()] {
        let (r, text) = server
            .run(json!({"language": "bash", "source": format!(
                "rm -r \"$ZCODE_RUN_OUTPUTS\"; ln -s {target} \"$ZCODE_RUN_OUTPUTS\"")}))
            .await;
        let listed = r["outputs"].to_string();
        assert!(!listed.contains("not for the model"), "{r}");
        assert!(
            !listed.contains("hunter2") && !text.contains("hunter2"),
            "{r}"
        );
        assert_eq!(r["outputs"].as_array().unwrap().len(), 1, "{r}");
        assert_eq!(r["outputs"][0]["returned"], false, "{r}");
    }
    // Symlinks inside it are listed, never followed.
    let (r, _) = server
        .run(json!({"language": "bash", "source": format!(
            "ln -s {}/private.txt \"$ZCODE_RUN_OUTPUTS/link\"; mkfifo \"$ZCODE_RUN_OUTPUTS/fifo\"", outside.display())}))
        .await;
    assert!(
        !r["outputs"].to_string().contains("not for the model"),
        "{r}"
    );
    assert_eq!(r["outputs"].as_array().unwrap().len(), 2, "{r}");
}

#[tokio::test]
async fn interpreter_probes_run_confined_like_runs() {
    if !require_kernel_features() {
        return;
    }
    // A PATH with a directory a run can write (an activated virtualenv in
    // the workspace): a run plants "python3" there for the next server.
    let world = World::new(json!({}));
    let venv = world.workspace().join(".venv/bin");
    std::fs::create_dir_all(&venv).unwrap();
    let real = which_python();
    let path = format!("{}:/usr/local/bin:/usr/bin:/bin", venv.display());
    let planted = world.outside().join("PLANTED");
    let planted_git = world.outside().join("PLANTED-GIT");
    // A repository whose config makes zcode-acp ask git (core.hooksPath).
    let git_init = std::process::Command::new("git")
        .args(["init", "-q"])
        .arg(world.workspace())
        .status()
        .unwrap();
    assert!(git_init.success());
    std::fs::write(
        world.workspace().join(".git/config"),
        "[core]\n\thooksPath = .githooks\n",
    )
    .unwrap();
    {
        let server = world.server(&[("PATH", &path)]).await;
        let plant = |name: &str, marker: &std::path::Path, real: &str| {
            format!(
                "printf '#!/bin/sh\\necho escaped > {m}\\nexec {real} \"$@\"\\n' > .venv/bin/{name}; chmod +x .venv/bin/{name}\n",
                m = marker.display()
            )
        };
        let source =
            plant("python3", &planted, &real) + &plant("git", &planted_git, "/usr/bin/git");
        let (r, _) = server
            .run(json!({"language": "sh", "source": source}))
            .await;
        assert_eq!(r["ok"], true, "{r}");
        assert!(
            venv.join("git").exists() && venv.join("python3").exists(),
            "{r}"
        );
    }
    let server = world.server(&[("PATH", &path)]).await;
    let langs = server.call("which_languages", json!({})).await;
    let langs = langs.structured_content.unwrap();
    let python = &langs["languages"][0];
    assert_eq!(python["language"], "python");
    assert_eq!(
        python["interpreter"][0],
        venv.join("python3").display().to_string(),
        "{langs}"
    );
    assert!(
        !planted.exists(),
        "the interpreter probe ran a planted binary unconfined"
    );
    let (r, _) = server
        .run(json!({"language": "sh", "source": "true"}))
        .await;
    assert_eq!(r["ok"], true, "{r}");
    assert!(
        !planted_git.exists(),
        "zcode-acp ran a planted git unconfined"
    );
}

fn which_python() -> String {
    let out = std::process::Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

#[tokio::test]
async fn a_huge_output_directory_is_listed_up_to_its_bound() {
    if !require_kernel_features() {
        return;
    }
    let world = World::new(json!({}));
    let server = world.server(&[]).await;
    let (r, text) = server
        .run(json!({"language": "python", "source": "import os\nout = os.environ['ZCODE_RUN_OUTPUTS']\nfor i in range(1500):\n    os.mkdir(os.path.join(out, 'd%04d' % i))\nfor i in range(1500):\n    open(os.path.join(out, 'f%04d' % i), 'w').close()"}))
        .await;
    assert_eq!(r["ok"], true, "{r}");
    let outputs = r["outputs"].as_array().unwrap();
    assert!(outputs.len() <= 1001, "{} entries listed", outputs.len());
    assert!(
        outputs.iter().any(|o| o["skipped"]
            .as_str()
            .is_some_and(|s| s.contains("more entries than"))),
        "the cut is not said: {text}"
    );
}

#[tokio::test]
async fn the_run_directories_of_a_server_that_is_gone_are_swept() {
    if !require_kernel_features() {
        return;
    }
    // A server killed mid-run could not remove its call directory.
    let mut gone = std::process::Command::new("true").spawn().unwrap();
    let dead = gone.id();
    gone.wait().unwrap();
    // The server's environment is cleared: its temp directory is /tmp.
    let tmp = std::path::Path::new("/tmp");
    let stale = tmp.join(format!("zcode-run-{dead}-testsweep"));
    let live = tmp.join(format!("zcode-run-{}-testsweep", std::process::id()));
    for d in [&stale, &live] {
        std::fs::create_dir_all(d.join("out/deep")).unwrap();
        std::fs::write(d.join("out/deep/big"), "x").unwrap();
    }
    let world = World::new(json!({}));
    let _server = world.server(&[]).await;
    assert!(!stale.exists(), "a dead server's run directory was left");
    assert!(live.exists(), "a live process's run directory was removed");
    std::fs::remove_dir_all(&live).unwrap();
}

/// The test's own MCP server (two tools), given to `zcode-acp mcp` in a
/// servers file as the bridge writes one; it counts the calls it served.
struct ToolWorld {
    world: World,
    count: PathBuf,
    servers: PathBuf,
}

impl ToolWorld {
    fn new(config: Value) -> ToolWorld {
        use std::os::unix::fs::PermissionsExt;
        let world = World::new(config);
        // In the workspace: an MCP server started inside a sandbox can
        // write nothing else.
        let count = world.workspace().join("served");
        let servers = world.path().join("servers.json");
        // Beside the servers file, not in the checkout: a checkout under
        // /tmp cannot be read from a sandbox, whose /tmp is its own.
        let fixture = world.path().join("mcp_tools.py");
        std::fs::copy(
            concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/mcp_tools.py"),
            &fixture,
        )
        .unwrap();
        let defs = json!([{"name": "fs", "command": "python3", "args": [fixture],
            "env": [{"name": "MCP_TOOLS_COUNT", "value": count}]}]);
        std::fs::write(&servers, defs.to_string()).unwrap();
        std::fs::set_permissions(&servers, std::fs::Permissions::from_mode(0o600)).unwrap();
        for name in ["a.txt", "b.txt", "c.md"] {
            std::fs::write(world.workspace().join(name), name).unwrap();
        }
        ToolWorld {
            world,
            count,
            servers,
        }
    }

    async fn server(&self) -> Server {
        self.world
            .server_with(&[], &["--servers", self.servers.to_str().unwrap()])
            .await
    }

    async fn server_in_a_sandbox(&self) -> Server {
        self.world
            .server_in_a_sandbox(&["--servers", self.servers.to_str().unwrap()])
            .await
    }

    /// Tool calls the MCP server served.
    fn served(&self) -> usize {
        std::fs::read(&self.count).map_or(0, |c| c.len())
    }
}

/// The run's own directory and socket, as the script saw them, are gone.
fn run_paths_are_gone(r: &Value) {
    let out = r["stdout"].as_str().unwrap();
    let mut seen = 0;
    for line in out.lines() {
        if let Some(p) = line.strip_prefix("path=") {
            seen += 1;
            assert!(!std::path::Path::new(p).exists(), "{p} is still there");
        }
    }
    assert_eq!(
        seen, 3,
        "the script said where its socket, stub and directory were: {out}"
    );
}

#[tokio::test]
async fn python_and_typescript_call_two_mcp_tools_a_hundred_times_and_return_a_result() {
    if !require_kernel_features() {
        return;
    }
    let tw = ToolWorld::new(json!({}));
    let server = tw.server().await;
    let ws = tw.world.workspace();
    let listed = server.call("which_tools", json!({})).await;
    let listed = listed.structured_content.unwrap();
    let names: Vec<&str> = listed["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["fs.list_files", "fs.echo"], "{listed}");
    let python = r#"
import os, zcode_tools
from zcode_tools import fs
seen = set()
for i in range(50):
    listing = fs.list_files({"dir": os.environ["ZCODE_RUN_WORKSPACE"]})
    seen.update(n for n in listing["files"] if n.endswith(".txt"))
    assert fs.echo(text="x", times=i) == "x" * i
zcode_tools.log("info", "looped")
zcode_tools.result({"txt": sorted(seen), "language": "python"})
print("path=" + os.environ["ZCODE_TOOLS_SOCKET"])
print("path=" + os.path.abspath(zcode_tools.__file__))
print("path=" + os.environ["ZCODE_RUN_DIR"])
"#;
    let typescript = r#"
import { fs, log, result } from "zcode-tools";
import { createRequire } from "node:module";
const seen = new Set<string>();
for (let i = 0; i < 50; i++) {
  const listing = (await fs.list_files({ dir: process.env.ZCODE_RUN_WORKSPACE! })) as { files: string[] };
  listing.files.filter((n) => n.endsWith(".txt")).forEach((n) => seen.add(n));
  const echoed = await fs.echo({ text: "x", times: i });
  if (echoed !== "x".repeat(i)) throw new Error(`echo ${i}: ${echoed}`);
}
await log("info", "looped");
await result({ txt: [...seen].sort(), language: "typescript" });
console.log("path=" + process.env.ZCODE_TOOLS_SOCKET);
console.log("path=" + createRequire(import.meta.url).resolve("zcode-tools").replace(/index\.cjs$/, ""));
console.log("path=" + process.env.ZCODE_RUN_DIR);
"#;
    for (language, source) in [("python", python), ("typescript", typescript)] {
        if language == "typescript" && !typescript_here() {
            continue;
        }
        let before = tw.served();
        let (r, text) = server
            .run(json!({"language": language, "source": source, "tools": ["fs.list_files", "fs.echo"]}))
            .await;
        assert_eq!(r["ok"], true, "{language}: {r}");
        assert_eq!(r["toolCalls"], 100, "{language}: {r}");
        assert_eq!(
            tw.served() - before,
            100,
            "{language}: every call reached the server"
        );
        assert_eq!(
            r["result"],
            json!({"txt": ["a.txt", "b.txt"], "language": language}),
            "{language}: {r}"
        );
        assert_eq!(r["logs"][0]["level"], "info");
        assert_eq!(r["logs"][0]["message"], "looped");
        assert!(text.contains("tool calls: 100"), "{text}");
        run_paths_are_gone(&r);
    }
    assert!(ws.join("a.txt").exists());
}

#[tokio::test]
async fn tools_off_the_list_and_past_the_ceilings_are_refused_and_the_script_can_catch_it() {
    if !require_kernel_features() {
        return;
    }
    let tw = ToolWorld::new(json!({"runCode": {"maxToolCalls": 6, "maxToolBytes": 1024}}));
    let server = tw.server().await;
    let source = r#"
import zcode_tools
from zcode_tools import fs, ToolError
def attempt(name, f):
    try:
        f()
        print(name, "=ok")
    except ToolError as e:
        print(name, "=" + e.code)
attempt("unlisted", lambda: zcode_tools.call("fs.list_files", {"dir": "/"}))
print("stub-has-list_files", hasattr(fs, "list_files"))
attempt("big-args", lambda: fs.echo(text="y" * 2000))
attempt("huge-line", lambda: fs.echo(text="y" * 9000))
attempt("kw-name", lambda: fs.echo(text="k", name="a parameter called name"))
attempt("big-answer", lambda: fs.echo(text="y" * 100, times=20))
attempt("big-result", lambda: zcode_tools.result("z" * 2000))
for i in range(5):
    attempt(f"call{i}", lambda: fs.echo(text="k"))
zcode_tools.result("still here")
"#;
    let (r, _) = server
        .run(json!({"language": "python", "source": source, "tools": ["fs.echo"]}))
        .await;
    assert_eq!(r["ok"], true, "{r}");
    let out = r["stdout"].as_str().unwrap();
    for expected in [
        "unlisted =not_allowed",
        "stub-has-list_files False",
        "big-args =too_large",
        "huge-line =too_large",
        "kw-name =ok",
        "big-answer =too_large",
        "big-result =too_large",
        "call0 =ok",
        "call1 =ok",
        "call2 =ok",
        "call3 =ok",
        "call4 =call_limit",
    ] {
        assert!(out.contains(expected), "{expected}: {out}");
    }
    // Refused calls never reached the server; the answer too large did
    // (and was refused on its way back), then five more: six in all.
    assert_eq!(tw.served(), 6, "{out}");
    assert_eq!(r["toolCalls"], 6, "{r}");
    assert_eq!(r["result"], "still here");
    let logs = r["logs"].to_string();
    for code in ["not_allowed", "too_large", "call_limit"] {
        assert!(logs.contains(code), "{code}: {logs}");
    }
    // A tool the session does not have: refused before anything runs.
    let (r, text) = server
        .run(json!({"language": "python", "source": "print(1)", "tools": ["fs.rm"]}))
        .await;
    assert_eq!(r["error"]["code"], "unknown_tool", "{r}");
    assert!(text.contains("fs.list_files, fs.echo"), "{text}");
    assert!(r["interpreter"].as_array().unwrap().is_empty());
    let (r, _) = server
        .run(json!({"language": "python", "source": "print(1)", "tools": ["web.search"]}))
        .await;
    assert_eq!(r["error"]["code"], "unknown_tool", "{r}");
}

#[tokio::test]
async fn calls_past_the_concurrency_limit_or_the_clock_are_refused_catchably() {
    if !require_kernel_features() {
        return;
    }
    if !typescript_here() {
        return;
    }
    let tw =
        ToolWorld::new(json!({"runCode": {"concurrentToolCalls": 2, "toolCallTimeoutMs": 1500}}));
    let server = tw.server().await;
    let source = r#"
import { fs, ToolError } from "zcode-tools";
// Four at once, each taking a while: two are taken, two refused.
const settled = await Promise.allSettled([0, 1, 2, 3].map(() => fs.echo({ text: "s", sleepMs: 300 })));
const codes = settled.map((s) => (s.status === "fulfilled" ? "ok" : (s.reason as ToolError).code)).sort();
console.log("concurrent=" + codes.join(","));
try {
  await fs.echo({ text: "slow", sleepMs: 5000 });
  console.log("slow=ok");
} catch (e) {
  console.log("slow=" + (e as ToolError).code);
}
"#;
    let (r, _) = server
        .run(json!({"language": "typescript", "source": source, "tools": ["fs.echo"]}))
        .await;
    assert_eq!(r["ok"], true, "{r}");
    let out = r["stdout"].as_str().unwrap();
    assert!(
        out.contains("concurrent=ok,ok,too_many_at_once,too_many_at_once"),
        "{out}"
    );
    assert!(out.contains("slow=timeout"), "{out}");
    let logs = r["logs"].to_string();
    assert!(
        logs.contains("too_many_at_once") && logs.contains("timeout"),
        "{logs}"
    );
}

#[tokio::test]
async fn another_run_that_finds_a_runs_socket_cannot_call_set_its_result_or_log() {
    if !require_kernel_features() {
        return;
    }
    // Inside an armed agent every run shares the agent's /tmp, where the
    // runs' sockets are.
    let tw = ToolWorld::new(json!({}));
    let server = tw.server_in_a_sandbox().await;
    let victim = r#"
import os, time, zcode_tools
zcode_tools.fs.echo(text="a")
zcode_tools.result("A's own")
zcode_tools.log("info", "A's own log")
open("a-ready", "w").close()
while not os.path.exists("b-done"):
    time.sleep(0.02)
print("A done")
"#;
    let intruder = r#"
import glob, json, os, re, socket, time
while not os.path.exists("a-ready"):
    time.sleep(0.02)
mine = os.environ["ZCODE_TOOLS_SOCKET"]
own = os.environ["ZCODE_TOOLS_TOKEN"]
tokens = [own, "", None, "0" * len(own)]
# Any other run's token this run can read where processes keep theirs.
for env in glob.glob("/proc/[0-9]*/environ"):
    try:
        seen = open(env, "rb").read()
    except OSError:
        continue
    for t in re.findall(rb"ZCODE_TOOLS_TOKEN=([0-9a-f]+)", seen):
        if t.decode() != own:
            print("read a token in", env)
            tokens.append(t.decode())
def ask(path, line):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    s.sendall(line + b"\n")
    answer = s.makefile("rb").readline()
    s.close()
    m = json.loads(answer) if answer else {}
    return ((m.get("error") or {}).get("data") or {}).get("code", "ANSWERED")
found = 0
for path in glob.glob(os.path.join(os.path.dirname(os.path.dirname(mine)), "zcode-run-*", "tools.sock")):
    if path == mine:
        continue
    found += 1
    for token in tokens:
        for method, params in [
            ("call", {"tool": "fs.echo", "args": {"text": "b"}}),
            ("result", {"value": "forged"}),
            ("log", {"level": "info", "message": "forged log"}),
        ]:
            req = {"id": 1, "jsonrpc": "2.0", "method": method, "params": params}
            if token is not None:
                req["token"] = token
            print(method, "=", ask(path, json.dumps(req).encode()))
    print("junk =", ask(path, b"not json"))
    big = {"id": 2, "jsonrpc": "2.0", "method": "log", "params": {"level": "info", "message": "x" * (2 << 20)}}
    print("big =", ask(path, json.dumps(big).encode()))
print("found", found)
open("b-done", "w").close()
"#;
    let (a, b) = tokio::join!(
        server.run(json!({"language": "python", "source": victim, "tools": ["fs.echo"], "timeoutMs": 60000})),
        server.run(json!({"language": "python", "source": intruder, "tools": ["fs.echo"], "timeoutMs": 60000})),
    );
    let (a, b) = (a.0, b.0);
    assert_eq!(a["ok"], true, "{a}");
    assert_eq!(b["ok"], true, "{b}");
    let out = b["stdout"].as_str().unwrap();
    assert!(
        out.contains("found 1"),
        "the other run's socket was not found: {out}"
    );
    assert!(!out.contains("read a token"), "{out}");
    let attempts: Vec<&str> = out.lines().filter(|l| l.contains(" = ")).collect();
    assert_eq!(attempts.len(), 4 * 3 + 2, "{out}");
    for line in &attempts {
        assert!(line.ends_with("= bad_token"), "{line}: {out}");
    }
    // The first run's result, logs and calls are its own.
    assert_eq!(a["result"], "A's own", "{a}");
    assert_eq!(a["toolCalls"], 1, "{a}");
    assert_eq!(
        tw.served(),
        1,
        "a call without the token reached the MCP server"
    );
    let logs = a["logs"].to_string();
    assert!(logs.contains("A's own log"), "{logs}");
    assert!(!logs.contains("forged"), "{logs}");
    assert!(
        logs.contains("bad_token"),
        "the refusals are not said: {logs}"
    );
    assert_eq!(b["toolCalls"], 0, "{b}");
}

/// Another run that holds connections to a run's socket without ever
/// sending a token takes none of its slots: the run's own calls and its
/// `result` still go through, and the silent connections are closed
/// after a short wait.
#[tokio::test]
async fn silent_connections_to_a_runs_socket_take_none_of_its_slots() {
    if !require_kernel_features() {
        return;
    }
    let tw = ToolWorld::new(json!({}));
    let server = tw.server_in_a_sandbox().await;
    let victim = r#"
import os, time, zcode_tools
open("a-ready", "w").close()
while not os.path.exists("b-flooding"):
    time.sleep(0.02)
print("victim", zcode_tools.fs.echo(text="mine"))
zcode_tools.result("A's own")
open("a-done", "w").close()
while not os.path.exists("b-done"):
    time.sleep(0.02)
"#;
    let intruder = r#"
import glob, os, socket, time
while not os.path.exists("a-ready"):
    time.sleep(0.02)
mine = os.environ["ZCODE_TOOLS_SOCKET"]
[path] = [p for p in glob.glob(os.path.join(os.path.dirname(os.path.dirname(mine)), "zcode-run-*", "tools.sock")) if p != mine]
held = []
for _ in range(40):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    held.append(s)
open("b-flooding", "w").close()
while not os.path.exists("a-done"):
    time.sleep(0.02)
# While the victim's run (and so its server) still lives: each silent
# connection is closed by the server once its first wait is over.
import select
closed, waiting, deadline = 0, list(held), time.time() + 8
while waiting and time.time() < deadline:
    ready, _, _ = select.select(waiting, [], [], max(0, deadline - time.time()))
    for s in ready:
        waiting.remove(s)
        try:
            if s.recv(1) == b"":
                closed += 1
        except OSError:
            closed += 1
print("closed", closed)
open("b-done", "w").close()
"#;
    let (a, b) = tokio::join!(
        server.run(json!({"language": "python", "source": victim, "tools": ["fs.echo"], "timeoutMs": 60000})),
        server.run(json!({"language": "python", "source": intruder, "tools": ["fs.echo"], "timeoutMs": 60000})),
    );
    let (a, b) = (a.0, b.0);
    assert_eq!(a["ok"], true, "{a}");
    assert_eq!(a["result"], "A's own", "{a}");
    assert!(a["stdout"].as_str().unwrap().contains("victim mine"), "{a}");
    assert_eq!(b["ok"], true, "{b}");
    assert!(
        b["stdout"].as_str().unwrap().contains("closed 40"),
        "the silent connections were kept open: {b}"
    );
}

#[tokio::test]
async fn a_script_that_never_reads_its_answers_cannot_grow_the_servers_memory() {
    if !require_kernel_features() {
        return;
    }
    // No call is refused for being one too many at once: only the budget
    // for answers held stops them.
    let tw = ToolWorld::new(json!({"runCode": {"concurrentToolCalls": 1000}}));
    let server = tw.server().await;
    let pid = server.pid.unwrap();
    // Warm: the MCP server connected, and answers of ~1 MB made and read.
    let (r, _) = server
        .run(json!({"language": "python", "tools": ["fs.echo"], "source":
            "from zcode_tools import fs\nfor i in range(20):\n    assert len(fs.echo(text='x' * 1000, times=1000)) == 10**6"}))
        .await;
    assert_eq!(r["ok"], true, "{r}");
    let (served, peak) = (tw.served(), peak_resident(pid));
    // Four connections, each sent calls of ~1 MB answers until the server
    // stops reading it; not one answer is read. The script then waits for
    // a seventeenth call to reach the MCP server, which only a server
    // that keeps taking calls makes: a bounded one leaves the script to
    // its clock.
    let source = format!(
        r#"
import json, os, socket, time
path, token = os.environ["ZCODE_TOOLS_SOCKET"], os.environ["ZCODE_TOOLS_TOKEN"]
n, held = 0, []
for c in range(4):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    s.setblocking(False)
    held.append(s)
    pending = b""
    while True:
        if not pending:
            n += 1
            pending = (json.dumps({{"id": n, "token": token, "jsonrpc": "2.0", "method": "call",
                "params": {{"tool": "fs.echo", "args": {{"text": "x" * 1000, "times": 1000}}}}}}) + "\n").encode()
        try:
            pending = pending[s.send(pending):]
        except BlockingIOError:
            break
print("sent", n, flush=True)
while len(open("served").read()) < {served} + 17:
    time.sleep(0.02)
print("unbounded")
"#
    );
    let (r, _) = server
        .run(json!({"language": "python", "source": source, "tools": ["fs.echo"], "timeoutMs": 4000}))
        .await;
    let started = tw.served() - served;
    let grew = peak_resident(pid).saturating_sub(peak);
    let out = r["stdout"].as_str().unwrap();
    assert!(
        !out.contains("unbounded"),
        "{started} calls were started: {r}"
    );
    assert_eq!(r["error"]["code"], "timeout", "{r}");
    let sent: usize = out.trim().strip_prefix("sent ").unwrap().parse().unwrap();
    // The run's budget (16 MiB by default) holds about sixteen answers of
    // 1 MB: no more calls were started, though far more were sent.
    assert!(sent > 100, "{r}");
    assert!(
        started <= 16,
        "{started} calls were started for a script that reads no answer"
    );
    assert!(r["toolCalls"].as_u64().unwrap() <= 16, "{r}");
    assert!(
        grew < 64 << 20,
        "the server's peak memory grew by {} MiB",
        grew >> 20
    );
    // The server goes on serving.
    let (r, _) = server
        .run(json!({"language": "python", "tools": ["fs.echo"], "source": "from zcode_tools import fs\nprint(fs.echo(text='ok'))"}))
        .await;
    assert_eq!(r["stdout"], "ok\n", "{r}");
}

/// A servers file naming the test's probe server (it reports its
/// environment) once for each of `names`.
fn probe_servers(world: &World, names: &[&str]) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    // Beside the servers file, not in the checkout (see ToolWorld::new).
    let fixture = world.path().join("mcp_probe.py");
    std::fs::copy(
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/mcp_probe.py"),
        &fixture,
    )
    .unwrap();
    let defs: Vec<Value> = names
        .iter()
        .map(|n| json!({"name": n, "command": "python3", "args": [fixture], "env": []}))
        .collect();
    let servers = world.path().join("probe-servers.json");
    std::fs::write(&servers, Value::Array(defs).to_string()).unwrap();
    std::fs::set_permissions(&servers, std::fs::Permissions::from_mode(0o600)).unwrap();
    servers
}

#[tokio::test]
async fn the_editors_token_reaches_no_mcp_server_the_run_code_server_starts() {
    if !require_kernel_features() {
        return;
    }
    let world = World::new(json!({}));
    let servers = probe_servers(&world, &["probe"]);
    let secret = "editor-token-must-not-leak";
    let server = world
        .server_with(
            &[("ZCODE_ACP_EDITOR_TOKEN", secret)],
            &["--servers", servers.to_str().unwrap()],
        )
        .await;
    let (r, _) = server
        .run(json!({"language": "python", "tools": ["probe.env"], "source":
            "import json, os, zcode_tools\nreport = zcode_tools.probe.env()\nprint(json.dumps({'report': report, 'own': dict(os.environ)}))"}))
        .await;
    assert_eq!(r["ok"], true, "{r}");
    let out: Value = serde_json::from_str(r["stdout"].as_str().unwrap()).unwrap();
    let report = &out["report"];
    // What the MCP server got, and what it could read of its parent's.
    assert!(report["env"]["PATH"].is_string(), "{report}");
    let parent = report["parent"].as_str().unwrap();
    assert!(
        parent.contains("ZCODE_TEST_SECRET=hunter2"),
        "the parent's environment was not read: {parent}"
    );
    assert!(
        !out.to_string().contains(secret),
        "the editor's token reached an MCP server or the run: {out}"
    );
    assert!(
        report["env"].get("ZCODE_ACP_EDITOR_TOKEN").is_none(),
        "{report}"
    );
}

#[tokio::test]
async fn servers_named_after_the_languages_built_ins_break_nothing_and_renames_are_said() {
    if !require_kernel_features() {
        return;
    }
    let world = World::new(json!({}));
    let names = [
        "dict", "str", "next", "process", "JSON", "Object", "Promise", "my-fs", "fine",
    ];
    let servers = probe_servers(&world, &names);
    let server = world
        .server_with(&[], &["--servers", servers.to_str().unwrap()])
        .await;
    let python = r#"
import zcode_tools as t
from zcode_tools import *
print(t.dict.big(n=2), t.str.big(n=3), t.next.big(n=1), t.my_fs.big(n=4), fine.big(n=5))
print(str(5), dict(a=1), next(iter([7])))
t.log("info", "logged")
t.result({"language": "python"})
"#;
    let node = r#"
const t = require("zcode-tools");
(async () => {
  console.log(await t.process.big({ n: 2 }), await t.JSON.big({ n: 3 }), await t.Object.big({ n: 1 }), await t.my_fs.big({ n: 4 }), await t.fine.big({ n: 5 }));
  console.log(typeof process.env.PATH, JSON.stringify({ a: 1 }), Object.keys({ b: 1 }).length);
  await t.log("info", "logged");
  await t.result({ language: "node" });
})();
"#;
    let typescript = r#"
import zt, { Promise as P, JSON as J, log, result } from "zcode-tools";
console.log(await zt.process.big({ n: 2 }), await J.big({ n: 3 }), await zt.Object.big({ n: 1 }), await P.big({ n: 4 }), await zt.fine.big({ n: 5 }));
const p: Promise<number> = Promise.resolve(1);
console.log(typeof process.env.PATH, JSON.stringify({ a: await p }));
await log("info", "logged");
await result({ language: "typescript" });
"#;
    for (language, source, tools, expected) in [
        (
            "python",
            python,
            json!(["dict.big", "str.big", "next.big", "my-fs.big", "fine.big"]),
            "yy yyy y yyyy yyyyy\n5 {'a': 1} 7\n",
        ),
        (
            "node",
            node,
            json!([
                "process.big",
                "JSON.big",
                "Object.big",
                "my-fs.big",
                "fine.big"
            ]),
            "yy yyy y yyyy yyyyy\nstring {\"a\":1} 1\n",
        ),
        (
            "typescript",
            typescript,
            json!([
                "process.big",
                "JSON.big",
                "Object.big",
                "Promise.big",
                "fine.big"
            ]),
            "yy yyy y yyyy yyyyy\nstring {\"a\":1}\n",
        ),
    ] {
        if language == "typescript" && !typescript_here() {
            continue;
        }
        let (r, _) = server
            .run(json!({"language": language, "source": source, "tools": tools}))
            .await;
        assert_eq!(r["ok"], true, "{language}: {r}");
        assert_eq!(r["stdout"], expected, "{language}: {r}");
        assert_eq!(r["result"]["language"], language, "{r}");
        let logs = r["logs"].to_string();
        assert!(logs.contains("logged"), "{language}: {logs}");
        if tools.to_string().contains("my-fs") {
            assert!(
                logs.contains(r#"the MCP server \"my-fs\" is `my_fs` in code"#),
                "{language}: the rename is not said: {logs}"
            );
        }
    }
}

#[tokio::test]
async fn a_run_the_clock_or_the_watchdog_ends_says_so_and_nothing_of_zcode_acp_s_own() {
    if !require_kernel_features() {
        return;
    }
    let world = World::new(json!({"runCode": {"memoryMb": 64}}));
    let server = world.server(&[]).await;
    // Ended at every stage: while the sandbox is still being armed (1 ms),
    // just after, and once the code runs.
    for timeout in [1, 1, 1, 1, 1, 20, 20, 20, 100, 100, 300, 300, 300] {
        let (r, _) = server
            .run(json!({"language": "sh", "source": "sleep 10", "timeoutMs": timeout}))
            .await;
        assert_eq!(r["error"]["code"], "timeout", "{timeout} ms: {r}");
        assert_eq!(r["stderr"], "", "{timeout} ms: {r}");
    }
    // The watchdog: memory held in a file of the run's private /tmp, which
    // no limit of the interpreter's own sees.
    for _ in 0..4 {
        let (r, _) = server
            .run(json!({"language": "sh", "source": "head -c 200000000 /dev/zero > /tmp/big; sleep 10"}))
            .await;
        assert_eq!(r["error"]["code"], "memory", "{r}");
        assert_eq!(r["stderr"], "", "{r}");
    }
}

#[tokio::test]
async fn every_request_runs_or_is_refused_with_bad_request_whatever_its_size() {
    if !require_kernel_features() {
        return;
    }
    let world = World::new(json!({}));
    let server = world.server(&[]).await;
    let answered = |args: Value| {
        let server = &server;
        async move {
            tokio::time::timeout(common::TIMEOUT * 4, server.run(args))
                .await
                .expect("the request got no answer")
        }
    };
    // Within every limit, though far past 16 MiB as sent (each newline is
    // two bytes of JSON).
    let (r, _) =
        answered(json!({"language": "sh", "source": "wc -c", "stdin": "\n".repeat(8 << 20)})).await;
    assert_eq!(
        r["ok"],
        true,
        "{}",
        &r.to_string()[..500.min(r.to_string().len())]
    );
    assert_eq!(
        r["stdout"].as_str().unwrap().trim(),
        (8u64 << 20).to_string()
    );
    let (r, _) = answered(
        json!({"language": "sh", "source": "wc -c < \"$ZCODE_RUN_INPUTS/a\"",
        "files": [{"path": "a", "content": "x".repeat(32 << 20)}]}),
    )
    .await;
    assert_eq!(
        r["stdout"].as_str().unwrap().trim(),
        (32u64 << 20).to_string(),
        "{}",
        r["error"]
    );
    // Just past a limit of run_code's own.
    let (r, text) = answered(json!({"language": "sh", "source": "true",
        "files": [{"path": "a", "content": "x".repeat((32 << 20) + 1)}]}))
    .await;
    assert_eq!(r["error"]["code"], "bad_request", "{}", r["error"]);
    assert!(text.contains("bad_request"), "{text}");
    // Past what the server reads as sent (control characters are six bytes
    // each in JSON): refused all the same, by its id.
    let (r, text) = answered(json!({"language": "sh", "source": "true",
        "stdin": "\u{1}".repeat(8 << 20), "files": [{"path": "a", "content": "x".repeat(20 << 20)}]})).await;
    assert_eq!(r["error"]["code"], "bad_request", "{}", r["error"]);
    assert!(
        r["error"]["message"].as_str().unwrap().contains("as sent"),
        "{}",
        r["error"]
    );
    assert!(text.contains("bad_request"), "{text}");
    // The server reads on.
    let (r, _) = answered(json!({"language": "sh", "source": "echo still"})).await;
    assert_eq!(r["stdout"], "still\n", "{r}");
}

#[tokio::test]
async fn a_language_whose_interpreter_is_missing_is_unavailable_and_its_runs_say_no_interpreter() {
    if !require_kernel_features() {
        return;
    }
    // A PATH with the shells and node, and no python.
    let world = World::new(json!({}));
    let bin = world.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    for tool in ["sh", "bash", "node"] {
        let real = which(tool);
        std::os::unix::fs::symlink(&real, bin.join(tool)).unwrap();
    }
    let server = world.server(&[("PATH", bin.to_str().unwrap())]).await;
    let langs = server.call("which_languages", json!({})).await;
    let langs = langs.structured_content.unwrap();
    let python = &langs["languages"][0];
    assert_eq!(python["language"], "python", "{langs}");
    assert_eq!(python["available"], false, "{langs}");
    assert!(
        python["reason"]
            .as_str()
            .unwrap()
            .contains("python3 is not on PATH"),
        "{langs}"
    );
    let (r, text) = server
        .run(json!({"language": "python", "source": "print(1)"}))
        .await;
    assert_eq!(r["error"]["code"], "no_interpreter", "{r}");
    assert!(text.contains("no_interpreter"), "{text}");
    // The others still run.
    let (r, _) = server
        .run(json!({"language": "sh", "source": "echo here"}))
        .await;
    assert_eq!(r["stdout"], "here\n", "{r}");
}

/// `name`'s absolute path on the test's own PATH.
fn which(name: &str) -> String {
    let out = std::process::Command::new("sh")
        .args(["-c", &format!("command -v {name}")])
        .output()
        .unwrap();
    let path = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    assert!(path.starts_with('/'), "{name} is not on PATH");
    std::fs::canonicalize(path).unwrap().display().to_string()
}

#[tokio::test]
async fn the_interpreter_the_user_configures_is_the_one_that_runs_and_is_named() {
    if !require_kernel_features() {
        return;
    }
    let world =
        World::new(json!({"runCode": {"interpreters": {"python": ["python3", "-X", "utf8"]}}}));
    let server = world.server(&[]).await;
    let langs = server.call("which_languages", json!({})).await;
    let langs = langs.structured_content.unwrap();
    let python = &langs["languages"][0];
    assert_eq!(python["available"], true, "{langs}");
    let interpreter: Vec<&str> = python["interpreter"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(interpreter[0].ends_with("/python3"), "{langs}");
    assert_eq!(&interpreter[1..], ["-X", "utf8"], "{langs}");
    let (r, _) = server
        .run(json!({"language": "python", "source": "import sys\nprint(sys.flags.utf8_mode)"}))
        .await;
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(
        r["stdout"], "1\n",
        "the override's flags were not used: {r}"
    );
    assert_eq!(r["interpreter"], python["interpreter"], "{r}");
}

#[tokio::test]
async fn a_connection_past_the_limit_is_refused_clearly_and_closed_ones_make_room() {
    if !require_kernel_features() {
        return;
    }
    let tw = ToolWorld::new(json!({}));
    let server = tw.server().await;
    let source = r#"
import json, os, socket, zcode_tools
path, token = os.environ["ZCODE_TOOLS_SOCKET"], os.environ["ZCODE_TOOLS_TOKEN"]
def connect():
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    return s, s.makefile("rb")
def ask(c, i):
    c[0].sendall((json.dumps({"id": i, "token": token, "jsonrpc": "2.0", "method": "log",
        "params": {"level": "info", "message": "on %d" % i}}) + "\n").encode())
    m = json.loads(c[1].readline())
    return "ok" if "result" in m else m["error"]["data"]["code"] + ": " + m["error"]["message"]
def close(c):
    c[1].close()
    c[0].close()
held = [connect() for _ in range(16)]
print("sixteen", set(ask(c, i) for i, c in enumerate(held)))
extra = connect()
print("seventeenth", ask(extra, 99))
close(extra)
for c in held:
    close(c)
print("stub", zcode_tools.fs.echo(text="again"))
held = [connect() for _ in range(15)]
print("again", set(ask(c, 100 + i) for i, c in enumerate(held)))
# Sixteen again, with the stub's: a thread's own connection is refused,
# and the script reads why.
import threading
def in_a_thread(label):
    try:
        print(label, zcode_tools.fs.echo(text="x"))
    except zcode_tools.ToolError as e:
        print(label, e.code)
for label in ["thread", "thread after"]:
    t = threading.Thread(target=in_a_thread, args=(label,))
    t.start()
    t.join()
    close(held.pop())
"#;
    let (r, _) = server
        .run(json!({"language": "python", "source": source, "tools": ["fs.echo"]}))
        .await;
    assert_eq!(r["ok"], true, "{r}");
    let out = r["stdout"].as_str().unwrap();
    assert!(out.contains("sixteen {'ok'}"), "{out}");
    assert!(
        out.contains("seventeenth too_many_at_once: this run holds 16 connections"),
        "{out}"
    );
    assert!(out.contains("stub again\n"), "{out}");
    assert!(out.contains("again {'ok'}"), "{out}");
    assert!(out.contains("thread too_many_at_once\n"), "{out}");
    assert!(out.contains("thread after x\n"), "{out}");
    let logs = r["logs"].to_string();
    assert!(logs.contains("too_many_at_once"), "{logs}");
}
