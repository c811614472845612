//! No window: what the audit guards is watched for as long as the agent's
//! generation lives, not only looked at when a turn ends. A process the
//! agent leaves running can write after its turn; the watcher sees the
//! change and the audit looks within about a second, at any moment.
//!
//! On Linux the watcher is inotify, on every directory the baseline's walk
//! entered (new ones are added as they appear) and on the directories of
//! every file the other rules read (settings, scripts, includes, protected
//! paths that did not exist, git directories and their indexes). An event
//! is relevant when its name is one the audit judges there (a hidden
//! entry, a named configuration, a watched file, a new `.git`); a burst of
//! them becomes one call to `on_change`, [`SETTLE`] after the first. Source
//! files the agent edits raise no look.
//!
//! Where a watch cannot be added (the system's limit,
//! `fs.inotify.max_user_watches`, is reached) or there is no inotify
//! (macOS), the watcher says so (`Watcher::degraded`) and calls `on_change`
//! every [`POLL`] as well: the audit then looks on a clock, at the cost of
//! one walk of the roots each time.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long after the first relevant change the look is asked for: a burst
/// of writes becomes one look.
pub const SETTLE: Duration = Duration::from_millis(100);
/// How often the audit looks where changes cannot be watched.
pub const POLL: Duration = Duration::from_secs(2);
/// Directories watched at most (past it: the clock, as for a full limit).
pub const MAX_WATCHES: usize = 100_000;

/// What to watch.
#[derive(Debug, Clone, Default)]
pub struct Targets {
    /// Directories whose entries the audit judges by name, and whether
    /// they are hidden (inside a hidden directory or an agent's tree).
    pub dirs: Vec<(PathBuf, bool)>,
    /// Files (and directories) any change to which matters.
    pub paths: Vec<PathBuf>,
    /// Files watched as files, whatever name they are reached by (a hard
    /// link of a hidden file, written through another name).
    pub files: Vec<PathBuf>,
    /// Where the walk starts (roots, and the agents' trees): walked again
    /// for directories to watch when events were lost.
    pub tops: Vec<(PathBuf, bool)>,
}

/// A running watcher; stopped when dropped.
pub struct Watcher {
    /// Why watching is partial: the audit also looks every [`POLL`].
    pub degraded: Option<String>,
    /// The write end of the stop pipe: closing it wakes the thread at once
    /// (its read end hangs up), so a drop never waits out a timeout.
    stop: Option<OwnedFd>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Watcher {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Watcher {
    /// Tells the thread to stop, without waiting for it.
    pub fn stop(&mut self) {
        drop(self.stop.take());
    }

    /// Stops the watcher without waiting for its thread to end. The
    /// thread closes its inotify instance as it ends, and the kernel makes
    /// that wait for a grace period of its own (fsnotify's SRCU): 0.2 to
    /// 14 ms here, which a re-arm's loop used to wait out before it asked
    /// the new agent anything. The thread may still hand over changes
    /// while it ends (after a long walk of new directories, later): the
    /// caller tells them from the next watcher's.
    pub fn let_go(mut self) {
        self.stop();
        drop(self.thread.take());
    }
}

/// The watcher thread's end of the stop pipe.
struct StopSignal(OwnedFd);

impl StopSignal {
    /// Waits up to `timeout` (`None`: for ever) for the stop; whether it
    /// came. With `inotify`, also wakes when it has events (the second
    /// value).
    fn wait(
        &self,
        timeout: Option<Duration>,
        inotify: Option<std::os::fd::BorrowedFd<'_>>,
    ) -> (bool, bool) {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        let timeout = match timeout {
            // Rounded up, so that a due time is never polled early in a loop.
            Some(t) => PollTimeout::try_from(t.as_millis().saturating_add(1).min(60_000) as i32)
                .unwrap_or(PollTimeout::MAX),
            None => PollTimeout::NONE,
        };
        let mut fds = vec![PollFd::new(self.0.as_fd(), PollFlags::POLLIN)];
        if let Some(fd) = inotify {
            fds.push(PollFd::new(fd, PollFlags::POLLIN));
        }
        match poll(&mut fds, timeout) {
            Ok(n) if n > 0 => {
                let stopped = fds[0].any().unwrap_or(true);
                let events = fds.get(1).is_some_and(|f| f.any().unwrap_or(false));
                (stopped, events)
            }
            Ok(_) | Err(nix::errno::Errno::EINTR) => (false, false),
            // A poll that cannot wait would spin: stop instead.
            Err(_) => (true, false),
        }
    }
}

/// A stop pipe: the end the [`Watcher`] keeps, and the thread's.
fn stop_pipe() -> std::io::Result<(OwnedFd, StopSignal)> {
    // Close-on-exec from the start: a child another thread starts meanwhile
    // must not hold the write end (a drop would then wait for it to end).
    #[cfg(target_os = "linux")]
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    #[cfg(not(target_os = "linux"))]
    let (read, write) = {
        let (read, write) = nix::unistd::pipe()?;
        for fd in [&read, &write] {
            nix::fcntl::fcntl(
                fd,
                nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
            )?;
        }
        (read, write)
    };
    Ok((write, StopSignal(read)))
}

/// Calls `on_change` now and every [`POLL`] until stopped: the watcher
/// where changes cannot be watched.
fn poll_only(
    on_change: impl Fn(Vec<PathBuf>) + Send + 'static,
    stop: StopSignal,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        on_change(Vec::new());
        while !stop.wait(Some(POLL), None).0 {
            on_change(Vec::new());
        }
    })
}

impl Watcher {
    /// Watches `targets`, calling `on_change` (from the watcher's own
    /// thread) after each burst of relevant changes, with the paths that
    /// changed (empty: look everywhere).
    pub fn start(targets: Targets, on_change: impl Fn(Vec<PathBuf>) + Send + 'static) -> Watcher {
        let (stop, signal) = match stop_pipe() {
            Ok(p) => p,
            Err(e) => {
                // No way to stop a thread: the caller looks at the end only.
                return Watcher {
                    degraded: Some(format!(
                        "cannot start the watcher ({e}); only the look at the end is made"
                    )),
                    stop: None,
                    thread: None,
                };
            }
        };
        #[cfg(target_os = "linux")]
        let (degraded, thread) = linux::start(targets, on_change, signal);
        #[cfg(not(target_os = "linux"))]
        let (degraded, thread) = {
            let _ = targets;
            (
                Some("this system gives no file-change notifications zcode-acp uses".to_owned()),
                Some(poll_only(on_change, signal)),
            )
        };
        Watcher {
            degraded,
            stop: Some(stop),
            thread,
        }
    }
}

/// Whether `dir` (beneath one of `roots`, or in one of `trees`) is a
/// hidden directory, as the walk judges its entries.
pub fn is_hidden_dir(dir: &Path, roots: &[PathBuf], trees: &[PathBuf]) -> bool {
    if trees.iter().any(|t| dir.starts_with(t)) {
        return true;
    }
    let Some(root) = roots
        .iter()
        .filter(|r| dir.starts_with(r))
        .max_by_key(|r| r.as_os_str().len())
    else {
        return false;
    };
    dir.strip_prefix(root).is_ok_and(|rel| {
        rel.components()
            .any(|c| c.as_os_str().as_encoded_bytes().first() == Some(&b'.'))
    })
}

#[cfg(target_os = "linux")]
mod linux {
    use super::*;
    use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
    use std::collections::{HashMap, HashSet};
    use std::ffi::OsString;

    /// What one watched directory is for.
    #[derive(Debug, Default)]
    struct Watch {
        dir: PathBuf,
        /// Its entries are judged by name (hidden: inside a hidden dir).
        walked: Option<bool>,
        /// Names in it that matter whatever they are.
        names: HashSet<OsString>,
        /// Every change in it matters (a hooks directory, an agent's tree).
        any: bool,
        /// A file watched as a file (its own events).
        file: bool,
    }

    struct State {
        inotify: Inotify,
        watches: HashMap<WatchDescriptor, Watch>,
        by_dir: HashMap<PathBuf, WatchDescriptor>,
        full: Option<String>,
        /// The paths that changed since the last call.
        dirty: Vec<PathBuf>,
        /// Events were lost: the next call looks everywhere.
        lost: bool,
        tops: Vec<(PathBuf, bool)>,
    }

    /// What a file's watch reports.
    const FILE_MASK: AddWatchFlags = AddWatchFlags::IN_MODIFY
        .union(AddWatchFlags::IN_CLOSE_WRITE)
        .union(AddWatchFlags::IN_ATTRIB)
        .union(AddWatchFlags::IN_DELETE_SELF)
        .union(AddWatchFlags::IN_MOVE_SELF)
        .union(AddWatchFlags::IN_DONT_FOLLOW);

    const MASK: AddWatchFlags = AddWatchFlags::IN_CREATE
        .union(AddWatchFlags::IN_MOVED_TO)
        .union(AddWatchFlags::IN_MOVED_FROM)
        .union(AddWatchFlags::IN_DELETE)
        .union(AddWatchFlags::IN_MODIFY)
        .union(AddWatchFlags::IN_CLOSE_WRITE)
        .union(AddWatchFlags::IN_ATTRIB)
        .union(AddWatchFlags::IN_DELETE_SELF)
        .union(AddWatchFlags::IN_MOVE_SELF)
        .union(AddWatchFlags::IN_DONT_FOLLOW)
        .union(AddWatchFlags::IN_ONLYDIR);

    impl State {
        /// Watches `dir` for `what` (merged with what it is watched for).
        fn watch(&mut self, dir: &Path, edit: impl FnOnce(&mut Watch)) -> bool {
            self.add(dir, MASK, edit)
        }

        /// Watches the file `path` itself, whatever name it is written by.
        fn watch_file(&mut self, path: &Path) -> bool {
            self.add(path, FILE_MASK, |w| w.file = true)
        }

        fn add(&mut self, path: &Path, mask: AddWatchFlags, edit: impl FnOnce(&mut Watch)) -> bool {
            if let Some(wd) = self.by_dir.get(path) {
                if let Some(w) = self.watches.get_mut(wd) {
                    edit(w);
                }
                return true;
            }
            if self.watches.len() >= MAX_WATCHES {
                self.full.get_or_insert_with(|| {
                    format!("more than {MAX_WATCHES} directories would be watched")
                });
                return false;
            }
            match self.inotify.add_watch(path, mask) {
                Ok(wd) => {
                    let mut w = Watch {
                        dir: path.to_path_buf(),
                        ..Default::default()
                    };
                    edit(&mut w);
                    self.watches.insert(wd, w);
                    self.by_dir.insert(path.to_path_buf(), wd);
                    true
                }
                Err(nix::errno::Errno::ENOSPC) => {
                    self.full.get_or_insert_with(|| {
                        "the system's limit on watched directories (fs.inotify.max_user_watches) is reached".to_owned()
                    });
                    false
                }
                // Gone, or not what the mask wants: nothing to watch there.
                Err(_) => false,
            }
        }

        /// Watches a directory that appeared beneath a walked one, and
        /// what is in it; whether anything in it is judged.
        fn walk_in(&mut self, dir: &Path, hidden: bool, depth: usize) -> bool {
            if depth > crate::audit::walk::MAX_DEPTH {
                return true;
            }
            self.watch(dir, |w| w.walked = Some(hidden));
            let Ok(entries) = std::fs::read_dir(dir) else {
                return false;
            };
            let mut judged = hidden;
            for e in entries.flatten() {
                let name = e.file_name();
                if crate::audit::walk::watched_name(&name, hidden).is_some() || name == ".git" {
                    judged = true;
                    self.dirty.push(e.path());
                }
                if name == ".git" && e.file_type().is_ok_and(|t| t.is_dir()) {
                    self.watch(&e.path(), |w| w.any = true);
                    self.watch(&e.path().join("hooks"), |w| w.any = true);
                }
                if e.file_type().is_ok_and(|t| t.is_dir()) && crate::audit::walk::enters(&name) {
                    let inner = hidden || name.as_encoded_bytes().first() == Some(&b'.');
                    judged |= self.walk_in(&e.path(), inner, depth + 1);
                }
            }
            judged
        }
    }

    pub(super) fn start(
        targets: Targets,
        on_change: impl Fn(Vec<PathBuf>) + Send + 'static,
        stop: StopSignal,
    ) -> (Option<String>, Option<std::thread::JoinHandle<()>>) {
        let inotify = match Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC) {
            Ok(i) => i,
            Err(e) => {
                let why = format!("inotify is not available ({e})");
                return (Some(why), Some(poll_only(on_change, stop)));
            }
        };
        let mut state = State {
            inotify,
            watches: HashMap::new(),
            by_dir: HashMap::new(),
            full: None,
            dirty: Vec::new(),
            lost: false,
            tops: targets.tops.clone(),
        };
        for f in &targets.files {
            state.watch_file(f);
        }
        for (dir, hidden) in &targets.dirs {
            let hidden = *hidden;
            state.watch(dir, |w| w.walked = Some(hidden));
        }
        for p in &targets.paths {
            if p.is_dir() && std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir()) {
                state.watch(p, |w| w.any = true);
            }
            // Its directory, for the name (made, removed, replaced); the
            // nearest one that exists, for a path not there yet.
            let Some(name) = p.file_name().map(|n| n.to_owned()) else {
                continue;
            };
            let mut dir = p.parent();
            let mut name = name;
            while let Some(d) = dir {
                if d.is_dir() {
                    let n = name.clone();
                    state.watch(d, |w| {
                        w.names.insert(n);
                    });
                    break;
                }
                name = d.file_name().map(|n| n.to_owned()).unwrap_or_default();
                dir = d.parent();
            }
        }
        let degraded = state.full.clone();
        let thread = std::thread::Builder::new()
            .name("zcode-acp-audit-watch".into())
            .spawn(move || run(state, on_change, stop))
            .ok();
        (degraded, thread)
    }

    fn run(mut state: State, on_change: impl Fn(Vec<PathBuf>), stop: StopSignal) {
        // What was changed between the walk and the watches being added is
        // looked at once now.
        on_change(Vec::new());
        let mut next_poll = std::time::Instant::now() + POLL;
        let mut due: Option<std::time::Instant> = None;
        loop {
            // Asleep until an event, the settle time, the clock of a
            // degraded watcher, or the stop.
            let now = std::time::Instant::now();
            let wake = match (due, state.full.is_some()) {
                (Some(at), true) => Some(at.min(next_poll)),
                (Some(at), false) => Some(at),
                (None, true) => Some(next_poll),
                (None, false) => None,
            };
            let (stopped, ready) = stop.wait(
                wake.map(|at| at.saturating_duration_since(now)),
                Some(state.inotify.as_fd()),
            );
            if stopped {
                return;
            }
            if ready && relevant_events(&mut state) && due.is_none() {
                due = Some(std::time::Instant::now() + SETTLE);
            }
            if due.is_some_and(|at| std::time::Instant::now() >= at) {
                due = None;
                if state.lost {
                    // Events were lost: directories made meanwhile are
                    // watched now, and the look covers everything.
                    state.lost = false;
                    for (top, hidden) in state.tops.clone() {
                        state.walk_in(&top, hidden, 0);
                    }
                    state.dirty.clear();
                    on_change(Vec::new());
                } else {
                    let mut dirty = std::mem::take(&mut state.dirty);
                    dirty.sort();
                    dirty.dedup();
                    on_change(dirty);
                }
            }
            if state.full.is_some() && std::time::Instant::now() >= next_poll {
                next_poll = std::time::Instant::now() + POLL;
                on_change(Vec::new());
            }
        }
    }

    /// Reads the queued events; whether one of them matters (noted in
    /// `state.dirty`).
    fn relevant_events(state: &mut State) -> bool {
        let mut relevant = false;
        loop {
            let events = match state.inotify.read_events() {
                Ok(e) if !e.is_empty() => e,
                _ => return relevant,
            };
            for ev in events {
                if ev.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
                    // Events were lost: look at everything.
                    state.lost = true;
                    relevant = true;
                    continue;
                }
                if ev.mask.contains(AddWatchFlags::IN_IGNORED) {
                    if let Some(w) = state.watches.remove(&ev.wd) {
                        state.by_dir.remove(&w.dir);
                    }
                    continue;
                }
                let Some(w) = state.watches.get(&ev.wd) else {
                    continue;
                };
                let dir = w.dir.clone();
                let Some(name) = ev.name else {
                    // The watched directory or file itself changed.
                    if w.file || w.any || w.walked == Some(true) || !w.names.is_empty() {
                        state.dirty.push(dir);
                        relevant = true;
                    }
                    continue;
                };
                let path = dir.join(&name);
                let walked = w.walked;
                let mut matters = w.any || w.names.contains(&name);
                let made_dir = ev.mask.contains(AddWatchFlags::IN_ISDIR)
                    && ev
                        .mask
                        .intersects(AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO);
                if name == ".git" {
                    // A repository made: its git directory is watched from
                    // now on (hooks and config written after `git init`).
                    matters = true;
                    if made_dir {
                        state.watch(&path, |w| w.any = true);
                        state.watch(&path.join("hooks"), |w| w.any = true);
                    }
                }
                if let Some(hidden) = walked {
                    if crate::audit::walk::watched_name(&name, hidden).is_some() {
                        matters = true;
                    }
                    if made_dir && crate::audit::walk::enters(&name) {
                        let inner = hidden
                            || name.as_encoded_bytes().first() == Some(&b'.')
                            || crate::audit::walk::CONFIG_DIRS.iter().any(|c| name == *c);
                        if state.walk_in(&path, inner, 0) {
                            matters = true;
                        }
                    }
                }
                if matters {
                    state.dirty.push(path);
                    relevant = true;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hidden_directories_are_told_apart() {
        let roots = vec![PathBuf::from("/w")];
        let trees = vec![PathBuf::from("/h/.claude/skills")];
        assert!(!is_hidden_dir(Path::new("/w"), &roots, &trees));
        assert!(!is_hidden_dir(Path::new("/w/src/a"), &roots, &trees));
        assert!(is_hidden_dir(Path::new("/w/.vscode"), &roots, &trees));
        assert!(is_hidden_dir(Path::new("/w/a/.b/c"), &roots, &trees));
        assert!(is_hidden_dir(
            Path::new("/h/.claude/skills/x"),
            &roots,
            &trees
        ));
    }

    /// A hidden file made deep in a directory that appears after the
    /// watcher started is seen; a source file is not.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_plant_in_a_new_directory_is_seen_and_source_edits_are_not() {
        let t = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(t.path()).unwrap();
        std::fs::create_dir_all(root.join("src")).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let w = Watcher::start(
            Targets {
                dirs: vec![(root.clone(), false), (root.join("src"), false)],
                tops: vec![(root.clone(), false)],
                ..Default::default()
            },
            move |_| {
                let _ = tx.send(());
            },
        );
        assert!(w.degraded.is_none(), "{:?}", w.degraded);
        // The first look, at start.
        rx.recv_timeout(Duration::from_secs(5)).unwrap();
        std::fs::write(root.join("src/main.rs"), "fn main() {}").unwrap();
        assert!(
            rx.recv_timeout(Duration::from_millis(500)).is_err(),
            "a source edit raised a look"
        );
        std::fs::create_dir_all(root.join("src/new/deeper")).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        while rx.try_recv().is_ok() {}
        std::fs::write(root.join("src/new/deeper/.envrc"), "evil").unwrap();
        rx.recv_timeout(Duration::from_secs(5))
            .expect("the plant was not seen");
    }
}
