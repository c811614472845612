//! macOS's half of confinement: commands run under `sandbox-exec` with the
//! profile written for the arming, in its private directory under the
//! managed root (never rebuilt from sandbox.json).
//!
//! Nothing here needs macOS to build or test: the argv and profile are
//! plain text and files; running them is tested on macOS
//! (tests/seatbelt_macos.rs).

use std::path::{Path, PathBuf};

use crate::config::generation::GenerationDir;
use crate::confine::{ArmError, Armed, Command, Enforce, Launch, Outside};
use crate::policy::{Platform, Policy};

pub const SANDBOX_EXEC: &str = "/usr/bin/sandbox-exec";
const PROFILE: &str = "profile.sb";

/// `sandbox-exec` is not where macOS keeps it.
#[derive(Debug, thiserror::Error)]
#[error("{0} is missing (Seatbelt cannot be armed without it)")]
pub struct MissingSandboxExec(PathBuf);

pub struct SeatbeltEnforcer {
    sandbox_exec: PathBuf,
    /// Carried by every write denial of this process's profiles, so the
    /// violation log can be read for this agent only.
    tag: String,
}

impl SeatbeltEnforcer {
    /// Refuses when `sandbox-exec` is missing: nothing could be armed.
    pub fn new() -> Result<SeatbeltEnforcer, MissingSandboxExec> {
        Self::with_sandbox_exec(Path::new(SANDBOX_EXEC))
    }

    pub fn with_sandbox_exec(sandbox_exec: &Path) -> Result<SeatbeltEnforcer, MissingSandboxExec> {
        if !sandbox_exec.is_file() {
            return Err(MissingSandboxExec(sandbox_exec.to_path_buf()));
        }
        Ok(SeatbeltEnforcer {
            sandbox_exec: sandbox_exec.to_path_buf(),
            tag: format!("zcode-acp-{:016x}", rand::random::<u64>()),
        })
    }
}

impl Enforce for SeatbeltEnforcer {
    fn platform(&self) -> Platform {
        Platform::Macos
    }

    fn describe(&self) -> String {
        "macOS Seatbelt".into()
    }

    fn network(&self, table: &crate::policy::network::NetworkPolicy) -> String {
        if !table.confines() {
            return table.describe();
        }
        format!(
            "out only through the sandbox's proxy (outside the sandbox, on a port of the host's loopback): {}",
            table.describe()
        )
    }

    fn confined_by(&self) -> String {
        super::MACOS_SEATBELT.into()
    }

    fn violation_tag(&self) -> Option<&str> {
        Some(&self.tag)
    }

    /// Writes the profile; where the network table confines, starts the
    /// proxy first (the profile names its port), and refuses to arm if it
    /// cannot: the profile would leave the agent no way out at all.
    fn prepare(
        &self,
        policy: &Policy,
        dir: Option<&GenerationDir>,
    ) -> Result<Option<Box<dyn Outside>>, ArmError> {
        let dir = dir.ok_or(ArmError::NoDir)?;
        let proxy = if policy.network.confines() {
            let proxy = crate::network::outside::OutsideProxy::start(&policy.network)
                .map_err(|e| ArmError::Refused(e.to_string()))?;
            Some(proxy)
        } else {
            None
        };
        let text =
            super::build_profile_with(policy, Some(&self.tag), proxy.as_ref().map(|p| p.port()))
                .map_err(|e| ArmError::Profile(e.to_string()))?;
        dir.write_file(PROFILE, &text)?;
        Ok(proxy.map(|p| Box::new(p) as Box<dyn Outside>))
    }

    /// `sandbox-exec -f PROFILE -- CMD` for a backend with nothing to set
    /// (the network left open); otherwise the environment (the proxy's
    /// variables, a terminal's own) is applied by a confined last stage
    /// (`zcode-acp __exec-env --env=... -- CMD`). The command replaces each
    /// stage in turn, so the editor's kill reaches it directly.
    fn wrap(
        &self,
        armed: &Armed,
        command: &Command,
        launch: Launch,
    ) -> Result<Vec<String>, ArmError> {
        let dir = armed.dir.as_ref().ok_or(ArmError::NoDir)?;
        let mut argv = vec![
            self.sandbox_exec.to_string_lossy().into_owned(),
            "-f".to_owned(),
            dir.path.join(PROFILE).to_string_lossy().into_owned(),
            "--".to_owned(),
        ];
        // The proxy's variables first: what the command sets itself (an
        // editor's terminal) comes after, and wins.
        let mut env = match &armed.outside {
            Some(proxy) => proxy.env(),
            None => Vec::new(),
        };
        env.extend(command.env.iter().cloned());
        if launch == Launch::Backend && env.is_empty() {
            argv.extend(command.argv.iter().cloned());
        } else {
            let exe = std::env::current_exe().map_err(ArmError::OwnPath)?;
            argv.extend(super::exec_env_argv(
                &exe.to_string_lossy(),
                &env,
                &command.argv,
            ));
        }
        Ok(argv)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::managed::ManagedRoot;
    use crate::confine::{Confinement, Sandbox, Starter};
    use crate::policy::PolicyInput;
    use std::os::unix::fs::PermissionsExt;
    use std::sync::Arc;

    fn input(home: &Path) -> PolicyInput {
        crate::confine::tests::input(home, Platform::Macos)
    }

    /// Any existing file stands in for sandbox-exec: nothing is run.
    fn sandbox() -> Sandbox {
        let enforcer =
            SeatbeltEnforcer::with_sandbox_exec(&std::env::current_exe().unwrap()).unwrap();
        Sandbox::Ready(Arc::new(enforcer))
    }

    fn armed(c: &Confinement) -> &Armed {
        match c {
            Confinement::Armed(a) => a,
            Confinement::Unconfined => panic!("unconfined"),
            Confinement::Refused(why) => panic!("refused: {why}"),
        }
    }

    #[test]
    fn a_missing_sandbox_exec_refuses_to_arm() {
        let home = tempfile::tempdir().unwrap();
        let err = SeatbeltEnforcer::with_sandbox_exec(&home.path().join("sandbox-exec"))
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("sandbox-exec is missing"), "{err}");
    }

    #[test]
    fn arming_writes_a_private_tagged_profile_with_the_managed_root_last() {
        let home = tempfile::tempdir().unwrap();
        let managed = ManagedRoot::for_home(home.path());
        let sandbox = sandbox();
        let tag = sandbox.violation_tag().unwrap().to_owned();
        let c = sandbox.arm(
            input(home.path()),
            &managed,
            "none".into(),
            Starter::Spawned,
        );
        let dir = &armed(&c).dir.as_ref().unwrap().path;
        assert_eq!(
            std::fs::metadata(dir).unwrap().permissions().mode() & 0o777,
            0o700
        );
        let text = std::fs::read_to_string(dir.join(PROFILE)).unwrap();
        let island = |p: &Path| {
            format!(
                "(deny file-write* (subpath \"{}\") (with message \"{tag}\"))",
                p.display()
            )
        };
        assert!(text.contains(&island(dir)), "{text}");
        // The managed root's island is the last file rule of all.
        let last_file_rule = text.lines().rev().find(|l| l.contains("file-write"));
        assert_eq!(last_file_rule, Some(island(&managed.path).as_str()));
        // Every write denial is tagged, so the log can be read for our own.
        for line in text.lines().filter(|l| l.starts_with("(deny file-write")) {
            assert!(
                line.ends_with(&format!("(with message \"{tag}\"))")),
                "{line}"
            );
        }
        // A second write into the same directory is refused, not followed.
        assert!(armed(&c)
            .dir
            .as_ref()
            .unwrap()
            .write_file(PROFILE, "x")
            .is_err());
    }

    #[test]
    fn backends_and_terminals_run_under_the_arming_s_profile() {
        let home = tempfile::tempdir().unwrap();
        let home = crate::policy::resolve_real(home.path()).unwrap();
        std::fs::create_dir_all(home.join("ws")).unwrap();
        let managed = ManagedRoot::for_home(&home);
        let sandbox = sandbox();
        let c = sandbox.arm(input(&home), &managed, "none".into(), Starter::Spawned);
        assert_eq!(c.describe(), "macOS Seatbelt, 1 root writable");
        let backend = Command {
            argv: vec!["codex-acp".into(), "-x".into()],
            ..Command::default()
        };
        let argv = c.wrap(&backend, Launch::Backend).unwrap();
        assert_eq!(argv[1], "-f");
        // Pointed at the arming's proxy, whose port alone the profile
        // lets it reach out to.
        let port = armed(&c).outside.as_ref().expect("a proxy").port();
        // With its credentials: any local program reaches the port.
        let http = argv
            .iter()
            .find(|a| a.starts_with("--env=HTTPS_PROXY="))
            .cloned()
            .unwrap_or_default();
        assert!(
            http.starts_with("--env=HTTPS_PROXY=http://zcode:")
                && http.ends_with(&format!("@127.0.0.1:{port}")),
            "{argv:?}"
        );
        assert_eq!(
            &argv[3..5],
            &[
                "--".to_owned(),
                std::env::current_exe()
                    .unwrap()
                    .to_string_lossy()
                    .into_owned()
            ]
        );
        assert_eq!(argv[5], "__exec-env");
        assert!(argv.contains(&http), "{argv:?}");
        assert!(argv.ends_with(&["--".into(), "codex-acp".into(), "-x".into()]));
        let profile = PathBuf::from(&argv[2]);
        let proxy_rule = format!("(allow network-outbound (remote tcp \"localhost:{port}\"))");
        assert!(std::fs::read_to_string(&profile)
            .unwrap()
            .contains(&proxy_rule));
        assert!(profile.starts_with(&managed.path) && profile.is_file());
        let ws_rule = format!("(subpath \"{}\")", home.join("ws").display());
        let text = std::fs::read_to_string(&profile).unwrap();
        assert!(
            text.lines()
                .any(|l| l.starts_with("(allow file-write*") && l.contains(&ws_rule)),
            "{text}"
        );

        let terminal = Command {
            argv: vec!["/bin/sh".into(), "-c".into(), "make".into()],
            env: vec![("DYLD_INSERT_LIBRARIES".into(), "/evil.dylib".into())],
            cwd: None,
        };
        let wrapped = c.wrap(&terminal, Launch::Terminal).unwrap();
        assert_eq!(&wrapped[..4], &argv[..4]);
        assert_eq!(wrapped[5], "__exec-env");
        assert!(wrapped.contains(&http), "{wrapped:?}");
        assert!(wrapped.ends_with(&[
            "--env=DYLD_INSERT_LIBRARIES=/evil.dylib".into(),
            "--".into(),
            "/bin/sh".into(),
            "-c".into(),
            "make".into()
        ]));

        // The next arming gets a fresh profile; the old one goes with it.
        let next = sandbox.arm(input(&home), &managed, "none".into(), Starter::Spawned);
        drop(c);
        let next_argv = next.wrap(&backend, Launch::Backend).unwrap();
        assert_ne!(next_argv[2], argv[2]);
        assert!(!profile.exists());
        assert!(PathBuf::from(&next_argv[2]).exists());
    }
}
