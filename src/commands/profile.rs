//! `zcode-acp profile`: print the sandbox profile a generation would get,
//! each rule with the reason it is there, or the decision for one path.

use std::path::PathBuf;

use crate::config::managed::ManagedRoot;
use crate::policy::discover::{gather, Sources};
use crate::policy::{Op, Platform, Policy};

#[derive(Debug, clap::Args)]
pub struct ProfileArgs {
    /// A workspace root (repeatable; default: the current directory).
    #[arg(long = "workspace", value_name = "DIR")]
    pub workspaces: Vec<PathBuf>,
    /// Which enforcement to print: `macos` (the Seatbelt profile).
    #[arg(long, default_value = "macos")]
    pub target: String,
    /// Print the decision for this path instead of the profile.
    #[arg(long, value_name = "PATH")]
    pub check: Option<PathBuf>,
    /// The backend command whose state directories are whitelisted
    /// (default: from ZCODE_ACP_BACKEND or the user config).
    #[arg(long, value_name = "COMMAND")]
    pub backend: Option<String>,
}

pub fn run(args: ProfileArgs) -> anyhow::Result<()> {
    let platform = match args.target.as_str() {
        "macos" => Platform::Macos,
        other => anyhow::bail!(
            "unknown target `{other}`: this version prints the macOS Seatbelt profile (--target macos); the Linux plan is not built yet"
        ),
    };
    let workspaces = if args.workspaces.is_empty() {
        vec![std::env::current_dir()?]
    } else {
        args.workspaces
    };
    let backend = match args.backend {
        Some(line) => line.split_whitespace().map(str::to_owned).collect(),
        None => crate::config::resolve_backend(&[])?.unwrap_or_default(),
    };
    let user = crate::config::load_user_config()?;
    let managed = ManagedRoot::user_default()?;
    let (input, projects) = gather(&Sources {
        platform,
        workspaces: &workspaces,
        backend: &backend,
        state_paths: &user.sandbox.state_paths,
        once_allows: &[],
        managed: &managed,
        inspect: true,
    })?;
    let policy = Policy::build(&input);
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
        None => print!("{}", crate::seatbelt::build_profile(&policy)?),
    }
    Ok(())
}
