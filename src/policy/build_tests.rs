//! The tests of `policy::build`, kept beside it.

use super::super::{Decision, Op};
use super::*;

pub(crate) fn sample() -> PolicyInput {
    PolicyInput {
        links: Vec::new(),
        platform: Platform::Linux,
        home: "/home/u".into(),
        roots: vec![RootInput {
            path: "/home/u/proj".into(),
            project: ProjectRules {
                allow: vec!["/data/shared".into()],
                deny: vec!["/home/u/proj/secrets".into()],
                strict_git: false,
            },
            repos: vec![
                Repo {
                    work_tree: "/home/u/proj".into(),
                    git_dir: "/home/u/proj/.git".into(),
                    common_dir: "/home/u/proj/.git".into(),
                    hooks_path: None,
                    gitfile: false,
                },
                Repo {
                    work_tree: "/home/u/proj/vendor/lib".into(),
                    git_dir: "/home/u/proj/.git/modules/lib".into(),
                    common_dir: "/home/u/proj/.git/modules/lib".into(),
                    hooks_path: None,
                    gitfile: false,
                },
            ],
        }],
        backend_state: vec![Writable {
            matcher: Matcher::NamePrefix {
                dir: "/home/u".into(),
                prefix: ".zcode".into(),
            },
            why: "zcode backend state".into(),
            layered: false,
        }],
        temp_and_caches: vec![Writable {
            matcher: Matcher::Subpath("/tmp".into()),
            why: "temp".into(),
            layered: false,
        }],
        once_allows: vec![],
        profile_dir: Some("/home/u/.zcode-acp/sandbox/abc".into()),
        managed_root: "/home/u/.zcode-acp".into(),
        network: Default::default(),
    }
}

fn decide(p: &Policy, path: &str, op: Op) -> Decision {
    p.evaluate_resolved(Path::new(path), op)
}

/// A protected symlink protects where it leads, and the directories on
/// the way there are pinned (a renamed parent would leave the link
/// pointing at whatever the agent puts in its place); a gitfile is
/// protected itself.
#[test]
fn protected_symlinks_protect_where_they_lead() {
    let mut input = sample();
    input.roots[0].repos[0].gitfile = true;
    // .git/hooks -> ../tools/hooks, where tools -> shared/tools.
    let chain = |p: &Path| {
        (p == Path::new("/home/u/proj/.git/hooks")).then(|| LinkChain {
            hops: vec![
                "/home/u/proj/.git/hooks".into(),
                "/home/u/proj/tools".into(),
            ],
            target: "/home/u/proj/shared/tools/hooks".into(),
            target_is_dir: true,
        })
    };
    let p = Policy::build_resolving_links(&mut input, chain);
    let k = |path: &str, op: Op| decide(&p, path, op).kind;
    assert_eq!(
        k("/home/u/proj/shared/tools/hooks/pre-commit", Op::Write),
        Band::Protected
    );
    // The directories on the way are pinned, the link between is held.
    assert_eq!(k("/home/u/proj/shared", Op::Remove), Band::Protected);
    assert_eq!(k("/home/u/proj/tools", Op::Write), Band::Protected);
    assert_eq!(
        k("/home/u/proj/shared/tools/other.sh", Op::Write),
        Band::Allow
    );
    assert_eq!(k("/home/u/proj/.git", Op::Write), Band::Protected);
    // A grant (a real path: made through the link, it names where the
    // link leads) opens what it names.
    input.once_allows = vec!["/home/u/proj/shared/tools/hooks/pre-push".into()];
    let write = |p: &Policy, path: &str| decide(p, path, Op::Write).kind;
    let (push, commit) = (
        "/home/u/proj/shared/tools/hooks/pre-push",
        "/home/u/proj/shared/tools/hooks/pre-commit",
    );
    let granted = Policy::build(&input);
    assert_eq!(write(&granted, push), Band::Allow);
    assert_eq!(write(&granted, commit), Band::Protected);
    let without = Policy::build(&sample());
    assert_eq!(write(&without, commit), Band::Allow);
}

/// Tools that run what a work-tree file lists on the user's next commit
/// are protected like hooks: pre-commit's and lefthook's configs, and
/// husky 9's scripts beside the `.husky/_` git is pointed at.
#[test]
fn hook_managers_configs_are_protected() {
    let mut input = sample();
    input.roots[0].repos[0].hooks_path = Some("/home/u/proj/.husky/_".into());
    let p = Policy::build(&input);
    let k = |path: &str| decide(&p, path, Op::Write).kind;
    for path in [
        "/home/u/proj/.husky/pre-commit",
        "/home/u/proj/.husky/_/h",
        "/home/u/proj/.pre-commit-config.yaml",
        "/home/u/proj/lefthook.yml",
    ] {
        assert_eq!(k(path), Band::Protected, "{path}");
    }
    assert_eq!(k("/home/u/proj/.husky-notes.md"), Band::Allow);
}

#[test]
fn the_sample_policy_decides_as_documented() {
    let p = Policy::build(&sample());
    let k = |path: &str, op: Op| decide(&p, path, op).kind;
    assert_eq!(k("/home/u/proj/src/main.rs", Op::Write), Band::Allow);
    assert_eq!(k("/home/u/proj/.git/objects/ab/cd", Op::Write), Band::Allow);
    assert_eq!(
        k("/home/u/proj/.git/hooks/pre-commit", Op::Write),
        Band::Protected
    );
    assert_eq!(k("/home/u/proj/.git/config", Op::Write), Band::Protected);
    assert_eq!(
        k("/home/u/proj/.git/modules/lib/hooks/x", Op::Write),
        Band::Protected
    );
    assert_eq!(
        k("/home/u/proj/vendor/lib/.envrc", Op::Write),
        Band::Protected
    );
    assert_eq!(
        k("/home/u/proj/.vscode/tasks.json", Op::Write),
        Band::Protected
    );
    assert!(!decide(&p, "/home/u/proj/secrets/k", Op::Write).promptable);
    assert!(decide(&p, "/home/u/proj/.envrc", Op::Write).promptable);
    // Pins: .git cannot be moved away from its protected hooks.
    assert_eq!(k("/home/u/proj/.git", Op::Remove), Band::Protected);
    assert_eq!(k("/home/u/proj/.git", Op::Write), Band::Allow);
    assert_eq!(k("/home/u/proj", Op::Remove), Band::Protected);
    // Islands.
    assert_eq!(
        k("/home/u/proj/.zcode/acp/sandbox.json", Op::Write),
        Band::Island
    );
    assert_eq!(k("/home/u/proj/.zcode", Op::Write), Band::Island);
    assert_eq!(k("/home/u/proj/.zcode/notes", Op::Write), Band::Allow);
    assert_eq!(
        k("/tmp/other/.zcode/acp/sandbox.json", Op::Write),
        Band::Island
    );
    assert_eq!(k("/data/shared/x/.zcode/acp", Op::Write), Band::Island);
    assert_eq!(k("/home/u/.zcode-acp/ledger/x", Op::Write), Band::Island);
    assert_eq!(k("/home/u/.zcode-shell-agent/s/t", Op::Write), Band::Allow);
    // `~/.zcode` matches the granted prefix, but a .zcode there could
    // hold the config of a later session rooted at the home directory.
    assert_eq!(k("/home/u/.zcode", Op::Write), Band::Island);
    assert_eq!(
        k("/home/u/.zcode/acp/sandbox.json", Op::Write),
        Band::Island
    );
    // Outside.
    assert_eq!(k("/home/u/.bashrc", Op::Write), Band::Outside);
    assert_eq!(k("/dev/null", Op::Write), Band::Allow);
    assert_eq!(k("/dev/sda", Op::Write), Band::Outside);
}

#[test]
fn a_grant_opens_the_protected_path_it_names_and_nothing_more() {
    let mut input = sample();
    input.once_allows = vec!["/home/u/proj/.git/hooks".into(), "/home/u/proj".into()];
    let p = Policy::build(&input);
    // The grant for the hooks opens them...
    assert!(decide(&p, "/home/u/proj/.git/hooks/pre-commit", Op::Write).allowed);
    // ...a grant for the whole workspace does not open its protected paths...
    assert_eq!(
        decide(&p, "/home/u/proj/.git/config", Op::Write).kind,
        Band::Protected
    );
    assert_eq!(
        decide(&p, "/home/u/proj/.envrc", Op::Write).kind,
        Band::Protected
    );
    // ...and no grant opens an island.
    input.once_allows = vec!["/home/u/proj/.zcode/acp".into()];
    let p = Policy::build(&input);
    assert_eq!(
        decide(&p, "/home/u/proj/.zcode/acp/sandbox.json", Op::Write).kind,
        Band::Island
    );
}

#[test]
fn strict_git_protects_the_whole_git_dir() {
    let mut input = sample();
    input.roots[0].project.strict_git = true;
    let p = Policy::build(&input);
    assert_eq!(
        decide(&p, "/home/u/proj/.git/objects/x", Op::Write).kind,
        Band::Protected
    );
    assert!(decide(&p, "/home/u/proj/.git/objects/x", Op::Write).promptable);
}

#[test]
fn a_home_or_slash_root_is_flagged() {
    let mut input = sample();
    input.roots[0].path = "/home/u".into();
    let p = Policy::build(&input);
    assert!(decide(&p, "/home/u/.bashrc", Op::Write).dangerous);
}

#[test]
fn worktree_git_dirs_outside_the_root_are_writable() {
    let mut input = sample();
    input.roots[0].repos = vec![Repo {
        work_tree: "/home/u/proj".into(),
        git_dir: "/home/u/main/.git/worktrees/proj".into(),
        common_dir: "/home/u/main/.git".into(),
        hooks_path: None,
        gitfile: false,
    }];
    let p = Policy::build(&input);
    assert_eq!(
        decide(&p, "/home/u/main/.git/worktrees/proj/HEAD", Op::Write).kind,
        Band::Allow
    );
    assert_eq!(
        decide(&p, "/home/u/main/.git/objects/x", Op::Write).kind,
        Band::Allow
    );
    assert_eq!(
        decide(&p, "/home/u/main/.git/hooks/post-checkout", Op::Write).kind,
        Band::Protected
    );
    assert_eq!(
        decide(&p, "/home/u/main/src/x", Op::Write).kind,
        Band::Outside
    );
}
