//! The generated Seatbelt profile under the real `sandbox-exec`: every
//! operation in every place, checked on disk. macOS only (the GitHub
//! Actions workflow runs it on a macOS runner).
#![cfg(target_os = "macos")]

use std::path::{Path, PathBuf};
use std::process::Command;

use zcode_acp::config::managed::ManagedRoot;
use zcode_acp::confine::{Confinement, Launch, Sandbox, Starter};
use zcode_acp::policy::build::{Platform, PolicyInput, ProjectRules, Repo, RootInput};
use zcode_acp::policy::resolve_real;
use zcode_acp::seatbelt::enforce::SeatbeltEnforcer;

struct Setup {
    _base: tempfile::TempDir,
    ws: PathBuf,
    outside: PathBuf,
    argv_prefix: Vec<String>,
    _armed: Confinement,
}

fn setup() -> Setup {
    // Under $HOME, not $TMPDIR: temp is writable by design, and "outside"
    // must be outside everything allowed.
    let home = resolve_real(&dirs::home_dir().unwrap()).unwrap();
    let base = tempfile::Builder::new()
        .prefix("zcode-acp-test-")
        .tempdir_in(&home)
        .unwrap();
    let root = resolve_real(base.path()).unwrap();
    let ws = root.join("ws");
    let outside = root.join("outside");
    for d in [
        ws.join(".git/hooks"),
        ws.join(".zcode/acp"),
        outside.clone(),
    ] {
        std::fs::create_dir_all(d).unwrap();
    }
    std::fs::write(ws.join(".git/config"), "[core]\n").unwrap();
    std::fs::write(ws.join(".zcode/acp/sandbox.json"), "{\"enabled\": true}").unwrap();
    std::fs::write(outside.join("victim"), "keep").unwrap();
    std::fs::write(ws.join("existing"), "x").unwrap();
    let managed = ManagedRoot::new(root.join("managed"));
    let input = PolicyInput {
        links: Vec::new(),
        platform: Platform::Macos,
        home: home.clone(),
        roots: vec![RootInput {
            path: ws.clone(),
            project: ProjectRules::default(),
            repos: vec![Repo {
                work_tree: ws.clone(),
                git_dir: ws.join(".git"),
                common_dir: ws.join(".git"),
                hooks_path: None,
                gitfile: false,
            }],
        }],
        backend_state: vec![],
        temp_and_caches: zcode_acp::policy::discover::temp_and_caches(
            Platform::Macos,
            &zcode_acp::policy::discover::ProcessEnv,
            &home,
        ),
        once_allows: vec![],
        profile_dir: None,
        managed_root: managed.path.clone(),
        network: Default::default(),
    };
    let sandbox = Sandbox::Ready(std::sync::Arc::new(SeatbeltEnforcer::new().unwrap()));
    let armed = sandbox.arm(input, &managed, "none".into(), Starter::Spawned);
    assert!(
        matches!(armed, Confinement::Armed(_)),
        "the profile did not arm"
    );
    // A placeholder command: the tests append their own after `--`.
    let command = zcode_acp::confine::Command {
        argv: vec!["true".into()],
        ..Default::default()
    };
    let mut argv_prefix = armed.wrap(&command, Launch::Backend).unwrap();
    argv_prefix.pop();
    Setup {
        _base: base,
        ws,
        outside,
        argv_prefix,
        _armed: armed,
    }
}

fn run(s: &Setup, script: &str) -> bool {
    let mut argv = s.argv_prefix.clone();
    argv.extend(["/bin/sh".to_owned(), "-c".to_owned(), script.to_owned()]);
    Command::new(&argv[0])
        .args(&argv[1..])
        .current_dir(&s.ws)
        .status()
        .unwrap()
        .success()
}

#[test]
fn the_write_matrix_holds_on_disk() {
    let s = setup();
    let ws = s.ws.display().to_string();
    let out = s.outside.display().to_string();
    type OnDisk = Box<dyn Fn() -> bool>;
    let cases: Vec<(String, bool, OnDisk)> = vec![
        (
            format!("echo a > {ws}/new"),
            true,
            Box::new({
                let p = s.ws.join("new");
                move || p.exists()
            }),
        ),
        (
            format!("echo a >> {ws}/existing"),
            true,
            Box::new({
                let p = s.ws.join("existing");
                move || std::fs::read_to_string(&p).unwrap() != "x"
            }),
        ),
        (
            format!("mkdir {ws}/d && rmdir {ws}/d"),
            true,
            Box::new(|| true),
        ),
        (
            format!("echo a > {out}/new"),
            false,
            Box::new({
                let p = s.outside.join("new");
                move || !p.exists()
            }),
        ),
        (
            format!("echo a > {out}/victim"),
            false,
            Box::new({
                let p = s.outside.join("victim");
                move || std::fs::read_to_string(&p).unwrap() == "keep"
            }),
        ),
        (
            format!("rm {out}/victim"),
            false,
            Box::new({
                let p = s.outside.join("victim");
                move || p.exists()
            }),
        ),
        (
            format!("ln -s {out}/victim {ws}/link && echo a > {ws}/link"),
            false,
            Box::new({
                let p = s.outside.join("victim");
                move || std::fs::read_to_string(&p).unwrap() == "keep"
            }),
        ),
        (
            format!("echo evil > {ws}/.git/hooks/pre-commit"),
            false,
            Box::new({
                let p = s.ws.join(".git/hooks/pre-commit");
                move || !p.exists()
            }),
        ),
        (
            format!("echo evil >> {ws}/.git/config"),
            false,
            Box::new({
                let p = s.ws.join(".git/config");
                move || std::fs::read_to_string(&p).unwrap() == "[core]\n"
            }),
        ),
        (
            format!("echo '{{}}' > {ws}/.zcode/acp/sandbox.json"),
            false,
            Box::new({
                let p = s.ws.join(".zcode/acp/sandbox.json");
                move || std::fs::read_to_string(&p).unwrap() == "{\"enabled\": true}"
            }),
        ),
        (
            format!("mv {ws}/.zcode {ws}/moved"),
            false,
            Box::new({
                let p = s.ws.join(".zcode/acp/sandbox.json");
                move || p.exists()
            }),
        ),
        (
            format!("mv {ws}/.git {ws}/g2"),
            false,
            Box::new({
                let p = s.ws.join(".git/config");
                move || p.exists()
            }),
        ),
        (
            format!("mkdir -p {ws}/sub/.zcode/acp"),
            false,
            Box::new({
                let p = s.ws.join("sub/.zcode");
                move || !p.exists()
            }),
        ),
        (
            format!("echo a > {ws}/.envrc"),
            false,
            Box::new({
                let p = s.ws.join(".envrc");
                move || !p.exists()
            }),
        ),
    ];
    for (script, expect_ok, on_disk) in cases {
        let ok = run(&s, &script);
        assert_eq!(ok, expect_ok, "exit status of `{script}`");
        assert!(on_disk(), "on disk after `{script}`");
    }
}

/// The same operation matrix as the Linux tests (tests/fixtures/ops.py),
/// under the real sandbox-exec.
#[test]
fn the_shared_operation_matrix() {
    let s = setup();
    for d in [
        s.ws.join(".git/hooks/olddir"),
        s.ws.join(".zcode/acp/olddir"),
        s.ws.join("olddir"),
        s.outside.join("olddir"),
    ] {
        std::fs::create_dir_all(d).unwrap();
    }
    for f in [
        "existing",
        "existing-for-links",
        "movable",
        "movable-out",
        ".git/hooks/existing",
        ".git/hooks/movable",
        ".zcode/acp/movable",
    ] {
        std::fs::write(s.ws.join(f), "original").unwrap();
    }
    std::fs::write(s.ws.join(".git/config"), "original").unwrap();
    for f in ["existing", "movable", "movable-in", "linkable"] {
        std::fs::write(s.outside.join(f), "original").unwrap();
    }
    std::os::unix::fs::symlink(s.outside.join("existing"), s.ws.join("link-to-outside")).unwrap();
    std::os::unix::fs::symlink(
        s.outside.join("new-through-link"),
        s.ws.join("link-to-outside-new"),
    )
    .unwrap();
    let tmp = resolve_real(&std::env::temp_dir())
        .unwrap()
        .join(format!("zcode-acp-ops-{}", std::process::id()));
    std::fs::create_dir_all(tmp.join("olddir")).unwrap();
    std::fs::write(tmp.join("existing"), "original").unwrap();
    std::fs::write(tmp.join("movable"), "original").unwrap();
    let ops = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/ops.py");
    let mut argv = s.argv_prefix.clone();
    argv.extend([
        "/usr/bin/python3".to_owned(),
        ops.to_owned(),
        s.ws.display().to_string(),
        s.outside.display().to_string(),
        tmp.display().to_string(),
    ]);
    let out = Command::new(&argv[0]).args(&argv[1..]).output().unwrap();
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    assert!(lines.len() > 90, "{}", String::from_utf8_lossy(&out.stderr));
    for v in lines {
        let name = v["name"].as_str().unwrap();
        let ok = v["ok"].as_bool().unwrap();
        let (place, op) = name.split_once(':').unwrap();
        // Not root: no device nodes, no chown to another user; no /proc.
        if op == "mknod_char" || op == "chown" || op == "proc_fd" {
            assert!(!ok, "{name}");
            continue;
        }
        let expect =
            (place == "symlink" && op == "unlink") || place == "workspace" || place == "temp";
        assert_eq!(ok, expect, "{name}: {}", v["error"]);
    }
    assert_eq!(
        std::fs::read_to_string(s.outside.join("existing")).unwrap(),
        "original"
    );
    assert_eq!(
        std::fs::read_to_string(s.ws.join(".git/config")).unwrap(),
        "original"
    );
    assert_eq!(
        std::fs::read_to_string(s.ws.join(".zcode/acp/sandbox.json")).unwrap(),
        "{\"enabled\": true}"
    );
    let _ = std::fs::remove_dir_all(&tmp);
}

#[test]
fn reads_and_process_execution_stay_open() {
    let s = setup();
    assert!(run(
        &s,
        &format!(
            "cat {}/victim >/dev/null && ls / >/dev/null && /usr/bin/true",
            s.outside.display()
        )
    ));
    assert!(Path::new(&s.outside).join("victim").exists());
}

/// A home of its own for a `zcode-acp run` test (not under $TMPDIR, which
/// is writable by design), beneath the user's: (its guard, the home, a
/// workspace in it, a folder outside the workspace).
fn run_home() -> (tempfile::TempDir, PathBuf, PathBuf, PathBuf) {
    let real_home = resolve_real(&dirs::home_dir().unwrap()).unwrap();
    let base = tempfile::Builder::new()
        .prefix("zcode-acp-run-")
        .tempdir_in(&real_home)
        .unwrap();
    let home = resolve_real(base.path()).unwrap();
    let ws = home.join("ws");
    let outside = home.join("outside");
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    (base, home, ws, outside)
}

#[test]
fn zcode_acp_run_confines_a_command_and_keeps_its_exit_status() {
    let (_base, home, ws, outside) = run_home();
    let out = Command::new(env!("CARGO_BIN_EXE_zcode-acp"))
        .args(["run", "--workspace"])
        .arg(&ws)
        .args(["--", "/bin/sh", "-c"])
        .arg(format!(
            "echo a > {}/in; echo b > {}/x; exit 3",
            ws.display(),
            outside.display()
        ))
        .env("HOME", &home)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read_to_string(ws.join("in")).unwrap(), "a\n");
    assert!(
        !outside.join("x").exists(),
        "run let the command write outside"
    );
    // The run's profile directory went with it.
    let left: Vec<_> = std::fs::read_dir(home.join(".zcode-acp/sandbox"))
        .map(|d| d.flatten().collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "{left:?}");
}

/// `zcode-acp run --refusals-line` names the writes Seatbelt refused, read
/// from the system log between its two fences, and the `--allow` that
/// would open them; a write inside the workspace is not among them.
#[test]
fn zcode_acp_run_names_the_writes_the_log_says_were_refused() {
    let (_base, home, ws, outside) = run_home();
    let out = Command::new(env!("CARGO_BIN_EXE_zcode-acp"))
        .args(["run", "--refusals-line", "--workspace"])
        .arg(&ws)
        .args(["--", "/bin/sh", "-c"])
        .arg(format!(
            "echo a > {}/in; echo b > {}/refused.txt; true",
            ws.display(),
            outside.display()
        ))
        .env("HOME", &home)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(!outside.join("refused.txt").exists());
    let line = stderr
        .lines()
        .find(|l| l.starts_with("zcode-acp: the sandbox refused writes to"))
        .unwrap_or_else(|| panic!("no refused-writes line: {stderr}"));
    assert!(
        line.contains(&format!("{}/refused.txt", outside.display())),
        "{line}"
    );
    assert!(!line.contains("/in"), "{line}");
    assert!(
        line.contains(&format!("--allow {}", outside.display())),
        "{line}"
    );
    // The fences are zcode-acp's own, never named.
    assert!(!stderr.contains("refused-fence"), "{stderr}");
}

/// A tmux server, a container engine or any other server outside the
/// sandbox (an editor's, listening outside the workspace) runs whatever it
/// is sent: unix sockets are refused by default, while a socket of the
/// agent's own (in the workspace) still works.
#[test]
fn servers_that_act_for_the_agent_outside_cannot_be_reached() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::net::UnixListener;
    let s = setup();
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let dir = PathBuf::from(format!("/private/tmp/tmux-{uid}"));
    // A real tmux directory is left as it is: only our socket comes and goes.
    let created = !dir.exists();
    if created {
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    }
    let theirs = dir.join(format!("zcode-acp-test-{}", std::process::id()));
    let _server = UnixListener::bind(&theirs).unwrap();
    let docker = s.outside.join("docker.sock");
    let _engine = UnixListener::bind(&docker).unwrap();
    let editor = s.outside.join("editor-ipc.sock");
    let _editor = UnixListener::bind(&editor).unwrap();
    let ours = s.ws.join("own.sock");
    let _own = UnixListener::bind(&ours).unwrap();
    let connect = |p: &Path| {
        format!(
            "/usr/bin/python3 -c 'import socket,sys; socket.socket(socket.AF_UNIX).connect(sys.argv[1])' {}",
            p.display()
        )
    };
    let reached_theirs = run(&s, &connect(&theirs));
    let reached_engine = run(&s, &connect(&docker));
    let reached_editor = run(&s, &connect(&editor));
    let reached_ours = run(&s, &connect(&ours));
    let _ = std::fs::remove_file(&theirs);
    if created {
        let _ = std::fs::remove_dir(&dir);
    }
    assert!(
        !reached_theirs,
        "the sandbox reached a tmux server's socket"
    );
    assert!(
        !reached_engine,
        "the sandbox reached a container engine's socket"
    );
    assert!(
        !reached_editor,
        "the sandbox reached another program's server outside the workspace"
    );
    assert!(reached_ours, "the agent's own socket must work");
}

/// The network under `zcode-acp run` (no editor to ask): out only through
/// the run's proxy, outside the sandbox, which judges every destination
/// by the network table; a program that ignores the proxy variables
/// reaches no address at all, not even the Mac's own services; names are
/// the proxy's to look up; a listed host loopback port is reached
/// directly; what left is said at exit. Only this machine's loopback and
/// a documentation address (never answered) are used.
#[test]
fn zcode_acp_run_goes_out_through_its_proxy_only() {
    use std::io::{Read, Write};
    let (_base, home, ws, _outside) = run_home();
    // Two services of this Mac: one the table lists, one it does not.
    let listed = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
    let unlisted = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
    let (listed_port, unlisted_port) = (
        listed.local_addr().unwrap().port(),
        unlisted.local_addr().unwrap().port(),
    );
    let config = home.join("Library/Application Support/zcode-acp");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(
        config.join("config.json"),
        format!(r#"{{"network": {{"hostLoopback": [{listed_port}]}}}}"#),
    )
    .unwrap();
    // The listed one answers each connection with a line.
    listed.set_nonblocking(false).unwrap();
    let server = std::thread::spawn(move || {
        for stream in listed.incoming().take(2) {
            let mut s = stream.unwrap();
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf);
            let _ = s.write_all(b"HTTP/1.0 200 OK\r\nContent-Length: 3\r\n\r\nyes");
        }
    });
    let python = |code: &str| format!("/usr/bin/python3 -c '{code}'");
    let script = [
        // 1. Directly, ignoring the proxy: an address away (EPERM at once,
        //    not a timeout), the unlisted service, the resolver.
        python("import socket,errno,sys\ntry:\n  socket.create_connection((\"192.0.2.1\", 80), 5)\nexcept OSError as e:\n  sys.exit(0 if e.errno == errno.EPERM else 1)\nsys.exit(1)"),
        format!("{} && echo away-refused", python(&format!("import socket,sys\ntry:\n  socket.create_connection((\"127.0.0.1\", {unlisted_port}), 5)\nexcept OSError:\n  sys.exit(0)\nsys.exit(1)"))),
        python("import socket,sys\ntry:\n  socket.getaddrinfo(\"example.com\", 443)\nexcept OSError:\n  sys.exit(0)\nsys.exit(1)") + " && echo lookup-refused",
        python("import socket\nsocket.getaddrinfo(\"localhost\", 80)") + " && echo localhost-named",
        // 2. Through the proxy: the unlisted service refused with the way
        //    to allow it; the listed one reached, directly and through it.
        format!("/usr/bin/curl -s --noproxy \"\" -x \"$HTTP_PROXY\" http://127.0.0.1:{unlisted_port}/ ; echo"),
        format!("/usr/bin/curl -s http://127.0.0.1:{listed_port}/ && echo ' direct'"),
        format!("/usr/bin/curl -s --noproxy \"\" -x \"$HTTP_PROXY\" http://127.0.0.1:{listed_port}/ && echo ' proxied'"),
    ];
    let script: Vec<String> = script
        .iter()
        .enumerate()
        .map(|(i, s)| {
            if i == 0 {
                format!("{s} && echo address-refused")
            } else {
                s.clone()
            }
        })
        .collect();
    let out = Command::new(env!("CARGO_BIN_EXE_zcode-acp"))
        .args(["run", "--workspace"])
        .arg(&ws)
        .args(["--", "/bin/sh", "-c"])
        .arg(script.join("\n"))
        .env("HOME", &home)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    for said in [
        "address-refused",
        "away-refused",
        "lookup-refused",
        "localhost-named",
        "yes direct",
        "yes proxied",
    ] {
        assert!(stdout.contains(said), "{said} missing: {stdout}\n{stderr}");
    }
    assert!(
        stdout.contains("hostLoopback"),
        "the proxy's refusal says how to allow: {stdout}"
    );
    // Nothing of the unlisted service was reached.
    unlisted.set_nonblocking(true).unwrap();
    assert!(
        unlisted.accept().is_err(),
        "the unlisted service was reached"
    );
    // What went through the proxy is said at exit.
    assert!(
        stderr.contains(&format!("127.0.0.1:{listed_port}")),
        "no ledger line: {stderr}"
    );
    server.join().unwrap();
}

/// A server the agent starts on every address answers this Mac's loopback
/// only: a connection that arrives at the Mac's own LAN address (as one
/// from the LAN would) is refused, so nothing it serves leaves that way.
#[test]
fn a_server_the_agent_starts_answers_this_mac_only() {
    use std::io::Read;
    let (_base, home, ws, _outside) = run_home();
    let port = {
        let l = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
        l.local_addr().unwrap().port()
    };
    // This Mac's first address away from the loopback, if it has one.
    let away: Option<std::net::Ipv4Addr> = nix::ifaddrs::getifaddrs().ok().and_then(|mut a| {
        a.find_map(|i| {
            let v4 = i.address?.as_sockaddr_in()?.ip();
            (!v4.is_loopback() && !v4.is_link_local()).then_some(v4)
        })
    });
    let server = format!(
        "/usr/bin/python3 -c 'import socket\ns=socket.socket()\ns.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\ns.bind((\"0.0.0.0\", {port}))\ns.listen(4)\ns.settimeout(6)\nprint(\"listening\", flush=True)\nwhile True:\n  try:\n    c, a = s.accept()\n  except OSError:\n    break\n  print(\"from\", a[0], flush=True)\n  c.sendall(b\"secret\")\n  c.close()'"
    );
    let mut child = Command::new(env!("CARGO_BIN_EXE_zcode-acp"))
        .args(["run", "--workspace"])
        .arg(&ws)
        .args(["--", "/bin/sh", "-c"])
        .arg(server)
        .env("HOME", &home)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    // Wait for it to listen.
    let mut first = [0u8; 10];
    stdout.read_exact(&mut first).unwrap();
    let fetch = |ip: std::net::IpAddr| -> String {
        let Ok(mut c) = std::net::TcpStream::connect_timeout(
            &std::net::SocketAddr::new(ip, port),
            std::time::Duration::from_secs(2),
        ) else {
            return String::new();
        };
        c.set_read_timeout(Some(std::time::Duration::from_secs(2)))
            .unwrap();
        let mut got = String::new();
        let _ = c.read_to_string(&mut got);
        got
    };
    assert_eq!(fetch("127.0.0.1".parse().unwrap()), "secret");
    match away {
        Some(ip) => assert_eq!(
            fetch(ip.into()),
            "",
            "a connection that arrived at {ip} was served"
        ),
        None => println!("skipped: this Mac has no address away from the loopback"),
    }
    let _ = child.wait();
}
