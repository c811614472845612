//! What a policy is gathered from for this user, as the bridge would
//! gather it: the workspaces named on a command line, the user config, the
//! managed root. Shared by the command line and `run_code`.

use std::path::PathBuf;

/// The `--workspace` arguments made absolute; the current directory when
/// none was given. A workspace that is not an existing directory is an
/// error that names it: judging a typo would judge nothing.
pub fn workspaces(given: &[PathBuf]) -> anyhow::Result<Vec<PathBuf>> {
    if given.is_empty() {
        return Ok(vec![std::env::current_dir()?]);
    }
    given
        .iter()
        .map(|w| {
            let abs = crate::policy::resolve::absolutize(w)?;
            if !abs.is_dir() {
                anyhow::bail!(
                    "the workspace {} {}; give an existing directory with --workspace",
                    abs.display(),
                    if abs.exists() {
                        "is not a directory"
                    } else {
                        "does not exist"
                    }
                );
            }
            Ok(abs)
        })
        .collect()
}

/// The backend command: `given` (a command line, split on whitespace), else
/// the one the bridge would run (`ZCODE_ACP_BACKEND`, the user config),
/// else none.
pub fn backend_command(given: Option<&str>) -> anyhow::Result<Vec<String>> {
    Ok(match given {
        Some(line) => line.split_whitespace().map(str::to_owned).collect(),
        None => crate::config::resolve_backend(&[])?.unwrap_or_default(),
    })
}

/// What a policy for `workspaces` is built from, with this user's config
/// and managed root, as the bridge would gather it. Writes nothing (see
/// `config::project::prepare` for what arming records).
pub fn gather_as_user(
    platform: crate::policy::Platform,
    workspaces: &[PathBuf],
    backend: &[String],
    backend_profile: Option<&str>,
    once_allows: &[PathBuf],
) -> anyhow::Result<Gathered> {
    let user = crate::config::load_user_config()?;
    let state = crate::policy::backends::state_settings(&user, backend_profile)
        .map_err(anyhow::Error::msg)?;
    let managed = crate::config::managed::ManagedRoot::user_default()?;
    let gathered = crate::policy::discover::gather(&crate::policy::discover::Sources {
        platform,
        workspaces,
        backend,
        state: &state,
        once_allows,
        managed: &managed,
    })?;
    Ok(Gathered {
        input: gathered.input,
        projects: gathered.projects,
        backend: gathered.backend,
        managed,
    })
}

pub struct Gathered {
    pub input: crate::policy::PolicyInput,
    /// Each workspace's project config as it takes effect.
    pub projects: Vec<(PathBuf, crate::config::project::Effective)>,
    /// Which backend profiles apply, and why.
    pub backend: crate::policy::backends::Detected,
    pub managed: crate::config::managed::ManagedRoot,
}
