//! Finding the repositories under the roots: the one a root is in, every
//! nested one, their submodules' and linked worktrees' git directories, and
//! each one's `core.hooksPath` (asked of a git that cannot have been
//! planted, or read from its config where git cannot be asked).

use std::path::{Path, PathBuf};

use super::build::Repo;
use super::resolve_real;
use crate::listing::{Entries, Kind, Listing};

/// How far below a root repositories are looked for, and how many entries
/// at most are looked at: arming must stay fast on huge trees. A repository
/// deeper than this (or created later) has no protected hooks/config.
const MAX_DEPTH: usize = 6;
#[cfg(not(test))]
const MAX_ENTRIES: usize = 20_000;
/// (Small in unit tests, which fill it on purpose.)
#[cfg(test)]
const MAX_ENTRIES: usize = 300;

/// Directories that never hold repositories worth protecting and can be
/// huge.
const SKIP_DIRS: &[&str] = &[
    "node_modules",
    "target",
    ".venv",
    "venv",
    "__pycache__",
    ".cache",
    ".zcode",
];

/// The repositories a root belongs to or contains: the enclosing one (a
/// root may be a subfolder of a repository, whose git dir commits need) and
/// every nested one that exists now.
pub fn find_repos(root: &Path) -> Vec<Repo> {
    find_repos_with(root, true)
}

/// [`find_repos`] without asking git for each repository's hooks path
/// (the post-turn audit looks often).
pub fn find_repos_quick(root: &Path) -> Vec<Repo> {
    find_repos_with(root, false)
}

fn find_repos_with(root: &Path, hooks: bool) -> Vec<Repo> {
    let mut repos = Vec::new();
    // The repository the root itself is in, if any.
    if let Some(repo) = enclosing_repo(root, hooks) {
        repos.push(repo);
    }
    let (whole, nested) = crate::listing::walk_anchored(root, |anchor| {
        let (mut budget, mut nested) = (MAX_ENTRIES, Vec::new());
        let whole = walk(anchor, root, 0, &mut budget, hooks, &mut nested);
        (whole, nested)
    });
    repos.extend(nested);
    if !whole {
        // Once per root, not once per directory the walk was in.
        tracing::warn!(root = %root.display(), "stopped looking for nested git repositories after {MAX_ENTRIES} entries: one further in has no read-only hooks or config (the audit still looks at what a command leaves there)");
    }
    with_their_git_dirs(repos)
}

/// The repository `dir` is in (itself or an ancestor's work tree).
fn enclosing_repo(dir: &Path, hooks: bool) -> Option<Repo> {
    dir.ancestors().find_map(|d| repo_at(d, hooks))
}

/// The repositories of `work_trees` (found by a walk of the caller's) and
/// the ones `roots` are inside, with their submodules' and linked
/// worktrees' git directories; `core.hooksPath` not asked.
pub fn repos_of_work_trees(roots: &[PathBuf], work_trees: &[PathBuf]) -> Vec<Repo> {
    let mut repos: Vec<Repo> = roots
        .iter()
        .filter_map(|r| enclosing_repo(r, false))
        .collect();
    repos.extend(work_trees.iter().filter_map(|w| repo_at(w, false)));
    with_their_git_dirs(repos)
}

/// `repos` (each work tree once), with the git directories of their
/// submodules and linked worktrees.
fn with_their_git_dirs(mut repos: Vec<Repo>) -> Vec<Repo> {
    let mut seen = std::collections::HashSet::new();
    repos.retain(|r| seen.insert(r.work_tree.clone()));
    // Submodules' git directories (`.git/modules/NAME`, nested the same way)
    // hold a config and hooks of their own, checked out or not.
    let mut modules = Vec::new();
    for r in &repos {
        module_git_dirs(&r.common_dir.join("modules"), &r.work_tree, 0, &mut modules);
    }
    repos.extend(modules);
    // Linked worktrees (`git worktree add ../feature`) keep their git dir
    // in the common dir, `worktrees/NAME`, wherever their work tree is:
    // its `commondir` and `config.worktree` tell git what to obey when the
    // user runs it there.
    let mut linked = Vec::new();
    for r in &repos {
        let Ok(entries) = std::fs::read_dir(r.common_dir.join("worktrees")) else {
            continue;
        };
        for e in entries
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        {
            if let Ok(git_dir) = resolve_real(&e.path()) {
                linked.push(Repo {
                    work_tree: r.work_tree.clone(),
                    git_dir,
                    common_dir: r.common_dir.clone(),
                    hooks_path: None,
                    gitfile: false,
                });
            }
        }
    }
    repos.extend(linked);
    let mut seen = std::collections::HashSet::new();
    repos.retain(|r| seen.insert(r.git_dir.clone()));
    repos
}

/// The git directories below a `modules` directory, as repositories whose
/// work tree is the superproject's (where their own is, is in their config).
fn module_git_dirs(dir: &Path, work_tree: &Path, depth: usize, out: &mut Vec<Repo>) {
    if depth > 4 {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        if !e.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        if path.join("HEAD").is_file() {
            if let Ok(git_dir) = resolve_real(&path) {
                out.push(Repo {
                    work_tree: work_tree.to_path_buf(),
                    common_dir: git_dir.clone(),
                    git_dir: git_dir.clone(),
                    hooks_path: None,
                    gitfile: false,
                });
                module_git_dirs(&git_dir.join("modules"), work_tree, depth + 1, out);
            }
        } else {
            // Submodule names may hold slashes: `modules/a/b`.
            module_git_dirs(&path, work_tree, depth + 1, out);
        }
    }
}

/// Walks `dir` for repositories; `false` when the budget ran out before
/// the walk was done. A directory below the root is a repository's work
/// tree where its own listing holds a `.git` (one call fewer for each of
/// the workspace's directories than asking for it); where it is not
/// listed whole, it is asked.
/// (`anchor`: the walk's top directory, held open; see `listing::Anchor`.)
fn walk(
    anchor: Option<&crate::listing::Anchor>,
    dir: &Path,
    depth: usize,
    budget: &mut usize,
    hooks: bool,
    repos: &mut Vec<Repo>,
) -> bool {
    let ask = |repos: &mut Vec<Repo>| {
        if depth > 0 {
            repos.extend(repo_at(dir, hooks));
        }
    };
    if depth > MAX_DEPTH {
        ask(repos);
        return true;
    }
    let Some((entries, listed_whole)) = list(anchor, dir, *budget) else {
        ask(repos);
        return true;
    };
    let mut work_tree = false;
    for (name, kind) in entries.iter() {
        if *budget == 0 {
            ask(repos);
            return false;
        }
        *budget -= 1;
        if name == ".git" {
            work_tree = true;
            continue;
        }
        if kind == Kind::Dir
            && !SKIP_DIRS.iter().any(|s| name == *s)
            && !walk(anchor, &dir.join(name), depth + 1, budget, hooks, repos)
        {
            // Not listed whole: asked.
            ask(repos);
            return false;
        }
    }
    if work_tree || !listed_whole {
        ask(repos);
    }
    true
}

/// What `dir` holds, and whether that is all of it (a listing that fails
/// part way is not); `None` where it cannot be listed. Reused from an
/// earlier walk where `dir` has not changed since (`crate::listing`), or
/// else listed now, up to one entry past `budget` (where the walk stops),
/// and kept for the audit's walk that follows.
fn list(
    anchor: Option<&crate::listing::Anchor>,
    dir: &Path,
    budget: usize,
) -> Option<(Entries, bool)> {
    let listed_at = crate::listing::now();
    if let Some(kept) = crate::listing::stat_dir(anchor, dir)
        .and_then(|m| crate::listing::reuse(dir, &m, listed_at))
    {
        return Some((kept, true));
    }
    let mut read = crate::listing::Reading::open(dir).ok()?;
    let mut list = Listing::default();
    let mut whole = true;
    for entry in read.by_ref() {
        match entry {
            Ok((name, Ok(kind))) => list.push(&name, kind),
            _ => whole = false,
        }
        if list.len() > budget {
            return Some((list.done(), whole));
        }
    }
    let list = list.done();
    if whole {
        crate::listing::keep(dir, &read, listed_at, &list);
    }
    Some((list, whole))
}

/// The repository whose work tree is `dir`, if `dir/.git` exists (its
/// `core.hooksPath` not asked).
pub fn repo_at_quick(dir: &Path) -> Option<Repo> {
    repo_at(dir, false)
}

/// The repository whose work tree is `dir`, if `dir/.git` exists
/// (`hooks`: ask for its `core.hooksPath` too).
fn repo_at(dir: &Path, hooks: bool) -> Option<Repo> {
    let dot_git = dir.join(".git");
    let meta = std::fs::symlink_metadata(&dot_git).ok()?;
    // Read without blocking or growing: an agent could have left a FIFO.
    let read = |p: &Path| {
        crate::config::atomic::read_regular(p, true)
            .ok()
            .map(|b| String::from_utf8_lossy(&b).into_owned())
    };
    let git_dir = if meta.is_dir() {
        dot_git
    } else if meta.file_type().is_symlink() && std::fs::metadata(&dot_git).is_ok_and(|m| m.is_dir())
    {
        // Git follows a `.git` symlink to its directory (made real below).
        dot_git
    } else if meta.is_file() {
        // A worktree or submodule: `gitdir: <path>`.
        let text = read(&dot_git)?;
        let target = text.lines().find_map(|l| l.strip_prefix("gitdir:"))?.trim();
        dir.join(target)
    } else {
        return None;
    };
    let git_dir = resolve_real(&git_dir).ok()?;
    let common_dir = match read(&git_dir.join("commondir")) {
        Some(text) => resolve_real(&git_dir.join(text.trim())).ok()?,
        None => git_dir.clone(),
    };
    let work_tree = resolve_real(dir).ok()?;
    let hooks_path = if hooks {
        hooks_path(&work_tree, &git_dir, &common_dir)
    } else {
        None
    };
    Some(Repo {
        work_tree,
        git_dir,
        common_dir,
        hooks_path,
        gitfile: !meta.is_dir(),
    })
}

/// `core.hooksPath` as git sees it for this repository (its whole
/// effective config: a global one counts too), made absolute: a relative
/// value is relative to the work tree, where hooks run. Asked of git
/// itself, without `git` on the PATH there is none to protect.
fn hooks_path(work_tree: &Path, git_dir: &Path, common_dir: &Path) -> Option<PathBuf> {
    let repo_configs = [
        git_dir.join("config"),
        git_dir.join("config.worktree"),
        common_dir.join("config"),
    ];
    if !repo_configs
        .iter()
        .all(|c| super::git_cmd::readable_config(c))
    {
        tracing::warn!(git_dir = %git_dir.display(), "a git config there is not a regular file; not asking git about it");
        return None;
    }
    // Asking git costs a process per repository at every arming (every
    // editor terminal too): only when some config git reads could name a
    // hooks path, or include one that does.
    if !may_name_hooks_path(&repo_configs) {
        return None;
    }
    // Once git stalled (a FIFO an include names), the repositories after
    // it are not asked for a while: many such plants must not add up to
    // minutes of arming. The enclosing repository is asked first.
    static STALLED: std::sync::Mutex<Option<std::time::Instant>> = std::sync::Mutex::new(None);
    let recently = |t: &std::time::Instant| t.elapsed() < std::time::Duration::from_secs(30);
    // What the repository's own config says is protected when git cannot
    // be asked.
    let written = || {
        written_hooks_path(&repo_configs).and_then(|v| real_even_if_absent(&expand(work_tree, &v)))
    };
    if STALLED
        .lock()
        .is_ok_and(|s| s.as_ref().is_some_and(recently))
    {
        tracing::warn!(git_dir = %git_dir.display(), "not asking git for core.hooksPath: it stalled on another repository moments ago");
        return written();
    }
    let mut cmd = crate::policy::git_cmd::command();
    cmd.arg("--git-dir")
        .arg(git_dir)
        .arg("--work-tree")
        .arg(work_tree)
        .args(["config", "--type=path", "--get", "core.hooksPath"]);
    let out = match super::git_cmd::output(cmd, super::git_cmd::LIMIT) {
        Ok(out) => out,
        Err(why) => {
            if why == super::git_cmd::NoAnswer::TimedOut {
                if let Ok(mut s) = STALLED.lock() {
                    *s = Some(std::time::Instant::now());
                }
            }
            return written();
        }
    };
    let value = String::from_utf8(out.stdout).ok()?;
    let value = value.trim_end_matches('\n');
    if !out.status.success() || value.is_empty() {
        return None;
    }
    real_even_if_absent(&work_tree.join(value))
}

/// The last `hooksPath = VALUE` written in these config files, read
/// plainly (no includes, no sections checked; a `[core]` header on the same
/// line, quotes and trailing `;`/`#` comments handled): the fallback when
/// git itself cannot be asked.
fn written_hooks_path(configs: &[PathBuf]) -> Option<String> {
    let mut found = None;
    for f in configs {
        let Ok(bytes) = crate::config::atomic::read_regular(f, true) else {
            continue;
        };
        for line in String::from_utf8_lossy(&bytes).lines() {
            let mut line = line.trim_start();
            if line.starts_with('[') {
                line = line.split_once(']').map_or("", |(_, rest)| rest);
            }
            let Some((key, value)) = line.split_once('=') else {
                continue;
            };
            if !key.trim().eq_ignore_ascii_case("hookspath") {
                continue;
            }
            let value = value.trim();
            let value = match value.strip_prefix('"') {
                Some(quoted) => quoted.split('"').next().unwrap_or(""),
                None => value.split([';', '#']).next().unwrap_or("").trim(),
            };
            if !value.is_empty() {
                found = Some(value.to_owned());
            }
        }
    }
    found
}

/// A config path value as git reads it (`--type=path`): `~/` is the home
/// directory, a relative one is relative to the work tree.
fn expand(work_tree: &Path, value: &str) -> PathBuf {
    match (value.strip_prefix("~/"), std::env::var_os("HOME")) {
        (Some(rest), Some(home)) => PathBuf::from(home).join(rest),
        _ => work_tree.join(value),
    }
}

/// Whether any config git would read for this repository mentions
/// `hookspath` or an include (which could): the repository's own files, the
/// global and system ones, and config given in the environment.
fn may_name_hooks_path(repo_configs: &[PathBuf]) -> bool {
    if std::env::var_os("GIT_CONFIG_COUNT").is_some()
        || std::env::var_os("GIT_CONFIG_PARAMETERS").is_some()
    {
        return true;
    }
    let env_path = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    let home = env_path("HOME");
    let mut files: Vec<PathBuf> = repo_configs.to_vec();
    files.extend(env_path("GIT_CONFIG_GLOBAL"));
    files.extend(home.as_ref().map(|h| h.join(".gitconfig")));
    files.extend(
        env_path("XDG_CONFIG_HOME")
            .or_else(|| home.as_ref().map(|h| h.join(".config")))
            .map(|x| x.join("git/config")),
    );
    // The system file is wherever git was built to look: /etc for a
    // distribution's git, `<prefix>/etc` for one built from source or by
    // Homebrew (/usr/local, /opt/homebrew); both are read.
    match env_path("GIT_CONFIG_SYSTEM") {
        Some(f) => files.push(f),
        None => {
            files.push("/etc/gitconfig".into());
            files.extend(git_prefix().map(|p| p.join("etc/gitconfig")));
        }
    }
    files.iter().any(|f| {
        match crate::config::atomic::read_regular(f, true) {
            Ok(bytes) => {
                let text = String::from_utf8_lossy(&bytes).to_ascii_lowercase();
                text.contains("hookspath") || text.contains("include")
            }
            // Absent: names nothing. Anything else (too large, not a
            // regular file): let git be asked, within its time limit.
            Err(e) => e.kind() != std::io::ErrorKind::NotFound,
        }
    })
}

/// The install prefix of the `git` found on PATH (`/usr/local` for
/// `/usr/local/bin/git`), looked up once.
fn git_prefix() -> Option<PathBuf> {
    static PREFIX: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    PREFIX
        .get_or_init(|| {
            let path = std::env::var_os("PATH")?;
            let git = std::env::split_paths(&path)
                .map(|d| d.join("git"))
                .find(|g| g.is_file())?;
            let real = std::fs::canonicalize(git).ok()?;
            Some(real.parent()?.parent()?.to_path_buf())
        })
        .clone()
}

/// `path` as a real path; where it does not exist yet (a hooks directory
/// the agent may create), its nearest existing ancestor made real with the
/// rest appended, so it is protected (and audited) before it exists.
fn real_even_if_absent(path: &Path) -> Option<PathBuf> {
    if let Ok(real) = resolve_real(path) {
        return Some(real);
    }
    let mut rest = Vec::new();
    let mut at = path;
    while let Some(parent) = at.parent() {
        let name = at.file_name()?;
        if name == ".." || name == "." {
            return None;
        }
        rest.push(name.to_owned());
        if let Ok(real) = resolve_real(parent) {
            return Some(rest.iter().rev().fold(real, |p, n| p.join(n)));
        }
        at = parent;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory is a repository by its own listing; where the walk
    /// does not list it whole (its bound reached, or its depth), it is
    /// asked, as it was before listings told.
    #[test]
    fn a_repository_the_walk_does_not_list_whole_is_still_found() {
        let t = tempfile::tempdir().unwrap();
        let t = std::fs::canonicalize(t.path()).unwrap();
        std::fs::create_dir_all(t.join("r/.git")).unwrap();
        let (mut budget, mut repos) = (1, Vec::new());
        assert!(!walk(None, &t, 0, &mut budget, false, &mut repos));
        let found: Vec<_> = repos.iter().map(|r| r.work_tree.clone()).collect();
        assert_eq!(found, vec![t.join("r")]);

        let deep = t.join("d/1/2/3/4/5/6");
        std::fs::create_dir_all(deep.join(".git")).unwrap();
        assert_eq!(
            deep.strip_prefix(&t).unwrap().components().count(),
            MAX_DEPTH + 1
        );
        let (mut budget, mut repos) = (MAX_ENTRIES, Vec::new());
        assert!(walk(None, &t, 0, &mut budget, false, &mut repos));
        let found: Vec<_> = repos.iter().map(|r| r.work_tree.clone()).collect();
        assert!(
            found.contains(&deep) && found.contains(&t.join("r")),
            "{found:?}"
        );
    }

    #[test]
    fn a_walk_past_its_bound_says_so_once_from_the_top() {
        let dir = tempfile::tempdir().unwrap();
        // Nested, so the bound is reached deep inside: the walk must stop
        // there and say so to its caller, not carry on a level up.
        let deep = dir.path().join("a/b/c");
        std::fs::create_dir_all(&deep).unwrap();
        for i in 0..MAX_ENTRIES {
            std::fs::write(deep.join(format!("f{i}")), "").unwrap();
        }
        std::fs::create_dir_all(dir.path().join("z/repo/.git")).unwrap();
        let mut budget = MAX_ENTRIES;
        let mut repos = Vec::new();
        assert!(!walk(None, dir.path(), 0, &mut budget, false, &mut repos));
        assert_eq!(budget, 0);
        let small = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(small.path().join("x/repo/.git")).unwrap();
        let mut budget = MAX_ENTRIES;
        let mut repos = Vec::new();
        assert!(walk(None, small.path(), 0, &mut budget, false, &mut repos));
        assert_eq!(repos.len(), 1);
    }

    #[test]
    fn a_written_hooks_path_is_read_when_git_cannot_be_asked() {
        let t = tempfile::tempdir().unwrap();
        let (a, b) = (t.path().join("config"), t.path().join("config.worktree"));
        std::fs::write(&a, "[core]\n\tbare = false\n\thooksPath = .husky\n").unwrap();
        assert_eq!(
            written_hooks_path(std::slice::from_ref(&a)).as_deref(),
            Some(".husky")
        );
        std::fs::write(&b, "[core]\n  HOOKSPATH = \"/srv/hooks\"\n").unwrap();
        assert_eq!(
            written_hooks_path(&[a.clone(), b.clone()]).as_deref(),
            Some("/srv/hooks")
        );
        std::fs::write(&b, "[core] hooksPath = .githooks ; set by the team\n").unwrap();
        assert_eq!(
            written_hooks_path(std::slice::from_ref(&b)).as_deref(),
            Some(".githooks")
        );
        assert_eq!(written_hooks_path(&[t.path().join("absent")]), None);
    }

    #[test]
    fn repos_nested_and_enclosing_and_worktrees_are_found() {
        let t = tempfile::tempdir().unwrap();
        let t = std::fs::canonicalize(t.path()).unwrap();
        std::fs::create_dir_all(t.join("main/.git/worktrees/wt")).unwrap();
        std::fs::write(t.join("main/.git/worktrees/wt/commondir"), "../..\n").unwrap();
        std::fs::create_dir_all(t.join("main/sub/inner/.git")).unwrap();
        std::fs::create_dir_all(t.join("main/node_modules/x/.git")).unwrap();
        std::fs::create_dir_all(t.join("wt")).unwrap();
        std::fs::write(
            t.join("wt/.git"),
            format!("gitdir: {}\n", t.join("main/.git/worktrees/wt").display()),
        )
        .unwrap();

        let repos = find_repos(&t.join("main"));
        let git_dirs: Vec<_> = repos.iter().map(|r| r.git_dir.clone()).collect();
        // The linked worktree's git dir is the main repository's to protect
        // (its work tree may be anywhere).
        assert_eq!(
            git_dirs,
            vec![
                t.join("main/.git"),
                t.join("main/sub/inner/.git"),
                t.join("main/.git/worktrees/wt")
            ]
        );
        assert_eq!(repos[2].common_dir, t.join("main/.git"));

        let wt = find_repos(&t.join("wt"));
        assert_eq!(wt[0].git_dir, t.join("main/.git/worktrees/wt"));
        assert_eq!(wt[0].common_dir, t.join("main/.git"));

        // A root inside a repository gets that repository.
        let sub = find_repos(&t.join("main/sub"));
        assert_eq!(sub[0].work_tree, t.join("main"));

        // Submodules' git directories, nested too, checked out or not.
        for m in [
            "main/.git/modules/lib",
            "main/.git/modules/lib/modules/deep",
        ] {
            std::fs::create_dir_all(t.join(m)).unwrap();
            std::fs::write(t.join(m).join("HEAD"), "ref: refs/heads/main\n").unwrap();
        }
        let repos = find_repos(&t.join("main"));
        let git_dirs: Vec<_> = repos.iter().map(|r| r.git_dir.clone()).collect();
        assert!(
            git_dirs.contains(&t.join("main/.git/modules/lib")),
            "{git_dirs:?}"
        );
        assert!(git_dirs.contains(&t.join("main/.git/modules/lib/modules/deep")));
    }

    #[test]
    fn a_fifo_planted_as_a_git_file_does_not_hang_discovery() {
        let t = tempfile::tempdir().unwrap();
        let t = std::fs::canonicalize(t.path()).unwrap();
        std::fs::create_dir_all(t.join("r")).unwrap();
        nix::unistd::mkfifo(
            &t.join("r/.git"),
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .unwrap();
        assert!(find_repos(&t).is_empty());
    }
}
