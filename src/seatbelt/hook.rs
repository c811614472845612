//! The bridge's spawn hook on macOS: every backend generation runs under
//! `sandbox-exec` with a profile written for the roots of that moment, and
//! the editor's terminals run under the same profile.
//!
//! Nothing here needs macOS to build: the argv and profile are plain text
//! and files, so the wrapping is unit-tested everywhere; running it is
//! tested on macOS (tests/seatbelt_macos.rs).

use super::arm::{arm_argv, Armed, SANDBOX_EXEC};
use crate::backend::spawn::{
    arming_input, PreparedCommand, SpawnContext, SpawnError, SpawnHook, TerminalCommand,
};
use crate::config::managed::ManagedRoot;
use crate::policy::backends::StateSettings;
use crate::policy::{Platform, Policy};

pub struct SeatbeltSandbox {
    managed: ManagedRoot,
    state: StateSettings,
    /// Carried by every write denial of this bridge's profiles, so the
    /// violation log can be read for this agent only.
    tag: String,
    /// The running generation's profile, policy and directory; replaced
    /// (the directory removed) when the next generation is prepared, after
    /// the old one and its terminals were stopped.
    current: Option<Armed>,
}

impl SeatbeltSandbox {
    /// Refuses when `sandbox-exec` is missing: nothing could be armed.
    pub fn new(managed: ManagedRoot, state: StateSettings) -> Result<SeatbeltSandbox, String> {
        Self::with_sandbox_exec(managed, state, std::path::Path::new(SANDBOX_EXEC))
    }

    fn with_sandbox_exec(
        managed: ManagedRoot,
        state: StateSettings,
        sandbox_exec: &std::path::Path,
    ) -> Result<SeatbeltSandbox, String> {
        if !sandbox_exec.is_file() {
            return Err(format!(
                "{} is missing (Seatbelt cannot be armed without it)",
                sandbox_exec.display()
            ));
        }
        Ok(SeatbeltSandbox {
            managed,
            state,
            tag: format!("zcode-acp-{:016x}", rand::random::<u64>()),
            current: None,
        })
    }
}

impl SpawnHook for SeatbeltSandbox {
    fn prepare(&mut self, ctx: &SpawnContext<'_>) -> Result<PreparedCommand, SpawnError> {
        if ctx.argv.is_empty() {
            return Err(SpawnError::Empty);
        }
        self.current = None;
        let (input, backend_profile) =
            arming_input(Platform::Macos, ctx, &self.state, &self.managed)?;
        let armed = arm_argv(ctx.argv, &input, &self.managed, Some(&self.tag))
            .map_err(SpawnError::cannot_arm)?;
        let argv = armed.argv.clone();
        self.current = Some(armed);
        Ok(PreparedCommand {
            argv,
            env: Vec::new(),
            confinement: format!(
                "macOS Seatbelt, {} root{} writable",
                ctx.roots.len(),
                if ctx.roots.len() == 1 { "" } else { "s" }
            ),
            backend_profile: Some(backend_profile),
        })
    }

    fn confines(&self) -> bool {
        true
    }

    fn policy(&self) -> Option<&Policy> {
        self.current.as_ref().map(|a| &a.policy)
    }

    /// `sandbox-exec -f PROFILE -- zcode-acp __exec-env --env=... -- CMD`:
    /// the profile is the running generation's, written by the bridge under
    /// the managed root (never rebuilt from sandbox.json); the agent's
    /// environment is applied by the confined last stage. The command
    /// replaces each stage in turn, so the editor's kill reaches it directly.
    fn terminal(&self, command: TerminalCommand) -> Result<Vec<String>, String> {
        let armed = self
            .current
            .as_ref()
            .ok_or("no generation is armed, so there is no profile to run the terminal under")?;
        let exe = std::env::current_exe()
            .map_err(|e| format!("cannot find this program's own path: {e}"))?;
        let mut argv = vec![
            SANDBOX_EXEC.to_owned(),
            "-f".to_owned(),
            armed.profile.to_string_lossy().into_owned(),
            "--".to_owned(),
        ];
        argv.extend(crate::commands::exec_env::wrap(
            &exe.to_string_lossy(),
            &command.env,
            &command.argv,
        ));
        Ok(argv)
    }

    fn violation_tag(&self) -> Option<&str> {
        Some(&self.tag)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn hook(home: &std::path::Path) -> SeatbeltSandbox {
        // Any existing file stands in for sandbox-exec: nothing is run.
        SeatbeltSandbox::with_sandbox_exec(
            ManagedRoot::for_home(home),
            StateSettings::default(),
            &std::env::current_exe().unwrap(),
        )
        .unwrap()
    }

    #[test]
    fn a_missing_sandbox_exec_refuses_to_arm() {
        let home = tempfile::tempdir().unwrap();
        let err = SeatbeltSandbox::with_sandbox_exec(
            ManagedRoot::for_home(home.path()),
            StateSettings::default(),
            &home.path().join("sandbox-exec"),
        )
        .err()
        .unwrap();
        assert!(err.contains("sandbox-exec is missing"), "{err}");
    }

    #[test]
    fn generations_and_terminals_run_under_the_bridge_written_profile() {
        let home = tempfile::tempdir().unwrap();
        let home = crate::policy::resolve_real(home.path()).unwrap();
        let ws = home.join("ws");
        std::fs::create_dir_all(&ws).unwrap();
        let mut hook = hook(&home);
        assert!(hook
            .terminal(TerminalCommand {
                argv: vec!["true".into()],
                env: vec![],
                cwd: None,
            })
            .is_err());
        let argv = vec!["codex-acp".to_owned()];
        let prepared = hook
            .prepare(&SpawnContext {
                argv: &argv,
                roots: std::slice::from_ref(&ws),
                generation: 1,
                grants: &[],
            })
            .unwrap();
        assert_eq!(prepared.confinement, "macOS Seatbelt, 1 root writable");
        assert_eq!(&prepared.argv[..2], &[SANDBOX_EXEC, "-f"]);
        assert_eq!(&prepared.argv[3..], &["--", "codex-acp"]);
        let profile = PathBuf::from(&prepared.argv[2]);
        assert!(profile.starts_with(home.join(".zcode-acp")));
        let text = std::fs::read_to_string(&profile).unwrap();
        let tag = hook.violation_tag().unwrap().to_owned();
        assert!(text.contains(&format!("(with message \"{tag}\")")));
        let ws_rule = format!("(subpath \"{}\")", ws.display());
        assert!(
            text.lines()
                .any(|l| l.starts_with("(allow file-write*") && l.contains(&ws_rule)),
            "{text}"
        );

        let wrapped = hook
            .terminal(TerminalCommand {
                argv: vec!["/bin/sh".into(), "-c".into(), "make".into()],
                env: vec![("DYLD_INSERT_LIBRARIES".into(), "/evil.dylib".into())],
                cwd: None,
            })
            .unwrap();
        assert_eq!(
            &wrapped[..4],
            &[SANDBOX_EXEC, "-f", &prepared.argv[2], "--"]
        );
        assert_eq!(wrapped[5], "__exec-env");
        assert_eq!(
            &wrapped[6..],
            &[
                "--env=DYLD_INSERT_LIBRARIES=/evil.dylib",
                "--",
                "/bin/sh",
                "-c",
                "make"
            ]
        );

        // The next generation gets a fresh profile; the old one is removed.
        let next = hook
            .prepare(&SpawnContext {
                argv: &argv,
                roots: std::slice::from_ref(&ws),
                generation: 2,
                grants: &[],
            })
            .unwrap();
        assert_ne!(next.argv[2], prepared.argv[2]);
        assert!(!profile.exists());
        assert!(PathBuf::from(&next.argv[2]).exists());
    }
}
