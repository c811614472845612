//! The per-call directory: the source, the input files and their manifest
//! going in, the output files coming back (bounded), and its removal
//! afterwards, whatever the code did to it.
//!
//! Layout (mode 0700, in the temp directory):
//! `main.<ext>` the source; `in/` the input files; `out/` the output
//! directory; `manifest.json` what is where.

use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::Mode;

use serde::Serialize;

use super::request::RunRequest;

/// Environment variables the code gets.
pub const ENV_DIR: &str = "ZCODE_RUN_DIR";
pub const ENV_MANIFEST: &str = "ZCODE_RUN_MANIFEST";
pub const ENV_INPUTS: &str = "ZCODE_RUN_INPUTS";
pub const ENV_OUTPUTS: &str = "ZCODE_RUN_OUTPUTS";
pub const ENV_WORKSPACE: &str = "ZCODE_RUN_WORKSPACE";

/// Every call directory's name starts so, then the server's pid.
const PREFIX: &str = "zcode-run-";

/// Removes the call directories of servers that are gone (one SIGKILLed
/// mid-run could not remove its own). Directories of live servers, and
/// anything not ours, are left alone.
pub fn sweep_stale(base: &Path) {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    let me = nix::unistd::geteuid().as_raw();
    for e in entries.flatten() {
        let Some(pid) = owner_pid(&e.file_name(), PREFIX) else {
            continue;
        };
        let alive = !process_gone(pid);
        let ours = std::fs::symlink_metadata(e.path()).is_ok_and(|m| m.is_dir() && m.uid() == me);
        if alive || !ours {
            continue;
        }
        let path = e.path();
        match open_dir(&path) {
            Ok(fd) => {
                if std::fs::remove_dir_all(&path).is_err() {
                    restore_rights(&fd);
                    let _ = std::fs::remove_dir_all(&path);
                }
                tracing::debug!(dir = %path.display(), "removed the run directory of a server that is gone");
            }
            Err(_) => continue,
        }
    }
}

/// The pid in a directory name `<prefix><pid>-<anything>`: the process
/// that made it (a run's server, a bridge).
pub fn owner_pid(name: &OsStr, prefix: &str) -> Option<i32> {
    name.to_str()?
        .strip_prefix(prefix)?
        .split('-')
        .next()?
        .parse()
        .ok()
}

/// Whether no process has `pid` (its directories are no one's).
pub fn process_gone(pid: i32) -> bool {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None) == Err(nix::errno::Errno::ESRCH)
}

/// One call's directory; removed when dropped.
pub struct CallDir {
    pub path: PathBuf,
    /// The directory itself, opened when it was made: outputs are read
    /// beneath it, never through a path the code (or, inside a shared temp
    /// directory, anyone) could have swapped for a symlink since.
    fd: OwnedFd,
    pub source: PathBuf,
    pub inputs: PathBuf,
    pub outputs: PathBuf,
    pub manifest: PathBuf,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Manifest<'a> {
    language: &'a str,
    source: &'a Path,
    workspace: &'a Path,
    input_dir: &'a Path,
    output_dir: &'a Path,
    inputs: Vec<ManifestInput>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ManifestInput {
    path: PathBuf,
    absolute_path: PathBuf,
    bytes: usize,
}

impl CallDir {
    /// Creates the directory under `base` and writes the source, the
    /// input files and the manifest.
    pub fn create(base: &Path, request: &RunRequest, workspace: &Path) -> std::io::Result<CallDir> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("{PREFIX}{}-", std::process::id()))
            .permissions(std::fs::Permissions::from_mode(0o700))
            .tempdir_in(base)?
            .keep();
        let fd = match open_dir(&dir) {
            Ok(fd) => fd,
            Err(e) => {
                let _ = std::fs::remove_dir(&dir);
                return Err(e);
            }
        };
        // From here on the directory is ours to remove, also on error.
        let call = CallDir {
            fd,
            source: dir.join(request.language.source_file(&request.source)),
            inputs: dir.join("in"),
            outputs: dir.join("out"),
            manifest: dir.join("manifest.json"),
            path: dir,
        };
        call.fill(request, workspace)?;
        Ok(call)
    }

    fn fill(&self, request: &RunRequest, workspace: &Path) -> std::io::Result<()> {
        std::fs::create_dir(&self.inputs)?;
        std::fs::create_dir(&self.outputs)?;
        write_new(&self.source, request.source.as_bytes())?;
        let mut inputs = Vec::with_capacity(request.files.len());
        for f in &request.files {
            let target = self.inputs.join(&f.path);
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent)?;
            }
            write_new(&target, f.content.as_bytes())?;
            inputs.push(ManifestInput {
                path: f.path.clone(),
                absolute_path: target,
                bytes: f.content.len(),
            });
        }
        let manifest = Manifest {
            language: request.language.name(),
            source: &self.source,
            workspace,
            input_dir: &self.inputs,
            output_dir: &self.outputs,
            inputs,
        };
        let text = serde_json::to_vec_pretty(&manifest).map_err(std::io::Error::other)?;
        write_new(&self.manifest, &text)
    }

    /// The variables that tell the code where things are.
    pub fn env(&self, workspace: &Path) -> Vec<(String, String)> {
        let s = |p: &Path| p.to_string_lossy().into_owned();
        vec![
            (ENV_DIR.into(), s(&self.path)),
            (ENV_MANIFEST.into(), s(&self.manifest)),
            (ENV_INPUTS.into(), s(&self.inputs)),
            (ENV_OUTPUTS.into(), s(&self.outputs)),
            (ENV_WORKSPACE.into(), s(workspace)),
        ]
    }
}

impl Drop for CallDir {
    fn drop(&mut self) {
        // A path swapped for a symlink is removed as a link, never followed.
        let result = match std::fs::remove_dir_all(&self.path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                // The code may have taken rights away: give them back,
                // through descriptors, then try again.
                restore_rights(&self.fd);
                std::fs::remove_dir_all(&self.path)
            }
            other => other,
        };
        match result {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                tracing::warn!(dir = %self.path.display(), "cannot remove a run's directory: {e}")
            }
            _ => {}
        }
    }
}

/// Opens `dir` as a directory, refusing a symlink.
fn open_dir(dir: &Path) -> std::io::Result<OwnedFd> {
    nix::fcntl::open(
        dir,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(std::io::Error::from)
}

/// Opens `name` beneath `parent` as a directory, refusing a symlink.
fn open_dir_at(parent: &OwnedFd, name: &OsStr) -> std::io::Result<OwnedFd> {
    nix::fcntl::openat(
        parent,
        name,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(std::io::Error::from)
}

/// At most `limit` names in `dir` (without `.` and `..`) with what each
/// is, not following symlinks.
fn entries(dir: &OwnedFd, limit: usize) -> std::io::Result<Vec<(OsString, libc::mode_t)>> {
    let mut listing = nix::dir::Dir::from_fd(dir.try_clone()?)?;
    let mut out = Vec::new();
    for entry in listing.iter() {
        if out.len() >= limit {
            break;
        }
        let entry = entry?;
        let name = OsStr::from_bytes(entry.file_name().to_bytes());
        if name == "." || name == ".." {
            continue;
        }
        let Ok(st) = nix::sys::stat::fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) else {
            continue;
        };
        out.push((name.to_os_string(), st.st_mode & libc::S_IFMT));
    }
    out.sort();
    Ok(out)
}

/// Gives the owner full rights on `dir` and every directory beneath it,
/// through descriptors opened without following symlinks.
fn restore_rights(top: &OwnedFd) {
    use std::rc::Rc;
    let _ = nix::sys::stat::fchmod(top, Mode::from_bits_truncate(0o700));
    // A stack, not recursion (the code chooses the depth), of directories
    // still to open, each beside its parent's descriptor: a directory is
    // opened only when its turn comes, so a wide tree holds few of them.
    let mut pending: Vec<(Rc<OwnedFd>, OsString)> = Vec::new();
    let push_children = |dir: Rc<OwnedFd>, pending: &mut Vec<(Rc<OwnedFd>, OsString)>| {
        for (name, kind) in entries(&dir, usize::MAX).unwrap_or_default() {
            if kind == libc::S_IFDIR {
                pending.push((dir.clone(), name));
            }
        }
    };
    match top.try_clone() {
        Ok(fd) => push_children(Rc::new(fd), &mut pending),
        Err(_) => return,
    }
    while let Some((parent, name)) = pending.pop() {
        let Ok(dir) = open_dir_at(&parent, &name).or_else(|_| {
            // Unreadable and unsearchable: its rights first, through the parent.
            let _ = nix::sys::stat::fchmodat(
                &*parent,
                name.as_os_str(),
                Mode::from_bits_truncate(0o700),
                nix::sys::stat::FchmodatFlags::NoFollowSymlink,
            );
            open_dir_at(&parent, &name)
        }) else {
            continue;
        };
        let _ = nix::sys::stat::fchmod(&dir, Mode::from_bits_truncate(0o700));
        push_children(Rc::new(dir), &mut pending);
    }
}

/// Creates `path` (never through a symlink, never over a file) with `bytes`.
fn write_new(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    f.write_all(bytes)
}

/// One file the code left in its output directory.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Output {
    /// Relative to the output directory.
    pub path: String,
    pub bytes: u64,
    pub mime_type: String,
    /// Returned in the result; otherwise `skipped` says why not.
    pub returned: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
    /// The content, for a returned text file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// The content, for a returned binary file (sent as MCP resource
    /// content; never in the structured result).
    #[serde(skip)]
    pub data: Option<Vec<u8>>,
}

/// The most entries of the output directory that are listed.
pub const MAX_OUTPUT_ENTRIES: usize = 1000;

/// Reads what the code left in its output directory: regular files, in
/// name order, each up to `file_cap` bytes and all up to `total_cap`;
/// anything else is listed with the reason it was not returned. Read
/// beneath the call directory's descriptor, never following a symlink.
pub fn collect_outputs(call: &CallDir, file_cap: u64, total_cap: u64) -> Vec<Output> {
    let mut found = Vec::new();
    match open_dir_at(&call.fd, OsStr::new("out")) {
        Ok(out) => walk(&out, "", &mut found, 0),
        Err(e) => found.push(Found {
            rel: "(the output directory)".into(),
            kind: EntryKind::Other(format!("was replaced or removed by the run ({e})")),
            dir: None,
            name: OsString::new(),
        }),
    }
    found.sort_by(|a, b| a.rel.cmp(&b.rel));
    let mut total = 0u64;
    let mut out = Vec::with_capacity(found.len());
    for f in found
        .into_iter()
        .filter(|f| !matches!(f.kind, EntryKind::Dir))
    {
        let mut entry = Output {
            mime_type: mime_for(&f.rel).to_owned(),
            path: f.rel,
            bytes: 0,
            returned: false,
            skipped: None,
            text: None,
            data: None,
        };
        match f.kind {
            EntryKind::File(bytes) => {
                entry.bytes = bytes;
                if bytes > file_cap {
                    entry.skipped = Some(format!(
                        "larger than the {file_cap} bytes returned per file"
                    ));
                } else if total + bytes > total_cap {
                    entry.skipped = Some(format!(
                        "the {total_cap} bytes returned for all output files were used up"
                    ));
                } else {
                    let read = f
                        .dir
                        .as_ref()
                        .ok_or_else(|| std::io::Error::other("no directory"))
                        .and_then(|d| read_at(d, &f.name, file_cap));
                    match read {
                        Ok(content) => {
                            total += content.len() as u64;
                            entry.bytes = content.len() as u64;
                            entry.returned = true;
                            match String::from_utf8(content) {
                                Ok(text) if !text.contains('\0') => entry.text = Some(text),
                                Ok(text) => entry.data = Some(text.into_bytes()),
                                Err(e) => entry.data = Some(e.into_bytes()),
                            }
                            if entry.data.is_some() && entry.mime_type.starts_with("text/") {
                                entry.mime_type = "application/octet-stream".into();
                            }
                        }
                        Err(e) => entry.skipped = Some(format!("cannot be read: {e}")),
                    }
                }
            }
            EntryKind::Other(why) => entry.skipped = Some(why),
            EntryKind::Dir => continue,
        }
        out.push(entry);
    }
    out
}

struct Found {
    rel: String,
    kind: EntryKind,
    /// The directory holding it, and its name there.
    dir: Option<std::rc::Rc<OwnedFd>>,
    name: OsString,
}

enum EntryKind {
    File(u64),
    /// Listed only to bound the walk; not in the result.
    Dir,
    Other(String),
}

fn walk(dir: &OwnedFd, prefix: &str, found: &mut Vec<Found>, depth: usize) {
    // One more than fits: enough to say that there were more.
    let room = (MAX_OUTPUT_ENTRIES + 1).saturating_sub(found.len());
    let listing = match entries(dir, room) {
        Ok(l) => l,
        Err(e) => {
            found.push(Found {
                rel: format!("{prefix}(a directory)"),
                kind: EntryKind::Other(format!("cannot be listed: {e}")),
                dir: None,
                name: OsString::new(),
            });
            return;
        }
    };
    let shared = dir.try_clone().ok().map(std::rc::Rc::new);
    for (name, kind) in listing {
        if found.len() >= MAX_OUTPUT_ENTRIES {
            found.push(Found {
                rel: format!("{prefix}..."),
                kind: EntryKind::Other(format!(
                    "more entries than the {MAX_OUTPUT_ENTRIES} listed; the rest are not read"
                )),
                dir: None,
                name: OsString::new(),
            });
            return;
        }
        let rel = format!("{prefix}{}", name.to_string_lossy());
        match kind {
            libc::S_IFDIR if depth >= 16 => found.push(Found {
                rel,
                kind: EntryKind::Other("nested too deep".into()),
                dir: None,
                name,
            }),
            libc::S_IFDIR => match open_dir_at(dir, &name) {
                Ok(sub) => {
                    // A directory counts toward the listing's bound too.
                    found.push(Found {
                        rel: format!("{rel}/"),
                        kind: EntryKind::Dir,
                        dir: None,
                        name: OsString::new(),
                    });
                    walk(&sub, &format!("{rel}/"), found, depth + 1)
                }
                Err(e) => found.push(Found {
                    rel,
                    kind: EntryKind::Other(format!("a directory that cannot be read: {e}")),
                    dir: None,
                    name,
                }),
            },
            libc::S_IFREG => {
                let size =
                    nix::sys::stat::fstatat(dir, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
                        .map(|st| st.st_size.max(0) as u64)
                        .unwrap_or(0);
                found.push(Found {
                    rel,
                    kind: EntryKind::File(size),
                    dir: shared.clone(),
                    name,
                })
            }
            libc::S_IFLNK => found.push(Found {
                rel,
                kind: EntryKind::Other("a symbolic link, not a regular file".into()),
                dir: None,
                name,
            }),
            _ => found.push(Found {
                rel,
                kind: EntryKind::Other("a special file, not a regular file".into()),
                dir: None,
                name,
            }),
        }
    }
}

/// At most `cap` bytes of `name` beneath `dir`, never through a symlink
/// and never from anything but a regular file (a FIFO would block).
fn read_at(dir: &OwnedFd, name: &OsStr, cap: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let fd = nix::fcntl::openat(
        dir,
        name,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let f = std::fs::File::from(fd);
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let mut out = Vec::new();
    f.take(cap).read_to_end(&mut out)?;
    Ok(out)
}

/// A MIME type from the file name.
pub fn mime_for(name: &str) -> &'static str {
    let ext = name
        .rsplit_once('.')
        .map(|(_, e)| e.to_ascii_lowercase())
        .unwrap_or_default();
    match ext.as_str() {
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "svg" => "image/svg+xml",
        "pdf" => "application/pdf",
        "json" => "application/json",
        "csv" => "text/csv",
        "html" | "htm" => "text/html",
        "md" => "text/markdown",
        "zip" => "application/zip",
        "gz" => "application/gzip",
        "txt" | "log" | "py" | "js" | "ts" | "sh" | "rs" | "toml" | "yaml" | "yml" | "xml" => {
            "text/plain"
        }
        _ => "text/plain",
    }
}
