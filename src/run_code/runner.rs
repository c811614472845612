//! One call, one run: check the call, stage its directory, start it under
//! the server's confinement, watch its clock and its tree's memory, read
//! its output bounded, collect its output files, remove its directory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;

use super::capture::Captured;
use super::confinement::Confiner;
use super::interpreters::{self, Found};
use super::request::{self, Language, RunRequest};
use super::result::{ErrorCode, RunError, RunResult};
use super::settings::{Limits, RunCodeSettings};
use super::stage::{self, CallDir};
use super::tools::rpc::{Caller, RpcServer};
use super::tools::{self, ToolLimits, ToolSpec, Toolbox};
use super::tree;

/// How often the tree's resident memory is read.
const WATCH_EVERY: Duration = Duration::from_millis(20);
/// How long the output pipes may stay open after the run ended (held by
/// something the run left, which the sandbox has already ended).
const DRAIN_GRACE: Duration = Duration::from_secs(2);

/// Names always passed from the server's environment, when set.
const BASE_ENV: &[&str] = &["PATH", "LANG", "TZ"];
const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";
/// How long an interpreter probe may take, and what of its output is kept.
const PROBE_TIMEOUT: Duration = Duration::from_secs(15);
const PROBE_OUTPUT: usize = 4096;

pub struct Runner {
    workspace: PathBuf,
    settings: RunCodeSettings,
    limits: Limits,
    confiner: Confiner,
    /// The code's search path (the server's), also used to find interpreters.
    path: String,
    languages: tokio::sync::OnceCell<BTreeMap<Language, Found>>,
    temp_base: PathBuf,
    /// The session's MCP servers, when they were given (`--servers`).
    tools: Option<Arc<Toolbox>>,
    tool_limits: ToolLimits,
}

impl Runner {
    pub fn new(workspace: PathBuf, settings: RunCodeSettings, confiner: Confiner) -> Runner {
        // Its real path: Seatbelt matches real paths (`/private/var/...`
        // for macOS's `/var/folders/...`), and a run's socket is named in it.
        let temp_base = std::env::temp_dir();
        let temp_base = std::fs::canonicalize(&temp_base).unwrap_or(temp_base);
        stage::sweep_stale(&temp_base);
        Runner {
            workspace,
            limits: settings.limits(),
            settings,
            confiner,
            path: std::env::var("PATH")
                .ok()
                .filter(|p| !p.is_empty())
                .unwrap_or_else(|| DEFAULT_PATH.into()),
            languages: tokio::sync::OnceCell::new(),
            temp_base,
            tools: None,
            tool_limits: ToolLimits::default(),
        }
    }

    /// Offers the session's MCP servers' tools to runs that list them.
    pub fn with_tools(mut self, tools: Toolbox, limits: ToolLimits) -> Runner {
        self.tools = Some(Arc::new(tools));
        self.tool_limits = limits;
        self
    }

    pub fn tools(&self) -> Option<&Toolbox> {
        self.tools.as_deref()
    }

    pub fn tool_limits(&self) -> ToolLimits {
        self.tool_limits
    }

    pub fn workspace(&self) -> &Path {
        &self.workspace
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// What confines runs, as results name it.
    pub fn confinement(&self) -> String {
        self.confiner.label()
    }

    /// Every language and its interpreter, probed on first use.
    pub async fn languages(&self) -> &BTreeMap<Language, Found> {
        self.languages
            .get_or_init(|| {
                interpreters::probe_all(&self.settings, &self.path, |argv| self.probe(argv))
            })
            .await
    }

    /// Runs one interpreter probe (`python3 --version`) confined as a run
    /// is, with nothing but PATH; its first line of output.
    async fn probe(&self, argv: Vec<String>) -> Result<Option<String>, String> {
        let command = crate::confine::Command {
            argv,
            env: vec![("PATH".into(), self.path.clone())],
            cwd: Some(self.workspace.clone()),
        };
        // The workspace stands in for a run's own directory: nothing more
        // becomes writable for a probe.
        let prepared = self
            .confiner
            .prepare(&self.workspace, &[], command)
            .map_err(|why| format!("it cannot be confined here: {why}"))?;
        let mut child = self
            .spawn(&prepared, false, None)
            .map_err(|e| e.to_string())?;
        // A probe is bounded like a run: its output, its clock, its tree.
        let mut guard = EndOnDrop(child.id().map(|p| p as i32));
        let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
            return Err("its output cannot be read".into());
        };
        let read = async {
            tokio::join!(
                super::capture::read_bounded(stdout, PROBE_OUTPUT),
                super::capture::read_bounded(stderr, PROBE_OUTPUT),
                child.wait(),
            )
        };
        let (out, err, status) = tokio::time::timeout(PROBE_TIMEOUT, read)
            .await
            .map_err(|_| format!("it did not answer within {} s", PROBE_TIMEOUT.as_secs()))?;
        guard.0 = None;
        let status = status.map_err(|e| e.to_string())?;
        if !status.success() {
            let err = String::from_utf8_lossy(&err.kept);
            return Err(format!(
                "{status} ({})",
                err.lines().last().unwrap_or("").trim()
            ));
        }
        Ok(interpreters::first_line(&out.kept, &err.kept))
    }

    /// Runs one call. Every outcome is a result: refusals are results with
    /// an error code, never protocol errors, so the model reads them.
    pub async fn run(&self, args: &serde_json::Value) -> RunResult {
        let language = args
            .get("language")
            .and_then(|l| l.as_str())
            .unwrap_or("")
            .to_owned();
        let refuse = |code, message: String| {
            RunResult::refused(&language, self.confinement(), code, message)
        };
        let limits = self.limits;
        let request = match request::parse(args, limits.default_timeout_ms, limits.max_timeout_ms) {
            Ok(r) => r,
            Err(why) => return refuse(ErrorCode::BadRequest, why),
        };
        if let Some(why) = self.confiner.refusal() {
            return refuse(
                ErrorCode::NoConfinement,
                format!("{why}; no sandbox can be armed here, so nothing runs (to accept unconfined runs, set \"runCode\": {{\"allowUnconfined\": true}} in the user config)"),
            );
        }
        let found = self.languages().await.get(&request.language).cloned();
        let Some(found) = found else {
            return refuse(ErrorCode::NoInterpreter, "not probed".into());
        };
        if found.disabled {
            return refuse(
                ErrorCode::LanguageDisabled,
                format!(
                    "{} is disabled in the user config (runCode.disable)",
                    request.language
                ),
            );
        }
        if !found.available {
            return refuse(
                ErrorCode::NoInterpreter,
                found.reason.unwrap_or_else(|| "no interpreter".into()),
            );
        }
        if request.language.is_shell() {
            if let Some(verb) = super::egress::denied_verb(&request.source) {
                return refuse(
                    ErrorCode::EgressDenied,
                    format!("`{verb}` reaches outside this machine on your behalf, which run_code does not run (a guard-rail against accidents); ask the user to run it"),
                );
            }
        }
        let specs = if request.tools.is_empty() {
            Vec::new()
        } else {
            let Some(tools) = &self.tools else {
                return refuse(
                    ErrorCode::UnknownTool,
                    "this server was given no tools: the session's MCP servers reach run_code when zcode-acp's bridge starts it (or `zcode-acp mcp --servers FILE`)".into(),
                );
            };
            match tools.specs(&request.tools).await {
                Ok(specs) => specs,
                Err(why) => return refuse(ErrorCode::UnknownTool, why),
            }
        };
        self.run_checked(request, found.interpreter, specs).await
    }

    async fn run_checked(
        &self,
        request: RunRequest,
        interpreter: Vec<String>,
        specs: Vec<ToolSpec>,
    ) -> RunResult {
        let language = request.language;
        let mut result = RunResult::refused(
            language.name(),
            self.confinement(),
            ErrorCode::Internal,
            String::new(),
        );
        result.error = None;
        let call = match CallDir::create(&self.temp_base, &request, &self.workspace) {
            Ok(c) => c,
            Err(e) => {
                result.error = Some(RunError {
                    code: ErrorCode::Internal,
                    message: format!(
                        "cannot prepare the run's directory in {}: {e}",
                        self.temp_base.display()
                    ),
                });
                return result;
            }
        };
        let mut argv = interpreter.clone();
        argv.push(call.source.to_string_lossy().into_owned());
        let mut env = self.code_env(language);
        env.extend(call.env(&self.workspace));
        // The tools server lives from here until the run has ended.
        let rpc = match self.serve_tools(&call, language, &request.tools, specs) {
            Ok(rpc) => rpc,
            Err(e) => {
                result.error = Some(RunError {
                    code: ErrorCode::Internal,
                    message: format!("cannot give the run its tools: {e}"),
                });
                return result;
            }
        };
        if let Some((path, server)) = &rpc {
            env.push((
                tools::SOCKET_ENV.into(),
                path.to_string_lossy().into_owned(),
            ));
            // Only in the run's environment (passed to the sandbox in its
            // sealed launch spec): never on disk, where other runs read.
            env.push((tools::TOKEN_ENV.into(), server.token().to_owned()));
        }
        let command = crate::confine::Command {
            argv,
            env,
            cwd: Some(self.workspace.clone()),
        };
        let served: Vec<PathBuf> = rpc.iter().map(|(path, _)| path.clone()).collect();
        let prepared = match self.confiner.prepare(&call.path, &served, command) {
            Ok(p) => p,
            Err(why) => {
                result.error = Some(RunError {
                    code: ErrorCode::NoConfinement,
                    message: format!("the sandbox could not be armed for this run: {why}"),
                });
                return result;
            }
        };
        result.interpreter = interpreter;
        let address_space = request
            .language
            .takes_address_space_limit()
            .then_some(self.limits.memory_bytes);
        let watched = match self.spawn(&prepared, request.stdin.is_some(), address_space) {
            Ok(child) => self.watch(child, &request).await,
            Err(e) => {
                result.error = Some(RunError {
                    code: ErrorCode::Internal,
                    message: format!("cannot start {}: {e}", prepared.argv[0]),
                });
                return result;
            }
        };
        drop(prepared);
        if let Some((_, server)) = rpc {
            let outcome = server.finish().await;
            result.result = outcome.result;
            result.logs = outcome.logs;
            result.tool_calls = Some(outcome.calls);
        }
        self.finish(&mut result, watched, language);
        // Reading the outputs and removing the directory can take a while
        // (a run may leave a huge tree): off the server's thread.
        let (file_cap, total_cap) = (
            self.limits.output_file_bytes,
            self.limits.outputs_total_bytes,
        );
        let outputs = tokio::task::spawn_blocking(move || {
            let outputs = stage::collect_outputs(&call, file_cap, total_cap);
            drop(call);
            outputs
        })
        .await;
        result.outputs = Some(outputs.unwrap_or_default());
        result
    }

    /// The stubs and the socket of a run that listed tools.
    fn serve_tools(
        &self,
        call: &CallDir,
        language: Language,
        names: &[String],
        specs: Vec<ToolSpec>,
    ) -> std::io::Result<Option<(PathBuf, RpcServer)>> {
        let Some(caller) = self.tools.clone().filter(|_| !names.is_empty()) else {
            return Ok(None);
        };
        tools::write_stubs(&call.path, language, &specs)?;
        let path = call.path.join(tools::SOCKET_NAME);
        let allowed = names.iter().cloned().collect();
        let caller: Arc<dyn Caller> = caller;
        let server = RpcServer::start(&path, allowed, caller, self.tool_limits)?;
        // Said where the code's author reads: a group or tool the stub
        // calls otherwise than its server does.
        if !language.is_shell() {
            for renamed in tools::stubs::renames(&specs) {
                server.note(format!("zcode-acp: {renamed}"));
            }
        }
        Ok(Some((path, server)))
    }

    /// The code's environment: an allowlist, never inherited.
    fn code_env(&self, language: Language) -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> = vec![("PATH".into(), self.path.clone())];
        for name in BASE_ENV
            .iter()
            .skip(1)
            .copied()
            .chain(self.settings.env.iter().map(String::as_str))
        {
            if env.iter().any(|(k, _)| k == name) {
                continue;
            }
            if let Ok(v) = std::env::var(name) {
                env.push((name.to_owned(), v));
            }
        }
        // Inside a sandbox, the way out is its proxy, which the sandbox
        // named in this server's environment; a run that arms a network
        // of its own is pointed at its own proxy by its helper.
        if self.confiner.inherits_a_sandbox() {
            let inherited: Vec<(String, String)> = crate::network::PROXY_VARS
                .iter()
                .filter_map(|name| Some((name.to_string(), std::env::var(name).ok()?)))
                .collect();
            // An agent that filtered them out (codex does, for its MCP
            // servers): on Linux the proxy's port is fixed; on macOS it
            // is the arming's, and code that cannot name it reaches nothing.
            #[cfg(target_os = "linux")]
            if inherited.is_empty() && crate::linux::net::in_a_sandbox_network() {
                env.extend(crate::linux::net::proxy_env());
            }
            env.extend(inherited);
        }
        if !language.takes_address_space_limit() {
            // Node's heap: its own ceiling, below the tree's.
            let heap = format!("--max-old-space-size={}", self.limits.memory_bytes >> 20);
            match env.iter_mut().find(|(k, _)| k == "NODE_OPTIONS") {
                Some((_, v)) => {
                    v.push(' ');
                    v.push_str(&heap);
                }
                None => env.push(("NODE_OPTIONS".into(), heap)),
            }
        }
        env
    }

    /// Starts a prepared command: a cleared environment but for what the
    /// confinement passes, no core dumps, the address-space limit where
    /// it applies, and the launch spec as fd 3.
    fn spawn(
        &self,
        prepared: &super::confinement::Prepared,
        with_stdin: bool,
        address_space: Option<u64>,
    ) -> std::io::Result<tokio::process::Child> {
        use std::os::fd::AsRawFd;
        use std::process::Stdio;
        let mut cmd = tokio::process::Command::new(&prepared.argv[0]);
        cmd.args(&prepared.argv[1..])
            .env_clear()
            .envs(prepared.env.iter().map(|(k, v)| (k, v)))
            .current_dir(&self.workspace)
            .stdin(if with_stdin {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let spec_fd = prepared.spec_fd.as_ref().map(|f| f.as_raw_fd());
        let unconfined = self.confiner.is_unconfined();
        // SAFETY: the closure runs between fork and exec and calls only
        // async-signal-safe functions (setrlimit, dup2, fcntl, setsid).
        unsafe {
            cmd.pre_exec(move || {
                let none = libc::rlimit {
                    rlim_cur: 0,
                    rlim_max: 0,
                };
                libc::setrlimit(libc::RLIMIT_CORE, &none);
                if let Some(bytes) = address_space {
                    let limit = libc::rlimit {
                        rlim_cur: bytes,
                        rlim_max: bytes,
                    };
                    if libc::setrlimit(libc::RLIMIT_AS, &limit) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                if let Some(fd) = spec_fd {
                    if fd == 3 {
                        let flags = libc::fcntl(3, libc::F_GETFD);
                        libc::fcntl(3, libc::F_SETFD, flags & !libc::FD_CLOEXEC);
                    } else if libc::dup2(fd, 3) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                if unconfined {
                    libc::setsid();
                }
                Ok(())
            });
        }
        cmd.spawn()
    }

    async fn watch(&self, mut child: tokio::process::Child, request: &RunRequest) -> Watched {
        let started = Instant::now();
        let pid = child.id().map(|p| p as i32);
        // A call abandoned mid-run (cancelled, or the server going away)
        // drops this future: the whole tree goes with it, not only the
        // process tokio would kill.
        let mut abandoned = EndOnDrop(pid);
        if let (Some(mut stdin), Some(input)) = (child.stdin.take(), request.stdin.clone()) {
            tokio::spawn(async move {
                let _ = stdin.write_all(input.as_bytes()).await;
            });
        }
        let cap = self.limits.output_bytes;
        let stdout = Arc::new(Mutex::new(Captured::default()));
        let stderr = Arc::new(Mutex::new(Captured::default()));
        let readers = [
            child
                .stdout
                .take()
                .map(|r| spawn_reader(r, cap, stdout.clone())),
            child
                .stderr
                .take()
                .map(|r| spawn_reader(r, cap, stderr.clone())),
        ];
        let deadline = tokio::time::Instant::now() + Duration::from_millis(request.timeout_ms);
        let watchdog = pid.map(|pid| Watchdog::start(pid, self.limits.memory_bytes));
        let mut timed_out = false;
        let status = loop {
            tokio::select! {
                status = child.wait() => break status.ok(),
                _ = tokio::time::sleep_until(deadline), if !timed_out => {
                    timed_out = true;
                    // Off this thread: a large tree takes a while to end,
                    // and the server keeps answering meanwhile.
                    if let Some(pid) = pid {
                        tokio::task::spawn_blocking(move || tree::end(pid));
                    }
                }
            }
        };
        abandoned.0 = None;
        let (over, peak) = watchdog.map(Watchdog::stop).unwrap_or((None, 0));
        let ended_by = match (over, timed_out) {
            (Some(bytes), _) => Some(Ended::Memory(bytes)),
            (None, true) => Some(Ended::Timeout),
            (None, false) => None,
        };
        let duration = started.elapsed();
        if self.confiner.is_unconfined() {
            // Its process group, which it leads: what stayed in it goes too.
            if let Some(pid) = pid {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        let drained = tokio::time::timeout(DRAIN_GRACE, async {
            for r in readers.into_iter().flatten() {
                let _ = r.await;
            }
        })
        .await
        .is_ok();
        let take = |c: &Arc<Mutex<Captured>>| c.lock().map(|c| c.clone()).unwrap_or_default();
        Watched {
            status,
            ended_by,
            duration,
            stdout: take(&stdout),
            stderr: take(&stderr),
            drained,
            peak,
        }
    }

    fn finish(&self, result: &mut RunResult, w: Watched, language: Language) {
        use std::os::unix::process::ExitStatusExt;
        result.duration_ms = w.duration.as_millis() as u64;
        result.stdout = w.stdout.text("stdout");
        result.stderr = w.stderr.text("stderr");
        if !w.drained {
            result.stderr.push_str("\n[zcode-acp: output still held open by a process the run left behind; stopped reading]\n");
        }
        result.truncated = w.stdout.truncated() || w.stderr.truncated();
        let confined = !matches!(self.confiner, Confiner::Unconfined | Confiner::Inherited(_));
        let (code, signal) = match w.status {
            Some(s) => match (s.code(), s.signal()) {
                // The sandbox helper reports a signal as 128 + its number,
                // as a shell does.
                (Some(c), _) if confined && (129..=192).contains(&c) => {
                    (None, Some(signal_name(c - 128)))
                }
                (Some(c), _) => (Some(c), None),
                (None, Some(sig)) => (None, Some(signal_name(sig))),
                (None, None) => (None, None),
            },
            None => (None, None),
        };
        result.exit_code = code;
        result.signal = signal;
        let mib = self.limits.memory_bytes >> 20;
        match w.ended_by {
            Some(Ended::Timeout) => {
                result.timed_out = true;
                result.exit_code = None;
                result.signal = Some("SIGKILL".into());
                result.error = Some(RunError {
                    code: ErrorCode::Timeout,
                    message: "the run reached its wall-clock ceiling and its whole process tree was ended; ask for a longer timeoutMs or do less per call".into(),
                });
            }
            Some(Ended::Memory(rss)) => {
                result.exit_code = None;
                result.signal = Some("SIGKILL".into());
                result.error = Some(RunError {
                    code: ErrorCode::Memory,
                    message: format!("the run held {} MiB (its processes' memory, memfds and private temp files), past the memory ceiling of {mib} MiB; its whole process tree was ended", rss >> 20),
                });
            }
            None if code != Some(0) && ran_out_of_memory(language, &result.stderr) => {
                result.error = Some(RunError {
                    code: ErrorCode::Memory,
                    message: format!("the run reached its memory ceiling of {mib} MiB (an allocation was refused)"),
                });
            }
            None if confined && code == Some(126) && result.stderr.starts_with("zcode-acp") => {
                result.error = Some(RunError {
                    code: ErrorCode::NoConfinement,
                    message: format!(
                        "the sandbox could not be armed for this run: {}",
                        result.stderr.lines().next().unwrap_or_default()
                    ),
                });
            }
            None => {}
        }
        tracing::debug!(peak_rss = w.peak, "run ended");
        result.ok = result.error.is_none() && result.exit_code == Some(0);
        if self.confiner.is_unconfined() {
            result.warning = Some(super::result::UNCONFINED.into());
        }
    }
}

/// A run's memory watchdog: a thread of its own, so that measuring a
/// large tree (many processes, many descriptors) never holds up the
/// server's clock, its other calls or a cancellation.
struct Watchdog {
    stop: Arc<std::sync::atomic::AtomicBool>,
    over: Arc<Mutex<Option<u64>>>,
    peak: Arc<std::sync::atomic::AtomicU64>,
}

impl Watchdog {
    fn start(pid: i32, limit: u64) -> Watchdog {
        use std::sync::atomic::Ordering;
        let w = Watchdog {
            stop: Arc::default(),
            over: Arc::default(),
            peak: Arc::default(),
        };
        let (stop, over, peak) = (w.stop.clone(), w.over.clone(), w.peak.clone());
        let spawned = std::thread::Builder::new()
            .name("run-watchdog".into())
            .spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let held = tree::memory_bytes(pid);
                    peak.fetch_max(held, Ordering::Relaxed);
                    if held > limit && !stop.load(Ordering::Relaxed) {
                        // Said before the tree is ended: whoever sees the
                        // run end sees why.
                        if let Ok(mut o) = over.lock() {
                            *o = Some(held);
                        }
                        tree::end(pid);
                        return;
                    }
                    std::thread::sleep(WATCH_EVERY);
                }
            });
        if let Err(e) = spawned {
            tracing::warn!("the run's memory watchdog cannot start ({e}); only the clock ends it");
        }
        w
    }

    /// Stops watching; what the run held past the ceiling, if it did, and
    /// the most it held.
    fn stop(self) -> (Option<u64>, u64) {
        use std::sync::atomic::Ordering;
        self.stop.store(true, Ordering::Relaxed);
        let over = self.over.lock().map(|o| *o).unwrap_or(None);
        (over, self.peak.load(Ordering::Relaxed))
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        // Also when the call is abandoned: the thread ends at its next look.
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Ends a run's tree when dropped while it is still set.
struct EndOnDrop(Option<i32>);

impl Drop for EndOnDrop {
    fn drop(&mut self) {
        if let Some(pid) = self.0 {
            tree::end(pid);
        }
    }
}

/// How a run was ended by the watcher.
enum Ended {
    Timeout,
    Memory(u64),
}

struct Watched {
    status: Option<std::process::ExitStatus>,
    ended_by: Option<Ended>,
    duration: Duration,
    stdout: Captured,
    stderr: Captured,
    drained: bool,
    peak: u64,
}

fn spawn_reader<R>(reader: R, cap: usize, into: Arc<Mutex<Captured>>) -> tokio::task::JoinHandle<()>
where
    R: tokio::io::AsyncRead + Unpin + Send + 'static,
{
    tokio::spawn(async move { super::capture::read_into(reader, cap, &into).await })
}

/// Whether the interpreter said an allocation was refused (the address
/// space limit, or node's heap flag).
fn ran_out_of_memory(language: Language, stderr: &str) -> bool {
    match language {
        Language::Python => stderr.contains("MemoryError"),
        Language::Node | Language::Typescript => {
            stderr.contains("heap out of memory") || stderr.contains("Allocation failed")
        }
        Language::Bash | Language::Sh => {
            stderr.contains("Cannot allocate memory")
                || stderr.contains("cannot allocate memory")
                || stderr.contains("xmalloc")
        }
    }
}

fn signal_name(n: i32) -> String {
    nix::sys::signal::Signal::try_from(n)
        .map(|s| s.as_str().to_owned())
        .unwrap_or_else(|_| format!("signal {n}"))
}
