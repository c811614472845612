//! `zcode-acp profile`: print the sandbox profile a generation would get,
//! each rule with the reason it is there, or the decision for one path.

use std::path::PathBuf;

use crate::policy::{Op, Platform, Policy};

#[derive(Debug, clap::Args)]
pub struct ProfileArgs {
    /// A workspace root (repeatable; default: the current directory).
    #[arg(long = "workspace", value_name = "DIR")]
    pub workspaces: Vec<PathBuf>,
    /// Which enforcement to print: `macos` (the Seatbelt profile) or `linux`
    /// (the mount plan and Landlock rules, in order). Default: this system.
    #[arg(long)]
    pub target: Option<String>,
    /// Print the decision for this path instead of the profile.
    #[arg(long, value_name = "PATH")]
    pub check: Option<PathBuf>,
    /// The backend command whose state directories are whitelisted
    /// (default: from ZCODE_ACP_BACKEND or the user config).
    #[arg(long, value_name = "COMMAND")]
    pub backend: Option<String>,
    /// Whose state is writable: claude, codex, gemini, qwen, opencode, vibe, zcode or none
    /// (default: read from the backend command).
    #[arg(long, value_name = "PROFILE")]
    pub backend_profile: Option<String>,
}

pub fn run(args: ProfileArgs) -> anyhow::Result<()> {
    let target = args.target.clone().unwrap_or_else(|| {
        if cfg!(target_os = "linux") {
            "linux"
        } else {
            "macos"
        }
        .into()
    });
    let platform = match target.as_str() {
        "macos" => Platform::Macos,
        "linux" if cfg!(target_os = "linux") => Platform::Linux,
        "linux" => anyhow::bail!(
            "the Linux plan can only be built on Linux (it reads the mount table and devices)"
        ),
        other => anyhow::bail!("unknown target `{other}`: use --target macos or --target linux"),
    };
    let workspaces = super::workspaces(&args.workspaces)?;
    let backend = super::backend_command(args.backend.as_deref())?;
    let super::Gathered {
        mut input,
        projects,
        backend,
        managed,
    } = super::gather_as_user(
        platform,
        &workspaces,
        &backend,
        args.backend_profile.as_deref(),
        &[],
    )?;
    eprintln!("note: backend profile: {}", backend.describe());
    eprintln!("note: network: {}", input.network.describe());
    let policy = Policy::build_resolving_links(&mut input, crate::policy::build::link_chain);
    for (root, eff) in &projects {
        for why in &eff.ignored {
            eprintln!("note: {}: {why}", root.display());
        }
    }
    match args.check {
        Some(path) => {
            let path = if path.is_absolute() {
                path
            } else {
                std::env::current_dir()?.join(path)
            };
            for op in [Op::Write, Op::Remove] {
                let (real, d) = policy.evaluate(&path, op)?;
                let verb = match op {
                    Op::Write => "write ",
                    Op::Remove => "remove",
                };
                println!(
                    "{verb} {}: {} ({}){}",
                    real.display(),
                    if d.allowed { "allowed" } else { "denied" },
                    d.kind,
                    d.rule
                        .map(|r| format!(": {r}"))
                        .unwrap_or_else(|| ": no rule allows it".into())
                );
                if d.dangerous {
                    println!("       note: allowed because a root is / or the home directory, which makes the whole tree writable");
                }
            }
        }
        None if platform == Platform::Macos => {
            print!("{}", crate::seatbelt::build_profile(&policy)?)
        }
        None => print_linux_plan(&policy, &managed, &input),
    }
    Ok(())
}

#[cfg(target_os = "linux")]
fn print_linux_plan(
    policy: &Policy,
    managed: &crate::config::managed::ManagedRoot,
    input: &crate::policy::PolicyInput,
) {
    use crate::linux::plan::{self, RealFs, Step, UserFacts};
    let facts = UserFacts::for_project(managed, input.roots.first().map(|r| r.path.as_path()));
    let plan = plan::build(policy, &RealFs, &facts);
    let section = |title: &str, steps: &[Step]| {
        println!("# {title}");
        for s in steps {
            println!("{}\t# {}", s.path.display(), s.why);
        }
        println!();
    };
    println!(
        "# The Linux plan, in the order it is applied (after `/` is made private and read-only).\n"
    );
    section(
        "1. bound onto themselves, writable (mounts read-only on the host stay read-only)",
        &plan.writable,
    );
    section(
        "2. copy-on-write: the cache as the lower layer, the sandbox's writes in a layer of its own (~/.zcode-acp/layers)",
        &plan.layered,
    );
    section("3. a private tmpfs each", &plan.tmpfs);
    section("4. mountpoints, so they cannot be renamed", &plan.pins);
    section(
        "5. read-only binds (protected paths and islands)",
        &plan.readonly,
    );
    section(
        "6. covered (services that would write for the caller)",
        &plan.hidden,
    );
    println!("# 7. Landlock: write rights beneath these directories");
    for d in &plan.landlock_dirs {
        println!("{}", d.display());
    }
    println!("\n# 8. Landlock: write rights on these files");
    for f in &plan.landlock_files {
        println!("{}", f.display());
    }
    println!("\n# 9. entries the sandbox's supervisor makes for the agent (the directory stays read-only)");
    for s in &plan.supervised {
        for prefix in &s.prefixes {
            println!("{}/{prefix}*", s.dir.display());
        }
    }
    println!();
    section("not enforced on Linux", &plan.gaps);
}

#[cfg(not(target_os = "linux"))]
fn print_linux_plan(
    _policy: &Policy,
    _managed: &crate::config::managed::ManagedRoot,
    _input: &crate::policy::PolicyInput,
) {
    unreachable!("refused above on other systems")
}
