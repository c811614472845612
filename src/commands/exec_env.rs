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
    let e = command.exec();
    format!("cannot run {program}: {e}")
}

#[cfg(test)]
mod tests {
    use super::*;

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
