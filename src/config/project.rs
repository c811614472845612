//! A project's `.zcode/acp/sandbox.json`, with the rules that make it the
//! users' security contract:
//!
//! - first touch creates the template with `enabled: false`: the file's
//!   presence is never the switch, only `enabled` is;
//! - malformed JSON, a non-object, or a field of the wrong type counts as
//!   `enabled: true` with no allow entries, and the file is not rewritten
//!   (corruption fails closed; a half-saved edit is never clobbered);
//! - a symlinked or hardlinked file: armed, persistence disabled;
//! - a file that was armed and then becomes unreadable or disappears stays
//!   armed (only the sandboxed agent could have done that);
//! - what differs from the approval ledger in the permissive direction
//!   (new allow entries, `enabled: false`, `strictGit: false`) is ignored
//!   until the user approves it.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::atomic::{create_atomic, create_real_dirs, plain_file, read_nofollow, write_atomic};
use super::ledger::{Approved, Ledger};
use super::managed::{project_key, ManagedRoot};

pub const CONFIG_DIR: [&str; 2] = [".zcode", "acp"];
pub const CONFIG_FILE: &str = "sandbox.json";

pub fn config_path(root: &Path) -> PathBuf {
    root.join(CONFIG_DIR[0])
        .join(CONFIG_DIR[1])
        .join(CONFIG_FILE)
}

/// The file's fields as written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProjectConfig {
    pub enabled: bool,
    pub allow: Vec<String>,
    pub deny: Vec<String>,
    pub strict_git: bool,
    /// Offer this project's sessions the `run_code` tool.
    pub code_exec: bool,
    /// Destinations this project's sandbox may also reach (it widens the
    /// user's table once approved).
    pub network: Option<crate::config::network::NetworkTable>,
    /// Keys the file has that zcode-acp does not know (ignored; said).
    pub unknown: Vec<String>,
}

/// The keys a project's sandbox.json may have.
pub const KEYS: &[&str] = &[
    "enabled",
    "allow",
    "deny",
    "strictGit",
    "codeExec",
    "network",
];

/// What `root`'s sandbox.json has that zcode-acp does not know, in words
/// (each key with the one it probably meant).
pub fn unknown_keys_note(root: &Path, config: &ProjectConfig) -> Option<String> {
    crate::config::keys::unknown_keys_note(&config_path(root), "", &config.unknown, KEYS)
}

/// How the file was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileState {
    Ok,
    /// The template was just created.
    Created,
    /// Missing and could not be created (e.g. a read-only workspace).
    Missing,
    /// Unparseable or of the wrong shape: armed, entries ignored.
    Malformed(String),
    /// Symlinked, hardlinked or behind a symlinked directory: armed.
    Untrusted(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProjectRead {
    pub config: ProjectConfig,
    pub state: FileState,
}

fn armed_without_entries(state: FileState) -> ProjectRead {
    ProjectRead {
        config: ProjectConfig {
            enabled: true,
            ..ProjectConfig::default()
        },
        state,
    }
}

/// Parses the file's bytes; `Err` says what is wrong with them.
pub fn parse(bytes: &[u8]) -> Result<ProjectConfig, String> {
    let value: Value = serde_json::from_slice(bytes).map_err(|e| format!("not valid JSON: {e}"))?;
    let obj = value.as_object().ok_or("not a JSON object")?;
    let flag = |key: &str| match obj.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(format!("`{key}` must be true or false")),
    };
    let list = |key: &str| match obj.get(key) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|i| {
                i.as_str()
                    .map(str::to_owned)
                    .ok_or(format!("`{key}` must be a list of paths"))
            })
            .collect(),
        Some(_) => Err(format!("`{key}` must be a list of paths")),
    };
    Ok(ProjectConfig {
        enabled: flag("enabled")?,
        allow: list("allow")?,
        deny: list("deny")?,
        strict_git: flag("strictGit")?,
        code_exec: flag("codeExec")?,
        network: match obj.get("network") {
            None | Some(Value::Null) => None,
            Some(v) => Some(crate::config::network::NetworkTable::parse(v)?),
        },
        unknown: obj
            .keys()
            .filter(|k| !KEYS.contains(&k.as_str()))
            .cloned()
            .collect(),
    })
}

fn template() -> Vec<u8> {
    let t = json!({"enabled": false, "allow": [], "deny": [], "strictGit": false});
    let mut bytes = serde_json::to_vec_pretty(&t).expect("static JSON");
    bytes.push(b'\n');
    bytes
}

/// Where the config directory chain goes through a symlink, if it does.
fn symlinked_dir(root: &Path) -> Option<PathBuf> {
    let mut cur = root.to_path_buf();
    for part in CONFIG_DIR {
        cur.push(part);
        if std::fs::symlink_metadata(&cur).is_ok_and(|m| m.file_type().is_symlink()) {
            return Some(cur);
        }
    }
    None
}

/// Reads a project's sandbox.json (creating the template on first touch).
/// A file that disappears after it armed the project does not disarm it:
/// the ledger remembers `enabled: true`.
pub fn read(root: &Path) -> ProjectRead {
    read_with(root, true)
}

/// Like [`read`]; `create_template` false leaves a missing file missing
/// (for commands that only look).
pub fn read_with(root: &Path, create_template: bool) -> ProjectRead {
    let path = config_path(root);
    if let Some(link) = symlinked_dir(root) {
        return armed_without_entries(FileState::Untrusted(format!(
            "{} is a symlink",
            link.display()
        )));
    }
    match plain_file(&path) {
        Ok(None) => {
            if !create_template {
                return ProjectRead {
                    config: ProjectConfig::default(),
                    state: FileState::Missing,
                };
            }
            // Placed whole: a reader in between (another session's
            // decision, discovery) sees no file or the template, never an
            // empty file it would take for a malformed one.
            let created = create_real_dirs(root, &CONFIG_DIR, 0o755)
                .and_then(|dir| create_atomic(&dir.join(CONFIG_FILE), &template(), 0o644));
            ProjectRead {
                config: ProjectConfig::default(),
                state: if created.is_ok() {
                    FileState::Created
                } else {
                    FileState::Missing
                },
            }
        }
        Ok(Some(false)) => {
            // Symlinked, hardlinked, or not a regular file.
            let mut read = armed_without_entries(FileState::Untrusted(format!(
                "{} is a symlink, has other hard links, or is not a regular file",
                path.display()
            )));
            // Its deny entries still count: they only take rights away. Read
            // without blocking or growing without bound: this may be a FIFO,
            // a device or a symlink to one.
            if let Ok(c) = super::atomic::read_regular(&path, true)
                .map_err(|e| e.to_string())
                .and_then(|b| parse(&b))
            {
                read.config.deny = c.deny;
            }
            read
        }
        Ok(Some(true)) => match read_nofollow(&path) {
            Ok(bytes) => match parse(&bytes) {
                Ok(config) => ProjectRead {
                    config,
                    state: FileState::Ok,
                },
                Err(why) => armed_without_entries(FileState::Malformed(why)),
            },
            Err(e) => armed_without_entries(FileState::Malformed(format!("unreadable: {e}"))),
        },
        Err(e) => armed_without_entries(FileState::Malformed(format!("unreadable: {e}"))),
    }
}

/// A project's approved entries, as written: plain values, which the
/// policy resolves (and refuses where they may never be granted).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Entries {
    pub allow: Vec<String>,
    pub deny: Vec<String>,
    pub strict_git: bool,
}

/// What the bridge acts on: the file, minus what the user has not approved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Effective {
    pub armed: bool,
    pub rules: Entries,
    /// Offer the project's sessions `run_code` (approved `codeExec: true`).
    pub code_exec: bool,
    /// The file asks for `codeExec: true`, not yet approved.
    pub code_exec_unapproved: bool,
    /// The project's approved `network` table.
    pub network: Option<crate::config::network::NetworkTable>,
    /// Each permissive difference from the ledger that was ignored, in
    /// words for the log and `doctor`.
    pub ignored: Vec<String>,
    /// The ledger after recording what needs no approval (the restrictive
    /// direction); the caller saves it if it changed.
    pub ledger: Approved,
    pub state: FileState,
}

impl std::fmt::Display for FileState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FileState::Ok => f.write_str("read"),
            FileState::Created => f.write_str("created just now (disarmed)"),
            FileState::Missing => f.write_str("missing"),
            FileState::Malformed(why) => write!(f, "malformed ({why}): armed, its entries ignored"),
            FileState::Untrusted(why) => {
                write!(f, "not trusted ({why}): armed, only its deny entries read")
            }
        }
    }
}

/// Applies the ledger to what was read.
pub fn effective(read: &ProjectRead, approved: &Approved) -> Effective {
    let mut ledger = approved.clone();
    let mut ignored = Vec::new();
    let config = &read.config;

    let mut armed = config.enabled;
    if config.enabled {
        ledger.enabled = Some(true);
    } else if approved.enabled == Some(true) {
        armed = true;
        ignored.push("`enabled: false` was not approved: the sandbox stays on".to_owned());
    }
    let mut strict_git = config.strict_git;
    if config.strict_git {
        ledger.strict_git = Some(true);
    } else if approved.strict_git == Some(true) {
        strict_git = true;
        ignored.push("`strictGit: false` was not approved: .git stays protected".to_owned());
    }
    // Code execution is permissive: on only once approved; off at once
    // (and turning it on again needs a new approval).
    let mut code_exec = false;
    let mut code_exec_unapproved = false;
    if config.code_exec {
        if approved.code_exec == Some(true) {
            code_exec = true;
        } else {
            code_exec_unapproved = true;
            ignored.push("`codeExec: true` was not approved: run_code is not offered".to_owned());
        }
    } else if approved.code_exec == Some(true) {
        ledger.code_exec = Some(false);
    }
    // The network table widens the user's: it counts once approved as
    // written. A table that opens nothing needs no approval, nor does one
    // narrower than the approved one (recorded, so what was cut needs a
    // new approval). Removed, it leaves the ledger.
    let network = match &config.network {
        None => {
            ledger.network = None;
            None
        }
        Some(table) if !table.opens_anything() => {
            ledger.network = None;
            Some(table.clone())
        }
        Some(table) if approved.network.as_ref() == Some(table) => Some(table.clone()),
        Some(table) if approved.network.as_ref().is_some_and(|a| table.within(a)) => {
            ledger.network = Some(table.clone());
            Some(table.clone())
        }
        Some(table) => {
            ignored.push(format!(
                "`network` ({}) was not approved: the user's table applies",
                table.describe()
            ));
            None
        }
    };
    // Entries removed from the file leave the ledger: adding them back
    // needs a new approval.
    ledger.allow.retain(|a| config.allow.contains(a));

    let mut allow = Vec::new();
    for entry in &config.allow {
        if approved.allow.contains(entry) {
            allow.push(entry.clone());
        } else {
            ignored.push(format!("allow entry `{entry}` was not approved"));
        }
    }
    Effective {
        armed,
        rules: Entries {
            allow,
            deny: config.deny.clone(),
            strict_git,
        },
        code_exec,
        code_exec_unapproved,
        network,
        ignored,
        ledger,
        state: read.state.clone(),
    }
}

/// Prepares a project for arming, the one place a project is written
/// without the user's answer: creates its sandbox.json template on first
/// touch, and records in the ledger what needs no approval (a restriction
/// the file makes: `enabled: true`, a narrower network table), so undoing
/// it needs one. Called when a session opens the project and before
/// `zcode-acp run` arms; reading a project ([`inspect`]) writes nothing.
/// Under the project's lock (it may wait for it), so a record being
/// written (ledger first, then the file) is never seen half done and
/// undone.
pub fn prepare(root: &Path, managed: &ManagedRoot) -> Effective {
    let lock = lock_project(root, managed);
    if let Err(e) = &lock {
        tracing::debug!(root = %root.display(), "reading sandbox.json without the project's lock: {e}");
    }
    let read = read(root);
    let ledger = Ledger::new(managed.clone());
    let approved = ledger.load(root);
    let eff = effective(&read, &approved);
    if eff.ledger != approved {
        if let Err(e) = ledger.save(&eff.ledger) {
            tracing::warn!(root = %root.display(), "could not update the approval ledger: {e}");
        }
    }
    for why in &eff.ignored {
        tracing::warn!(root = %root.display(), "sandbox.json: {why}; approve the file as it is with `zcode-acp approve --workspace DIR`");
    }
    eff
}

/// Reads and applies the ledger without writing anything (no template, no
/// ledger update): for `profile`, `doctor`, and the bridge deciding
/// whether a session's project arms it.
pub fn inspect(root: &Path, managed: &ManagedRoot) -> Effective {
    let read = read_with(root, false);
    effective(&read, &Ledger::new(managed.clone()).load(root))
}

/// Which list an entry goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum List {
    Allow,
    Deny,
}

impl List {
    fn key(self) -> &'static str {
        match self {
            List::Allow => "allow",
            List::Deny => "deny",
        }
    }
}

/// Why a project's sandbox.json (or its approval) could not be written.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("cannot take the project's lock under {dir}: {source}")]
    Lock {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("{0} is a symlink")]
    Symlinked(PathBuf),
    #[error("sandbox.json is a symlink or has other hard links")]
    Untrusted,
    #[error("sandbox.json is malformed ({0}); fix it by hand first")]
    Malformed(String),
    #[error("sandbox.json cannot be approved as it is: it is {0}")]
    NotApprovable(FileState),
    #[error("its `network` table has changes you have not approved; approve the file first (`zcode-acp approve --workspace DIR`, or accept it in the editor)")]
    UnapprovedNetwork,
    #[error("cannot read or write {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

fn io_at(path: &Path) -> impl FnOnce(std::io::Error) -> WriteError + '_ {
    move |source| WriteError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Adds `entry` to a project's allow (or deny) list, on the user's behalf:
/// the whole file round-trips (unknown keys kept), entries are deduped by
/// exact string, the ledger is updated in the same step, the write is
/// atomic and never goes through a symlink, and an advisory lock keeps two
/// bridges on one project from losing each other's entries. It may wait
/// for that lock: callers on the bridge's loop run it off the loop. When
/// it fails the caller keeps the grant for this bridge's lifetime only.
pub fn append(
    root: &Path,
    list: List,
    entry: &str,
    managed: &ManagedRoot,
) -> Result<(), WriteError> {
    let _lock = lock_project(root, managed)?;
    let (path, mut value) = read_for_update(root)?;
    let not_a_list = || WriteError::Malformed(format!("`{}` is not a list", list.key()));
    let obj = value
        .as_object_mut()
        .ok_or_else(|| WriteError::Malformed("not a JSON object".into()))?;
    let items = obj
        .entry(list.key())
        .or_insert_with(|| Value::Array(Vec::new()));
    if items.is_null() {
        *items = Value::Array(Vec::new());
    }
    let items = items.as_array_mut().ok_or_else(not_a_list)?;
    if !items.iter().any(|i| i.as_str() == Some(entry)) {
        items.push(Value::from(entry));
    }
    let mut bytes = serde_json::to_vec_pretty(&value).expect("a JSON value serializes");
    bytes.push(b'\n');

    let ledger = Ledger::new(managed.clone());
    let mut approved = ledger.load(root);
    if list == List::Allow && !approved.allow.iter().any(|a| a == entry) {
        approved.allow.push(entry.to_owned());
    }
    // Ledger first: a crash between the two writes leaves an approved entry
    // the file does not have yet (harmless), never the reverse.
    ledger.save(&approved).map_err(io_at(&managed.path))?;
    write_atomic(&path, &bytes, 0o644).map_err(io_at(&path))
}

/// The file's path and contents, to be changed and written back whole
/// (unknown keys kept); the template where there is no file yet. Under
/// the project's lock.
fn read_for_update(root: &Path) -> Result<(PathBuf, Value), WriteError> {
    if let Some(link) = symlinked_dir(root) {
        return Err(WriteError::Symlinked(link));
    }
    let dir = create_real_dirs(root, &CONFIG_DIR, 0o755).map_err(io_at(root))?;
    let path = dir.join(CONFIG_FILE);
    let value = match plain_file(&path).map_err(io_at(&path))? {
        None => serde_json::from_slice(&template()).expect("static JSON"),
        Some(false) => return Err(WriteError::Untrusted),
        Some(true) => {
            let bytes = read_nofollow(&path).map_err(io_at(&path))?;
            // A file we cannot read correctly is never rewritten.
            parse(&bytes).map_err(WriteError::Malformed)?;
            serde_json::from_slice(&bytes).map_err(|e| WriteError::Malformed(e.to_string()))?
        }
    };
    Ok((path, value))
}

/// Widens `root`'s `network` table by `grant` and approves the result
/// (the network prompt's "always allow").
pub fn widen_network(
    root: &Path,
    grant: &crate::config::network::NetworkTable,
    managed: &ManagedRoot,
) -> Result<(), WriteError> {
    let _lock = lock_project(root, managed)?;
    let (path, mut value) = read_for_update(root)?;
    let current = match value.get("network") {
        None | Some(Value::Null) => None,
        Some(v) => {
            Some(crate::config::network::NetworkTable::parse(v).map_err(WriteError::Malformed)?)
        }
    };
    let ledger = Ledger::new(managed.clone());
    let mut approved = ledger.load(root);
    // Recording approves the whole table: never what the user has not
    // approved beside the one entry they allowed now.
    if current.as_ref().is_some_and(|t| {
        t.opens_anything() && !approved.network.as_ref().is_some_and(|a| t.within(a))
    }) {
        return Err(WriteError::UnapprovedNetwork);
    }
    let table = current.unwrap_or_default().widened(grant);
    table.within_limits().map_err(WriteError::Malformed)?;
    value
        .as_object_mut()
        .ok_or_else(|| WriteError::Malformed("not a JSON object".into()))?
        .insert("network".into(), table.to_json());
    let mut bytes = serde_json::to_vec_pretty(&value).expect("a JSON value serializes");
    bytes.push(b'\n');
    approved.network = Some(table);
    // Ledger first, as for allow entries.
    ledger.save(&approved).map_err(io_at(&managed.path))?;
    write_atomic(&path, &bytes, 0o644).map_err(io_at(&path))
}

fn lock_project(
    root: &Path,
    managed: &ManagedRoot,
) -> Result<nix::fcntl::Flock<std::fs::File>, WriteError> {
    let lock_error = |dir: &Path| {
        let dir = dir.to_path_buf();
        move |source| WriteError::Lock { dir, source }
    };
    let locks = managed.locks_dir().map_err(lock_error(&managed.path))?;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(locks.join(format!("{}.lock", project_key(root))))
        .map_err(lock_error(&locks))?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| lock_error(&locks)(e.into()))
}

/// Approves the file as it is now (the user confirmed a hand edit, or ran
/// `zcode-acp allow` outside the sandbox). May wait for the project's lock.
pub fn approve_current(root: &Path, managed: &ManagedRoot) -> Result<(), WriteError> {
    let _lock = lock_project(root, managed)?;
    let read = read(root);
    if read.state != FileState::Ok && read.state != FileState::Created {
        return Err(WriteError::NotApprovable(read.state));
    }
    let approved = Approved {
        root: root.to_path_buf(),
        enabled: Some(read.config.enabled),
        strict_git: Some(read.config.strict_git),
        allow: read.config.allow.clone(),
        code_exec: Some(read.config.code_exec),
        network: read.config.network.clone(),
    };
    Ledger::new(managed.clone())
        .save(&approved)
        .map_err(io_at(&managed.path))
}

#[cfg(test)]
#[path = "project_tests.rs"]
mod tests;
