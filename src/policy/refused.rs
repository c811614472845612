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

/// How the sandbox's helper says a refused write as it happens, on the
/// agent's stderr, for an agent whose shell shows the editor nothing
/// (`Agent::quiet_shell`): the bridge offers it as it offers one read from
/// a tool call. The words a tool would print are in it, so the log reads
/// as any refusal does; the path is verbatim between it and [`END`], so a
/// line cut short names nothing.
const ANNOUNCED: &str =
    "zcode-acp sandbox: Read-only file system (the sandbox refused this write): ";
const END: &str = " <end>";

/// The longest announcement line, its line break included: a longer path
/// is refused all the same, but not offered (the bridge keeps lines of
/// the agent's stderr up to this length).
pub const MAX_ANNOUNCEMENT_BYTES: usize = 300;

/// The line that says `path` was refused; none for a path a line cannot
/// carry whole (too long, with a line break, or not UTF-8).
pub fn announcement(path: &Path) -> Option<String> {
    let text = path.to_str()?;
    let line = format!("{ANNOUNCED}{text}{END}\n");
    (!text.contains(['\n', '\r']) && line.len() <= MAX_ANNOUNCEMENT_BYTES).then_some(line)
}

/// The path an announcement line names (it may follow a partial line of
/// the agent's own, left without its line break).
pub fn announced(line: &str) -> Option<PathBuf> {
    let line = line.strip_suffix('\n').unwrap_or(line);
    let at = line.find(ANNOUNCED)?;
    let path = line[at + ANNOUNCED.len()..].strip_suffix(END)?;
    path.starts_with('/').then(|| PathBuf::from(path))
}

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
    /// names where the write would have gone. Returns the real path when
    /// it is newly noted.
    pub fn note(&mut self, policy: &Policy, path: PathBuf) -> Option<&Path> {
        if policy.evaluate_resolved(&path, Op::Write).allowed {
            return None;
        }
        let (real, decision) = match policy.evaluate(&path, Op::Write) {
            Ok(d) => d,
            // A path that cannot be resolved is judged as written.
            Err(_) => (path.clone(), policy.evaluate_resolved(&path, Op::Write)),
        };
        if decision.allowed || decision.kind != Band::Outside || self.paths.contains(&real) {
            return None;
        }
        if self.paths.len() >= MAX_NOTED {
            if self.beyond.len() < MAX_COUNTED {
                self.beyond.insert(real);
            }
            return None;
        }
        self.paths.insert(real.clone());
        self.paths.get(&real).map(PathBuf::as_path)
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
        let path_dirs: Vec<PathBuf> = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).map(|d| folded(&d)).collect())
            .unwrap_or_default();
        let suggested = |d: &PathBuf| suggestible(d, home, &path_dirs);
        let kept = dirs.len();
        let allows: Vec<String> = dirs
            .iter()
            .filter(|d| suggested(d))
            .take(3)
            .map(|d| format!("--allow {}", shell_word(d)))
            .collect();
        let withheld = if allows.len() < kept.min(3) {
            " (nothing is suggested for your home directory itself, hidden directories (keys, startup files, tools' settings), directories on PATH, or system directories: opening them is yours to decide)"
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

/// Whether `--allow dir` may be suggested: never for a place zcode-acp
/// never grants (`/`, the home directory or above it, its keys and startup
/// files), a hidden directory or one beneath it (tools' settings and hooks:
/// `~/.config/git`, `~/.docker`, an agent's), a directory on PATH (what is
/// put there runs outside the sandbox), `~/bin`, or a system directory.
/// Compared without case where the disk ignores it (macOS), so that
/// `/USERS/me/.SSH` is `~/.ssh`.
fn suggestible(dir: &Path, home: Option<&Path>, path_dirs: &[PathBuf]) -> bool {
    let d = folded(dir);
    let home = home.map(folded);
    let hidden = d.components().any(
        |c| matches!(c, std::path::Component::Normal(n) if n.to_string_lossy().starts_with('.')),
    );
    !dir.to_string_lossy().chars().any(unsafe_to_show)
        && crate::policy::offerable::never_granted(&d, home.as_deref()).is_none()
        && d != Path::new("/")
        && !hidden
        && !path_dirs.iter().any(|p| p == &d)
        && home.as_ref().is_none_or(|h| d != h.join("bin"))
        && !SYSTEM_DIRS
            .iter()
            .any(|s| d.starts_with(folded(Path::new(s))))
}

/// `path` as the disk compares it: case folded on macOS.
fn folded(path: &Path) -> PathBuf {
    if cfg!(target_os = "macos") {
        PathBuf::from(path.to_string_lossy().to_lowercase())
    } else {
        path.to_path_buf()
    }
}

/// Characters that must not reach a terminal as they are: controls (a
/// newline, an escape sequence) and the invisible ones that reorder or hide
/// text (bidirectional overrides, zero-width characters).
fn unsafe_to_show(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2060}'..='\u{2069}' | '\u{061C}' | '\u{FEFF}')
}

/// `path` for a terminal, as one shell word: quoted when it holds anything
/// but plain characters, so a name the command chose cannot pass for the
/// line's own words, and with unsafe characters written out, never sent.
fn shown(path: &Path) -> String {
    let word = shell_word(path);
    if word.chars().any(unsafe_to_show) {
        word.chars()
            .map(|c| {
                if unsafe_to_show(c) {
                    c.escape_default().to_string()
                } else {
                    c.to_string()
                }
            })
            .collect()
    } else {
        word
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
    #[test]
    fn an_announced_path_is_read_back_whole_or_not_at_all() {
        for path in ["/home/u/out/a b.txt", "/o/x <end>", "/o/ends with space "] {
            let line = super::announcement(std::path::Path::new(path)).unwrap();
            assert_eq!(super::announced(&line).unwrap(), std::path::Path::new(path));
            // Cut short (as a long line is, where it is read), it names nothing.
            assert_eq!(super::announced(&line[..line.len() - 3]), None);
        }
        assert_eq!(super::announcement(std::path::Path::new("/o/a\nb")), None);
        let long = format!("/o/{}", "x".repeat(super::MAX_ANNOUNCEMENT_BYTES));
        assert_eq!(super::announcement(std::path::Path::new(&long)), None);
        assert_eq!(super::announced("Read-only file system: /o/x"), None);
        // After a partial line of the agent's own.
        let line = super::announcement(std::path::Path::new("/o/y")).unwrap();
        assert_eq!(
            super::announced(&format!("progress 40%{line}")).unwrap(),
            std::path::Path::new("/o/y")
        );
    }

    use super::*;

    /// A temporary directory whose own name is not hidden (tempfile's
    /// default, `.tmpXXXX`, is: nothing beneath it would be suggested).
    fn visible_tempdir() -> tempfile::TempDir {
        tempfile::Builder::new()
            .prefix("zcode-refused-")
            .tempdir()
            .unwrap()
    }

    #[test]
    fn the_line_names_the_paths_and_the_allow_that_opens_them() {
        let mut r = Refusals::default();
        assert!(r.line(None).is_none());
        let t = visible_tempdir();
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
        let t = visible_tempdir();
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

    /// A refused name chosen to read as the line's own words, or to hide
    /// itself, stays one quoted word; and what would run outside the
    /// sandbox later (a hidden directory's hooks, a directory on PATH,
    /// ~/bin) is never suggested.
    #[test]
    fn a_name_cannot_pass_for_the_line_s_words_nor_invite_a_later_escape() {
        let t = visible_tempdir();
        let home = t.path().join("home");
        for d in [".config/git", ".local/bin", "bin", "tools/bin", "work"] {
            std::fs::create_dir_all(home.join(d)).unwrap();
        }
        let mut r = Refusals::default();
        let spoof =
            home.join("work/x); to let a run write there: zcode-acp run --allow ~ -- make (y");
        r.paths.insert(spoof.clone());
        r.paths.insert(home.join("work/\u{202E}txt.exe"));
        let line = r.line(Some(&home)).unwrap();
        assert!(line.contains("'"), "{line}");
        assert!(
            !line.contains('\u{202E}') && line.contains("\\u{202e}"),
            "{line}"
        );
        // The forged words stay inside the name's quotes.
        assert!(line.contains(&format!("'{}'", spoof.display())), "{line}");
        assert!(
            line.contains(&format!("--allow {}", home.join("work").display())),
            "{line}"
        );

        let path_dirs = vec![home.join("tools/bin")];
        for d in [".config/git", ".local/bin", "bin", "tools/bin"] {
            assert!(!suggestible(&home.join(d), Some(&home), &path_dirs), "{d}");
        }
        assert!(suggestible(&home.join("work"), Some(&home), &path_dirs));
        if cfg!(target_os = "macos") {
            let shouted = PathBuf::from(home.to_string_lossy().to_uppercase());
            assert!(!suggestible(&shouted.join(".SSH"), Some(&home), &[]));
            assert!(!suggestible(&shouted, Some(&home), &[]));
        }
    }
}
