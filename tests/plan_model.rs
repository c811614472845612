//! The Linux plan decides writes as the policy does.
//!
//! A model of the executor (the plan's mount operations applied in the
//! order `Plan::mount_ops` gives, which is the order the executor takes
//! them in; Landlock allowing writes only beneath its directories and
//! files) runs every plan built from random
//! policies over a world where every path a rule names exists, and must
//! agree with `Policy::evaluate_resolved` on every write, except where the
//! plan itself names a gap. What each operation does to the real kernel is
//! tested in `tests/linux_sandbox.rs`; this checks the planner's choices
//! and their order.
#![cfg(target_os = "linux")]

#[path = "support/policies.rs"]
mod policies;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use policies::{any_path, linux_projects, one_root, probes};
use proptest::prelude::*;
use zcode_acp::linux::plan::{self, Fs, MountOp, Plan, UserFacts};
use zcode_acp::policy::build::ProjectRules;
use zcode_acp::policy::{Matcher, Op, Policy};

/// Every path a rule names exists (directories for subpaths, files for
/// literals), with its parents.
struct World {
    dirs: BTreeSet<PathBuf>,
    files: BTreeSet<PathBuf>,
}

impl World {
    fn of(policy: &Policy) -> World {
        let mut w = World {
            dirs: BTreeSet::new(),
            files: BTreeSet::new(),
        };
        for rule in &policy.rules {
            match &rule.matcher {
                Matcher::Subpath(p) => w.dir(p),
                Matcher::Literal(p) => {
                    if let Some(parent) = p.parent() {
                        w.dir(parent);
                    }
                    if !w.dirs.contains(p) {
                        w.files.insert(p.clone());
                    }
                }
                Matcher::NamePrefix { dir, .. } => w.dir(dir),
                // The bridge makes <root>/.zcode/acp before arming.
                Matcher::ZcodeConfig { beneath } => w.dir(&beneath.join(".zcode/acp")),
            }
        }
        w
    }

    fn dir(&mut self, p: &Path) {
        for a in p.ancestors() {
            self.files.remove(a);
            self.dirs.insert(a.to_path_buf());
        }
    }
}

impl Fs for World {
    fn is_dir(&self, p: &Path) -> bool {
        self.dirs.contains(p)
    }
    fn exists(&self, p: &Path) -> bool {
        self.dirs.contains(p) || self.files.contains(p)
    }
    fn list(&self, p: &Path) -> Vec<String> {
        self.dirs
            .iter()
            .chain(&self.files)
            .filter(|c| c.parent() == Some(p))
            .filter_map(|c| c.file_name().map(|n| n.to_string_lossy().into_owned()))
            .collect()
    }
    fn is_socket(&self, _p: &Path) -> bool {
        false
    }
    fn is_symlink(&self, _p: &Path) -> bool {
        false
    }
    fn resolves(&self, p: &Path) -> bool {
        self.exists(p)
    }
}

/// Whether the executor's mounts plus Landlock leave `path` writable: the
/// plan's mount operations applied in the order the executor takes them.
fn writable(plan: &Plan, ops: &[MountOp<'_>], path: &Path) -> bool {
    let mut rw = true;
    for op in ops.iter().copied() {
        let under = |p: &Path| path.starts_with(p);
        match op {
            MountOp::PrivateRoot => {}
            MountOp::ReadOnlyRoot => rw = false,
            // A bind keeps the attributes it was made from: a pin changes
            // nothing but what can be renamed.
            MountOp::Pin(_) | MountOp::PinLink(_) | MountOp::LayerSlot => {}
            // Writable recursively (nothing here is read-only on the host);
            // a tmpfs's carried trees were writable already.
            MountOp::Writable(p)
            | MountOp::Layer(p)
            | MountOp::PrivateTmp(p)
            | MountOp::Reopen(p) => {
                if under(p) {
                    rw = true
                }
            }
            MountOp::ReadOnly(p) | MountOp::Hide(p) => {
                if under(p) {
                    rw = false
                }
            }
        }
    }
    // Writing a device node is no write to its filesystem: a read-only
    // mount does not stop it, Landlock does.
    let device = path.starts_with("/dev");
    let landlock = plan.landlock_dirs.iter().any(|d| path.starts_with(d))
        || plan.landlock_files.iter().any(|f| f == path);
    (rw || device) && landlock
}

/// Whether the plan says it cannot enforce what the policy says at `path`.
fn in_a_gap(plan: &Plan, path: &Path) -> bool {
    plan.gaps.iter().any(|g| {
        let text = g.path.to_string_lossy();
        match text.strip_suffix('*') {
            // `dir/prefix*`: every entry of the granted prefix, and below.
            Some(prefix) => {
                let prefix = Path::new(prefix);
                let (Some(dir), Some(name)) = (prefix.parent(), prefix.file_name()) else {
                    return false;
                };
                path.strip_prefix(dir)
                    .ok()
                    .and_then(|rest| rest.components().next())
                    .is_some_and(|first| {
                        first
                            .as_os_str()
                            .to_string_lossy()
                            .starts_with(&*name.to_string_lossy())
                    })
            }
            None => g.path != Path::new("/") && path.starts_with(&g.path),
        }
    })
}

fn facts() -> UserFacts {
    UserFacts {
        uid: 1000,
        ssh_auth_sock: None,
        xdg_runtime_dir: None,
        home: Some(("/h".into(), "/h".into())),
        supervise: Some(true),
        bound_sockets: vec![],
        layers: None,
    }
}

fn disagreements(policy: &Policy, world: &World, plan: &Plan, paths: &[PathBuf]) -> Vec<String> {
    disagreements_in_order(policy, world, plan, &plan.mount_ops(), paths)
}

/// As [`disagreements`], with the mount operations taken in `ops`'s order.
fn disagreements_in_order(
    policy: &Policy,
    world: &World,
    plan: &Plan,
    ops: &[MountOp<'_>],
    paths: &[PathBuf],
) -> Vec<String> {
    let mut out = Vec::new();
    for path in paths {
        if in_a_gap(plan, path) {
            continue;
        }
        // Nothing can be made beneath a file.
        if path.ancestors().skip(1).any(|a| world.files.contains(a)) {
            continue;
        }
        let expected = policy.evaluate_resolved(path, Op::Write);
        // The plan's gap at `/`: a `.zcode/acp` below a writable
        // directory's top, or made after arming, is not read-only (the
        // approval ledger guards what it may say).
        let made_later = path.ancestors().any(|a| {
            a.file_name().is_some_and(|n| n == ".zcode")
                && !plan.readonly.iter().any(|r| r.path == a.join("acp"))
        });
        if made_later {
            continue;
        }
        // A directory named `.zcode` is itself an island in the policy, so
        // that none can be renamed into place or away; the plan makes an
        // existing one a mountpoint (a pin, or a writable bind of a grant),
        // which no rename moves, while the directory's own attributes
        // follow that mount: a mount's root cannot be read-only while what
        // is beneath it is writable.
        if path.file_name().is_some_and(|n| n == ".zcode")
            && plan
                .writable
                .iter()
                .chain(&plan.pins)
                .any(|w| w.path == *path)
        {
            continue;
        }
        let got = writable(plan, ops, path);
        // A protected file name that is a directory here (a root named
        // `.envrc`) is made read-only whole: more than the policy asks,
        // never less.
        let literal_dir_above = || {
            policy.rules.iter().any(|r| {
                matches!(&r.matcher, Matcher::Literal(l) if world.dirs.contains(l) && path.starts_with(l) && path != l)
            })
        };
        if got != expected.allowed && !(expected.allowed && literal_dir_above()) {
            out.push(format!(
                "{}: plan says {got}, policy says {expected:?}",
                path.display()
            ));
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    #[test]
    fn the_plan_decides_writes_as_the_policy_does(input in linux_projects(), extra in prop::collection::vec(any_path(), 0..20)) {
        let policy = Policy::build(&input);
        let world = World::of(&policy);
        let plan = plan::build(&policy, &world, &facts());
        let mut paths = probes(&policy);
        paths.extend(extra);
        let wrong = disagreements(&policy, &world, &plan, &paths);
        prop_assert!(wrong.is_empty(), "{:#?}\nplan: {:#?}", wrong, plan);
    }
}

/// The model can disagree: a plan without the read-only bind of a
/// protected path, or that binds an island writable, is caught.
#[test]
fn the_model_itself_can_disagree() {
    let input = one_root("/h/src/w");
    let policy = Policy::build(&input);
    let world = World::of(&policy);
    let plan = plan::build(&policy, &world, &facts());
    let tasks = PathBuf::from("/h/src/w/.vscode/tasks.json");
    let island = PathBuf::from("/h/src/w/.zcode/acp/sandbox.json");
    let probes = [tasks.clone(), island.clone()];
    assert!(disagreements(&policy, &world, &plan, &probes).is_empty());
    let mut open_vscode = plan.clone();
    open_vscode
        .readonly
        .retain(|r| !r.path.ends_with(".vscode"));
    assert!(!disagreements(&policy, &world, &open_vscode, std::slice::from_ref(&tasks)).is_empty());
    let mut open_island = plan.clone();
    open_island.reopen.push(plan::Step {
        path: "/h/src/w/.zcode/acp".into(),
        why: "a broken planner".into(),
    });
    assert!(
        !disagreements(&policy, &world, &open_island, std::slice::from_ref(&island)).is_empty()
    );
    // And the order matters: islands bound read-only before the root they
    // are in is bound writable would be opened again by it.
    let ops = plan.mount_ops();
    let (islands, rest): (Vec<MountOp>, Vec<MountOp>) = ops
        .iter()
        .partition(|op| matches!(op, MountOp::ReadOnly(_)));
    let mut islands_first: Vec<MountOp> = rest[..2].to_vec();
    islands_first.extend(islands);
    islands_first.extend(&rest[2..]);
    assert!(!disagreements_in_order(
        &policy,
        &world,
        &plan,
        &islands_first,
        &[tasks.clone(), island]
    )
    .is_empty());
}

/// An island is never granted, at any level: not bound writable, not
/// reopened, and not given Landlock write rights (the only guard at the
/// landlock-only level), even when an approved entry names it.
#[test]
fn an_island_named_by_a_grant_gets_no_write_rights() {
    let mut input = one_root("/h/src/w");
    input.roots[0].project = ProjectRules {
        allow: vec!["/h/.zcode-acp/layers".into()],
        deny: vec!["/h/.zcode-acp".into()],
        strict_git: false,
    };
    input.once_allows = vec!["/h/.zcode-acp".into()];
    let policy = Policy::build(&input);
    let plan = plan::build(&policy, &World::of(&policy), &facts());
    for managed in ["/h/.zcode-acp", "/h/.zcode-acp/layers"] {
        let managed = Path::new(managed);
        assert!(
            !plan.writable.iter().any(|s| s.path == managed),
            "{plan:#?}"
        );
        assert!(!plan.reopen.iter().any(|s| s.path == managed), "{plan:#?}");
        assert!(
            !plan.landlock_dirs.iter().any(|d| d == managed),
            "{plan:#?}"
        );
    }
    assert!(!writable(
        &plan,
        &plan.mount_ops(),
        Path::new("/h/.zcode-acp/ledger/x")
    ));
}
