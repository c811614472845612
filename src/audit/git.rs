//! What a git repository would run for the user: its hooks, and the config
//! keys that name programs (git runs `core.fsmonitor` on every `git status`,
//! also in a parent repository that has it as a submodule or gitlink).

use std::path::{Path, PathBuf};

/// Config keys (lower case; `*` for a subsection) whose value git runs.
const RUNS: &[&str] = &[
    "core.fsmonitor",
    "core.hookspath",
    "core.sshcommand",
    "core.editor",
    "core.pager",
    "core.askpass",
    "sequence.editor",
    "diff.external",
    "credential.helper",
    "gpg.program",
    "gpg.*.program",
    "filter.*.clean",
    "filter.*.smudge",
    "filter.*.process",
    "diff.*.textconv",
    "diff.*.command",
    "merge.*.driver",
    "uploadpack.packobjectshook",
    "include.path",
    "includeif.*.path",
];

/// Whether a config key (as `git config --list` prints it) names a program.
pub fn runs(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    if let Some(alias) = key.strip_prefix("alias.") {
        // Aliases run a program only when their value starts with `!`;
        // the caller passes the value's first byte in `key` for those.
        return alias.ends_with('!');
    }
    let parts: Vec<&str> = key.split('.').collect();
    RUNS.iter().any(|pat| {
        let p: Vec<&str> = pat.split('.').collect();
        match (p.len(), parts.len()) {
            (2, 2) => p == parts,
            (3, n) if n >= 3 => {
                // `section.<subsection>.name`: the subsection may hold dots.
                p[0] == parts[0] && p[2] == parts[n - 1]
            }
            _ => false,
        }
    })
}

/// The entries of a config file that name programs, as `key=value`, read
/// by git itself from this one file (includes are not followed: an
/// `include.path` is reported as such).
pub fn running_entries(config: &Path) -> Vec<(String, String)> {
    use crate::policy::git_cmd;
    if !git_cmd::readable_config(config) {
        // Not a file git could read without blocking: it names nothing,
        // and git reading it later blocks rather than runs anything.
        return Vec::new();
    }
    let mut cmd = crate::policy::git_cmd::command();
    cmd.args(["config", "--no-includes", "--file"])
        .arg(config)
        .args(["--list", "-z"]);
    let Ok(out) = git_cmd::output(cmd, git_cmd::LIMIT) else {
        return Vec::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .split('\0')
        .filter_map(|entry| {
            let (key, value) = entry.split_once('\n').unwrap_or((entry, ""));
            let probe = if key.to_ascii_lowercase().starts_with("alias.") {
                if value.starts_with('!') {
                    format!("{key}!")
                } else {
                    return None;
                }
            } else {
                key.to_owned()
            };
            (!key.is_empty() && runs(&probe)).then(|| (key.to_owned(), value.to_owned()))
        })
        .collect()
}

/// `config` with the given keys removed (every value of each), by git on
/// this one file.
pub fn unset(config: &Path, keys: &[String]) {
    use crate::policy::git_cmd;
    for key in keys {
        if !git_cmd::readable_config(config) {
            return;
        }
        let mut cmd = crate::policy::git_cmd::command();
        cmd.args(["config", "--file"])
            .arg(config)
            .args(["--unset-all", key]);
        let _ = git_cmd::output(cmd, git_cmd::LIMIT);
    }
}

/// The hooks git would run: regular files in `hooks/` that are not the
/// `.sample` files `git init` leaves.
pub fn hooks(git_dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(git_dir.join("hooks")) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file() || t.is_symlink()))
        .map(|e| e.path())
        .filter(|p| p.extension().is_none_or(|x| x != "sample"))
        .collect();
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_that_run_programs() {
        for k in [
            "core.fsmonitor",
            "core.hooksPath",
            "filter.lfs.smudge",
            "filter.a.b.process",
            "diff.pdf.textconv",
            "includeIf.gitdir:/x/.path",
            "alias.st!",
        ] {
            assert!(runs(k), "{k}");
        }
        for k in [
            "core.bare",
            "user.name",
            "alias.st",
            "remote.origin.url",
            "filter.lfs.required",
        ] {
            assert!(!runs(k), "{k}");
        }
    }
}
