//! The writes-only sandbox policy: one platform-neutral model, one
//! evaluator. The Seatbelt profile, the Linux launcher and the bridge's own
//! judgement of ACP requests are all generated from (or decided by) this.
//!
//! A policy is an ordered list of rules; the last rule that matches a path
//! and operation decides. The builder emits them in three bands:
//! 1. **allow**: the write whitelist;
//! 2. **protected**: denied, but the user may grant them (files the user's
//!    own unsandboxed tools later obey: a delayed escape);
//! 3. **islands**: never writable, never prompted, no grant opens them.
//!
//! Paths in rules and in queries are real paths (see [`resolve`]).

pub mod agents;
pub mod backends;
pub mod build;
pub mod discover;
pub mod egress;
pub mod env;
pub mod gather;
pub mod git_cmd;
pub mod launch;
pub mod local_names;
pub mod network;
pub mod offerable;
pub mod protected;
pub mod refused;
pub mod repos;
pub mod resolve;
pub mod sockets;

use std::path::{Path, PathBuf};

pub use build::{Platform, PolicyInput};
pub use resolve::{resolve_real, ResolveError};

/// What is being done to a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// Create, write, truncate, chmod, ... the path itself.
    Write,
    /// Unlink, rmdir, or rename the path away.
    Remove,
}

/// Which band decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Band {
    Allow,
    Protected,
    Island,
    /// No rule matched: outside the whitelist.
    Outside,
}

impl std::fmt::Display for Band {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Band::Allow => "allow",
            Band::Protected => "protected",
            Band::Island => "island",
            Band::Outside => "outside",
        })
    }
}

/// Which paths a rule covers.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Matcher {
    /// The path and everything beneath it.
    Subpath(PathBuf),
    /// Exactly this path.
    Literal(PathBuf),
    /// Entries of `dir` whose name starts with `prefix`, and everything
    /// beneath them (`~/.zcode*`, `/dev/ttys*`).
    NamePrefix { dir: PathBuf, prefix: String },
    /// Beneath `dir`, any path with a `.zcode` component that is the last
    /// one or is followed by `acp`: every project's sandbox config, and
    /// the `.zcode` entries that could be renamed to plant one.
    ZcodeConfig { beneath: PathBuf },
}

impl Matcher {
    /// The one path a subpath or literal matcher names.
    pub fn path(&self) -> Option<&Path> {
        match self {
            Matcher::Subpath(p) | Matcher::Literal(p) => Some(p),
            _ => None,
        }
    }

    pub fn matches(&self, path: &Path) -> bool {
        match self {
            Matcher::Subpath(p) => path.starts_with(p),
            Matcher::Literal(p) => path == p,
            Matcher::NamePrefix { dir, prefix } => match path.strip_prefix(dir) {
                Ok(rel) => rel
                    .components()
                    .next()
                    .and_then(|c| c.as_os_str().to_str())
                    .is_some_and(|first| first.starts_with(prefix.as_str())),
                Err(_) => false,
            },
            Matcher::ZcodeConfig { beneath } => {
                path.starts_with(beneath) && is_zcode_config_path(path)
            }
        }
    }
}

/// Whether some component of `path` is `.zcode` and is either the last
/// component or followed by `acp`.
pub fn is_zcode_config_path(path: &Path) -> bool {
    let names: Vec<&std::ffi::OsStr> = path.components().map(|c| c.as_os_str()).collect();
    names
        .iter()
        .enumerate()
        .any(|(i, n)| *n == ".zcode" && (i + 1 == names.len() || names[i + 1] == "acp"))
}

/// Which operations a rule applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Ops {
    All,
    /// Only unlink/rename: pins a directory in place (the ancestors of
    /// islands and protected paths) while its contents stay writable.
    RemoveOnly,
}

/// One rule of the policy.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Rule {
    pub kind: Band,
    pub matcher: Matcher,
    pub ops: Ops,
    /// Why the rule is there, in words a user understands.
    pub why: String,
    /// For protected rules: whether a denial may be put to the user.
    pub promptable: bool,
    /// For allow rules: a root of `/` or the home directory.
    pub dangerous: bool,
    /// For allow rules: a grant the user made for a protected path, placed
    /// after the protected band so it opens what it names (never an island).
    pub reopens: bool,
    /// For allow rules: a workspace root of a live session (the agent's
    /// own servers may listen there).
    #[serde(default)]
    pub root: bool,
    /// For allow rules: a cache shared with the user's own builds; where
    /// the platform can, writes go into a copy-on-write layer of the
    /// sandbox's own.
    #[serde(default)]
    pub layered: bool,
}

impl Rule {
    fn applies(&self, path: &Path, op: Op) -> bool {
        (self.ops == Ops::All || op == Op::Remove) && self.matcher.matches(path)
    }

    pub fn allows(&self) -> bool {
        self.kind == Band::Allow
    }
}

/// The verdict for one path and operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    pub kind: Band,
    /// The deciding rule's reason, if a rule decided.
    pub rule: Option<String>,
    /// Whether a protected denial may be put to the user.
    pub promptable: bool,
    /// The path was allowed only because a root is `/` or the home
    /// directory: legal, but the caller should say how much that opens.
    pub dangerous: bool,
}

/// A built policy. It travels in the Linux launch spec, where the
/// supervisor decides name-prefix grants with it.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Policy {
    pub rules: Vec<Rule>,
    /// Which destinations the sandbox may reach.
    #[serde(default)]
    pub network: network::NetworkPolicy,
}

impl Policy {
    /// Decides for a path that is already real (see [`resolve_real`]).
    pub fn evaluate_resolved(&self, path: &Path, op: Op) -> Decision {
        match self.rules.iter().rev().find(|r| r.applies(path, op)) {
            Some(rule) => Decision {
                allowed: rule.allows(),
                kind: rule.kind,
                rule: Some(rule.why.clone()),
                promptable: rule.kind == Band::Protected && rule.promptable,
                dangerous: rule.dangerous,
            },
            None => Decision {
                allowed: false,
                kind: Band::Outside,
                rule: None,
                promptable: true,
                dangerous: false,
            },
        }
    }

    /// Resolves `path` and decides.
    pub fn evaluate(&self, path: &Path, op: Op) -> Result<(PathBuf, Decision), ResolveError> {
        let real = resolve_real(path)?;
        let decision = self.evaluate_resolved(&real, op);
        Ok((real, decision))
    }

    pub fn rules_of(&self, kind: Band) -> impl Iterator<Item = &Rule> {
        self.rules.iter().filter(move |r| r.kind == kind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(kind: Band, matcher: Matcher, ops: Ops) -> Rule {
        Rule {
            kind,
            matcher,
            ops,
            why: format!("{kind}"),
            promptable: true,
            dangerous: false,
            reopens: false,
            root: false,
            layered: false,
        }
    }

    #[test]
    fn the_last_matching_rule_wins() {
        let p = Policy {
            network: Default::default(),
            rules: vec![
                rule(Band::Allow, Matcher::Subpath("/w".into()), Ops::All),
                rule(
                    Band::Protected,
                    Matcher::Subpath("/w/.git/hooks".into()),
                    Ops::All,
                ),
                rule(
                    Band::Island,
                    Matcher::Literal("/w/.git".into()),
                    Ops::RemoveOnly,
                ),
            ],
        };
        let d = |path: &str, op| p.evaluate_resolved(Path::new(path), op);
        assert_eq!(d("/w/src/a.rs", Op::Write).kind, Band::Allow);
        assert!(d("/w/src/a.rs", Op::Write).allowed);
        assert_eq!(
            d("/w/.git/hooks/pre-commit", Op::Write).kind,
            Band::Protected
        );
        assert_eq!(d("/w/.git/hooks", Op::Remove).kind, Band::Protected);
        // An ancestor pin stops renames, not writes.
        assert!(d("/w/.git", Op::Write).allowed);
        assert!(!d("/w/.git", Op::Remove).allowed);
        assert_eq!(d("/x", Op::Write).kind, Band::Outside);
        // Component-wise, not string prefixes.
        assert_eq!(d("/wx/a", Op::Write).kind, Band::Outside);
    }

    #[test]
    fn zcode_config_paths() {
        for (p, yes) in [
            ("/w/.zcode", true),
            ("/w/.zcode/acp", true),
            ("/w/.zcode/acp/sandbox.json", true),
            ("/w/deep/er/.zcode/acp/x", true),
            ("/w/.zcode/other", false),
            ("/w/.zcode/acpx", false),
            ("/w/.zcodex/acp", false),
            ("/w/x.zcode", false),
        ] {
            assert_eq!(is_zcode_config_path(Path::new(p)), yes, "{p}");
        }
    }

    #[test]
    fn name_prefixes_match_entries_and_their_contents() {
        let m = Matcher::NamePrefix {
            dir: "/home/u".into(),
            prefix: ".zcode".into(),
        };
        assert!(m.matches(Path::new("/home/u/.zcode")));
        assert!(m.matches(Path::new("/home/u/.zcode-acp/x")));
        assert!(m.matches(Path::new("/home/u/.zcodestuff")));
        assert!(!m.matches(Path::new("/home/u/.zcod")));
        assert!(!m.matches(Path::new("/home/u")));
        assert!(!m.matches(Path::new("/home/u/x/.zcode")));
    }
}
