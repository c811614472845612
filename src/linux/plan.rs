//! The Linux mount plan and Landlock rules, built from the policy. Pure:
//! what exists on disk is asked through [`Fs`], so the exact plan is
//! unit-tested; `exec` carries it out.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::policy::{is_zcode_config_path, sockets, Band, Matcher, Ops, Policy};

/// What the planner may ask about the filesystem.
pub trait Fs {
    fn is_dir(&self, p: &Path) -> bool;
    fn exists(&self, p: &Path) -> bool;
    /// Entry names of a directory.
    fn list(&self, p: &Path) -> Vec<String>;
    /// Whether `p` is a socket itself (not through a symlink).
    fn is_socket(&self, p: &Path) -> bool;
    /// Whether `p` is a symlink itself.
    fn is_symlink(&self, p: &Path) -> bool;
    /// Whether `p` leads somewhere, following symlinks.
    fn resolves(&self, p: &Path) -> bool;
}

pub struct RealFs;

impl Fs for RealFs {
    fn is_dir(&self, p: &Path) -> bool {
        std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir())
    }
    fn exists(&self, p: &Path) -> bool {
        std::fs::symlink_metadata(p).is_ok()
    }
    fn list(&self, p: &Path) -> Vec<String> {
        std::fs::read_dir(p)
            .map(|d| {
                d.flatten()
                    .filter_map(|e| e.file_name().into_string().ok())
                    .collect()
            })
            .unwrap_or_default()
    }
    fn is_socket(&self, p: &Path) -> bool {
        use std::os::unix::fs::FileTypeExt;
        std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_socket())
    }
    fn is_symlink(&self, p: &Path) -> bool {
        std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_symlink())
    }
    fn resolves(&self, p: &Path) -> bool {
        std::fs::metadata(p).is_ok()
    }
}

/// Directories replaced by a fresh tmpfs in each generation. A shared /tmp
/// holds other programs' sockets (X11, tmux, ssh agents, editors' IPC), any
/// of which could run commands for the agent outside the sandbox; a private
/// one costs only sharing temp files with the host (and they do not
/// survive a re-arm).
pub const PRIVATE_TMP: &[&str] = &["/tmp", "/var/tmp"];

/// One step of the plan, with the reason it is there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    pub path: PathBuf,
    pub why: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    /// Bound onto themselves and made writable (parents first).
    pub writable: Vec<Step>,
    /// Replaced by an empty, writable tmpfs.
    pub tmpfs: Vec<Step>,
    /// Made mountpoints, so they cannot be renamed (EBUSY).
    pub pins: Vec<Step>,
    /// Protected paths that are symlinks: each link is bound onto itself,
    /// so it cannot be removed or replaced (EBUSY); what it points to is
    /// read-only through `readonly`.
    #[serde(default)]
    pub links: Vec<Step>,
    /// Bound onto themselves and made read-only, recursively.
    pub readonly: Vec<Step>,
    /// The user's grants for protected paths: made writable again after
    /// the read-only binds.
    #[serde(default)]
    pub reopen: Vec<Step>,
    /// Islands beneath a reopened grant: read-only again after it (a grant
    /// never opens the sandbox's own configuration).
    #[serde(default)]
    pub readonly_again: Vec<Step>,
    /// Covered so nothing inside can be reached (sockets of services that
    /// would write for the caller).
    pub hidden: Vec<Step>,
    /// Landlock: write rights beneath these directories...
    pub landlock_dirs: Vec<PathBuf>,
    /// ...and on these files (devices).
    pub landlock_files: Vec<PathBuf>,
    /// What the policy asks for that this plan cannot enforce, and why.
    pub gaps: Vec<Step>,
    /// Directories whose entries of granted prefixes the supervisor
    /// creates, renames and removes for the sandbox (see `supervise`).
    #[serde(default)]
    pub supervised: Vec<Supervised>,
    /// Shared caches mounted copy-on-write: the user's cache is the lower
    /// layer, what the sandbox writes goes into a layer of its own.
    #[serde(default)]
    pub layered: Vec<Step>,
    /// Where the layers live (`~/.zcode-acp/layers/PROJECT`); the launcher
    /// takes the first slot below it that no other sandbox holds.
    #[serde(default)]
    pub layers: Option<PathBuf>,
}

pub use super::supervise::decide::Supervised;

fn step(path: &Path, why: &str) -> Step {
    Step {
        path: path.to_path_buf(),
        why: why.to_owned(),
    }
}

fn push_unique(list: &mut Vec<Step>, s: Step) {
    if !list.iter().any(|x| x.path == s.path) {
        list.push(s);
    }
}

/// Per-user facts the plan depends on: the hidden-socket list, how the
/// home directory is spelled, and whether the supervisor can work here.
/// The default is nobody's: no home, no sockets, no supervisor.
#[derive(Debug, Clone)]
pub struct UserFacts {
    pub uid: u32,
    pub ssh_auth_sock: Option<PathBuf>,
    pub xdg_runtime_dir: Option<PathBuf>,
    /// `$HOME` as set, and its real path.
    pub home: Option<(PathBuf, PathBuf)>,
    /// Whether name-prefix grants can be supervised; `None`: asked of this
    /// machine (`supervise::available`, a forked probe where this process
    /// already runs under a seccomp filter) only when a plan has such a
    /// grant, so a launch without one never pays for the probe.
    pub supervise: Option<bool>,
    /// The pathname sockets bound when the plan is made (`/proc/net/unix`).
    pub bound_sockets: Vec<PathBuf>,
    /// Where shared caches' copy-on-write layers live for this project
    /// (None: the caches are written directly, as on a lower level).
    pub layers: Option<PathBuf>,
}

impl Default for UserFacts {
    fn default() -> UserFacts {
        UserFacts {
            uid: 0,
            ssh_auth_sock: None,
            xdg_runtime_dir: None,
            home: None,
            supervise: Some(false),
            bound_sockets: Vec::new(),
            layers: None,
        }
    }
}

impl UserFacts {
    /// This process's user and environment, with the caches' layers of the
    /// project rooted at `first_root` under `managed` (as a launch there
    /// would get them).
    pub fn for_project(
        managed: &crate::config::managed::ManagedRoot,
        first_root: Option<&Path>,
    ) -> UserFacts {
        UserFacts {
            layers: first_root.map(|r| crate::confine::layers_for(managed, r)),
            ..UserFacts::current()
        }
    }

    /// This process's user and environment.
    pub fn current() -> UserFacts {
        let home = std::env::var_os("HOME")
            .map(PathBuf::from)
            .filter(|h| h.is_absolute())
            .and_then(|h| crate::policy::resolve_real(&h).ok().map(|r| (h, r)));
        UserFacts {
            uid: nix::unistd::getuid().as_raw(),
            ssh_auth_sock: std::env::var_os("SSH_AUTH_SOCK").map(PathBuf::from),
            xdg_runtime_dir: std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from),
            home,
            supervise: None,
            bound_sockets: super::listening::bound_sockets(),
            layers: None,
        }
    }
}

/// At most this many entries of a directory holding a bound socket are
/// looked through for sockets moved there.
const MAX_BESIDE: usize = 4096;

/// What the sandbox must not reach: the well-known servers that run what
/// they are sent (`sockets::linux_known`), every other socket bound when the
/// sandbox is armed but the few allowed (`sockets::ALLOWED`), and
/// `/dev/userfaultfd`. Directories first: a socket inside a covered
/// directory needs nothing more.
fn hidden_candidates(s: &UserFacts, served: &[PathBuf], fs: &dyn Fs) -> (Vec<Step>, Vec<Step>) {
    let mut hide = vec![step(
        Path::new("/dev/userfaultfd"),
        "page faults served by a sandboxed program could stall the supervisor reading its memory",
    )];
    for k in sockets::linux_known(
        s.uid,
        s.xdg_runtime_dir.as_deref(),
        s.ssh_auth_sock.as_deref(),
    ) {
        hide.push(step(Path::new(&k.path), k.why));
    }
    let reachable = |p: &Path| sockets::linux_allowed(p).is_none() && !served_here(p, served);
    let mut unseen = Vec::new();
    let mut beside: Vec<&Path> = Vec::new();
    for p in &s.bound_sockets {
        if let Some(dir) = p.parent().filter(|d| !beside.contains(d)) {
            beside.push(dir);
        }
        if !reachable(p) {
            continue;
        }
        if fs.is_socket(p) {
            hide.push(step(
                p,
                "a server listening outside the sandbox (covered: it would act for the agent with its own rights)",
            ));
        } else {
            unseen.push(step(
                p,
                "a socket bound when the sandbox was armed, not at that path now (renamed away, or in another mount namespace): covered only if found beside another",
            ));
        }
    }
    // A server may bind a temporary name and rename or link the socket
    // into place (OpenSSH's ControlMaster, supervisord): the listing keeps
    // the name it was bound to. Every socket beside a bound one is covered.
    for dir in beside {
        let names = fs.list(dir);
        if names.len() > MAX_BESIDE {
            unseen.push(step(
                dir,
                "a directory of bound sockets too large to look through: its sockets bound under another name are not covered",
            ));
            continue;
        }
        for name in names {
            let p = dir.join(name);
            if reachable(&p) && fs.is_socket(&p) && !hide.iter().any(|h| h.path == p) {
                hide.push(step(
                    &p,
                    "a socket beside one bound outside the sandbox (covered: it may have been bound under another name and moved there)",
                ));
            }
        }
    }
    hide.sort_by_key(|h| !fs.is_dir(&h.path));
    (hide, unseen)
}

/// Whether `p` is a socket zcode-acp serves the sandbox (or beneath a
/// directory of them): its server judges every request.
fn served_here(p: &Path, served: &[PathBuf]) -> bool {
    for s in served {
        if p.starts_with(s) {
            return true;
        }
    }
    false
}

fn depth(p: &Path) -> usize {
    p.components().count()
}

/// Builds the plan for `policy`.
pub fn build(policy: &Policy, fs: &dyn Fs, facts: &UserFacts) -> Plan {
    let mut plan = Plan::default();
    let private_tmp = |p: &Path| PRIVATE_TMP.iter().any(|t| p == Path::new(t));
    let private_tmp_holds = |p: &Path| {
        PRIVATE_TMP.iter().any(|t| p.starts_with(t))
            && policy.rules.iter().any(|r| {
                r.kind == Band::Allow
                    && matches!(&r.matcher, Matcher::Subpath(s) if PRIVATE_TMP.iter().any(|t| s == Path::new(t)) && p.starts_with(s))
            })
    };

    for rule in policy.rules.iter().filter(|r| r.kind == Band::Allow) {
        // An allow rule a later rule takes back entirely (a project's deny
        // entry holding a device) grants nothing: a read-only mount would
        // not stop a device write, Landlock must not allow it.
        let taken_back = |p: &Path| {
            !policy
                .evaluate_resolved(p, crate::policy::Op::Write)
                .allowed
        };
        if let Matcher::Subpath(p) | Matcher::Literal(p) = &rule.matcher {
            if p.starts_with("/dev") && taken_back(p) {
                continue;
            }
        }
        if rule.reopens {
            if let Matcher::Subpath(p) | Matcher::Literal(p) = &rule.matcher {
                if fs.exists(p) {
                    push_unique(&mut plan.reopen, step(p, &rule.why));
                    if fs.is_dir(p) {
                        plan.landlock_dirs.push(p.clone());
                    } else {
                        plan.landlock_files.push(p.clone());
                    }
                }
            }
            continue;
        }
        match &rule.matcher {
            Matcher::Subpath(p) if private_tmp(p) => {
                if fs.is_dir(p) {
                    push_unique(&mut plan.tmpfs, step(p, "private temp for this generation (a shared /tmp holds other programs' sockets)"));
                    plan.landlock_dirs.push(p.clone());
                }
            }
            Matcher::Subpath(p) if p == Path::new("/dev/shm") => {
                push_unique(&mut plan.tmpfs, step(p, "the sandbox's own shared memory"));
                plan.landlock_dirs.push(p.clone());
            }
            Matcher::Subpath(p) if p.starts_with("/dev") => {
                // Device directories (ptys) stay as they are; Landlock grants them.
                if fs.is_dir(p) {
                    plan.landlock_dirs.push(p.clone());
                }
            }
            Matcher::Subpath(p) if rule.layered && facts.layers.is_some() && fs.is_dir(p) => {
                push_unique(&mut plan.layered, step(p, &rule.why));
                plan.landlock_dirs.push(p.clone());
                plan.layers.clone_from(&facts.layers);
            }
            Matcher::Subpath(p) => {
                if rule.layered {
                    plan.gaps.push(step(
                        p,
                        "a cache shared with your own builds, written directly (no copy-on-write layer here): a file planted there reaches them",
                    ));
                }
                if fs.is_dir(p) {
                    push_unique(&mut plan.writable, step(p, &rule.why));
                    plan.landlock_dirs.push(p.clone());
                } else if fs.exists(p) {
                    push_unique(&mut plan.writable, step(p, &rule.why));
                    plan.landlock_files.push(p.clone());
                } else {
                    plan.gaps.push(step(p, "allowed, but it does not exist when the sandbox is armed, so it stays read-only"));
                }
            }
            Matcher::Literal(p) => {
                if fs.exists(p) {
                    plan.landlock_files.push(p.clone());
                }
            }
            Matcher::NamePrefix { dir, prefix } => {
                // Inside a private tmpfs the directory is not there at all.
                let supervised = !private_tmp_holds(dir)
                    && facts.supervise.unwrap_or_else(super::supervise::available);
                let mut names = fs.list(dir);
                names.sort();
                for name in names.into_iter().filter(|n| n.starts_with(prefix.as_str())) {
                    let p = dir.join(&name);
                    if policy.evaluate_resolved(&p, crate::policy::Op::Write).kind != Band::Allow {
                        continue; // an island (the managed root) takes it back
                    }
                    // An empty directory (a lock left over from before) is
                    // the supervisor's too: bound, it could not be removed.
                    if fs.is_dir(&p) && !(supervised && fs.list(&p).is_empty()) {
                        push_unique(&mut plan.writable, step(&p, &rule.why));
                        plan.landlock_dirs.push(p);
                    } else if !supervised {
                        push_unique(&mut plan.writable, step(&p, &rule.why));
                        plan.landlock_files.push(p);
                    }
                    // A supervised file gets no bind: a mount would pin the
                    // old inode, and a save renamed over it would fail
                    // (EBUSY). The supervisor serves it instead.
                }
                if supervised {
                    match plan.supervised.iter_mut().find(|s| s.dir == *dir) {
                        Some(s) => s.prefixes.push(prefix.clone()),
                        None => plan.supervised.push(Supervised {
                            dir: dir.clone(),
                            spellings: facts
                                .home
                                .iter()
                                .filter(|(given, real)| real == dir && given != dir)
                                .map(|(given, _)| given.clone())
                                .collect(),
                            prefixes: vec![prefix.clone()],
                        }),
                    }
                    plan.gaps.push(step(
                        &dir.join(format!("{prefix}*")),
                        "new entries are made by the sandbox's supervisor; inside a directory made that way, writes work only from the next arming",
                    ));
                } else {
                    plan.gaps.push(step(
                        &dir.join(format!("{prefix}*")),
                        "only entries that exist when the sandbox is armed are writable; new ones cannot be created (this kernel cannot supervise them)",
                    ));
                }
            }
            Matcher::ZcodeConfig { .. } => {}
        }
    }

    for rule in policy.rules.iter().filter(|r| r.kind != Band::Allow) {
        match (&rule.matcher, rule.ops) {
            // Exactly this name, a symlink: the link itself is held (where
            // it leads has a rule of its own, see `build_resolving_links`).
            (Matcher::Literal(p), Ops::All) if fs.is_symlink(p) => {
                push_unique(&mut plan.links, step(p, &rule.why));
            }
            (Matcher::Subpath(p) | Matcher::Literal(p), Ops::All) => {
                if fs.is_symlink(p) {
                    // A read-only bind follows the link: the link itself
                    // would stay free to be replaced by a file of the
                    // agent's (a `.git/hooks` of its own).
                    push_unique(&mut plan.links, step(p, &rule.why));
                    if !fs.resolves(p) {
                        plan.gaps.push(step(
                            p,
                            "protected, but a symlink to nothing when the sandbox is armed: what it points to can be created; the audit reverts it within about a second",
                        ));
                        continue;
                    }
                }
                if fs.exists(p) {
                    push_unique(&mut plan.readonly, step(p, &rule.why));
                } else if rule.kind == Band::Protected {
                    plan.gaps.push(step(
                        p,
                        "protected, but it does not exist when the sandbox is armed: a write can create it; the audit reverts it within about a second",
                    ));
                }
            }
            (Matcher::Subpath(p) | Matcher::Literal(p), Ops::RemoveOnly) if fs.is_dir(p) => {
                push_unique(&mut plan.pins, step(p, &rule.why));
            }
            (Matcher::ZcodeConfig { beneath }, _) => {
                // The bridge creates <root>/.zcode/acp before arming; it and
                // its parent become read-only mountpoints.
                let acp = beneath.join(".zcode").join("acp");
                if fs.is_dir(&acp) && is_zcode_config_path(&acp) {
                    push_unique(
                        &mut plan.pins,
                        step(
                            &beneath.join(".zcode"),
                            "holds the sandbox config: cannot be renamed",
                        ),
                    );
                    push_unique(&mut plan.readonly, step(&acp, &rule.why));
                }
            }
            _ => {}
        }
    }
    plan.gaps.push(step(
        Path::new("/"),
        "a .zcode/acp deeper than a writable directory's top, or created later, is not read-only on Linux; the approval ledger guards what it may say",
    ));

    let (hide, unseen) = hidden_candidates(facts, &policy.network.served_sockets, fs);
    for h in hide {
        // Inside a directory covered before it, the socket is out of sight.
        // Inside a private tmpfs it is too, unless a tree carried over (a
        // workspace under /tmp) or shown there holds it: the executor
        // covers what is still there after the tmpfs is set up.
        let covered = plan.hidden.iter().any(|d| h.path.starts_with(&d.path));
        if fs.exists(&h.path) && !covered {
            push_unique(&mut plan.hidden, h);
        }
    }
    plan.gaps.extend(unseen);
    plan.gaps.push(step(
        Path::new("/"),
        "a socket bound after the sandbox was armed is covered only from the next arming",
    ));

    // Inside a private tmpfs only the writable trees carried over exist. A
    // step for anything else there names what the sandbox cannot see (a
    // `.zcode` a session once left in the host's /tmp), and the host's copy
    // is out of the agent's reach anyway: binding it would only fail.
    let in_tmpfs = |p: &Path| plan.tmpfs.iter().any(|t| p.starts_with(&t.path));
    let carried: Vec<PathBuf> = plan
        .writable
        .iter()
        .filter(|w| in_tmpfs(&w.path))
        .map(|w| w.path.clone())
        .collect();
    let reachable = |p: &Path| !in_tmpfs(p) || carried.iter().any(|c| p.starts_with(c));
    plan.pins.retain(|s| reachable(&s.path));
    plan.links.retain(|s| reachable(&s.path));
    plan.readonly.retain(|s| reachable(&s.path));
    plan.reopen.retain(|s| reachable(&s.path));

    plan.writable.sort_by_key(|s| depth(&s.path));
    plan.pins.sort_by_key(|s| depth(&s.path));
    plan.readonly.sort_by_key(|s| depth(&s.path));
    plan.reopen.sort_by_key(|s| depth(&s.path));
    // A grant never reopens an island: none that is one whole is kept, and
    // islands beneath a kept one are made read-only again after it. (A
    // `.zcode` entry is an island by its name only, what is in it is not:
    // its mount root follows the grant, and its `acp` is read-only again.)
    let island =
        |p: &Path| policy.evaluate_resolved(p, crate::policy::Op::Write).kind == Band::Island;
    let island_tree = |p: &Path| island(p) && island(&p.join("any"));
    plan.reopen.retain(|r| !island_tree(&r.path));
    // Nor does any allow rule bind one writable (a workspace opened inside
    // a `.zcode/acp`, a grant of the managed root).
    plan.writable.retain(|w| !island_tree(&w.path));
    // And Landlock, the only guard at the landlock-only level, grants none.
    plan.landlock_dirs.retain(|d| !island_tree(d));
    plan.landlock_files.retain(|f| !island(f));
    plan.readonly_again = plan
        .readonly
        .iter()
        .filter(|s| island(&s.path) && plan.reopen.iter().any(|r| s.path.starts_with(&r.path)))
        .cloned()
        .collect();
    plan.landlock_dirs.dedup();
    plan.landlock_files.dedup();
    plan
}

/// One mount operation of the launch, in the order [`Plan::mount_ops`]
/// gives; `exec` carries each out through one function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MountOp<'a> {
    /// Mount events stop at the namespace's edge, both ways.
    PrivateRoot,
    /// Everything read-only, recursively: the default the rest carves into.
    ReadOnlyRoot,
    /// Bound onto itself, writable and nosuid; mounts inside it that are
    /// read-only on the host stay read-only.
    Writable(&'a Path),
    /// The launch's layer slot, bound writable for the overlays.
    LayerSlot,
    /// A shared cache made copy-on-write over the slot (or, where overlayfs
    /// cannot be mounted, bound writable, and the log says so).
    Layer(&'a Path),
    /// A fresh tmpfs; the writable trees and what the command must see
    /// beneath it are carried over.
    PrivateTmp(&'a Path),
    /// Made a mountpoint, so it cannot be renamed away.
    Pin(&'a Path),
    /// A symlink bound onto itself (not followed): it cannot be removed or
    /// replaced, and it still leads where it led.
    PinLink(&'a Path),
    /// Bound onto itself read-only, recursively.
    ReadOnly(&'a Path),
    /// A grant inside a read-only path: writable again.
    Reopen(&'a Path),
    /// Covered: a socket by /dev/null, a directory by an empty tmpfs.
    Hide(&'a Path),
}

impl Plan {
    /// The mount operations in the order that makes the plan true. Each
    /// later step narrows or carves into what the earlier ones made, so
    /// the order is the design:
    /// 1. private propagation first: no mount of ours may reach the host;
    /// 2. `/` read-only before anything opens: a path no step names is
    ///    never writable;
    /// 3. writable roots, then the caches' layers (their slot before them),
    ///    both before the private temp directories, which carry the
    ///    writable trees beneath them over to the new tmpfs;
    /// 4. pins (of directories and of protected symlinks) and read-only
    ///    islands after every writable bind, so an island inside a root is
    ///    not opened again by the root's bind;
    /// 5. the user's grants inside protected paths after the islands, and
    ///    the islands beneath a grant read-only again after it;
    /// 6. covers last, so no later bind uncovers a socket.
    pub fn mount_ops(&self) -> Vec<MountOp<'_>> {
        fn each<'p>(
            steps: &'p [Step],
            op: fn(&'p Path) -> MountOp<'p>,
        ) -> impl Iterator<Item = MountOp<'p>> {
            steps.iter().map(move |s| op(&s.path))
        }
        let mut ops = vec![MountOp::PrivateRoot, MountOp::ReadOnlyRoot];
        ops.extend(each(&self.writable, MountOp::Writable));
        if !self.layered.is_empty() && self.layers.is_some() {
            ops.push(MountOp::LayerSlot);
            ops.extend(each(&self.layered, MountOp::Layer));
        }
        ops.extend(each(&self.tmpfs, MountOp::PrivateTmp));
        ops.extend(each(&self.pins, MountOp::Pin));
        ops.extend(each(&self.links, MountOp::PinLink));
        ops.extend(each(&self.readonly, MountOp::ReadOnly));
        ops.extend(each(&self.reopen, MountOp::Reopen));
        ops.extend(each(&self.readonly_again, MountOp::ReadOnly));
        ops.extend(each(&self.hidden, MountOp::Hide));
        ops
    }
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
