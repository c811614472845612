//! Issue 14's spawn, start-up, re-arm and file-heavy rows: each against
//! the same work done bare (or unarmed) in the same run, alternating so
//! drift hits both columns alike.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::{median, Bridged, BIN};

const FAKE_AGENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/fake_agent.py");

/// Where a row works: `home` and `ws` in a scratch directory (never /tmp,
/// which the sandbox keeps private and writable), and the fake
/// agent's state in /tmp (writable to an armed agent before it has any
/// workspace, as an agent's own state is).
struct Place {
    _dirs: (tempfile::TempDir, tempfile::TempDir),
    home: PathBuf,
    ws: PathBuf,
    state: PathBuf,
}

fn place() -> Place {
    let base = super::scratch_dir();
    let root = std::fs::canonicalize(base.path()).unwrap();
    let (home, ws) = (root.join("home"), root.join("ws"));
    std::fs::create_dir_all(&home).unwrap();
    std::fs::create_dir_all(&ws).unwrap();
    let state = tempfile::tempdir().unwrap();
    Place {
        home,
        ws,
        state: state.path().to_owned(),
        _dirs: (base, state),
    }
}

/// `n` runs without the sandbox and `n` with it, alternating so drift hits
/// both alike; their medians.
fn alternate(n: usize, mut run: impl FnMut(bool) -> Duration) -> (Duration, Duration) {
    let (mut bare, mut boxed) = (Vec::new(), Vec::new());
    for _ in 0..n {
        bare.push(run(false));
        boxed.push(run(true));
    }
    (median(bare), median(boxed))
}

/// Lets the disk settle before a row that arms: the rows before it make
/// and remove trees of 20,000 files, and while the file system's journal
/// commits that, each directory or file an arming makes (its private
/// directory, its launch spec) can wait milliseconds for it: the
/// `initialize` row read +15.9 ms so, against +4 to +5 ms by hand on a
/// quiet disk. A user's editor does not start in the second after 40,000
/// unlinks.
fn settle() {
    let _ = Command::new("sync").status();
    std::thread::sleep(Duration::from_secs(1));
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The fake agent behind a bridge, armed or not.
fn bridge(at: &Place, armed: bool) -> Bridged {
    let mut env: Vec<(&str, &Path)> = vec![("FAKE_AGENT_DIR", &at.state)];
    if armed {
        env.push(("ZCODE_ACP_SANDBOX", Path::new("1")));
    }
    Bridged::start(&at.home, &[FAKE_AGENT], &env)
}

/// `zcode-acp run -- ARGV` (policy read from disk, namespaces, mounts,
/// Landlock, the PID namespace's init) against `ARGV` bare, alternating.
pub fn spawn(n: usize, argv: &[&str], what: &str) -> String {
    spawn_in(n, argv, what, 0)
}

/// The same, in a workspace that is a repository of `files` source files
/// (20 to a directory, two levels deep), as a user's project is: what
/// `run` reads of the workspace (the repositories in it, the audit's walk
/// before and after the command) grows with it.
pub fn spawn_in(n: usize, argv: &[&str], what: &str, files: usize) -> String {
    let at = place();
    if files > 0 {
        fill_as_a_repository(&at.ws, files);
        settle();
        // As a user's project is when a command runs: its directories not
        // changed in the last seconds (a directory changed within three
        // seconds of a walk is listed afresh by every walk; src/listing.rs).
        std::thread::sleep(zcode_acp::listing::RACY + Duration::from_millis(500));
    }
    let run = |sandboxed: bool| -> Duration {
        let mut cmd = if sandboxed {
            let mut c = Command::new(BIN);
            c.arg("run").arg("--workspace").arg(&at.ws).arg("--");
            c.args(argv);
            c
        } else {
            let mut c = Command::new(argv[0]);
            c.args(&argv[1..]);
            c
        };
        cmd.current_dir(&at.ws)
            .env("HOME", &at.home)
            .env("ZCODE_ACP_LOG", "error");
        let start = Instant::now();
        let status = cmd.status().unwrap();
        let took = start.elapsed();
        assert!(
            status.success(),
            "the sandboxed spawn failed (needs root or user namespaces, and Landlock)"
        );
        took
    };
    let name = format!(
        "`run -- {}`{}",
        argv.join(" "),
        if files > 0 {
            format!(" in a repository of {files} files")
        } else {
            String::new()
        }
    );
    // The stretch goal, held against bare whether bubblewrap is here or not.
    let against_bare = |b: Duration, s: Duration| {
        if argv == ["sh", "-c", "true"] && files == 0 {
            crate::goals::at_most(
                &format!("{name}: vs bare (the stretch goal)"),
                s.as_secs_f64() / b.as_secs_f64(),
                2.0,
            );
        }
    };
    let Some(bwrap) = bubblewrap() else {
        let (b, s) = alternate(n, run);
        against_bare(b, s);
        return spawn_row(&format!("{what} ({n} each, alternating)"), b, s);
    };
    // Bubblewrap in the same loop, as the peer this row is held to.
    let (mut bare, mut ours, mut peer) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..n {
        bare.push(run(false));
        ours.push(run(true));
        let mut cmd = Command::new(&bwrap);
        cmd.args(bubblewrap_args(&at.ws))
            .args(argv)
            .current_dir(&at.ws)
            .env("HOME", &at.home);
        let start = Instant::now();
        let status = cmd.status().unwrap();
        peer.push(start.elapsed());
        assert!(status.success(), "bubblewrap failed: {cmd:?}");
    }
    let (b, s, p) = (median(bare), median(ours), median(peer));
    crate::goals::at_most(
        &format!("{name}: vs bubblewrap"),
        s.as_secs_f64() / p.as_secs_f64(),
        1.0,
    );
    against_bare(b, s);
    format!(
        "| {what} ({n} each, alternating; bubblewrap {:.2} ms, so zcode-acp is {:.2}x bubblewrap, goal: 1x at most) | {:.2} ms | {:.2} ms | {:.1}x |",
        ms(p),
        s.as_secs_f64() / p.as_secs_f64(),
        ms(b),
        ms(s),
        s.as_secs_f64() / b.as_secs_f64()
    )
}

/// `files` source files in `ws`, 20 to a directory, and a `.git` at its
/// top (laid out as git makes it; its objects are not needed).
fn fill_as_a_repository(ws: &Path, files: usize) {
    for d in 0..files.div_ceil(20) {
        let dir = ws.join(format!("src/m{}/d{d}", d / 100));
        std::fs::create_dir_all(&dir).unwrap();
        for f in 0..20.min(files - d * 20) {
            std::fs::write(dir.join(format!("f{f}.rs")), "fn f() {}\n").unwrap();
        }
    }
    for d in ["objects", "refs/heads", "hooks"] {
        std::fs::create_dir_all(ws.join(".git").join(d)).unwrap();
    }
    std::fs::write(ws.join(".git/HEAD"), "ref: refs/heads/main\n").unwrap();
}

/// What a file-heavy run runs under.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Under {
    Bare,
    ZcodeAcp,
    /// `zcode-acp run` with the test knob that takes Landlock away (the
    /// launch arms at the level below and says so): what Landlock costs.
    ZcodeAcpWithoutLandlock,
    Bubblewrap,
}

/// Bubblewrap, when installed (scripts/bench installs it as root) and
/// able to set up its sandbox here.
fn bubblewrap() -> Option<PathBuf> {
    let found = ["/usr/bin/bwrap", "/usr/local/bin/bwrap"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists());
    let Some(bwrap) = found else {
        println!(
            "bench: no bubblewrap here (scripts/bench installs it as root): its column is left out"
        );
        return None;
    };
    let works = Command::new(&bwrap)
        .args(bubblewrap_args(Path::new("/tmp")))
        .arg("true")
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !works {
        println!("bench: bubblewrap cannot set up its sandbox here: its column is left out");
        return None;
    }
    Some(bwrap)
}

/// Bubblewrap set up as close to `zcode-acp run` as it can say: user,
/// PID, IPC and network namespaces, `/` read-only, the workspace
/// writable, a private `/tmp`, its own `/dev` and `/proc`. (It has no
/// Landlock, seccomp filter, protected paths, proxy or audit.)
fn bubblewrap_args(ws: &Path) -> Vec<std::ffi::OsString> {
    let mut args: Vec<std::ffi::OsString> = [
        "--unshare-user",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-net",
        "--die-with-parent",
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        "--tmpfs",
        "/tmp",
        "--bind",
    ]
    .map(Into::into)
    .to_vec();
    args.push(ws.into());
    args.push(ws.into());
    args.push("--".into());
    args
}

/// A spawn row: the baseline's and the sandboxed median, and their ratio.
fn spawn_row(what: &str, base: Duration, ours: Duration) -> String {
    format!(
        "| {what} | {:.2} ms | {:.2} ms | {:.1}x |",
        ms(base),
        ms(ours),
        ours.as_secs_f64() / base.as_secs_f64()
    )
}

/// An editor terminal (`terminal/create` of `true`, which the editor runs
/// as a shell line) as the editor runs it: from an unarmed bridge as asked,
/// from an armed one rewritten to the sandbox helper, which enters the
/// running generation's namespaces. Timed: the editor's spawn until the exit.
pub fn terminal_spawn(n: usize) -> String {
    settle();
    let at = place();
    let ws = &at.ws;
    let mut times = [Vec::new(), Vec::new()];
    let mut bridges = [bridge(&at, false), bridge(&at, true)];
    let mut sids = Vec::new();
    for b in bridges.iter_mut() {
        sids.push(b.handshake(ws));
    }
    let mut unarmed = false;
    'runs: for i in 0..n {
        for (armed, b) in bridges.iter_mut().enumerate() {
            let id = 1000 + i as u64;
            writeln!(
                b.stdin,
                r#"{{"jsonrpc":"2.0","id":{id},"method":"session/prompt","params":{{"sessionId":"{}","prompt":[{{"type":"text","text":"terminal"}}]}}}}"#,
                sids[armed]
            )
            .unwrap();
            b.stdin.flush().unwrap();
            let request = loop {
                b.line.clear();
                assert!(b.stdout.read_until(b'\n', &mut b.line).unwrap() > 0);
                let v: serde_json::Value = serde_json::from_slice(&b.line).unwrap();
                if v["method"] == "terminal/create" {
                    break v;
                }
            };
            let p = &request["params"];
            let command = p["command"].as_str().unwrap().to_owned();
            let args: Vec<String> = p["args"]
                .as_array()
                .map(|a| a.iter().map(|s| s.as_str().unwrap().to_owned()).collect())
                .unwrap_or_default();
            if armed == 1 && args.first().map(String::as_str) != Some("__sandbox") {
                unarmed = true;
                break 'runs;
            }
            let mut cmd = if args.is_empty() {
                let mut c = Command::new("/bin/sh");
                c.arg("-c").arg(&command);
                c
            } else {
                let mut c = Command::new(&command);
                c.args(&args);
                c
            };
            cmd.current_dir(ws).stdout(Stdio::null());
            let start = Instant::now();
            let status = cmd.status().unwrap();
            times[armed].push(start.elapsed());
            assert!(status.success(), "the terminal failed: {request}");
            writeln!(
                b.stdin,
                r#"{{"jsonrpc":"2.0","id":{},"result":{{"terminalId":"t{i}"}}}}"#,
                request["id"]
            )
            .unwrap();
            b.stdin.flush().unwrap();
            super::read_to_answer(&mut b.stdout, &mut b.line, id);
        }
    }
    for b in bridges {
        b.stop();
    }
    if unarmed {
        return "| editor terminal (`true`), armed bridge vs unarmed | skipped: the bridge could not arm here (needs Landlock and namespaces) | | |".into();
    }
    let [plain, armed] = times;
    let (plain, armed) = (median(plain), median(armed));
    crate::goals::at_most(
        "editor terminal: armed vs unarmed",
        armed.as_secs_f64() / plain.as_secs_f64(),
        1.5,
    );
    spawn_row(
        &format!("editor terminal (`true`, run by the editor as it is asked): armed bridge (the sandbox helper entering the generation's namespaces) vs unarmed ({n} each, alternating; goal: 1.5x at most)"),
        plain,
        armed,
    )
}

/// From starting the bridge to its answer to `initialize`, armed and not
/// (the same python agent behind both).
pub fn initialize_answer(n: usize) -> String {
    settle();
    let at = place();
    let mut times = [Vec::new(), Vec::new()];
    for _ in 0..n {
        for (armed, t) in times.iter_mut().enumerate() {
            let start = Instant::now();
            let mut b = bridge(&at, armed == 1);
            b.until_answer(
                r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{}}}"#,
                1,
            );
            t.push(start.elapsed());
            b.stop();
        }
    }
    let [off, on] = times;
    let (off, on) = (median(off), median(on));
    crate::goals::record(
        "start to `initialize`: what the sandbox adds",
        format!("{:+.2} ms", ms(on) - ms(off)),
        "+5 ms at most",
        ms(on) - ms(off) <= 5.0,
    );
    format!(
        "| start to the `initialize` answer, sandbox on vs off ({n} each, alternating; goal: 5 ms more at most; it is {:+.1} ms) | {:.1} ms | {:.1} ms | {:.2}x |",
        ms(on) - ms(off),
        ms(off),
        ms(on),
        on.as_secs_f64() / off.as_secs_f64()
    )
}

/// A re-arm with `sessions` live sessions: a session in a new root makes
/// the armed bridge start a new generation and restore every session.
/// Timed from that `session/new` to the first session answering again (a
/// prompt sent right behind it); the agent's own share (its start and the
/// restores, asked of it directly, as the bridge asks them) is measured
/// apart, and the rest is the bridge's.
pub fn rearm(sessions: usize, runs: usize) -> String {
    let at = place();
    let (home, ws) = (&at.home, &at.ws);
    let (mut total, mut agent) = (Vec::new(), Vec::new());
    for run in 0..runs {
        // The agent offers `session/load`, as the agents a user runs do:
        // without it every session is lost at the re-arm, and nothing is
        // restored.
        let mut b = Bridged::start(
            home,
            &[FAKE_AGENT],
            &[
                ("FAKE_AGENT_DIR", &at.state),
                ("FAKE_LOAD", Path::new("1")),
                ("ZCODE_ACP_SANDBOX", Path::new("1")),
            ],
        );
        let mut sids = vec![b.handshake(ws)];
        for i in 1..sessions {
            sids.push(b.new_session(ws, 100 + i as u64));
        }
        let fresh = ws.parent().unwrap().join(format!("root{run}"));
        std::fs::create_dir_all(&fresh).unwrap();
        let start = Instant::now();
        writeln!(
            b.stdin,
            r#"{{"jsonrpc":"2.0","id":900,"method":"session/new","params":{{"cwd":"{}","mcpServers":[]}}}}"#,
            fresh.display()
        )
        .unwrap();
        writeln!(
            b.stdin,
            r#"{{"jsonrpc":"2.0","id":901,"method":"session/prompt","params":{{"sessionId":"{}","prompt":[]}}}}"#,
            sids[0]
        )
        .unwrap();
        b.stdin.flush().unwrap();
        super::read_to_answer(&mut b.stdout, &mut b.line, 901);
        total.push(start.elapsed());
        assert_answered(&b.line, "the restored session's prompt");
        // The last session restored answers too (untimed): none was lost.
        // (The agent's own files are in its sandbox's private /tmp.)
        writeln!(
            b.stdin,
            r#"{{"jsonrpc":"2.0","id":902,"method":"session/prompt","params":{{"sessionId":"{}","prompt":[]}}}}"#,
            sids[sessions - 1]
        )
        .unwrap();
        b.stdin.flush().unwrap();
        super::read_to_answer(&mut b.stdout, &mut b.line, 902);
        assert_answered(&b.line, "the last restored session's prompt");
        b.stop();

        // The agent alone: started, initialized, every session restored.
        let start = Instant::now();
        let mut direct = Command::new(super::python())
            .arg(FAKE_AGENT)
            .env("FAKE_AGENT_DIR", &at.state)
            .env("HOME", home)
            .current_dir(ws)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = direct.stdin.take().unwrap();
        let mut stdout = std::io::BufReader::new(direct.stdout.take().unwrap());
        let mut line = Vec::new();
        writeln!(
            stdin,
            r#"{{"jsonrpc":"2.0","id":1,"method":"initialize","params":{{"protocolVersion":1,"clientCapabilities":{{}}}}}}"#
        )
        .unwrap();
        stdin.flush().unwrap();
        super::read_to_answer(&mut stdout, &mut line, 1);
        for (i, sid) in sids.iter().enumerate() {
            let id = 10 + i as u64;
            writeln!(
                stdin,
                r#"{{"jsonrpc":"2.0","id":{id},"method":"session/load","params":{{"sessionId":"{sid}","cwd":"{}","mcpServers":[]}}}}"#,
                ws.display()
            )
            .unwrap();
            stdin.flush().unwrap();
            super::read_to_answer(&mut stdout, &mut line, id);
        }
        agent.push(start.elapsed());
        drop(stdin);
        let _ = direct.wait();
    }
    let (t, a) = (median(total), median(agent));
    let share = t.saturating_sub(a);
    crate::goals::record(
        &format!("re-arm with {sessions} sessions: the bridge's share"),
        format!("{:.2} ms", ms(share)),
        "20 ms at most",
        ms(share) <= 20.0,
    );
    format!(
        "| re-arm with {sessions} live sessions, from the trigger to the first session answering again ({runs} runs): the agent's own start and restores (asked directly) vs the whole; the bridge's share is {:.1} ms (goal: 20 ms at most) | {:.1} ms | {:.1} ms | {:.2}x |",
        ms(share),
        ms(a),
        ms(t),
        t.as_secs_f64() / a.as_secs_f64()
    )
}

/// Panics unless `line` is a prompt's answer with its stop reason (a lost
/// session is answered with an error).
fn assert_answered(line: &[u8], what: &str) {
    let answer: serde_json::Value = serde_json::from_slice(line).unwrap();
    assert!(
        answer["result"]["stopReason"].is_string(),
        "{what} was not answered: {answer}"
    );
}

/// `files` creates, writes and unlinks, then a `git init`, `add` and
/// `commit` of as many files, in the workspace, under `zcode-acp run`
/// against bare.
pub fn file_heavy(files: usize, runs: usize) -> Vec<String> {
    let at = place();
    let (home, ws) = (&at.home, &at.ws);
    // In a directory of its own each time ($1), removed by the bench
    // afterwards: inside the sandbox a repository's hooks and config are
    // read-only, so one run could not clear another's.
    let script = format!(
        r#"
set -e
mkdir "$1" && cd "$1" && mkdir churn repo
cd churn
i=0; while [ $i -lt {files} ]; do echo "line $i" > f$i; i=$((i+1)); done
i=0; while [ $i -lt {files} ]; do echo more >> f$i; i=$((i+1)); done
cd .. && rm -rf churn
cd repo
i=0; while [ $i -lt {files} ]; do echo "file $i" > f$i; i=$((i+1)); done
git init -q . && git add -A && git -c user.email=b@e -c user.name=bench commit -qm bench
"#
    );
    let mut runs_made = 0usize;
    let parent_ns = std::fs::metadata("/proc/self/ns/mnt")
        .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
        .unwrap();
    let bwrap = bubblewrap();
    // Bare, zcode-acp, or bubblewrap (the peer).
    let mut run = |how: Under, tmpfs: bool| -> Duration {
        let mut cmd = match how {
            Under::ZcodeAcp | Under::ZcodeAcpWithoutLandlock => {
                let mut c = Command::new(BIN);
                c.arg("run").arg("--workspace").arg(ws).arg("--");
                if how == Under::ZcodeAcpWithoutLandlock {
                    c.env("ZCODE_ACP_TEST_NO_LANDLOCK", "1");
                }
                c
            }
            Under::Bare => Command::new("env"),
            Under::Bubblewrap => {
                let mut c = Command::new(bwrap.as_ref().expect("bubblewrap is here"));
                c.args(bubblewrap_args(ws));
                c
            }
        };
        runs_made += 1;
        let dir = ws.join(format!("run{runs_made}"));
        cmd.args(["sh", "-c", &script, "sh"])
            .arg(&dir)
            .current_dir(ws)
            .env("HOME", home)
            .env("ZCODE_ACP_LOG", "error")
            .stdout(Stdio::null());
        if tmpfs {
            super::on_a_tmpfs(&mut cmd, ws, parent_ns);
        }
        let start = Instant::now();
        let status = cmd.status().unwrap();
        let took = start.elapsed();
        assert!(status.success(), "the file-heavy script failed");
        if dir.exists() {
            std::fs::remove_dir_all(&dir).unwrap();
        }
        took
    };
    let mut rows = Vec::new();
    for (tmpfs, place) in [(false, "this machine's disk"), (true, "a tmpfs")] {
        if let Some(why) = super::no_tmpfs_here().filter(|_| tmpfs) {
            println!("bench: the file-heavy row on a tmpfs is {why}");
            rows.push(format!(
                "| {files} file creates, appends and unlinks, then `git init` + `add` + `commit`, on {place} | {why} | | |"
            ));
            continue;
        }
        let (mut bare, mut ours, mut peer) = (Vec::new(), Vec::new(), Vec::new());
        // On the tmpfs, where the disk hides nothing, also without Landlock:
        // the layer's own cost, measured in the same run.
        let mut unlandlocked = Vec::new();
        for _ in 0..runs {
            bare.push(run(Under::Bare, tmpfs));
            ours.push(run(Under::ZcodeAcp, tmpfs));
            if tmpfs {
                unlandlocked.push(run(Under::ZcodeAcpWithoutLandlock, tmpfs));
            }
            if bwrap.is_some() {
                peer.push(run(Under::Bubblewrap, tmpfs));
            }
        }
        let (b, s) = (median(bare), median(ours));
        crate::goals::at_most(
            &format!("file-heavy work on {place}: under `run` vs bare"),
            s.as_secs_f64() / b.as_secs_f64(),
            1.05,
        );
        // Each other column in the row's text: its median, and how it
        // stands to bare.
        let beside = |who: &str, times: Vec<Duration>| {
            if times.is_empty() {
                return String::new();
            }
            let t = median(times);
            format!(
                "; {who} {:.0} ms, {:.2}x bare",
                ms(t),
                t.as_secs_f64() / b.as_secs_f64()
            )
        };
        let peer = format!(
            "{}{}",
            beside("bubblewrap", peer),
            beside("`run` without Landlock", unlandlocked)
        );
        rows.push(format!(
            "| {files} file creates, appends and unlinks, then `git init` + `add` + `commit` of {files} files, in the workspace on {place}: under `zcode-acp run` vs bare ({runs} each, alternating{peer}; goal: 1.05x at most) | {:.0} ms | {:.0} ms | {:.2}x |",
            ms(b),
            ms(s),
            s.as_secs_f64() / b.as_secs_f64()
        ));
    }
    rows
}

/// A turn's end in a repository of `files` source files: an empty prompt
/// to `zcode-acp shell-agent`, which ends its turn at once, through an
/// unarmed bridge and an armed one, whose turn ends only once its audit
/// has looked at what the turn left (a walk of the workspace). Medians of
/// `n` turns each, the two bridges in turn.
pub fn turn_end_in(n: usize, files: usize) -> String {
    let at = place();
    fill_as_a_repository(&at.ws, files);
    settle();
    // As a user's project is when the agent works in it (see `spawn_in`).
    std::thread::sleep(zcode_acp::listing::RACY + Duration::from_millis(500));
    let mut times = [Vec::new(), Vec::new()];
    let mut bridges: Vec<Bridged> = [false, true]
        .into_iter()
        .map(|armed| {
            let mut env: Vec<(&str, &Path)> = vec![("ZCODE_SHELL_AGENT_HOME", Path::new(""))];
            if armed {
                env.push(("ZCODE_ACP_SANDBOX", Path::new("1")));
            }
            Bridged::start_command(&at.home, &[BIN, "shell-agent"], &env, Some(&at.ws))
        })
        .collect();
    let mut sids = Vec::new();
    for b in bridges.iter_mut() {
        sids.push(b.handshake(&at.ws));
    }
    for i in 0..n {
        for (armed, b) in bridges.iter_mut().enumerate() {
            let id = 10 + i as u64;
            let start = Instant::now();
            b.until_answer(
                &format!(
                    r#"{{"jsonrpc":"2.0","id":{id},"method":"session/prompt","params":{{"sessionId":"{}","prompt":[{{"type":"text","text":""}}]}}}}"#,
                    sids[armed]
                ),
                id,
            );
            times[armed].push(start.elapsed());
        }
    }
    for b in bridges {
        b.stop();
    }
    let [plain, armed] = times;
    spawn_row(
        &format!("a turn's end in a repository of {files} files: armed bridge (its audit looks at what the turn left first) vs unarmed ({n} each, alternating; 40.7 ms armed before the kept listings of 2026-12-05)"),
        median(plain),
        median(armed),
    )
}
