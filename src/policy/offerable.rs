//! What may ever be granted, in one place. The bridge's allow flow, the
//! `allow` command and a project's approved `allow` entries all ask here,
//! so a path the editor would never offer cannot be opened from a terminal
//! or a hand edit either: granting these would hand the agent the whole
//! machine, or a way to run code outside the sandbox later.

use std::path::Path;

use super::{Band, Decision};

/// Why a write to `path` (a real path) that the policy refused as
/// `decision` may never be granted, if it may not: the one answer the
/// bridge's allow flow, its refusals and the `allow` command all give.
pub fn refusal(path: &Path, decision: &Decision, home: Option<&Path>) -> Option<String> {
    let rule = decision.rule.as_deref().unwrap_or("no rule allows it");
    match decision.kind {
        Band::Island => Some(format!(
            "it is the sandbox's own configuration ({rule}), which no grant opens"
        )),
        Band::Protected if !decision.promptable => Some(format!("it is never allowed ({rule})")),
        _ => never_granted(path, home)
            .map(|never| format!("{rule}, and zcode-acp never offers it: {never}")),
    }
}

/// Shell start-up files, relative to the home directory: they run in every
/// new shell the user opens, outside the sandbox.
const STARTUP: &[&str] = &[
    ".bashrc",
    ".bash_profile",
    ".bash_login",
    ".bash_logout",
    ".profile",
    ".zshrc",
    ".zprofile",
    ".zshenv",
    ".zlogin",
    ".config/fish",
    ".local/share/fish",
    ".config/environment.d",
    ".xprofile",
    ".xinitrc",
];

/// Directories whose programs start at login, relative to the home directory.
const AUTOSTART: &[&str] = &[
    ".config/autostart",
    "Library/LaunchAgents",
    ".config/systemd/user",
    ".local/share/systemd/user",
];

/// Whether `path` (a real path) opens everything beneath `/` or the home
/// directory: never a grant, and a warning when it is a workspace root.
pub fn opens_everything(path: &Path, home: Option<&Path>) -> bool {
    path == Path::new("/") || Some(path) == home
}

/// Why `path` (a real path) is never granted, if it is not: it is one of
/// the places below (or inside one), or it holds one (`~/.config` holds the
/// autostart folder, `/home` the home directory).
pub fn never_granted(path: &Path, home: Option<&Path>) -> Option<&'static str> {
    if path == Path::new("/") {
        return Some("it would make the whole tree writable");
    }
    let home = home?;
    if home.starts_with(path) {
        return Some("it would make the whole home directory writable");
    }
    let places = std::iter::once((
        ".ssh",
        "ssh keys and configuration decide who can log in, and where",
    ))
    .chain(STARTUP.iter().map(|f| {
        (
            *f,
            "shell start-up files run in every new shell, outside the sandbox",
        )
    }))
    .chain(
        AUTOSTART
            .iter()
            .map(|d| (*d, "programs there start at login, outside the sandbox")),
    );
    for (place, why) in places {
        let place = home.join(place);
        if path.starts_with(&place) || place.starts_with(path) {
            return Some(why);
        }
    }
    None
}

/// The user's real home directory, as [`never_granted`] wants it.
pub fn real_home() -> Option<std::path::PathBuf> {
    dirs::home_dir().and_then(|h| super::resolve_real(&h).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_never_granted() {
        let home = Path::new("/home/u");
        for p in [
            "/",
            "/home/u",
            "/home/u/.ssh",
            "/home/u/.ssh/authorized_keys",
            "/home/u/.bashrc",
            "/home/u/.config/autostart/x.desktop",
            "/home/u/.config/fish/config.fish",
            // Folders that hold one of them.
            "/home",
            "/home/u/.config",
            "/home/u/Library",
            "/home/u/.config/systemd",
        ] {
            assert!(never_granted(Path::new(p), Some(home)).is_some(), "{p}");
        }
        for p in [
            "/home/u/other/file",
            "/srv/data/x",
            "/home/u/.bashrc-notes/x",
            "/home/u/.sshfs/x",
            "/home/u/.config/nvim",
            "/home/u/.local/share/x",
        ] {
            assert!(never_granted(Path::new(p), Some(home)).is_none(), "{p}");
        }
        assert!(opens_everything(Path::new("/home/u"), Some(home)));
        assert!(!opens_everything(Path::new("/home/u/p"), Some(home)));
    }
}
