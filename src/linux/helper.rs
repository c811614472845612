//! `zcode-acp __sandbox --spec FILE`: the helper stage that arms a launch
//! spec written by [`super::enforce`] and runs its command.

/// Reads the spec (never through a symlink) and runs it. Must run before
/// any thread.
pub fn helper(
    spec_file: &std::path::Path,
    consume: bool,
    die_with_parent: bool,
) -> Result<i32, String> {
    if die_with_parent {
        nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
            .map_err(|e| format!("cannot set the parent-death signal: {e}"))?;
    }
    let bytes = crate::config::atomic::read_nofollow(spec_file)
        .map_err(|e| format!("cannot read the launch spec {}: {e}", spec_file.display()))?;
    if consume {
        let _ = std::fs::remove_file(spec_file);
    }
    let spec: crate::linux::exec::LaunchSpec =
        serde_json::from_slice(&bytes).map_err(|e| format!("the launch spec is not valid: {e}"))?;
    crate::linux::exec::run(&spec).map_err(|e| format!("cannot arm the sandbox: {e}"))
}
