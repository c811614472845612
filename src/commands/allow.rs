//! `zcode-acp allow PATH`, `zcode-acp deny PATH` and `zcode-acp approve`:
//! the project's sandbox.json changed from a terminal, outside the
//! sandbox, so approved by definition (the ledger records it in the same
//! step).

use std::path::PathBuf;

use crate::config::managed::ManagedRoot;
use crate::config::project::{self, List};
use crate::policy::discover::{gather, Sources};
use crate::policy::{resolve_real, Band, Op, Platform, Policy};

#[derive(Debug, clap::Args)]
pub struct ListArgs {
    /// The path to allow (or deny) writes beneath (a relative one is taken
    /// from the workspace).
    pub path: PathBuf,
    /// The project whose sandbox.json records it (default: the current directory).
    #[arg(long, value_name = "DIR")]
    pub workspace: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct ApproveArgs {
    /// The project whose sandbox.json is approved as it is now (default: the current directory).
    #[arg(long, value_name = "DIR")]
    pub workspace: Option<PathBuf>,
}

fn workspace(given: &Option<PathBuf>) -> anyhow::Result<PathBuf> {
    let ws = super::workspaces(given.as_slice())?.remove(0);
    Ok(resolve_real(&ws)?)
}

/// Adds PATH to the allow (or deny) list. Returns an error that says why
/// when it must not be, or cannot be, recorded.
pub fn run(list: List, args: ListArgs) -> anyhow::Result<()> {
    let root = workspace(&args.workspace)?;
    // Relative to the project it is recorded for, as an entry in its file
    // would be read, not to wherever the terminal happens to be.
    let path = resolve_real(&root.join(&args.path))?;
    let managed = ManagedRoot::user_default()?;
    if list == List::Allow {
        let home = crate::policy::offerable::real_home();
        let input = gather(&Sources {
            platform: Platform::current(),
            workspaces: std::slice::from_ref(&root),
            backend: &[],
            state: &Default::default(),
            once_allows: &[],
            managed: &managed,
        })?
        .input;
        let decision = Policy::build(&input).evaluate_resolved(&path, Op::Write);
        // What the editor would never offer, a terminal cannot grant.
        if let Some(why) = crate::policy::offerable::refusal(&path, &decision, home.as_deref()) {
            let hint = if crate::policy::offerable::opens_everything(&path, home.as_deref()) {
                "open it as a workspace if you really mean it"
            } else if decision.kind == Band::Protected {
                "remove it from the project's deny entries first, if you mean it"
            } else {
                "the editor never offers it either; make such changes yourself, outside the agent"
            };
            anyhow::bail!("refusing to allow {}: {why}; {hint}", path.display());
        }
    }
    let entry = path.to_string_lossy().into_owned();
    if let Err(e) = project::append(&root, list, &entry, &managed) {
        anyhow::bail!(
            "could not record it in {}: {e}; nothing was changed",
            project::config_path(&root).display()
        );
    }
    let verb = match list {
        List::Allow => "allowed",
        List::Deny => "never allowed",
    };
    println!(
        "{verb}: {entry} (recorded in {}, approved)",
        project::config_path(&root).display()
    );
    Ok(())
}

/// Approves the project's sandbox.json as it is now.
pub fn approve(args: ApproveArgs) -> anyhow::Result<()> {
    let root = workspace(&args.workspace)?;
    let managed = ManagedRoot::user_default()?;
    project::approve_current(&root, &managed)?;
    println!(
        "approved {} as it is now",
        project::config_path(&root).display()
    );
    Ok(())
}
