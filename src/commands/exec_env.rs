//! `zcode-acp __exec-env [--env=NAME=VALUE]... -- COMMAND [ARGS...]`: the
//! last stage of a terminal the editor runs for a sandboxed agent on macOS.
//!
//! The editor applies a terminal's `env` to the process it starts. On macOS
//! that process is `sandbox-exec`, which arms the profile and then starts
//! this stage, already confined: the environment the agent asked for
//! (`DYLD_INSERT_LIBRARIES`, `PATH`, `ZCODE_ACP_*`) is applied here, inside,
//! so it can never steer anything that runs unconfined.

use std::os::unix::process::CommandExt;

/// Splits `NAME=VALUE` at the first `=`; a name must not be empty.
pub fn parse_assignment(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((name, value)) if !name.is_empty() && !name.contains('\0') => {
            Ok((name.to_owned(), value.to_owned()))
        }
        _ => Err(format!(
            "`{text}` is not an environment assignment; expected NAME=VALUE"
        )),
    }
}

/// The argv that runs `argv` through this stage with `env` applied.
pub use crate::seatbelt::exec_env_argv as wrap;

/// Applies `env` and replaces this process with `argv` (looked up on the
/// new `PATH`, as a shell would after `NAME=VALUE command`). Returns only
/// on failure.
pub fn run(env: &[String], argv: &[String]) -> String {
    let Some((program, args)) = argv.split_first() else {
        return "no command was given after --".into();
    };
    let mut command = std::process::Command::new(program);
    command.args(args);
    for text in env {
        match parse_assignment(text) {
            Ok((name, value)) => {
                command.env(name, value);
            }
            Err(e) => return e,
        }
    }
    keep_only_stdio();
    let e = command.exec();
    format!("cannot run {program}: {e}")
}

/// Marks every descriptor above stderr close-on-exec: the command gets its
/// standard streams only. On macOS a socket is made close-on-exec only
/// after it is made, so one the proxy's thread opened (a connection out of
/// the sandbox, in the bridge) just as the bridge forked this stage would
/// otherwise reach the command, past Seatbelt's connect check.
fn keep_only_stdio() {
    let listed: Option<Vec<i32>> = std::fs::read_dir("/dev/fd").ok().map(|dir| {
        dir.flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .collect()
    });
    // Where the list cannot be read: every number a process here is
    // likely to have open.
    close_on_exec(listed.unwrap_or_else(|| (0..4096).collect()));
}

/// Marks each of `fds` above stderr close-on-exec.
fn close_on_exec(fds: Vec<i32>) {
    for fd in fds.into_iter().filter(|&fd| fd > 2) {
        // SAFETY: F_GETFD and F_SETFD only read and set the flag of a
        // descriptor number (one not open fails, and is skipped).
        unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags >= 0 {
                libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_gets_its_standard_streams_only() {
        use std::os::fd::AsRawFd;
        let file = std::fs::File::open("/dev/null").unwrap();
        // A copy that is not close-on-exec, as a socket made on another
        // thread can be for a moment.
        // SAFETY: F_DUPFD makes a new descriptor, closed below.
        let leaked = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_DUPFD, 700) };
        assert!(leaked >= 700);
        // SAFETY: as above.
        assert_eq!(
            unsafe { libc::fcntl(leaked, libc::F_GETFD) } & libc::FD_CLOEXEC,
            0
        );
        // Only this test's own descriptor: the others are the harness's.
        close_on_exec(vec![1, leaked]);
        // SAFETY: reads the flag, then closes the copy made above.
        unsafe {
            assert_ne!(libc::fcntl(leaked, libc::F_GETFD) & libc::FD_CLOEXEC, 0);
            libc::close(leaked);
        }
    }

    #[test]
    fn assignments_split_at_the_first_equals_sign() {
        assert_eq!(
            parse_assignment("A=b=c").unwrap(),
            ("A".to_owned(), "b=c".to_owned())
        );
        assert_eq!(
            parse_assignment("EMPTY=").unwrap(),
            ("EMPTY".to_owned(), String::new())
        );
        assert!(parse_assignment("=x").is_err());
        assert!(parse_assignment("novalue").is_err());
    }

    #[test]
    fn the_wrapped_argv_keeps_arguments_that_look_like_options() {
        let argv = wrap(
            "/bin/zcode-acp",
            &[("LD_PRELOAD".into(), "/x.so".into())],
            &["--env=NOT=THIS".into(), "-c".into()],
        );
        assert_eq!(
            argv,
            [
                "/bin/zcode-acp",
                "__exec-env",
                "--env=LD_PRELOAD=/x.so",
                "--",
                "--env=NOT=THIS",
                "-c"
            ]
        );
    }
}
