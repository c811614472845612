//! `zcode-acp run`: any command under the same sandbox a backend gets
//! (Linux: namespaces + Landlock; macOS: `sandbox-exec`).

use std::path::PathBuf;
use std::sync::Arc;

use crate::config::managed::ManagedRoot;
#[cfg(target_os = "macos")]
use crate::confine::Launch;
use crate::confine::{Command, Confinement, Enforce, Sandbox, Starter};
use crate::policy::build::PolicyInput;
use crate::policy::Platform;

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// A writable workspace root (repeatable; default: the current directory).
    #[arg(long = "workspace", value_name = "DIR")]
    pub workspaces: Vec<PathBuf>,
    /// Also allow writes beneath PATH, for this run only (repeatable).
    #[arg(long = "allow", value_name = "PATH")]
    pub allow: Vec<PathBuf>,
    /// Whose state the command may write: claude, codex, gemini, qwen,
    /// opencode, vibe, zcode or none (default: read from the command, as
    /// for a backend).
    #[arg(long, value_name = "PROFILE")]
    pub backend_profile: Option<String>,
    /// Watch for refused writes and name them in a last line even when
    /// stderr is not a terminal (by default only a terminal's reader gets
    /// it: on Linux, watching costs each call that makes or removes a name
    /// a round trip to the sandbox's supervisor; on macOS, it reads the
    /// system log).
    #[arg(long, conflicts_with = "no_refusals_line")]
    pub refusals_line: bool,
    /// Never watch for refused writes, even on a terminal.
    #[arg(long)]
    pub no_refusals_line: bool,
    /// The command to run.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// What the policy for `args` is built from, and which backend profile
/// chose the command's writable state. Prepares each workspace
/// (`config::project::prepare`: its `.zcode/acp`, which must exist to be
/// made read-only) and creates the missing state and cache directories the
/// policy makes writable.
fn policy_input(
    args: &RunArgs,
    platform: Platform,
) -> anyhow::Result<(PolicyInput, ManagedRoot, String, Option<PathBuf>)> {
    let allow = args
        .allow
        .iter()
        .map(|a| crate::policy::resolve::absolutize(a))
        .collect::<Result<Vec<_>, _>>()?;
    let workspaces = super::workspaces(&args.workspaces)?;
    // Arming records what the projects say that needs no approval (the
    // one place it is written); gathering then only reads.
    let managed = crate::config::managed::ManagedRoot::user_default()?;
    let mut reals = Vec::new();
    for ws in &workspaces {
        let real = crate::policy::resolve_real(ws).unwrap_or_else(|_| ws.clone());
        crate::config::project::prepare(&real, &managed);
        reals.push(real);
    }
    // What the last run in these workspaces listed, for the walks below
    // and the audit's to reuse where nothing changed since.
    let listings = saved_listings(&managed, &reals);
    if let Some(file) = &listings {
        crate::listing::load(file);
    }
    let gathered = super::gather_as_user(
        platform,
        &workspaces,
        &args.command,
        args.backend_profile.as_deref(),
        &allow,
    )?;
    let profile = gathered.backend.describe();
    tracing::debug!(backend_profile = %profile, "state the command may write");
    crate::policy::discover::create_writable_dirs(&gathered.input);
    Ok((gathered.input, gathered.managed, profile, listings))
}

/// Where the listings of the run in `workspaces` are saved (see
/// `listing::saved`): one file per set of workspaces, in the managed root
/// no sandbox can write.
fn saved_listings(managed: &ManagedRoot, workspaces: &[PathBuf]) -> Option<PathBuf> {
    let joined = workspaces
        .iter()
        .map(|w| w.as_os_str().to_owned())
        .collect::<Vec<_>>()
        .join(std::ffi::OsStr::new("\0"));
    let dir = managed.dir("listings").ok()?;
    Some(
        dir.join(crate::config::managed::project_key(std::path::Path::new(
            &joined,
        ))),
    )
}

/// Saves what this run listed for the next (a failure only costs the next
/// run its reading).
fn save_listings(file: Option<PathBuf>) {
    if let Some(file) = file {
        if let Err(e) = crate::listing::save(&file) {
            tracing::debug!(file = %file.display(), "cannot save the listings: {e}");
        }
    }
}

fn cannot_arm(why: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!(
        "cannot arm the sandbox: {why}; nothing was run (to run it unconfined on purpose, run the command without zcode-acp)"
    )
}

/// Arms this platform's sandbox for `args`, through the same arming as
/// the bridge's generations; with the managed root it used.
fn arm(
    args: &RunArgs,
    enforcer: Arc<dyn Enforce>,
    starter: Starter,
) -> anyhow::Result<(Confinement, ManagedRoot, Option<PathBuf>)> {
    let (input, managed, profile, listings) = policy_input(args, enforcer.platform())?;
    match Sandbox::Ready(enforcer).arm(input, &managed, profile, starter) {
        // Already said: "cannot arm the sandbox: ...".
        Confinement::Refused(why) => Err(anyhow::anyhow!(
            "{why}; nothing was run (to run it unconfined on purpose, run the command without zcode-acp)"
        )),
        armed => Ok((armed, managed, listings)),
    }
}

/// What the command leaves that your own tools would run later (a hidden
/// file of the project's, a `.git/commondir` that did not exist, a hook of
/// a new repository, a new agent hook): the audit the bridge makes when a
/// turn ends. Nobody is there to ask, so each is reverted, said on stderr,
/// and the command's version kept under `~/.zcode-acp/reverted/`.
struct Audit {
    baseline: crate::audit::Baseline,
    stash: crate::audit::stash::Stash,
}

impl Audit {
    fn before(policy: &crate::policy::Policy, managed: ManagedRoot) -> Audit {
        let roots: Vec<PathBuf> = policy
            .rules
            .iter()
            .filter(|r| r.root)
            .filter_map(|r| r.matcher.path())
            .map(PathBuf::from)
            .collect();
        let baseline = crate::audit::baseline(policy, &roots);
        for (path, why) in &baseline.unchecked {
            eprintln!(
                "zcode-acp: the audit cannot check everything in {}: {why}; what the command leaves there is not reverted",
                path.display()
            );
        }
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let stash = crate::audit::stash::Stash::new(
            &managed,
            &format!("run-{secs}-{}", std::process::id()),
        );
        Audit { baseline, stash }
    }

    /// Watches while the command runs, once it has run for
    /// [`WATCH_AFTER`]: what it leaves is undone as it is made (within the
    /// watcher's bound), as the bridge does between turns. A shorter
    /// command is covered by the look when it ends alone: a watcher costs
    /// more to stop (closing an inotify instance waits for the kernel's
    /// grace period, about 15 ms) than most commands take. The watcher's
    /// first look covers what came before it.
    fn watch(audit: &std::sync::Arc<std::sync::Mutex<Audit>>) -> Watching {
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let audit = audit.clone();
        let thread = std::thread::spawn(move || {
            if stopped.recv_timeout(WATCH_AFTER) != Err(std::sync::mpsc::RecvTimeoutError::Timeout)
            {
                return;
            }
            // Its first look covers what came before it.
            let watching = Audit::watch_now(&audit);
            // Until the command ends (the sender is dropped).
            let _ = stopped.recv();
            let WatchingNow { watcher, looker } = watching;
            // Dropping the watcher drops its sender, so the looker's loop ends.
            drop(watcher);
            let _ = looker.join();
        });
        Watching { stop, thread }
    }

    /// The watcher, and the thread that looks when it reports a change
    /// (on a thread of its own, so a long look never keeps the watcher
    /// from reading its events).
    fn watch_now(audit: &std::sync::Arc<std::sync::Mutex<Audit>>) -> WatchingNow {
        let targets = match audit.lock() {
            Ok(a) => a.baseline.watch_targets(),
            Err(_) => Default::default(),
        };
        let (tx, rx) = std::sync::mpsc::channel::<Vec<PathBuf>>();
        let shared = audit.clone();
        let looker = std::thread::spawn(move || {
            while let Ok(mut dirty) = rx.recv() {
                while let Ok(more) = rx.try_recv() {
                    dirty.extend(more);
                }
                if let Ok(mut a) = shared.lock() {
                    a.look(&dirty);
                }
            }
        });
        let watcher = crate::audit::watch::Watcher::start(targets, move |dirty| {
            let _ = tx.send(dirty);
        });
        if let Some(why) = &watcher.degraded {
            eprintln!(
                "zcode-acp: the audit cannot watch everything for changes ({why}); it looks every {} s while the command runs",
                crate::audit::watch::POLL.as_secs()
            );
        }
        WatchingNow { watcher, looker }
    }

    /// Looks, and undoes what it finds: nobody is there to ask, so each is
    /// reverted, said on stderr, and the command's version kept.
    fn look(&mut self, dirty: &[PathBuf]) {
        let findings = self.baseline.audit_with(dirty);
        // A flood of findings is said in a few lines, all undone.
        let total = findings.len();
        for (i, f) in findings.into_iter().enumerate() {
            let quiet = i >= MAX_SAID;
            if i == MAX_SAID {
                eprintln!(
                    "zcode-acp: and {} more left by the command, each reverted the same way (see the index in ~/.zcode-acp/reverted)",
                    total - MAX_SAID
                );
            }
            if f.blind {
                self.baseline.said_blind(&f);
                eprintln!(
                    "zcode-acp: the audit cannot look at {}: {}; what the command left there is not checked: look at it before you run anything there",
                    f.path.display(),
                    f.what
                );
                continue;
            }
            if f.revert.is_none() {
                if !quiet {
                    eprintln!(
                        "zcode-acp: {} was left by the command: {}; it was not changed (undoing it would touch what is yours): look at it before you run anything there",
                        f.path.display(),
                        f.what
                    );
                }
                continue;
            }
            // Undone whether or not the command's version could be kept.
            let undone = self.stash.undo(&f, true);
            let kept = match (&undone.kept_at, &undone.not_kept) {
                (Some(at), _) => format!("; the command's version is kept in {}", at.display()),
                (None, Some(why)) => format!("; the command's version could not be kept: {why}"),
                (None, None) => String::new(),
            };
            match undone.reverted {
                Ok(()) if quiet => {}
                Ok(()) => eprintln!("zcode-acp: reverted {}: {}{kept}", f.path.display(), f.what),
                Err(e) => eprintln!(
                    "zcode-acp: could not revert {} ({e}): {}{kept}; look at it before you run anything there",
                    f.path.display(),
                    f.what
                ),
            }
        }
    }

    /// The last look, once the command and everything it started ended:
    /// the watcher stops, the looker finishes what it was sent, and one
    /// full look covers whatever came after.
    fn after(audit: std::sync::Arc<std::sync::Mutex<Audit>>, watching: Watching) {
        let Watching { stop, thread } = watching;
        drop(stop);
        let _ = thread.join();
        // A look that panicked is no reason to skip the last one.
        audit
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .look(&[]);
    }
}

/// How long a command runs before the audit watches it (see
/// `Audit::watch`): well within the second the audit promises.
const WATCH_AFTER: std::time::Duration = std::time::Duration::from_millis(300);

/// The thread that starts watching once the command has run a while, and
/// stops when told (its sender dropped).
struct Watching {
    stop: std::sync::mpsc::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

/// The watcher and the thread that looks when it reports a change.
struct WatchingNow {
    watcher: crate::audit::watch::Watcher,
    looker: std::thread::JoinHandle<()>,
}

/// Findings said one per line; the rest are counted in one line (all are
/// undone and indexed alike).
const MAX_SAID: usize = 50;

fn command(args: &RunArgs) -> Command {
    Command {
        argv: args.command.clone(),
        ..Command::default()
    }
}

/// Runs the command sandboxed; returns its exit code. Must be called
/// before any thread is started: the launcher unshares namespaces.
#[cfg(target_os = "linux")]
pub fn run(args: RunArgs) -> anyhow::Result<i32> {
    use crate::linux::enforce::LinuxEnforcer;
    use nix::unistd::{fork, ForkResult};
    // The sockets bound in the machine's other network namespaces are
    // read beside the policy (see `listening::prefetch`); the plan takes
    // them.
    crate::linux::listening::prefetch();
    // Not probed: the launcher arms what this machine allows, and says
    // what it could not (see `LinuxEnforcer::unprobed`).
    let (enforcer, probed) = match LinuxEnforcer::unprobed() {
        Some(enforcer) => (enforcer, false),
        None => (LinuxEnforcer::probe().map_err(cannot_arm)?, true),
    };
    let (confinement, managed, listings) = arm(&args, Arc::new(enforcer), Starter::ThisProcess)?;
    let Confinement::Armed(armed) = &confinement else {
        return Err(cannot_arm("the sandbox did not arm"));
    };
    let mut spec = enforcer.spec(armed, &command(&args));
    if !probed {
        spec = spec.level_left_to_the_launcher();
    }
    // The command's refused writes are named when it ends.
    if wants_refusals_line(&args) {
        spec = spec.noting_refusals(&armed.policy);
    }
    // And what it sent where, when it has a network of its own.
    let ledger = spec.network.as_ref().and_then(|_| {
        let name = crate::confine::network_ledger_name(&crate::confine::network_asks_name());
        match crate::network::ledger::Source::bind(&name) {
            Ok(source) => {
                spec.network_ledger = Some(name);
                Some(source)
            }
            Err(e) => {
                eprintln!("zcode-acp: what the command sends over the network is not counted: cannot listen for the proxy's counts ({e})");
                None
            }
        }
    });
    // The socket scan's thread was joined when the plan was made.
    if !crate::linux::exec::wait_until_single_threaded() {
        return Err(cannot_arm(
            "zcode-acp run has more than one thread, so it cannot fork the sandbox's launcher (a bug in zcode-acp: please report it)",
        ));
    }
    // Where the launcher says whether the command got a network of its
    // own: only then are the counts said (see `says_its_network`).
    let (its_network, says_its_network) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK)?;
    // The launcher sets the sandbox up while this process takes the
    // audit's baseline, and runs nothing of the command's before it is
    // told the baseline is whole (see `LaunchSpec::waits_for_go`).
    let (waits_for_go, go) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    let shield = super::shield::Shield::raise()?;
    // The launcher enters the sandbox's namespaces itself, so it runs in a
    // child: this process stays outside, to audit what the command left.
    // SAFETY: single-threaded (checked above), so the child may run anything.
    let child = match unsafe { fork() }? {
        ForkResult::Child => {
            let _ = shield.old.thread_set_mask();
            drop(its_network);
            drop(go);
            spec.says_its_network = Some(std::os::fd::AsRawFd::as_raw_fd(&says_its_network));
            spec.waits_for_go = Some(std::os::fd::IntoRawFd::into_raw_fd(waits_for_go));
            let code = match crate::linux::exec::run(&spec) {
                Ok(code) => code,
                Err(e) => {
                    eprintln!("zcode-acp: {:#}", cannot_arm(e));
                    126
                }
            };
            std::process::exit(code);
        }
        ForkResult::Parent { child } => child,
    };
    drop(says_its_network);
    drop(waits_for_go);
    // The tests' stand-in for a slow baseline (a large workspace): the
    // command must still start after it.
    if std::env::var_os("ZCODE_ACP_TEST_SLOW_BASELINE").is_some() {
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    let audit = std::sync::Arc::new(std::sync::Mutex::new(Audit::before(&armed.policy, managed)));
    // The baseline is whole: the command may start. (A launcher that
    // ended already is found by the wait below.)
    let _ = nix::unistd::write(&go, &[1]);
    drop(go);
    // The watcher's thread starts only now: the launcher forked above had
    // to be single-threaded.
    let watcher = Audit::watch(&audit);
    let counting = ledger.map(crate::network::ledger::Collector::start);
    let code = shield.wait(child)?;
    Audit::after(audit, watcher);
    save_listings(listings);
    // Written before the command started, by a launcher that has ended.
    let mut said = [0u8; 1];
    let own_network = nix::unistd::read(&its_network, &mut said) == Ok(1)
        && said[0] == crate::linux::exec::OWN_NETWORK;
    if let Some(counting) = counting {
        let counted = counting.finish();
        if own_network {
            say_what_left(counted, &armed.policy.network.listed);
        }
    }
    drop(shield);
    Ok(code)
}

/// Whether the run watches for refused writes: asked for, or by default
/// when stderr is a terminal (a person reads the line there; a script's
/// log gains nothing worth its cost: on Linux a round trip per call, on
/// macOS a `log stream` and two fences).
fn wants_refusals_line(args: &RunArgs) -> bool {
    use std::io::IsTerminal;
    !args.no_refusals_line && (args.refusals_line || std::io::stderr().is_terminal())
}

/// What the command sent through the sandbox's proxy, beyond the agent's
/// own API: one line, and one per destination.
#[cfg(any(target_os = "linux", target_os = "macos"))]
fn say_what_left(ledger: crate::network::ledger::Ledger, listed: &[String]) {
    let own = crate::policy::egress::own_hosts(listed);
    if let Some((title, lines)) = ledger.summary(&own, "this run") {
        eprintln!("zcode-acp: {title}");
        for line in lines {
            eprintln!("  {line}");
        }
    }
}

/// Runs the command under `sandbox-exec` with a profile written for this
/// run (removed when it ends); returns its exit code, or 128 + the signal
/// that ended it, as a shell would.
#[cfg(target_os = "macos")]
pub fn run(args: RunArgs) -> anyhow::Result<i32> {
    use std::os::unix::process::CommandExt;
    // Raised first, before any thread exists (the proxy's, the audit's,
    // the ledger's): they inherit the mask, so a ^C or SIGTERM is held for
    // the command wherever it lands, and never ends `run` before its last
    // look (or leaves `log stream` behind).
    let shield = super::shield::Shield::raise()?;
    let enforcer = Arc::new(crate::seatbelt::enforce::SeatbeltEnforcer::new().map_err(cannot_arm)?);
    let (confinement, managed, listings) = arm(&args, enforcer.clone(), Starter::Spawned)?;
    let Confinement::Armed(armed) = &confinement else {
        return Err(cannot_arm("the sandbox did not arm"));
    };
    let argv = confinement
        .wrap(&command(&args), Launch::Backend)
        .map_err(cannot_arm)?;
    // What the command sends through the proxy (nobody is asked here: a
    // refusal is final, and says how to allow the destination).
    let proxy = armed.outside.as_ref().and_then(|o| {
        o.as_any()
            .downcast_ref::<crate::network::outside::OutsideProxy>()
    });
    let counting = proxy.and_then(|proxy| match proxy.ledger() {
        Ok(source) => Some(crate::network::ledger::Collector::start(source)),
        Err(e) => {
            eprintln!("zcode-acp: what the command sends over the network is not counted: {e}");
            None
        }
    });
    let audit = std::sync::Arc::new(std::sync::Mutex::new(Audit::before(&armed.policy, managed)));
    let watcher = Audit::watch(&audit);
    // The command's refused writes are named when it ends, from the
    // system log (read from before the command starts).
    let fence = |path: &std::path::Path| make_fence(&confinement, path);
    let refusal_log = match (
        wants_refusals_line(&args),
        enforcer.violation_tag(),
        &armed.dir,
    ) {
        (true, Some(tag), Some(dir)) => {
            match crate::seatbelt::refusal_log::RefusalLog::start(tag, &dir.path, &fence) {
                Ok(log) => Some(log),
                Err(e) => {
                    eprintln!("zcode-acp: the writes the sandbox refuses will not be named when the command ends: {e}");
                    None
                }
            }
        }
        _ => None,
    };
    let old = shield.old;
    let mut cmd = std::process::Command::new(&argv[0]);
    cmd.args(&argv[1..]);
    // SAFETY: only the signal mask is set back in the child, with a call
    // that is async-signal-safe.
    unsafe {
        cmd.pre_exec(move || old.thread_set_mask().map_err(std::io::Error::from));
    }
    let child = cmd
        .spawn()
        .map_err(|e| anyhow::anyhow!("cannot start {}: {e}", argv[0]))?;
    let code = shield.wait(nix::unistd::Pid::from_raw(child.id() as i32))?;
    if let Some(log) = refusal_log {
        let read = log.finish(&fence);
        let mut refused = crate::policy::refused::Refusals::default();
        for v in read.refused {
            refused.note(&armed.policy, v.path);
        }
        let partial = if read.whole {
            ""
        } else {
            " (the system log had not reported them all when the command ended: there may be more)"
        };
        if let Some(line) = refused.line(dirs::home_dir().as_deref()) {
            eprintln!("{line}{partial}");
        } else if !read.whole {
            eprintln!("zcode-acp: the system log had not reported every write the sandbox refused when the command ended: none is named");
        }
    }
    if let Some(counting) = counting {
        // What the command's connections had under way is counted as
        // they end (they end with the command, or are cut off here).
        if let Some(proxy) = proxy {
            proxy.settle(std::time::Duration::from_secs(1));
        }
        say_what_left(counting.finish(), &armed.policy.network.listed);
    }
    drop(confinement);
    Audit::after(audit, watcher);
    save_listings(listings);
    drop(shield);
    Ok(code)
}

/// A write into the run's private directory under its own profile, which
/// Seatbelt refuses and reports with the run's tag: a fence for the log
/// (see `seatbelt::refusal_log`). Its outcome is the report, not the
/// status.
#[cfg(target_os = "macos")]
fn make_fence(confinement: &Confinement, path: &std::path::Path) {
    let touch = Command {
        argv: vec!["/usr/bin/touch".into(), path.to_string_lossy().into_owned()],
        ..Command::default()
    };
    let Ok(argv) = confinement.wrap(&touch, Launch::Backend) else {
        return;
    };
    let _ = std::process::Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
}
