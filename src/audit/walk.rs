//! One walk of the roots, for the audit and its watcher: every hidden
//! entry (a name starting with `.`, and everything beneath a hidden
//! directory), every file named as some tool's configuration, every
//! repository's work tree, and the directories walked (for the watcher).
//!
//! What the walk does not enter, and why:
//! - environments and caches a build fills and that run only when you use
//!   them (`node_modules`, `.venv`, `target`, `.next`, ...: see
//!   [`ENVIRONMENTS`]), which can hold hundreds of thousands of files;
//! - `.git` directories: git's own rule reads those (`super::git`);
//! - nothing through a symlink: a link is an entry, never followed.
//!
//! A walk that reaches its bound ([`MAX_ENTRIES`] per root, [`MAX_DEPTH`])
//! says so (`Walked::cut`): what lies past it is not checked, and the user
//! is told, never left to assume it was.

use std::collections::{BTreeMap, HashSet};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use crate::policy::build::Repo;

/// Entries one root's walk visits, at most (a million entries take about a
/// second to walk; past them the walk says where it stopped).
#[cfg(not(test))]
pub const MAX_ENTRIES: usize = 1_000_000;
/// (Small in unit tests, which fill it on purpose.)
#[cfg(test)]
pub const MAX_ENTRIES: usize = 3_000;
/// How deep below a root the walk goes.
pub const MAX_DEPTH: usize = 64;

/// Directories filled by builds and package managers, never entered: what
/// is in them runs when you use the environment they make (yours to trust,
/// as the packages you install are), and they can be huge.
pub const ENVIRONMENTS: &[&str] = &[
    "node_modules",
    "target",
    "venv",
    "__pycache__",
    ".venv",
    ".direnv",
    ".tox",
    ".nox",
    ".cache",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
    ".hypothesis",
    ".ipynb_checkpoints",
    ".gradle",
    ".kotlin",
    ".next",
    ".nuxt",
    ".output",
    ".svelte-kit",
    ".turbo",
    ".parcel-cache",
    ".angular",
    ".astro",
    ".docusaurus",
    ".expo",
    ".vercel",
    ".netlify",
    ".wrangler",
    ".serverless",
    ".terraform",
    ".dart_tool",
    ".build",
    ".swiftpm",
    ".stack-work",
    ".eggs",
    ".nyc_output",
    ".sass-cache",
    ".pnpm-store",
    ".zig-cache",
    ".elixir_ls",
    ".zcode",
];

/// Hidden directories whose content no tool on this machine runs on its
/// own, by their path below a root: a CI service's workflows and issue
/// forms (run there, after you push and review). Walked past, never
/// findings. (Not `.github` whole: Copilot loads `.github/hooks`.)
pub const INERT_DIRS: &[&str] = &[".github/workflows", ".github/ISSUE_TEMPLATE", ".circleci"];

/// Hidden files that name nothing to run: ignore lists, editor and version
/// pins, caches of linters, the OS's own.
pub const INERT_FILES: &[&str] = &[
    ".gitignore",
    ".gitkeep",
    ".keep",
    ".gitattributes",
    ".gitmodules",
    ".mailmap",
    ".dockerignore",
    ".npmignore",
    ".prettierignore",
    ".eslintignore",
    ".stylelintignore",
    ".ignore",
    ".rgignore",
    ".fdignore",
    ".editorconfig",
    ".nvmrc",
    ".node-version",
    ".python-version",
    ".ruby-version",
    ".terraform-version",
    ".browserslistrc",
    ".DS_Store",
    ".eslintcache",
    ".stylelintcache",
    ".coverage",
];

/// Configuration files without a leading dot that a tool obeys on its
/// own: when you open the folder, enter it, or start an agent there.
pub const NAMED_CONFIGS: &[&str] = &[
    "opencode.json",
    "opencode.jsonc",
    "crush.json",
    "mise.toml",
    "mise.local.toml",
    "rust-toolchain",
    "rust-toolchain.toml",
    "lefthook.yml",
    "lefthook.yaml",
    "lefthook-local.yml",
    "lefthook-local.yaml",
    "bunfig.toml",
    "devcontainer.json",
];

/// Configuration files some tool obeys by their path below a directory
/// (mise reads `mise/config.toml` and `mise/conf.d/*.toml` as it reads
/// `mise.toml`): what is inside these directories is judged like a hidden
/// directory's.
pub const CONFIG_DIRS: &[&str] = &["mise"];

/// Whether `name` is one no tool loads: a swap or backup file an editor
/// keeps beside what it edits, a lock or stale-handle file, a temporary
/// file of an atomic save (zcode-acp's own, and hidden `.tmp-<id>`
/// files), each a hidden name. Judged by how the name ends, never by a
/// marker in its middle: a tool that loads `*.toml` from a directory would
/// load `x.tmp.toml`.
pub fn is_transient(name: &OsStr) -> bool {
    // Only hidden names: a directory some shell sources whole
    // (`~/.bashrc.d/*`) skips them, as globs do; any other name is judged.
    // (Asked first: most names a walk meets are not hidden.)
    if name.as_encoded_bytes().first() != Some(&b'.') {
        return false;
    }
    if crate::config::atomic::is_temp_name(name) {
        return true;
    }
    let n = name.to_string_lossy();
    let temp_id = n.rsplit_once(".tmp-").is_some_and(|(_, id)| {
        !id.is_empty() && id.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
    });
    temp_id
        || n.ends_with(".swp")
        || n.ends_with(".swo")
        || n.ends_with(".swx")
        || n.starts_with(".#")
        || n.starts_with(".~lock.")
        || n.starts_with(".nfs")
        || n.starts_with(".fuse_hidden")
        || n.starts_with(".goutputstream-")
}

/// Whether a name is a named configuration ([`NAMED_CONFIGS`], or
/// `mise.<env>.toml`, or a VS Code workspace file).
pub fn is_named_config(name: &OsStr) -> bool {
    let n = name.as_encoded_bytes();
    NAMED_CONFIGS.iter().any(|c| n == c.as_bytes())
        || (n.starts_with(b"mise.") && n.ends_with(b".toml"))
        || n.ends_with(b".code-workspace")
}

pub use crate::listing::Kind;

/// An entry as it was seen: its kind, size, change time, inode and mode (a
/// write, a replacement or a chmod changes one of them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    pub kind: Kind,
    pub len: u64,
    pub ctime: (i64, i64),
    pub ino: u64,
    pub mode: u32,
}

impl Seen {
    pub fn of(meta: &std::fs::Metadata) -> Seen {
        use std::os::unix::fs::MetadataExt;
        Seen {
            kind: Kind::of(meta.file_type()),
            len: meta.len(),
            ctime: (meta.ctime(), meta.ctime_nsec()),
            ino: meta.ino(),
            mode: meta.mode() & 0o7777,
        }
    }

    pub fn at(path: &Path) -> Option<Seen> {
        std::fs::symlink_metadata(path).ok().map(|m| Seen::of(&m))
    }
}

/// Why an entry is watched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// Hidden, or beneath a hidden directory.
    Hidden,
    /// A file some tool obeys by its name ([`NAMED_CONFIGS`]).
    NamedConfig,
}

/// What one walk found.
#[derive(Debug, Default, Clone)]
pub struct Walked {
    /// Hidden entries and named configs, by path.
    pub entries: BTreeMap<PathBuf, (Seen, Why)>,
    /// Work trees with a `.git` (the repositories' own walk reads them).
    pub work_trees: Vec<PathBuf>,
    /// The directories walked (for the watcher), roots included.
    pub dirs: Vec<PathBuf>,
    /// Where the walk stopped at a bound: what lies past it is unchecked.
    pub cut: Vec<(PathBuf, String)>,
    /// Directories laid out as a bare repository (`HEAD`, `objects/`,
    /// `refs/`): git inside them obeys their `config` and hooks.
    pub bare: Vec<PathBuf>,
    /// Symlinks to directories, of any name, with where they lead: a way
    /// into a directory the walk does not enter (`tools` ->
    /// `node_modules/x`, whose `.envrc` a `cd tools` loads).
    pub dir_links: Vec<(PathBuf, PathBuf)>,
    /// Directories the walk could not list (their permissions were taken
    /// away, and could not be given back).
    pub unreadable: Vec<PathBuf>,
}

/// Where the audit looks: the roots, trees outside them whose every file
/// matters (agents' plugins, skills, hooks in the home directory), and
/// single files there (an agent's `.env`).
#[derive(Debug, Clone, Default)]
pub struct Places {
    pub roots: Vec<PathBuf>,
    /// Places inside the roots that are someone else's to judge, never
    /// walked: zcode-acp's own managed root, and what the policy makes
    /// writable besides the roots (the agent's state, caches, temp), where
    /// a workspace root holds them (a root that is the home directory).
    pub skip: Vec<PathBuf>,
    /// The home directory `~` means in the agents' settings.
    pub home: Option<PathBuf>,
    /// Hidden symlinks to directories in the roots that are walked where
    /// they lead: the user's own (there when the sandbox was armed), never
    /// one the agent made.
    pub follow: Vec<PathBuf>,
    pub trees: Vec<PathBuf>,
    pub files: Vec<PathBuf>,
}

/// Walks every root and tree, and looks at every file.
pub fn walk(places: &Places) -> Walked {
    let mut out = Walked::default();
    for root in &places.roots {
        out.dirs.push(root.clone());
        if root.join(".git").symlink_metadata().is_ok() {
            out.work_trees.push(root.clone());
        }
        let budget = walk_top(root, false, &places.skip, &places.follow, &mut out);
        if budget == 0 {
            out.cut.push((
                root.clone(),
                format!("it holds more than {MAX_ENTRIES} entries (outside node_modules and the like), and the walk stopped there"),
            ));
        }
    }
    for tree in &places.trees {
        // The tree itself, and everything in it, whatever its names.
        let Some(seen) = Seen::at(tree) else { continue };
        out.entries.insert(tree.clone(), (seen, Why::Hidden));
        if seen.kind != Kind::Dir {
            continue;
        }
        out.dirs.push(tree.clone());
        let budget = walk_top(tree, true, &[], &[], &mut out);
        if budget == 0 {
            out.cut.push((
                tree.clone(),
                format!("it holds more than {MAX_ENTRIES} entries"),
            ));
        }
    }
    for file in &places.files {
        if let Some(seen) = Seen::at(file) {
            out.entries.insert(file.clone(), (seen, Why::Hidden));
        }
    }
    out
}

/// Walks the top directory `top` (a root, or a tree: `in_hidden`) into
/// `out`; the budget left. Each directory is asked about relative to `top`
/// held open, and the walk is made again by whole paths where another
/// directory took `top`'s place meanwhile (`listing::walk_anchored`): a
/// directory put in its place is never judged by the stamps of the one it
/// replaced.
fn walk_top(
    top: &Path,
    in_hidden: bool,
    skip: &[PathBuf],
    follow: &[PathBuf],
    out: &mut Walked,
) -> usize {
    let euid = nix::unistd::geteuid().as_raw();
    let (budget, part) = crate::listing::walk_anchored(top, |anchor| {
        let (mut budget, mut seen, mut part) = (MAX_ENTRIES, HashSet::new(), Walked::default());
        let ctx = Ctx {
            root: top,
            anchor,
            skip,
            follow,
            euid,
        };
        walk_dir(&ctx, top, 0, in_hidden, &mut budget, &mut seen, &mut part);
        (budget, part)
    });
    out.absorb(part);
    budget
}

impl Walked {
    /// Adds what another walk found.
    fn absorb(&mut self, other: Walked) {
        self.entries.extend(other.entries);
        self.work_trees.extend(other.work_trees);
        self.dirs.extend(other.dirs);
        self.cut.extend(other.cut);
        self.bare.extend(other.bare);
        self.dir_links.extend(other.dir_links);
        self.unreadable.extend(other.unreadable);
    }
}

/// Whether `name`, in a directory that is hidden or not (`in_hidden`),
/// is an entry of the audit's.
pub fn watched_name(name: &OsStr, in_hidden: bool) -> Option<Why> {
    // A repository's `.git` (a directory, or a pointer to one) is git's
    // rule's (`super::repos`): a new repository is no finding for being new.
    if is_transient(name) || name == ".git" {
        return None;
    }
    let hidden = name.as_encoded_bytes().first() == Some(&b'.');
    if in_hidden || hidden {
        if INERT_FILES.iter().any(|f| name == *f) {
            return None;
        }
        return Some(Why::Hidden);
    }
    is_named_config(name).then_some(Why::NamedConfig)
}

/// Whether the walk enters a directory of this name.
pub fn enters(name: &OsStr) -> bool {
    name != ".git" && !ENVIRONMENTS.iter().any(|e| name == *e)
}

/// Whether `rel` (a directory's path below its root) is one no tool runs
/// anything from ([`INERT_DIRS`]).
pub fn is_inert_dir(rel: &Path) -> bool {
    INERT_DIRS.iter().any(|d| rel == Path::new(d))
}

/// Whether a directory laid out as a bare repository is at `dir`, as git
/// decides it: a `HEAD` that is a file or symlink, and `objects` and
/// `refs` of any kind.
pub fn is_bare_repo(dir: &Path) -> bool {
    let there = |n: &str| std::fs::symlink_metadata(dir.join(n));
    there("HEAD").is_ok_and(|m| m.is_file() || m.file_type().is_symlink())
        && there("objects").is_ok()
        && there("refs").is_ok()
}

/// Gives the user's own directory its owner's permissions back (the agent
/// took them away so that nothing could look inside); whether it did.
fn give_back(dir: &Path) -> bool {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    std::fs::symlink_metadata(dir).is_ok_and(|m| {
        m.is_dir()
            && m.uid() == nix::unistd::geteuid().as_raw()
            && std::fs::set_permissions(
                dir,
                std::fs::Permissions::from_mode((m.mode() & 0o7777) | 0o700),
            )
            .is_ok()
    })
}

/// What one walk carries down.
struct Ctx<'a> {
    root: &'a Path,
    /// The root held open: each directory is asked about relative to it.
    anchor: Option<&'a crate::listing::Anchor>,
    skip: &'a [PathBuf],
    follow: &'a [PathBuf],
    /// Who walks (asked once, not at every directory).
    euid: u32,
}

/// Walks `dir` and what it holds; whether it holds a `.git`, where its
/// whole listing was read (`None` where the walk stopped before: its
/// caller then asks).
fn walk_dir(
    ctx: &Ctx<'_>,
    dir: &Path,
    depth: usize,
    in_hidden: bool,
    budget: &mut usize,
    seen_dirs: &mut std::collections::HashSet<(u64, u64, bool)>,
    out: &mut Walked,
) -> Option<bool> {
    if depth >= MAX_DEPTH {
        out.cut.push((
            dir.to_path_buf(),
            format!("it lies {MAX_DEPTH} directories deep, where the walk stops"),
        ));
        return None;
    }
    // Each directory once as hidden and once as not (a symlinked one may
    // lead back; one of the user's hidden links may lead to a directory
    // walked as plain before). Its `statx` also says whether what it held
    // when last listed is still what it holds (`crate::listing`): asked
    // after the time is taken.
    let listed_at = crate::listing::now();
    let stat = crate::listing::stat_dir(ctx.anchor, dir);
    if let Some(s) = &stat {
        if !seen_dirs.insert((s.dev, s.ino, in_hidden)) {
            return None;
        }
    }
    let kept = stat
        .as_ref()
        .and_then(|s| crate::listing::reuse(dir, s, listed_at));
    // The agent may take its own directory's permissions away so that
    // nothing can list it (no `r`) or look at what it lists (no `x`),
    // while direnv and git still open files there by name: given back, as
    // it is the user's own, or else said.
    let mut given_back = false;
    let mut fresh = match &kept {
        Some(_) => None,
        None => match crate::listing::Reading::open(dir) {
            Ok(e) => Some(e),
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                given_back = give_back(dir);
                match given_back.then(|| crate::listing::Reading::open(dir)) {
                    Some(Ok(e)) => Some(e),
                    _ => {
                        out.unreadable.push(dir.to_path_buf());
                        return None;
                    }
                }
            }
            // Removed meanwhile: nothing left to check.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            // A path too long to open, or any other failure: what is inside
            // is not checked, and the user is told so.
            Err(e) => {
                out.cut
                    .push((dir.to_path_buf(), format!("the walk cannot list it ({e})")));
                return None;
            }
        },
    };
    // Listed but not searchable (no `x`): what is listed could not be
    // looked at (the kinds come from the listing, which needs no `x`, but
    // a repository inside, a link's target or a judged entry do), so it is
    // given back once here, or said. Not asked of a directory its owner
    // walks with its `x` bit set (an ACL's owner entry is those bits): the
    // workspace's every directory, on every walk.
    let owners_and_searchable = stat
        .as_ref()
        .is_some_and(|s| s.uid == ctx.euid && s.mode & 0o100 != 0);
    if !given_back
        && !owners_and_searchable
        && nix::unistd::access(dir, nix::unistd::AccessFlags::X_OK)
            == Err(nix::errno::Errno::EACCES)
    {
        given_back = give_back(dir);
        if !given_back {
            out.unreadable.push(dir.to_path_buf());
            return None;
        }
    }
    let mut subdirs = Vec::new();
    let (mut head, mut objects, mut refs) = (false, false, false);
    let mut marked_work_tree = false;
    // A listing that fails part way (an I/O error) is not taken for the
    // whole: a work tree's mark may be in what was not read.
    let mut listed_whole = true;
    // What a fresh listing held, kept for the next walk where it is whole
    // and not too long to hold.
    let mut keeping = fresh.is_some().then(crate::listing::Listing::default);
    let mut kept_entries = kept.as_deref().map(crate::listing::Listing::iter);
    loop {
        let (listed, kind): (std::borrow::Cow<'_, OsStr>, _) = match (&mut kept_entries, &mut fresh)
        {
            (Some(kept), _) => match kept.next() {
                Some((name, kind)) => (name.into(), Ok(kind)),
                None => break,
            },
            (None, Some(fresh)) => match fresh.next() {
                Some(Ok((name, kind))) => (name.into(), kind),
                Some(Err(_)) => {
                    listed_whole = false;
                    continue;
                }
                None => break,
            },
            (None, None) => break,
        };
        let name: &OsStr = &listed;
        if *budget == 0 {
            return None;
        }
        *budget -= 1;
        // A work tree's mark, whatever its kind (as `symlink_metadata`
        // of `dir/.git` would find it).
        if name == ".git" {
            marked_work_tree = true;
        }
        // The kind from the listing (no call where the file system gives
        // it); the rest of what an entry is, only for one that is judged:
        // a workspace's thousands of source files cost no `statx` each.
        let kind = match kind {
            Ok(kind) => kind,
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                // Listed but not searchable: given back once, or said.
                let path = dir.join(name);
                match (!given_back && give_back(dir)).then(|| std::fs::symlink_metadata(&path)) {
                    Some(Ok(m)) => {
                        given_back = true;
                        Kind::of(m.file_type())
                    }
                    _ => {
                        out.unreadable.push(dir.to_path_buf());
                        return None;
                    }
                }
            }
            Err(_) => {
                // Removed meanwhile: the listing is not what it holds.
                keeping = None;
                continue;
            }
        };
        if let Some(list) = &mut keeping {
            list.push(name, kind);
            if list.len() > crate::listing::MAX_PER_DIR {
                keeping = None;
            }
        }
        if !ctx.skip.is_empty() && ctx.skip.contains(&dir.join(name)) {
            continue;
        }
        // Git takes a directory for a bare repository when its `HEAD` is a
        // file or symlink and `objects` and `refs` are there at all.
        match name.as_encoded_bytes() {
            b"HEAD" => head = matches!(kind, Kind::File | Kind::Symlink),
            b"objects" => objects = true,
            b"refs" => refs = true,
            _ => {}
        }
        let watched = watched_name(name, in_hidden);
        // A plain file no rule judges (most of a workspace) needs nothing
        // more, not even its path.
        if kind == Kind::File && watched.is_none() {
            continue;
        }
        let path = dir.join(name);
        if kind == Kind::Dir && is_inert_dir(path.strip_prefix(ctx.root).unwrap_or(&path)) {
            continue;
        }
        // An environment (`.venv`, `.next`) is neither walked nor judged:
        // a build makes and removes it.
        let environment = kind == Kind::Dir && !enters(name);
        if let Some(why) = watched.filter(|_| !environment) {
            let meta = match std::fs::symlink_metadata(&path) {
                Ok(m) => m,
                Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                    // Listed but not searchable: given back once, or said.
                    match (!given_back && give_back(dir)).then(|| std::fs::symlink_metadata(&path))
                    {
                        Some(Ok(m)) => {
                            given_back = true;
                            m
                        }
                        _ => {
                            out.unreadable.push(dir.to_path_buf());
                            return None;
                        }
                    }
                }
                Err(_) => continue, // removed meanwhile
            };
            // Judged as it is now (its kind too, if it was replaced since
            // it was listed).
            out.entries.insert(path.clone(), (Seen::of(&meta), why));
        }
        if kind == Kind::Symlink && std::fs::metadata(&path).is_ok_and(|m| m.is_dir()) {
            if let Ok(target) = crate::policy::resolve_real(&path) {
                out.dir_links.push((path.clone(), target.clone()));
                // One of the user's, walked where it leads, as hidden.
                if ctx.follow.contains(&path) {
                    subdirs.push((target, name.to_os_string(), true));
                }
            }
        }
        if kind == Kind::Dir {
            if enters(name) {
                subdirs.push((path, name.to_os_string(), false));
            } else if name != ".git" {
                // An environment is not walked, but a repository made at
                // its top is still a repository.
                if path.join(".git").symlink_metadata().is_ok() {
                    out.work_trees.push(path.clone());
                }
                if is_bare_repo(&path) {
                    out.bare.push(path);
                }
            }
        }
    }
    if head && objects && refs {
        out.bare.push(dir.to_path_buf());
    }
    if let (Some(list), Some(read), true, false) = (keeping, &fresh, listed_whole, given_back) {
        crate::listing::keep(dir, read, listed_at, &list.done());
    }
    // Closed before the walk goes deeper: a tree 64 deep holds no more
    // than one open directory at a time.
    drop(fresh);
    for (path, name, through_link) in subdirs {
        if *budget == 0 {
            // What lies below is cut, and said.
            return listed_whole.then_some(marked_work_tree);
        }
        let hidden = in_hidden
            || through_link
            || name.as_encoded_bytes().first() == Some(&b'.')
            || CONFIG_DIRS.iter().any(|c| name == *c);
        out.dirs.push(path.clone());
        // Its own listing says whether it is a work tree (a call fewer for
        // each of the workspace's directories), or else it is asked. (So a
        // nested work tree comes before the one holding it: the order of
        // `work_trees` means nothing to its readers.)
        let listed = walk_dir(ctx, &path, depth + 1, hidden, budget, seen_dirs, out);
        if !hidden && listed.unwrap_or_else(|| path.join(".git").symlink_metadata().is_ok()) {
            out.work_trees.push(path.clone());
        }
    }
    listed_whole.then_some(marked_work_tree)
}

/// The repositories under `roots` (work trees the walk found, and the
/// one each root is inside), with their submodules' and linked
/// worktrees' git directories.
pub fn repos(roots: &[PathBuf], walked: &Walked) -> Vec<Repo> {
    let mut repos = crate::policy::discover::repos_of_work_trees(roots, &walked.work_trees);
    // A bare repository is its own git directory (git in it obeys its
    // config and hooks).
    for dir in &walked.bare {
        if let Ok(real) = crate::policy::resolve_real(dir) {
            if !repos.iter().any(|r| r.git_dir == real) {
                repos.push(Repo {
                    work_tree: real.clone(),
                    git_dir: real.clone(),
                    common_dir: real,
                    hooks_path: None,
                    gitfile: false,
                });
            }
        }
    }
    repos
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory is a work tree by its own listing; one the walk does
    /// not list whole (at its depth, or past its bound) is asked.
    #[test]
    fn work_trees_are_found_listed_or_not() {
        let t = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(t.path()).unwrap();
        let listed = root.join("a/listed");
        std::fs::create_dir_all(listed.join(".git")).unwrap();
        let mut at_the_bound = root.join("deep");
        for _ in 0..MAX_DEPTH - 1 {
            at_the_bound.push("d");
        }
        std::fs::create_dir_all(&at_the_bound).unwrap();
        // A `.git` of any kind marks a work tree, as git takes it.
        std::fs::write(at_the_bound.join(".git"), "gitdir: elsewhere\n").unwrap();
        let walked = walk(&Places {
            roots: vec![root.clone()],
            ..Places::default()
        });
        assert!(
            walked.cut.iter().any(|(p, _)| p == &at_the_bound),
            "{:?}",
            walked.cut
        );
        for w in [&listed, &at_the_bound] {
            assert!(
                walked.work_trees.contains(w),
                "{w:?}: {:?}",
                walked.work_trees
            );
        }
    }

    #[test]
    fn what_the_walk_watches_by_name() {
        let w = |n: &str, h: bool| watched_name(OsStr::new(n), h);
        assert_eq!(w(".envrc", false), Some(Why::Hidden));
        assert_eq!(w(".cursor", false), Some(Why::Hidden));
        assert_eq!(w("tasks.json", true), Some(Why::Hidden));
        assert_eq!(w("opencode.json", false), Some(Why::NamedConfig));
        assert_eq!(w("mise.dev.toml", false), Some(Why::NamedConfig));
        assert_eq!(w("my.code-workspace", false), Some(Why::NamedConfig));
        assert_eq!(w(".github", false), Some(Why::Hidden));
        // A temporary-looking name a tool loads by its ending is judged.
        assert_eq!(w("x.tmp.toml", true), Some(Why::Hidden));
        for quiet in [
            ".gitignore",
            "main.rs",
            ".zcode-acp-0123456789abcdef.tmp",
            ".x.swp",
            ".tmp-12-ab",
            "a~",
        ] {
            assert_eq!(w(quiet, false), None, "{quiet}");
        }
        assert!(!enters(OsStr::new("node_modules")));
        assert!(!enters(OsStr::new(".git")));
        assert!(enters(OsStr::new(".vscode")));
    }

    #[test]
    fn the_walk_finds_hidden_entries_at_any_depth_and_says_where_it_stopped() {
        let t = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(t.path()).unwrap();
        std::fs::create_dir_all(root.join("a/b/c")).unwrap();
        std::fs::write(root.join("a/b/c/.envrc"), "x").unwrap();
        std::fs::create_dir_all(root.join(".vscode")).unwrap();
        std::fs::write(root.join(".vscode/tasks.json"), "{}").unwrap();
        std::fs::create_dir_all(root.join("node_modules/x")).unwrap();
        std::fs::write(root.join("node_modules/x/.envrc"), "x").unwrap();
        std::fs::write(root.join("src.rs"), "x").unwrap();
        let w = walk(&Places {
            roots: vec![root.clone()],
            ..Default::default()
        });
        let found: Vec<_> = w
            .entries
            .keys()
            .map(|p| p.strip_prefix(&root).unwrap().to_owned())
            .collect();
        assert_eq!(
            found,
            vec![
                PathBuf::from(".vscode"),
                ".vscode/tasks.json".into(),
                "a/b/c/.envrc".into()
            ]
        );
        assert!(w.cut.is_empty());
        assert!(w.dirs.contains(&root.join("a/b/c")));
        assert!(!w.dirs.contains(&root.join("node_modules")));
    }
}
