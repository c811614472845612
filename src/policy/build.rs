//! Assembling a [`Policy`] from what discovery found. Pure: every path in
//! the input is already real, and nothing here touches the filesystem, so
//! the exact rule list is unit- and property-tested.

use std::path::{Path, PathBuf};

use super::protected::{Entry, Shape, IN_GIT_DIR, IN_WORK_TREE};
use super::{Band, Matcher, Ops, Policy, Rule};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Platform {
    Linux,
    Macos,
}

impl Platform {
    pub fn current() -> Platform {
        if cfg!(target_os = "macos") {
            Platform::Macos
        } else {
            Platform::Linux
        }
    }
}

/// A git repository found under a root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Repo {
    pub work_tree: PathBuf,
    /// `.git`, or what a `gitdir:` file points to (worktrees, submodules).
    pub git_dir: PathBuf,
    /// Where hooks and the shared config live (`commondir`), often `git_dir`.
    pub common_dir: PathBuf,
    /// `core.hooksPath` from the repository's effective config at arming
    /// (husky points it into the work tree), made absolute.
    pub hooks_path: Option<PathBuf>,
    /// The work tree's `.git` is a pointer (a `gitdir:` file of a linked
    /// worktree or submodule, or a symlink), not the git directory itself.
    pub gitfile: bool,
}

/// What a project's sandbox.json contributes, after the approval ledger.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProjectRules {
    pub allow: Vec<PathBuf>,
    pub deny: Vec<PathBuf>,
    pub strict_git: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootInput {
    pub path: PathBuf,
    pub project: ProjectRules,
    pub repos: Vec<Repo>,
}

/// A writable place with the reason it is writable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Writable {
    pub matcher: Matcher,
    pub why: String,
    /// A cache shared with the user's own builds: the sandbox writes into a
    /// copy-on-write layer of its own where the platform can give one.
    pub layered: bool,
}

/// How a path leads elsewhere through symlinks: each symlink met on the way
/// (the path itself among them when it is one), and where it ends, which
/// may not exist yet (a link to nothing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkChain {
    pub hops: Vec<PathBuf>,
    pub target: PathBuf,
    /// It ends at a directory (a `.git` symlink's git directory).
    pub target_is_dir: bool,
}

/// Everything a policy is built from. All paths are real.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyInput {
    pub platform: Platform,
    pub home: PathBuf,
    pub roots: Vec<RootInput>,
    /// The backend's own state (built-in profiles and the user's list).
    pub backend_state: Vec<Writable>,
    /// System temp and regenerable caches.
    pub temp_and_caches: Vec<Writable>,
    /// Bridge-lifetime grants from the allow flow.
    pub once_allows: Vec<PathBuf>,
    /// The directory holding the profile of this generation, if any.
    pub profile_dir: Option<PathBuf>,
    /// `~/.zcode-acp`: every generation's profile, the approval ledger.
    pub managed_root: PathBuf,
    /// Which destinations the sandbox may reach (`policy::network`).
    pub network: super::network::NetworkPolicy,
    /// Protected paths that led elsewhere through symlinks when the sandbox
    /// was armed, and how ([`Policy::build_resolving_links`]).
    pub links: Vec<(PathBuf, LinkChain)>,
}

fn allow(matcher: Matcher, why: impl Into<String>) -> Rule {
    Rule {
        kind: Band::Allow,
        matcher,
        ops: Ops::All,
        why: why.into(),
        promptable: false,
        dangerous: false,
        reopens: false,
        root: false,
        layered: false,
    }
}

/// Protects each of `entries` beneath `base` once (a work tree may also be
/// a root, and worktrees share a git directory).
fn protect_entries(
    base: &Path,
    entries: &[Entry],
    protected: &mut Vec<Rule>,
    subjects: &mut Vec<PathBuf>,
) {
    for e in entries {
        let p = base.join(e.name);
        if subjects.contains(&p) {
            continue;
        }
        protected.push(protect(shape_matcher(&p, e.shape), e.why, true));
        subjects.push(p);
    }
}

fn protect(matcher: Matcher, why: impl Into<String>, promptable: bool) -> Rule {
    Rule {
        kind: Band::Protected,
        matcher,
        ops: Ops::All,
        why: why.into(),
        promptable,
        dangerous: false,
        reopens: false,
        root: false,
        layered: false,
    }
}

fn island(matcher: Matcher, why: impl Into<String>) -> Rule {
    Rule {
        kind: Band::Island,
        matcher,
        ops: Ops::All,
        why: why.into(),
        promptable: false,
        dangerous: false,
        reopens: false,
        root: false,
        layered: false,
    }
}

fn pin(kind: Band, dir: &Path, why: impl Into<String>) -> Rule {
    Rule {
        kind,
        matcher: Matcher::Literal(dir.to_path_buf()),
        ops: Ops::RemoveOnly,
        why: why.into(),
        promptable: false,
        dangerous: false,
        reopens: false,
        root: false,
        layered: false,
    }
}

fn devices(platform: Platform) -> Vec<Rule> {
    let why = "a device every program may write (null sink, terminal, ptys)";
    let mut rules: Vec<Rule> = ["/dev/null", "/dev/zero", "/dev/tty", "/dev/ptmx"]
        .iter()
        .map(|d| allow(Matcher::Literal(d.into()), why))
        .collect();
    match platform {
        Platform::Linux => {
            rules.push(allow(Matcher::Literal("/dev/full".into()), why));
            rules.push(allow(
                Matcher::Subpath("/dev/pts".into()),
                "pseudo-terminals (script, ssh, editors' terminals)",
            ));
            rules.push(allow(
                Matcher::Subpath("/dev/shm".into()),
                "POSIX shared memory (Python multiprocessing fails without it)",
            ));
        }
        Platform::Macos => {
            rules.push(allow(
                Matcher::NamePrefix {
                    dir: "/dev".into(),
                    prefix: "ttys".into(),
                },
                "pseudo-terminals",
            ));
            for d in ["/dev/stdout", "/dev/stderr", "/dev/dtracehelper"] {
                rules.push(allow(Matcher::Literal(d.into()), why));
            }
            rules.push(allow(
                Matcher::Subpath("/dev/fd".into()),
                "the process's own open files",
            ));
        }
    }
    rules
}

/// Directories strictly between `root` (inclusive) and `path` (exclusive).
fn dirs_between(root: &Path, path: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut cur = path.parent();
    while let Some(dir) = cur {
        if !dir.starts_with(root) {
            break;
        }
        out.push(dir.to_path_buf());
        if dir == root {
            break;
        }
        cur = dir.parent();
    }
    out.reverse();
    out
}

impl Policy {
    pub fn build(input: &PolicyInput) -> Policy {
        let mut allows: Vec<Rule> = Vec::new();
        let mut protected: Vec<Rule> = Vec::new();
        let mut islands: Vec<Rule> = Vec::new();
        // Directories the allow band opens; islands and pins are laid over them.
        let mut open_dirs: Vec<PathBuf> = Vec::new();

        for root in &input.roots {
            let mut r = allow(
                Matcher::Subpath(root.path.clone()),
                format!("workspace root of a live session: {}", root.path.display()),
            );
            r.dangerous = super::offerable::opens_everything(&root.path, Some(&input.home));
            r.root = true;
            allows.push(r);
            open_dirs.push(root.path.clone());
            for repo in &root.repos {
                for dir in [&repo.git_dir, &repo.common_dir] {
                    if !dir.starts_with(&root.path) && !open_dirs.contains(dir) {
                        allows.push(allow(
                            Matcher::Subpath(dir.clone()),
                            format!(
                                "git directory of the worktree or submodule {}",
                                repo.work_tree.display()
                            ),
                        ));
                        open_dirs.push(dir.clone());
                    }
                }
            }
        }
        // Directories where a name prefix is granted: a `.zcode` made there
        // (`~/.zcode` matches `~/.zcode*`) must be an island too, or the
        // agent could plant the config of a later session rooted there.
        let mut prefix_dirs: Vec<PathBuf> = Vec::new();
        for grant in input.backend_state.iter().chain(&input.temp_and_caches) {
            let mut rule = allow(grant.matcher.clone(), grant.why.clone());
            rule.layered = grant.layered;
            allows.push(rule);
            match &grant.matcher {
                Matcher::Subpath(d) => open_dirs.push(d.clone()),
                Matcher::NamePrefix { dir, .. } if !prefix_dirs.contains(dir) => {
                    prefix_dirs.push(dir.clone())
                }
                _ => {}
            }
        }
        for root in &input.roots {
            for p in &root.project.allow {
                allows.push(allow(
                    Matcher::Subpath(p.clone()),
                    format!("allowed by {}/.zcode/acp/sandbox.json", root.path.display()),
                ));
                open_dirs.push(p.clone());
            }
        }
        for p in &input.once_allows {
            allows.push(allow(
                Matcher::Subpath(p.clone()),
                "allowed once, for this bridge's lifetime",
            ));
            open_dirs.push(p.clone());
        }
        allows.extend(devices(input.platform));

        // Protected: the delayed escapes.
        let mut subjects: Vec<PathBuf> = Vec::new();
        for root in &input.roots {
            let mut trees: Vec<&Path> = vec![&root.path];
            trees.extend(root.repos.iter().map(|r| r.work_tree.as_path()));
            for tree in trees {
                protect_entries(tree, IN_WORK_TREE, &mut protected, &mut subjects);
            }
            for repo in &root.repos {
                for dir in dedup([&repo.common_dir, &repo.git_dir]) {
                    if root.project.strict_git {
                        protected.push(protect(
                            Matcher::Subpath(dir.clone()),
                            "strictGit: the whole git directory is behind the allow prompt",
                            true,
                        ));
                        subjects.push(dir.clone());
                        continue;
                    }
                    protect_entries(dir, IN_GIT_DIR, &mut protected, &mut subjects);
                }
                // A `.git` pointer (a `gitdir:` file, a symlink) says where
                // the repository is: pointed at a directory the agent made,
                // git would obey that one's config and hooks.
                let gitfile = repo.work_tree.join(".git");
                if repo.gitfile && !subjects.contains(&gitfile) {
                    protected.push(protect(
                        Matcher::Literal(gitfile.clone()),
                        "a .git file tells git where the repository is: pointed elsewhere, git obeys that directory's config and hooks",
                        true,
                    ));
                    subjects.push(gitfile);
                }
                if let Some(hooks) = &repo.hooks_path {
                    // husky 9 points git at `.husky/_`, whose stubs run the
                    // scripts beside it, in `.husky`: that is protected.
                    let hooks = match (hooks.file_name(), hooks.parent()) {
                        (Some(name), Some(parent))
                            if name == "_" && parent.file_name().is_some_and(|n| n == ".husky") =>
                        {
                            parent.to_path_buf()
                        }
                        _ => hooks.clone(),
                    };
                    let hooks = &hooks;
                    if !subjects.contains(hooks) {
                        protected.push(protect(
                            Matcher::Subpath(hooks.clone()),
                            format!(
                                "core.hooksPath of {}: git runs the hooks there, outside the sandbox when the user runs git",
                                repo.work_tree.display()
                            ),
                            true,
                        ));
                        subjects.push(hooks.clone());
                    }
                }
            }
            for p in &root.project.deny {
                protected.push(protect(
                    Matcher::Subpath(p.clone()),
                    format!(
                        "never allowed, by {}/.zcode/acp/sandbox.json",
                        root.path.display()
                    ),
                    false,
                ));
                subjects.push(p.clone());
            }
        }
        // A protected path that leads elsewhere through symlinks protects
        // where it leads (a write through `.git/hooks -> ../tools/hooks`
        // lands in `tools/hooks`, a path no rule above names), and every
        // symlink on the way, each of which could be repointed.
        for (subject, chain) in &input.links {
            let Some(rule) = protected
                .iter()
                .find(|r| r.matcher.path() == Some(subject.as_path()))
                .cloned()
            else {
                continue;
            };
            // A name protected as one file that leads to a directory (a
            // `.git` symlink): the link is held, and what the directory
            // holds has rules of its own (its hooks, its config).
            let file_to_dir = matches!(rule.matcher, Matcher::Literal(_)) && chain.target_is_dir;
            if !file_to_dir && !subjects.contains(&chain.target) {
                let mut r = rule.clone();
                r.matcher = match &rule.matcher {
                    Matcher::Subpath(_) => Matcher::Subpath(chain.target.clone()),
                    _ => Matcher::Literal(chain.target.clone()),
                };
                r.why = format!("where {} leads: {}", subject.display(), rule.why);
                protected.push(r);
                subjects.push(chain.target.clone());
            }
            let writable = |p: &Path| open_dirs.iter().any(|d| p.starts_with(d));
            for hop in chain.hops.iter().filter(|h| *h != subject && writable(h)) {
                if subjects.contains(hop) {
                    continue;
                }
                protected.push(protect(
                    Matcher::Literal(hop.clone()),
                    format!(
                        "a symlink on the way to the protected {}: repointed, it would lead the protection elsewhere",
                        subject.display()
                    ),
                    rule.promptable,
                ));
                subjects.push(hop.clone());
            }
        }
        // Pin every directory between an open root and a protected path, so
        // the path cannot be moved away from its rule.
        let mut pinned: Vec<PathBuf> = Vec::new();
        for subject in &subjects {
            if let Some(root) = open_dirs
                .iter()
                .filter(|d| subject.starts_with(d) && *d != subject)
                .max_by_key(|d| d.as_os_str().len())
            {
                for dir in dirs_between(root, subject) {
                    if !pinned.contains(&dir) {
                        protected.push(pin(
                            Band::Protected,
                            &dir,
                            format!(
                                "holds the protected {}: cannot be renamed or removed",
                                subject.display()
                            ),
                        ));
                        pinned.push(dir);
                    }
                }
            }
        }

        // The user's own grants (approved allow entries, once-allows) open a
        // protected path they name or lie inside: placed after the protected
        // band. A grant that merely contains a protected path (an entry for
        // the whole workspace) opens nothing more.
        let grants = input
            .roots
            .iter()
            .flat_map(|r| r.project.allow.iter())
            .chain(&input.once_allows);
        let mut reopened: Vec<Rule> = Vec::new();
        // Grants are real paths: one made through a protected symlink names
        // where it leads, whose rule it opens.
        for g in grants {
            if let Some(subject) = subjects.iter().find(|s| g.starts_with(s)) {
                let mut r = allow(
                    Matcher::Subpath(g.clone()),
                    format!(
                        "granted by the user, over the protection of {}",
                        subject.display()
                    ),
                );
                r.reopens = true;
                if !reopened.iter().any(|x| x.matcher == r.matcher) {
                    reopened.push(r);
                }
            }
        }
        protected.extend(reopened);

        // Islands: the sandbox's own configuration, last of all.
        let mut seen_beneath: Vec<&PathBuf> = Vec::new();
        for dir in open_dirs.iter().chain(&prefix_dirs) {
            if seen_beneath.contains(&dir) {
                continue;
            }
            seen_beneath.push(dir);
            islands.push(island(
                Matcher::ZcodeConfig { beneath: dir.clone() },
                "a project's sandbox config (.zcode/acp) is never writable by the agent, nor any .zcode entry that could be renamed into one",
            ));
        }
        for root in &input.roots {
            if !pinned.contains(&root.path) {
                islands.push(pin(
                    Band::Island,
                    &root.path,
                    "a workspace root cannot be renamed or removed: the islands inside it would move with it",
                ));
            }
        }
        if let Some(dir) = &input.profile_dir {
            islands.push(island(
                Matcher::Subpath(dir.clone()),
                "the directory of this generation's sandbox profile",
            ));
        }
        islands.push(island(
            Matcher::Subpath(input.managed_root.clone()),
            "zcode-acp's managed root: every generation's profile and the approval ledger",
        ));

        let mut rules = allows;
        rules.extend(protected);
        rules.extend(islands);
        Policy {
            rules,
            network: input.network.clone(),
        }
    }
}

impl Policy {
    /// Builds the policy for `input`, with the protected paths that lead
    /// elsewhere through symlinks protecting where they lead and every link
    /// on the way too: `chain` says how a path leads elsewhere (None: it
    /// does not; [`link_chain`] on the real disk).
    pub fn build_resolving_links(
        input: &mut PolicyInput,
        chain: impl Fn(&Path) -> Option<LinkChain>,
    ) -> Policy {
        let first = Policy::build(input);
        input.links = first
            .rules
            .iter()
            .filter(|r| r.kind == Band::Protected && r.ops == Ops::All)
            .filter_map(|r| r.matcher.path())
            .filter_map(|p| chain(p).map(|c| (p.to_path_buf(), c)))
            .collect();
        if input.links.is_empty() {
            return first;
        }
        Policy::build(input)
    }
}

/// How `p` (a real directory and a last name, as every protected path is)
/// leads elsewhere through symlinks, if it does: resolved one component and
/// one link at a time, as the kernel does, so every link on the way is seen
/// (and a last one that leads nowhere still says where).
pub fn link_chain(p: &Path) -> Option<LinkChain> {
    use std::path::Component;
    // The protected paths are built on real paths: only their last name
    // can be a link, so one look tells most of them apart.
    if !std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_symlink()) {
        return None;
    }
    let mut pending: std::collections::VecDeque<std::ffi::OsString> =
        std::collections::VecDeque::new();
    let push_front = |pending: &mut std::collections::VecDeque<std::ffi::OsString>, path: &Path| {
        for c in path.components().rev() {
            match c {
                Component::Normal(n) => pending.push_front(n.to_owned()),
                Component::ParentDir => pending.push_front("..".into()),
                _ => {}
            }
        }
    };
    push_front(&mut pending, p);
    let mut at = PathBuf::from("/");
    let mut hops = Vec::new();
    // As the kernel does, at most 40 links.
    let mut links_left = 40;
    while let Some(name) = pending.pop_front() {
        if name == ".." {
            at.pop();
            continue;
        }
        let next = at.join(&name);
        match std::fs::read_link(&next) {
            Ok(target) => {
                links_left -= 1;
                if links_left == 0 {
                    return None;
                }
                hops.push(next);
                if target.is_absolute() {
                    at = PathBuf::from("/");
                }
                push_front(&mut pending, &target);
            }
            Err(_) => at = next,
        }
    }
    let target_is_dir = at.is_dir();
    (!hops.is_empty()).then_some(LinkChain {
        hops,
        target: at,
        target_is_dir,
    })
}

fn shape_matcher(p: &Path, shape: Shape) -> Matcher {
    match shape {
        Shape::Dir => Matcher::Subpath(p.to_path_buf()),
        Shape::File => Matcher::Literal(p.to_path_buf()),
    }
}

fn dedup(dirs: [&PathBuf; 2]) -> Vec<&PathBuf> {
    if dirs[0] == dirs[1] {
        vec![dirs[0]]
    } else {
        dirs.to_vec()
    }
}

#[cfg(test)]
#[path = "build_tests.rs"]
mod tests;
