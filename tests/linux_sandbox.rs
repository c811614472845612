//! The Linux sandbox against the real kernel: every write-class operation
//! in every kind of place, and escape attempts, checked on disk.
//!
//! Each run happens inside an outer mount namespace whose `/` has shared
//! propagation (this machine's `/` is private, so a missing "make /
//! private" step could not fail otherwise), and each test checks that the
//! host's mount table is unchanged afterwards. Runs as root here; the
//! unprivileged-user half of the matrix is still to come.
#![cfg(target_os = "linux")]

mod common;

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::{rand_u32, require_kernel_features, scratch_base, skip, TestUser, BIN};

fn host_mounts() -> String {
    std::fs::read_to_string("/proc/self/mountinfo").unwrap()
}

/// Runs `zcode-acp run ARGS` inside a fresh outer mount namespace with a
/// shared `/`, and reports whether the outer namespace's mount table
/// changed (it must not: that would mean the sandbox's mounts propagated).
fn run_in_outer_ns(cwd: &Path, args: &[&str], extra_fd: Option<i32>) -> (Output, bool) {
    run_in_outer_ns_as(cwd, args, extra_fd, None)
}

/// The places of the matrix, in a test user's directory.
trait UserPlaces {
    fn places(&self) -> Places;
}

impl UserPlaces for TestUser {
    /// The places of the matrix, in this user's directory and theirs.
    fn places(&self) -> Places {
        let p = places_in(&self.base);
        self.own(p.ws.parent().unwrap());
        p
    }
}

/// A reaper the test started (tests/fixtures/reaper.py), asked to end the
/// daemon it adopted (SIGTERM, by pid) when the guard goes away, even if
/// the test fails first.
struct StopOnDrop(std::process::Child);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the pid of a child this test started.
        unsafe {
            libc::kill(self.0.id() as i32, libc::SIGTERM);
        }
        let _ = self.0.wait();
    }
}

/// A process the test started, ended (by pid) when the guard goes away,
/// even if the test fails first.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The zcode-acp binary the user can run.
fn bin_for(user: Option<&TestUser>) -> PathBuf {
    match user {
        Some(u) => u.base.join("bin/zcode-acp"),
        None => PathBuf::from(BIN),
    }
}

fn run_in_outer_ns_as(
    cwd: &Path,
    args: &[&str],
    extra_fd: Option<i32>,
    user: Option<&TestUser>,
) -> (Output, bool) {
    let mut argv = vec![bin_for(user).to_string_lossy().into_owned()];
    argv.extend(args.iter().map(|a| a.to_string()));
    run_argv_in_outer_ns_as(cwd, &argv, extra_fd, user)
}

/// Runs `argv` (as `user`, if any) inside a fresh outer mount namespace
/// whose `/` is shared; reports whether that namespace's mount table stayed
/// as it was.
fn run_argv_in_outer_ns_as(
    cwd: &Path,
    argv: &[String],
    extra_fd: Option<i32>,
    user: Option<&TestUser>,
) -> (Output, bool) {
    run_with_home(cwd, argv, extra_fd, user, None)
}

/// As [`run_argv_in_outer_ns_as`], with the home directory given (its
/// owner must be the user who runs).
fn run_with_home(
    cwd: &Path,
    argv: &[String],
    extra_fd: Option<i32>,
    user: Option<&TestUser>,
    home_at: Option<&Path>,
) -> (Output, bool) {
    let before = host_mounts();
    let parent_ns = nix::sys::stat::stat("/proc/self/ns/mnt").unwrap().st_ino;
    let script = r#"cat /proc/self/mountinfo > "$OUTER/before"; "$@"; rc=$?; cat /proc/self/mountinfo > "$OUTER/after"; exit $rc"#;
    // The outer shell (the test user, if any) writes the mount tables here.
    let outer = match user {
        Some(u) => tempfile::tempdir_in(&u.base).unwrap(),
        None => tempfile::tempdir_in(scratch_base()).unwrap(),
    };
    // A home of the test's own: the launcher keeps its ledger and launch
    // files under ~/.zcode-acp.
    let home = tempfile::tempdir_in(scratch_base()).unwrap();
    let home_path = match user {
        Some(u) => {
            u.own(outer.path());
            u.base.join("home")
        }
        None => home.path().to_path_buf(),
    };
    let home_path = home_at.map_or(home_path, Path::to_path_buf);
    let ids = user.map(|u| (u.uid, u.gid));
    let mut cmd = Command::new("sh");
    cmd.env("HOME", &home_path);
    if home_at.is_some() {
        // A home the test laid out is the whole world: the caches are its
        // own, not wherever this test process's cargo keeps its own.
        cmd.env_remove("CARGO_HOME")
            .env_remove("XDG_CACHE_HOME")
            .env_remove("XDG_CONFIG_HOME");
    }
    cmd.arg("-c").arg(script).arg("sh").args(argv);
    cmd.env("OUTER", outer.path())
        .current_dir(cwd)
        .stdin(Stdio::null());
    // SAFETY: runs in the forked child before exec; only system calls.
    unsafe {
        cmd.pre_exec(move || {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)?;
            let now = nix::sys::stat::stat("/proc/self/ns/mnt")?.st_ino;
            if now == parent_ns {
                return Err(std::io::Error::other(
                    "the mount namespace did not change; refusing to mount",
                ));
            }
            nix::mount::mount(
                None::<&str>,
                "/",
                None::<&str>,
                nix::mount::MsFlags::MS_REC | nix::mount::MsFlags::MS_SHARED,
                None::<&str>,
            )?;
            if let Some(fd) = extra_fd {
                // An open, writable fd the command inherits (as fd 5).
                if libc::dup2(fd, 5) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            match ids {
                // Become the test user only now: the outer namespace needed root.
                Some((uid, gid)) => common::become_user(uid, gid),
                None => Ok(()),
            }
        });
    }
    let out = cmd.output().unwrap();
    let inner_before = std::fs::read_to_string(outer.path().join("before")).unwrap_or_default();
    let inner_after = std::fs::read_to_string(outer.path().join("after")).unwrap_or_default();
    assert_eq!(host_mounts(), before, "the host's mount table changed");
    (out, !inner_before.is_empty() && inner_before == inner_after)
}

struct Places {
    _dir: tempfile::TempDir,
    ws: PathBuf,
    outside: PathBuf,
}

fn places() -> Places {
    // Not under /tmp: /tmp is private inside the sandbox, so an "outside"
    // there would only ever show the private copy.
    places_in(&scratch_base())
}

fn places_in(parent: &Path) -> Places {
    // A name of its own, not hidden as tempfile's `.tmpXXXX` is: a user's
    // projects are not (and `run` suggests no --allow beneath a hidden
    // directory). No longer than that one: the tests bind Unix sockets
    // beneath it, whose paths hold 107 bytes at most (the mutation suite's
    // copy of the tree is deeper than the checkout).
    let dir = tempfile::Builder::new()
        .prefix("zc")
        .tempdir_in(parent)
        .unwrap();
    let base = std::fs::canonicalize(dir.path()).unwrap();
    let ws = base.join("ws");
    let outside = base.join("outside");
    for d in [
        ws.join(".git/hooks/olddir"),
        ws.join(".zcode/acp/olddir"),
        ws.join("olddir"),
        outside.join("olddir"),
    ] {
        std::fs::create_dir_all(d).unwrap();
    }
    for f in [
        ws.join("existing"),
        ws.join("existing-for-links"),
        ws.join("movable"),
        ws.join("movable-out"),
        ws.join(".git/config"),
        ws.join(".git/hooks/existing"),
        ws.join(".git/hooks/movable"),
        ws.join(".zcode/acp/movable"),
        outside.join("existing"),
        outside.join("movable"),
        outside.join("movable-in"),
        outside.join("linkable"),
    ] {
        std::fs::write(f, "original").unwrap();
    }
    std::fs::write(ws.join(".zcode/acp/sandbox.json"), r#"{"enabled": true}"#).unwrap();
    std::os::unix::fs::symlink(outside.join("existing"), ws.join("link-to-outside")).unwrap();
    std::os::unix::fs::symlink(
        outside.join("new-through-link"),
        ws.join("link-to-outside-new"),
    )
    .unwrap();
    Places {
        _dir: dir,
        ws,
        outside,
    }
}

fn results(out: &Output) -> BTreeMap<String, (bool, String)> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .map(|v| {
            (
                v["name"].as_str().unwrap().to_owned(),
                (
                    v["ok"].as_bool().unwrap(),
                    v["error"].as_str().unwrap().to_owned(),
                ),
            )
        })
        .collect()
}

fn content(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| format!("<{e}>"))
}

/// tests/fixtures/ops.py copied beside the places, where the sandbox
/// shows it (not the host's /tmp, where the repository may have been
/// cloned).
fn copy_ops(p: &Places) -> PathBuf {
    let ops = p.ws.parent().unwrap().join("ops.py");
    std::fs::copy(
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/ops.py"),
        &ops,
    )
    .unwrap();
    ops
}

/// The shell line that lays out `tmp`'s own places and runs the ops
/// script over the workspace, the outside and `tmp`.
fn ops_setup(p: &Places, ops: &str, tmp: &str) -> String {
    format!(
        "mkdir -p {tmp}/olddir && for f in existing movable; do echo original > {tmp}/$f; done && exec /usr/bin/python3 {ops} {} {} {tmp}",
        p.ws.display(),
        p.outside.display()
    )
}

#[test]
fn every_write_operation_in_every_place() {
    if !require_kernel_features() {
        return;
    }
    let p = places();
    let ops = copy_ops(&p);
    write_matrix(&p, None, ops.to_str().unwrap());
}

#[test]
fn every_write_operation_in_every_place_as_an_unprivileged_user() {
    if !require_kernel_features() {
        return;
    }
    let user = TestUser::create();
    let p = user.places();
    let ops = user.base.join("bin/ops.py");
    write_matrix(&p, Some(&user), ops.to_str().unwrap());
    // It really ran as the user: what it created is the user's.
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        std::fs::metadata(p.ws.join("file")).unwrap().uid(),
        user.uid
    );
}

/// The landlock-only level (a machine that refuses namespaces): no mounts,
/// so Landlock alone keeps every write of contents and names outside the
/// writable set out, truncation included. What Landlock does not cover (a
/// file's mode, group, times, extended attributes) the level's description
/// says; changing the owner or group to another's needs a capability the
/// sandbox drops, so `chown` is refused here too.
#[test]
fn landlock_alone_refuses_every_write_outside() {
    if !require_kernel_features() {
        return;
    }
    let p = places();
    let ops = copy_ops(&p);
    // The host's own /tmp at this level: a directory of this test's there.
    let tmp = tempfile::tempdir_in("/tmp").unwrap();
    let tmp = tmp.path().to_str().unwrap().to_owned();
    let setup = ops_setup(&p, ops.to_str().unwrap(), &tmp);
    let argv: Vec<String> = [
        "env",
        "ZCODE_ACP_TEST_NO_NAMESPACES=1",
        BIN,
        "run",
        "--workspace",
        p.ws.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        &setup,
    ]
    .map(String::from)
    .to_vec();
    let (out, _) = run_argv_in_outer_ns_as(&p.ws, &argv, None, None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("landlock-only"), "{stderr}");
    let r = results(&out);
    // The whole matrix ran, outside included.
    assert!(r.len() > 90, "the ops script ran: {stderr}");
    for name in [
        "outside:write",
        "outside:create",
        "rename:workspace_to_outside",
    ] {
        assert!(r.contains_key(name), "{name} was tried: {stderr}");
    }
    assert_eq!(
        r.get("workspace:truncate"),
        Some(&(true, String::new())),
        "{stderr}"
    );
    let handles_truncation = zcode_acp::linux::landlock_abi() >= 3;
    if !handles_truncation {
        skip("truncation: this kernel's Landlock (ABI < 3) has no right for it");
    }
    // Landlock has no right for these: see `Level::name`.
    let uncovered = ["chmod", "utimes", "setxattr"];
    for (name, (ok, err)) in &r {
        let (place, op) = name.split_once(':').unwrap();
        let outside = place == "outside"
            || (place == "symlink" && op != "unlink")
            || name.contains("_outside")
            || name.contains("outside_")
            // Its parent, outside, would hold the moved workspace.
            || name == "rename:workspace_root";
        if outside && !uncovered.contains(&op) && (op != "truncate" || handles_truncation) {
            assert!(!ok, "{name}: ok={ok} err={err}");
        }
    }
    if handles_truncation {
        assert_eq!(content(&p.outside.join("existing")), "original");
    }
    assert!(!p.outside.join("file").exists());
}

/// A file of yours handed in as stdin (`run -- cmd < notes`) was opened on
/// the host's writable mount, and `/proc/self/fd/0` reopens it past the
/// read-only ones: at the full level too, Landlock's truncation right is
/// all that refuses truncating it there (found by review, when leaving
/// truncation to the mounts was tried).
#[test]
fn a_file_handed_in_on_stdin_is_not_truncated_through_proc() {
    if !require_kernel_features() {
        return;
    }
    if zcode_acp::linux::landlock_abi() < 3 {
        skip("this kernel's Landlock (ABI < 3) has no right for truncation");
        return;
    }
    let p = places();
    let notes = p.outside.join("existing");
    let attempts = r#"
import os
print("stdin", os.fstat(0).st_ino)
for how in ("truncate", "open"):
    try:
        if how == "truncate":
            os.truncate("/proc/self/fd/0", 0)
        else:
            os.close(os.open("/proc/self/fd/0", os.O_RDONLY | os.O_TRUNC))
        print(how, "ok")
    except OSError as e:
        print(how, "refused", e.errno)
"#;
    let argv: Vec<String> = [
        "sh",
        "-c",
        r#"exec "$@" < "$NOTES""#,
        "sh",
        BIN,
        "run",
        "--workspace",
        p.ws.to_str().unwrap(),
        "--",
        "/usr/bin/python3",
        "-c",
        attempts,
    ]
    .map(String::from)
    .to_vec();
    let argv: Vec<String> = ["env".to_owned(), format!("NOTES={}", notes.display())]
        .into_iter()
        .chain(argv)
        .collect();
    let (out, _) = run_argv_in_outer_ns_as(&p.ws, &argv, None, None);
    let stdout = String::from_utf8_lossy(&out.stdout);
    // Stdin was the file itself, and Landlock refused (EACCES), not
    // something else (a pipe's EINVAL).
    use std::os::unix::fs::MetadataExt;
    let ino = std::fs::metadata(&notes).unwrap().ino();
    let eacces = nix::errno::Errno::EACCES as i32;
    assert!(
        stdout.contains(&format!("stdin {ino}\n"))
            && stdout.contains(&format!("truncate refused {eacces}\n"))
            && stdout.contains(&format!("open refused {eacces}\n")),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(content(&notes), "original");
}

/// The armed bridge in front of the shell agent, run by `user` with its
/// own copy of the binary, and a session in the user's workspace.
fn armed_editor_as(user: &TestUser) -> (common::Editor, PathBuf, String) {
    user.own(&user.base.join("home"));
    user.own(&user.base.join("ws"));
    let bin = user.base.join("bin/zcode-acp");
    let mut opts = common::Options::new(vec![
        bin.to_string_lossy().into_owned(),
        "shell-agent".into(),
    ])
    .env("ZCODE_ACP_SANDBOX", "1")
    .env("ZCODE_SHELL_AGENT_HOME", "");
    opts.home_at = Some(user.base.join("home"));
    opts.run_as = Some((user.uid, user.gid, bin));
    let mut ed = common::Editor::start_with(opts);
    ed.initialize();
    let ws = user.base.join("ws");
    let sid = ed.new_session(&ws);
    (ed, ws, sid)
}

#[test]
fn an_editor_terminal_joins_its_generation_as_an_unprivileged_user() {
    if !require_kernel_features() {
        return;
    }
    // Declared first, so the bridge below is gone before the user is removed.
    let user = TestUser::create();
    let (mut ed, ws, sid) = armed_editor_as(&user);
    common::terminal_joins_its_generation(&mut ed, &sid);
    // The terminal ran as the user, in the workspace it may write.
    let (_, text) = ed.prompt(&sid, "/terminal id -u; echo x > made-by-terminal");
    assert!(text.contains(&user.uid.to_string()), "{text}");
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        std::fs::metadata(ws.join("made-by-terminal"))
            .unwrap()
            .uid(),
        user.uid
    );
}

#[test]
fn the_editor_writes_where_it_was_judged_as_an_unprivileged_user() {
    if !require_kernel_features() {
        return;
    }
    // Declared first, so the bridge below is gone before the user is removed.
    let user = TestUser::create();
    let (mut ed, ws, sid) = armed_editor_as(&user);
    let outside = user.base.join("outside");
    common::editor_writes_land_where_judged(&mut ed, &ws, &sid, &outside);
}

#[test]
fn a_plant_after_the_turn_is_reverted_at_once_as_an_unprivileged_user() {
    if !require_kernel_features() {
        return;
    }
    // Declared first, so the bridge below is gone before the user is removed.
    let user = TestUser::create();
    let ws2 = user.base.join("ws2");
    std::fs::create_dir_all(&ws2).unwrap();
    user.own(&ws2);
    let (mut ed, ws, sid) = armed_editor_as(&user);
    let outside = user.base.join("outside");
    user.own(&outside);
    common::plants_after_the_turn_are_reverted(&mut ed, &ws, &sid, &ws2, &outside);
}

#[test]
fn refused_connections_are_put_to_an_unprivileged_user() {
    if !require_kernel_features() {
        return;
    }
    // Declared first, so the bridge below is gone before the user is removed.
    let user = TestUser::create();
    let (mut ed, ws, sid) = armed_editor_as(&user);
    common::refused_connections_are_put_to_the_user(&mut ed, &ws, &sid);
}

fn write_matrix(p: &Places, user: Option<&TestUser>, ops: &str) {
    let tmp = "/tmp/zcode-acp-ops";
    let setup = ops_setup(p, ops, tmp);
    let ws = p.ws.to_str().unwrap();
    let (out, outer_unchanged) = run_in_outer_ns_as(
        &p.ws,
        &["run", "--workspace", ws, "--", "sh", "-c", &setup],
        None,
        user,
    );
    assert!(
        outer_unchanged,
        "the sandbox's mounts leaked into the outer namespace"
    );
    let r = results(&out);
    assert!(
        r.len() > 90,
        "the ops script ran: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let allowed_places = ["workspace", "temp"];
    for (name, (ok, err)) in &r {
        let place = name.split(':').next().unwrap();
        let op = name.split(':').nth(1).unwrap();
        let expect = if place == "symlink" && op == "unlink" {
            // Removes the link itself, which lives in the workspace.
            true
        } else if allowed_places.contains(&place) {
            // Creating device nodes needs CAP_MKNOD, which the sandbox drops;
            // chown to another user needs CAP_CHOWN; the private /tmp is
            // another filesystem, so a hard link from the workspace is EXDEV.
            !(op == "mknod_char" || op == "chown" || (place == "temp" && op == "hardlink"))
        } else {
            false
        };
        assert_eq!(*ok, expect, "{name}: ok={ok} err={err}");
    }

    // What the disk says.
    assert_eq!(content(&p.ws.join("file")), "new");
    assert!(!p.ws.join("existing").exists(), "unlinked in the workspace");
    assert_eq!(content(&p.ws.join(".git/config")), "original");
    assert_eq!(content(&p.ws.join(".git/hooks/existing")), "original");
    assert!(!p.ws.join(".git/hooks/pre-commit").exists());
    assert_eq!(
        content(&p.ws.join(".zcode/acp/sandbox.json")),
        r#"{"enabled": true}"#
    );
    assert!(!p.ws.join(".zcode/acp/new.json").exists());
    assert!(p.ws.join(".zcode/acp/olddir").is_dir());
    assert_eq!(content(&p.outside.join("existing")), "original");
    assert!(!p.outside.join("file").exists());
    assert!(!p.outside.join("new-through-link").exists());
    assert!(!p.outside.join("newdir").exists());
    assert!(p.outside.join("olddir").is_dir());
    assert!(p.outside.join("movable-in").exists() && !p.ws.join("moved-in").exists());
    assert!(p.ws.join("movable-out").exists() && !p.outside.join("moved-out").exists());
    assert!(p.ws.join(".zcode/acp/sandbox.json").exists() && !p.ws.join("zcode-moved").exists());
    assert!(p.ws.join(".git/config").exists() && !p.ws.join("git-moved").exists());
    assert!(!p.ws.join("stolen").exists());
    // The sandbox's /tmp was its own.
    assert!(
        !Path::new(tmp).exists(),
        "the private /tmp leaked to the host"
    );
}

fn run_script(ws: &Path, script: &str, extra_fd: Option<i32>) -> Output {
    let (out, unchanged) = run_in_outer_ns(
        ws,
        &[
            "run",
            "--workspace",
            ws.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            script,
        ],
        extra_fd,
    );
    assert!(
        unchanged,
        "the sandbox's mounts leaked into the outer namespace"
    );
    out
}

#[test]
fn escape_attempts_fail() {
    if !require_kernel_features() {
        return;
    }
    escape_attempts(&places(), None);
}

#[test]
fn escape_attempts_fail_as_an_unprivileged_user() {
    if !require_kernel_features() {
        return;
    }
    let user = TestUser::create();
    let p = user.places();
    escape_attempts(&p, Some(&user));
}

fn escape_attempts(p: &Places, user: Option<&TestUser>) {
    let target = p.outside.join("pwned");
    let t = target.display();
    // A device node outside the grants: read-only mounts do not stop writes
    // to devices, Landlock must.
    let dev = p.outside.join("nulldev");
    nix::sys::stat::mknod(
        &dev,
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o666),
        nix::sys::stat::makedev(1, 3),
    )
    .unwrap();
    // A process outside the sandbox it must not be able to signal.
    let mut sleeper = Command::new("sleep");
    if let Some(u) = user {
        // The user's own process: it could signal it, were it not sandboxed.
        std::os::unix::process::CommandExt::uid(&mut sleeper, u.uid);
    }
    let mut sleeper = KillOnDrop(sleeper.arg("60").spawn().unwrap());
    let victim_pid = sleeper.0.id();
    let script = format!(
        r#"
        umount {ws} 2>/dev/null && echo ESCAPE umount
        mount -o remount,rw / 2>/dev/null && echo ESCAPE remount
        mount -o remount,bind,rw {ws} 2>/dev/null && touch {t} && echo ESCAPE bind-remount
        unshare -Urm sh -c 'mount -o remount,rw / 2>/dev/null; touch {t}' 2>/dev/null && echo ESCAPE nested-userns
        touch /proc/{me}/root{t} 2>/dev/null && echo ESCAPE proc-root
        kill -TERM {victim} 2>/dev/null && echo ESCAPE signal
        /usr/bin/python3 -c 'import ctypes,os,sys; r=ctypes.CDLL(None).ptrace(16,int(sys.argv[1]),0,0); os._exit(0 if r==0 else 1)' {victim} && echo ESCAPE ptrace
        /usr/bin/python3 -c 'import ctypes,os; p=ctypes.CDLL(None).ptrace; r=p(16,1,0,0); r==0 and (os.waitpid(1,0x40000000), p(17,1,0,0)); os._exit(0 if r==0 else 1)' && echo ESCAPE ptrace-init
        echo x >&5 2>/dev/null && echo ESCAPE inherited-fd
        /usr/bin/python3 -c 'import ctypes,os; libc=ctypes.CDLL(None); m=ctypes.c_uint64*4; a=m(0,1,0,0); r=libc.syscall(442,-100,b"/",0x8000,a,32); os._exit(0 if r==0 else 1)' && touch {t} 2>/dev/null && echo ESCAPE mount_setattr
        grep -Eq '^CapEff:[[:space:]]*0+$' /proc/self/status || echo ESCAPE capabilities-kept
        grep -Eq '^CapBnd:[[:space:]]*0+$' /proc/self/status || echo ESCAPE bounding-set-kept
        grep -Eq '^NoNewPrivs:[[:space:]]*1$' /proc/self/status || echo ESCAPE no-new-privs-unset
        echo x 2>/dev/null > {dev} && echo ESCAPE device-node
        (sleep 2; touch {ws}/late) &
        echo done
        "#,
        ws = p.ws.display(),
        me = std::process::id(),
        victim = victim_pid,
        dev = dev.display(),
    );
    let file = std::fs::File::create(p.outside.join("fd-target")).unwrap();
    use std::os::fd::AsRawFd;
    let (out, unchanged) = run_in_outer_ns_as(
        &p.ws,
        &[
            "run",
            "--workspace",
            p.ws.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            &script,
        ],
        Some(file.as_raw_fd()),
        user,
    );
    assert!(
        unchanged,
        "the sandbox's mounts leaked into the outer namespace"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("done"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!stdout.contains("ESCAPE"), "{stdout}");
    assert!(!target.exists());
    assert_eq!(content(&p.outside.join("fd-target")), "");
    assert!(
        sleeper.0.try_wait().unwrap().is_none(),
        "the outside process was signalled"
    );
    drop(sleeper);
    // A background process dies with the command (the PID namespace ends).
    std::thread::sleep(std::time::Duration::from_secs(3));
    assert!(
        !p.ws.join("late").exists(),
        "a background process outlived the command"
    );
}

#[test]
fn services_that_write_for_the_caller_are_out_of_reach() {
    if !require_kernel_features() {
        return;
    }
    if !common::require_tool("tmux", "apt install tmux")
        || !common::require_tool("gpg-agent", "apt install gnupg")
    {
        return;
    }
    tmux_server_outside(&places(), None, false);
    tmux_server_outside(&places(), None, true);
    // A workspace under /tmp, whose tree the sandbox carries into its
    // private /tmp, sockets included.
    tmux_server_outside(&places_in(Path::new("/tmp")), None, true);
    gpg_agent_outside(&places(), None);
    moved_sockets_outside(&places(), None);
}

#[test]
fn services_that_write_for_the_caller_are_out_of_reach_as_an_unprivileged_user() {
    if !require_kernel_features() {
        return;
    }
    if !common::require_tool("tmux", "apt install tmux")
        || !common::require_tool("gpg-agent", "apt install gnupg")
    {
        return;
    }
    let user = TestUser::create();
    let p = user.places();
    tmux_server_outside(&p, Some(&user), false);
    tmux_server_outside(&p, Some(&user), true);
    gpg_agent_outside(&p, Some(&user));
    moved_sockets_outside(&p, Some(&user));
}

/// Services that act on request, whose socket did not stay at the name it
/// was bound to: linked into place under another name (OpenSSH's
/// ControlMaster), renamed there, bound by a relative name, or bound by a
/// server in another network namespace (root only: making one as a user
/// needs a user namespace of its own). From inside, none is reached and
/// none writes its mark, where from outside each is.
fn moved_sockets_outside(p: &Places, user: Option<&TestUser>) {
    let dir =
        p.ws.parent()
            .unwrap()
            .join(format!("services-{:08x}", rand_u32()));
    std::fs::create_dir(&dir).unwrap();
    if let Some(u) = user {
        u.own(&dir);
    }
    let fixture = dir.join("socket_service.py");
    std::fs::copy(
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/socket_service.py"
        ),
        &fixture,
    )
    .unwrap();
    let mut modes = vec!["link", "rename", "relative"];
    if user.is_none() {
        modes.push("otherns");
    }
    // Each in a directory of its own: a socket beside another bound one is
    // covered for that reason alone, and each way must hold by itself.
    let sock = |m: &str| dir.join(m).join(format!("{m}.sock"));
    let mark = |m: &str, who: &str| dir.join(m).join(format!("MARK-{who}-{m}"));
    let mut services = Vec::new();
    for mode in &modes {
        std::fs::create_dir(dir.join(mode)).unwrap();
        if let Some(u) = user {
            u.own(&dir.join(mode));
        }
        let mut c = if *mode == "otherns" {
            let mut c = Command::new("unshare");
            c.args(["--net", "python3"]);
            c
        } else {
            Command::new("python3")
        };
        let serve_mode = if *mode == "otherns" { "plain" } else { mode };
        c.arg(&fixture)
            .args(["serve", serve_mode])
            .arg(sock(mode))
            .stdin(Stdio::null())
            .stdout(Stdio::piped());
        if let Some(u) = user {
            c.uid(u.uid).gid(u.gid);
        }
        let mut child = c.spawn().unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        assert_eq!(line.trim(), "ready", "{mode}");
        services.push(KillOnDrop(child));
    }
    let ask = |who: &str| {
        modes
            .iter()
            .map(|m| {
                format!(
                    "python3 {f} ask {s} {who}-{m}; ",
                    f = fixture.display(),
                    s = sock(m).display()
                )
            })
            .collect::<String>()
    };
    // Control: from outside, every service acts.
    let outside = Command::new("sh")
        .args(["-c", &ask("outside")])
        .output()
        .unwrap();
    let outside = String::from_utf8_lossy(&outside.stdout).into_owned();
    for m in &modes {
        assert!(
            outside.contains(&format!("outside-{m}=reached")),
            "{outside}"
        );
        assert!(mark(m, "outside").exists(), "{m}");
    }
    let script = format!("{}echo done", ask("inside"));
    let (out, unchanged) =
        run_argv_in_outer_ns_as(&p.ws, &run_sh(user, "none", &p.ws, &script), None, user);
    assert!(
        unchanged,
        "the sandbox's mounts leaked into the outer namespace"
    );
    drop(services);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("done"), "{stdout}");
    for m in &modes {
        assert!(
            stdout.contains(&format!("inside-{m}=refused")),
            "{m}: {stdout}"
        );
        assert!(
            !mark(m, "inside").exists(),
            "the {m} service wrote for the sandbox: {stdout}"
        );
    }
}

/// A real gpg-agent outside, on its own home (outside /tmp, so its socket
/// sits beside the keys, as it does where there is no /run/user/UID): from
/// inside, neither a new key nor the deletion of one reaches it.
fn gpg_agent_outside(p: &Places, user: Option<&TestUser>) {
    let home =
        p.ws.parent()
            .unwrap()
            .join(format!("gnupg-{:08x}", rand_u32()));
    std::fs::create_dir(&home).unwrap();
    std::fs::set_permissions(&home, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    if let Some(u) = user {
        u.own(&home);
    }
    let as_user = |program: &str| {
        let mut c = Command::new(program);
        c.arg("--homedir").arg(&home);
        if let Some(u) = user {
            std::os::unix::process::CommandExt::uid(&mut c, u.uid);
            std::os::unix::process::CommandExt::gid(&mut c, u.gid);
            c.env("HOME", u.base.join("home"));
        }
        c.env_remove("GPG_AGENT_INFO")
            .env_remove("XDG_RUNTIME_DIR")
            .stdin(Stdio::null());
        c
    };
    // gpg-agent forks away as daemons do; a reaper of ours adopts it, so
    // the test ends it (and reaps it) through a child it started.
    let reaper = p.ws.parent().unwrap().join("reaper.py");
    std::fs::copy(
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/reaper.py"),
        &reaper,
    )
    .unwrap();
    let mut c = Command::new("python3");
    c.arg(&reaper)
        .arg("gpg-agent")
        .arg("--homedir")
        .arg(&home)
        .args(["--daemon", "--allow-loopback-pinentry"])
        .env_remove("XDG_RUNTIME_DIR")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    if let Some(u) = user {
        std::os::unix::process::CommandExt::uid(&mut c, u.uid);
        std::os::unix::process::CommandExt::gid(&mut c, u.gid);
        c.env("HOME", u.base.join("home"));
    }
    let mut child = c.spawn().expect("start gpg-agent (install gnupg)");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let agent = StopOnDrop(child);
    let socket = {
        let out = as_user("gpgconf")
            .args(["--list-dirs", "agent-socket"])
            .output()
            .unwrap();
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    };
    common::wait_until("gpg-agent listens", || socket.exists());
    let gen = |uid: &str| {
        as_user("gpg")
            .args(["--batch", "--pinentry-mode", "loopback", "--passphrase", ""])
            .args(["--quick-gen-key", uid, "default", "default", "never"])
            .output()
            .unwrap()
    };
    let keys = || {
        let out = as_user("gpg")
            .args(["--batch", "--with-colons", "--list-secret-keys"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.starts_with("fpr:"))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    // Control: the agent makes keys for whoever reaches its socket.
    assert!(gen("outside@zcode-acp.test").status.success());
    let before = keys();
    assert!(!before.is_empty(), "{before:?}");
    // The primary key's fingerprint comes first.
    let fpr = before[0].split(':').nth(9).unwrap().to_owned();
    let h = home.display();
    let script = format!(
        "gpg --version >/dev/null && echo gpg-runs; \
         gpg --homedir {h} --batch --pinentry-mode loopback --passphrase '' --quick-gen-key inside@zcode-acp.test default default never 2>/dev/null && echo ESCAPE made-key; \
         gpg --homedir {h} --batch --yes --delete-secret-keys {fpr} 2>/dev/null && echo ESCAPE deleted-key; echo done"
    );
    let argv = run_sh(user, "none", &p.ws, &script);
    let (out, unchanged) = run_argv_in_outer_ns_as(&p.ws, &argv, None, user);
    assert!(
        unchanged,
        "the sandbox's mounts leaked into the outer namespace"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let after = keys();
    drop(agent);
    // Control inside: gpg itself runs there (its refusals are the
    // agent's, not a missing tool's).
    assert!(
        stdout.contains("gpg-runs") && stdout.contains("done") && !stdout.contains("ESCAPE"),
        "{stdout}"
    );
    assert_eq!(after, before, "the keys outside changed: {stdout}");
}

/// A tmux server outside the sandbox, on its default socket directory in
/// the host's /tmp: commands sent to it would run unconfined.
/// A tmux server outside, on its default socket directory (`-L`) or on a
/// socket path of its own outside /tmp (`-S`): driven from inside, it would
/// run the agent's command unconfined.
fn tmux_server_outside(p: &Places, user: Option<&TestUser>, own_socket: bool) {
    let label = format!("zcodetest{:08x}", rand_u32());
    // Beside the workspace, or in it where the workspace is in a private
    // temp dir's place (the tree is carried into the sandbox, socket too).
    let socket = if p.ws.starts_with("/tmp") {
        p.ws.join(format!("{label}.sock"))
    } else {
        p.ws.parent().unwrap().join(format!("{label}.sock"))
    };
    let select: Vec<String> = if own_socket {
        vec!["-S".into(), socket.display().to_string()]
    } else {
        vec!["-L".into(), label.clone()]
    };
    let tmux = |args: &[&str]| {
        let mut c = Command::new("tmux");
        c.args(&select).args(args);
        if let Some(u) = user {
            std::os::unix::process::CommandExt::uid(&mut c, u.uid);
            std::os::unix::process::CommandExt::gid(&mut c, u.gid);
            c.env("HOME", u.base.join("home"));
        }
        c.status()
    };
    if !tmux(&["new-session", "-d", "sleep 60"]).is_ok_and(|s| s.success()) {
        panic!("tmux could not start a server (install tmux)");
    }
    // Ends the server this test started (through its own socket), even if
    // the test fails first.
    struct Server<F: Fn(&[&str]) -> std::io::Result<std::process::ExitStatus>>(F);
    impl<F: Fn(&[&str]) -> std::io::Result<std::process::ExitStatus>> Drop for Server<F> {
        fn drop(&mut self) {
            let _ = (self.0)(&["kill-server"]);
        }
    }
    let server = Server(tmux);
    // Control: the server takes commands from outside.
    assert!((server.0)(&["list-sessions"]).is_ok_and(|s| s.success()));
    let target = p.outside.join("via-tmux");
    let script = format!(
        "tmux -V >/dev/null && echo tmux-runs; tmux {sel} new-window 'touch {t}' 2>/dev/null && echo ESCAPE tmux; echo done",
        sel = select.join(" "),
        t = target.display()
    );
    let (out, unchanged) = run_in_outer_ns_as(
        &p.ws,
        &[
            "run",
            "--workspace",
            p.ws.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            &script,
        ],
        None,
        user,
    );
    assert!(
        unchanged,
        "the sandbox's mounts leaked into the outer namespace"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    drop(server);
    // Control inside: tmux itself runs there.
    assert!(
        stdout.contains("tmux-runs") && stdout.contains("done") && !stdout.contains("ESCAPE"),
        "{stdout}"
    );
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(!target.exists());
}

#[test]
fn tiocsti_cannot_inject_input_into_the_callers_terminal() {
    if !require_kernel_features() {
        return;
    }
    tiocsti(&places(), None);
}

#[test]
fn tiocsti_cannot_inject_input_as_an_unprivileged_user() {
    if !require_kernel_features() {
        return;
    }
    let user = TestUser::create();
    let p = user.places();
    tiocsti(&p, Some(&user));
}

fn tiocsti(p: &Places, user: Option<&TestUser>) {
    if std::fs::read_to_string("/proc/sys/dev/tty/legacy_tiocsti")
        .map(|s| s.trim() == "0")
        .unwrap_or(false)
    {
        skip("TIOCSTI is disabled by this kernel (dev.tty.legacy_tiocsti=0), so the test could not fail");
        return;
    }
    // `script` gives the sandbox a terminal it inherits on stdin.
    let inner = format!(
        "{} run --workspace {} -- /usr/bin/python3 -c 'import fcntl,termios,sys; fcntl.ioctl(0, termios.TIOCSTI, b\"x\"); print(\"ESCAPE tiocsti\")'; echo done",
        bin_for(user).display(),
        p.ws.display()
    );
    let argv: Vec<String> = ["script", "-qec", &inner, "/dev/null"]
        .iter()
        .map(|a| a.to_string())
        .collect();
    let (out, unchanged) = run_argv_in_outer_ns_as(&p.ws, &argv, None, user);
    assert!(
        unchanged,
        "the sandbox's mounts leaked into the outer namespace"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("done"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!stdout.contains("ESCAPE"), "{stdout}");
}

#[test]
fn real_work_keeps_working_inside() {
    if !require_kernel_features() {
        return;
    }
    let p = places();
    let script = r#"
        set -e
        git init -q repo
        cd repo
        echo hi > a.txt
        git add a.txt
        git -c user.email=t@t -c user.name=t commit -qm first
        /usr/bin/python3 -m venv venv
        ./venv/bin/python -c 'import multiprocessing as m; assert m.Pool(2).map(abs, [-1, -2]) == [1, 2]'
        script -qec 'echo pty-ok' /dev/null | grep -q pty-ok
        cd ..
        cargo new --vcs none --quiet hello
        cd hello
        cargo build --offline --quiet
        ./target/debug/hello | grep -q 'Hello, world!'
        cd ..
        mkdir lib app
        (cd lib && npm init -y >/dev/null)
        cd app
        npm init -y >/dev/null
        npm install --offline --no-audit --no-fund ../lib >/dev/null
        test -e node_modules/lib/package.json
        t=$(mktemp)
        echo x > "$t"
        rm "$t"
        echo all-ok
    "#;
    let out = run_script(&p.ws, script, None);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("all-ok"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(p.ws.join("repo/.git/HEAD").exists());
    assert!(p.ws.join("hello/target/debug/hello").exists());
    assert!(p.ws.join("app/node_modules/lib").exists());
    // The repository the agent created has its own hooks: writable, and not
    // protected (documented).
}

#[test]
fn a_hardlinked_file_in_an_island_refuses_to_arm() {
    if !require_kernel_features() {
        return;
    }
    let p = places();
    std::fs::hard_link(
        p.outside.join("existing"),
        p.ws.join(".zcode/acp/extra.json"),
    )
    .unwrap();
    let (out, _) = run_in_outer_ns(
        &p.ws,
        &[
            "run",
            "--workspace",
            p.ws.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            "echo ran",
        ],
        None,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(126), "{stderr}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("ran"));
    assert!(
        stderr.contains("extra.json") && stderr.contains("hard links"),
        "{stderr}"
    );
}

#[test]
fn doctor_reports_the_level_and_passes_its_self_test() {
    if !require_kernel_features() {
        return;
    }
    let p = places();
    let (out, unchanged) = run_in_outer_ns(
        &p.ws,
        &[
            "doctor",
            "--workspace",
            p.ws.to_str().unwrap(),
            "--backend",
            "codex-acp",
        ],
        None,
    );
    assert!(unchanged);
    let stdout = String::from_utf8_lossy(&out.stdout);
    // Which backend profile applies, and why.
    assert!(
        stdout.contains("backend profile: codex (") && stdout.contains("codex-acp"),
        "{stdout}"
    );
    // The user config's explicit choice overrides the guess.
    let home = p.ws.parent().unwrap().join("home");
    std::fs::create_dir_all(home.join(".config/zcode-acp")).unwrap();
    std::fs::write(
        home.join(".config/zcode-acp/config.json"),
        r#"{"sandbox": {"backendProfile": "gemini"}}"#,
    )
    .unwrap();
    let bin = bin_for(None).display().to_string();
    let argv: Vec<String> = [
        &bin,
        "doctor",
        "--workspace",
        p.ws.to_str().unwrap(),
        "--backend",
        "codex-acp",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let (chosen, _) = run_with_home(&p.ws, &argv, None, None, Some(&home));
    let chosen = String::from_utf8_lossy(&chosen.stdout);
    assert!(
        chosen.contains(
            "backend profile: gemini (chosen by sandbox.backendProfile in the user config)"
        ),
        "{chosen}"
    );
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("level that would be armed: full"),
        "{stdout}"
    );
    assert!(
        stdout.contains("written (as it must be)")
            && stdout.contains("denied (as it must be)")
            && stdout.contains("PASS"),
        "{stdout}"
    );
    assert!(
        stdout.contains(".git/hooks"),
        "the protected paths are listed: {stdout}"
    );
    assert!(
        stdout.contains("network: a network of its own; out through the sandbox's proxy: host loopback denied, LAN denied, public egress to the agent's API and the package registries (")
            && stdout.contains("reachable without a question: ")
            && stdout.contains("registry.npmjs.org"),
        "{stdout}"
    );
}

/// The user's runtime dir holds the session bus and the systemd user
/// manager's socket (`systemd-run --user` asks it to start anything,
/// unconfined). Inside the sandbox it is covered: a listener there cannot
/// be reached.
#[test]
fn the_users_runtime_dir_is_out_of_reach() {
    if !require_kernel_features() {
        return;
    }
    runtime_dir(&places(), None);
}

#[test]
fn the_users_runtime_dir_is_out_of_reach_as_an_unprivileged_user() {
    if !require_kernel_features() {
        return;
    }
    let user = TestUser::create();
    let p = user.places();
    runtime_dir(&p, Some(&user));
}

fn runtime_dir(p: &Places, user: Option<&TestUser>) {
    let uid = user.map_or(0, |u| u.uid);
    let runtime = PathBuf::from(format!("/run/user/{uid}"));
    let created = !runtime.exists();
    std::fs::create_dir_all(&runtime).unwrap();
    if let Some(u) = user {
        u.own(&runtime);
    }
    let sock = runtime.join(format!("zcode-acp-test-{}", std::process::id()));
    // Removes what this test made, even if it fails first.
    struct Cleanup(PathBuf, Option<PathBuf>);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
            if let Some(dir) = &self.1 {
                let _ = std::fs::remove_dir(dir);
            }
        }
    }
    let cleanup = Cleanup(sock.clone(), created.then(|| runtime.clone()));
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    // Anyone may connect, as to the user's own bus: only the sandbox stops it.
    std::fs::set_permissions(&sock, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    // Control: reachable from outside.
    assert!(std::os::unix::net::UnixStream::connect(&sock).is_ok());
    drop(listener.accept().unwrap());
    let script = format!(
        "/usr/bin/python3 -c 'import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])' {} 2>/dev/null && echo ESCAPE runtime-dir; echo done",
        sock.display()
    );
    let (out, unchanged) = run_in_outer_ns_as(
        &p.ws,
        &[
            "run",
            "--workspace",
            p.ws.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            &script,
        ],
        None,
        user,
    );
    assert!(
        unchanged,
        "the sandbox's mounts leaked into the outer namespace"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    drop(cleanup);
    assert!(
        stdout.contains("done") && !stdout.contains("ESCAPE"),
        "{stdout}"
    );
}

/// `zcode-acp run --backend-profile PROFILE --workspace WS -- sh -c SCRIPT`.
fn run_sh(user: Option<&TestUser>, profile: &str, ws: &Path, script: &str) -> Vec<String> {
    let bin = bin_for(user);
    [
        bin.to_str().unwrap(),
        "run",
        "--backend-profile",
        profile,
        "--workspace",
        ws.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        script,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Name-prefix grants: the supervisor makes Claude's saves of
/// `~/.claude.json` work (a temporary file created exclusively and a lock
/// directory beside it, renamed over it) while the home directory stays
/// closed to every other name, to symlinks, to set-user-ID bits and to
/// in-place writes, checked on disk.
#[test]
fn name_prefix_grants_in_the_home_directory() {
    if !require_kernel_features() {
        return;
    }
    let p = places();
    name_prefix_grants(&p, None, &p.ws.parent().unwrap().join("home"));
}

#[test]
fn name_prefix_grants_in_the_home_directory_as_an_unprivileged_user() {
    if !require_kernel_features() {
        return;
    }
    let user = TestUser::create();
    let p = user.places();
    let home = user.base.join("home");
    name_prefix_grants(&p, Some(&user), &home);
    // The supervisor acts with the user's own rights: where the user may not
    // create entries (a home made read-only for them), it may not either.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&home, PermissionsExt::from_mode(0o555)).unwrap();
    let script = format!(
        "mkdir {h}/.claude.json.dac && echo made; set -C; echo x > {h}/.claude.json.dac2 && echo made2; echo done",
        h = home.display()
    );
    let argv = run_sh(Some(&user), "claude", &p.ws, &script);
    let (out, _) = run_with_home(&p.ws, &argv, None, Some(&user), Some(&home));
    std::fs::set_permissions(&home, PermissionsExt::from_mode(0o755)).unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("done") && !stdout.contains("made"),
        "{stdout}"
    );
    assert!(!home.join(".claude.json.dac").exists());
}

fn name_prefix_grants(p: &Places, user: Option<&TestUser>, home: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(home).unwrap();
    // JSON, as Claude keeps it: a change the audit after the run can read
    // as one that runs nothing.
    std::fs::write(home.join(".claude.json"), "{\"v\":\"old\"}\n").unwrap();
    std::fs::write(home.join(".bashrc"), "original\n").unwrap();
    std::fs::set_permissions(home.join(".bashrc"), PermissionsExt::from_mode(0o644)).unwrap();
    // A dotfile manager's symlink that happens to carry the prefix.
    std::os::unix::fs::symlink(home.join(".bashrc"), home.join(".claude.json.link")).unwrap();
    // A second name of .bashrc that happens to carry the prefix: writing
    // it must not reach .bashrc.
    std::fs::hard_link(home.join(".bashrc"), home.join(".claude.json.hl-old")).unwrap();
    // A lock directory a crashed run left behind: it must stay removable.
    std::fs::create_dir(home.join(".claude.json.stale-lock")).unwrap();
    std::fs::write(p.ws.join("moved-in"), "x").unwrap();
    let race = p.ws.join("prefix_race.py");
    std::fs::copy(
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/prefix_race.py"),
        &race,
    )
    .unwrap();
    if let Some(u) = user {
        u.own(home);
        u.own(&p.ws);
    }
    let h = home.display();
    let name = home.file_name().unwrap().to_string_lossy();
    let ws = p.ws.display();
    let script = format!(
        r#"t() {{ label=$1; shift; if ( "$@" ) >/dev/null 2>&1; then echo "$label=ok"; else echo "$label=no"; fi; }}
t save sh -c 'set -C; echo {{\"v\":\"new\"}} > {h}/.claude.json.tmp.1 && mv {h}/.claude.json.tmp.1 {h}/.claude.json'
t lock sh -c 'mkdir {h}/.claude.json.lock && touch {h}/.claude.json.lock && rmdir {h}/.claude.json.lock'
t relative sh -c 'cd {h} && set -C && echo rel > .claude.json.rel'
t read-back sh -c 'test "$(cat {h}/.claude.json)" = {{\"v\":\"new\"}}'
t suid python3 -c 'import os; os.open("{h}/.claude.json.bin", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o4755)'
t in-place sh -c 'echo {{\"v\":\"over\"}} > {h}/.claude.json'
t stale-lock rmdir {h}/.claude.json.stale-lock
t no-fd-left timeout 10 python3 -c '
import os, resource
resource.setrlimit(resource.RLIMIT_NOFILE, (16, 16))
held = []
try:
    while True: held.append(os.open("/dev/null", 0))
except OSError: pass
try:
    os.open("{h}/.claude.json.nofd", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
except OSError: raise SystemExit(0)
raise SystemExit(1)'
t bashrc sh -c 'echo evil > {h}/.bashrc'
t profile sh -c 'echo evil > {h}/.bash_profile'
t through-link sh -c 'echo evil > {h}/.claude.json.link'
t chmod-link chmod 666 {h}/.claude.json.link
t rename-out sh -c 'set -C; echo x > {h}/.claude.json.x && mv {h}/.claude.json.x {h}/.profile'
t rename-in python3 -c 'import os; os.rename("{ws}/moved-in", "{h}/.claude.json.in")'
t hardlink ln {h}/.bashrc {h}/.claude.json.hl
t symlink ln -s {h}/.bashrc {h}/.claude.json.sl
t symlink-sibling ln -s .bashrc {h}/.claude.json.sl2
t symlink-absent sh -c 'cd {h} && ln -s .bash_profile .claude.json.sl3'
t symlink-note sh -c 'cd {h} && ln -s host:1 .claude.json.note'
t symlink-over python3 -c 'import os; os.chdir("{h}"); os.rename(".claude.json.note", ".claude.json.moved")'
t second-name sh -c 'echo evil > {h}/.claude.json.hl-old'
t dotdot sh -c 'echo x > {h}/../{name}/.claude.json.dd'
t managed sh -c 'echo x > {h}/.zcode-acp/x'
t race python3 {race} {h}
"#,
        race = race.display()
    );
    let argv = run_sh(user, "claude", &p.ws, &script);
    let (out, unchanged) = run_with_home(&p.ws, &argv, None, user, Some(home));
    assert!(
        unchanged,
        "the sandbox's mounts leaked into the outer namespace"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let result = |label: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{label}=")))
            .unwrap_or_else(|| {
                panic!(
                    "no result for {label}: {stdout}\n{}",
                    String::from_utf8_lossy(&out.stderr)
                )
            })
            .to_owned()
    };
    for ok in [
        "save",
        "lock",
        "relative",
        "read-back",
        "stale-lock",
        "in-place",
        "symlink-note",
        "no-fd-left",
        // Creates went through while the path flipped under them, and the
        // flipped name was never made.
        "race",
    ] {
        assert_eq!(
            result(ok),
            "ok",
            "{ok}: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for no in [
        // A set-user-ID mode is refused outright (the seccomp filter).
        "suid",
        "bashrc",
        "profile",
        "through-link",
        "chmod-link",
        "rename-out",
        "rename-in",
        "hardlink",
        "symlink",
        "symlink-sibling",
        "symlink-absent",
        "symlink-over",
        "second-name",
        "dotdot",
        "managed",
    ] {
        assert_eq!(result(no), "no", "{no} got through: {stdout}");
    }
    // On disk: the saves landed (the last one in place), nothing else
    // changed.
    assert_eq!(content(&home.join(".claude.json")), "{\"v\":\"over\"}\n");
    // The rename out of the prefix was refused after the create it needs
    // went through (so the refusal is the rename's).
    assert!(home.join(".claude.json.x").exists());
    assert!(!home.join(".profile").exists());
    assert_eq!(content(&home.join(".claude.json.rel")), "rel\n");
    assert!(!home.join(".claude.json.lock").exists());
    assert!(!home.join(".claude.json.tmp.1").exists());
    assert_eq!(content(&home.join(".bashrc")), "original\n");
    let mode = |f: &str| {
        std::fs::metadata(home.join(f))
            .unwrap()
            .permissions()
            .mode()
    };
    assert_eq!(mode(".bashrc") & 0o7777, 0o644);
    assert!(!home.join(".claude.json.bin").exists());
    for absent in [
        ".bash_profile",
        ".profile",
        ".claude.json.in",
        ".claude.json.hl",
        ".claude.json.sl",
        ".claude.json.sl2",
        ".claude.json.sl3",
        ".claude.json.moved",
        ".claude.json.dd",
    ] {
        assert!(
            std::fs::symlink_metadata(home.join(absent)).is_err(),
            "{absent} exists"
        );
    }
    assert!(p.ws.join("moved-in").exists());
    // Files the supervisor made belong to the user, as the agent's own would.
    use std::os::unix::fs::MetadataExt;
    let owner = std::fs::metadata(home.join(".claude.json.rel"))
        .unwrap()
        .uid();
    assert_eq!(owner, user.map_or(0, |u| u.uid));
}

/// A name-prefix grant does not depend on the calls a program picks: each
/// way of making, replacing or removing a name (raw system calls, so no
/// libc picks another) works for a granted name in HOME and is refused for
/// `~/.profile` and `~/.bashrc`, checked on disk.
#[test]
fn every_call_that_makes_a_name_works_for_granted_names_only() {
    if !require_kernel_features() {
        return;
    }
    let p = places();
    let home = p.ws.parent().unwrap().join("home");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(home.join(".bashrc"), "original\n").unwrap();
    let fixture = p.ws.join("prefix_calls.py");
    std::fs::copy(
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/prefix_calls.py"
        ),
        &fixture,
    )
    .unwrap();
    let script = format!("python3 {} {}", fixture.display(), home.display());
    let argv = run_sh(None, "claude", &p.ws, &script);
    let (out, unchanged) = run_with_home(&p.ws, &argv, None, None, Some(&home));
    assert!(
        unchanged,
        "the sandbox's mounts leaked into the outer namespace"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(
        lines.len() >= 11,
        "the calls did not all run: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in &lines {
        assert!(
            line.ends_with(" granted=ok other=no"),
            "{line}\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // On disk: every granted name the calls made is there; the others are
    // not, and .bashrc is as it was.
    for made in [
        ".claude.json.oe",
        ".claude.json.oc",
        ".claude.json.oct",
        ".claude.json.oa",
        ".claude.json.rn-to",
        ".claude.json.ln-to",
        ".claude.json.sl",
        ".claude.json.dir",
    ] {
        assert!(
            std::fs::symlink_metadata(home.join(made)).is_ok(),
            "{made} missing"
        );
    }
    assert_eq!(content(&home.join(".claude.json.tr")), "");
    assert!(!home.join(".claude.json.rm").exists());
    assert!(std::fs::symlink_metadata(home.join(".profile")).is_err());
    assert_eq!(content(&home.join(".bashrc")), "original\n");
}

/// Every sandbox gets the seccomp filter (one more than outside); only a
/// plan with name-prefix grants has a supervisor behind it.
#[test]
fn every_sandbox_is_filtered_and_only_prefix_grants_are_supervised() {
    if !require_kernel_features() {
        return;
    }
    let p = places();
    let home = p.ws.parent().unwrap().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let outside = std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("Seccomp_filters:"))
        .map(|v| v.trim().parse::<u32>().unwrap())
        .unwrap();
    for profile in ["claude", "codex"] {
        let argv = run_sh(
            None,
            profile,
            &p.ws,
            "grep Seccomp_filters /proc/self/status",
        );
        let (out, _) = run_with_home(&p.ws, &argv, None, None, Some(&home));
        let inside = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .last()
            .and_then(|n| n.parse::<u32>().ok())
            .unwrap_or_else(|| panic!("{out:?}"));
        assert_eq!(inside, outside + 1, "{profile}");
    }
    let plan = |profile: &str| {
        let out = Command::new(BIN)
            .args([
                "profile",
                "--target",
                "linux",
                "--backend-profile",
                profile,
                "--workspace",
            ])
            .arg(&p.ws)
            .env("HOME", &home)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let section = text.split("# 9.").nth(1).unwrap_or("").to_owned();
        section.lines().nth(1).unwrap_or("").to_owned()
    };
    assert!(
        plan("claude").ends_with(".claude.json*"),
        "{}",
        plan("claude")
    );
    assert!(plan("codex").trim().is_empty(), "{}", plan("codex"));
}

// ---- Side doors: what an agent could change outside without writing a file.

/// A System V shared-memory segment made outside (as another program's
/// would be), removed when dropped even if the test fails.
struct Segment {
    id: i32,
    addr: *mut libc::c_void,
}

impl Segment {
    fn create() -> Segment {
        // SAFETY: plain System V calls on a segment this test creates; the
        // address is checked before use and detached in Drop.
        unsafe {
            let id = libc::shmget(libc::IPC_PRIVATE, 4096, libc::IPC_CREAT | 0o666);
            assert!(id >= 0, "shmget: {}", std::io::Error::last_os_error());
            let addr = libc::shmat(id, std::ptr::null(), 0);
            assert_ne!(addr as isize, -1, "shmat");
            std::ptr::copy_nonoverlapping(b"original".as_ptr(), addr as *mut u8, 8);
            Segment { id, addr }
        }
    }

    fn content(&self) -> Vec<u8> {
        // SAFETY: `addr` maps 4096 bytes of our segment.
        unsafe { std::slice::from_raw_parts(self.addr as *const u8, 8).to_vec() }
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: detaches and removes the segment this test made.
        unsafe {
            libc::shmdt(self.addr);
            libc::shmctl(self.id, libc::IPC_RMID, std::ptr::null_mut());
        }
    }
}

/// POSIX message queues by name, removed when dropped.
struct Queues(Vec<std::ffi::CString>);

impl Queues {
    fn exists(name: &std::ffi::CStr) -> bool {
        // SAFETY: opens (and at once closes) a queue by name.
        unsafe {
            let q = libc::mq_open(name.as_ptr(), libc::O_RDONLY);
            if q >= 0 {
                libc::mq_close(q);
            }
            q >= 0
        }
    }
}

impl Drop for Queues {
    fn drop(&mut self) {
        for n in &self.0 {
            // SAFETY: removes a queue this test named.
            unsafe {
                libc::mq_unlink(n.as_ptr());
            }
        }
    }
}

/// Keys whose description this test chose: searched for in this
/// process's user keyring (the host's `@u`), and invalidated there when
/// dropped if one landed (a sandbox's own keyrings go with its user
/// namespace).
struct Keys(String);

impl Keys {
    /// The key of this description reachable from the host's `@u`.
    fn in_host_user_keyring(&self) -> Option<i64> {
        let kind = std::ffi::CString::new("user").unwrap();
        let desc = std::ffi::CString::new(self.0.as_str()).unwrap();
        // SAFETY: KEYCTL_SEARCH (10) of KEY_SPEC_USER_KEYRING (-4) with
        // NUL-terminated strings we own; no destination keyring.
        let id =
            unsafe { libc::syscall(libc::SYS_keyctl, 10, -4i64, kind.as_ptr(), desc.as_ptr(), 0) };
        (id >= 0).then_some(id)
    }
}

impl Drop for Keys {
    fn drop(&mut self) {
        if let Some(id) = self.in_host_user_keyring() {
            // SAFETY: KEYCTL_INVALIDATE (21) on a key this test made.
            unsafe {
                libc::syscall(libc::SYS_keyctl, 21, id);
            }
        }
    }
}

fn side_doors(p: &Places, user: Option<&TestUser>, fixture: &Path) {
    let seg = Segment::create();
    let tag = format!("zcode-acp-test-{:08x}", rand_u32());
    let outside_q = std::ffi::CString::new(format!("/{tag}-out")).unwrap();
    let inside_q = std::ffi::CString::new(format!("/{tag}-in")).unwrap();
    let queues = Queues(vec![outside_q.clone(), inside_q.clone()]);
    // SAFETY: creates a queue by name (removed by `queues`).
    let q = unsafe {
        libc::mq_open(
            outside_q.as_ptr(),
            libc::O_CREAT | libc::O_RDWR,
            0o666,
            std::ptr::null::<libc::mq_attr>(),
        )
    };
    assert!(q >= 0, "mq_open: {}", std::io::Error::last_os_error());
    // SAFETY: closes the descriptor just opened.
    unsafe { libc::mq_close(q) };
    let keys = Keys(tag.clone());
    let planted = p.ws.join("planted");
    let f = fixture.display();
    let script = format!(
        "python3 {f} shm {id}; python3 {f} mq-unlink {out}; python3 {f} mq-create {inn}; python3 {f} key {tag}; python3 {f} setuid {planted}",
        id = seg.id,
        out = outside_q.to_str().unwrap(),
        inn = inside_q.to_str().unwrap(),
        planted = planted.display()
    );
    // Around the sandbox, outside: a session keyring of its own (as a
    // login has), searched with the user's keyring afterwards.
    let mut argv = vec![
        "python3".to_owned(),
        fixture.display().to_string(),
        "around".to_owned(),
        tag.clone(),
    ];
    argv.extend(run_sh(user, "none", &p.ws, &script));
    let (out, unchanged) = run_argv_in_outer_ns_as(&p.ws, &argv, None, user);
    assert!(
        unchanged,
        "the sandbox's mounts leaked into the outer namespace"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    // Outside, nothing changed: the segment, the queues, the keyring.
    assert_eq!(
        seg.content(),
        b"original",
        "shared memory was written: {stdout}"
    );
    assert!(
        Queues::exists(&outside_q),
        "an outside queue was removed: {stdout}"
    );
    assert!(
        !Queues::exists(&inside_q),
        "a queue was made outside: {stdout}"
    );
    assert!(
        keys.in_host_user_keyring().is_none(),
        "a key reached the host's keyring: {stdout}"
    );
    // The attempts ran (each keyring inside took the key: its own), and
    // neither the session's keyring nor the user's outside has it.
    assert!(
        stdout.contains("key=ok") && stdout.contains("key-session=ok"),
        "{stdout}"
    );
    for outside in ["outside-session=absent", "outside-user=absent"] {
        assert!(stdout.contains(outside), "{outside}: {stdout}");
    }
    drop(queues);
    // No setuid or setgid bit on disk, however it was asked for.
    use std::os::unix::fs::PermissionsExt;
    for f in [
        planted.clone(),
        p.ws.join("planted.created"),
        p.ws.join("planted.node"),
    ] {
        if let Ok(m) = std::fs::metadata(&f) {
            assert_eq!(
                m.permissions().mode() & 0o6000,
                0,
                "{}: {stdout}",
                f.display()
            );
        }
    }
    for attempt in [
        "chmod-suid",
        "chmod-sgid",
        "open-suid",
        "fchmod-suid",
        "mknod-suid",
    ] {
        assert!(
            stdout.contains(&format!("{attempt}=no")),
            "{attempt}: {stdout}"
        );
    }
    assert!(planted.exists(), "the plain file was written: {stdout}");
}

#[test]
fn side_doors_stay_shut() {
    if !require_kernel_features() {
        return;
    }
    let p = places();
    let fixture = p.ws.parent().unwrap().join("sidedoors.py");
    std::fs::copy(
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/sidedoors.py"),
        &fixture,
    )
    .unwrap();
    side_doors(&p, None, &fixture);
}

#[test]
fn side_doors_stay_shut_as_an_unprivileged_user() {
    if !require_kernel_features() {
        return;
    }
    let user = TestUser::create();
    let p = user.places();
    let fixture = user.base.join("bin/sidedoors.py");
    std::fs::copy(
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/sidedoors.py"),
        &fixture,
    )
    .unwrap();
    side_doors(&p, Some(&user), &fixture);
}

/// Git indirections: the `core.hooksPath` target (husky's `.husky` in the
/// work tree), a submodule's own git directory (`.git/modules/NAME`:
/// config and hooks) and a worktree's `commondir` are protected like
/// `.git/config` and `.git/hooks`: plants fail at the write.
#[test]
fn git_indirections_cannot_be_planted() {
    if !require_kernel_features() {
        return;
    }
    git_indirections(&places(), None);
}

#[test]
fn git_indirections_cannot_be_planted_as_an_unprivileged_user() {
    if !require_kernel_features() {
        return;
    }
    let user = TestUser::create();
    git_indirections(&user.places(), Some(&user));
}

fn git_indirections(p: &Places, user: Option<&TestUser>) {
    let git = |args: &[&str], dir: &Path| {
        let ok = Command::new("git")
            .args(["-c", "user.email=t@e", "-c", "user.name=t"])
            .args(args)
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap()
            .success();
        assert!(ok, "git {args:?}");
    };
    let repo = p.ws.join("app");
    std::fs::create_dir_all(repo.join(".husky")).unwrap();
    git(&["init", "-q"], &repo);
    git(&["config", "core.hooksPath", ".husky"], &repo);
    std::fs::write(repo.join(".husky/pre-commit"), "#!/bin/sh\nexit 0\n").unwrap();
    std::fs::write(repo.join(".pre-commit-config.yaml"), "repos: []\n").unwrap();
    // husky 9: git runs the stubs in `.husky/_`, which run `.husky/NAME`.
    let repo9 = p.ws.join("app9");
    std::fs::create_dir_all(repo9.join(".husky/_")).unwrap();
    git(&["init", "-q"], &repo9);
    git(&["config", "core.hooksPath", ".husky/_"], &repo9);
    std::fs::write(repo9.join(".husky/pre-commit"), "npm test\n").unwrap();
    // A submodule's git directory, as `git submodule add` leaves it.
    let module = repo.join(".git/modules/lib");
    std::fs::create_dir_all(module.join("hooks")).unwrap();
    std::fs::write(module.join("HEAD"), "ref: refs/heads/main\n").unwrap();
    std::fs::write(module.join("config"), "[core]\n").unwrap();
    // A worktree of it, whose git dir points back through `commondir`.
    git(&["commit", "-q", "--allow-empty", "-m", "x"], &repo);
    let wt = p.ws.join("wt");
    git(&["worktree", "add", "-q", wt.to_str().unwrap()], &repo);
    let wt_git = repo.join(".git/worktrees/wt");
    assert!(wt_git.join("commondir").is_file());
    // And one outside the workspace (`git worktree add ../feature`), whose
    // git dir is inside it all the same.
    let feature = p.outside.join("feature");
    git(&["worktree", "add", "-q", feature.to_str().unwrap()], &repo);
    let feature_git = repo.join(".git/worktrees/feature");
    assert!(feature_git.join("commondir").is_file());
    let script = format!(
        "echo evil > {a}/.husky/pre-commit; echo evil > {a}/.husky/post-checkout; \
         echo evil >> {a}/.pre-commit-config.yaml; echo evil > {a9}/.husky/pre-commit; \
         echo '[core] fsmonitor = evil' >> {m}/config; echo evil > {m}/hooks/post-checkout; \
         echo {o} > {w}/commondir; echo {o} > {f}/commondir; \
         echo ok > {a}/plain.txt; echo done",
        a = repo.display(),
        a9 = repo9.display(),
        m = module.display(),
        o = p.outside.display(),
        w = wt_git.display(),
        f = feature_git.display(),
    );
    if let Some(u) = user {
        u.own(&p.ws);
    }
    let argv = run_sh(user, "none", &p.ws, &script);
    let (out, unchanged) = run_argv_in_outer_ns_as(&p.ws, &argv, None, user);
    assert!(
        unchanged,
        "the sandbox's mounts leaked into the outer namespace"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("done"), "{stdout}");
    assert_eq!(
        content(&repo.join(".husky/pre-commit")),
        "#!/bin/sh\nexit 0\n"
    );
    assert!(!repo.join(".husky/post-checkout").exists());
    assert_eq!(
        content(&repo.join(".pre-commit-config.yaml")),
        "repos: []\n"
    );
    assert_eq!(content(&repo9.join(".husky/pre-commit")), "npm test\n");
    assert_eq!(content(&module.join("config")), "[core]\n");
    assert!(!module.join("hooks/post-checkout").exists());
    assert!(!content(&wt_git.join("commondir")).contains("outside"));
    assert!(!content(&feature_git.join("commondir")).contains("outside"));
    assert_eq!(
        content(&repo.join("plain.txt")),
        "ok\n",
        "the work tree stays writable"
    );
}

/// Root's sandbox maps the whole id range onto itself: a file of another
/// owner keeps its owner inside (not nobody), and git's ownership check
/// takes a repository of another user's as it does outside.
#[test]
fn root_sees_every_owner_as_it_is() {
    if !require_kernel_features() {
        return;
    }
    let p = places();
    let theirs = p.ws.join("theirs");
    std::fs::create_dir_all(&theirs).unwrap();
    let ok = Command::new("git")
        .args(["init", "-q"])
        .current_dir(&theirs)
        .status()
        .unwrap()
        .success();
    assert!(ok);
    std::os::unix::fs::chown(&theirs, Some(12345), Some(12346)).unwrap();
    let script = format!(
        "export GIT_CONFIG_GLOBAL=/dev/null GIT_CONFIG_NOSYSTEM=1; stat -c owner=%u:%g {t}; cd {t} && git status >/dev/null 2>&1 && echo git-status-ran; \
         git -c safe.directory={t} status >/dev/null 2>&1 && echo trusted-ran; echo done",
        t = theirs.display()
    );
    let argv = run_sh(None, "none", &p.ws, &script);
    let (out, unchanged) = run_argv_in_outer_ns_as(&p.ws, &argv, None, None);
    assert!(
        unchanged,
        "the sandbox's mounts leaked into the outer namespace"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("owner=12345:12346"), "{stdout}");
    // As outside: git refuses a repository root does not own, until told to
    // trust it.
    assert!(
        !stdout.contains("git-status-ran") && stdout.contains("trusted-ran"),
        "{stdout}"
    );
}

/// A workspace opened through a symlinked path works, and its
/// sandbox.json (read with no symlink followed below the root) holds: the
/// deny entry is enforced, the rest of the workspace is writable.
#[test]
fn a_workspace_opened_through_a_symlink_keeps_its_config() {
    if !require_kernel_features() {
        return;
    }
    let p = places();
    let secrets = p.ws.join("secrets");
    std::fs::create_dir_all(&secrets).unwrap();
    std::fs::create_dir_all(p.ws.join(".zcode/acp")).unwrap();
    // Adding a deny entry needs no approval.
    std::fs::write(
        p.ws.join(".zcode/acp/sandbox.json"),
        format!("{{\"deny\": [\"{}\"]}}\n", secrets.display()),
    )
    .unwrap();
    let link = p.ws.parent().unwrap().join("ws-link");
    std::os::unix::fs::symlink(&p.ws, &link).unwrap();
    let script = format!(
        "echo n > {l}/notes.txt && echo wrote-notes; echo k > {l}/secrets/key && echo wrote-key; echo done",
        l = link.display()
    );
    let argv = run_sh(None, "none", &link, &script);
    let (out, unchanged) = run_argv_in_outer_ns_as(&p.ws, &argv, None, None);
    assert!(
        unchanged,
        "the sandbox's mounts leaked into the outer namespace"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("done") && stdout.contains("wrote-notes") && !stdout.contains("wrote-key"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(content(&p.ws.join("notes.txt")), "n\n");
    assert!(!secrets.join("key").exists(), "the deny entry did not hold");
}

/// Every writable bind is `nosuid`: a setuid file that got there some
/// other way (the seccomp filter refuses setting the bit) still runs with
/// the caller's rights. Read from the sandbox's own mount table.
#[test]
fn writable_binds_are_nosuid() {
    if !require_kernel_features() {
        return;
    }
    writable_nosuid(&places(), None);
}

#[test]
fn writable_binds_are_nosuid_as_an_unprivileged_user() {
    if !require_kernel_features() {
        return;
    }
    let user = TestUser::create();
    writable_nosuid(&user.places(), Some(&user));
}

fn writable_nosuid(p: &Places, user: Option<&TestUser>) {
    // Field 5 of a mountinfo line is the mount point, field 6 its options.
    let script = format!(
        "touch {ws}/probe && echo writable; awk '$5 == \"{ws}\" {{print \"options=\" $6}}' /proc/self/mountinfo",
        ws = p.ws.display()
    );
    let argv = run_sh(user, "none", &p.ws, &script);
    let (out, unchanged) = run_argv_in_outer_ns_as(&p.ws, &argv, None, user);
    assert!(
        unchanged,
        "the sandbox's mounts leaked into the outer namespace"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let options: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("options="))
        .collect();
    assert!(stdout.contains("writable"), "{stdout}");
    assert!(
        !options.is_empty(),
        "the workspace is no mount of its own: {stdout}"
    );
    // The topmost mount there is the one that counts.
    let top = options.last().unwrap();
    assert!(
        top.split(',').any(|o| o == "rw") && top.split(',').any(|o| o == "nosuid"),
        "{stdout}"
    );
}

/// Protected paths that are symlinks (a `.git/hooks` kept in the work tree,
/// a shared `.vscode`, an `.envrc` link), and a linked worktree's `.git`
/// file: none can be removed and replaced by a file of the sandbox's, and
/// what a link leads to stays read-only; plain files beside them stay
/// writable.
#[test]
fn protected_links_and_git_files_cannot_be_replaced() {
    if !require_kernel_features() {
        return;
    }
    protected_links(&places(), None);
}

#[test]
fn protected_links_and_git_files_cannot_be_replaced_as_an_unprivileged_user() {
    if !require_kernel_features() {
        return;
    }
    let user = TestUser::create();
    let p = user.places();
    protected_links(&p, Some(&user));
}

fn protected_links(p: &Places, user: Option<&TestUser>) {
    let git = |args: &[&str], dir: &Path| {
        let ok = Command::new("git")
            .args(["-c", "user.email=t@e", "-c", "user.name=t"])
            .args(args)
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap()
            .success();
        assert!(ok, "git {args:?}");
    };
    let repo = p.ws.join("app");
    std::fs::create_dir_all(repo.join("tools/hooks")).unwrap();
    std::fs::write(repo.join("tools/hooks/pre-commit"), "#!/bin/sh\nexit 0\n").unwrap();
    git(&["init", "-q"], &repo);
    git(&["commit", "-q", "--allow-empty", "-m", "x"], &repo);
    std::fs::remove_dir_all(repo.join(".git/hooks")).unwrap();
    std::os::unix::fs::symlink("../tools/hooks", repo.join(".git/hooks")).unwrap();
    std::fs::create_dir(repo.join("shared-vscode")).unwrap();
    std::fs::write(repo.join("shared-vscode/settings.json"), "{}\n").unwrap();
    std::os::unix::fs::symlink("shared-vscode", repo.join(".vscode")).unwrap();
    std::fs::write(repo.join("envrc.shared"), "export A=1\n").unwrap();
    std::os::unix::fs::symlink("envrc.shared", repo.join(".envrc")).unwrap();
    // A chain: `.lefthook.yml -> conf/current`, where `conf/current ->
    // ../rel2/lefthook.yml`; and a link to nothing: `.mcp.json ->
    // shared/mcp.json`, which does not exist yet.
    std::fs::create_dir_all(repo.join("conf")).unwrap();
    std::fs::create_dir_all(repo.join("rel2")).unwrap();
    std::fs::write(repo.join("rel2/lefthook.yml"), "pre-commit: {}\n").unwrap();
    std::os::unix::fs::symlink("../rel2/lefthook.yml", repo.join("conf/current")).unwrap();
    std::os::unix::fs::symlink("conf/current", repo.join(".lefthook.yml")).unwrap();
    std::fs::create_dir_all(repo.join("shared")).unwrap();
    std::os::unix::fs::symlink("shared/mcp.json", repo.join(".mcp.json")).unwrap();
    // A repository whose `.git` is a symlink to its git directory.
    let other = p.ws.join("other");
    std::fs::create_dir_all(&other).unwrap();
    git(
        &[
            "init",
            "-q",
            "--separate-git-dir",
            p.ws.join("other.git").to_str().unwrap(),
        ],
        &other,
    );
    std::fs::remove_file(other.join(".git")).unwrap();
    std::os::unix::fs::symlink("../other.git", other.join(".git")).unwrap();
    let wt = p.ws.join("wt");
    git(&["worktree", "add", "-q", wt.to_str().unwrap()], &repo);
    let gitfile = content(&wt.join(".git"));
    assert!(gitfile.starts_with("gitdir:"), "{gitfile}");
    if let Some(u) = user {
        u.own(&p.ws);
    }
    let script = format!(
        "cd {a}; \
         rm .git/hooks; mkdir .git/hooks; echo evil > .git/hooks/pre-commit; mv .git/hooks .git/h2; \
         echo evil > tools/hooks/pre-commit; echo evil > .git/hooks/post-checkout; \
         mv tools t2; \
         rm .vscode; mkdir .vscode; echo '{{}}' > .vscode/tasks.json; mv .vscode v2; \
         echo evil > shared-vscode/tasks.json; \
         rm .envrc; echo evil > .envrc; mv .envrc e2; echo evil > envrc.shared; \
         echo 'gitdir: {ws}/evil' > {w}/.git; rm {w}/.git; \
         rm conf/current; ln -s ../evil conf/current; echo evil > rel2/lefthook.yml; \
         echo '{{}}' > shared/mcp.json; \
         echo evil > {ws}/other.git/hooks/pre-commit; rm {ws}/other/.git; \
         echo ok > plain.txt; echo done",
        a = repo.display(),
        ws = p.ws.display(),
        w = wt.display(),
    );
    let argv = run_sh(user, "none", &p.ws, &script);
    let (out, unchanged) = run_argv_in_outer_ns_as(&p.ws, &argv, None, user);
    assert!(
        unchanged,
        "the sandbox's mounts leaked into the outer namespace"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("done"), "{stdout}");
    let link = |name: &str| std::fs::read_link(repo.join(name)).map(|l| l.display().to_string());
    assert_eq!(link(".git/hooks").as_deref().ok(), Some("../tools/hooks"));
    assert_eq!(link(".vscode").as_deref().ok(), Some("shared-vscode"));
    assert_eq!(link(".envrc").as_deref().ok(), Some("envrc.shared"));
    for gone in [
        ".git/h2",
        "t2",
        "v2",
        "e2",
        "tools/hooks/post-checkout",
        "shared-vscode/tasks.json",
    ] {
        assert!(!repo.join(gone).exists(), "{gone} was made");
    }
    assert_eq!(
        content(&repo.join("tools/hooks/pre-commit")),
        "#!/bin/sh\nexit 0\n"
    );
    assert_eq!(content(&repo.join("envrc.shared")), "export A=1\n");
    assert_eq!(content(&wt.join(".git")), gitfile);
    // The chain holds, link by link, and where it leads stays as it was.
    assert_eq!(
        link("conf/current").as_deref().ok(),
        Some("../rel2/lefthook.yml")
    );
    assert_eq!(content(&repo.join("rel2/lefthook.yml")), "pre-commit: {}\n");
    // Where the link to nothing leads cannot be kept from being made on
    // Linux; `run` reverts it when the command ends (the audit).
    assert!(
        !repo.join("shared/mcp.json").exists(),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The `.git` symlink of a repository is a pointer like a gitdir file,
    // and its git directory's hooks are protected.
    assert_eq!(
        std::fs::read_link(p.ws.join("other/.git")).ok(),
        Some(PathBuf::from("../other.git"))
    );
    assert!(!p.ws.join("other.git/hooks/pre-commit").exists());
    assert_eq!(
        content(&repo.join("plain.txt")),
        "ok\n",
        "the work tree stays writable"
    );
}

/// Under `zcode-acp run`, what did not exist when the sandbox was armed and
/// your own tools would run (a `.git/commondir` in a plain repository, the
/// `core.hooksPath` target, `.envrc`, `.vscode/`, `.mcp.json`) is created by
/// the command, and reverted when it ends: said on stderr, the command's
/// version kept where nothing runs it. Plain files stay.
#[test]
fn what_run_leaves_that_would_run_is_reverted() {
    if !require_kernel_features() {
        return;
    }
    let p = places();
    run_leaves(&p, None, &p.ws.parent().unwrap().join("home"));
}

/// The walks reuse what they listed of a directory unchanged since well
/// before (`src/listing.rs`): in a workspace whose directories have aged
/// past that margin, what the command plants in one of them is still found
/// and reverted.
#[test]
fn what_run_leaves_in_directories_listed_before_is_reverted() {
    if !require_kernel_features() {
        return;
    }
    let p = places();
    let home = p.ws.parent().unwrap().join("home");
    std::fs::create_dir_all(&home).unwrap();
    for d in ["app/sub/dir", ".tools"] {
        std::fs::create_dir_all(p.ws.join(d)).unwrap();
    }
    std::fs::write(p.ws.join("app/sub/dir/main.rs"), "fn main() {}\n").unwrap();
    std::fs::write(p.ws.join(".tools/lint.sh"), "true\n").unwrap();
    // Older than the margin (three seconds) when `run` lists them.
    std::thread::sleep(std::time::Duration::from_millis(3500));
    let script = "echo evil > app/sub/dir/.envrc; echo evil > .tools/build.sh; echo done";
    let argv = run_sh(None, "none", &p.ws, script);
    let (out, _) = run_with_home(&p.ws, &argv, None, None, Some(&home));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stdout.contains("done"), "{stdout} {stderr}");
    for planted in ["app/sub/dir/.envrc", ".tools/build.sh"] {
        assert!(
            std::fs::symlink_metadata(p.ws.join(planted)).is_err(),
            "{planted} is still there: {stderr}"
        );
    }
    assert_eq!(content(&p.ws.join("app/sub/dir/main.rs")), "fn main() {}\n");
    // The next run starts from what this one listed (saved in the managed
    // root): the same plants are found again, and a repository made
    // between the runs in a directory listed before is found too (its
    // hooks are not left behind).
    let saved = std::fs::read_dir(home.join(".zcode-acp/listings"))
        .map(|d| d.count())
        .unwrap_or(0);
    use nix::sys::statfs::{statfs, EXT4_SUPER_MAGIC, TMPFS_MAGIC, XFS_SUPER_MAGIC};
    let fs = statfs(&p.ws).unwrap().filesystem_type();
    if [EXT4_SUPER_MAGIC, XFS_SUPER_MAGIC, TMPFS_MAGIC].contains(&fs) {
        assert!(saved > 0, "the run saved no listings");
    } else {
        println!("skipped in part: listings are not kept on the workspace's file system");
    }
    let made = Command::new("git")
        .args(["init", "-q", "app/sub"])
        .current_dir(&p.ws)
        .status()
        .unwrap();
    assert!(made.success());
    let script = "echo evil > app/sub/dir/.envrc; echo evil > .tools/build.sh; \
        mkdir -p app/sub/.git/hooks; echo evil > app/sub/.git/hooks/pre-commit; echo done";
    let argv = run_sh(None, "none", &p.ws, script);
    let (out, _) = run_with_home(&p.ws, &argv, None, None, Some(&home));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stdout.contains("done"), "{stdout} {stderr}");
    for planted in [
        "app/sub/dir/.envrc",
        ".tools/build.sh",
        "app/sub/.git/hooks/pre-commit",
    ] {
        assert!(
            std::fs::symlink_metadata(p.ws.join(planted)).is_err(),
            "{planted} is still there after the second run: {stderr}"
        );
    }
}

/// The launcher sets the sandbox up while `run` takes the audit's
/// baseline, but starts the command only once the baseline is whole: a
/// baseline slowed down (by the test's knob) still predates what the
/// command leaves, which is reverted.
#[test]
fn the_command_starts_only_after_the_audits_baseline() {
    if !require_kernel_features() {
        return;
    }
    let p = places();
    let home = p.ws.parent().unwrap().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let script = "echo evil > .envrc; echo done";
    let mut argv: Vec<String> = vec!["env".into(), "ZCODE_ACP_TEST_SLOW_BASELINE=1".into()];
    argv.extend(run_sh(None, "none", &p.ws, script));
    let (out, _) = run_with_home(&p.ws, &argv, None, None, Some(&home));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stdout.contains("done"), "{stdout} {stderr}");
    assert!(
        std::fs::symlink_metadata(p.ws.join(".envrc")).is_err(),
        ".envrc is still there: the command ran before the baseline: {stderr}"
    );
}

#[test]
fn what_run_leaves_that_would_run_is_reverted_as_an_unprivileged_user() {
    if !require_kernel_features() {
        return;
    }
    let user = TestUser::create();
    let p = user.places();
    let home = user.base.join("home");
    run_leaves(&p, Some(&user), &home);
}

fn run_leaves(p: &Places, user: Option<&TestUser>, home: &Path) {
    std::fs::create_dir_all(home).unwrap();
    let repo = p.ws.join("app");
    std::fs::create_dir_all(&repo).unwrap();
    let ok = Command::new("git")
        .args(["init", "-q"])
        .current_dir(&repo)
        .status()
        .unwrap()
        .success()
        && Command::new("git")
            .args(["config", "core.hooksPath", ".husky"])
            .current_dir(&repo)
            .status()
            .unwrap()
            .success();
    assert!(ok);
    // A hidden file of the project's, which the command changes.
    std::fs::write(repo.join(".npmrc"), "ignore-scripts=true\n").unwrap();
    if let Some(u) = user {
        u.own(&p.ws);
        u.own(home);
    }
    let long = format!(".{}", "l".repeat(240));
    let script = format!(
        "cd {a}; echo {o} > .git/commondir; mkdir .husky; echo evil > .husky/pre-commit; \
         echo evil > .envrc; mkdir .vscode; echo '{{}}' > .vscode/tasks.json; echo '{{}}' > .mcp.json; \
         mkdir -p .cursor sub/dir .devcontainer; echo evil > .cursor/mcp.json; echo evil > sub/dir/.envrc; \
         echo evil > opencode.json; echo evil > .devcontainer/devcontainer.json; echo evil > {long}; \
         echo script-shell=/tmp/evil > .npmrc; \
         echo ok > plain.txt; echo done",
        a = repo.display(),
        o = p.outside.display(),
    );
    let argv = run_sh(user, "none", &p.ws, &script);
    let (out, unchanged) = run_with_home(&p.ws, &argv, None, user, Some(home));
    assert!(
        unchanged,
        "the sandbox's mounts leaked into the outer namespace"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stdout.contains("done"), "{stdout} {stderr}");
    assert!(out.status.success(), "{stderr}");
    for planted in [
        ".git/commondir",
        ".husky",
        ".envrc",
        ".vscode",
        ".mcp.json",
        ".cursor",
        "sub/dir/.envrc",
        "opencode.json",
        ".devcontainer",
        long.as_str(),
    ] {
        assert!(
            std::fs::symlink_metadata(repo.join(planted)).is_err(),
            "{planted} is still there: {stderr}"
        );
        assert!(
            stderr.contains(&format!("reverted {}", repo.join(planted).display())),
            "{planted}: {stderr}"
        );
    }
    assert_eq!(content(&repo.join("plain.txt")), "ok\n");
    // A hidden file of yours the command changed is put back.
    assert_eq!(
        content(&repo.join(".npmrc")),
        "ignore-scripts=true\n",
        "{stderr}"
    );
    // The command's versions are kept, where nothing runs them: one
    // directory per finding, and an index saying which is what.
    let kept: Vec<PathBuf> = std::fs::read_dir(home.join(".zcode-acp/reverted"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(kept.len(), 1, "{kept:?}");
    let index = content(&kept[0].join("index.txt"));
    let line = index
        .lines()
        .find(|l| l.contains(&format!("{}:", repo.join(".envrc").display())))
        .unwrap_or_else(|| panic!("{index}"));
    let n = line.split(':').next().unwrap();
    assert_eq!(content(&kept[0].join(n).join(".envrc")), "evil\n");
    // A name as long as the filesystem takes is kept too.
    let line = index
        .lines()
        .find(|l| l.contains(&format!("{}:", repo.join(&long).display())))
        .unwrap_or_else(|| panic!("{index}"));
    let n = line.split(':').next().unwrap();
    assert_eq!(content(&kept[0].join(n).join(&long)), "evil\n");
}

/// `zcode-acp run` is watched as the bridge's agent is: what the command
/// plants is undone while it still runs (the command itself sees it gone),
/// not only when it ends; what it plants at once, before the watcher
/// starts (a short command is only looked at when it ends), too.
#[test]
fn what_run_plants_is_undone_while_it_runs() {
    if !require_kernel_features() {
        return;
    }
    let p = places();
    let home = p.ws.parent().unwrap().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let script = "mkdir -p early; echo evil > early/.envrc; \
                  for i in $(seq 50); do [ -e early/.envrc ] || break; sleep 0.1; done; \
                  [ -e early/.envrc ] && echo early-still-there || echo early-gone; \
                  mkdir -p sub; echo evil > sub/.envrc; \
                  for i in $(seq 50); do [ -e sub/.envrc ] || break; sleep 0.1; done; \
                  [ -e sub/.envrc ] && echo still-there || echo gone";
    let argv = run_sh(None, "none", &p.ws, script);
    let (out, _) = run_with_home(&p.ws, &argv, None, None, Some(&home));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stdout.contains("early-gone"), "{stdout} {stderr}");
    assert!(stdout.lines().any(|l| l == "gone"), "{stdout} {stderr}");
    assert!(!stdout.contains("still-there"), "{stdout} {stderr}");
    for planted in ["early/.envrc", "sub/.envrc"] {
        assert!(
            stderr.contains(&format!("reverted {}", p.ws.join(planted).display())),
            "{stderr}"
        );
    }
}

/// A directory the command makes listable but not searchable (mode 644)
/// hides nothing from the look at its end: it is given back (it is the
/// user's own) and a repository planted in a build environment inside is
/// found and its config undone. Run as a user (root searches anything).
#[test]
fn what_run_hides_in_an_unsearchable_directory_is_found() {
    if !require_kernel_features() {
        return;
    }
    let user = TestUser::create();
    let p = user.places();
    let script = "mkdir -p d/node_modules && git init -q d/node_modules && \
                  git -C d/node_modules config core.fsmonitor 'touch /nonexistent/x; false' && \
                  chmod 644 d && echo planted";
    let argv = run_sh(Some(&user), "none", &p.ws, script);
    let (out, _) = run_argv_in_outer_ns_as(&p.ws, &argv, None, Some(&user));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stdout.contains("planted"), "{stdout} {stderr}");
    let repo = p.ws.join("d/node_modules");
    assert!(
        stderr.contains(&repo.display().to_string()),
        "the planted repository was not found: {stderr}"
    );
    let fsmonitor = Command::new("git")
        .args(["config", "--file"])
        .arg(repo.join(".git/config"))
        .args(["--get", "core.fsmonitor"])
        .output()
        .unwrap();
    assert!(
        fsmonitor.stdout.is_empty(),
        "core.fsmonitor is still set: {stderr}"
    );
}

/// A workspace that is the home directory itself: the audit still undoes
/// a plant, and leaves zcode-acp's own directory and the agent's state and
/// caches (which the policy makes writable) alone.
#[test]
fn the_audit_of_a_home_workspace_leaves_zcode_acps_own_directory_alone() {
    if !require_kernel_features() {
        return;
    }
    let p = places();
    let home = p.ws.clone();
    let script = "echo evil > .envrc; mkdir -p .cache/x && echo c > .cache/x/f; echo done";
    let argv = run_sh(None, "none", &home, script);
    let (out, _) = run_with_home(&home, &argv, None, None, Some(&home));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stdout.contains("done"), "{stdout} {stderr}");
    assert!(!home.join(".envrc").exists(), "{stderr}");
    let reverted: Vec<&str> = stderr.lines().filter(|l| l.contains("reverted")).collect();
    assert_eq!(reverted.len(), 1, "{stderr}");
    assert!(home.join(".zcode-acp/reverted").is_dir(), "{stderr}");
}

/// `zcode-acp run` waits as a shell does: the command gets SIGPIPE's
/// default back (a pipeline ends quietly when its reader does), a SIGTERM
/// sent to `run` reaches the command (which ends with it, and `run` says
/// so in its exit code), and what the command left is still audited.
#[test]
fn run_passes_signals_on_and_audits_after_them() {
    if !require_kernel_features() {
        return;
    }
    let p = places();
    let argv = run_sh(None, "none", &p.ws, "yes | head -n 1");
    let (out, _) = run_argv_in_outer_ns_as(&p.ws, &argv, None, None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "y\n", "{stderr}");
    assert!(
        !stderr.contains("Broken pipe") && !stderr.contains("yes:"),
        "{stderr}"
    );

    let home = p.ws.parent().unwrap().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let started = p.ws.join("started");
    let script = format!(
        "echo evil > .envrc; touch {}; exec sleep 60",
        started.display()
    );
    let mut cmd = Command::new(BIN);
    cmd.args(["run", "--backend-profile", "none", "--workspace"])
        .arg(&p.ws)
        .args(["--", "sh", "-c", &script])
        .current_dir(&p.ws)
        .env("HOME", &home)
        .stdin(Stdio::null())
        .stderr(Stdio::piped());
    // In a mount namespace of the test's own, as every sandbox test runs.
    common::in_outer_mount_ns_masking(&mut cmd, None);
    let run = KillOnDrop(cmd.spawn().unwrap());
    common::wait_until("the command started", || started.exists());
    // SAFETY: kill(2) on the pid of the child this test started.
    unsafe { libc::kill(run.0.id() as i32, libc::SIGTERM) };
    let mut run = run;
    let status = common::exit_within(
        &mut run.0,
        std::time::Duration::from_secs(20),
        "run did not end after SIGTERM",
    );
    assert_eq!(status.code(), Some(128 + libc::SIGTERM));
    let mut stderr = String::new();
    std::io::Read::read_to_string(run.0.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(!p.ws.join(".envrc").exists(), "{stderr}");
    assert!(stderr.contains("reverted"), "{stderr}");
}

/// Shared caches are copy-on-write: what the sandbox writes into cargo's
/// registry (a planted `build.rs`) stays in a layer of that project's own,
/// seen again by its next sandbox, never by your own builds or another
/// project's sandbox.
#[test]
fn a_poisoned_cache_never_reaches_a_build_outside() {
    if !require_kernel_features() {
        return;
    }
    let p = places();
    poisoned_cache(&p, None, &p.ws.parent().unwrap().join("home"));
}

#[test]
fn a_poisoned_cache_never_reaches_a_build_outside_as_an_unprivileged_user() {
    if !require_kernel_features() {
        return;
    }
    let user = TestUser::create();
    let p = user.places();
    let home = user.base.join("home");
    poisoned_cache(&p, Some(&user), &home);
}

/// `script` under `zcode-acp run` in `ws`, with `home` as HOME; its
/// stdout. The sandbox's mounts must not leak out, and every launch must
/// give each cache its layer (overlayfs refuses a `volatile` upper whose
/// mark was left, and that would be said).
fn run_layered(ws: &Path, user: Option<&TestUser>, home: &Path, script: &str) -> String {
    let argv = run_sh(user, "none", ws, script);
    let (out, unchanged) = run_with_home(ws, &argv, None, user, Some(home));
    assert!(
        unchanged,
        "the sandbox's mounts leaked into the outer namespace"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("no copy-on-write layer"), "{stderr}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn poisoned_cache(p: &Places, user: Option<&TestUser>, home: &Path) {
    let src = home.join(".cargo/registry/src/index/dep-1.0.0");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("build.rs"), "fn main() {}\n").unwrap();
    let other = p.ws.parent().unwrap().join("other-project");
    std::fs::create_dir_all(&other).unwrap();
    if let Some(u) = user {
        u.own(home);
        u.own(&other);
    }
    let build_rs = src.join("build.rs");
    let b = build_rs.display();
    let run = |ws: &Path, script: &str| run_layered(ws, user, home, script);
    let planted = run(
        &p.ws,
        &format!("echo 'fn main() {{ evil() }}' > {b} && echo planted; cat {b}"),
    );
    assert!(
        planted.contains("planted") && planted.contains("evil"),
        "{planted}"
    );
    // Outside: your own builds see the cache as it was.
    assert_eq!(content(&build_rs), "fn main() {}\n");
    // The same project's next sandbox keeps its layer...
    assert!(run(&p.ws, &format!("cat {b}")).contains("evil"));
    // ...another project's does not see it.
    assert_eq!(run(&other, &format!("cat {b}")), "fn main() {}\n");
    // A layer last mounted in another boot is not trusted whole (its
    // overlays skip syncing): it starts empty, your cache shows through.
    let layers = home.join(".zcode-acp/layers");
    let mut stamps = 0;
    for project in std::fs::read_dir(&layers).unwrap().flatten() {
        for f in std::fs::read_dir(project.path()).unwrap().flatten() {
            if f.path().extension().is_some_and(|e| e == "boot") {
                std::fs::write(f.path(), "an-earlier-boot").unwrap();
                stamps += 1;
            }
        }
    }
    assert!(stamps >= 2, "no boot stamps under {}", layers.display());
    assert_eq!(run(&p.ws, &format!("cat {b}")), "fn main() {}\n");
    // And is used as ever from then on.
    assert!(run(&p.ws, &format!("echo again > {b}; cat {b}")).contains("again"));
    assert!(run(&p.ws, &format!("cat {b}")).contains("again"));
    assert_eq!(content(&build_rs), "fn main() {}\n");
}

/// A cache that holds nothing on the host is the layer's own directory
/// (what its overlay would show, for a bind's cost): what the sandbox
/// writes there still never reaches yours; once your cache holds
/// something, the next sandbox sees both, overlaid as ever; and a layer
/// once overlaid stays overlaid, even over a cache emptied again, since
/// only an overlay hides what the sandbox deleted of yours.
#[test]
fn an_empty_cache_is_its_layer_until_yours_fills() {
    if !require_kernel_features() {
        return;
    }
    let p = places();
    let home = p.ws.parent().unwrap().join("home");
    let npm = home.join(".npm");
    std::fs::create_dir_all(&npm).unwrap();
    assert!(std::fs::read_dir(&npm).unwrap().next().is_none());
    let run = |script: &str| run_layered(&p.ws, None, &home, script);
    // The file system mounted at the cache, as the sandbox sees it.
    let mounted_at = |dir: &Path| {
        format!(
            "grep ' {} ' /proc/self/mountinfo | sed 's/.* - //' | cut -d' ' -f1",
            dir.display()
        )
    };
    let (mine, yours) = (npm.join("theirs"), npm.join("yours"));
    let written = run(&format!(
        "echo inside > {m} && cat {m} && {t}",
        m = mine.display(),
        t = mounted_at(&npm)
    ));
    assert!(written.starts_with("inside\n"), "{written}");
    assert!(
        !written.contains("overlay"),
        "an empty cache was overlaid: {written}"
    );
    assert!(!mine.exists(), "a write into an empty cache reached yours");
    std::fs::write(&yours, "outside\n").unwrap();
    let seen = run(&format!("cat {} {}", mine.display(), yours.display()));
    assert_eq!(seen, "inside\noutside\n");
    assert!(!mine.exists(), "a write into the cache reached yours");
    // Deleted inside (a whiteout in the layer), then gone from yours too.
    run(&format!("rm {}", yours.display()));
    assert!(yours.exists(), "a removal inside reached your cache");
    std::fs::remove_file(&yours).unwrap();
    let listed = run(&format!("ls -A {}", npm.display()));
    assert_eq!(listed, "theirs\n", "what the sandbox deleted shows again");
}

/// Root in a container whose user namespace maps only part of the id range
/// (rootless podman, unprivileged LXC), and a home reached through a
/// symlink (Fedora Atomic's `/home` -> `var/home`): both still get the
/// whole sandbox, checked on disk.
#[test]
fn partial_id_maps_and_symlinked_homes_still_get_their_sandbox() {
    if !require_kernel_features() {
        return;
    }
    let p = places();
    let base = p.ws.parent().unwrap().to_path_buf();
    let (inside, outside) = (p.ws.join("written"), p.outside.join("escaped"));
    let script = format!(
        "echo in > {}; echo out > {}; echo done",
        inside.display(),
        outside.display()
    );
    let check = |what: &str, out: &Output| {
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && stdout.contains("done"),
            "{what}: {stdout}\n{stderr}"
        );
        assert!(inside.exists(), "{what}: nothing written inside: {stderr}");
        assert!(!outside.exists(), "{what}: written outside: {stderr}");
        std::fs::remove_file(&inside).unwrap();
    };

    let real_home = base.join("var/home/user");
    std::fs::create_dir_all(&real_home).unwrap();
    let home = base.join("home");
    std::os::unix::fs::symlink("var/home", &home).unwrap();
    let argv = run_sh(None, "none", &p.ws, &script);
    let (out, unchanged) = run_with_home(&p.ws, &argv, None, None, Some(&home.join("user")));
    assert!(
        unchanged,
        "the sandbox's mounts leaked into the outer namespace"
    );
    check("a home behind a symlink", &out);
    assert!(real_home.join(".zcode-acp").is_dir());

    let fixture = base.join("partial_userns.py");
    std::fs::copy(
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/partial_userns.py"
        ),
        &fixture,
    )
    .unwrap();
    let mut argv = vec![
        "python3".to_owned(),
        fixture.display().to_string(),
        "65536".to_owned(),
    ];
    argv.extend(run_sh(None, "none", &p.ws, &script));
    let (out, unchanged) = run_argv_in_outer_ns_as(&p.ws, &argv, None, None);
    assert!(
        unchanged,
        "the sandbox's mounts leaked into the outer namespace"
    );
    check("root of a partial id map", &out);
}

/// A run whose writes were refused ends with one line naming them and the
/// `--allow` that would open them; what it wrote in its workspace, and
/// what it only read, is not named. Without it, a user sees only the
/// shell's "Read-only file system".
#[test]
fn run_names_the_writes_it_refused_and_the_allow_that_opens_them() {
    if !require_kernel_features() {
        return;
    }
    let p = places();
    let deep = p.outside.join("not/there");
    let script = format!(
        "echo hi > {o}/refused.txt; mkdir {o}/refused-dir; mkdir -p {d}; echo ok > inside.txt; \
         cat {o}/../ws/inside.txt > /dev/null; mv inside.txt moved.txt; echo done",
        o = p.outside.display(),
        d = deep.display(),
    );
    // Asked for: stderr is no terminal here.
    let mut argv = run_sh(None, "none", &p.ws, &script);
    argv.insert(2, "--refusals-line".into());
    let (out, _) = run_with_home(&p.ws, &argv, None, None, None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("done"),
        "{stderr}"
    );
    assert!(p.ws.join("moved.txt").exists(), "{stderr}");
    assert!(!p.outside.join("refused.txt").exists());
    if !stderr.contains("zcode-acp: the sandbox refused writes to") {
        // A kernel without seccomp user notification (before 5.14), or a
        // listener already above us: nothing watches the calls.
        assert!(
            !zcode_acp::linux::supervise::available(),
            "no refused-writes line: {stderr}"
        );
        println!("skipped: the supervisor cannot watch calls here");
        return;
    }
    let line = stderr
        .lines()
        .find(|l| l.starts_with("zcode-acp: the sandbox refused writes to"))
        .unwrap();
    for refused in ["refused.txt", "refused-dir", "not"] {
        assert!(
            line.contains(&format!("{}/{refused}", p.outside.display())),
            "{line}"
        );
    }
    assert!(
        !line.contains("inside.txt") && !line.contains("moved.txt"),
        "{line}"
    );
    assert!(
        line.contains(&format!("--allow {}", p.outside.display())),
        "{line}"
    );
    assert_eq!(
        stderr.matches("the sandbox refused writes").count(),
        1,
        "{stderr}"
    );
    // Not asked for, and no terminal to read it: no watching, no line.
    let argv = run_sh(None, "none", &p.ws, &script);
    let (out, _) = run_with_home(&p.ws, &argv, None, None, None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("the sandbox refused writes"), "{stderr}");
}
