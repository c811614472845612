//! The writes the sandbox refused a run, and the line `zcode-acp run`
//! ends with about them: the paths, and the `--allow` that would let a next
//! run write them. Each platform feeds it what it sees (Linux: the
//! supervisor, as the calls go by; macOS: Seatbelt's violation log).
//! Protected paths inside a root are left out: the audit speaks for those,
//! and `--allow` would not open them.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::{Band, Op, Policy};

/// Distinct paths kept; past it, only counted.
pub const MAX_NOTED: usize = 64;

/// Distinct paths counted past [`MAX_NOTED`] at most.
const MAX_COUNTED: usize = 4096;

/// Top-level system directories, Linux's and macOS's: never suggested to
/// `--allow` (a run that writes there is a system change, not a
/// project's).
const SYSTEM_DIRS: &[&str] = &[
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/nix",
    "/opt",
    "/proc",
    "/run",
    "/sbin",
    "/sys",
    "/usr",
    "/var",
    "/Applications",
    "/Library",
    "/System",
    "/private",
];

/// The refused paths noted so far.
#[derive(Debug, Default)]
pub struct Refusals {
    pub paths: BTreeSet<PathBuf>,
    /// Distinct paths past [`MAX_NOTED`] (counted up to [`MAX_COUNTED`]).
    pub beyond: std::collections::HashSet<PathBuf>,
}

impl Refusals {
    /// Notes `path` if the policy lets nothing write it: judged on the
    /// name first (cheap, and what nearly every write in a workspace
    /// passes), then on the real path, links followed, for a message that
    /// names where the write would have gone.
    pub fn note(&mut self, policy: &Policy, path: PathBuf) {
        if policy.evaluate_resolved(&path, Op::Write).allowed {
            return;
        }
        let (real, decision) = match policy.evaluate(&path, Op::Write) {
            Ok(d) => d,
            // A path that cannot be resolved is judged as written.
            Err(_) => (path.clone(), policy.evaluate_resolved(&path, Op::Write)),
        };
        if decision.allowed || decision.kind != Band::Outside || self.paths.contains(&real) {
            return;
        }
        if self.paths.len() >= MAX_NOTED {
            if self.beyond.len() < MAX_COUNTED {
                self.beyond.insert(real);
            }
            return;
        }
        self.paths.insert(real);
    }

    /// The line `run` ends with, if anything was refused: the paths, and
    /// the `--allow` that would let a next run write them (the nearest
    /// existing directory of each; at most three), never one that opens a
    /// place zcode-acp never grants (`home`'s keys and startup files, the
    /// home directory itself or above it) or a system directory: the
    /// command that tried a write is the one a user should not trust, and
    /// a line to copy is an invitation.
    pub fn line(&self, home: Option<&Path>) -> Option<String> {
        if self.paths.is_empty() {
            return None;
        }
        let shown: Vec<String> = self.paths.iter().take(5).map(|p| shown(p)).collect();
        let rest = self.paths.len().saturating_sub(shown.len()) + self.beyond.len();
        let mut dirs: BTreeSet<PathBuf> = BTreeSet::new();
        for p in &self.paths {
            let mut dir = p.parent().unwrap_or(Path::new("/"));
            while !dir.is_dir() {
                match dir.parent() {
                    Some(up) => dir = up,
                    None => break,
                }
            }
            dirs.insert(dir.to_path_buf());
        }
        let suggested = |d: &PathBuf| {
            !d.to_string_lossy().chars().any(char::is_control)
                && crate::policy::offerable::never_granted(d, home).is_none()
                && d != Path::new("/")
                && !SYSTEM_DIRS.iter().any(|s| d.starts_with(s))
        };
        let kept = dirs.len();
        let allows: Vec<String> = dirs
            .iter()
            .filter(|d| suggested(d))
            .take(3)
            .map(|d| format!("--allow {}", shell_word(d)))
            .collect();
        let withheld = if allows.len() < kept.min(3) {
            " (nothing is suggested for your home directory itself, its keys and startup files, or system directories: opening them is yours to decide)"
        } else {
            ""
        };
        let more = if rest > 0 {
            format!(" and {rest} more")
        } else {
            String::new()
        };
        let how = if allows.is_empty() {
            format!("zcode-acp suggests no --allow for them{withheld}")
        } else {
            format!(
                "to let a run write there: zcode-acp run {} -- COMMAND (each opens everything beneath it){withheld}",
                allows.join(" ")
            )
        };
        Some(format!(
            "zcode-acp: the sandbox refused writes to {}{more} (outside everything this run may write); {how}",
            shown.join(", ")
        ))
    }
}

/// `path` for a terminal: control characters (a newline, an escape
/// sequence in a name the command chose) written out, never sent.
fn shown(path: &Path) -> String {
    let text = path.display().to_string();
    if text.chars().any(char::is_control) {
        text.chars()
            .map(|c| {
                if c.is_control() {
                    c.escape_default().to_string()
                } else {
                    c.to_string()
                }
            })
            .collect()
    } else {
        text
    }
}

/// `path` as one shell word.
fn shell_word(path: &Path) -> String {
    let text = path.display().to_string();
    if text
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"/._-+:@%".contains(&b))
    {
        text
    } else {
        format!("'{}'", text.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_names_the_paths_and_the_allow_that_opens_them() {
        let mut r = Refusals::default();
        assert!(r.line(None).is_none());
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("it's here");
        std::fs::create_dir(&dir).unwrap();
        r.paths.insert(dir.join("not/yet/x"));
        let line = r.line(None).unwrap();
        assert!(line.contains("not/yet/x"), "{line}");
        // The nearest directory that exists, quoted for the shell.
        assert!(
            line.contains(&format!("--allow {}", shell_word(&dir))),
            "{line}"
        );
        assert!(shell_word(&dir).ends_with(r"it'\''s here'"), "{line}");
        r.beyond.insert(PathBuf::from("/a"));
        r.beyond.insert(PathBuf::from("/b"));
        assert!(r.line(None).unwrap().contains("and 2 more"));
        // Never `--allow /`.
        let mut top = Refusals::default();
        top.paths.insert(PathBuf::from("/nonexistent-zcode-dir/x"));
        let line = top.line(None).unwrap();
        assert!(!line.contains("--allow /"), "{line}");
        assert!(line.contains("suggests no --allow"), "{line}");
    }

    /// What a command that wants out would have the user paste: the home
    /// directory, its keys and startup files, system directories. None is
    /// suggested.
    #[test]
    fn no_suggestion_opens_the_home_its_keys_or_the_system() {
        let t = tempfile::tempdir().unwrap();
        let home = t.path().join("home");
        for d in [".ssh", ".config/autostart", "projects"] {
            std::fs::create_dir_all(home.join(d)).unwrap();
        }
        let mut r = Refusals::default();
        for p in [
            home.join(".ssh/authorized_keys"),
            home.join(".bashrc"),
            home.join(".config/autostart/a.desktop"),
            PathBuf::from("/etc/zcode-evil"),
            PathBuf::from("/usr/local/bin/zcode-evil"),
        ] {
            r.paths.insert(p);
        }
        let line = r.line(Some(&home)).unwrap();
        assert!(!line.contains("run --allow"), "{line}");
        assert!(line.contains("opening them is yours to decide"), "{line}");
        // A plain directory beside them is still suggested.
        r.paths.insert(home.join("projects/out/x"));
        let line = r.line(Some(&home)).unwrap();
        assert!(
            line.contains(&format!("--allow {}", home.join("projects").display())),
            "{line}"
        );
        assert_eq!(line.matches("--allow ").count(), 1, "{line}");
    }

    #[test]
    fn a_name_cannot_write_to_the_terminal() {
        let mut r = Refusals::default();
        r.paths
            .insert(PathBuf::from("/nonexistent-zcode/evil\n\u{1b}[2Kfake"));
        let line = r.line(None).unwrap();
        assert!(!line.chars().any(|c| c.is_control()), "{line:?}");
        assert!(line.contains("evil\\n\\u{1b}[2Kfake"), "{line}");
    }
}
