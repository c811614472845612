//! The tests of `config::project`, kept beside it.

use super::*;

struct Fixture {
    _dirs: (tempfile::TempDir, tempfile::TempDir),
    root: PathBuf,
    managed: ManagedRoot,
}

fn fixture() -> Fixture {
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(ws.path()).unwrap();
    let managed = ManagedRoot::for_home(home.path());
    Fixture {
        _dirs: (ws, home),
        root,
        managed,
    }
}

fn write(root: &Path, text: &str) {
    let dir = create_real_dirs(root, &CONFIG_DIR, 0o755).unwrap();
    std::fs::write(dir.join(CONFIG_FILE), text).unwrap();
}

fn file(root: &Path) -> String {
    std::fs::read_to_string(config_path(root)).unwrap()
}

#[test]
fn first_touch_creates_a_disarmed_template() {
    let f = fixture();
    let r = read(&f.root);
    assert_eq!(r.state, FileState::Created);
    assert!(!r.config.enabled);
    assert_eq!(
        parse(file(&f.root).as_bytes()).unwrap(),
        ProjectConfig::default()
    );
    // Presence is not the switch.
    assert_eq!(read(&f.root).state, FileState::Ok);
    assert!(!prepare(&f.root, &f.managed).armed);
}

#[test]
fn malformed_non_object_and_wrong_types_fail_closed_without_a_rewrite() {
    let f = fixture();
    for text in [
        r#"{"enabled": false, "allow": ["/x"]"#,
        r#"["enabled", false]"#,
        r#"{"enabled": "false"}"#,
        r#"{"enabled": false, "allow": "/x"}"#,
        r#"{"enabled": false, "deny": [1]}"#,
    ] {
        write(&f.root, text);
        let r = read(&f.root);
        assert!(
            matches!(r.state, FileState::Malformed(_)),
            "{text}: {:?}",
            r.state
        );
        assert!(r.config.enabled && r.config.allow.is_empty(), "{text}");
        assert!(
            append(&f.root, List::Allow, "/y", &f.managed).is_err(),
            "{text}"
        );
        assert_eq!(file(&f.root), text, "the user's bytes are untouched");
    }
}

#[test]
fn symlinked_and_hardlinked_configs_are_armed_and_not_persisted() {
    let f = fixture();
    let elsewhere = f.root.join("elsewhere.json");
    std::fs::write(&elsewhere, r#"{"enabled": false}"#).unwrap();
    create_real_dirs(&f.root, &CONFIG_DIR, 0o755).unwrap();
    std::os::unix::fs::symlink(&elsewhere, config_path(&f.root)).unwrap();
    let r = read(&f.root);
    assert!(r.config.enabled && matches!(r.state, FileState::Untrusted(_)));
    assert!(append(&f.root, List::Allow, "/y", &f.managed).is_err());
    assert_eq!(
        std::fs::read_to_string(&elsewhere).unwrap(),
        r#"{"enabled": false}"#
    );

    std::fs::remove_file(config_path(&f.root)).unwrap();
    std::fs::hard_link(&elsewhere, config_path(&f.root)).unwrap();
    let r = read(&f.root);
    assert!(r.config.enabled);
    assert!(append(&f.root, List::Deny, "/y", &f.managed).is_err());

    // A symlinked .zcode directory is untrusted too.
    let g = fixture();
    let real = g.root.join("real");
    std::fs::create_dir_all(real.join("acp")).unwrap();
    std::os::unix::fs::symlink(&real, g.root.join(".zcode")).unwrap();
    assert!(matches!(read(&g.root).state, FileState::Untrusted(_)));
}

#[test]
fn an_armed_config_that_vanishes_or_turns_unreadable_stays_armed() {
    let f = fixture();
    write(&f.root, r#"{"enabled": true}"#);
    assert!(prepare(&f.root, &f.managed).armed);
    std::fs::remove_file(config_path(&f.root)).unwrap();
    // The template comes back disarmed, but the ledger remembers.
    let again = prepare(&f.root, &f.managed);
    assert!(
        again.armed && again.state == FileState::Created,
        "{again:?}"
    );
    assert!(!read(&f.root).config.enabled);
    std::fs::write(config_path(&f.root), b"{not json").unwrap();
    assert!(prepare(&f.root, &f.managed).armed);
}

#[test]
fn append_keeps_unknown_keys_dedupes_and_writes_atomically() {
    let f = fixture();
    write(
        &f.root,
        r#"{"enabled": true, "allow": ["/a"], "future": {"x": 1}}"#,
    );
    assert!(append(&f.root, List::Allow, "/b", &f.managed).is_ok());
    assert!(append(&f.root, List::Allow, "/b", &f.managed).is_ok());
    assert!(append(&f.root, List::Deny, "/c", &f.managed).is_ok());
    let v: Value = serde_json::from_str(&file(&f.root)).unwrap();
    assert_eq!(v["allow"], json!(["/a", "/b"]));
    assert_eq!(v["deny"], json!(["/c"]));
    assert_eq!(v["future"], json!({"x": 1}));
    assert_eq!(v["enabled"], true);
    let leftovers: Vec<_> = std::fs::read_dir(config_path(&f.root).parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(leftovers.len(), 1, "no temp files left: {leftovers:?}");
}

#[test]
fn the_ledger_gates_permissive_changes() {
    let f = fixture();
    // A hand-added allow entry is ignored until approved.
    write(&f.root, r#"{"enabled": true, "allow": ["/usr"]}"#);
    let e = prepare(&f.root, &f.managed);
    assert!(e.armed && e.rules.allow.is_empty());
    assert!(
        e.ignored.iter().any(|i| i.contains("/usr")),
        "{:?}",
        e.ignored
    );
    // The bridge's own append is approved in the same step.
    assert!(append(&f.root, List::Allow, "/var", &f.managed).is_ok());
    let e = prepare(&f.root, &f.managed);
    assert_eq!(e.rules.allow, vec!["/var".to_owned()]);
    // An unapproved `enabled: false` keeps the sandbox armed.
    let text = file(&f.root).replace("\"enabled\": true", "\"enabled\": false");
    write(&f.root, &text);
    let e = prepare(&f.root, &f.managed);
    assert!(e.armed, "{:?}", e.ignored);
    // Approving the hand edit makes both count.
    approve_current(&f.root, &f.managed).unwrap();
    let e = prepare(&f.root, &f.managed);
    assert!(!e.armed);
    assert_eq!(e.rules.allow.len(), 2);
    assert!(e.ignored.is_empty());
}

#[test]
fn removed_entries_need_a_new_approval() {
    let f = fixture();
    write(&f.root, r#"{"enabled": true}"#);
    assert!(append(&f.root, List::Allow, "/opt", &f.managed).is_ok());
    write(&f.root, r#"{"enabled": true, "allow": []}"#);
    prepare(&f.root, &f.managed);
    write(&f.root, r#"{"enabled": true, "allow": ["/opt"]}"#);
    assert!(prepare(&f.root, &f.managed).rules.allow.is_empty());
}

#[test]
fn two_writers_never_lose_each_others_entries() {
    let f = fixture();
    write(&f.root, r#"{"enabled": true}"#);
    let handles: Vec<_> = (0..8)
        .map(|i| {
            let (root, managed) = (f.root.clone(), f.managed.clone());
            std::thread::spawn(move || {
                for j in 0..10 {
                    assert!(append(&root, List::Allow, &format!("/p{i}-{j}"), &managed).is_ok());
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let v: Value = serde_json::from_str(&file(&f.root)).unwrap();
    assert_eq!(v["allow"].as_array().unwrap().len(), 80);
    assert_eq!(Ledger::new(f.managed.clone()).load(&f.root).allow.len(), 80);
}

#[test]
fn persistence_is_refused_where_the_file_cannot_be_written() {
    let f = fixture();
    let ro = f.root.join("ro");
    std::fs::create_dir_all(&ro).unwrap();
    // A regular file where the .zcode directory should be.
    std::fs::write(ro.join(".zcode"), "").unwrap();
    assert!(append(&ro, List::Allow, "/x", &f.managed).is_err());
    // Something odd in the way reads as armed, never as "off".
    let r = read(&ro);
    assert!(r.config.enabled, "{r:?}");
}

#[test]
fn an_always_allowed_connection_widens_the_table_and_is_approved() {
    let f = fixture();
    write(
        &f.root,
        r#"{"enabled": true, "future": 1, "network": {"egress": ["a.com"]}}"#,
    );
    // The file's table was never approved: recording would approve it.
    let port =
        crate::config::network::NetworkTable::parse(&json!({"hostLoopback": [8888]})).unwrap();
    assert!(matches!(
        widen_network(&f.root, &port, &f.managed),
        Err(WriteError::UnapprovedNetwork)
    ));
    approve_current(&f.root, &f.managed).unwrap();
    let grant = |v: serde_json::Value| crate::config::network::NetworkTable::parse(&v).unwrap();
    widen_network(&f.root, &grant(json!({"hostLoopback": [8888]})), &f.managed).unwrap();
    widen_network(&f.root, &grant(json!({"egress": ["b.com"]})), &f.managed).unwrap();
    let v: Value = serde_json::from_str(&file(&f.root)).unwrap();
    assert_eq!(
        v["network"],
        json!({"hostLoopback": [8888], "egress": ["a.com", "b.com"]})
    );
    assert_eq!(v["future"], 1);
    let eff = prepare(&f.root, &f.managed);
    assert_eq!(eff.network.unwrap().to_json(), v["network"]);
    assert!(eff.ignored.is_empty(), "{:?}", eff.ignored);
}

#[test]
fn a_network_table_counts_once_approved_as_written() {
    let table = |v: serde_json::Value| crate::config::network::NetworkTable::parse(&v).unwrap();
    let wide = table(json!({"hostLoopback": [11434]}));
    let read = |network: Option<crate::config::network::NetworkTable>| ProjectRead {
        config: ProjectConfig {
            network,
            ..ProjectConfig::default()
        },
        state: FileState::Ok,
    };
    let approved = |network| Approved {
        root: "/p".into(),
        network,
        ..Approved::default()
    };
    let asked = effective(&read(Some(wide.clone())), &approved(None));
    assert_eq!(asked.network, None);
    assert!(
        asked.ignored.iter().any(|w| w.contains("`network`")),
        "{:?}",
        asked.ignored
    );
    let ok = effective(&read(Some(wide.clone())), &approved(Some(wide.clone())));
    assert_eq!(ok.network, Some(wide.clone()));
    // Another table than the one approved is asked again.
    let other = table(json!({"hostLoopback": [11434, 22]}));
    assert_eq!(
        effective(&read(Some(other)), &approved(Some(wide.clone()))).network,
        None
    );
    // An egress entry adds to a user's list: asked like any other.
    let hosts = table(json!({"egress": ["example.com"]}));
    assert_eq!(effective(&read(Some(hosts)), &approved(None)).network, None);
    // Nothing but denials: nothing to approve.
    let closed = table(json!({"lan": "deny"}));
    assert_eq!(
        effective(&read(Some(closed.clone())), &approved(None)).network,
        Some(closed)
    );
    // Narrower than approved: applied, and recorded as the approval.
    let both = table(json!({"hostLoopback": [11434, 22]}));
    let cut = effective(&read(Some(wide.clone())), &approved(Some(both)));
    assert_eq!(cut.network, Some(wide.clone()));
    assert_eq!(cut.ledger.network, Some(wide.clone()));
    // Removed: it leaves the ledger.
    assert_eq!(
        effective(&read(None), &approved(Some(wide))).ledger.network,
        None
    );
    // A wrong table makes the file malformed: armed, nothing allowed.
    assert!(parse(br#"{"network": {"lan": "open"}}"#).is_err());
}

#[test]
fn code_exec_counts_only_once_approved_and_turning_it_off_is_recorded() {
    let read = |code_exec: bool| ProjectRead {
        config: ProjectConfig {
            code_exec,
            ..ProjectConfig::default()
        },
        state: FileState::Ok,
    };
    let approved = |code_exec: Option<bool>| Approved {
        root: "/p".into(),
        code_exec,
        ..Approved::default()
    };
    let asked = effective(&read(true), &approved(None));
    assert!(!asked.code_exec);
    assert!(asked.code_exec_unapproved, "{:?}", asked.ignored);
    assert!(effective(&read(true), &approved(Some(true))).code_exec);
    // Off at once, and recorded: on again needs a new approval.
    let off = effective(&read(false), &approved(Some(true)));
    assert!(!off.code_exec);
    assert_eq!(off.ledger.code_exec, Some(false));
    assert!(!effective(&read(true), &off.ledger).code_exec);
    // A malformed file never turns it on.
    assert!(
        !effective(
            &armed_without_entries(FileState::Malformed("x".into())),
            &approved(Some(true))
        )
        .code_exec
    );
}
