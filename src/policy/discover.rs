//! Reading the machine: repositories under the roots, the backend's own
//! state directories, temp and cache directories. Everything found is
//! resolved to real paths before it reaches the (pure) builder.

use std::path::{Path, PathBuf};

#[cfg(test)]
use std::collections::HashMap;

use super::backends::{self, Detected, StateSettings};
use super::build::{Platform, PolicyInput, RootInput, Writable};
use super::env::{cache_grant, dir_grant};
pub use super::env::{expand_home, Env, ProcessEnv};
pub use super::repos::{find_repos, find_repos_quick, repo_at_quick, repos_of_work_trees};
use super::{resolve_real, Matcher, ResolveError};
use crate::config::managed::ManagedRoot;
use crate::config::project::{self, Effective};

/// What a policy is gathered from.
pub struct Sources<'a> {
    pub platform: Platform,
    pub workspaces: &'a [PathBuf],
    pub backend: &'a [String],
    /// Which backend profile applies, and `sandbox.statePaths`.
    pub state: &'a StateSettings,
    pub once_allows: &'a [PathBuf],
    pub managed: &'a ManagedRoot,
}

/// What [`gather`] found.
pub struct Gathered {
    pub input: PolicyInput,
    /// Each root's effective project config.
    pub projects: Vec<(PathBuf, Effective)>,
    /// Which backend profiles apply, and why.
    pub backend: Detected,
}

/// Reads everything a policy needs from the machine, writing nothing.
pub fn gather(src: &Sources<'_>) -> Result<Gathered, ResolveError> {
    let home = dirs::home_dir().unwrap_or_else(|| PathBuf::from("/"));
    let home = resolve_real(&home)?;
    let mut roots = Vec::new();
    let mut projects = Vec::new();
    for ws in src.workspaces {
        let path = resolve_real(ws)?;
        // Only read: what a project records is `project::prepare`'s.
        let mut eff = project::inspect(&path, src.managed);
        let (rules, refused) = project_rules(&eff.rules, &home);
        for why in &refused {
            tracing::warn!(root = %path.display(), "{why}");
        }
        eff.ignored.extend(refused);
        roots.push(RootInput {
            path: path.clone(),
            project: rules,
            repos: find_repos(&path),
        });
        projects.push((path, eff));
    }
    let once_allows = src
        .once_allows
        .iter()
        .map(|p| resolve_real(p))
        .collect::<Result<Vec<_>, _>>()?;
    let backend = backends::detect(
        src.backend,
        &src.state.choice,
        &backends::RealLook,
        &backends::home_spellings(&home),
    );
    let input = PolicyInput {
links: Vec::new(),
        platform: src.platform,
        home: home.clone(),
        roots,
        backend_state: backend_state(
            &backend,
            &ProcessEnv,
            &home,
            &src.state.extra,
            remembered(&backend, src.state),
        ),
        temp_and_caches: temp_and_caches(src.platform, &ProcessEnv, &home),
        once_allows,
        profile_dir: None,
        managed_root: resolve_real(&src.managed.path)?,
        // The user's table, widened by each root's approved one (a
        // generation has one network for all its roots), as far as the
        // limits allow: a root whose ports or hosts would pass them is left
        // out, and the log says so.
        network: projects
            .iter()
            .filter_map(|(root, eff)| Some((root, eff.network.as_ref()?)))
            .fold(src.state.network.clone(), |table, (root, project)| {
                let wider = table.clone().widened_by(project);
                match wider.within_limits() {
                    Ok(()) => wider,
                    Err(why) => {
                        tracing::warn!(root = %root.display(), "the project's network table is left out: with it, {why}; shorten the lists in the user config or the project's sandbox.json");
                        table
                    }
                }
            })
            // What the agent needs, and the registries: no question.
            .listing(super::egress::reachable(&backend.profiles, &ProcessEnv)),
    };
    Ok(Gathered {
        input,
        projects,
        backend,
    })
}

/// A project's approved entries resolved to real paths, and what was
/// refused, in words: an entry that is not an absolute path or cannot be
/// resolved, and an allow entry for a place that is never granted.
pub fn project_rules(
    entries: &project::Entries,
    home: &Path,
) -> (super::build::ProjectRules, Vec<String>) {
    let mut refused = Vec::new();
    let mut real = |list: &str, entry: &str| {
        let p = Path::new(entry);
        let resolved = if p.is_absolute() {
            resolve_real(p).map_err(|e| e.to_string())
        } else {
            Err("not an absolute path".to_owned())
        };
        resolved
            .map_err(|why| refused.push(format!("{list} entry `{entry}`: {why}")))
            .ok()
    };
    let allow: Vec<PathBuf> = entries
        .allow
        .iter()
        .filter_map(|e| real("allow", e))
        .collect();
    let deny = entries
        .deny
        .iter()
        .filter_map(|e| real("deny", e))
        .collect();
    let allow = allow
        .into_iter()
        .filter(|p| match super::offerable::never_granted(p, Some(home)) {
            Some(why) => {
                refused.push(format!(
                    "allow entry `{}` is never granted: {why}",
                    p.display()
                ));
                false
            }
            None => true,
        })
        .collect();
    let rules = super::build::ProjectRules {
        allow,
        deny,
        strict_git: entries.strict_git,
    };
    (rules, refused)
}

/// The state locations the user allowed the detected agent in the editor
/// ("for this agent, always"), remembered in the user config.
fn remembered<'a>(detected: &Detected, state: &'a backends::StateSettings) -> &'a [PathBuf] {
    detected
        .agent
        .as_ref()
        .and_then(|a| state.remembered.get(a))
        .map_or(&[], Vec::as_slice)
}

/// The backend's own state: what its profiles write (see
/// [`backends`]), `extra`, the user config's list for backends no profile
/// knows, and `remembered`, what the user allowed this agent.
pub fn backend_state(
    detected: &Detected,
    env: &dyn Env,
    home: &Path,
    extra: &[PathBuf],
    remembered: &[PathBuf],
) -> Vec<Writable> {
    let mut grants = backends::grants(&detected.profiles, env, home);
    for p in extra {
        let p = expand_home(p, home);
        grants.extend(dir_grant(
            &p,
            home,
            "backend state listed in the user config",
        ));
    }
    let agent = detected.agent.as_deref().unwrap_or("the agent");
    for p in remembered {
        let p = expand_home(p, home);
        grants.extend(dir_grant(
            &p,
            home,
            &format!("the state of `{agent}`, which you allowed it (sandbox.agentState in the user config)"),
        ));
    }
    grants
}

/// System temp and regenerable caches. Tools write there constantly and
/// nothing in them is worth protecting.
pub fn temp_and_caches(platform: Platform, env: &dyn Env, home: &Path) -> Vec<Writable> {
    let mut grants = Vec::new();
    if let Some(tmpdir) = env.var("TMPDIR") {
        if let Some(g) = dir_grant(Path::new(&tmpdir), home, "$TMPDIR") {
            if platform == Platform::Macos {
                // /var/folders/xx/yyyy/T: tools write the sibling C/ cache.
                if let Matcher::Subpath(real) = &g.matcher {
                    if let Some(parent) = real.parent() {
                        grants.extend(dir_grant(
                            parent,
                            home,
                            "the parent of $TMPDIR (its C/ cache sibling)",
                        ));
                    }
                }
            }
            grants.push(g);
        }
    }
    grants.extend(dir_grant(Path::new("/tmp"), home, "system temp (/tmp)"));
    grants.extend(dir_grant(
        Path::new("/var/tmp"),
        home,
        "system temp (/var/tmp)",
    ));
    let cache = env
        .var("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| home.join(".cache"));
    grants.extend(cache_grant(
        &cache,
        home,
        "the user cache ($XDG_CACHE_HOME or ~/.cache; pip lives here on Linux)",
    ));
    if platform == Platform::Macos {
        grants.extend(cache_grant(
            &home.join("Library/Caches"),
            home,
            "~/Library/Caches (pip lives here on macOS)",
        ));
    }
    grants.extend(cache_grant(
        &home.join(".npm"),
        home,
        "npm's cache (~/.npm)",
    ));
    let cargo = env
        .var("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| home.join(".cargo"));
    grants.extend(cache_grant(
        &cargo.join("registry"),
        home,
        "cargo's download cache ($CARGO_HOME/registry)",
    ));
    grants.extend(cache_grant(
        &cargo.join("git"),
        home,
        "cargo's git checkouts cache ($CARGO_HOME/git)",
    ));
    grants
}

/// Creates the missing state and cache directories of a policy input
/// before arming: on Linux a directory that does not exist when the sandbox
/// is armed cannot be made writable, and agents and tools (npm, pip) break
/// when their state or cache directory cannot be created. So a new user's
/// first sandboxed session behaves like the hundredth. Backend state is
/// created wherever it is configured; caches only in the home directory.
/// Each is made mode 0700 by this user, never through a symlink.
pub fn create_writable_dirs(input: &PolicyInput) {
    for g in &input.backend_state {
        if let Matcher::Subpath(dir) = &g.matcher {
            create_missing(dir, &g.why, true);
        }
    }
    for g in &input.temp_and_caches {
        if let Matcher::Subpath(dir) = &g.matcher {
            if dir.starts_with(&input.home) && *dir != input.home {
                create_missing(dir, &g.why, false);
            }
        }
    }
}

fn create_missing(dir: &Path, why: &str, state: bool) {
    if std::fs::symlink_metadata(dir).is_ok() {
        return;
    }
    match crate::config::atomic::create_real_dir_path(dir, 0o700) {
        Ok(()) => tracing::debug!(dir = %dir.display(), "created before arming: {why}"),
        // The agent will fail to save its state: say so where it can be seen.
        Err(e) if state => {
            tracing::warn!(dir = %dir.display(), "could not create {why} before arming ({e}); the agent may fail to save its state")
        }
        Err(e) => tracing::debug!(dir = %dir.display(), "could not create {why}: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn detected(names: &[backends::Profile]) -> Detected {
        Detected {
            profiles: names.to_vec(),
            why: String::new(),
            agent: None,
        }
    }

    /// Everything under `dir`: path, size and modification time.
    fn tree(dir: &Path) -> Vec<(PathBuf, u64, Option<std::time::SystemTime>)> {
        let mut out = Vec::new();
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                let m = e.path().symlink_metadata().unwrap();
                if m.is_dir() {
                    stack.push(e.path());
                }
                out.push((e.path(), m.len(), m.modified().ok()));
            }
        }
        out.sort();
        out
    }

    /// Reads do not write: gathering a policy for a project whose
    /// sandbox.json turns the sandbox on (what `prepare` would record) and
    /// one with none (whose template `prepare` would make) touches neither
    /// the projects nor the managed root.
    #[test]
    fn gathering_a_policy_writes_nothing() {
        let t = tempfile::tempdir().unwrap();
        let t = resolve_real(t.path()).unwrap();
        let (on, bare, managed) = (t.join("on"), t.join("bare"), t.join("managed"));
        std::fs::create_dir_all(on.join(".zcode/acp")).unwrap();
        std::fs::write(on.join(".zcode/acp/sandbox.json"), r#"{"enabled": true}"#).unwrap();
        std::fs::create_dir_all(&bare).unwrap();
        std::fs::create_dir_all(&managed).unwrap();
        let managed_root = ManagedRoot::new(managed.clone());
        let before = tree(&t);
        let gathered = gather(&Sources {
            platform: Platform::Linux,
            workspaces: &[on.clone(), bare.clone()],
            backend: &[],
            state: &StateSettings::default(),
            once_allows: &[],
            managed: &managed_root,
        })
        .unwrap();
        assert!(gathered.projects[0].1.armed);
        assert_eq!(tree(&t), before, "gathering a policy wrote files");
        // Preparing, the one place that writes, does.
        crate::config::project::prepare(&bare, &managed_root);
        assert!(bare.join(".zcode/acp/sandbox.json").exists());
    }

    #[test]
    fn backend_profiles_follow_the_env() {
        use backends::Profile::*;
        let home = tempfile::tempdir().unwrap();
        let home = std::fs::canonicalize(home.path()).unwrap();
        let grants = backend_state(&detected(&[Codex]), &env(&[]), &home, &[], &[]);
        assert_eq!(grants[0].matcher, Matcher::Subpath(home.join(".codex")));
        let grants = backend_state(
            &detected(&[Codex]),
            &env(&[("CODEX_HOME", "/opt/codex")]),
            &home,
            &[],
            &[],
        );
        assert_eq!(grants[0].matcher, Matcher::Subpath("/opt/codex".into()));
        let grants = backend_state(&detected(&[Claude]), &env(&[]), &home, &[], &[]);
        assert_eq!(grants.len(), 2);
        let grants = backend_state(&detected(&[Gemini]), &env(&[]), &home, &[], &[]);
        assert_eq!(grants[0].matcher, Matcher::Subpath(home.join(".gemini")));
        let grants = backend_state(&detected(&[Zcode]), &env(&[]), &home, &[], &[]);
        assert_eq!(
            grants[0].matcher,
            Matcher::Subpath(home.join(".zcode-shell-agent"))
        );
        assert!(
            matches!(&grants[1].matcher, Matcher::NamePrefix { prefix, .. } if prefix == ".zcode")
        );
        assert!(backend_state(&detected(&[]), &env(&[]), &home, &[], &[]).is_empty());
    }

    #[test]
    fn a_profile_never_widens_to_the_home_directory() {
        let home = tempfile::tempdir().unwrap();
        let home = std::fs::canonicalize(home.path()).unwrap();
        let h = home.to_str().unwrap();
        assert!(backend_state(
            &detected(&[backends::Profile::Codex]),
            &env(&[("CODEX_HOME", h)]),
            &home,
            &[],
            &[]
        )
        .is_empty());
        assert!(backend_state(
            &detected(&[]),
            &env(&[]),
            &home,
            &["~".into(), "/".into()],
            &[]
        )
        .is_empty());
        assert!(backend_state(
            &detected(&[]),
            &env(&[]),
            &home,
            &[],
            &["~".into(), "/".into()]
        )
        .is_empty());
        let caches = temp_and_caches(
            Platform::Linux,
            &env(&[("XDG_CACHE_HOME", h), ("TMPDIR", h)]),
            &home,
        );
        assert!(caches
            .iter()
            .all(|g| g.matcher != Matcher::Subpath(home.clone())));
    }

    #[test]
    fn a_first_run_finds_every_state_directory_made() {
        let home = tempfile::tempdir().unwrap();
        let home = std::fs::canonicalize(home.path()).unwrap();
        let other = tempfile::tempdir().unwrap();
        let codex_home = std::fs::canonicalize(other.path())
            .unwrap()
            .join("deep/codex");
        let input = PolicyInput {
            links: Vec::new(),
            platform: Platform::Linux,
            home: home.clone(),
            roots: vec![],
            backend_state: backend_state(
                &detected(&[backends::Profile::Claude, backends::Profile::Codex]),
                &env(&[("CODEX_HOME", codex_home.to_str().unwrap())]),
                &home,
                &[],
                &[],
            ),
            temp_and_caches: temp_and_caches(Platform::Linux, &env(&[]), &home),
            once_allows: vec![],
            profile_dir: None,
            managed_root: home.join(".zcode-acp"),
            network: Default::default(),
        };
        create_writable_dirs(&input);
        for dir in [home.join(".claude"), codex_home, home.join(".cache")] {
            let meta = std::fs::symlink_metadata(&dir).unwrap();
            assert!(meta.is_dir(), "{}", dir.display());
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(meta.permissions().mode() & 0o077, 0, "{}", dir.display());
        }
        // The settings file is the agent's to create, not ours.
        assert!(!home.join(".claude.json").exists());
    }

    #[test]
    fn project_entries_are_resolved_and_never_granted_places_refused() {
        let t = tempfile::tempdir().unwrap();
        let home = std::fs::canonicalize(t.path()).unwrap();
        std::fs::create_dir_all(home.join(".ssh")).unwrap();
        std::fs::create_dir_all(home.join("shared")).unwrap();
        let entries = project::Entries {
            allow: vec![
                home.join("shared").display().to_string(),
                home.join(".ssh").display().to_string(),
                "relative/dir".into(),
            ],
            deny: vec![home.join("shared/secret").display().to_string()],
            strict_git: true,
        };
        let (rules, refused) = project_rules(&entries, &home);
        assert_eq!(rules.allow, vec![home.join("shared")]);
        assert_eq!(rules.deny, vec![home.join("shared/secret")]);
        assert!(rules.strict_git);
        assert_eq!(refused.len(), 2, "{refused:?}");
        assert!(refused
            .iter()
            .any(|r| r.contains(".ssh") && r.contains("never granted")));
        assert!(refused
            .iter()
            .any(|r| r.contains("relative/dir") && r.contains("absolute")));
    }
}
