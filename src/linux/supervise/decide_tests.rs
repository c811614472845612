//! The tests of `linux::supervise::decide`, kept beside it.

use super::*;
use crate::policy::build::{Platform, PolicyInput, Writable};
use crate::policy::Matcher;
use std::path::PathBuf;

fn setup() -> (Vec<Supervised>, Policy) {
    let home = PathBuf::from("/home/u");
    let policy = Policy::build(&PolicyInput {
        links: Vec::new(),
        platform: Platform::Linux,
        home: home.clone(),
        roots: vec![],
        backend_state: vec![
            Writable {
                matcher: Matcher::NamePrefix {
                    dir: home.clone(),
                    prefix: ".claude.json".into(),
                },
                why: "claude".into(),
                layered: false,
            },
            Writable {
                matcher: Matcher::NamePrefix {
                    dir: home.clone(),
                    prefix: ".zcode".into(),
                },
                why: "zcode".into(),
                layered: false,
            },
        ],
        temp_and_caches: vec![],
        once_allows: vec![],
        profile_dir: None,
        managed_root: home.join(".zcode-acp"),
        network: Default::default(),
    });
    let dirs = vec![Supervised {
        dir: home,
        spellings: vec!["/users/u".into()],
        prefixes: vec![".claude.json".into(), ".zcode".into()],
    }];
    (dirs, policy)
}

fn open(path: &str, flags: i32) -> Call {
    Call::Open {
        at: libc::AT_FDCWD,
        path: path.as_bytes().to_vec(),
        flags,
        mode: 0o666,
    }
}

fn decide_with_cwd(call: &Call, cwd_is_home: bool) -> Option<Act> {
    let (dirs, policy) = setup();
    decide(call, &dirs, &policy, &mut |_, _| cwd_is_home)
}

#[test]
fn claude_saves_its_settings_through_the_supervisor() {
    let w = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL;
    let act = decide_with_cwd(&open("/home/u/.claude.json.tmp.42.abc", w), false);
    assert_eq!(
        act,
        Some(Act::Open {
            dir: 0,
            name: ".claude.json.tmp.42.abc".into(),
            flags: w,
            mode: 0o666
        })
    );
    // The lock directory and the rename over the file.
    assert!(matches!(
        decide_with_cwd(
            &Call::Mkdir {
                at: libc::AT_FDCWD,
                path: b"/home/u/.claude.json.lock".to_vec(),
                mode: 0o777
            },
            false
        ),
        Some(Act::Mkdir { .. })
    ));
    let rename = Call::Rename {
        from_at: libc::AT_FDCWD,
        from: b"/home/u/.claude.json.tmp.42.abc".to_vec(),
        to_at: libc::AT_FDCWD,
        to: b"/home/u/.claude.json".to_vec(),
        flags: 0,
    };
    assert!(matches!(
        decide_with_cwd(&rename, false),
        Some(Act::Rename { .. })
    ));
    // Spelled through the other name of the home directory.
    assert!(decide_with_cwd(&open("/users/u/.zcode-x", w), false).is_some());
    // Whatever flags a version of Node or of the agent picks.
    for flags in [
        libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
        libc::O_WRONLY | libc::O_CREAT,
        libc::O_RDWR | libc::O_CREAT | libc::O_APPEND,
        libc::O_WRONLY | libc::O_TRUNC,
    ] {
        assert!(
            decide_with_cwd(&open("/home/u/.claude.json.tmp.5.1", flags), false).is_some(),
            "{flags:#o}"
        );
    }
    let unlink = Call::Unlink {
        at: libc::AT_FDCWD,
        path: b"/home/u/.claude.json.tmp.5.1".to_vec(),
    };
    assert!(matches!(
        decide_with_cwd(&unlink, false),
        Some(Act::Unlink { .. })
    ));
    let link = Call::Link {
        from_at: libc::AT_FDCWD,
        from: b"/home/u/.claude.json.tmp".to_vec(),
        to_at: libc::AT_FDCWD,
        to: b"/home/u/.claude.json.lk".to_vec(),
        flags: 0,
    };
    assert!(matches!(
        decide_with_cwd(&link, false),
        Some(Act::Link { .. })
    ));
    let lock = Call::Symlink {
        target: b"host:1234".to_vec(),
        at: libc::AT_FDCWD,
        path: b"/home/u/.zcode-lock".to_vec(),
    };
    assert!(matches!(
        decide_with_cwd(&lock, false),
        Some(Act::Symlink { .. })
    ));
}

#[test]
fn nothing_else_in_home_is_taken_on() {
    let w = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL;
    // An open that makes nothing is never taken on, even for a
    // granted name.
    for flags in [libc::O_WRONLY, libc::O_RDWR | libc::O_APPEND] {
        assert_eq!(
            decide_with_cwd(&open("/home/u/.claude.json", flags), false),
            None
        );
    }
    // Nor a second name for a file of yours, a link that leads out,
    // or the removal of anything not granted.
    let link = |from: &str, to: &str| Call::Link {
        from_at: libc::AT_FDCWD,
        from: from.as_bytes().to_vec(),
        to_at: libc::AT_FDCWD,
        to: to.as_bytes().to_vec(),
        flags: 0,
    };
    assert_eq!(
        decide_with_cwd(&link("/home/u/.bashrc", "/home/u/.claude.json.hl"), false),
        None
    );
    assert_eq!(
        decide_with_cwd(&link("/home/u/.claude.json", "/home/u/.profile"), false),
        None
    );
    let mut followed = link("/home/u/.zcode-a", "/home/u/.zcode-b");
    if let Call::Link { flags, .. } = &mut followed {
        *flags = libc::AT_SYMLINK_FOLLOW;
    }
    assert_eq!(decide_with_cwd(&followed, false), None);
    for (target, at) in [
        (".bash_profile", "/home/u/.claude.json.sl"),
        // A note with a path in it would lead wherever the path does.
        ("host:1/../.bashrc", "/home/u/.claude.json.sl"),
        ("notes", "/home/u/.claude.json.sl"),
        ("/home/u/.bashrc", "/home/u/.claude.json.sl"),
        ("../u/.bashrc", "/home/u/.claude.json.sl"),
        ("..", "/home/u/.claude.json.sl"),
        ("host:1", "/home/u/.profile"),
    ] {
        let call = Call::Symlink {
            target: target.as_bytes().to_vec(),
            at: libc::AT_FDCWD,
            path: at.as_bytes().to_vec(),
        };
        assert_eq!(decide_with_cwd(&call, false), None, "{target} at {at}");
    }
    let unlink = Call::Unlink {
        at: libc::AT_FDCWD,
        path: b"/home/u/.bashrc".to_vec(),
    };
    assert_eq!(decide_with_cwd(&unlink, false), None);
    for path in [
        "/home/u/.bashrc",
        "/home/u/.profile",
        "/home/u/.bash_profile",
        "/home/u/.claude.jso",
        "/home/u/x/.claude.json",
        "/home/u/.zcode-shell-agent/t.jsonl",
        "/home/u/../u/.claude.json",
        "/home/u//.claude.json",
        "/home/u/.claude.json/",
        "/home/uu/.claude.json",
        "/home/u",
        "/etc/passwd",
        // The managed root matches the prefix; its island takes it back.
        "/home/u/.zcode-acp",
    ] {
        assert_eq!(decide_with_cwd(&open(path, w), true), None, "{path}");
    }
    // O_TMPFILE / O_PATH are never ours.
    assert_eq!(
        decide_with_cwd(
            &open(
                "/home/u/.zcode-x",
                libc::O_TMPFILE | libc::O_RDWR | libc::O_EXCL
            ),
            false
        ),
        None
    );
    // A rename that brings something in from elsewhere, or takes a
    // granted entry out, is the kernel's.
    for (from, to) in [
        ("/home/u/w/evil", "/home/u/.zcode-x"),
        ("/home/u/.zcode-x", "/home/u/.bashrc"),
        ("/home/u/.zcode-acp", "/home/u/.zcode-y"),
    ] {
        let r = Call::Rename {
            from_at: libc::AT_FDCWD,
            from: from.as_bytes().to_vec(),
            to_at: libc::AT_FDCWD,
            to: to.as_bytes().to_vec(),
            flags: 0,
        };
        assert_eq!(decide_with_cwd(&r, false), None, "{from} -> {to}");
    }
}

#[test]
fn a_relative_name_counts_only_where_the_caller_is_in_the_directory() {
    let w = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL;
    assert!(decide_with_cwd(&open(".zcode-notes", w), true).is_some());
    assert_eq!(decide_with_cwd(&open(".zcode-notes", w), false), None);
    assert_eq!(decide_with_cwd(&open("./.zcode-notes", w), true), None);
    assert_eq!(decide_with_cwd(&open(".bashrc", w), true), None);
}

#[test]
fn calls_are_decoded_from_their_arguments() {
    let mut mem = |addr: u64| Some(format!("/p{addr}").into_bytes());
    let c = decode(
        libc::SYS_renameat2 as u32,
        [
            3,
            1,
            libc::AT_FDCWD as u64,
            2,
            libc::RENAME_NOREPLACE as u64,
            0,
        ],
        &mut mem,
    );
    assert_eq!(
        c,
        Some(Call::Rename {
            from_at: 3,
            from: b"/p1".to_vec(),
            to_at: libc::AT_FDCWD,
            to: b"/p2".to_vec(),
            flags: libc::RENAME_NOREPLACE
        })
    );
    let c = decode(
        libc::SYS_unlinkat as u32,
        [3, 7, libc::AT_REMOVEDIR as u64, 0, 0, 0],
        &mut mem,
    );
    assert!(matches!(c, Some(Call::Rmdir { at: 3, .. })));
    let c = decode(libc::SYS_unlinkat as u32, [3, 7, 0, 0, 0, 0], &mut mem);
    assert!(matches!(c, Some(Call::Unlink { at: 3, .. })));
    let c = decode(libc::SYS_linkat as u32, [3, 1, 4, 2, 0, 0], &mut mem);
    assert_eq!(
        c,
        Some(Call::Link {
            from_at: 3,
            from: b"/p1".to_vec(),
            to_at: 4,
            to: b"/p2".to_vec(),
            flags: 0
        })
    );
    let c = decode(libc::SYS_symlinkat as u32, [1, 5, 2, 0, 0, 0], &mut mem);
    assert_eq!(
        c,
        Some(Call::Symlink {
            target: b"/p1".to_vec(),
            at: 5,
            path: b"/p2".to_vec()
        })
    );
    // An unreadable path: not ours.
    let mut none = |_: u64| None;
    assert_eq!(decode(libc::SYS_openat as u32, [0; 6], &mut none), None);
}
