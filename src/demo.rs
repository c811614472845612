//! `zcode-acp demo`: a scripted editor drives the bridge and the embedded
//! shell agent in a temporary workspace, and prints what crosses the wire
//! in a readable form.

use std::path::Path;
use std::process::Stdio;

use anyhow::{anyhow, bail, Context};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

struct Client {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Lines<BufReader<ChildStdout>>,
    next_id: u64,
}

impl Client {
    async fn send(&mut self, msg: Value) -> anyhow::Result<()> {
        let stdin = self.stdin.as_mut().context("stdin closed")?;
        stdin.write_all(format!("{msg}\n").as_bytes()).await?;
        Ok(())
    }

    /// The bridge's next message on stdout.
    async fn next_message(&mut self) -> anyhow::Result<Value> {
        let line = self
            .lines
            .next_line()
            .await?
            .ok_or_else(|| anyhow!("the bridge closed its stdout"))?;
        serde_json::from_str(&line).context("the bridge wrote a non-JSON line")
    }

    /// Sends a request and prints what the agent streams until it answers.
    async fn call(&mut self, method: &str, params: Value) -> anyhow::Result<Value> {
        self.next_id += 1;
        let id = self.next_id;
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await?;
        loop {
            let msg = self.next_message().await?;
            if msg.get("method").is_none() && msg["id"] == id {
                if let Some(e) = msg.get("error") {
                    bail!("{method} failed: {}", e["message"]);
                }
                return Ok(msg["result"].clone());
            }
            match (msg["method"].as_str(), msg.get("id")) {
                (Some("session/update"), None) => show_update(&msg["params"]["update"]),
                (Some(m), Some(rid)) => {
                    let rid = rid.clone();
                    let result = self.answer(m, &msg["params"]).await;
                    self.send(json!({"jsonrpc": "2.0", "id": rid, "result": result}))
                        .await?;
                }
                _ => {}
            }
        }
    }

    /// Prints the updates the bridge sends until one `until` accepts (the
    /// bridge's notice that the agent restarted, say).
    async fn wait_for_update(&mut self, until: impl Fn(&Value) -> bool) -> anyhow::Result<()> {
        loop {
            let msg = self.next_message().await?;
            if msg["method"] == "session/update" {
                let update = &msg["params"]["update"];
                show_update(update);
                if until(update) {
                    return Ok(());
                }
            }
        }
    }

    /// What this little editor does when the agent asks it for something.
    async fn answer(&mut self, method: &str, params: &Value) -> Value {
        match method {
            "fs/write_text_file" => {
                let path = params["path"].as_str().unwrap_or_default();
                println!("   <> the agent asks the editor to write {path}");
                if let Err(e) = std::fs::write(path, params["content"].as_str().unwrap_or_default())
                {
                    println!("   <> the write failed: {e}");
                }
                json!({})
            }
            "session/request_permission" => {
                println!(
                    "   ?? the editor asks you: {}",
                    params["toolCall"]["title"].as_str().unwrap_or("?")
                );
                println!("   ?? the demo answers: Allow once");
                json!({"outcome": {"outcome": "selected", "optionId": "allow-once"}})
            }
            _ => json!({}),
        }
    }
}

/// Starts `zcode-acp [bridge_args] -- zcode-acp shell-agent`.
fn start(exe: &Path, bridge_args: &[&str], agent_state: &Path) -> anyhow::Result<Client> {
    start_with_env(exe, bridge_args, agent_state, &[])
}

fn start_with_env(
    exe: &Path,
    bridge_args: &[&str],
    agent_state: &Path,
    env: &[(&str, &str)],
) -> anyhow::Result<Client> {
    let mut child = Command::new(exe)
        .args(bridge_args)
        .arg("--")
        .arg(exe)
        .arg("shell-agent")
        .env("ZCODE_SHELL_AGENT_HOME", agent_state)
        .env_remove("ZCODE_ACP_SANDBOX")
        .envs(env.iter().copied())
        .env(
            "ZCODE_ACP_LOG",
            std::env::var("ZCODE_ACP_LOG").unwrap_or_else(|_| "error".into()),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .context("cannot start the bridge")?;
    let stdin = child.stdin.take();
    let stdout = child.stdout.take().context("no stdout")?;
    Ok(Client {
        child,
        stdin,
        lines: BufReader::new(stdout).lines(),
        next_id: 0,
    })
}

async fn open_session(client: &mut Client, workspace: &Path) -> anyhow::Result<String> {
    println!("-> initialize");
    client
        .call(
            "initialize",
            json!({"protocolVersion": 1, "clientCapabilities": {"fs": {"readTextFile": false, "writeTextFile": true}}}),
        )
        .await?;
    println!("-> session/new in {}", workspace.display());
    let session = client
        .call("session/new", json!({"cwd": workspace, "mcpServers": []}))
        .await?;
    let sid = session["sessionId"]
        .as_str()
        .context("no sessionId")?
        .to_owned();
    println!("<- session {sid}\n");
    Ok(sid)
}

/// Part two: the same agent in a project that turns the sandbox on.
async fn sandbox_part(exe: &Path, tmp: &Path) -> anyhow::Result<()> {
    println!("\n== part 2: a project that turns the sandbox on ==\n");
    if let Err(why) = zcode_acp_sandbox_available() {
        println!("skipped: {why}");
        return Ok(());
    }
    let workspace = tmp.join("sandboxed");
    std::fs::create_dir_all(workspace.join(".zcode/acp"))?;
    std::fs::write(
        workspace.join(".zcode/acp/sandbox.json"),
        "{\"enabled\": true}\n",
    )?;
    println!(
        "{}/.zcode/acp/sandbox.json says {{\"enabled\": true}}",
        workspace.display()
    );
    // Outside everything the sandbox allows (not in /tmp, which is private
    // inside): a folder in the home directory, removed at the end.
    let home = dirs::home_dir().context("no home directory")?;
    let outside = tempfile::Builder::new()
        .prefix("zcode-acp-demo-outside-")
        .tempdir_in(&home)?;
    let target = outside.path().join("outside.txt");
    let mut client = start(exe, &[], &workspace.join("agent-state"))?;
    let sid = open_session(&mut client, &workspace).await?;
    prompt(
        &mut client,
        &sid,
        "echo written inside > inside.txt && cat inside.txt",
    )
    .await?;
    println!();
    prompt(
        &mut client,
        &sid,
        &format!("echo written directly > {}", target.display()),
    )
    .await?;
    println!("\n(the grant takes effect from the next prompt: the agent was re-armed when that turn ended)");
    prompt(
        &mut client,
        &sid,
        &format!(
            "echo written directly > {t} && cat {t}",
            t = target.display()
        ),
    )
    .await?;
    client.stdin.take();
    let status = client.child.wait().await?;
    println!("\n<- bridge exited: {status}");

    println!(
        "\n== part 3: ZCODE_ACP_SANDBOX=1, and a write the agent asks the editor to make ==\n"
    );
    let plain = tmp.join("plain");
    std::fs::create_dir_all(&plain)?;
    let through_editor = outside.path().join("through-editor.txt");
    let mut client = start_with_env(
        exe,
        &[],
        &plain.join("agent-state"),
        &[("ZCODE_ACP_SANDBOX", "1")],
    )?;
    let sid = open_session(&mut client, &plain).await?;
    prompt(
        &mut client,
        &sid,
        &format!(
            "/write {} written after you allowed it",
            through_editor.display()
        ),
    )
    .await?;
    client.stdin.take();
    let status = client.child.wait().await?;
    println!("\n<- bridge exited: {status}");
    for f in [&target, &through_editor] {
        println!(
            "{} now says: {}",
            f.display(),
            std::fs::read_to_string(f)
                .unwrap_or_else(|e| format!("<{e}>"))
                .trim_end()
        );
    }
    Ok(())
}

fn zcode_acp_sandbox_available() -> Result<(), String> {
    #[cfg(target_os = "linux")]
    if crate::linux::landlock_abi() < 1 {
        return Err("this kernel has no Landlock".into());
    }
    #[cfg(target_os = "macos")]
    if !Path::new(crate::seatbelt::enforce::SANDBOX_EXEC).is_file() {
        return Err("this system has no /usr/bin/sandbox-exec".into());
    }
    #[cfg(not(any(target_os = "linux", target_os = "macos")))]
    return Err("zcode-acp cannot arm a sandbox on this operating system".into());
    #[allow(unreachable_code)]
    Ok(())
}

fn show_update(update: &Value) {
    match update["sessionUpdate"].as_str() {
        Some("tool_call") => println!(
            "   [tool] {} ({})",
            update["title"].as_str().unwrap_or(""),
            update["status"].as_str().unwrap_or("")
        ),
        Some("tool_call_update") => {
            let code = &update["rawOutput"]["exitCode"];
            println!(
                "   [tool] {} (exit {code})",
                update["status"].as_str().unwrap_or("")
            );
        }
        Some("agent_message_chunk") => {
            for line in update["content"]["text"].as_str().unwrap_or("").lines() {
                println!("   | {line}");
            }
        }
        _ => {}
    }
}

async fn prompt(client: &mut Client, sid: &str, text: &str) -> anyhow::Result<()> {
    println!("-> prompt: {text}");
    let r = client
        .call(
            "session/prompt",
            json!({"sessionId": sid, "prompt": [{"type": "text", "text": text}]}),
        )
        .await?;
    println!("<- {}", r["stopReason"].as_str().unwrap_or("?"));
    Ok(())
}

pub async fn run() -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("cannot find the zcode-acp binary")?;
    let tmp = tempfile::Builder::new()
        .prefix("zcode-acp-demo-")
        .tempdir()?;
    let workspace = tmp.path().join("workspace");
    std::fs::create_dir_all(&workspace)?;
    println!("zcode-acp demo: a scripted editor talks to `zcode-acp -- zcode-acp shell-agent`");
    println!("legend: -> the editor sends   <- it receives   <> the agent asks the editor   ?? the demo answers for you");
    println!(
        "        | the agent's words   [tool] the agent's tool calls and the bridge's notices"
    );
    println!("\n== part 1: the relay (the agent runs unconfined here) ==\n");

    // Part one shows the relay; it runs the agent unconfined on purpose
    // (--no-sandbox) so it behaves the same whatever the sandbox settings.
    let mut client = start(&exe, &["--no-sandbox"], &tmp.path().join("agent-state"))?;
    let sid = open_session(&mut client, &workspace).await?;

    prompt(
        &mut client,
        &sid,
        "echo \"hello from the agent\" > hello.txt && cat hello.txt && echo \"agent pid: $PPID\"",
    )
    .await?;

    println!("\n-> SIGHUP to the bridge: restart the backend, as a sandbox re-arm does");
    let pid = client.child.id().context("the bridge already exited")?;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGHUP,
    )?;
    // The next prompt goes to the new agent once the bridge says it is up.
    client
        .wait_for_update(|u| {
            u["sessionUpdate"] == "tool_call"
                && u["title"]
                    .as_str()
                    .is_some_and(|t| t.ends_with("(restarted)"))
        })
        .await?;
    prompt(
        &mut client,
        &sid,
        "echo \"same session, new agent pid: $PPID\"; cat hello.txt",
    )
    .await?;

    println!();
    prompt(
        &mut client,
        &sid,
        "/write notes.txt written by the editor for the agent",
    )
    .await?;

    println!("\n-> the editor quits (closes the bridge's stdin)");
    client.stdin.take();
    let status = client.child.wait().await?;
    println!("<- bridge exited: {status}");
    print_files(&workspace)?;
    sandbox_part(&exe, tmp.path()).await?;
    Ok(())
}

fn print_files(dir: &Path) -> anyhow::Result<()> {
    let mut names: Vec<String> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    println!("files in the workspace: {}", names.join(", "));
    Ok(())
}
