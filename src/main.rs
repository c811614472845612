//! The `zcode-acp` command line.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use zcode_acp::confine::Sandbox;
use zcode_acp::{bridge, config, demo, logging, relay, shell_agent};

const USAGE_HINT: &str = r#"zcode-acp needs an agent backend to run.

  zcode-acp [OPTIONS] -- BACKEND [ARGS...]

or set ZCODE_ACP_BACKEND, or put {"backend": ["codex-acp"]} in the user config
file (~/.config/zcode-acp/config.json on Linux).

In Zed, add this to settings.json (ZCODE_ACP_SANDBOX=1 turns the sandbox on):

  "agent_servers": {
    "Claude (sandboxed)": {
      "type": "custom",
      "command": "zcode-acp",
      "args": ["--", "claude-agent-acp"],
      "env": { "ZCODE_ACP_SANDBOX": "1" }
    }
  }

Try it first with the embedded agent:  zcode-acp demo
"#;

/// What `--help` ends with: how the sandbox is turned on, and where to
/// see whether it is.
const SWITCH_HELP: &str = "The sandbox is off unless something turns it on:
  ZCODE_ACP_SANDBOX=1                 in the agent's environment: on for every project
  {\"sandbox\": {\"enabled\": true}}      in the user config (~/.config/zcode-acp/config.json;
                                      macOS: ~/Library/Application Support/zcode-acp/): the same
  {\"enabled\": true}                   in a project's .zcode/acp/sandbox.json: on for that project
--no-sandbox runs the agent unconfined on purpose. `zcode-acp doctor` says whether it is on.";

#[derive(Parser, Debug)]
#[command(
    name = "zcode-acp",
    version,
    about = "A writes-only sandbox between an ACP editor and an agent backend",
    after_help = SWITCH_HELP,
    args_conflicts_with_subcommands = true
)]
struct Cli {
    /// Also write logs to this file (logs never go to stdout).
    #[arg(long, global = true, value_name = "PATH")]
    log_file: Option<PathBuf>,

    #[command(subcommand)]
    command: Option<Command>,

    #[command(flatten)]
    bridge: BridgeArgs,
}

#[derive(Args, Debug)]
struct BridgeArgs {
    /// Largest frame accepted from either side (e.g. 256MiB).
    // Negative numbers reach the parser, which refuses them plainly
    // (clap would suggest `-- -5`, which would make it the backend).
    #[arg(long, value_name = "SIZE", default_value = "256MiB", allow_negative_numbers = true, value_parser = relay::framing::parse_byte_size)]
    max_frame_bytes: usize,

    /// Milliseconds a backend gets between SIGTERM and SIGKILL when stopped.
    #[arg(long, value_name = "MS", default_value = "3000", allow_negative_numbers = true, value_parser = relay::framing::parse_millis)]
    stop_grace_ms: u64,

    /// Milliseconds zcode-acp waits, after giving up on an agent that keeps
    /// crashing, before the editor's next request starts it again.
    #[arg(long, value_name = "MS", default_value = "60000", allow_negative_numbers = true, value_parser = relay::framing::parse_millis)]
    crash_cooldown_ms: u64,

    /// Run the agent unconfined on purpose, even where a sandbox is requested.
    #[arg(long)]
    no_sandbox: bool,

    /// Offer every session the run_code tool (an MCP server this bridge adds
    /// to the session's mcpServers); also "codeExec": true in the user config.
    #[arg(long)]
    code_exec: bool,

    /// Whose state the agent may write: claude, codex, gemini, qwen, opencode, vibe, zcode or none
    /// (default: read from the backend command; also ZCODE_ACP_BACKEND_PROFILE).
    #[arg(long, value_name = "PROFILE")]
    backend_profile: Option<String>,

    /// The agent backend command line.
    #[arg(last = true, value_name = "BACKEND")]
    backend: Vec<String>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the embedded shell agent (an ACP agent whose prompts are shell commands).
    ShellAgent,
    /// Serve the run_code and which_languages tools over MCP on stdio.
    Mcp(zcode_acp::run_code::server::McpArgs),
    /// Run a scripted editor against the bridge and the shell agent, and print what happens.
    Demo,
    /// Print the sandbox profile for workspaces, or the decision for one path.
    Profile(zcode_acp::commands::profile::ProfileArgs),
    /// Allow writes beneath PATH for a project (recorded in its sandbox.json, approved).
    Allow(zcode_acp::commands::allow::ListArgs),
    /// Never allow writes beneath PATH for a project (recorded in its sandbox.json).
    Deny(zcode_acp::commands::allow::ListArgs),
    /// Approve a project's sandbox.json as it is now (after editing it by hand).
    Approve(zcode_acp::commands::allow::ApproveArgs),
    /// Run a command under the sandbox (Linux: namespaces + Landlock; macOS: Seatbelt).
    #[cfg(any(target_os = "linux", target_os = "macos"))]
    Run(zcode_acp::commands::run::RunArgs),
    /// What this machine can arm, what the sandbox allows, and a live self-test.
    #[cfg(target_os = "linux")]
    Doctor(zcode_acp::commands::doctor::DoctorArgs),
    /// Internal: inside a terminal's sandbox, apply the agent's environment and run the command.
    #[command(name = "__exec-env", hide = true)]
    ExecEnv {
        /// NAME=VALUE, applied to the command.
        #[arg(long = "env", value_name = "NAME=VALUE")]
        env: Vec<String>,
        #[arg(last = true, required = true, value_name = "COMMAND")]
        command: Vec<String>,
    },
    /// Internal: the keeper between the bridge and an unconfined backend.
    #[cfg(target_os = "linux")]
    #[command(name = "__keeper", hide = true)]
    Keeper {
        /// The bridge whose death ends the agent's whole tree.
        #[arg(long)]
        bridge: i32,
        #[arg(last = true, required = true, value_name = "COMMAND")]
        command: Vec<String>,
    },
    /// Internal: the re-executed helper stage that arms a backend generation.
    #[cfg(target_os = "linux")]
    #[command(name = "__sandbox", hide = true)]
    Sandbox(SandboxArgs),
}

/// `__sandbox`'s arguments.
#[cfg(target_os = "linux")]
#[derive(clap::Args, Debug)]
struct SandboxArgs {
    #[arg(long, required_unless_present_any = ["spec_fd", "args_on_stdin"])]
    spec: Option<PathBuf>,
    /// Read the spec from this inherited descriptor instead.
    #[arg(long, conflicts_with = "spec")]
    spec_fd: Option<i32>,
    /// Started ahead of its arming: the rest of this command line comes as
    /// the first line of stdin (see `backend::spawn::Ahead`).
    #[arg(long, conflicts_with_all = ["spec", "spec_fd", "consume", "die_with_parent"])]
    args_on_stdin: bool,
    /// Remove the spec file once read (terminals' one-shot specs).
    #[arg(long)]
    consume: bool,
    /// Die with the process that started this one (an editor's terminal).
    #[arg(long)]
    die_with_parent: bool,
}

/// The subcommands a user types.
const SUBCOMMANDS: &[&str] = &[
    "shell-agent",
    "mcp",
    "demo",
    "profile",
    "allow",
    "deny",
    "approve",
    "run",
    "doctor",
    "help",
];

/// What to say when the first word is neither an option nor a subcommand:
/// a near miss of a subcommand, or an agent's command given without `--`.
fn first_word_hint(word: &str) -> String {
    let close = SUBCOMMANDS
        .iter()
        .map(|c| (zcode_acp::config::keys::edit_distance(word, c), c))
        .filter(|(d, c)| *d <= 2 && *d < c.len())
        .min();
    match close {
        Some((_, c)) => format!("`{word}` is not a zcode-acp command; did you mean `zcode-acp {c}`?"),
        None => format!(
            "`{word}` is not a zcode-acp command; to run an agent behind zcode-acp, put `--` before its command: zcode-acp -- {word} ..."
        ),
    }
}

/// `zcode-acp run`: the command's exit code, or 126 when it was not run.
#[cfg(any(target_os = "linux", target_os = "macos"))]
fn run(args: zcode_acp::commands::run::RunArgs) -> ExitCode {
    match zcode_acp::commands::run::run(args) {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(e) => {
            eprintln!("zcode-acp: {e:#}");
            ExitCode::from(126)
        }
    }
}

/// `zcode-acp run`'s arguments read by a parser of `run`'s own: a command
/// an agent starts at every step should not pay for building every
/// subcommand's parser (about 0.3 ms). `None` for anything else, and for
/// anything this parser refuses or answers (`--log-file`, `--help`, a
/// mistake): the whole parser then reads it and says what it says.
#[cfg(any(target_os = "linux", target_os = "macos"))]
fn run_args_alone() -> Option<zcode_acp::commands::run::RunArgs> {
    args_alone("run")
}

/// The arguments of the subcommand `name` (the first word), read by that
/// subcommand's parser alone; `None` for another command line, or one it
/// does not take (the whole parser then says what is wrong).
#[cfg(any(target_os = "linux", target_os = "macos"))]
fn args_alone<A: clap::Args + clap::FromArgMatches>(name: &'static str) -> Option<A> {
    args_of(name, std::env::args_os().skip(1)).ok()
}

/// The arguments of the subcommand `name` in `argv` (its first word
/// `name`), read by that subcommand's parser alone, or why not.
#[cfg(any(target_os = "linux", target_os = "macos"))]
fn args_of<A: clap::Args + clap::FromArgMatches>(
    name: &'static str,
    argv: impl IntoIterator<Item = impl Into<std::ffi::OsString>>,
) -> Result<A, String> {
    let mut argv = argv.into_iter().map(Into::into);
    if argv.next().as_deref() != Some(std::ffi::OsStr::new(name)) {
        return Err(format!("it does not start with {name}"));
    }
    let parser = A::augment_args(clap::Command::new(name).no_binary_name(true));
    let matches = parser
        .try_get_matches_from(argv)
        .map_err(|e| e.to_string())?;
    A::from_arg_matches(&matches).map_err(|e| e.to_string())
}

/// `__sandbox`'s arguments read by its own parser, as [`run_args_alone`]
/// does: the helper starts every generation and every editor terminal.
#[cfg(target_os = "linux")]
fn sandbox_args_alone() -> Option<SandboxArgs> {
    args_alone("__sandbox")
}

/// The launcher's refusal of the command line it was handed on stdin.
#[cfg(target_os = "linux")]
fn refused(why: &str) -> ExitCode {
    eprintln!(
        "zcode-acp: the sandbox's launcher was handed a command line it does not take: {}",
        why.trim()
    );
    ExitCode::from(126)
}

/// The helper stage: arms the launch its spec describes.
#[cfg(target_os = "linux")]
fn sandbox(args: SandboxArgs) -> ExitCode {
    use zcode_acp::linux::helper::SpecSource;
    if args.args_on_stdin {
        return match zcode_acp::linux::helper::args_on_stdin() {
            Ok(Some(line)) => match args_of::<SandboxArgs>("__sandbox", line) {
                Ok(args) if !args.args_on_stdin => sandbox(args),
                Ok(_) => refused("it asks for --args-on-stdin again"),
                Err(why) => refused(&why),
            },
            // Started ahead for an arming that did not come: nothing to do.
            Ok(None) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("zcode-acp: {e}");
                ExitCode::from(126)
            }
        };
    }
    let source = match (args.spec, args.spec_fd) {
        (Some(path), _) => SpecSource::File {
            path,
            consume: args.consume,
        },
        (None, Some(fd)) => SpecSource::Fd(fd),
        (None, None) => unreachable!("clap requires one of them"),
    };
    match zcode_acp::linux::helper::helper(&source, args.die_with_parent) {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(e) => {
            eprintln!("zcode-acp: {e}");
            ExitCode::from(126)
        }
    }
}

fn main() -> ExitCode {
    #[cfg(any(target_os = "linux", target_os = "macos"))]
    if let Some(args) = run_args_alone() {
        if let Err(e) = logging::init(None) {
            eprintln!("zcode-acp: {e}");
            return ExitCode::from(2);
        }
        return run(args);
    }
    #[cfg(target_os = "linux")]
    if let Some(args) = sandbox_args_alone() {
        if let Err(e) = logging::init(None) {
            eprintln!("zcode-acp: {e}");
            return ExitCode::from(2);
        }
        return sandbox(args);
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let first = std::env::args().nth(1).filter(|w| {
                !w.starts_with('-') && !SUBCOMMANDS.contains(&w.as_str()) && !w.starts_with("__")
            });
            match (e.kind(), first) {
                (clap::error::ErrorKind::UnknownArgument, Some(word)) => {
                    eprintln!("zcode-acp: {}", first_word_hint(&word));
                    eprintln!("For more information, try 'zcode-acp --help'.");
                    return ExitCode::from(2);
                }
                _ => e.exit(),
            }
        }
    };
    if let Err(e) = logging::init(cli.log_file.as_deref()) {
        eprintln!("zcode-acp: {e}");
        return ExitCode::from(2);
    }
    if let Some(Command::ExecEnv { env, command }) = &cli.command {
        eprintln!(
            "zcode-acp: {}",
            zcode_acp::commands::exec_env::run(env, command)
        );
        return ExitCode::from(127);
    }
    // `run` sets up namespaces, which needs a process without threads: it
    // runs before the async runtime exists.
    #[cfg(any(target_os = "linux", target_os = "macos"))]
    let cli = match cli.command {
        Some(Command::Run(args)) => return run(args),
        command => Cli { command, ..cli },
    };
    #[cfg(target_os = "linux")]
    let cli = match cli.command {
        Some(Command::Keeper { bridge, command }) => {
            let code = zcode_acp::backend::keeper::run(bridge, &command);
            return ExitCode::from(code.clamp(0, 255) as u8);
        }
        Some(Command::Sandbox(args)) => return sandbox(args),
        Some(Command::Doctor(args)) => {
            return match zcode_acp::commands::doctor::run(args) {
                Ok(true) => ExitCode::SUCCESS,
                Ok(false) => ExitCode::from(1),
                Err(e) => {
                    eprintln!("zcode-acp: {e:#}");
                    ExitCode::from(2)
                }
            };
        }
        command => Cli { command, ..cli },
    };
    // The MCP server decides its confinement first: probing the kernel
    // forks, which wants no threads.
    let (cli, mcp_runner) = match cli.command {
        Some(Command::Mcp(args)) => match zcode_acp::run_code::server::prepare(&args) {
            Ok(runner) => (
                Cli {
                    command: Some(Command::Mcp(args)),
                    ..cli
                },
                Some(runner),
            ),
            Err(e) => {
                eprintln!("zcode-acp: {e:#}");
                return ExitCode::from(2);
            }
        },
        command => (Cli { command, ..cli }, None),
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("zcode-acp: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // One thread: the backend's parent-death signal is tied to the thread
    // that spawned it, and the main thread lives as long as the process.
    let result = runtime.block_on(async {
        match cli.command {
            Some(Command::ShellAgent) => shell_agent::run().await.map(|_| ExitCode::SUCCESS),
            Some(Command::Mcp(_)) => match mcp_runner {
                Some(runner) => zcode_acp::run_code::server::serve(runner)
                    .await
                    .map(|_| ExitCode::SUCCESS),
                None => unreachable!("prepared before the runtime starts"),
            },
            Some(Command::Demo) => demo::run().await.map(|_| ExitCode::SUCCESS),
            Some(Command::Allow(args)) => {
                zcode_acp::commands::allow::run(zcode_acp::config::project::List::Allow, args)
                    .map(|_| ExitCode::SUCCESS)
            }
            Some(Command::Deny(args)) => {
                zcode_acp::commands::allow::run(zcode_acp::config::project::List::Deny, args)
                    .map(|_| ExitCode::SUCCESS)
            }
            Some(Command::Approve(args)) => {
                zcode_acp::commands::allow::approve(args).map(|_| ExitCode::SUCCESS)
            }
            Some(Command::Profile(args)) => {
                zcode_acp::commands::profile::run(args).map(|_| ExitCode::SUCCESS)
            }
            #[cfg(target_os = "linux")]
            Some(Command::Sandbox { .. } | Command::Doctor(_) | Command::Keeper { .. }) => {
                unreachable!("handled before the runtime starts")
            }
            #[cfg(any(target_os = "linux", target_os = "macos"))]
            Some(Command::Run(_)) => unreachable!("handled before the runtime starts"),
            Some(Command::ExecEnv { .. }) => unreachable!("handled before the runtime starts"),
            None => run_bridge(cli.bridge).await,
        }
    });
    // A blocking read of stdin may still be parked in the runtime's thread
    // pool (the editor has not closed it); do not wait for it.
    runtime.shutdown_background();
    match result {
        Ok(code) => code,
        Err(e) => {
            tracing::error!(target: logging::FILE_ONLY, "{e:#}");
            eprintln!("zcode-acp: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run_bridge(args: BridgeArgs) -> anyhow::Result<ExitCode> {
    // A broken user config never stops the bridge before the editor hears
    // why: it answers with the file, the place and what is expected.
    let (user, config_problem) = match config::load_user_config() {
        Ok(user) => (user, None),
        Err(e) => (config::UserConfig::default(), Some(e.to_string())),
    };
    let backend = config::resolve_backend(&args.backend).ok().flatten();
    let (backend, cannot_start) = match (backend, &config_problem) {
        (Some(backend), _) => (backend, None),
        (None, Some(problem)) => (
            Vec::new(),
            Some(format!("zcode-acp has no agent to start: {problem}")),
        ),
        (None, None) => {
            eprint!("{USAGE_HINT}");
            return Ok(ExitCode::from(2));
        }
    };
    let mut state =
        zcode_acp::policy::backends::state_settings(&user, args.backend_profile.as_deref())?;
    if config_problem.is_some() {
        // The unreadable file may have held an egress list: the sandbox
        // reaches no network until it is fixed, not the defaults' internet.
        state.network = zcode_acp::policy::network::NetworkPolicy::closed();
    }
    let managed = config::managed::ManagedRoot::user_default()?;
    // The config may have asked for the sandbox: unreadable, it is armed as
    // if it had (fail closed), and the user is told why.
    let requested = match (&config_problem, args.no_sandbox) {
        (Some(problem), false) if cannot_start.is_none() => {
            tracing::warn!(
                "{problem}; until it is fixed, the sandbox is armed as if it were enabled"
            );
            Some(format!("the user config could not be read ({problem})"))
        }
        _ => config::sandbox_requested_globally(&user),
    };
    let startup_note = config_problem.as_ref().filter(|_| cannot_start.is_none() && !args.no_sandbox).map(|problem| {
        format!("The sandbox is armed because {problem}; until it is fixed, zcode-acp arms it as if it were enabled, and the sandbox reaches no network (the file may have held a network table).")
    }).or_else(|| {
        zcode_acp::policy::backends::network_problem(&user).map(|p| {
            let mut p = p;
            p[..1].make_ascii_uppercase();
            format!("{p}.")
        })
    });
    // A misspelled key would leave the sandbox as it was without a word.
    let startup_note = match (startup_note, &user.unknown_keys) {
        (Some(note), Some(keys)) => Some(format!("{note}\n{keys}.")),
        (None, Some(keys)) => Some(format!("{keys}.")),
        (note, None) => note,
    };
    let sandbox = match requested {
        Some(requested_by) if !args.no_sandbox => {
            let sandbox = Sandbox::detect(requested_by, zcode_acp::commands::platform_enforcer());
            if sandbox.arms() {
                let swept = config::generation::sweep_dead(&managed);
                if swept > 0 {
                    tracing::debug!(swept, "removed the sandbox directories of dead generations");
                }
            }
            sandbox
        }
        Some(requested_by) => {
            tracing::warn!("the sandbox is requested ({requested_by}) but --no-sandbox was given: the agent runs UNCONFINED");
            Sandbox::Off
        }
        None if config_problem.is_some() && args.no_sandbox => {
            tracing::warn!(
                "{}; --no-sandbox was given: the agent runs UNCONFINED",
                config_problem.as_deref().unwrap_or_default()
            );
            Sandbox::Off
        }
        // A project may still turn it on (see `honor_project_switch`).
        None => Sandbox::Off,
    };
    let code_exec = match (args.code_exec, user.code_exec) {
        (true, _) => Some("--code-exec"),
        (false, true) => Some("\"codeExec\": true in the user config"),
        (false, false) => None,
    };
    // Projects may turn it on too (an approved `codeExec: true`), so the
    // path the agent starts the server by is found either way.
    // The path goes into JSON: it must be text.
    let exe = std::env::current_exe().and_then(|exe| match exe.to_str() {
        Some(_) => Ok(exe),
        None => Err(std::io::Error::other(format!(
            "its path {} is not UTF-8",
            exe.display()
        ))),
    });
    let code_exec = match (exe, code_exec) {
        (Ok(exe), everywhere) => {
            if let Some(by) = everywhere {
                tracing::info!("sessions are offered the run_code tool ({by})");
            }
            Some(zcode_acp::run_code::inject::CodeExec {
                exe,
                everywhere: everywhere.map(str::to_owned),
            })
        }
        (Err(e), Some(by)) => anyhow::bail!(
            "code execution is on ({by}), but zcode-acp cannot find its own path to offer it: {e}"
        ),
        (Err(e), None) => {
            tracing::debug!("run_code cannot be offered to projects that ask for it: {e}");
            None
        }
    };
    let cfg = bridge::BridgeConfig {
        platform: zcode_acp::commands::platform_enforcer,
        backend,
        max_frame_bytes: args.max_frame_bytes,
        stop_grace: Duration::from_millis(args.stop_grace_ms),
        crash_limit: 3,
        crash_window: Duration::from_secs(30),
        crash_cooldown: Duration::from_millis(args.crash_cooldown_ms),
        honor_project_switch: !args.no_sandbox,
        managed,
        state,
        startup_note,
        cannot_start,
        code_exec,
    };
    bridge::Bridge::run(cfg, sandbox).await?;
    Ok(ExitCode::SUCCESS)
}
