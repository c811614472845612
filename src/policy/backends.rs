//! Which agent backend is being armed, and which state of its own it may
//! write. A real agent that cannot write its state breaks: Claude's
//! `~/.claude` and `~/.claude.json`, codex's `$CODEX_HOME`, gemini's
//! `~/.gemini`, and the rest of `agents::AGENTS`.
//!
//! The profile is read from how the agent is launched, the way editors
//! launch it (`launch`): a bare binary (`claude-agent-acp`, `codex-acp`,
//! `gemini --experimental-acp`), `npx [-y] <package>[@version]`, `node
//! <prefix>/<package>/dist/index.js`, an npm `.bin` shim (a symlink, or a
//! pnpm shell script), a uv tool and a wrapper script that `exec`s it.
//! Only the launch chain counts, never an argument's words. An explicit
//! choice overrides the guess: `--backend-profile`,
//! `ZCODE_ACP_BACKEND_PROFILE` or `sandbox.backendProfile` in the user
//! config.

use std::path::{Path, PathBuf};

use super::build::Writable;
use super::env::Env;
use super::{resolve_real, Matcher};
use crate::config::{UserConfig, BACKEND_PROFILE_ENV};

pub use super::agents::Profile;
pub use super::launch::{Look, RealLook};

/// The user's explicit choice, or none (guess from the command).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Choice {
    #[default]
    Guess,
    /// `profile` is None for "none": no backend state at all.
    Explicit {
        profile: Option<Profile>,
        by: String,
    },
}

/// A backend profile name no profile has.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown backend profile `{value}` ({by}): use {} or none",
    Profile::names()
)]
pub struct UnknownProfile {
    pub value: String,
    pub by: String,
}

impl Choice {
    /// Parses a profile's name (see [`Profile::names`]) or `none`; `by` says
    /// where the value came from, for the explanation.
    pub fn parse(value: &str, by: &str) -> Result<Choice, UnknownProfile> {
        let v = value.trim().to_ascii_lowercase();
        let profile = match v.as_str() {
            "none" => None,
            other => Some(
                Profile::ALL
                    .into_iter()
                    .find(|p| p.name() == other)
                    .ok_or_else(|| UnknownProfile {
                        value: value.to_owned(),
                        by: by.to_owned(),
                    })?,
            ),
        };
        Ok(Choice::Explicit {
            profile,
            by: by.to_owned(),
        })
    }
}

/// What a backend may write of its own, as configured by the user.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StateSettings {
    pub choice: Choice,
    /// `sandbox.statePaths`: state directories of backends no profile knows.
    pub extra: Vec<PathBuf>,
    /// `sandbox.agentState`: state directories the user allowed an agent
    /// no profile knows, by the agent's name (see `launch::agent_name`).
    pub remembered: std::collections::BTreeMap<String, Vec<PathBuf>>,
    /// The user config's `network` table (it comes to every arming with
    /// the state settings, from the same file).
    pub network: super::network::NetworkPolicy,
}

/// The profiles applied and why, in words for the editor and `doctor`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Detected {
    pub profiles: Vec<Profile>,
    pub why: String,
    /// The agent's name, as its launch chain says (see
    /// `launch::agent_name`).
    pub agent: Option<String>,
}

impl Detected {
    /// `claude (why)`, or `none (why)`.
    pub fn describe(&self) -> String {
        let names: Vec<&str> = self.profiles.iter().map(|p| p.name()).collect();
        let names = if names.is_empty() {
            "none".to_owned()
        } else {
            names.join(" + ")
        };
        format!("{names} ({})", self.why)
    }
}

/// Decides which profiles apply to `argv`, from its launch chain (see
/// `launch`). `homes` are the spellings of the home directory to leave
/// out of paths.
pub fn detect(argv: &[String], choice: &Choice, look: &dyn Look, homes: &[PathBuf]) -> Detected {
    let agent = super::launch::agent_name(argv, look, homes);
    if let Choice::Explicit { profile, by } = choice {
        return Detected {
            profiles: profile.iter().copied().collect(),
            why: format!("chosen by {by}"),
            agent,
        };
    }
    let found = super::launch::launched(argv, look, homes);
    if found.is_empty() {
        return Detected {
            profiles: Vec::new(),
            why: format!(
                "the command launches none of the agents zcode-acp knows ({}); where it keeps \
                 state of its own, the editor asks once per place, or set sandbox.statePaths in \
                 the user config",
                Profile::names()
            ),
            agent,
        };
    }
    let why = found
        .iter()
        .map(|(p, why)| format!("{}: {why}", p.name()))
        .collect::<Vec<_>>()
        .join("; ");
    Detected {
        profiles: found.into_iter().map(|(p, _)| p).collect(),
        why,
        agent,
    }
}

/// A state directory the backend may write, created before arming.
fn state_dir(path: &Path, home: &Path, why: &str) -> Option<Writable> {
    super::env::dir_grant(path, home, why)
}

/// The state each profile writes (its row of `agents::AGENTS`). `env` is
/// the agent's environment (it inherits the bridge's).
pub fn grants(profiles: &[Profile], env: &dyn Env, home: &Path) -> Vec<Writable> {
    let mut grants = Vec::new();
    for p in profiles {
        let agent = p.agent();
        for d in agent.dirs {
            let dir = match d.env.and_then(|v| env.var(v)) {
                Some(moved) => PathBuf::from(moved).join(d.under_env),
                None => home.join(d.home),
            };
            grants.extend(state_dir(&dir, home, agent.described));
        }
        for n in agent.home_names {
            if n.unless_env.is_some_and(|v| env.var(v).is_some()) {
                continue;
            }
            grants.push(Writable {
                matcher: Matcher::NamePrefix {
                    dir: home.to_path_buf(),
                    prefix: n.prefix.into(),
                },
                why: format!("{} (~/{}*)", agent.described, n.prefix),
                layered: false,
            });
        }
    }
    grants
}

/// Both spellings of the home directory: as given and real.
pub fn home_spellings(home: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(h) = dirs::home_dir() {
        out.push(h);
    }
    out.push(home.to_path_buf());
    if let Ok(real) = resolve_real(home) {
        out.push(real);
    }
    out.dedup();
    out
}

/// What the backend may write of its own: the explicit profile choice
/// (`cli` first, then `ZCODE_ACP_BACKEND_PROFILE`, then
/// `sandbox.backendProfile`) and `sandbox.statePaths`. An unknown profile
/// name is an error that says which values exist.
pub fn state_settings(
    user: &UserConfig,
    cli: Option<&str>,
) -> Result<StateSettings, UnknownProfile> {
    let env = std::env::var(BACKEND_PROFILE_ENV)
        .ok()
        .filter(|v| !v.trim().is_empty());
    let choice = if let Some(v) = cli {
        Choice::parse(v, "--backend-profile")?
    } else if let Some(v) = env {
        Choice::parse(&v, BACKEND_PROFILE_ENV)?
    } else if let Some(v) = &user.sandbox.backend_profile {
        Choice::parse(v, "sandbox.backendProfile in the user config")?
    } else {
        Choice::Guess
    };
    Ok(StateSettings {
        choice,
        extra: user.sandbox.state_paths.clone(),
        remembered: user.sandbox.agent_state.clone(),
        network: user_network(user),
    })
}

/// The user's network table. One that cannot be read fails closed: it
/// may have been an egress list, and the defaults would open the whole
/// internet, so nothing is reachable until it is fixed, and the log (and
/// the editor, see [`network_problem`]) says why.
fn user_network(user: &UserConfig) -> super::network::NetworkPolicy {
    let Some(value) = &user.network else {
        return Default::default();
    };
    super::network::NetworkPolicy::parse(value).unwrap_or_else(|why| {
        tracing::error!("the user config's network table cannot be read ({why}); until it is fixed, the sandbox reaches no network");
        super::network::NetworkPolicy::closed()
    })
}

/// Why the user config's network table cannot be read, if it cannot.
pub fn network_problem(user: &UserConfig) -> Option<String> {
    let why = super::network::NetworkPolicy::parse(user.network.as_ref()?).err()?;
    Some(format!(
        "the user config's network table cannot be read ({why}); until it is fixed, the sandbox reaches no network"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn a_network_table_that_cannot_be_read_closes_the_network() {
        let user: UserConfig =
            serde_json::from_str(r#"{"network": {"egress": ["a.com", "not a host"]}}"#).unwrap();
        let net = user_network(&user);
        assert_eq!(net, crate::policy::network::NetworkPolicy::closed());
        assert!(network_problem(&user).unwrap().contains("not a host"));
        let fine: UserConfig = serde_json::from_str(r#"{"network": {"lan": "allow"}}"#).unwrap();
        assert!(network_problem(&fine).is_none());
        assert_eq!(user_network(&UserConfig::default()), Default::default());
    }

    /// A machine made of a PATH table, symlinks and scripts.
    #[derive(Default)]
    struct FakeLook {
        path: HashMap<String, PathBuf>,
        links: HashMap<PathBuf, PathBuf>,
        scripts: HashMap<PathBuf, String>,
    }

    impl Look for FakeLook {
        fn which(&self, program: &str) -> Option<PathBuf> {
            self.path.get(program).cloned()
        }
        fn real(&self, path: &Path) -> Option<PathBuf> {
            Some(self.links.get(path).cloned().unwrap_or(path.to_path_buf()))
        }
        fn script(&self, path: &Path) -> Option<String> {
            self.scripts.get(path).cloned()
        }
    }

    fn argv(s: &str) -> Vec<String> {
        s.split(' ').map(String::from).collect()
    }

    fn names(d: &Detected) -> Vec<&'static str> {
        d.profiles.iter().map(|p| p.name()).collect()
    }

    fn guess(cmd: &str, look: &FakeLook) -> Detected {
        detect(
            &argv(cmd),
            &Choice::Guess,
            look,
            &[PathBuf::from("/home/claude")],
        )
    }

    #[test]
    fn an_agent_nobody_profiled_is_named_by_its_launch_chain() {
        let mut look = FakeLook::default();
        look.links.insert(
            PathBuf::from("/usr/bin/python3"),
            PathBuf::from("/usr/bin/python3.12"),
        );
        look.path
            .insert("python3".into(), PathBuf::from("/usr/bin/python3"));
        // A pyenv shim, as on many developers' machines: the shim's own
        // script names pyenv, not the agent.
        look.path.insert(
            "python".into(),
            PathBuf::from("/home/u/.pyenv/shims/python"),
        );
        look.scripts.insert(
            PathBuf::from("/home/u/.pyenv/shims/python"),
            "#!/usr/bin/env bash\nexec \"/home/u/.pyenv/libexec/pyenv\" exec \"$program\" \"$@\"\n"
                .into(),
        );
        for (cmd, want) in [
            ("python3 /home/u/bin/newagent.py", Some("newagent")),
            ("python /home/u/bin/newagent.py", Some("newagent")),
            ("newagent --acp", Some("newagent")),
            ("npx -y @acme/newagent@1.0", Some("newagent")),
            (
                "node /usr/lib/node_modules/@acme/newagent/dist/index.js",
                Some("newagent"),
            ),
            ("uvx newagent", Some("newagent")),
            ("env FOO=1 newagent", Some("newagent")),
            ("python3 -c pass", None),
            ("sh -c newagent", None),
        ] {
            let d = guess(cmd, &look);
            assert_eq!(d.agent.as_deref(), want, "{cmd}");
        }
    }

    #[test]
    fn agents_are_recognised_however_editors_launch_them() {
        let look = FakeLook::default();
        for (cmd, want) in [
            ("claude-agent-acp", "claude"),
            ("codex-acp", "codex"),
            ("gemini --experimental-acp", "gemini"),
            ("npx -y @agentclientprotocol/claude-agent-acp@0.49.0", "claude"),
            ("npx @zed-industries/codex-acp", "codex"),
            (
                "node /usr/lib/node_modules/@agentclientprotocol/claude-agent-acp/dist/index.js",
                "claude",
            ),
            (
                "/usr/bin/node /opt/n/lib/node_modules/@zed-industries/claude-code-acp/dist/index.js",
                "claude",
            ),
            ("zcode-acp shell-agent", "zcode"),
        ] {
            let d = guess(cmd, &look);
            assert_eq!(names(&d), vec![want], "{cmd}: {}", d.why);
        }
        let d = guess("node index.js", &look);
        assert!(d.profiles.is_empty(), "{}", d.why);
        assert!(d.why.contains("sandbox.statePaths"), "{}", d.why);
    }

    #[test]
    fn every_launch_form_of_the_seven_agents_is_recognised() {
        let mut look = FakeLook::default();
        // A uv tool's entry point: a script whose `#!` is its environment.
        look.path
            .insert("vibe-acp".into(), "/home/claude/.local/bin/vibe-acp".into());
        look.scripts.insert(
            "/home/claude/.local/bin/vibe-acp".into(),
            "#!/home/claude/.local/share/uv/tools/mistral-vibe/bin/python\nimport sys\n".into(),
        );
        look.path
            .insert("opencode".into(), "/usr/bin/opencode".into());
        look.links.insert(
            "/usr/bin/opencode".into(),
            "/usr/lib/node_modules/opencode-ai/bin/opencode".into(),
        );
        for (cmd, want) in [
            ("npx -y @zed-industries/claude-code-acp@0.16.2", "claude"),
            (
                "npx --yes @google/gemini-cli@0.61.0 --experimental-acp",
                "gemini",
            ),
            ("gemini --acp", "gemini"),
            (
                "node /usr/lib/node_modules/@google/gemini-cli/dist/index.js --experimental-acp",
                "gemini",
            ),
            ("qwen --acp", "qwen"),
            ("npx @qwen-code/qwen-code@0.15.10 --acp", "qwen"),
            (
                "node /opt/npm/lib/node_modules/@qwen-code/qwen-code/cli.js --acp",
                "qwen",
            ),
            ("opencode acp", "opencode"),
            ("npx -y opencode-ai@1.18.33 acp", "opencode"),
            ("bun x opencode-ai acp", "opencode"),
            ("vibe-acp", "vibe"),
            ("uvx --from mistral-vibe==3.0.2 vibe-acp", "vibe"),
            ("pipx run --spec mistral-vibe vibe-acp", "vibe"),
            ("env OPENAI_API_KEY=x codex-acp", "codex"),
            ("npm exec --yes -- @zed-industries/codex-acp", "codex"),
        ] {
            let d = guess(cmd, &look);
            assert_eq!(names(&d), vec![want], "{cmd}: {}", d.why);
        }
    }

    /// Only the launch chain is evidence: an argument, a shell line, a
    /// script's comments or the project's own script name nothing.
    #[test]
    fn arguments_and_shell_lines_are_not_evidence() {
        let mut look = FakeLook::default();
        look.scripts.insert(
            "./build.sh".into(),
            "#!/bin/sh\n# run claude-agent-acp here some day\necho codex-acp\nmake all\n".into(),
        );
        for cmd in [
            "sh -c cat notes/zcode-ideas.txt",
            "bash -c exec claude-agent-acp",
            "python3 tool.py --name claude-agent-acp",
            "./build.sh",
            "make claude",
            "node -e require('claude-agent-acp')",
            "/home/claude/projects/tool --agent codex",
        ] {
            let d = guess(cmd, &look);
            assert!(d.profiles.is_empty(), "{cmd}: {}", d.why);
        }
    }

    #[test]
    fn shims_symlinks_and_wrapper_scripts_are_followed() {
        let mut look = FakeLook::default();
        // An npm .bin symlink under a neutral name.
        look.links.insert(
            "/w/node_modules/.bin/agent".into(),
            "/w/node_modules/@agentclientprotocol/claude-agent-acp/dist/index.js".into(),
        );
        let d = guess("/w/node_modules/.bin/agent", &look);
        assert_eq!(names(&d), vec!["claude"], "{}", d.why);
        assert!(d.why.contains("is /w/node_modules/@agentclientprotocol"));

        // A wrapper on PATH that execs the agent.
        look.path
            .insert("my-agent".into(), "/usr/local/bin/my-agent".into());
        look.scripts.insert(
            "/usr/local/bin/my-agent".into(),
            "#!/bin/sh\nexport X=1\nexec codex-acp \"$@\"\n".into(),
        );
        let d = guess("my-agent --flag", &look);
        assert_eq!(names(&d), vec!["codex"], "{}", d.why);
        assert!(d.why.contains("is a script"), "{}", d.why);

        // pnpm's shell shim: the package path behind a variable.
        look.path.insert("agent2".into(), "/p/.bin/agent2".into());
        look.scripts.insert(
            "/p/.bin/agent2".into(),
            "#!/bin/sh\nbasedir=$(dirname \"$0\")\nexec node \"$basedir/../@zed-industries/codex-acp/bin/codex-acp.js\" \"$@\"\n".into(),
        );
        assert_eq!(names(&guess("agent2", &look)), vec!["codex"]);
    }

    #[test]
    fn the_home_directory_name_is_not_evidence() {
        let look = FakeLook::default();
        let d = guess("/home/claude/bin/my-agent", &look);
        assert!(d.profiles.is_empty(), "{}", d.why);
        let d = guess("/home/claude/.local/bin/claude-agent-acp", &look);
        assert_eq!(names(&d), vec!["claude"]);
    }

    #[test]
    fn an_explicit_choice_wins() {
        let look = FakeLook::default();
        let choice = Choice::parse("codex", "--backend-profile").unwrap();
        let d = detect(&argv("claude-agent-acp"), &choice, &look, &[]);
        assert_eq!(names(&d), vec!["codex"]);
        assert!(d.why.contains("--backend-profile"));
        let none = Choice::parse("none", "the user config").unwrap();
        assert!(detect(&argv("claude-agent-acp"), &none, &look, &[])
            .profiles
            .is_empty());
        assert!(Choice::parse("cursor", "x")
            .unwrap_err()
            .to_string()
            .contains("claude, codex"));
    }

    #[test]
    fn claude_keeps_its_settings_file_only_where_it_lives() {
        let home = tempfile::tempdir().unwrap();
        let home = std::fs::canonicalize(home.path()).unwrap();
        let env: HashMap<String, String> = HashMap::new();
        let g = grants(&[Profile::Claude], &env, &home);
        assert_eq!(g[0].matcher, Matcher::Subpath(home.join(".claude")));
        assert!(
            matches!(&g[1].matcher, Matcher::NamePrefix { prefix, .. } if prefix == ".claude.json")
        );
        let mut env = HashMap::new();
        env.insert(
            "CLAUDE_CONFIG_DIR".to_string(),
            home.join("cfg").display().to_string(),
        );
        let g = grants(&[Profile::Claude], &env, &home);
        assert_eq!(g.len(), 1);
        assert_eq!(g[0].matcher, Matcher::Subpath(home.join("cfg")));
    }
}
