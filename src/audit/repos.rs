//! The audit's git rule: repositories made since arming (their hooks, and
//! every config git reads for them: `super::git::configs_of`), whether the
//! walk finds them or an index links them in; and the includes of your
//! own repositories that lie in the roots, where the agent may write.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use super::walk::Walked;
use super::{git, index, read, short, show, snapshot, Action, Finding};
use crate::policy::build::Repo;

/// How deep gitlinks are followed (a linked repository's own index links
/// more in, and `git status` follows them all).
const MAX_GITLINK_DEPTH: usize = 4;

/// A config file a repository of yours includes: its bytes, and the
/// entries in it that run.
type Include = (PathBuf, Option<Vec<u8>>, Vec<(String, String)>);

/// The repositories there were when the sandbox was armed.
#[derive(Debug, Clone, Default)]
pub struct Repos {
    /// Git directories.
    git_dirs: HashSet<PathBuf>,
    /// Every config file git read for them: a new repository's config that
    /// is one of these is yours (a linked worktree's common config).
    configs: Vec<PathBuf>,
    /// Each repository's index as it was: only an index changed since is
    /// read for new gitlinks.
    indexes: Vec<(PathBuf, Option<super::walk::Seen>)>,
    /// The `.git` files and symlinks there were: yours, never removed.
    pointers: Vec<PathBuf>,
    /// Config files your repositories include that lie in the roots, with
    /// their bytes and what in them runs.
    includes: Vec<Include>,
    /// Indexes that could not be read when armed: what they link in is
    /// unchecked.
    pub unreadable: Vec<(PathBuf, String)>,
    /// Your repositories' configs (what in them runs), hooks, and the
    /// state files git acts on (a rebase's todo list, whose `exec` lines
    /// `git rebase --continue` runs; alternates), as they were: the
    /// sandbox protects those of the repositories it found when it armed,
    /// this catches a change to any (one deeper than its look, say).
    guarded: HashMap<PathBuf, Guarded>,
    /// Where each of your repositories' guarded files are, by git directory.
    guards: HashMap<PathBuf, Guard>,
}

/// Where one repository's guarded files are: its configs as they were
/// when armed (a new include is itself a config entry that runs), the
/// directories whose files git runs as hooks (`hooks/` of its git and
/// common directories, and `core.hooksPath`), and its git and common
/// directories (for the state files).
#[derive(Debug, Clone, Default)]
struct Guard {
    configs: Vec<PathBuf>,
    hook_dirs: Vec<PathBuf>,
    dirs: Vec<PathBuf>,
}

/// New repositories one look reads, at most (each may ask git about its
/// configs): past them the look says what it did not check.
const MAX_NEW_REPOS: usize = 64;

/// A file of one of your repositories, as it was.
#[derive(Debug, Clone)]
struct Guarded {
    path: PathBuf,
    bytes: Option<Vec<u8>>,
    /// For a config: what in it runs (a change that runs nothing new,
    /// such as a new remote, is no finding).
    running: Option<Vec<(String, String)>>,
}

/// The state files of a git directory that make git run something.
const STATE_FILES: &[&str] = &[
    "rebase-merge/git-rebase-todo",
    "rebase-apply/patch",
    "sequencer/todo",
    "objects/info/alternates",
];

/// Where `repo`'s guarded files are (see [`Guard`]).
fn guard_of(repo: &Repo) -> Guard {
    let configs = git::configs_of(&repo.git_dir, &repo.common_dir);
    let mut hook_dirs = vec![repo.git_dir.join("hooks"), repo.common_dir.join("hooks")];
    for c in &configs {
        let Ok(entries) = git::running_entries(c) else {
            continue;
        };
        for (_, v) in entries
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case("core.hookspath"))
        {
            let dir = match v.strip_prefix("~/") {
                Some(rest) => dirs::home_dir().map(|h| h.join(rest)),
                None => Some(repo.work_tree.join(v)),
            };
            hook_dirs.extend(dir);
        }
    }
    hook_dirs.dedup();
    Guard {
        configs,
        hook_dirs,
        dirs: vec![repo.git_dir.clone(), repo.common_dir.clone()],
    }
}

/// The files `guard` guards now: its configs, the hooks in its hook
/// directories, its state files (those that exist, and those that do not
/// yet); whether each is a config.
fn guarded_files(guard: &Guard) -> Vec<(PathBuf, bool)> {
    let mut seen: HashSet<PathBuf> = HashSet::new();
    let mut out: Vec<(PathBuf, bool)> = Vec::new();
    let mut add = |p: PathBuf, config: bool| {
        if seen.insert(p.clone()) {
            out.push((p, config));
        }
    };
    for c in &guard.configs {
        add(c.clone(), true);
    }
    for d in &guard.hook_dirs {
        for h in git::hooks_in(d) {
            add(h, false);
        }
    }
    for d in &guard.dirs {
        for f in STATE_FILES {
            add(d.join(f), false);
        }
    }
    out
}

fn guard(path: PathBuf, config: bool) -> Guarded {
    let bytes = super::read_following(&path);
    let running =
        (config && bytes.is_some()).then(|| git::running_entries(&path).unwrap_or_default());
    Guarded {
        path,
        bytes,
        running,
    }
}

impl Repos {
    pub fn take(roots: &[PathBuf], walked: &Walked) -> Repos {
        let mut repos = super::walk::repos(roots, walked);
        let (linked, unreadable) = gitlinked_from(roots, &repos, |_| true);
        repos.extend(linked);
        let guards: HashMap<PathBuf, Guard> = repos
            .iter()
            .map(|r| (r.git_dir.clone(), guard_of(r)))
            .collect();
        let configs: Vec<PathBuf> = guards.values().flat_map(|g| g.configs.clone()).collect();
        let includes = configs
            .iter()
            .filter(|c| roots.iter().any(|r| c.starts_with(r)))
            .filter(|c| {
                !repos
                    .iter()
                    .any(|r| c.starts_with(&r.git_dir) || c.starts_with(&r.common_dir))
            })
            .map(|c| {
                let running = git::running_entries(c).unwrap_or_default();
                (c.clone(), super::read_following(c), running)
            })
            .collect();
        Repos {
            indexes: repos
                .iter()
                .map(|r| {
                    let index = r.git_dir.join("index");
                    let seen = super::walk::Seen::at(&index);
                    (index, seen)
                })
                .collect(),
            pointers: repos
                .iter()
                .map(|r| r.work_tree.join(".git"))
                .filter(|p| std::fs::symlink_metadata(p).is_ok_and(|m| !m.is_dir()))
                .collect(),
            guards: guards.clone(),
            guarded: guards
                .values()
                .flat_map(guarded_files)
                .map(|(p, config)| (p.clone(), guard(p, config)))
                .collect(),
            git_dirs: repos.iter().map(|r| r.git_dir.clone()).collect(),
            configs,
            includes,
            unreadable,
        }
    }

    /// What the watcher watches for this rule: every repository's git
    /// directory (a `config`, `commondir`, `hooks` or `index` there), and
    /// the includes.
    pub fn watched_paths(&self) -> Vec<PathBuf> {
        let mut out: Vec<PathBuf> = Vec::new();
        for g in &self.git_dirs {
            for name in [
                "config",
                "config.worktree",
                "commondir",
                "hooks",
                "index",
                "rebase-merge",
                "sequencer",
                "objects/info",
            ] {
                out.push(g.join(name));
            }
        }
        out.extend(self.configs.iter().cloned());
        out.extend(self.includes.iter().map(|(p, _, _)| p.clone()));
        // Hooks directories elsewhere (`core.hooksPath`).
        out.extend(
            self.guards
                .values()
                .flat_map(|g| g.hook_dirs.iter().cloned()),
        );
        out
    }

    /// The files this rule judges (your repositories' includes).
    pub fn covered(&self) -> impl Iterator<Item = PathBuf> + '_ {
        self.includes.iter().map(|(p, _, _)| p.clone())
    }

    /// The repositories' findings now.
    pub fn audit(&self, roots: &[PathBuf], walked: &Walked) -> Vec<Finding> {
        let mut out = Vec::new();
        let now = super::walk::repos(roots, walked);
        let (linked, unreadable) = self.gitlinked_since(roots, &now);
        for (index, why) in unreadable {
            out.push(Finding {
                what: format!(
                    "this git index changed and cannot be read ({why}), so the repositories it links in were not checked: a `git status` there may run what they name"
                ),
                shown: String::new(),
                revert: None,
                keep: None,
                path: index,
                blind: false,
            });
        }
        let new: Vec<&Repo> = now
            .iter()
            .chain(&linked)
            .filter(|r| !self.git_dirs.contains(&r.git_dir))
            .collect();
        for repo in new.iter().take(MAX_NEW_REPOS) {
            out.extend(self.new_repo_finding(repo, roots));
        }
        if new.len() > MAX_NEW_REPOS {
            out.push(Finding {
                path: roots.first().cloned().unwrap_or_default(),
                what: format!(
                    "{} repositories were made since the sandbox was armed; the audit reads {MAX_NEW_REPOS} of them at a look, and the rest are not checked",
                    new.len()
                ),
                shown: String::new(),
                revert: None,
                keep: None,
                blind: true,
            });
        }
        // Your repositories: a hook or state file made or changed, a config
        // that runs something new.
        let now_repos: Vec<&Repo> = now
            .iter()
            .filter(|r| self.git_dirs.contains(&r.git_dir))
            .collect();
        for repo in now_repos {
            let Some(g) = self.guards.get(&repo.git_dir) else {
                continue;
            };
            for (path, config) in guarded_files(g) {
                let then = self.guarded.get(&path);
                let bytes_now = super::read_following(&path);
                if then.map(|g| &g.bytes) == Some(&bytes_now)
                    || (then.is_none() && bytes_now.is_none())
                {
                    continue;
                }
                if config {
                    let running_now = git::running_entries(&path).unwrap_or_default();
                    let running_then = then.and_then(|g| g.running.clone()).unwrap_or_default();
                    let added: Vec<String> = running_now
                        .iter()
                        .filter(|e| !running_then.contains(e))
                        .map(|(k, v)| format!("{k} = {}", short(v)))
                        .collect();
                    if added.is_empty() {
                        continue;
                    }
                    let real = crate::policy::resolve_real(&path).unwrap_or_else(|_| path.clone());
                    out.push(Finding {
                        what: format!(
                            "a config of your repository now names programs git runs: {}",
                            added.join("; ")
                        ),
                        shown: show(&real),
                        revert: Some(match then.and_then(|g| g.bytes.clone()) {
                            Some(b) => Action::Write(
                                real.clone(),
                                b,
                                super::mode_of(&real).unwrap_or(0o644),
                            ),
                            None => Action::Remove(real.clone()),
                        }),
                        keep: snapshot(&real),
                        path: real,
                        blind: false,
                    });
                } else {
                    out.push(Finding {
                        what: match then.and_then(|g| g.bytes.as_ref()) {
                            Some(_) => "a hook or state file of your repository, which git runs, was changed".into(),
                            None => "a hook or state file of your repository, which git runs, was made".into(),
                        },
                        shown: show(&path),
                        // Put back where it really is: a hook of yours that
                        // is a symlink stays one.
                        revert: Some(match then.and_then(|g| g.bytes.clone()) {
                            Some(b) => {
                                let real = crate::policy::resolve_real(&path)
                                    .unwrap_or_else(|_| path.clone());
                                Action::Write(real.clone(), b, super::mode_of(&real).unwrap_or(0o755))
                            }
                            None => Action::Remove(path.clone()),
                        }),
                        keep: snapshot(&path),
                        path,
                        blind: false,
                    });
                }
            }
        }
        for (path, before, running_then) in &self.includes {
            let now_bytes = super::read_following(path);
            // Said once: as your repository's config, where it is one.
            if now_bytes == *before || out.iter().any(|f: &Finding| f.path == *path) {
                continue;
            }
            let running_now = match git::running_entries(path) {
                Ok(r) => r,
                Err(git::Unread(why)) => vec![("(unreadable)".into(), why)],
            };
            let added: Vec<String> = running_now
                .iter()
                .filter(|e| !running_then.contains(e))
                .map(|(k, v)| format!("{k} = {}", short(v)))
                .collect();
            if added.is_empty() {
                continue;
            }
            let real = crate::policy::resolve_real(path).unwrap_or_else(|_| path.clone());
            out.push(Finding {
                what: format!(
                    "a config file your repository includes now names programs git runs: {}",
                    added.join("; ")
                ),
                shown: show(&real),
                revert: Some(match before {
                    Some(b) => Action::Write(
                        real.clone(),
                        b.clone(),
                        super::mode_of(&real).unwrap_or(0o644),
                    ),
                    None => Action::Remove(real.clone()),
                }),
                keep: snapshot(&real),
                path: real,
                blind: false,
            });
        }
        out
    }

    /// The repositories that an index changed since arming links in, and
    /// the changed indexes that could not be read.
    fn gitlinked_since(
        &self,
        roots: &[PathBuf],
        now: &[Repo],
    ) -> (Vec<Repo>, Vec<(PathBuf, String)>) {
        gitlinked_from(roots, now, |index| {
            let then = self
                .indexes
                .iter()
                .find(|(p, _)| p == index)
                .and_then(|(_, s)| *s);
            then.is_none() || then != super::walk::Seen::at(index)
        })
    }

    /// The user kept what a finding is about: a repository it touches is
    /// yours from now on, an include as it is now.
    pub fn accept(&mut self, path: &Path, roots: &[PathBuf], walked: &Walked) {
        let now = super::walk::repos(roots, walked);
        let (linked, _) = self.gitlinked_since(roots, &now);
        for r in now.iter().chain(&linked) {
            let touches = |p: &Path| path.starts_with(p) || p.starts_with(path);
            let dot_git = r.work_tree.join(".git");
            if !self.git_dirs.contains(&r.git_dir) && (touches(&r.git_dir) || touches(&dot_git)) {
                self.git_dirs.insert(r.git_dir.clone());
                // Kept: yours from now on, guarded as it is now.
                let g = guard_of(r);
                self.configs.extend(g.configs.iter().cloned());
                for (p, config) in guarded_files(&g) {
                    self.guarded
                        .entry(p.clone())
                        .or_insert_with(|| guard(p, config));
                }
                self.guards.insert(r.git_dir.clone(), g);
            }
        }
        for g in self.guarded.values_mut() {
            if g.path.starts_with(path) || path.starts_with(&g.path) {
                *g = guard(g.path.clone(), g.running.is_some());
            }
        }
        for (p, bytes, running) in self.includes.iter_mut() {
            if crate::policy::resolve_real(p).ok().as_deref() == Some(path) || p == path {
                *bytes = super::read_following(p);
                *running = git::running_entries(p).unwrap_or_default();
            }
        }
    }

    /// What a repository made since arming would run. Its git directory
    /// is reverted where it is under a root (the agent made it). One
    /// elsewhere (a `.git` file or symlink pointing at a repository of
    /// yours) is never touched: the `.git` pointer the agent made is
    /// removed instead, and only where it is one (new since arming,
    /// leading to exactly that directory); otherwise the finding is only
    /// said.
    fn new_repo_finding(&self, repo: &Repo, roots: &[PathBuf]) -> Vec<Finding> {
        let git_dir = &repo.git_dir;
        let hooks = git::hooks(&repo.common_dir);
        let mut hooks_all = git::hooks(git_dir);
        for h in hooks {
            if !hooks_all.contains(&h) {
                hooks_all.push(h);
            }
        }
        // Every config git reads for it that is not one of yours.
        let configs: Vec<PathBuf> = git::configs_of(git_dir, &repo.common_dir)
            .into_iter()
            .filter(|c| !self.configs.contains(c))
            .collect();
        let mut running: Vec<(PathBuf, Vec<(String, String)>)> = Vec::new();
        let mut unread: Vec<(PathBuf, String)> = Vec::new();
        for c in &configs {
            match git::running_entries(c) {
                Ok(r) if !r.is_empty() => running.push((c.clone(), r)),
                Ok(_) => {}
                Err(git::Unread(why)) => unread.push((c.clone(), why)),
            }
        }
        let under_a_root = |p: &Path| roots.iter().any(|r| p.starts_with(r));
        if !under_a_root(git_dir) {
            let pointer = repo.work_tree.join(".git");
            let mut runs: Vec<String> = hooks_all.iter().map(|h| h.display().to_string()).collect();
            for (_, r) in &running {
                runs.extend(r.iter().map(|(k, v)| format!("{k} = {}", short(v))));
            }
            runs.extend(
                unread
                    .iter()
                    .map(|(c, why)| format!("{} (unread: {why})", c.display())),
            );
            if runs.is_empty() {
                return Vec::new();
            }
            let is_pointer = std::fs::symlink_metadata(&pointer).is_ok_and(|m| !m.is_dir())
                && crate::policy::discover::repo_at_quick(&repo.work_tree)
                    .is_some_and(|r| r.git_dir == *git_dir);
            let made_now = is_pointer && !self.pointers.contains(&pointer);
            return vec![Finding {
                what: format!(
                    "a repository made during the turn points git at {}, which runs: {}",
                    git_dir.display(),
                    runs.join("; ")
                ),
                shown: runs.join("\n"),
                revert: made_now.then(|| Action::Remove(pointer.clone())),
                keep: if made_now { snapshot(&pointer) } else { None },
                path: if made_now { pointer } else { git_dir.clone() },
                blind: false,
            }];
        }
        let mut out = Vec::new();
        for hook in hooks_all {
            out.push(Finding {
                what: format!(
                    "a repository made during the turn has a hook git runs: {}",
                    hook.display()
                ),
                shown: show(&hook),
                revert: Some(Action::Remove(hook.clone())),
                keep: snapshot(&hook),
                path: hook,
                blind: false,
            });
        }
        for (config, entries) in running {
            out.push(config_finding(&config, &entries, roots));
        }
        for (config, why) in unread {
            // Neither git nor zcode-acp could read it: it goes, whole.
            out.push(Finding {
                what: format!("a repository made during the turn has a config that cannot be read to see what it would run ({why})"),
                shown: show(&config),
                revert: Some(Action::Remove(config.clone())),
                keep: snapshot(&config),
                path: config,
                blind: false,
            });
        }
        out
    }
}

/// A new repository's config that names programs: the entries are taken
/// out (git rewrites a copy); one that is a symlink (the agent's, in a
/// repository it made) is removed, the file it points to left alone; one
/// git could not rewrite goes whole.
fn config_finding(config: &Path, entries: &[(String, String)], roots: &[PathBuf]) -> Finding {
    let what = entries
        .iter()
        .map(|(k, v)| format!("{k} = {}", short(v)))
        .collect::<Vec<_>>()
        .join("; ");
    let is_link = std::fs::symlink_metadata(config).is_ok_and(|m| m.file_type().is_symlink());
    let in_roots = roots.iter().any(|r| config.starts_with(r));
    let revert = if is_link || !in_roots {
        // Not its own file to rewrite: the link (or what reaches it) goes.
        Some(Action::Remove(config.to_path_buf()))
    } else {
        Some(match strip_config(config, entries) {
            Some(bytes) => Action::Write(
                config.to_path_buf(),
                bytes,
                super::mode_of(config).unwrap_or(0o644),
            ),
            None => Action::Remove(config.to_path_buf()),
        })
    };
    Finding {
        path: config.to_path_buf(),
        what: format!("a repository made during the turn names programs git runs: {what}"),
        shown: what,
        revert,
        keep: snapshot(config),
        blind: false,
    }
}

/// The config's bytes with the running entries removed (by git, on a
/// copy); None where git could not do it.
fn strip_config(config: &Path, running: &[(String, String)]) -> Option<Vec<u8>> {
    let copy = tempfile::NamedTempFile::new().ok()?;
    std::fs::write(copy.path(), read(config)?).ok()?;
    let keys: Vec<String> = running.iter().map(|(k, _)| k.clone()).collect();
    if !git::unset(copy.path(), &keys) {
        return None;
    }
    let bytes = std::fs::read(copy.path()).ok()?;
    // Only a copy git left with none of them is good.
    match git::running_entries(copy.path()) {
        Ok(left) if left.is_empty() => Some(bytes),
        _ => None,
    }
}

/// The repositories the indexes of `repos` link in, beside `repos`,
/// following each one found into its own index; an index is read only
/// where `changed` says so. With them, the indexes that could not be read.
fn gitlinked_from(
    roots: &[PathBuf],
    repos: &[Repo],
    changed: impl Fn(&Path) -> bool,
) -> (Vec<Repo>, Vec<(PathBuf, String)>) {
    let under = |p: &Path| roots.iter().any(|root| p.starts_with(root));
    let mut out: Vec<Repo> = Vec::new();
    let mut unreadable = Vec::new();
    let mut look: Vec<Repo> = repos
        .iter()
        .filter(|r| changed(&r.git_dir.join("index")))
        .cloned()
        .collect();
    for _ in 0..MAX_GITLINK_DEPTH {
        let mut next = Vec::new();
        for repo in &look {
            let links = match gitlinked(repo) {
                Ok(links) => links,
                Err(why) => {
                    unreadable.push((repo.git_dir.join("index"), why));
                    continue;
                }
            };
            for linked in links {
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
    (out, unreadable)
}

/// The repositories `repo`'s index links in: read by zcode-acp (the index
/// is the agent's to write); where it cannot (a split index, one past the
/// reader's bounds), git lists the gitlinks instead, its hooks and
/// fsmonitor turned off; where neither can, why.
fn gitlinked(repo: &Repo) -> Result<Vec<Repo>, String> {
    let index_path = repo.git_dir.join("index");
    let links = match read_index(&index_path) {
        Ok(bytes) => match index::gitlinks_any_hash(&bytes) {
            Some(links) => links,
            None => gitlinks_by_git(repo).ok_or_else(|| {
                "not an index zcode-acp can read (a split index, or past its bounds), and git could not list it".to_owned()
            })?,
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("{e}")),
    };
    // Written by the agent: a path that climbs out is no gitlink git made.
    let plain = |rel: &&PathBuf| {
        rel.components()
            .all(|c| matches!(c, std::path::Component::Normal(_)))
    };
    Ok(links
        .iter()
        .filter(plain)
        .filter_map(|rel| crate::policy::discover::repo_at_quick(&repo.work_tree.join(rel)))
        .collect())
}

/// The gitlinks of `repo`'s index as git lists them (`ls-files --stage`),
/// with the repository's fsmonitor and hooks turned off for the call.
fn gitlinks_by_git(repo: &Repo) -> Option<Vec<PathBuf>> {
    use crate::policy::git_cmd;
    git_cmd::program()?;
    let mut cmd = git_cmd::command();
    cmd.args([
        "--no-pager",
        "-c",
        "core.fsmonitor=false",
        "-c",
        "core.hooksPath=/dev/null",
        "--git-dir",
    ])
    .arg(&repo.git_dir)
    .arg("--work-tree")
    .arg(&repo.work_tree)
    .args(["ls-files", "--stage", "-z"])
    .env("GIT_OPTIONAL_LOCKS", "0");
    let out = git_cmd::output(cmd, git_cmd::LIMIT).ok()?;
    if !out.status.success() {
        return None;
    }
    Some(
        out.stdout
            .split(|b| *b == 0)
            .filter_map(|entry| {
                let text = std::str::from_utf8(entry).ok()?;
                let (meta, path) = text.split_once('\t')?;
                meta.starts_with("160000 ").then(|| PathBuf::from(path))
            })
            .collect(),
    )
}

fn read_index(p: &Path) -> std::io::Result<Vec<u8>> {
    crate::config::atomic::read_nofollow(p)
}
