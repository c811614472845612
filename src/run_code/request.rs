//! What a `run_code` call asks for, checked before anything is written.

use std::path::{Component, Path, PathBuf};

use serde::Deserialize;

/// The languages `run_code` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Language {
    Python,
    Node,
    Typescript,
    Bash,
    Sh,
}

impl Language {
    pub const ALL: [Language; 5] = [
        Language::Python,
        Language::Node,
        Language::Typescript,
        Language::Bash,
        Language::Sh,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Language::Python => "python",
            Language::Node => "node",
            Language::Typescript => "typescript",
            Language::Bash => "bash",
            Language::Sh => "sh",
        }
    }

    pub fn parse(name: &str) -> Option<Language> {
        Language::ALL.into_iter().find(|l| l.name() == name)
    }

    /// Shells: their sources pass the egress guard-rail.
    pub fn is_shell(self) -> bool {
        matches!(self, Language::Bash | Language::Sh)
    }

    /// Node and what runs on it reserve more address space at start than
    /// any sane limit, so their ceiling is the heap flag and the watchdog.
    pub fn takes_address_space_limit(self) -> bool {
        !matches!(self, Language::Node | Language::Typescript)
    }

    /// The source file's name. Node 20 does not guess a module's kind, so
    /// a source with `import`/`export` statements is an ES module and any
    /// other is CommonJS (where `require` works).
    pub fn source_file(self, source: &str) -> &'static str {
        let esm = source.lines().any(|l| {
            let l = l.trim_start();
            l.starts_with("import ")
                || l.starts_with("import{")
                || l.starts_with("import\"")
                || l.starts_with("import'")
                || l.starts_with("export ")
        });
        match (self, esm) {
            (Language::Python, _) => "main.py",
            (Language::Node, true) => "main.mjs",
            (Language::Node, false) => "main.cjs",
            (Language::Typescript, true) => "main.mts",
            (Language::Typescript, false) => "main.cts",
            (Language::Bash | Language::Sh, _) => "main.sh",
        }
    }
}

impl std::fmt::Display for Language {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The tool's arguments as sent.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Raw {
    language: String,
    source: String,
    #[serde(default)]
    timeout_ms: Option<u64>,
    #[serde(default)]
    stdin: Option<String>,
    #[serde(default)]
    files: Vec<RawFile>,
    #[serde(default)]
    tools: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    path: String,
    content: String,
}

/// One input file, at a checked relative path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputFile {
    pub path: PathBuf,
    pub content: String,
}

/// A call that can be run.
#[derive(Debug, Clone)]
pub struct RunRequest {
    pub language: Language,
    pub source: String,
    pub timeout_ms: u64,
    pub stdin: Option<String>,
    pub files: Vec<InputFile>,
    /// The tools the code may call (`server.tool`), each once, in order.
    pub tools: Vec<String>,
}

/// Bounds on what one call may carry.
pub const MAX_SOURCE_BYTES: usize = 1 << 20;
pub const MAX_FILES: usize = 256;
pub const MAX_FILES_BYTES: usize = 32 << 20;
pub const MAX_STDIN_BYTES: usize = 8 << 20;
pub const MAX_TOOLS: usize = 128;

/// Checks `args` against the limits. The error says what to change.
pub fn parse(
    args: &serde_json::Value,
    default_timeout_ms: u64,
    max_timeout_ms: u64,
) -> Result<RunRequest, String> {
    let raw: Raw = serde_json::from_value(args.clone()).map_err(|e| {
        format!("the arguments are not valid: {e}; expected {{language, source, timeoutMs?, stdin?, files?: [{{path, content}}], tools?: [names]}}")
    })?;
    let language = Language::parse(&raw.language).ok_or_else(|| {
        format!(
            "unknown language {:?}; use one of python, node, typescript, bash, sh",
            raw.language
        )
    })?;
    if raw.source.len() > MAX_SOURCE_BYTES {
        return Err(format!(
            "the source is {} bytes, more than {MAX_SOURCE_BYTES}; put data in `files` or have the code read it",
            raw.source.len()
        ));
    }
    let timeout_ms = match raw.timeout_ms {
        None => default_timeout_ms,
        Some(0) => return Err("timeoutMs must be at least 1".into()),
        Some(t) if t > max_timeout_ms => {
            return Err(format!(
                "timeoutMs {t} is more than the most allowed here ({max_timeout_ms})"
            ))
        }
        Some(t) => t,
    };
    if raw
        .stdin
        .as_ref()
        .is_some_and(|s| s.len() > MAX_STDIN_BYTES)
    {
        return Err(format!(
            "stdin is more than {MAX_STDIN_BYTES} bytes; pass it as a file"
        ));
    }
    if raw.files.len() > MAX_FILES {
        return Err(format!(
            "{} files given, at most {MAX_FILES} are taken",
            raw.files.len()
        ));
    }
    let total: usize = raw.files.iter().map(|f| f.content.len()).sum();
    if total > MAX_FILES_BYTES {
        return Err(format!(
            "the files hold {total} bytes, more than {MAX_FILES_BYTES}"
        ));
    }
    let mut files: Vec<InputFile> = Vec::with_capacity(raw.files.len());
    for f in raw.files {
        let path = input_path(&f.path)?;
        if files
            .iter()
            .any(|other| other.path.starts_with(&path) || path.starts_with(&other.path))
        {
            return Err(format!(
                "the file path {:?} is given twice, or inside another given file",
                f.path
            ));
        }
        files.push(InputFile {
            path,
            content: f.content,
        });
    }
    if raw.tools.len() > MAX_TOOLS {
        return Err(format!(
            "{} tools listed, at most {MAX_TOOLS} are taken",
            raw.tools.len()
        ));
    }
    let mut tools: Vec<String> = Vec::with_capacity(raw.tools.len());
    for t in raw.tools {
        if t.trim().is_empty() || t.len() > 256 {
            return Err(format!("{t:?} is not a tool name (server.tool)"));
        }
        if !tools.contains(&t) {
            tools.push(t);
        }
    }
    Ok(RunRequest {
        language,
        source: raw.source,
        timeout_ms,
        stdin: raw.stdin,
        files,
        tools,
    })
}

/// A relative path of plain names: no root, no `..`, no `.`-only path.
fn input_path(given: &str) -> Result<PathBuf, String> {
    let path = Path::new(given);
    let plain = !given.is_empty()
        && !given.contains('\0')
        && path
            .components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
        && path.components().any(|c| matches!(c, Component::Normal(_)));
    if !plain {
        return Err(format!(
            "the file path {given:?} must be relative and stay inside the input directory (no leading /, no ..)"
        ));
    }
    Ok(path
        .components()
        .filter(|c| matches!(c, Component::Normal(_)))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn p(v: serde_json::Value) -> Result<RunRequest, String> {
        parse(&v, 30_000, 600_000)
    }

    #[test]
    fn a_plain_call_takes_the_defaults() {
        let r = p(json!({"language": "python", "source": "print(1)"})).unwrap();
        assert_eq!(r.language, Language::Python);
        assert_eq!(r.timeout_ms, 30_000);
        assert!(r.stdin.is_none() && r.files.is_empty());
    }

    #[test]
    fn what_cannot_run_is_refused_with_what_to_change() {
        let e = p(json!({"language": "ruby", "source": ""})).unwrap_err();
        assert!(e.contains("python, node"), "{e}");
        let e = p(json!({"language": "sh", "source": "", "timeout": 5})).unwrap_err();
        assert!(e.contains("timeout"), "{e}");
        let e = p(json!({"language": "sh", "source": "", "timeoutMs": 700000})).unwrap_err();
        assert!(e.contains("600000"), "{e}");
        assert!(p(json!({"language": "sh", "source": "", "timeoutMs": 0})).is_err());
        for bad in ["/etc/passwd", "../x", "a/../../x", "", ".", "a/./.."] {
            let e =
                p(json!({"language": "sh", "source": "", "files": [{"path": bad, "content": ""}]}));
            assert!(e.is_err(), "{bad} was taken");
        }
        let e = p(json!({"language": "sh", "source": "", "files": [
            {"path": "a", "content": ""}, {"path": "a/b", "content": ""}]}));
        assert!(e.is_err());
    }

    #[test]
    fn input_paths_are_normalised() {
        let r = p(json!({"language": "sh", "source": "", "files": [{"path": "./d/x.csv", "content": "1"}]}))
            .unwrap();
        assert_eq!(r.files[0].path, PathBuf::from("d/x.csv"));
    }

    #[test]
    fn node_sources_choose_their_module_kind() {
        assert_eq!(
            Language::Node.source_file("const fs = require('fs')"),
            "main.cjs"
        );
        assert_eq!(
            Language::Node.source_file("import fs from 'fs'\n"),
            "main.mjs"
        );
        assert_eq!(
            Language::Typescript.source_file("  export const x = 1"),
            "main.mts"
        );
    }
}
