//! `zcode-acp doctor`: what this machine can arm, what the sandbox would
//! allow for a workspace, and a live self-test (one write that must
//! succeed, one that must be denied), checked on disk.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::config::managed::ManagedRoot;
use crate::linux::exec::{choose_level, namespaces_available};
use crate::linux::plan::{self, RealFs, UserFacts};
use crate::policy::{Band, Matcher, Ops, Platform, Policy};

#[derive(Debug, clap::Args)]
pub struct DoctorArgs {
    /// A workspace root (repeatable; default: the current directory).
    #[arg(long = "workspace", value_name = "DIR")]
    pub workspaces: Vec<PathBuf>,
    /// The backend command whose state is checked (default: from
    /// ZCODE_ACP_BACKEND or the user config).
    #[arg(long, value_name = "COMMAND")]
    pub backend: Option<String>,
    /// Whose state is writable: claude, codex, gemini, qwen, opencode, vibe, zcode or none
    /// (default: read from the backend command).
    #[arg(long, value_name = "PROFILE")]
    pub backend_profile: Option<String>,
}

fn describe(m: &Matcher) -> String {
    match m {
        Matcher::Subpath(p) => format!("{}/**", p.display()),
        Matcher::Literal(p) => p.display().to_string(),
        Matcher::NamePrefix { dir, prefix } => format!("{}/{prefix}*", dir.display()),
        Matcher::ZcodeConfig { beneath } => format!("{}/**/.zcode[/acp/**]", beneath.display()),
    }
}

/// What turns the sandbox on for every project, if anything: the
/// environment or the user config (one that cannot be read arms it too).
fn global_switch() -> Result<Option<String>, String> {
    match crate::config::load_user_config() {
        Ok(user) => Ok(crate::config::sandbox_requested_globally(&user)),
        Err(e) => Err(e.to_string()),
    }
}

/// The first line `doctor` prints: whether the sandbox is on, and what
/// turns it on (or how to).
fn on_or_off(global: &Result<Option<String>, String>, armed_projects: &[&Path]) -> String {
    match global {
        Ok(Some(why)) => format!("sandbox: on ({why})"),
        Err(problem) => format!(
            "sandbox: on (the user config cannot be read, which arms it with no network: {problem})"
        ),
        Ok(None) if !armed_projects.is_empty() => format!(
            "sandbox: on for {} (its .zcode/acp/sandbox.json says \"enabled\": true); off for other projects",
            armed_projects
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Ok(None) => "sandbox: off (nothing turns it on: set ZCODE_ACP_SANDBOX=1 in the agent's env, \
             or put {\"enabled\": true} in a project's .zcode/acp/sandbox.json)"
            .to_owned(),
    }
}

/// Runs the doctor; returns whether everything that must hold held. Must
/// run before any thread (it probes namespaces in a forked child).
pub fn run(args: DoctorArgs) -> anyhow::Result<bool> {
    let workspaces = super::workspaces(&args.workspaces)?;
    let backend = super::backend_command(args.backend.as_deref())?;
    let super::Gathered {
        input,
        projects,
        backend: detected,
        managed,
    } = super::gather_as_user(
        Platform::Linux,
        &workspaces,
        &backend,
        args.backend_profile.as_deref(),
        &[],
    )?;
    let armed_projects: Vec<&Path> = projects
        .iter()
        .filter(|(_, eff)| eff.armed)
        .map(|(root, _)| root.as_path())
        .collect();
    println!("{}", on_or_off(&global_switch(), &armed_projects));
    if let Some(note) = crate::config::load_user_config()
        .ok()
        .and_then(|u| u.unknown_keys)
    {
        println!("{note}");
    }
    let uname = nix::sys::utsname::uname()?;
    println!(
        "kernel: {} {} ({})",
        uname.sysname().to_string_lossy(),
        uname.release().to_string_lossy(),
        uname.machine().to_string_lossy()
    );
    let uid = nix::unistd::getuid();
    println!(
        "user: uid {uid}{}",
        if uid.is_root() { " (root)" } else { "" }
    );
    let abi = crate::linux::landlock_abi();
    println!(
        "Landlock: {}",
        if abi > 0 {
            format!("ABI {abi}")
        } else {
            "not available".into()
        }
    );
    let available = namespaces_available();
    let ns = available.namespaces;
    println!(
        "namespaces: {}",
        if ns {
            "available"
        } else if uid.is_root() {
            "not available (root without CAP_SYS_ADMIN, as in many containers)"
        } else {
            "not available (user namespaces are disabled or restricted here)"
        }
    );
    let level = choose_level(ns, abi > 0);
    match &level {
        Ok(l) => println!("level that would be armed: {}", l.name()),
        Err(why) => println!("level that would be armed: none: {why}"),
    }

    println!(
        "\nbackend: {}",
        if backend.is_empty() {
            "none configured (pass --backend, or set ZCODE_ACP_BACKEND)".to_owned()
        } else {
            format!("`{}`", backend.join(" "))
        }
    );
    println!("backend profile: {}", detected.describe());
    let network = match level {
        Ok(level) => {
            use crate::confine::Enforce;
            let enforcer = crate::linux::enforce::LinuxEnforcer {
                level,
                landlock_abi: abi,
                network_namespace: level != crate::linux::exec::Level::LandlockOnly
                    && available.network,
            };
            enforcer.network(&input.network)
        }
        Err(_) => "not confined (nothing can be armed)".to_owned(),
    };
    println!("network: {network}");
    if matches!(
        input.network.egress,
        crate::policy::network::Egress::Hosts(_)
    ) && !input.network.listed.is_empty()
    {
        println!(
            "  reachable without a question: {}",
            input.network.listed.join(", ")
        );
    }
    for (root, eff) in &projects {
        println!(
            "\nworkspace {}: sandbox.json {}, armed by the project: {}",
            root.display(),
            eff.state,
            eff.armed
        );
        for why in &eff.ignored {
            println!("  ignored until approved: {why}");
        }
        let read = crate::config::project::read_with(root, false);
        if let Some(note) = crate::config::project::unknown_keys_note(root, &read.config) {
            println!("  {note}");
        }
    }
    let policy = Policy::build(&input);
    for (kind, title) in [
        (Band::Allow, "writable"),
        (Band::Protected, "protected (the user may grant)"),
        (Band::Island, "islands (never writable)"),
    ] {
        println!("\n{title}:");
        for rule in policy.rules_of(kind) {
            let what = if rule.ops == Ops::RemoveOnly {
                " (cannot be renamed or removed)"
            } else {
                ""
            };
            println!("  {}{what}: {}", describe(&rule.matcher), rule.why);
        }
    }
    let facts = UserFacts::for_project(&managed, input.roots.first().map(|r| r.path.as_path()));
    let plan = plan::build(&policy, &RealFs, &facts);
    println!("\nnot enforced on Linux:");
    for gap in &plan.gaps {
        println!("  {}: {}", gap.path.display(), gap.why);
    }

    if level.is_err() {
        println!("\nself-test: skipped (nothing can be armed)");
        return Ok(false);
    }
    Ok(self_test(&workspaces[0], &managed))
}

/// One write that must succeed (in the workspace) and one that must be
/// denied (in the managed root), run under `zcode-acp run` and checked on
/// disk.
fn self_test(ws: &Path, managed: &ManagedRoot) -> bool {
    let tag = format!("{:016x}", rand::random::<u64>());
    // Not hidden: `run`'s audit would take a hidden file for something a
    // tool reads, and undo it.
    let inside = ws.join(format!("zcode-doctor-{tag}"));
    let outside_dir = match managed.dir("doctor") {
        Ok(d) => d,
        Err(e) => {
            println!(
                "\nself-test: FAILED: cannot prepare {}: {e}",
                managed.path.display()
            );
            return false;
        }
    };
    let outside = outside_dir.join(tag);
    let script = format!(
        "echo ok > '{}' && echo inside-written; echo no > '{}' 2>/dev/null && echo outside-written; true",
        inside.display(),
        outside.display()
    );
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            println!("\nself-test: FAILED: {e}");
            return false;
        }
    };
    let out = Command::new(exe)
        .arg("run")
        .arg("--workspace")
        .arg(ws)
        .args(["--", "sh", "-c", &script])
        .output();
    let inside_ok = std::fs::read_to_string(&inside).is_ok_and(|t| t == "ok\n");
    let outside_denied = !outside.exists();
    let _ = std::fs::remove_file(&inside);
    let _ = std::fs::remove_file(&outside);
    println!("\nself-test:");
    println!(
        "  write inside the workspace: {}",
        if inside_ok {
            "written (as it must be)"
        } else {
            "FAILED: not written"
        }
    );
    println!(
        "  write to {}: {}",
        outside_dir.display(),
        if outside_denied {
            "denied (as it must be)"
        } else {
            "FAILED: it was written"
        }
    );
    if let Ok(out) = &out {
        if !out.status.success() {
            println!(
                "  the sandboxed command failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
    }
    let pass = inside_ok && outside_denied;
    println!("  {}", if pass { "PASS" } else { "FAIL" });
    pass
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_line_says_on_or_off_and_why() {
        let env = Ok(Some("ZCODE_ACP_SANDBOX=1".to_owned()));
        assert_eq!(on_or_off(&env, &[]), "sandbox: on (ZCODE_ACP_SANDBOX=1)");
        let project = Path::new("/home/u/p");
        assert!(on_or_off(&Ok(None), &[project]).starts_with("sandbox: on for /home/u/p ("));
        let off = on_or_off(&Ok(None), &[]);
        assert!(off.starts_with("sandbox: off (") && off.contains("ZCODE_ACP_SANDBOX=1"));
        assert!(on_or_off(&Err("bad".into()), &[]).starts_with("sandbox: on ("));
    }
}
