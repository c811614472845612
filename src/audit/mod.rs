//! The post-turn audit: what an armed agent left that the user's own,
//! unsandboxed tools would run later.
//!
//! The sandbox refuses writes to protected paths that exist when it is
//! armed, but on Linux it cannot refuse creating one that does not exist
//! yet (`.envrc`, `.vscode/`, `.mcp.json`, `.git/commondir` in a plain
//! repository) without placeholders on your disk, and agent settings stay
//! writable because agents save permission rules and trust there. So when a
//! turn ends (and before a re-arm) the bridge compares what it saw when the
//! generation was armed with what is there now:
//!
//! - a protected path that did not exist then and does now;
//! - a repository created under a root since, with hooks or config entries
//!   that run programs (`core.fsmonitor` runs on every `git status`, also in
//!   the parent repository);
//! - a new or changed executable entry in an agent's settings (hooks, MCP
//!   servers, notify and helper commands, environment), in the home
//!   directory or the workspace.
//!
//! Each finding is reverted at once (the copy the agent made is kept in
//! memory, within bounds) and put to the user, who may keep it. Between
//! the write and the end of the turn, the agent's version is on disk: a
//! tool the user runs in that window sees it.

pub mod git;
pub mod index;
pub mod settings;

use std::path::{Path, PathBuf};

use crate::policy::build::Repo;
use crate::policy::{Band, Matcher, Ops, Policy};
use settings::Format;

/// Files larger than this are not kept for "keep": reverted, and said so.
const MAX_KEPT: u64 = 1 << 20;
/// At most this many entries of a new directory are kept.
const MAX_KEPT_ENTRIES: usize = 256;

/// What is watched, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Watched {
    /// A protected path that does not exist: its appearing is a plant.
    Absent { path: PathBuf, why: String },
    /// An agent's settings file: its executable entries.
    Settings { path: PathBuf, format: Format },
}

/// The state a generation was armed in.
#[derive(Debug, Clone)]
pub struct Baseline {
    roots: Vec<PathBuf>,
    watched: Vec<Watched>,
    /// Settings files' bytes (None: absent), by path.
    settings: Vec<(PathBuf, Option<Vec<u8>>)>,
    /// Git directories of the repositories under the roots.
    repos: Vec<PathBuf>,
    /// Symlinks on the way to a settings file when armed (the user's own).
    links: Vec<PathBuf>,
    /// Each repository's index as it was (see [`Stamp`]): only an index
    /// changed since is read for new gitlinks.
    indexes: Vec<(PathBuf, Option<Stamp>)>,
    /// The `.git` files and symlinks there were (the pointers of linked
    /// worktrees, submodules, repositories kept elsewhere): yours, never
    /// removed by a revert.
    pointers: Vec<PathBuf>,
}

/// A file's size, change time and inode: a write or a replacement changes
/// one of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp(u64, i64, i64, u64);

fn stamp(p: &Path) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(p).ok()?;
    Some(Stamp(m.len(), m.ctime(), m.ctime_nsec(), m.ino()))
}

/// One thing the agent left that would run.
#[derive(Debug, Clone)]
pub struct Finding {
    pub path: PathBuf,
    /// What it would run, in words.
    pub what: String,
    /// Puts back what was there when armed (None: nothing zcode-acp may
    /// undo without touching what is yours; the finding is only said).
    pub revert: Option<Action>,
    /// Puts the agent's version back (None: too large to keep a copy).
    pub keep: Option<Action>,
}

/// A change made outside the sandbox, never through a symlink.
#[derive(Debug, Clone)]
pub enum Action {
    /// Write these bytes (atomically) at the path.
    Write(PathBuf, Vec<u8>),
    /// Remove the path (a file, or a directory with everything in it).
    Remove(PathBuf),
    /// Recreate a directory tree: (relative path, None for a directory or
    /// the file's bytes).
    Tree(PathBuf, Vec<(PathBuf, Option<Vec<u8>>)>),
    /// Several of these, in order.
    All(Vec<Action>),
}

/// The settings files agents keep executable entries in: each root's, and
/// the home directory's (with the agents' own directories moved by
/// `CLAUDE_CONFIG_DIR` and `CODEX_HOME`).
pub fn settings_files(
    roots: &[PathBuf],
    home: &Path,
    env: &dyn crate::policy::discover::Env,
) -> Vec<(PathBuf, Format)> {
    let mut out = Vec::new();
    for r in roots {
        out.push((r.join(".claude/settings.json"), Format::ClaudeSettings));
        out.push((
            r.join(".claude/settings.local.json"),
            Format::ClaudeSettings,
        ));
        out.push((r.join(".gemini/settings.json"), Format::GeminiSettings));
        out.push((r.join(".codex/config.toml"), Format::CodexToml));
    }
    // Directories named by the environment, as real paths: a symlink on
    // the way would otherwise make them unauditable.
    let real =
        |p: String| crate::policy::resolve_real(Path::new(&p)).unwrap_or_else(|_| PathBuf::from(p));
    let claude = env
        .var("CLAUDE_CONFIG_DIR")
        .map(real)
        .unwrap_or_else(|| home.join(".claude"));
    out.push((claude.join("settings.json"), Format::ClaudeSettings));
    out.push((claude.join("settings.local.json"), Format::ClaudeSettings));
    match env.var("CLAUDE_CONFIG_DIR") {
        Some(dir) => out.push((real(dir).join(".claude.json"), Format::ClaudeState)),
        None => out.push((home.join(".claude.json"), Format::ClaudeState)),
    }
    let codex = env
        .var("CODEX_HOME")
        .map(real)
        .unwrap_or_else(|| home.join(".codex"));
    out.push((codex.join("config.toml"), Format::CodexToml));
    out.push((home.join(".gemini/settings.json"), Format::GeminiSettings));
    out
}

/// What to watch for a policy armed for `roots`: the protected paths that
/// do not exist now, and the agents' settings files.
pub fn watch_list(policy: &Policy, settings: Vec<(PathBuf, Format)>) -> Vec<Watched> {
    let mut out = Vec::new();
    for rule in policy
        .rules
        .iter()
        .filter(|r| r.kind == Band::Protected && r.ops == Ops::All)
    {
        if let Matcher::Subpath(p) | Matcher::Literal(p) = &rule.matcher {
            if std::fs::symlink_metadata(p).is_err() {
                out.push(Watched::Absent {
                    path: p.clone(),
                    why: rule.why.clone(),
                });
            }
        }
    }
    for (path, format) in settings {
        out.push(Watched::Settings { path, format });
    }
    out
}

/// The first symlink among the directories on the way to `path`.
fn first_link_on_the_way(path: &Path) -> Option<PathBuf> {
    let mut on_the_way: Vec<&Path> = path.ancestors().skip(1).collect();
    on_the_way.reverse();
    on_the_way
        .into_iter()
        .find(|d| std::fs::symlink_metadata(d).is_ok_and(|m| m.file_type().is_symlink()))
        .map(Path::to_path_buf)
}

/// Runs `act` on `path` with its directory pinned: on Linux the directory
/// is opened with no symlink anywhere on its path (`openat2`,
/// `RESOLVE_NO_SYMLINKS`) and `act` is given the path through that
/// descriptor, so no swap of a directory for a symlink (by a process the
/// agent left running) can redirect it; elsewhere the directory is checked
/// to be its own real path first.
fn at_real<T>(path: &Path, act: impl FnOnce(&Path) -> std::io::Result<T>) -> std::io::Result<T> {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(std::io::Error::other("no parent directory"));
    };
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let pinned = crate::linux::open_dir_without_symlinks(dir).map_err(|e| {
            std::io::Error::other(format!(
                "{} is reached through a symlink or cannot be opened ({e}); not followed",
                dir.display()
            ))
        })?;
        act(&Path::new(&format!("/proc/self/fd/{}", pinned.as_raw_fd())).join(name))
    }
    #[cfg(not(target_os = "linux"))]
    {
        if crate::policy::resolve_real(dir).ok().as_deref() != Some(dir) {
            return Err(std::io::Error::other(format!(
                "{} is reached through a symlink; not followed",
                dir.display()
            )));
        }
        act(&dir.join(name))
    }
}

fn read(p: &Path) -> Option<Vec<u8>> {
    crate::config::atomic::read_nofollow(p).ok()
}

/// The baseline of a sandbox armed with `policy` for `roots`, in the
/// user's real home.
pub fn baseline(policy: &Policy, roots: &[PathBuf]) -> Baseline {
    let home = crate::policy::offerable::real_home().unwrap_or_else(|| "/".into());
    let settings = settings_files(roots, &home, &crate::policy::discover::ProcessEnv);
    Baseline::take(roots, watch_list(policy, settings))
}

impl Baseline {
    /// Takes the state now (when a generation is armed).
    pub fn take(roots: &[PathBuf], watched: Vec<Watched>) -> Baseline {
        let settings = watched
            .iter()
            .filter_map(|w| match w {
                Watched::Settings { path, .. } => Some((path.clone(), read(path))),
                _ => None,
            })
            .collect();
        let links = watched
            .iter()
            .filter_map(|w| match w {
                Watched::Settings { path, .. } => first_link_on_the_way(path),
                _ => None,
            })
            .collect();
        // The repositories there are, those only a gitlink leads to
        // included (where the walk does not look): none of them is new.
        let mut repos = repos_under(roots);
        let linked = gitlinked_from(roots, &repos, |_| true);
        repos.extend(linked);
        let indexes = repos
            .iter()
            .map(|r| {
                let index = r.git_dir.join("index");
                (index.clone(), stamp(&index))
            })
            .collect();
        let pointers = repos
            .iter()
            .map(|r| r.work_tree.join(".git"))
            .filter(|p| std::fs::symlink_metadata(p).is_ok_and(|m| !m.is_dir()))
            .collect();
        Baseline {
            roots: roots.to_vec(),
            watched,
            settings,
            repos: git_dirs(&repos),
            links,
            indexes,
            pointers,
        }
    }

    /// What changed since, that would run.
    pub fn audit(&self) -> Vec<Finding> {
        let mut out = Vec::new();
        for w in &self.watched {
            match w {
                Watched::Absent { path, why } => {
                    if std::fs::symlink_metadata(path).is_ok() {
                        out.push(Finding {
                            path: path.clone(),
                            what: format!("it did not exist when the sandbox was armed, and {why}"),
                            revert: Some(Action::Remove(path.clone())),
                            keep: snapshot(path),
                        });
                    }
                }
                Watched::Settings { path, format } => {
                    // A directory on the way made a symlink: an agent run
                    // outside later would read its settings from wherever
                    // it points (a temp dir the agent can write).
                    if let Some(link) = first_link_on_the_way(path) {
                        if !self.links.contains(&link)
                            && !out.iter().any(|f: &Finding| f.path == link)
                        {
                            let target = std::fs::read_link(&link)
                                .map(|t| t.display().to_string())
                                .unwrap_or_else(|_| "somewhere".into());
                            out.push(Finding {
                                what: format!(
                                    "it is a symlink to {target}, through which an agent run outside the sandbox would read {}",
                                    path.display()
                                ),
                                revert: Some(Action::Remove(link.clone())),
                                keep: None,
                                path: link,
                            });
                        }
                        continue;
                    }
                    let before = self.setting(path);
                    if let Some(f) = settings_finding(path, *format, before) {
                        out.push(f);
                    }
                }
            }
        }
        let now = repos_under(&self.roots);
        let linked = self.gitlinked_since(&now);
        for repo in now.iter().chain(&linked) {
            if !self.repos.contains(&repo.git_dir) {
                out.extend(new_repo_finding(repo, &self.roots, &self.pointers));
            }
        }
        out
    }

    /// The repositories that an index changed since arming links in (a
    /// gitlink's `git status` runs its repository's config), wherever the
    /// walk for repositories does not look (`node_modules` and the like),
    /// beside those of `now`.
    fn gitlinked_since(&self, now: &[Repo]) -> Vec<Repo> {
        gitlinked_from(&self.roots, now, |index| {
            let then = self
                .indexes
                .iter()
                .find(|(p, _)| p == index)
                .and_then(|(_, s)| *s);
            then.is_none() || then != stamp(index)
        })
    }

    fn setting(&self, path: &Path) -> Option<&[u8]> {
        self.settings
            .iter()
            .find(|(p, _)| p == path)
            .and_then(|(_, b)| b.as_deref())
    }

    /// The user kept what a finding is about: it is the baseline now.
    pub fn accept(&mut self, f: &Finding) {
        if let Some((_, bytes)) = self.settings.iter_mut().find(|(p, _)| *p == f.path) {
            *bytes = read(&f.path);
        }
        self.watched
            .retain(|w| !matches!(w, Watched::Absent { path, .. } if *path == f.path));
        let now = repos_under(&self.roots);
        let linked = self.gitlinked_since(&now);
        for r in now.iter().chain(&linked) {
            let touches = |p: &Path| f.path.starts_with(p) || p.starts_with(&f.path);
            let dot_git = r.work_tree.join(".git");
            if !self.repos.contains(&r.git_dir) && (touches(&r.git_dir) || touches(&dot_git)) {
                self.repos.push(r.git_dir.clone());
            }
        }
    }
}

/// How deep gitlinks are followed (a linked repository's own index links
/// more in, and `git status` follows them all).
const MAX_GITLINK_DEPTH: usize = 4;

/// The repositories the indexes of `repos` link in, beside `repos`,
/// following each one found into its own index; an index is read only where
/// `changed` says so (a new repository's always is).
fn gitlinked_from(roots: &[PathBuf], repos: &[Repo], changed: impl Fn(&Path) -> bool) -> Vec<Repo> {
    let under = |p: &Path| roots.iter().any(|root| p.starts_with(root));
    let mut out: Vec<Repo> = Vec::new();
    let mut look: Vec<Repo> = repos
        .iter()
        .filter(|r| changed(&r.git_dir.join("index")))
        .cloned()
        .collect();
    for _ in 0..MAX_GITLINK_DEPTH {
        let mut next = Vec::new();
        for repo in &look {
            for linked in gitlinked(repo) {
                let known = repos
                    .iter()
                    .chain(&out)
                    .chain(&next)
                    .any(|r| r.git_dir == linked.git_dir);
                if under(&linked.work_tree) && !known {
                    next.push(linked);
                }
            }
        }
        if next.is_empty() {
            break;
        }
        out.extend(next.iter().cloned());
        look = next;
    }
    out
}

/// The repositories `repo`'s index links in (read without git: the index
/// is the agent's to write).
fn gitlinked(repo: &Repo) -> Vec<Repo> {
    let index_path = repo.git_dir.join("index");
    let bytes = match read_index(&index_path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
        Err(e) => {
            tracing::warn!(index = %index_path.display(), "a git index the audit cannot read ({e}): the repositories it links in are not checked");
            return Vec::new();
        }
    };
    let Some(links) = index::gitlinks_any_hash(&bytes) else {
        tracing::warn!(index = %index_path.display(), "a git index the audit cannot read (not an index of git's versions 2 to 4, a split index, or past the reader's bounds): the repositories it links in are not checked");
        return Vec::new();
    };
    // Written by the agent: a path that climbs out is no gitlink git made.
    let plain = |rel: &&PathBuf| {
        rel.components()
            .all(|c| matches!(c, std::path::Component::Normal(_)))
    };
    links
        .iter()
        .filter(plain)
        .filter_map(|rel| crate::policy::discover::repo_at_quick(&repo.work_tree.join(rel)))
        .collect()
}

fn read_index(p: &Path) -> std::io::Result<Vec<u8>> {
    crate::config::atomic::read_nofollow(p)
}

/// The repositories under `roots` now: those whose work tree or git
/// directory is under one (a git directory may be kept elsewhere: `git init
/// --separate-git-dir`), each git directory once.
fn repos_under(roots: &[PathBuf]) -> Vec<Repo> {
    let under = |p: &Path| roots.iter().any(|root| p.starts_with(root));
    let mut out: Vec<Repo> = Vec::new();
    for r in roots
        .iter()
        .flat_map(|r| crate::policy::discover::find_repos_quick(r))
        .filter(|r| under(&r.work_tree) || under(&r.git_dir))
    {
        if !out.iter().any(|o| o.git_dir == r.git_dir) {
            out.push(r);
        }
    }
    out.sort_by(|a, b| a.git_dir.cmp(&b.git_dir));
    out
}

fn git_dirs(repos: &[Repo]) -> Vec<PathBuf> {
    repos.iter().map(|r| r.git_dir.clone()).collect()
}

fn settings_finding(path: &Path, format: Format, before: Option<&[u8]>) -> Option<Finding> {
    let now = read(path);
    if now.as_deref() == before {
        return None;
    }
    let now_bytes = now.clone().unwrap_or_default();
    let revert_whole = || match before {
        Some(b) => Action::Write(path.to_path_buf(), b.to_vec()),
        None => Action::Remove(path.to_path_buf()),
    };
    let keep_whole = || match &now {
        Some(b) => Action::Write(path.to_path_buf(), b.clone()),
        None => Action::Remove(path.to_path_buf()),
    };
    let entries = |b: Option<&[u8]>| settings::executable(format, b.unwrap_or_default());
    match (entries(before), entries(now.as_deref())) {
        (Some(b), Some(a)) => {
            let diff = settings::changed(&b, &a);
            if diff.is_empty() {
                return None; // permissions, trust, state: nothing that runs
            }
            let what = diff
                .iter()
                .map(|(k, v)| match v {
                    Some(v) => format!("{k} = {}", short(&v.to_string())),
                    None => format!("{k} removed"),
                })
                .collect::<Vec<_>>()
                .join("; ");
            let revert = match settings::restore(format, before, &now_bytes) {
                Some(bytes) if now.is_some() => Action::Write(path.to_path_buf(), bytes),
                _ => revert_whole(),
            };
            let revert = Some(revert);
            Some(Finding {
                path: path.to_path_buf(),
                what: format!("the agent's settings would run: {what}"),
                revert,
                keep: Some(keep_whole()),
            })
        }
        // Not readable as its format: any change is put to the user whole.
        _ => Some(Finding {
            path: path.to_path_buf(),
            what: "it changed and cannot be read to see what it would run".into(),
            revert: Some(revert_whole()),
            keep: Some(keep_whole()),
        }),
    }
}

/// What a repository made during the turn would run. Its git directory is
/// reverted where it is under a root (the agent made it). One elsewhere (a
/// `.git` file or symlink pointing at a repository of yours) is never
/// touched: the `.git` pointer the agent made is removed instead, and only
/// where it is one (new since arming, leading to exactly that directory);
/// otherwise the finding is only said.
fn new_repo_finding(repo: &Repo, roots: &[PathBuf], pointers_then: &[PathBuf]) -> Vec<Finding> {
    let git_dir = &repo.git_dir;
    let hooks = git::hooks(git_dir);
    let config = git_dir.join("config");
    let running = git::running_entries(&config);
    if !roots.iter().any(|r| git_dir.starts_with(r)) {
        let pointer = repo.work_tree.join(".git");
        let mut runs: Vec<String> = hooks.iter().map(|h| h.display().to_string()).collect();
        runs.extend(running.iter().map(|(k, v)| format!("{k} = {}", short(v))));
        if runs.is_empty() {
            return Vec::new();
        }
        let is_pointer = std::fs::symlink_metadata(&pointer).is_ok_and(|m| !m.is_dir())
            && crate::policy::discover::repo_at_quick(&repo.work_tree)
                .is_some_and(|r| r.git_dir == *git_dir);
        let made_now = is_pointer && !pointers_then.contains(&pointer);
        return vec![Finding {
            what: format!(
                "a repository made during the turn points git at {}, which runs: {}",
                git_dir.display(),
                runs.join("; ")
            ),
            revert: made_now.then(|| Action::Remove(pointer.clone())),
            keep: if made_now { snapshot(&pointer) } else { None },
            path: if made_now { pointer } else { git_dir.clone() },
        }];
    }
    let mut out = Vec::new();
    for hook in hooks {
        out.push(Finding {
            what: format!(
                "a repository made during the turn has a hook git runs: {}",
                hook.display()
            ),
            revert: Some(Action::Remove(hook.clone())),
            keep: snapshot(&hook),
            path: hook,
        });
    }
    if !running.is_empty() {
        let what = running
            .iter()
            .map(|(k, v)| format!("{k} = {}", short(v)))
            .collect::<Vec<_>>()
            .join("; ");
        let before = read(&config);
        out.push(Finding {
            path: config.clone(),
            what: format!("a repository made during the turn names programs git runs: {what}"),
            // Only with the config git itself rewrote without those entries:
            // never an empty file for a config git could not read.
            revert: strip_config(&config, &running)
                .map(|bytes| Action::Write(config.clone(), bytes)),
            keep: before.map(|b| Action::Write(config.clone(), b)),
        });
    }
    out
}

/// The config's bytes with the running entries removed (by git, on a copy).
fn strip_config(config: &Path, running: &[(String, String)]) -> Option<Vec<u8>> {
    let copy = tempfile::NamedTempFile::new().ok()?;
    std::fs::write(copy.path(), read(config)?).ok()?;
    let keys: Vec<String> = running.iter().map(|(k, _)| k.clone()).collect();
    git::unset(copy.path(), &keys);
    std::fs::read(copy.path()).ok()
}

fn short(s: &str) -> String {
    if s.chars().count() > 200 {
        format!("{}…", s.chars().take(200).collect::<String>())
    } else {
        s.to_owned()
    }
}

/// What it takes to put `path` back as it is now, within bounds.
fn snapshot(path: &Path) -> Option<Action> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    if meta.is_file() {
        if meta.len() > MAX_KEPT {
            return None;
        }
        return read(path).map(|b| Action::Write(path.to_path_buf(), b));
    }
    if !meta.is_dir() {
        return None; // a symlink or a device: reverted, not kept
    }
    let mut entries = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = path.join(&rel);
        for e in std::fs::read_dir(&dir).ok()?.flatten() {
            if entries.len() >= MAX_KEPT_ENTRIES {
                return None;
            }
            let r = rel.join(e.file_name());
            let t = e.file_type().ok()?;
            if t.is_dir() {
                entries.push((r.clone(), None));
                stack.push(r);
            } else if t.is_file() {
                let m = e.metadata().ok()?;
                if m.len() > MAX_KEPT {
                    return None;
                }
                entries.push((r, Some(read(&e.path())?)));
            } else {
                return None;
            }
        }
    }
    Some(Action::Tree(path.to_path_buf(), entries))
}

impl Action {
    /// Carries the action out (outside the sandbox): never through a
    /// symlink, writes atomic.
    pub fn apply(&self) -> std::io::Result<()> {
        match self {
            Action::Write(path, bytes) => at_real(path, |p| {
                crate::config::atomic::write_atomic(p, bytes, 0o644)
            }),
            Action::Remove(path) => at_real(path, remove),
            Action::Tree(path, entries) => {
                at_real(path, |p| {
                    remove(p)?;
                    std::fs::create_dir(p)
                })?;
                for (rel, bytes) in entries {
                    at_real(&path.join(rel), |p| match bytes {
                        None => std::fs::create_dir(p),
                        Some(b) => crate::config::atomic::write_atomic(p, b, 0o644),
                    })?;
                }
                Ok(())
            }
            Action::All(actions) => actions.iter().try_for_each(Action::apply),
        }
    }
}

impl Action {
    /// Writes what this action would put back beneath `dir`, each path
    /// under its own file name (a copy kept where nothing runs it); whether
    /// it wrote anything (a removal keeps nothing).
    pub fn save_under(&self, dir: &Path) -> std::io::Result<bool> {
        let name = |p: &Path| p.file_name().map(|n| n.to_owned()).unwrap_or_default();
        match self {
            Action::Write(path, bytes) => {
                crate::config::atomic::write_atomic(&dir.join(name(path)), bytes, 0o600)?;
                Ok(true)
            }
            Action::Remove(_) => Ok(false),
            Action::Tree(path, entries) => {
                let top = dir.join(name(path));
                std::fs::create_dir(&top)?;
                // Relative paths the snapshot made itself, parents first.
                for (rel, bytes) in entries {
                    match bytes {
                        None => std::fs::create_dir(top.join(rel))?,
                        Some(b) => crate::config::atomic::write_atomic(&top.join(rel), b, 0o600)?,
                    }
                }
                Ok(true)
            }
            Action::All(actions) => actions
                .iter()
                .try_fold(false, |wrote, a| Ok(a.save_under(dir)? || wrote)),
        }
    }
}

/// Removes a file, a symlink itself, or a directory tree (whose symlinks
/// are removed, never followed).
fn remove(path: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::build::{Platform, PolicyInput, ProjectRules, RootInput};

    fn armed(root: &Path, home: &Path) -> Baseline {
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
        let files = settings_files(&[root.to_path_buf()], home, &env);
        Baseline::take(&[root.to_path_buf()], watch_list(&policy, files))
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
        let now: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
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
        assert!(Action::Write(through.clone(), b"{}".to_vec())
            .apply()
            .is_err());
        assert_eq!(
            std::fs::read_to_string(&victim).unwrap(),
            "// mine\n{\"a\": 1}"
        );
        // A real directory still works.
        std::fs::remove_file(root.join(".gemini")).unwrap();
        std::fs::create_dir(root.join(".gemini")).unwrap();
        Action::Write(through.clone(), b"{}".to_vec())
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

    fn git(dir: &Path, args: &[&str]) {
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
    fn committed_repo(dir: &Path) {
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
}
