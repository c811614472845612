//! Which interpreter runs each language here: the user's override (an
//! argv prefix) or the first default found on PATH, each checked by
//! running it once, confined like a run (a PATH entry a run can write
//! must not get a binary of the run's choosing run outside the sandbox).
//! Probed once per server and cached.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::settings::RunCodeSettings;
use super::Language;

/// One language's interpreter, or why there is none.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Found {
    pub language: Language,
    pub available: bool,
    pub disabled: bool,
    /// The argv prefix; the source file's path is appended.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub interpreter: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl Serialize for Language {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

/// The candidates for `language`, in order: argv prefix and the argv that
/// proves it works (its version, or for node's type stripping, the flag).
fn candidates(language: Language) -> Vec<(Vec<&'static str>, Vec<&'static str>)> {
    match language {
        Language::Python => vec![
            (vec!["python3"], vec!["--version"]),
            (vec!["python"], vec!["--version"]),
        ],
        Language::Node => vec![(vec!["node"], vec!["--version"])],
        Language::Typescript => vec![
            (vec!["tsx"], vec!["--version"]),
            (vec!["bun"], vec!["--version"]),
            (
                vec!["node", "--experimental-strip-types", "--no-warnings"],
                vec!["-e", "0"],
            ),
        ],
        Language::Bash => vec![(vec!["bash"], vec!["--version"])],
        // dash has no --version: running nothing proves it.
        Language::Sh => vec![(vec!["sh"], vec!["-c", ":"])],
    }
}

/// Probes every language (concurrently) with `path` as the search path;
/// `check` runs an argv (confined) and gives its first line of output.
pub async fn probe_all<F, Fut>(
    settings: &RunCodeSettings,
    path: &str,
    check: F,
) -> BTreeMap<Language, Found>
where
    F: Fn(Vec<String>) -> Fut,
    Fut: std::future::Future<Output = Result<Option<String>, String>>,
{
    let check = &check;
    let (python, node, typescript, bash, sh) = tokio::join!(
        probe(Language::Python, settings, path, check),
        probe(Language::Node, settings, path, check),
        probe(Language::Typescript, settings, path, check),
        probe(Language::Bash, settings, path, check),
        probe(Language::Sh, settings, path, check),
    );
    [python, node, typescript, bash, sh]
        .into_iter()
        .map(|f| (f.language, f))
        .collect()
}

async fn probe<F, Fut>(
    language: Language,
    settings: &RunCodeSettings,
    path: &str,
    check: &F,
) -> Found
where
    F: Fn(Vec<String>) -> Fut,
    Fut: std::future::Future<Output = Result<Option<String>, String>>,
{
    let mut found = Found {
        language,
        available: false,
        disabled: settings.disable.contains(&language),
        interpreter: Vec::new(),
        version: None,
        reason: None,
    };
    if found.disabled {
        found.reason = Some("disabled in the user config (runCode.disable)".into());
        return found;
    }
    let custom = settings.interpreters.get(&language);
    let tries: Vec<(Vec<String>, Vec<String>)> = match custom {
        Some(prefix) if !prefix.is_empty() => vec![(prefix.clone(), vec!["--version".into()])],
        Some(_) => {
            found.reason = Some(format!(
                "runCode.interpreters.{language} in the user config is empty; give an argv prefix such as [\"python3\"]"
            ));
            return found;
        }
        None => candidates(language)
            .into_iter()
            .map(|(p, c)| {
                (
                    p.into_iter().map(String::from).collect(),
                    c.into_iter().map(String::from).collect(),
                )
            })
            .collect(),
    };
    let mut why = Vec::new();
    let check_run = check;
    for (prefix, check) in tries {
        let Some(exe) = search(&prefix[0], path) else {
            why.push(format!("{} is not on PATH", prefix[0]));
            continue;
        };
        let mut argv = prefix.clone();
        argv[0] = exe.to_string_lossy().into_owned();
        let probe_argv = argv.iter().chain(&check).cloned().collect();
        match check_run(probe_argv).await {
            Ok(version) => {
                found.available = true;
                found.interpreter = argv;
                found.version = version;
                return found;
            }
            Err(e) => why.push(format!("{} does not work here: {e}", prefix.join(" "))),
        }
    }
    found.reason = Some(format!(
        "{}; install one, or set runCode.interpreters.{language} in the user config",
        why.join("; ")
    ));
    found
}

/// The first line of a probe's output (stdout, else stderr): its version.
pub fn first_line(stdout: &[u8], stderr: &[u8]) -> Option<String> {
    let text = if stdout.iter().all(u8::is_ascii_whitespace) {
        stderr
    } else {
        stdout
    };
    String::from_utf8_lossy(text)
        .lines()
        .next()
        .map(|l| l.trim().to_owned())
        .filter(|l| !l.is_empty())
}

/// `name` on `path`, as an executable file (a name with a `/` is taken as
/// a path).
pub fn search(name: &str, path: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if name.contains('/') {
        let p = PathBuf::from(name);
        return executable(&p).then_some(p);
    }
    path.split(':')
        .filter(|d| !d.is_empty())
        .map(|d| Path::new(d).join(name))
        .find(|p| executable(p))
}
