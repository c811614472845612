//! The tests of `linux::plan`, kept beside it.

use super::*;
use crate::policy::build::{Platform, PolicyInput, ProjectRules, Repo, RootInput, Writable};
use std::collections::BTreeMap;

/// A fake filesystem: path -> is_dir, and the symlinks among them with
/// whether each leads somewhere.
struct FakeFs(BTreeMap<PathBuf, bool>, Vec<(PathBuf, bool)>);

impl Fs for FakeFs {
    fn is_dir(&self, p: &Path) -> bool {
        self.0.get(p) == Some(&true)
    }
    fn exists(&self, p: &Path) -> bool {
        self.0.contains_key(p)
    }
    fn list(&self, p: &Path) -> Vec<String> {
        self.0
            .keys()
            .filter(|k| k.parent() == Some(p))
            .map(|k| k.file_name().unwrap().to_string_lossy().into_owned())
            .collect()
    }
    /// Files named `*.sock` or `S.*` are sockets here.
    fn is_socket(&self, p: &Path) -> bool {
        let name = p.file_name().unwrap_or_default().to_string_lossy();
        self.0.get(p) == Some(&false) && (name.ends_with(".sock") || name.starts_with("S."))
    }
    fn is_symlink(&self, p: &Path) -> bool {
        self.1.iter().any(|(l, _)| l == p)
    }
    fn resolves(&self, p: &Path) -> bool {
        match self.1.iter().find(|(l, _)| l == p) {
            Some((_, leads)) => *leads,
            None => self.exists(p),
        }
    }
}

fn fake(entries: &[(&str, bool)]) -> FakeFs {
    FakeFs(
        entries
            .iter()
            .map(|(p, d)| (PathBuf::from(p), *d))
            .collect(),
        Vec::new(),
    )
}

fn policy() -> Policy {
    Policy::build(&PolicyInput {
        links: Vec::new(),
        platform: Platform::Linux,
        home: "/home/u".into(),
        roots: vec![RootInput {
            path: "/home/u/w".into(),
            project: ProjectRules::default(),
            repos: vec![Repo {
                work_tree: "/home/u/w".into(),
                git_dir: "/home/u/w/.git".into(),
                common_dir: "/home/u/w/.git".into(),
                hooks_path: None,
                gitfile: false,
            }],
        }],
        backend_state: vec![Writable {
            matcher: Matcher::NamePrefix {
                dir: "/home/u".into(),
                prefix: ".zcode".into(),
            },
            why: "zcode".into(),
            layered: false,
        }],
        temp_and_caches: vec![Writable {
            matcher: Matcher::Subpath("/tmp".into()),
            why: "temp".into(),
            layered: false,
        }],
        once_allows: vec![],
        profile_dir: None,
        managed_root: "/home/u/.zcode-acp".into(),
        network: Default::default(),
    })
}

#[test]
fn the_plan_follows_the_policy() {
    let fs = fake(&[
        ("/home/u", true),
        ("/home/u/w", true),
        ("/home/u/w/.git", true),
        ("/home/u/w/.git/hooks", true),
        ("/home/u/w/.git/config", false),
        ("/home/u/w/.zcode", true),
        ("/home/u/w/.zcode/acp", true),
        ("/home/u/.zcode-shell-agent", true),
        ("/home/u/.zcode-acp", true),
        ("/tmp", true),
        ("/dev/null", false),
        ("/dev/pts", true),
        ("/dev/shm", true),
        ("/run/user/1000", true),
    ]);
    let facts = UserFacts {
        uid: 1000,
        ..UserFacts::default()
    };
    let plan = build(&policy(), &fs, &facts);
    let paths = |steps: &[Step]| {
        steps
            .iter()
            .map(|s| s.path.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        paths(&plan.writable),
        vec!["/home/u/w", "/home/u/.zcode-shell-agent"]
    );
    assert_eq!(paths(&plan.tmpfs), vec!["/tmp", "/dev/shm"]);
    assert_eq!(
        paths(&plan.pins),
        vec!["/home/u/w", "/home/u/w/.git", "/home/u/w/.zcode"]
    );
    assert_eq!(
        paths(&plan.readonly),
        vec![
            "/home/u/.zcode-acp",
            "/home/u/w/.git/hooks",
            "/home/u/w/.git/config",
            "/home/u/w/.zcode/acp"
        ]
    );
    assert_eq!(paths(&plan.hidden), vec!["/run/user/1000"]);

    assert!(plan.landlock_files.contains(&PathBuf::from("/dev/null")));
    assert!(plan.landlock_dirs.contains(&PathBuf::from("/dev/pts")));
    // What cannot be enforced is said, not hidden.
    assert!(plan
        .gaps
        .iter()
        .any(|g| g.path == Path::new("/home/u/w/.envrc")));
    // Bound sockets: covered but for the few allowed, and those inside a
    // covered directory need nothing more.
    let fs2 = fake(&[
        ("/home/u", true),
        ("/home/u/w", true),
        ("/home/u/.gnupg/S.gpg-agent", false),
        ("/home/u/w/dev.sock", false),
        ("/run/user/1000", true),
        ("/run/user/1000/bus", false),
        ("/run/systemd/journal/socket", false),
        ("/run/systemd/private", false),
    ]);
    let facts2 = UserFacts {
        uid: 1000,
        xdg_runtime_dir: Some("/run/custom".into()),
        bound_sockets: [
            "/home/u/.gnupg/S.gpg-agent",
            "/home/u/w/dev.sock",
            "/run/user/1000/bus",
            "/run/systemd/journal/socket",
            "/srv/other-namespace.sock",
        ]
        .iter()
        .map(PathBuf::from)
        .collect(),
        ..UserFacts::default()
    };
    let plan2 = build(&policy(), &fs2, &facts2);
    assert_eq!(
        paths(&plan2.hidden),
        vec![
            "/run/user/1000",
            "/run/systemd/private",
            "/home/u/.gnupg/S.gpg-agent",
            "/home/u/w/dev.sock"
        ]
    );
    assert!(plan2
        .gaps
        .iter()
        .any(|g| g.path == Path::new("/srv/other-namespace.sock")));
}

/// A protected path that is a symlink: the link is pinned (a read-only
/// bind alone would follow it and leave the link free to be replaced).
/// A protected directory's contents are read-only through it; a
/// protected file's link is held by its name alone, what it leads to
/// having a rule of its own (`build_resolving_links`).
#[test]
fn protected_symlinks_are_pinned_themselves() {
    let mut fs = fake(&[
        ("/home/u", true),
        ("/home/u/w", true),
        ("/home/u/w/.git", true),
        ("/home/u/w/.git/hooks", true),
        ("/home/u/w/.envrc", false),
    ]);
    fs.1 = vec![
        (PathBuf::from("/home/u/w/.git/hooks"), true),
        (PathBuf::from("/home/u/w/.envrc"), false),
    ];
    let plan = build(&policy(), &fs, &UserFacts::default());
    let names = |steps: &[Step]| -> Vec<String> {
        steps.iter().map(|s| s.path.display().to_string()).collect()
    };
    assert_eq!(
        names(&plan.links),
        ["/home/u/w/.envrc", "/home/u/w/.git/hooks"]
    );
    let readonly = names(&plan.readonly);
    assert!(readonly.contains(&"/home/u/w/.git/hooks".to_owned()));
    assert!(!readonly.contains(&"/home/u/w/.envrc".to_owned()));
    let ops = plan.mount_ops();
    let at = |op: MountOp| ops.iter().position(|o| *o == op).unwrap();
    assert!(
        at(MountOp::PinLink(Path::new("/home/u/w/.git/hooks")))
            < at(MountOp::ReadOnly(Path::new("/home/u/w/.git/hooks")))
    );
}

/// A socket bound under a temporary name and linked or renamed into
/// place (OpenSSH's ControlMaster) is listed by the name it was bound
/// to, which is gone: what sits beside that name is covered.
#[test]
fn sockets_moved_beside_a_bound_name_are_covered() {
    let fs = fake(&[
        ("/home/u", true),
        ("/home/u/w", true),
        ("/home/u/.ssh", true),
        ("/home/u/.ssh/cm-host.sock", false),
        ("/home/u/.ssh/config", false),
        ("/run/systemd/journal/socket", false),
        ("/run/systemd/journal/S.other", false),
    ]);
    let facts = UserFacts {
        uid: 1000,
        bound_sockets: [
            "/home/u/.ssh/cm-host.sock.Xq2a",
            "/run/systemd/journal/socket",
        ]
        .iter()
        .map(PathBuf::from)
        .collect(),
        ..UserFacts::default()
    };
    let plan = build(&policy(), &fs, &facts);
    let hidden: Vec<&str> = plan
        .hidden
        .iter()
        .map(|s| s.path.to_str().unwrap())
        .collect();
    assert!(hidden.contains(&"/home/u/.ssh/cm-host.sock"), "{hidden:?}");
    // Beside an allowed one too, but the allowed stays reachable.
    assert!(
        hidden.contains(&"/run/systemd/journal/S.other"),
        "{hidden:?}"
    );
    assert!(
        !hidden.contains(&"/run/systemd/journal/socket"),
        "{hidden:?}"
    );
    assert!(!hidden.contains(&"/home/u/.ssh/config"), "{hidden:?}");
}

#[test]
fn what_a_private_tmp_hides_needs_no_step_but_a_carried_workspace_keeps_its_own() {
    // A session once opened in the host's /tmp left a .zcode there; a
    // workspace in /tmp is carried over with its config.
    let policy = Policy::build(&PolicyInput {
        links: Vec::new(),
        platform: Platform::Linux,
        home: "/home/u".into(),
        roots: vec![RootInput {
            path: "/tmp/ws".into(),
            project: ProjectRules::default(),
            repos: vec![],
        }],
        backend_state: vec![],
        temp_and_caches: vec![Writable {
            matcher: Matcher::Subpath("/tmp".into()),
            why: "temp".into(),
            layered: false,
        }],
        once_allows: vec![],
        profile_dir: None,
        managed_root: "/home/u/.zcode-acp".into(),
        network: Default::default(),
    });
    let fs = fake(&[
        ("/home/u", true),
        ("/tmp", true),
        ("/tmp/.zcode", true),
        ("/tmp/.zcode/acp", true),
        ("/tmp/ws", true),
        ("/tmp/ws/.zcode", true),
        ("/tmp/ws/.zcode/acp", true),
    ]);
    let plan = build(&policy, &fs, &UserFacts::default());
    let has = |steps: &[Step], p: &str| steps.iter().any(|s| s.path == Path::new(p));
    assert!(has(&plan.writable, "/tmp/ws"), "{plan:?}");
    assert!(!has(&plan.readonly, "/tmp/.zcode/acp"), "{plan:?}");
    assert!(!has(&plan.pins, "/tmp/.zcode"), "{plan:?}");
    assert!(has(&plan.readonly, "/tmp/ws/.zcode/acp"), "{plan:?}");
    assert!(has(&plan.pins, "/tmp/ws/.zcode"), "{plan:?}");
}

#[test]
fn supervised_name_prefixes_bind_directories_but_not_files() {
    let fs = fake(&[
        ("/home/u", true),
        ("/home/u/w", true),
        ("/home/u/.zcode-shell-agent", true),
        ("/home/u/.zcode-shell-agent/t.jsonl", false),
        ("/home/u/.zcode-lock", true),
        ("/home/u/.zcode-notes", false),
        ("/home/u/.zcode-acp", true),
    ]);
    let facts = UserFacts {
        uid: 1000,
        home: Some(("/users/u".into(), "/home/u".into())),
        supervise: Some(true),
        ..UserFacts::default()
    };
    let plan = build(&policy(), &fs, &facts);
    let writable: Vec<_> = plan.writable.iter().map(|s| s.path.clone()).collect();
    // A bound file would pin its old inode: a save renamed over it
    // would fail. The supervisor serves it instead.
    assert!(writable.contains(&PathBuf::from("/home/u/.zcode-shell-agent")));
    assert!(!writable.contains(&PathBuf::from("/home/u/.zcode-notes")));
    // An empty one (a stale lock) is left to the supervisor too.
    assert!(!writable.contains(&PathBuf::from("/home/u/.zcode-lock")));
    assert!(!plan
        .landlock_files
        .contains(&PathBuf::from("/home/u/.zcode-notes")));
    assert_eq!(
        plan.supervised,
        vec![Supervised {
            dir: "/home/u".into(),
            spellings: vec!["/users/u".into()],
            prefixes: vec![".zcode".into()],
        }]
    );
    // Without a supervisor the old way holds, and the gap says so.
    let plain = build(
        &policy(),
        &fs,
        &UserFacts {
            supervise: Some(false),
            ..facts
        },
    );
    assert!(plain.supervised.is_empty());
    assert!(plain
        .writable
        .iter()
        .any(|s| s.path == Path::new("/home/u/.zcode-notes")));
    assert!(plain
        .gaps
        .iter()
        .any(|g| g.why.contains("cannot supervise")));
}
