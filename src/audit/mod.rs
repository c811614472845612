//! The audit: what an armed agent left that the user's own, unsandboxed
//! tools would run or obey later.
//!
//! The guarantee, in one sentence (README, "The audit"): nothing the agent
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
use settings::Format;

/// Files larger than this are not held in memory for "keep" (the stash
/// keeps them on disk).
const MAX_KEPT: u64 = 1 << 20;
/// At most this many entries of a new directory are held in memory.
const MAX_KEPT_ENTRIES: usize = 256;
/// How much of the agent's version a finding shows.
const SHOWN: usize = 2048;

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
}

/// One entry of a directory tree held in memory.
#[derive(Debug, Clone)]
pub enum Node {
    Dir,
    File(Vec<u8>, u32),
    Link(PathBuf),
}

/// A change made outside the sandbox, never through a symlinked directory.
#[derive(Debug, Clone)]
pub enum Action {
    /// Write these bytes (atomically, with this mode) at the path.
    Write(PathBuf, Vec<u8>, u32),
    /// Remove the path (a file, a symlink, or a directory with everything
    /// in it).
    Remove(PathBuf),
    /// Make a directory at the path (where nothing is).
    Dir(PathBuf),
    /// Make a symlink at the path, to this target.
    Link(PathBuf, PathBuf),
    /// Recreate a directory tree: (relative path, what it is).
    Tree(PathBuf, Vec<(PathBuf, Node)>),
    /// Move one path to another (the stash's: never across filesystems).
    Move(PathBuf, PathBuf),
    /// Several of these, in order.
    All(Vec<Action>),
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
        let links = watched
            .iter()
            .filter_map(|w| match w {
                Watched::Settings { path, .. } => first_link_on_the_way(path),
                _ => None,
            })
            .collect();
        let walked = walk::walk(&places);
        let repos = repos::Repos::take(&places.roots, &walked);
        let mut unchecked = walked.cut.clone();
        unchecked.extend(repos.unreadable.iter().cloned());
        Baseline {
            entries: entries::Entries::take(&walked),
            dirs: walked.dirs.clone(),
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
        let mut out: Vec<Finding> = Vec::new();
        let walked = walk::walk(&self.places);
        for w in &self.watched {
            match w {
                Watched::Absent { path, why } => {
                    if std::fs::symlink_metadata(path).is_ok() {
                        out.push(Finding {
                            path: path.clone(),
                            what: format!("it did not exist when the sandbox was armed, and {why}"),
                            shown: show(path),
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
                                shown: format!("a symlink to {target}"),
                                revert: Some(Action::Remove(link.clone())),
                                keep: None,
                                path: link,
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
                });
            }
        }
        out.extend(self.repos.audit(&self.places.roots, &walked));
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
        for f in self.entries.compare(&walked, &covered) {
            // Said once: a protected path, a settings file or a repository's
            // own finding says more than the general rule.
            if !out
                .iter()
                .any(|o| o.path == f.path || f.path.starts_with(&o.path))
            {
                out.push(f);
            }
        }
        out
    }

    /// What the watcher watches for this baseline: the directories the
    /// walk entered, and every path another rule reads.
    pub fn watch_targets(&self) -> watch::Targets {
        let dirs = self
            .dirs
            .iter()
            .map(|d| {
                let hidden = watch::is_hidden_dir(d, &self.places.roots, &self.places.trees);
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
        watch::Targets { dirs, paths }
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
    let now = read_following(path);
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
            })
        }
        // Not readable as its format: any change is put to the user whole.
        _ => Some(Finding {
            path: path.to_path_buf(),
            what: "it changed and cannot be read to see what it would run".into(),
            shown: show(path),
            revert: Some(revert_whole()),
            keep: Some(keep_whole()),
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

/// The agent's version of `path`, for the user to see: a file's text (cut
/// at [`SHOWN`] bytes), a directory's listing, a symlink's target.
pub fn show(path: &Path) -> String {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return "(gone)".into();
    };
    if meta.file_type().is_symlink() {
        return match std::fs::read_link(path) {
            Ok(t) => format!("a symlink to {}", t.display()),
            Err(_) => "a symlink".into(),
        };
    }
    if meta.is_dir() {
        let mut names: Vec<String> = Vec::new();
        let mut stack = vec![(path.to_path_buf(), PathBuf::new())];
        while let Some((dir, rel)) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in entries.flatten() {
                let r = rel.join(e.file_name());
                if names.len() >= 40 {
                    names.push("…".into());
                    return names.join("\n");
                }
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    names.push(format!("{}/", r.display()));
                    stack.push((e.path(), r));
                } else {
                    names.push(r.display().to_string());
                }
            }
        }
        return if names.is_empty() {
            "an empty directory".into()
        } else {
            names.join("\n")
        };
    }
    if !meta.is_file() {
        return "a special file".into();
    }
    use std::io::Read;
    let mut head = Vec::new();
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(path);
    if let Ok(f) = opened {
        let _ = f.take(SHOWN as u64 + 1).read_to_end(&mut head);
    }
    if head.contains(&0) {
        return format!("binary, {} bytes", meta.len());
    }
    let mut text = String::from_utf8_lossy(&head[..head.len().min(SHOWN)]).into_owned();
    if meta.len() > SHOWN as u64 {
        text.push_str(&format!("\n… ({} bytes in all)", meta.len()));
    }
    text
}

use std::os::unix::fs::OpenOptionsExt;

/// What it takes to put `path` back as it is now, held in memory within
/// bounds (None past them: the stash keeps it on disk).
fn snapshot(path: &Path) -> Option<Action> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::symlink_metadata(path).ok()?;
    if meta.file_type().is_symlink() {
        return std::fs::read_link(path)
            .ok()
            .map(|t| Action::Link(path.to_path_buf(), t));
    }
    if meta.is_file() {
        if meta.len() > MAX_KEPT {
            return None;
        }
        let mode = meta.permissions().mode() & 0o7777;
        return read(path).map(|b| Action::Write(path.to_path_buf(), b, mode));
    }
    if !meta.is_dir() {
        return None;
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
            let m = e.metadata().ok()?;
            if m.file_type().is_symlink() {
                entries.push((r, Node::Link(std::fs::read_link(e.path()).ok()?)));
            } else if m.is_dir() {
                entries.push((r.clone(), Node::Dir));
                stack.push(r);
            } else if m.is_file() {
                if m.len() > MAX_KEPT {
                    return None;
                }
                let mode = m.permissions().mode() & 0o7777;
                entries.push((r, Node::File(read(&e.path())?, mode)));
            } else {
                return None;
            }
        }
    }
    Some(Action::Tree(path.to_path_buf(), entries))
}

impl Action {
    /// Carries the action out (outside the sandbox): never through a
    /// symlinked directory, writes atomic.
    pub fn apply(&self) -> std::io::Result<()> {
        match self {
            Action::Write(path, bytes, mode) => at_real(path, |p| {
                crate::config::atomic::write_atomic(p, bytes, *mode)
            }),
            Action::Remove(path) => at_real(path, remove),
            Action::Dir(path) => at_real(path, |p| match std::fs::create_dir(p) {
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
                other => other,
            }),
            Action::Link(path, target) => at_real(path, |p| {
                remove(p)?;
                std::os::unix::fs::symlink(target, p)
            }),
            Action::Tree(path, entries) => {
                at_real(path, |p| {
                    remove(p)?;
                    std::fs::create_dir(p)
                })?;
                for (rel, node) in entries {
                    at_real(&path.join(rel), |p| match node {
                        Node::Dir => std::fs::create_dir(p),
                        Node::File(b, mode) => crate::config::atomic::write_atomic(p, b, *mode),
                        Node::Link(t) => std::os::unix::fs::symlink(t, p),
                    })?;
                }
                Ok(())
            }
            Action::Move(from, to) => at_real(from, |f| at_real(to, |t| std::fs::rename(f, t))),
            Action::All(actions) => actions.iter().try_for_each(Action::apply),
        }
    }

    /// Writes what this action would put back beneath `dir`, each path
    /// under its own file name (a copy kept where nothing runs it); whether
    /// it wrote anything (a removal keeps nothing).
    pub fn save_under(&self, dir: &Path) -> std::io::Result<bool> {
        use std::os::unix::fs::PermissionsExt;
        let name = |p: &Path| p.file_name().map(|n| n.to_owned()).unwrap_or_default();
        // Kept copies never run: no execute or set-id bits.
        let quiet = |mode: u32| mode & 0o666;
        match self {
            Action::Write(path, bytes, mode) => {
                crate::config::atomic::write_atomic(&dir.join(name(path)), bytes, quiet(*mode))?;
                Ok(true)
            }
            Action::Link(path, target) => {
                std::os::unix::fs::symlink(target, dir.join(name(path)))?;
                Ok(true)
            }
            Action::Remove(_) | Action::Dir(_) | Action::Move(..) => Ok(false),
            Action::Tree(path, entries) => {
                let top = dir.join(name(path));
                std::fs::create_dir(&top)?;
                // Relative paths the snapshot made itself, parents first.
                for (rel, node) in entries {
                    match node {
                        Node::Dir => std::fs::create_dir(top.join(rel))?,
                        Node::File(b, mode) => {
                            crate::config::atomic::write_atomic(&top.join(rel), b, quiet(*mode))?;
                            let _ = std::fs::set_permissions(
                                top.join(rel),
                                std::fs::Permissions::from_mode(quiet(*mode)),
                            );
                        }
                        Node::Link(t) => std::os::unix::fs::symlink(t, top.join(rel))?,
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
mod tests;
