//! The audit: what an armed agent left that the user's own, unsandboxed
//! tools would run or obey later.
//!
//! The guarantee, in one sentence (docs/editor.md, "The audit"): nothing the agent
//! creates, changes or removes in a hidden file or directory of your roots,
//! in a file named as a tool's configuration, in a git repository's config
//! or hooks, or in an agent's settings and the scripts they name, stays on
//! disk without your say. What it covers, rule first and refinements after:
//!
//! - every hidden entry and named configuration in the roots (`entries`:
//!   new, changed or removed, whatever tool would read it; a few names that
//!   nothing runs are left out, see `walk`);
//! - the agents' plugin, skill, hook and extension trees in the home
//!   directory, and the files there that set their environment (whole);
//! - a protected path that did not exist when the sandbox was armed;
//! - a repository made since, with hooks or config entries that run
//!   programs (its `config`, `config.worktree`, its common directory's
//!   config, their includes: `git`), found by walking the roots and through
//!   every index changed since arming (a gitlink's `git status` runs the
//!   linked repository's config);
//! - an include of a repository of yours that lies in the roots, which the
//!   agent may write: a new entry there that runs a program;
//! - a new or changed executable entry in an agent's settings, in the
//!   home directory or the roots (a settings file that is a symlink is
//!   read through it), and any change to a script those settings name.
//!
//! Each finding is reverted (`stash` keeps the agent's version where it
//! cannot be held in memory) and put to the user, who may keep it. Where
//! the audit cannot look (a root past its walk's bound, an index neither
//! it nor git can read), it says so, never that all is well.

pub mod action;
pub mod entries;
pub mod git;
pub mod index;
pub mod repos;
pub mod settings;
pub mod stash;
pub mod walk;
pub mod watch;

use std::path::{Path, PathBuf};

use crate::policy::{Band, Matcher, Ops, Policy};
use action::snapshot;
pub use action::{show, Action, Node};
use settings::Format;

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
    places: walk::Places,
    watched: Vec<Watched>,
    /// Settings files' bytes (None: absent), by path, read through a
    /// symlink where the file is one.
    settings: Vec<(PathBuf, Option<Vec<u8>>)>,
    /// Scripts the settings name, with their bytes.
    scripts: Vec<(PathBuf, Option<Vec<u8>>)>,
    /// Symlinks on the way to a settings file when armed (the user's own).
    links: Vec<PathBuf>,
    /// Hidden entries and named configurations, with their content.
    entries: entries::Entries,
    /// Repositories, indexes, and includes in the roots.
    repos: repos::Repos,
    /// Where the audit could not look, and why (said to the user).
    pub unchecked: Vec<(PathBuf, String)>,
    /// The directories the walk entered (the watcher's).
    dirs: Vec<PathBuf>,
    /// Symlinks to directories there were (the user's own ways in).
    dir_links: Vec<PathBuf>,
    /// Where the user's hidden symlinks into the roots lead: walked and
    /// watched as hidden directories.
    followed: Vec<PathBuf>,
}

/// One thing the agent left that would run.
#[derive(Debug, Clone)]
pub struct Finding {
    pub path: PathBuf,
    /// What it would run, in words.
    pub what: String,
    /// The agent's version, shown to the user: text (cut), or a listing.
    pub shown: String,
    /// Puts back what was there when armed (None: nothing zcode-acp may
    /// undo without touching what is yours; the finding is only said).
    pub revert: Option<Action>,
    /// Puts the agent's version back (None: not held in memory; the stash
    /// keeps it on disk instead).
    pub keep: Option<Action>,
    /// A place the audit cannot look into (`what` says why): nothing to
    /// undo, and no word that all is well there.
    pub blind: bool,
}

/// Where the audit looks for the roots, in the user's real home.
pub fn places(
    roots: &[PathBuf],
    home: &Path,
    env: &dyn crate::policy::discover::Env,
) -> walk::Places {
    let (trees, files) = settings::home_trees_and_files(home, env);
    walk::Places {
        roots: roots.to_vec(),
        skip: Vec::new(),
        follow: Vec::new(),
        home: Some(home.to_path_buf()),
        trees,
        files,
    }
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

/// The symlinks among the directories on the way to files, for one look:
/// the settings files share most of their ways (the home directory, a
/// root), and each directory is asked once.
#[derive(Default)]
struct LinksOnTheWay(std::collections::HashMap<PathBuf, bool>);

impl LinksOnTheWay {
    /// The first symlink among the directories on the way to `path`.
    fn first(&mut self, path: &Path) -> Option<PathBuf> {
        let mut on_the_way: Vec<&Path> = path.ancestors().skip(1).collect();
        on_the_way.reverse();
        on_the_way
            .into_iter()
            .find(|d| {
                *self.0.entry(d.to_path_buf()).or_insert_with(|| {
                    std::fs::symlink_metadata(d).is_ok_and(|m| m.file_type().is_symlink())
                })
            })
            .map(Path::to_path_buf)
    }
}

/// A file's bytes, not through a symlink at its last component.
fn read(p: &Path) -> Option<Vec<u8>> {
    crate::config::atomic::read_nofollow(p).ok()
}

/// A file's bytes, through a symlink at its last component (settings a
/// user keeps elsewhere and links in are read where they are).
fn read_following(p: &Path) -> Option<Vec<u8>> {
    crate::config::atomic::read_regular(p, true).ok()
}

/// The baseline of a sandbox armed with `policy` for `roots`, in the
/// user's real home.
pub fn baseline(policy: &Policy, roots: &[PathBuf]) -> Baseline {
    let home = crate::policy::offerable::real_home().unwrap_or_else(|| "/".into());
    let env = crate::policy::discover::ProcessEnv;
    let settings = settings::settings_files(roots, &home, &env);
    let mut places = places(roots, &home, &env);
    // Inside a root (one that is the home directory), the agent's state,
    // caches and temp are the policy's to allow and the settings rule's to
    // read; zcode-acp's own directory is no one's but its own.
    places.skip = policy
        .rules
        .iter()
        .filter(|r| (r.kind == Band::Allow && !r.root) || r.kind == Band::Island)
        .filter_map(|r| match &r.matcher {
            Matcher::Subpath(p) => Some(p.clone()),
            _ => None,
        })
        .filter(|p| roots.iter().any(|r| p.starts_with(r) && p != r))
        .collect();
    Baseline::take(places, watch_list(policy, settings))
}

impl Baseline {
    /// Takes the state now (when a generation is armed, before it runs).
    pub fn take(places: walk::Places, watched: Vec<Watched>) -> Baseline {
        let settings: Vec<(PathBuf, Option<Vec<u8>>)> = watched
            .iter()
            .filter_map(|w| match w {
                Watched::Settings { path, .. } => Some((path.clone(), read_following(path))),
                _ => None,
            })
            .collect();
        let scripts =
            settings::named_scripts(&watched, &settings, &places.roots, places.home.as_deref())
                .into_iter()
                .map(|p| {
                    let bytes = read_following(&p);
                    (p, bytes)
                })
                .collect();
        let mut on_the_way = LinksOnTheWay::default();
        let links = watched
            .iter()
            .filter_map(|w| match w {
                Watched::Settings { path, .. } => on_the_way.first(path),
                _ => None,
            })
            .collect();
        let mut places = places;
        let mut walked = walk::walk(&places);
        // The user's hidden symlinks to directories in the roots (a shared
        // `.claude/skills`): walked where they lead from now on.
        let followed: Vec<(PathBuf, PathBuf)> = walked
            .dir_links
            .iter()
            .filter(|(link, target)| {
                link.components()
                    .any(|c| c.as_os_str().as_encoded_bytes().first() == Some(&b'.'))
                    && places.roots.iter().any(|r| target.starts_with(r))
            })
            .cloned()
            .collect();
        places.follow = followed.iter().map(|(link, _)| link.clone()).collect();
        if !places.follow.is_empty() {
            walked = walk::walk(&places);
        }
        let repos = repos::Repos::take(&places.roots, &walked);
        let mut unchecked = walked.cut.clone();
        unchecked.extend(repos.unreadable.iter().cloned());
        Baseline {
            entries: entries::Entries::take(&walked),
            dirs: walked.dirs.clone(),
            dir_links: walked.dir_links.iter().map(|(l, _)| l.clone()).collect(),
            followed: followed.into_iter().map(|(_, t)| t).collect(),
            places,
            watched,
            settings,
            scripts,
            links,
            repos,
            unchecked,
        }
    }

    /// The roots this baseline covers.
    pub fn roots(&self) -> &[PathBuf] {
        &self.places.roots
    }

    /// Where the audit looks (the watcher watches the same).
    pub fn places(&self) -> &walk::Places {
        &self.places
    }

    /// What changed since, that would run.
    pub fn audit(&self) -> Vec<Finding> {
        self.audit_with(&[])
    }

    /// The same, looking also at `dirty`: the paths the watcher saw change
    /// (found even where a walk stops short).
    pub fn audit_with(&self, dirty: &[PathBuf]) -> Vec<Finding> {
        let mut out: Vec<Finding> = Vec::new();
        let walked = walk::walk(&self.places);
        for dir in &walked.unreadable {
            if self.unchecked.iter().any(|(p, _)| p == dir) {
                continue;
            }
            out.push(Finding {
                path: dir.clone(),
                what: "its permissions were changed so that nothing can list it, and zcode-acp could not give them back".into(),
                shown: String::new(),
                revert: None,
                keep: None,
                blind: true,
            });
        }
        // A walk cut short where the baseline's was not (the agent filled
        // a root past the walk's bound, or nested it past its depth): said.
        for (path, why) in &walked.cut {
            if !self.unchecked.iter().any(|(p, _)| p == path) {
                out.push(Finding {
                    path: path.clone(),
                    what: why.clone(),
                    shown: String::new(),
                    revert: None,
                    keep: None,
                    blind: true,
                });
            }
        }
        for (link, target) in &walked.dir_links {
            if self.dir_links.contains(link) {
                continue;
            }
            // A new way into a directory the walk does not judge as this
            // name would be.
            if self.leads_where_unjudged(target) {
                out.push(Finding {
                    path: link.clone(),
                    what: format!(
                        "a new symlink leads to {}, where a tool entering it would obey what it holds",
                        target.display()
                    ),
                    shown: format!("a symlink to {}", target.display()),
                    revert: Some(Action::Remove(link.clone())),
                    keep: snapshot(link),
                    blind: false,
                });
            }
        }
        let mut on_the_way = LinksOnTheWay::default();
        for w in &self.watched {
            match w {
                Watched::Absent { path, why } => {
                    if std::fs::symlink_metadata(path).is_ok() && !self.granted(path) {
                        out.push(Finding {
                            path: path.clone(),
                            what: format!("it did not exist when the sandbox was armed, and {why}"),
                            shown: show(path),
                            revert: Some(Action::Remove(path.clone())),
                            keep: snapshot(path),
                            blind: false,
                        });
                    }
                }
                Watched::Settings { path, format } => {
                    // A directory on the way made a symlink: an agent run
                    // outside later would read its settings from wherever
                    // it points (a temp dir the agent can write).
                    if let Some(link) = on_the_way.first(path) {
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
                                shown: format!("a symlink to {target}"),
                                revert: Some(Action::Remove(link.clone())),
                                keep: None,
                                path: link,
                                blind: false,
                            });
                        }
                        continue;
                    }
                    if let Some(f) = settings_finding(path, *format, self.setting(path)) {
                        out.push(f);
                    }
                }
            }
        }
        for (path, before) in &self.scripts {
            let now = read_following(path);
            if now != *before {
                let real = crate::policy::resolve_real(path).unwrap_or_else(|_| path.clone());
                out.push(Finding {
                    path: real.clone(),
                    what: "a script an agent's settings run was changed".into(),
                    shown: show(&real),
                    revert: Some(match before {
                        Some(b) => {
                            Action::Write(real.clone(), b.clone(), mode_of(&real).unwrap_or(0o755))
                        }
                        None => Action::Remove(real.clone()),
                    }),
                    keep: snapshot(&real),
                    blind: false,
                });
            }
        }
        out.extend(
            self.repos
                .audit(&self.places.roots, &walked)
                .into_iter()
                .filter(|f| !self.granted(&f.path)),
        );
        // What the rules above look at is theirs to judge.
        let mut covered: Vec<PathBuf> = self
            .watched
            .iter()
            .map(|w| match w {
                Watched::Absent { path, .. } | Watched::Settings { path, .. } => path.clone(),
            })
            .collect();
        covered.extend(self.scripts.iter().map(|(p, _)| p.clone()));
        covered.extend(self.repos.covered());
        let dirty: Vec<(PathBuf, walk::Why)> = dirty
            .iter()
            // As the walk: never inside a `.git` (git's rule reads those),
            // an environment, or what the policy lets the agent write.
            .filter(|p| {
                let below = self
                    .places
                    .roots
                    .iter()
                    .chain(&self.places.trees)
                    .find_map(|r| p.strip_prefix(r).ok())
                    .unwrap_or(p);
                !self.granted(p) && below.components().all(|c| walk::enters(c.as_os_str()))
            })
            .filter_map(|p| {
                let hidden = p.parent().is_some_and(|d| self.is_hidden_dir(d));
                walk::watched_name(p.file_name()?, hidden).map(|w| (p.clone(), w))
            })
            .collect();
        for f in self.entries.compare(&walked, &covered, &dirty) {
            // Said once: a protected path, a settings file or a repository's
            // own finding says more than the general rule.
            if !out
                .iter()
                .any(|o| !o.blind && (o.path == f.path || f.path.starts_with(&o.path)))
            {
                out.push(f);
            }
        }
        out
    }

    /// Whether a new symlink to `target` is a way into what the walk does
    /// not judge as a plain directory would be: inside the roots (outside
    /// them, what is there is not the agent's to write), in a `.git`, an
    /// environment, a CI directory, a place the policy lets the agent
    /// write, or a directory holding what a tool obeys on entering it (a
    /// `.envrc`, a `.git`) that the link would let it enter by another name.
    fn leads_where_unjudged(&self, target: &Path) -> bool {
        let Some(rel) = self
            .places
            .roots
            .iter()
            .find_map(|r| target.strip_prefix(r).ok())
        else {
            return false;
        };
        let mut walked_to = PathBuf::new();
        for c in rel.components() {
            walked_to.push(c);
            if !walk::enters(c.as_os_str()) || walk::is_inert_dir(&walked_to) {
                return true;
            }
        }
        self.granted(target)
            || std::fs::read_dir(target).is_ok_and(|entries| {
                entries.flatten().any(|e| {
                    walk::watched_name(&e.file_name(), false).is_some() || e.file_name() == ".git"
                })
            })
    }

    /// Whether the policy lets the agent write `path` inside the roots (a
    /// path you granted it, its state, caches, temp): not the repository
    /// or protected-path rules' to take back (the settings rule still
    /// reads an agent's settings there).
    fn granted(&self, path: &Path) -> bool {
        self.places.skip.iter().any(|s| path.starts_with(s))
    }

    /// What the watcher watches for this baseline: the directories the
    /// walk entered, and every path another rule reads.
    pub fn watch_targets(&self) -> watch::Targets {
        let dirs = self
            .dirs
            .iter()
            .map(|d| {
                let hidden = self.is_hidden_dir(d);
                (d.clone(), hidden)
            })
            .collect();
        let mut paths: Vec<PathBuf> = self
            .watched
            .iter()
            .map(|w| match w {
                Watched::Absent { path, .. } | Watched::Settings { path, .. } => path.clone(),
            })
            .collect();
        paths.extend(self.scripts.iter().map(|(p, _)| p.clone()));
        paths.extend(self.places.trees.iter().cloned());
        paths.extend(self.places.files.iter().cloned());
        paths.extend(self.repos.watched_paths());
        // Hidden files watched as files too: written through a hard link
        // of another name, they still raise a look.
        let files = self
            .entries
            .seen
            .iter()
            .filter(|(_, (s, _, _))| s.kind == walk::Kind::File)
            .map(|(p, _)| p.clone())
            .take(10_000)
            .collect();
        let tops = self
            .places
            .roots
            .iter()
            .map(|r| (r.clone(), false))
            .chain(self.places.trees.iter().map(|t| (t.clone(), true)))
            .collect();
        watch::Targets {
            dirs,
            paths,
            files,
            tops,
        }
    }

    /// Whether what is in `dir` is judged whatever its names: beneath a
    /// hidden name, in an agent's tree, or where a hidden symlink of the
    /// user's leads.
    fn is_hidden_dir(&self, dir: &Path) -> bool {
        watch::is_hidden_dir(dir, &self.places.roots, &self.places.trees)
            || self.followed.iter().any(|t| dir.starts_with(t))
    }

    fn setting(&self, path: &Path) -> Option<&[u8]> {
        self.settings
            .iter()
            .find(|(p, _)| p == path)
            .and_then(|(_, b)| b.as_deref())
    }

    /// A place the audit cannot look into was said: from now on it is
    /// one of [`Baseline::unchecked`], said once rather than at every look.
    pub fn said_blind(&mut self, f: &Finding) {
        if f.blind && !self.unchecked.iter().any(|(p, _)| *p == f.path) {
            self.unchecked.push((f.path.clone(), f.what.clone()));
        }
    }

    /// The user kept what a finding is about: it is the baseline now.
    pub fn accept(&mut self, f: &Finding) {
        if let Some((_, bytes)) = self.settings.iter_mut().find(|(p, _)| *p == f.path) {
            *bytes = read_following(&f.path);
        }
        for (p, bytes) in self.scripts.iter_mut() {
            if crate::policy::resolve_real(p).ok().as_ref() == Some(&f.path) || *p == f.path {
                *bytes = read_following(p);
            }
        }
        self.watched
            .retain(|w| !matches!(w, Watched::Absent { path, .. } if *path == f.path));
        let walked = walk::walk(&self.places);
        self.entries.accept(&f.path, &walked);
        self.repos.accept(&f.path, &self.places.roots, &walked);
    }
}

fn mode_of(p: &Path) -> Option<u32> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p)
        .ok()
        .map(|m| m.permissions().mode() & 0o7777)
}

fn settings_finding(path: &Path, format: Format, before: Option<&[u8]>) -> Option<Finding> {
    let now = match crate::config::atomic::read_regular(path, true) {
        Ok(bytes) => Some(bytes),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        // Too large to read, or not a regular file: what it would run
        // cannot be seen, so it is taken back whole.
        Err(e) => {
            let at = crate::policy::resolve_real(path).unwrap_or_else(|_| path.to_path_buf());
            return Some(Finding {
                path: path.to_path_buf(),
                what: format!("it changed and cannot be read to see what it would run ({e})"),
                shown: String::new(),
                revert: Some(match before {
                    Some(b) => Action::All(vec![
                        Action::Remove(at.clone()),
                        Action::Write(at.clone(), b.to_vec(), 0o644),
                    ]),
                    None => Action::Remove(path.to_path_buf()),
                }),
                keep: None,
                blind: false,
            });
        }
    };
    if now.as_deref() == before {
        return None;
    }
    // Written where the file really is: a settings file kept elsewhere and
    // linked in is put back there, the link left as it is.
    let at = crate::policy::resolve_real(path).unwrap_or_else(|_| path.to_path_buf());
    let mode = mode_of(&at).unwrap_or(0o644);
    let now_bytes = now.clone().unwrap_or_default();
    let revert_whole = || match before {
        Some(b) => Action::Write(at.clone(), b.to_vec(), mode),
        None => Action::Remove(path.to_path_buf()),
    };
    let keep_whole = || match &now {
        Some(b) => Action::Write(at.clone(), b.clone(), mode),
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
                Some(bytes) if now.is_some() => Action::Write(at.clone(), bytes, mode),
                _ => revert_whole(),
            };
            Some(Finding {
                path: path.to_path_buf(),
                what: format!("the agent's settings would run: {what}"),
                shown: what.clone(),
                revert: Some(revert),
                keep: Some(keep_whole()),
                blind: false,
            })
        }
        // Not readable as its format: any change is put to the user whole.
        _ => Some(Finding {
            path: path.to_path_buf(),
            what: "it changed and cannot be read to see what it would run".into(),
            shown: show(path),
            revert: Some(revert_whole()),
            keep: Some(keep_whole()),
            blind: false,
        }),
    }
}

fn short(s: &str) -> String {
    if s.chars().count() > 200 {
        format!("{}…", s.chars().take(200).collect::<String>())
    } else {
        s.to_owned()
    }
}

#[cfg(test)]
mod bounds_tests;
#[cfg(test)]
mod tests;
