//! The agents whose own state the sandbox knows, as data: how each is
//! launched (the names a launch chain shows), where it keeps its state
//! and what moves it, and the hosts of its API. One table; nothing else
//! in the code knows an agent by name.

/// A backend whose own state the sandbox knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    Claude,
    Codex,
    Gemini,
    Qwen,
    Opencode,
    Vibe,
    Zcode,
}

/// A directory an agent keeps its state in: `~/<home>`, or where the
/// variable `env` says (`$env/<under_env>`).
#[derive(Debug)]
pub struct StateDir {
    pub home: &'static str,
    pub env: Option<&'static str>,
    pub under_env: &'static str,
}

/// Names in the home directory an agent saves beside its directories
/// (`~/.claude.json` and its temporary files), where the variable
/// `unless_env` does not move them.
#[derive(Debug)]
pub struct HomeNames {
    pub prefix: &'static str,
    pub unless_env: Option<&'static str>,
}

/// What the sandbox knows of one agent.
#[derive(Debug)]
pub struct Agent {
    pub profile: Profile,
    pub name: &'static str,
    /// Programs and packages that launch it: a launch chain naming one of
    /// these (its program, an npm package, a Python tool's environment)
    /// is this agent.
    pub launchers: &'static [&'static str],
    pub dirs: &'static [StateDir],
    pub home_names: &'static [HomeNames],
    /// The hosts its model API is served from: reachable without a
    /// question (see `egress`).
    pub api_hosts: &'static [&'static str],
    /// The hosts it signs in through (OAuth and its token endpoints):
    /// reachable without a question too.
    pub sign_in_hosts: &'static [&'static str],
    /// Variables that point it at another API server (a gateway, a proxy,
    /// a local model): their hosts are reachable without a question.
    pub base_url_env: &'static [&'static str],
    /// What the state is, in words for the log and `doctor`.
    pub described: &'static str,
    /// Its shell tool shows the editor nothing of what a command printed,
    /// so a write the sandbox refused cannot be read from the tool call:
    /// on Linux the sandbox's supervisor says each one as it happens
    /// instead (`policy::refused::announced`), at one round trip per call
    /// that makes a name.
    pub quiet_shell: bool,
}

const fn dir(home: &'static str, env: Option<&'static str>, under_env: &'static str) -> StateDir {
    StateDir {
        home,
        env,
        under_env,
    }
}

/// Every agent the sandbox knows.
pub const AGENTS: &[Agent] = &[
    Agent {
        profile: Profile::Claude,
        name: "claude",
        launchers: &["claude-agent-acp", "claude-code-acp", "claude"],
        dirs: &[dir(".claude", Some("CLAUDE_CONFIG_DIR"), "")],
        // Without CLAUDE_CONFIG_DIR Claude keeps its settings in
        // ~/.claude.json, saved through a temporary file and a lock
        // directory beside it (`~/.claude.json.tmp.PID.N`,
        // `~/.claude.json.lock`) renamed over it.
        home_names: &[HomeNames {
            prefix: ".claude.json",
            unless_env: Some("CLAUDE_CONFIG_DIR"),
        }],
        api_hosts: &["api.anthropic.com"],
        sign_in_hosts: &["claude.ai", "console.anthropic.com", "platform.claude.com"],
        base_url_env: &["ANTHROPIC_BASE_URL"],
        described: "Claude's own state ($CLAUDE_CONFIG_DIR or ~/.claude, and ~/.claude.json)",
        quiet_shell: false,
    },
    Agent {
        profile: Profile::Codex,
        name: "codex",
        launchers: &["codex-acp", "codex"],
        dirs: &[dir(".codex", Some("CODEX_HOME"), "")],
        home_names: &[],
        api_hosts: &["api.openai.com", "chatgpt.com"],
        sign_in_hosts: &["auth.openai.com"],
        base_url_env: &["OPENAI_BASE_URL"],
        described: "codex's own state ($CODEX_HOME or ~/.codex)",
        quiet_shell: false,
    },
    Agent {
        profile: Profile::Gemini,
        name: "gemini",
        launchers: &["gemini", "gemini-cli"],
        dirs: &[dir(".gemini", Some("GEMINI_CLI_HOME"), ".gemini")],
        home_names: &[],
        api_hosts: &[
            "generativelanguage.googleapis.com",
            "cloudcode-pa.googleapis.com",
        ],
        sign_in_hosts: &[
            "accounts.google.com",
            "oauth2.googleapis.com",
            "www.googleapis.com",
        ],
        base_url_env: &["GOOGLE_GEMINI_BASE_URL"],
        described: "gemini's own state (~/.gemini, or $GEMINI_CLI_HOME/.gemini)",
        // Gemini CLI 0.61's shell tool call carries no output.
        quiet_shell: true,
    },
    Agent {
        profile: Profile::Qwen,
        name: "qwen",
        launchers: &["qwen", "qwen-code"],
        dirs: &[dir(".qwen", Some("QWEN_HOME"), "")],
        home_names: &[],
        api_hosts: &["dashscope.aliyuncs.com", "dashscope-intl.aliyuncs.com"],
        sign_in_hosts: &["chat.qwen.ai"],
        base_url_env: &["OPENAI_BASE_URL"],
        described: "qwen's own state ($QWEN_HOME or ~/.qwen)",
        quiet_shell: false,
    },
    Agent {
        profile: Profile::Opencode,
        name: "opencode",
        launchers: &["opencode", "opencode-ai"],
        dirs: &[
            dir(".config/opencode", Some("XDG_CONFIG_HOME"), "opencode"),
            dir(".local/share/opencode", Some("XDG_DATA_HOME"), "opencode"),
            dir(".local/state/opencode", Some("XDG_STATE_HOME"), "opencode"),
            dir(".cache/opencode", Some("XDG_CACHE_HOME"), "opencode"),
        ],
        home_names: &[],
        api_hosts: &["opencode.ai", "models.dev"],
        sign_in_hosts: &[],
        base_url_env: &[],
        described: "opencode's own state (its XDG config, data, state and cache directories)",
        quiet_shell: false,
    },
    Agent {
        profile: Profile::Vibe,
        name: "vibe",
        launchers: &["vibe-acp", "vibe", "mistral-vibe"],
        dirs: &[dir(".vibe", Some("VIBE_HOME"), "")],
        home_names: &[],
        api_hosts: &["api.mistral.ai"],
        // The console signs in; chat.mistral.ai serves its managed config
        // and its sessions.
        sign_in_hosts: &["console.mistral.ai", "chat.mistral.ai"],
        base_url_env: &[],
        described: "Mistral Vibe's own state ($VIBE_HOME or ~/.vibe)",
        quiet_shell: false,
    },
    Agent {
        profile: Profile::Zcode,
        name: "zcode",
        // `zcode-acp shell-agent` (the launch chain names it so).
        launchers: &["zcode-shell-agent"],
        dirs: &[dir(
            ".zcode-shell-agent",
            Some("ZCODE_SHELL_AGENT_HOME"),
            "",
        )],
        home_names: &[HomeNames {
            prefix: ".zcode",
            unless_env: None,
        }],
        api_hosts: &[],
        sign_in_hosts: &[],
        base_url_env: &[],
        described:
            "the shell agent's transcripts ($ZCODE_SHELL_AGENT_HOME or ~/.zcode-shell-agent)",
        quiet_shell: false,
    },
];

impl Profile {
    pub const ALL: [Profile; 7] = [
        Profile::Claude,
        Profile::Codex,
        Profile::Gemini,
        Profile::Qwen,
        Profile::Opencode,
        Profile::Vibe,
        Profile::Zcode,
    ];

    /// This profile's row of [`AGENTS`].
    pub fn agent(self) -> &'static Agent {
        AGENTS
            .iter()
            .find(|a| a.profile == self)
            .expect("every profile has a row")
    }

    pub fn name(self) -> &'static str {
        self.agent().name
    }

    /// The profile whose launchers include `launcher` (compared as is:
    /// the caller gives a program's or package's own name).
    pub fn launched_as(launcher: &str) -> Option<Profile> {
        AGENTS
            .iter()
            .find(|a| a.launchers.contains(&launcher))
            .map(|a| a.profile)
    }

    /// Every profile's name, for messages: `claude, codex, ...`.
    pub fn names() -> String {
        Profile::ALL.map(Profile::name).join(", ")
    }
}

/// Where an agent no profile knows keeps its own state, when `refused` (a
/// write the sandbox refused it) lies there: a directory of the home
/// directory named after the agent (`~/.NAME...`), or its XDG config, data
/// or state directory (`~/.config/NAME...`, `~/.local/share/NAME...`,
/// `~/.local/state/NAME...`). The place's name must start with the
/// agent's, so what an agent prints can never bring a question about
/// `~/.ssh` or `~/.bashrc`; a file directly in the home directory is never
/// such a place (it would open names beside it), so `refused` must lie
/// inside the directory, or be the directory itself exactly as named.
pub fn own_state_location(
    refused: &std::path::Path,
    home: &std::path::Path,
    agent: &str,
) -> Option<std::path::PathBuf> {
    use std::path::Component;
    let rest = refused.strip_prefix(home).ok()?;
    let parts: Vec<&str> = rest
        .components()
        .map(|c| match c {
            Component::Normal(n) => n.to_str(),
            _ => None,
        })
        .collect::<Option<_>>()?;
    let agent = agent.to_ascii_lowercase();
    // The agent's name, alone or with a short suffix (`-cache`, `_2`):
    // nothing a line it prints could dress up as something else.
    let named = |n: &str| {
        let n = n.to_ascii_lowercase();
        n.strip_prefix(&agent).is_some_and(|rest| {
            rest.is_empty()
                || (rest.len() <= 17
                    && rest.starts_with(['-', '_', '.'])
                    && rest[1..]
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'))
        })
    };
    let (at, depth) = match parts.as_slice() {
        [".config", name, ..] if named(name) => (1, parts.len()),
        [".local", "share" | "state", name, ..] if named(name) => (2, parts.len()),
        [first, ..] if first.strip_prefix('.').is_some_and(named) => (0, parts.len()),
        _ => return None,
    };
    // Places other programs keep, whatever the agent is called.
    const OTHERS: &[&str] = &[
        "share",
        "state",
        "applications",
        "fish",
        "vim",
        "nvim",
        "emacs",
        "emacs.d",
        "ipython",
        "jupyter",
        "gradle",
        "m2",
        "vscode",
        "idea",
        "direnv",
        "netrc",
        "pypirc",
        "npmrc",
        "config",
        "local",
        "cache",
        "ssh",
        "gnupg",
        "aws",
        "kube",
        "docker",
        "git",
        "gitconfig",
        "profile",
        "bashrc",
        "bash_profile",
        "zshrc",
        "zshenv",
        "zprofile",
        "pki",
        "mozilla",
        "npm",
        "cargo",
        "rustup",
        "systemd",
        "autostart",
        "environment.d",
        "zcode-acp",
    ];
    let name = parts[at].trim_start_matches('.').to_ascii_lowercase();
    if OTHERS.contains(&name.as_str()) {
        return None;
    }
    let location: std::path::PathBuf = parts[..=at].iter().collect();
    // The place itself, refused: only a directory named exactly after the
    // agent (`mkdir ~/.NAME`), never `~/.NAME.json` or `~/.NAMErc`.
    if depth == at + 1 && parts[at].trim_start_matches('.').to_ascii_lowercase() != agent {
        return None;
    }
    Some(home.join(location))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_profile_has_one_row_and_no_launcher_is_shared() {
        for p in Profile::ALL {
            assert_eq!(AGENTS.iter().filter(|a| a.profile == p).count(), 1);
        }
        let mut all: Vec<&str> = AGENTS.iter().flat_map(|a| a.launchers.to_vec()).collect();
        let n = all.len();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), n, "a launcher names two agents");
    }

    #[test]
    fn an_unprofiled_agents_own_state_is_a_place_named_after_it() {
        use std::path::{Path, PathBuf};
        let home = Path::new("/home/u");
        let at = |p: &str| own_state_location(&home.join(p), home, "newagent");
        assert_eq!(
            at(".newagent/state.json"),
            Some(PathBuf::from("/home/u/.newagent"))
        );
        assert_eq!(at(".newagent"), Some(PathBuf::from("/home/u/.newagent")));
        assert_eq!(
            at(".newagent-cache/x/y"),
            Some(PathBuf::from("/home/u/.newagent-cache"))
        );
        assert_eq!(
            at(".config/newagent/settings.json"),
            Some(PathBuf::from("/home/u/.config/newagent"))
        );
        assert_eq!(
            at(".local/share/NewAgent/db"),
            Some(PathBuf::from("/home/u/.local/share/NewAgent"))
        );
        for not_its_own in [
            ".ssh/authorized_keys",
            ".bashrc",
            ".newagent.json",
            ".newagentrc",
            ".config/git/config",
            "newagent/x",
            ".local/newagent/x",
            ".newagent (choose Always)/x",
            ".newagentsuffixmuchtoolongtobeshort/x",
            "../other/.newagent/x",
        ] {
            assert_eq!(at(not_its_own), None, "{not_its_own}");
        }
        assert_eq!(
            at(".config/newagent"),
            Some(PathBuf::from("/home/u/.config/newagent"))
        );
        assert_eq!(
            own_state_location(Path::new("/etc/newagent/x"), home, "newagent"),
            None
        );
        // An agent named like a place others keep gets no question about it.
        for (agent, path) in [
            ("ssh", ".ssh/config"),
            ("config", ".config/x"),
            ("git", ".config/git/x"),
            ("share", ".local/share/share/x"),
            ("sha", ".local/share/share/x"),
        ] {
            assert_eq!(
                own_state_location(&home.join(path), home, agent),
                None,
                "{agent}"
            );
        }
    }
}
