//! Random policies for the model tests (`sbpl_model`, `plan_model`):
//! roots, repositories, project entries, grants and name prefixes over a
//! small alphabet of names that matter (`.git`, `.zcode`, `acp`,
//! protected names, a space and a quote), and the paths worth asking about.
#![allow(dead_code)]

use std::path::PathBuf;

use proptest::prelude::*;
use zcode_acp::policy::build::{Platform, PolicyInput, ProjectRules, Repo, RootInput, Writable};
use zcode_acp::policy::{Matcher, Ops, Policy};

const NAMES: &[&str] = &[
    "a", "b", ".git", "hooks", "config", ".zcode", "acp", ".vscode", ".envrc", "x y", "q\"r",
];

pub fn path_under(base: &'static str) -> impl Strategy<Value = PathBuf> {
    prop::collection::vec(prop::sample::select(NAMES), 0..5).prop_map(move |parts| {
        let mut p = PathBuf::from(base);
        for part in parts {
            p.push(part);
        }
        p
    })
}

pub fn any_path() -> impl Strategy<Value = PathBuf> {
    prop_oneof![
        path_under("/"),
        path_under("/h"),
        path_under("/h/.zcode-acp")
    ]
}

/// A Linux policy with one root and nothing else, home `/h`.
pub fn one_root(root: &str) -> PolicyInput {
    PolicyInput {
        links: Vec::new(),
        platform: Platform::Linux,
        home: "/h".into(),
        roots: vec![RootInput {
            path: root.into(),
            project: ProjectRules::default(),
            repos: vec![],
        }],
        backend_state: vec![],
        temp_and_caches: vec![],
        once_allows: vec![],
        profile_dir: None,
        managed_root: "/h/.zcode-acp".into(),
        network: Default::default(),
    }
}

/// Policies with roots and grants anywhere (`/` and the home directory
/// included), for Linux and, with `mac_too`, macOS.
pub fn input(mac_too: bool) -> impl Strategy<Value = PolicyInput> {
    input_with(any_path().boxed(), any_path().boxed(), mac_too)
}

/// Linux policies whose roots are projects below `/h/src` and whose temp
/// and bridge grants lie in the home directory: `/` is never a root or a
/// grant there (refused or warned about before any plan is made).
pub fn linux_projects() -> impl Strategy<Value = PolicyInput> {
    input_with(
        path_under("/h/src").boxed(),
        path_under("/h").boxed(),
        false,
    )
}

fn input_with(
    roots: BoxedStrategy<PathBuf>,
    grants: BoxedStrategy<PathBuf>,
    mac_too: bool,
) -> impl Strategy<Value = PolicyInput> {
    let root = (
        roots,
        prop::collection::vec(any_path(), 0..2),
        prop::collection::vec(any_path(), 0..2),
        any::<bool>(),
        prop::collection::vec(prop::sample::select(&["", "a", "b/a"][..]), 0..3),
    )
        .prop_map(|(path, allow, deny, strict_git, repo_dirs)| {
            let repos = repo_dirs
                .into_iter()
                .map(|d| {
                    let tree = if d.is_empty() {
                        path.clone()
                    } else {
                        path.join(d)
                    };
                    Repo {
                        git_dir: tree.join(".git"),
                        common_dir: tree.join(".git"),
                        // husky's layout: hooks run from the work tree.
                        hooks_path: Some(tree.join(".husky")),
                        gitfile: false,
                        work_tree: tree,
                    }
                })
                .collect();
            RootInput {
                path,
                project: ProjectRules {
                    allow,
                    deny,
                    strict_git,
                },
                repos,
            }
        });
    (
        prop::collection::vec(root, 1..3),
        any::<bool>(),
        prop::collection::vec(grants.clone(), 0..2),
        prop::collection::vec(grants, 0..2),
        any::<bool>(),
    )
        .prop_map(move |(roots, zcode, temps, once, mac)| {
            let mut backend_state = vec![];
            if zcode {
                backend_state.push(Writable {
                    matcher: Matcher::NamePrefix {
                        dir: "/h".into(),
                        prefix: ".zcode".into(),
                    },
                    why: "zcode".into(),
                    layered: false,
                });
            }
            PolicyInput {
                links: Vec::new(),
                platform: if mac && mac_too {
                    Platform::Macos
                } else {
                    Platform::Linux
                },
                home: "/h".into(),
                roots,
                backend_state,
                temp_and_caches: temps
                    .into_iter()
                    .map(|t| Writable {
                        matcher: Matcher::Subpath(t),
                        why: "temp".into(),
                        layered: false,
                    })
                    .collect(),
                once_allows: once,
                profile_dir: Some("/h/.zcode-acp/sandbox/gen".into()),
                managed_root: "/h/.zcode-acp".into(),
                network: Default::default(),
            }
        })
}

/// Paths worth asking about for a policy: around every rule's anchor.
pub fn probes(policy: &Policy) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for rule in &policy.rules {
        let anchor = match &rule.matcher {
            Matcher::Subpath(p) | Matcher::Literal(p) => p.clone(),
            Matcher::NamePrefix { dir, prefix } => dir.join(prefix),
            Matcher::ZcodeConfig { beneath } => beneath.clone(),
        };
        for extra in [
            "",
            "child",
            ".zcode",
            ".zcode/acp",
            ".zcode/acp/sandbox.json",
            ".zcode/other",
            "new/deeper/file",
        ] {
            out.push(if extra.is_empty() {
                anchor.clone()
            } else {
                anchor.join(extra)
            });
        }
        if let Some(parent) = anchor.parent() {
            out.push(parent.to_path_buf());
        }
        if rule.ops == Ops::RemoveOnly {
            out.push(anchor.join("x"));
        }
    }
    out
}
