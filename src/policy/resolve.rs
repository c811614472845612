//! `resolve_real`: a path's filesystem truth.
//!
//! Seatbelt matches real paths and mount plans bind real paths, so a
//! symlinked prefix (`/tmp` -> `/private/tmp` on macOS, a symlinked
//! workspace) would silently fail to match. Every path that enters a policy,
//! a profile or a decision goes through here: the deepest existing ancestor
//! is canonicalized (following symlinks, dangling ones included, the way a
//! write through them would), and the not-yet-existing remainder is appended.

use std::path::{Component, Path, PathBuf};

/// Symlink hops followed before giving up (the kernel's ELOOP limit).
const MAX_LINKS: usize = 40;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ResolveError {
    #[error("{0} is not an absolute path")]
    NotAbsolute(PathBuf),
    #[error(
        "{0} uses `..` below a part that does not exist yet, so where it lands cannot be known"
    )]
    DotDotInRemainder(PathBuf),
    #[error("{0} has too many levels of symbolic links")]
    TooManyLinks(PathBuf),
    #[error("cannot resolve {path}: {reason}")]
    Io { path: PathBuf, reason: String },
}

/// A path given on the command line, made absolute against the current
/// directory.
pub fn absolutize(path: &Path) -> std::io::Result<PathBuf> {
    if path.is_absolute() {
        Ok(path.to_path_buf())
    } else {
        Ok(std::env::current_dir()?.join(path))
    }
}

/// Resolves `path` to the real path a write to it would touch.
pub fn resolve_real(path: &Path) -> Result<PathBuf, ResolveError> {
    if !path.is_absolute() {
        return Err(ResolveError::NotAbsolute(path.to_path_buf()));
    }
    if let Some(real) = real_of_existing(path) {
        return Ok(real);
    }
    resolve_with_budget(path, &mut 0)
}

/// The real path of `path` when all of it exists, as the kernel resolved it
/// (three calls, where walking it costs one per component): opened without
/// being read, and named by its descriptor. Never through a `/proc` magic
/// link (`/proc/PID/root`, `/proc/PID/fd/N`): those lead into another
/// process's mounts, where a name means another file than here; the long
/// way reads such a link's text and walks it here. `None` sends the caller
/// the long way: something missing (a dangling symlink included), a magic
/// link, no `openat2` or `/proc`, or a name the kernel marks as removed.
#[cfg(target_os = "linux")]
fn real_of_existing(path: &Path) -> Option<PathBuf> {
    use rustix::fs::{Mode, OFlags, ResolveFlags, CWD};
    use std::os::fd::AsRawFd;
    use std::os::unix::ffi::OsStrExt;
    let fd = rustix::fs::openat2(
        CWD,
        path,
        OFlags::PATH | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::NO_MAGICLINKS,
    )
    .ok()?;
    // This thread's own table (a thread that unshared its descriptors
    // would find another file under /proc/self).
    let real = std::fs::read_link(format!("/proc/thread-self/fd/{}", fd.as_raw_fd())).ok()?;
    let bytes = real.as_os_str().as_bytes();
    (bytes.starts_with(b"/") && !bytes.ends_with(b" (deleted)")).then_some(real)
}

#[cfg(not(target_os = "linux"))]
fn real_of_existing(_path: &Path) -> Option<PathBuf> {
    None
}

fn resolve_with_budget(path: &Path, hops: &mut usize) -> Result<PathBuf, ResolveError> {
    // Walk down from `/`, keeping the real path of what exists so far.
    let mut real = PathBuf::from("/");
    let mut components = path.components().peekable();
    while let Some(component) = components.next() {
        match component {
            Component::RootDir | Component::Prefix(_) | Component::CurDir => continue,
            Component::ParentDir => {
                // `real` exists and is canonical here, so its parent is the
                // kernel's `..` too.
                real.pop();
                continue;
            }
            Component::Normal(name) => {
                let candidate = real.join(name);
                match std::fs::symlink_metadata(&candidate) {
                    Ok(meta) if meta.file_type().is_symlink() => {
                        *hops += 1;
                        if *hops > MAX_LINKS {
                            return Err(ResolveError::TooManyLinks(path.to_path_buf()));
                        }
                        let target =
                            std::fs::read_link(&candidate).map_err(|e| io(&candidate, e))?;
                        let mut through = real.join(target);
                        for rest in components.by_ref() {
                            through.push(rest.as_os_str());
                        }
                        return resolve_with_budget(&through, hops);
                    }
                    Ok(_) => real = candidate,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                        // From here on nothing exists: append the rest as
                        // written, refusing `..` whose meaning is unknowable.
                        let mut out = candidate;
                        for rest in components {
                            match rest {
                                Component::Normal(n) => out.push(n),
                                Component::CurDir => {}
                                _ => {
                                    return Err(ResolveError::DotDotInRemainder(path.to_path_buf()))
                                }
                            }
                        }
                        return Ok(out);
                    }
                    Err(e) => return Err(io(&candidate, e)),
                }
            }
        }
    }
    Ok(real)
}

fn io(path: &Path, e: std::io::Error) -> ResolveError {
    ResolveError::Io {
        path: path.to_path_buf(),
        reason: e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn real_tmp() -> (tempfile::TempDir, PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let real = std::fs::canonicalize(d.path()).unwrap();
        (d, real)
    }

    #[test]
    fn existing_paths_are_canonical() {
        let (_d, t) = real_tmp();
        std::fs::create_dir_all(t.join("a/b")).unwrap();
        assert_eq!(resolve_real(&t.join("a/./b/../b")).unwrap(), t.join("a/b"));
    }

    #[test]
    fn the_missing_remainder_is_appended() {
        let (_d, t) = real_tmp();
        std::fs::create_dir_all(t.join("a")).unwrap();
        assert_eq!(
            resolve_real(&t.join("a/new/file.txt")).unwrap(),
            t.join("a/new/file.txt")
        );
        assert!(matches!(
            resolve_real(&t.join("a/new/../x")),
            Err(ResolveError::DotDotInRemainder(_))
        ));
    }

    #[test]
    fn symlinked_prefixes_resolve_to_their_target() {
        let (_d, t) = real_tmp();
        std::fs::create_dir_all(t.join("real/ws")).unwrap();
        symlink(t.join("real"), t.join("link")).unwrap();
        symlink("real/ws", t.join("rel")).unwrap();
        assert_eq!(
            resolve_real(&t.join("link/ws/f")).unwrap(),
            t.join("real/ws/f")
        );
        assert_eq!(
            resolve_real(&t.join("rel/sub/f")).unwrap(),
            t.join("real/ws/sub/f")
        );
    }

    #[test]
    fn dangling_symlinks_resolve_to_where_a_write_would_land() {
        let (_d, t) = real_tmp();
        std::fs::create_dir_all(t.join("ws")).unwrap();
        symlink(t.join("outside/secret"), t.join("ws/innocent")).unwrap();
        assert_eq!(
            resolve_real(&t.join("ws/innocent")).unwrap(),
            t.join("outside/secret")
        );
    }

    /// A path through another process's root (`/proc/PID/root`) is walked
    /// here, through this namespace's symlinks: where a write by a process
    /// of this namespace would land, never a name that means another file
    /// in that process's mounts.
    #[test]
    #[cfg(target_os = "linux")]
    fn a_path_through_another_processs_root_is_walked_here() {
        use nix::sched::{unshare, CloneFlags};
        let (_d, t) = real_tmp();
        // Here: `a` leads elsewhere.
        std::fs::create_dir_all(t.join("elsewhere")).unwrap();
        symlink(t.join("elsewhere"), t.join("a")).unwrap();
        let (ready_r, ready_w) = nix::unistd::pipe().unwrap();
        let (done_r, done_w) = nix::unistd::pipe().unwrap();
        // Made before forking: the child only makes system calls.
        let (uid, gid) = (nix::unistd::getuid(), nix::unistd::getgid());
        let (uid_map, gid_map) = (format!("{uid} {uid} 1"), format!("{gid} {gid} 1"));
        let (a, f) = (t.join("a"), t.join("a/f"));
        // SAFETY: the child makes only system calls and exits.
        let child = match unsafe { nix::unistd::fork() }.unwrap() {
            nix::unistd::ForkResult::Child => {
                // There: a tmpfs over the same place, where `a` is a
                // directory of its own.
                let ok = unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNS).is_ok()
                    && std::fs::write("/proc/self/setgroups", "deny").is_ok()
                    && std::fs::write("/proc/self/uid_map", &uid_map).is_ok()
                    && std::fs::write("/proc/self/gid_map", &gid_map).is_ok()
                    && nix::mount::mount(
                        None::<&str>,
                        "/",
                        None::<&str>,
                        nix::mount::MsFlags::MS_REC | nix::mount::MsFlags::MS_PRIVATE,
                        None::<&str>,
                    )
                    .is_ok()
                    && nix::mount::mount(
                        Some("tmpfs"),
                        &t,
                        Some("tmpfs"),
                        nix::mount::MsFlags::empty(),
                        None::<&str>,
                    )
                    .is_ok()
                    && std::fs::create_dir(&a).is_ok()
                    && std::fs::write(&f, "").is_ok();
                let _ = nix::unistd::write(&ready_w, &[u8::from(ok)]);
                let mut b = [0u8; 1];
                let _ = nix::unistd::read(&done_r, &mut b);
                // SAFETY: ends the forked child without running the
                // parent's destructors.
                unsafe { libc::_exit(0) };
            }
            nix::unistd::ForkResult::Parent { child } => child,
        };
        drop(ready_w);
        let mut ok = [0u8; 1];
        let _ = nix::unistd::read(&ready_r, &mut ok);
        let through =
            PathBuf::from(format!("/proc/{child}/root")).join(t.strip_prefix("/").unwrap());
        let resolved = (ok[0] == 1).then(|| resolve_real(&through.join("a/f")));
        let _ = nix::unistd::write(&done_w, &[1]);
        let _ = nix::sys::wait::waitpid(child, None);
        let Some(resolved) = resolved else {
            println!("skipped: no user and mount namespace for the test here");
            return;
        };
        assert_eq!(resolved.unwrap(), t.join("elsewhere/f"));
    }

    #[test]
    fn loops_and_relative_paths_are_refused() {
        let (_d, t) = real_tmp();
        symlink(t.join("b"), t.join("a")).unwrap();
        symlink(t.join("a"), t.join("b")).unwrap();
        assert!(matches!(
            resolve_real(&t.join("a/x")),
            Err(ResolveError::TooManyLinks(_))
        ));
        assert!(matches!(
            resolve_real(Path::new("rel/x")),
            Err(ResolveError::NotAbsolute(_))
        ));
    }
}
