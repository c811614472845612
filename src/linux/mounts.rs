//! Steps 3 and 4 of the launch (see `exec`): the mount namespace checked
//! new, then the plan's mount operations carried out one by one, in the
//! order the pure planner gives.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use nix::mount::{mount, MsFlags};
use nix::sched::{unshare, CloneFlags};

use super::error::{sys, sys_at, LaunchError, Syscall};
use super::idmap::{own_id_map, Mapper};
use super::level::NAMESPACES;
use super::plan::{MountOp, Plan};
use super::spec::LaunchSpec;
use super::stages::degraded;
use super::sys;

/// A file with other hard links inside an island could be changed through
/// one of them: refuse to arm, and say which file.
pub(super) fn check_island_links(plan: &Plan) -> Result<(), LaunchError> {
    use std::os::unix::fs::MetadataExt;
    for step in plan
        .readonly
        .iter()
        .filter(|s| s.path.ends_with(".zcode/acp"))
    {
        let mut stack = vec![step.path.clone()];
        while let Some(dir) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in entries.flatten() {
                let Ok(meta) = e.path().symlink_metadata() else {
                    continue;
                };
                if meta.is_dir() {
                    stack.push(e.path());
                } else if meta.is_file() && meta.nlink() > 1 {
                    return Err(LaunchError::Refused(format!(
                        "{} has {} hard links: another link could change it from outside the sandbox; remove the extra links and try again",
                        e.path().display(),
                        meta.nlink()
                    )));
                }
            }
        }
    }
    Ok(())
}

/// Mountpoints that are read-only in the current mount table.
pub(super) fn readonly_mounts() -> BTreeSet<PathBuf> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    table
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let (point, opts) = (f.get(4)?, f.get(5)?);
            opts.split(',')
                .any(|o| o == "ro")
                .then(|| PathBuf::from(unescape(point)))
        })
        .collect()
}

/// mountinfo escapes space, tab, newline and backslash as octal.
pub(super) fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub(super) fn bind(path: &Path) -> Result<(), LaunchError> {
    sys_at(
        Syscall::Bind,
        path,
        mount(
            Some(path),
            path,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None::<&str>,
        ),
    )
}

pub(super) fn setattr(
    path: &Path,
    recursive: bool,
    set: u64,
    clear: u64,
) -> Result<(), LaunchError> {
    sys_at(
        Syscall::SetAttr,
        path,
        sys::mount_setattr(path, recursive, set, clear),
    )
}

/// Paths the command needs to see that a private tmpfs would hide: its own
/// executable, files named on its command line, and its working directory,
/// when they live in the host's /tmp. They are carried over read-only. A
/// file inside a `node_modules` tree brings the whole tree (the outermost
/// `node_modules`): an npm agent's script imports its packages from there,
/// and its launcher runs a native binary from a sibling package.
pub(super) fn needed_visible(spec: &LaunchSpec) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let exe = &spec.argv[0];
    let exe_path = if exe.contains('/') {
        spec.cwd
            .as_ref()
            .map(|c| c.join(exe))
            .unwrap_or_else(|| PathBuf::from(exe))
    } else {
        let path = std::env::var_os("PATH").unwrap_or_default();
        match std::env::split_paths(&path)
            .map(|d| d.join(exe))
            .find(|p| p.is_file())
        {
            Some(p) => p,
            None => return out,
        }
    };
    out.push(exe_path);
    out.extend(spec.cwd.clone());
    // Scripts and files named on the command line (`python3 /tmp/x/agent.py`).
    out.extend(
        spec.argv[1..]
            .iter()
            .map(PathBuf::from)
            .filter(|p| p.is_absolute() && p.is_file()),
    );
    let out = out
        .into_iter()
        .filter_map(|p| std::fs::canonicalize(p).ok())
        .map(|p| outermost_node_modules(&p).unwrap_or(p))
        .filter(|p| {
            spec.plan
                .tmpfs
                .iter()
                .any(|t| p.starts_with(&t.path) && *p != t.path)
                && !spec.plan.writable.iter().any(|w| p.starts_with(&w.path))
        })
        .collect::<Vec<_>>();
    // A file inside a directory that is carried anyway needs nothing more.
    let mut kept: Vec<PathBuf> = Vec::new();
    let mut by_depth = out;
    by_depth.sort_by_key(|p| p.components().count());
    for p in by_depth {
        if !kept.iter().any(|k| p.starts_with(k)) {
            kept.push(p);
        }
    }
    kept
}

/// The outermost `node_modules` directory `p` lies in, if any.
pub(super) fn outermost_node_modules(p: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in p.components() {
        out.push(c);
        if c.as_os_str() == "node_modules" {
            return Some(out);
        }
    }
    None
}

/// Steps 2-4: namespaces, then the plan's mount operations in the order
/// the planner gave them. Runs in the helper process. Whether the
/// namespaces include a network of the sandbox's own: always when
/// `own_network`, unless `may_lower` (no level was announced) and the
/// machine refuses only that one.
pub(super) fn arm_mounts(
    plan: &Plan,
    visible: &[PathBuf],
    layer: Option<&super::layers::Slot>,
    own_network: bool,
    may_lower: bool,
) -> Result<bool, LaunchError> {
    let uid = nix::unistd::getuid();
    let gid = nix::unistd::getgid();
    let host_readonly = readonly_mounts();
    let host_ns = sys(Syscall::ReadNamespace, sys::ns_inode("/proc/self/ns/mnt"))?;

    let is_root = uid.is_root();
    // Root's full-range map must be written by a process that keeps its
    // privilege in the parent namespace: a helper of ours, forked now.
    let mapper = if is_root { Some(Mapper::fork()?) } else { None };
    // The test knob stands for a machine that refuses only the network
    // namespace, found by the launcher: it only ever takes away.
    let refuse_network = std::env::var_os("ZCODE_ACP_TEST_HELPER_NO_NETWORK_NAMESPACE").is_some();
    let networked = match own_network.then(|| {
        if refuse_network {
            Err(nix::errno::Errno::EPERM)
        } else {
            unshare(NAMESPACES | CloneFlags::CLONE_NEWNET)
        }
    }) {
        Some(Ok(())) => true,
        // Not probed (`run`): the namespaces without a network of their
        // own, as the probe would have decided (and said) on a machine
        // that refuses only that; one that refuses them all is said by
        // the caller (`Syscall::Unshare`).
        Some(Err(e)) if may_lower && refused_by_the_machine(e) => {
            sys(Syscall::Unshare, unshare(NAMESPACES))?;
            tracing::warn!("this machine refuses the sandbox a network namespace of its own, or a limit on them is reached ({e}): the network is NOT confined, and what the command sends is not counted");
            false
        }
        // Probed when the sandbox was announced: failing now (too many
        // network namespaces) refuses, never arms less than announced.
        Some(Err(e)) => {
            return Err(LaunchError::Refused(format!(
                "cannot create the sandbox's namespaces, its network namespace included ({e}); `zcode-acp doctor` says what this machine allows"
            )))
        }
        None => {
            sys(Syscall::Unshare, unshare(NAMESPACES))?;
            false
        }
    };
    match mapper {
        Some(m) => m.map_parent()?,
        None => {
            // Unprivileged: only its own ids, and setgroups denied first
            // (the kernel requires it before a gid map).
            std::fs::write("/proc/self/setgroups", "deny")
                .and_then(|_| std::fs::write("/proc/self/uid_map", own_id_map(uid.as_raw())))
                .and_then(|_| std::fs::write("/proc/self/gid_map", own_id_map(gid.as_raw())))
                .map_err(|e| LaunchError::Refused(format!("cannot map the user namespace: {e}")))?;
        }
    }
    let ns = sys(Syscall::ReadNamespace, sys::ns_inode("/proc/self/ns/mnt"))?;
    if ns == host_ns {
        // Never mount in the namespace we started in.
        return Err(LaunchError::Refused(
            "the mount namespace did not change after unshare; refusing to mount anything".into(),
        ));
    }
    let at = MountContext {
        plan,
        host_readonly,
        visible,
        layer,
    };
    for op in plan.mount_ops() {
        apply(op, &at)?;
    }
    Ok(networked)
}

/// An `unshare` refused for what the machine allows (a policy, a limit),
/// not for a fault of the call: a lower level may still be armed.
pub(super) fn refused_by_the_machine(errno: nix::errno::Errno) -> bool {
    use nix::errno::Errno;
    matches!(
        errno,
        Errno::EPERM | Errno::EINVAL | Errno::ENOSPC | Errno::EUSERS | Errno::EACCES
    )
}

/// What carrying out a mount operation needs beyond the operation.
pub(super) struct MountContext<'a> {
    plan: &'a Plan,
    /// Mountpoints read-only on the host: they stay so inside writable
    /// binds (as root, clearing those would give the agent more than the
    /// user has).
    host_readonly: BTreeSet<PathBuf>,
    /// What the command must see beneath a private tmpfs.
    visible: &'a [PathBuf],
    /// The copy-on-write slot this launch holds, if it took one.
    layer: Option<&'a super::layers::Slot>,
}

/// Carries out one mount operation. Every mount the launch makes before
/// the namespace's init (which mounts its own /proc) goes through here.
pub(super) fn apply(op: MountOp<'_>, at: &MountContext<'_>) -> Result<(), LaunchError> {
    let root = Path::new("/");
    match op {
        MountOp::PrivateRoot => sys(
            Syscall::MakePrivate,
            mount(
                None::<&str>,
                root,
                None::<&str>,
                MsFlags::MS_REC | MsFlags::MS_PRIVATE,
                None::<&str>,
            ),
        ),
        MountOp::ReadOnlyRoot => setattr(root, true, sys::MOUNT_ATTR_RDONLY, 0),
        MountOp::Writable(path) => {
            bind(path)?;
            // Writable, and nosuid: nothing there runs with its owner's
            // rights inside the sandbox (the seccomp filter keeps setuid
            // bits off disk).
            setattr(path, true, sys::MOUNT_ATTR_NOSUID, sys::MOUNT_ATTR_RDONLY)?;
            for ro in at.host_readonly.iter().filter(|m| m.starts_with(path)) {
                setattr(ro, false, sys::MOUNT_ATTR_RDONLY, 0)?;
            }
            Ok(())
        }
        // The slot is bound writable first (overlayfs keeps a private clone
        // of the upper mount, so the read-only bind of the managed root
        // later leaves it as it is).
        MountOp::LayerSlot => match at.layer {
            Some(slot) => {
                bind(&slot.dir)?;
                setattr(
                    &slot.dir,
                    true,
                    sys::MOUNT_ATTR_NOSUID,
                    sys::MOUNT_ATTR_RDONLY,
                )
            }
            None => Ok(()),
        },
        MountOp::Layer(path) => match at.layer {
            Some(slot) => overlay(path, slot),
            None => Ok(()),
        },
        MountOp::PrivateTmp(path) => private_tmp(path, at),
        MountOp::Pin(path) => bind(path),
        MountOp::PinLink(path) => {
            let link = sys_at(Syscall::OpenTree, path, sys::open_tree_link(path))?;
            sys_at(Syscall::MoveMount, path, sys::move_mount_to(&link, path))
        }
        MountOp::ReadOnly(path) => {
            bind(path)?;
            setattr(path, true, sys::MOUNT_ATTR_RDONLY, 0)
        }
        MountOp::Reopen(path) => {
            bind(path)?;
            setattr(path, true, 0, sys::MOUNT_ATTR_RDONLY)
        }
        MountOp::Hide(path) => hide(path, at.plan),
    }
}

/// A shared cache, copy-on-write: the user's cache (read-only by now) is
/// the lower layer, the slot this launch holds the upper; `userxattr`
/// because this is a user namespace. Where overlayfs cannot be mounted
/// (a filesystem without user xattrs, an old kernel, a path overlayfs's
/// options cannot name: `,` `:` `\\`), the cache is the slot's own
/// directory instead: private, without yours, so builds fetch again, and
/// nothing the agent writes there reaches yours. Said as a degradation.
/// A cache that holds nothing, whose layer was never overlaid, gets the
/// slot's directory too, without a word: that is what its overlay would
/// show.
pub(super) fn overlay(path: &Path, slot: &super::layers::Slot) -> Result<(), LaunchError> {
    let (upper, work) = slot.layer_for(path);
    // Over a cache that holds nothing, an overlay shows exactly its upper
    // layer, as long as that layer was never overlaid (overlayfs leaves
    // `work/work` behind): only then does it hold none of overlayfs's
    // whiteouts, which only an overlay hides. The slot's directory bound
    // there then shows the same, for a bind's cost rather than an
    // overlay's (about 0.4 ms each: the kernel checks and remakes its work
    // directory on every mount). What is written lands in the same
    // directory either way, so a later launch, over a cache that has
    // filled meanwhile, overlays it as ever. Through the bind, the
    // sandbox can also set overlayfs's own `user.overlay.*`
    // attributes there, which that later overlay reads: with `userxattr`
    // redirects are not followed and metacopy is off, so they change only
    // what this project's sandboxes see of the cache, as any file it
    // writes there does.
    let never_overlaid = !work.join("work").exists();
    if holds_nothing(path) && never_overlaid {
        return stand_in(path, &upper);
    }
    let nameable = [path, upper.as_path(), work.as_path()].iter().all(|p| {
        p.to_str()
            .is_some_and(|s| !s.contains([',', ':', '\\', '\n']))
    });
    if slot.volatile {
        super::layers::clear_volatile_mark(&work);
    }
    let mounted = if nameable {
        let options = format!(
            "lowerdir={},upperdir={},workdir={},userxattr{}",
            path.display(),
            upper.display(),
            work.display(),
            if slot.volatile { ",volatile" } else { "" }
        );
        mount(
            Some("overlay"),
            path,
            Some("overlay"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some(options.as_str()),
        )
        .map_err(|e| e.to_string())
    } else {
        Err("its path holds a character overlayfs's options cannot name".to_owned())
    };
    if let Err(e) = mounted {
        degraded(&format!(
                "the cache {} has no copy-on-write layer ({e}): the agent gets a private one of its own instead, without yours (builds fetch again; nothing it writes there reaches your own)",
                path.display()
            ));
        stand_in(path, &upper)?;
    }
    Ok(())
}

/// Whether the directory `path` has no entry (one that cannot be read is
/// taken to hold something: it gets its overlay).
fn holds_nothing(path: &Path) -> bool {
    std::fs::read_dir(path).is_ok_and(|mut entries| entries.next().is_none())
}

/// The slot's own directory `private`, bound writable over the cache
/// `path` (`nosuid` and `nodev`, as the overlay is): it stands for the
/// cache.
fn stand_in(path: &Path, private: &Path) -> Result<(), LaunchError> {
    let opened = sys::open_tree_clone(private).map_err(|errno| LaunchError::Sys {
        step: Syscall::OpenTree,
        path: Some(private.to_path_buf()),
        errno,
    })?;
    sys::move_mount_to(&opened, path).map_err(|errno| LaunchError::Sys {
        step: Syscall::MoveMount,
        path: Some(path.to_path_buf()),
        errno,
    })?;
    setattr(
        path,
        true,
        sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV,
        sys::MOUNT_ATTR_RDONLY,
    )
}

/// A fresh tmpfs over `path`, with the writable trees beneath it carried
/// over as they are, and what the command must see there, read-only.
pub(super) fn private_tmp(path: &Path, at: &MountContext<'_>) -> Result<(), LaunchError> {
    let mut carried = Vec::new();
    for w in at
        .plan
        .writable
        .iter()
        .filter(|w| w.path.starts_with(path) && w.path != path)
    {
        let tree = sys_at(Syscall::OpenTree, &w.path, sys::open_tree_clone(&w.path))?;
        carried.push((w.path.clone(), tree));
    }
    let mut shown = Vec::new();
    for v in at.visible.iter().filter(|v| v.starts_with(path)) {
        let tree = sys_at(Syscall::OpenTree, v, sys::open_tree_clone(v))?;
        shown.push((v.clone(), v.is_dir(), tree));
    }
    sys_at(
        Syscall::Tmpfs,
        path,
        mount(
            Some("tmpfs"),
            path,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some("mode=1777"),
        ),
    )?;
    for (tree_path, tree) in carried {
        std::fs::create_dir_all(&tree_path).map_err(|e| {
            LaunchError::Refused(format!("cannot recreate {}: {e}", tree_path.display()))
        })?;
        sys_at(
            Syscall::MoveMount,
            &tree_path,
            sys::move_mount_to(&tree, &tree_path),
        )?;
    }
    for (shown_path, is_dir, tree) in shown {
        let made = if is_dir {
            std::fs::create_dir_all(&shown_path)
        } else {
            shown_path
                .parent()
                .map_or(Ok(()), std::fs::create_dir_all)
                .and_then(|_| std::fs::File::create(&shown_path).map(drop))
        };
        made.map_err(|e| {
            LaunchError::Refused(format!("cannot show {}: {e}", shown_path.display()))
        })?;
        sys_at(
            Syscall::MoveMount,
            &shown_path,
            sys::move_mount_to(&tree, &shown_path),
        )?;
        setattr(&shown_path, true, sys::MOUNT_ATTR_RDONLY, 0)?;
    }
    Ok(())
}

/// Covers `path`: a directory by an empty, inaccessible tmpfs, anything
/// else by /dev/null, read-only.
pub(super) fn hide(path: &Path, plan: &Plan) -> Result<(), LaunchError> {
    let meta = std::fs::symlink_metadata(path);
    if meta.is_err() && plan.tmpfs.iter().any(|t| path.starts_with(&t.path)) {
        // Under a private tmpfs and not carried over: out of reach.
        return Ok(());
    }
    // Gone since the plan was made (a socket listed in /proc/net/unix then
    // unlinked, as a run's tools socket is when its run ends): nothing is
    // left to reach by that path, and what is bound there from now on is
    // bound after the arming, like any other later socket.
    let gone = |e: &std::io::Error| e.kind() == std::io::ErrorKind::NotFound;
    if meta.as_ref().is_err_and(gone) {
        return Ok(());
    }
    if meta.is_ok_and(|m| m.is_dir()) {
        return sys_at(
            Syscall::Cover,
            path,
            mount(
                Some("tmpfs"),
                path,
                Some("tmpfs"),
                MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
                Some("size=4k,mode=000"),
            ),
        );
    }
    let covered = mount(
        Some("/dev/null"),
        path,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    );
    if covered == Err(nix::errno::Errno::ENOENT)
        && std::fs::symlink_metadata(path).is_err_and(|e| gone(&e))
    {
        return Ok(());
    }
    sys_at(Syscall::Cover, path, covered)?;
    setattr(path, false, sys::MOUNT_ATTR_RDONLY, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_npm_script_brings_its_node_modules_tree() {
        assert_eq!(
            outermost_node_modules(Path::new(
                "/tmp/c/tests/agents/node_modules/@a/b/node_modules/c/dist/index.js"
            )),
            Some(PathBuf::from("/tmp/c/tests/agents/node_modules"))
        );
        assert_eq!(outermost_node_modules(Path::new("/tmp/x/agent.py")), None);
    }

    #[test]
    fn mountinfo_escapes_are_read() {
        assert_eq!(unescape(r"/a\040b"), "/a b");
        assert_eq!(unescape(r"/x\134y"), r"/x\y");
        assert_eq!(unescape("/plain"), "/plain");
    }
}
