//! Which agent a command launches, read from its launch chain only: the
//! program, and the launchers in front of it (`env`, `node`, `npx`,
//! `bunx`, `uvx`, `pipx run`, `npm exec`, a shim or wrapper script that
//! `exec`s the next). What counts is a program's own name, the package an
//! npm launcher or a `node` script belongs to (the directory after
//! `node_modules` or its `@scope`), and a Python tool's environment (the
//! directory after uv's `tools` or pipx's `venvs`). Arguments are never
//! evidence: `sh -c '... zcode ...'` and `python3 tool.py --name
//! claude-agent-acp` launch no agent, and a script's comments and other
//! lines say nothing, only the lines that `exec` what runs next.

use std::path::{Path, PathBuf};

use super::agents::Profile;

/// What detection may ask about the machine.
pub trait Look {
    /// The file a bare command name runs (a `PATH` lookup).
    fn which(&self, program: &str) -> Option<PathBuf>;
    /// The real path of an existing file (symlinks followed).
    fn real(&self, path: &Path) -> Option<PathBuf>;
    /// The text of a small script (`#!` first line), if `path` is one.
    fn script(&self, path: &Path) -> Option<String>;
}

/// The machine as it is.
pub struct RealLook;

/// Scripts larger than this are not read: wrappers are small.
const MAX_SCRIPT: u64 = 64 * 1024;
/// Launchers followed one behind another, at most.
const MAX_DEPTH: usize = 6;

impl Look for RealLook {
    fn which(&self, program: &str) -> Option<PathBuf> {
        let path = std::env::var_os("PATH")?;
        std::env::split_paths(&path)
            .map(|d| d.join(program))
            .find(|p| p.is_file())
    }
    fn real(&self, path: &Path) -> Option<PathBuf> {
        std::fs::canonicalize(path).ok()
    }
    fn script(&self, path: &Path) -> Option<String> {
        use std::io::Read;
        let meta = std::fs::metadata(path).ok()?;
        if !meta.is_file() || meta.len() > MAX_SCRIPT {
            return None;
        }
        let mut text = String::new();
        std::fs::File::open(path)
            .ok()?
            .take(MAX_SCRIPT)
            .read_to_string(&mut text)
            .ok()?;
        text.starts_with("#!").then_some(text)
    }
}

/// The agents `argv` launches, each with why, in words.
pub fn launched(argv: &[String], look: &dyn Look, homes: &[PathBuf]) -> Vec<(Profile, String)> {
    let mut out = Vec::new();
    let walk = Walk::new(look, homes);
    walk.chain(argv, 0, &mut out);
    out
}

/// The name of the agent `argv` launches, as its launch chain says: the
/// first program, script or package in it that is not a launcher, an
/// interpreter or a generic file name (`index`, `main`, `cli`). What the
/// user allows an agent no profile knows is remembered under it.
pub fn agent_name(argv: &[String], look: &dyn Look, homes: &[PathBuf]) -> Option<String> {
    let walk = Walk::new(look, homes);
    walk.chain(argv, 0, &mut Vec::new());
    let names = walk.names.into_inner();
    names.into_iter().find(|n| !generic(n))
}

/// Names that say nothing about which agent runs.
fn generic(name: &str) -> bool {
    const WORDS: &[&str] = &[
        "pyenv",
        "rbenv",
        "nodenv",
        "nvm",
        "volta",
        "fnm",
        "corepack",
        "shims",
        "libexec",
        "env",
        "npm",
        "pnpm",
        "yarn",
        "uv",
        "pipx",
        "mise",
        "asdf",
        "rtx",
        "zcode-acp",
        "index",
        "main",
        "cli",
        "bin",
        "dist",
        "lib",
        "src",
        "run",
        "start",
        "server",
        "app",
        "acp",
    ];
    let versioned = |tool: &&str| {
        name == *tool
            || name
                .strip_prefix(*tool)
                .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit() || c == '.'))
    };
    name.len() < 3
        || WORDS.contains(&name)
        || INTERPRETERS.iter().any(versioned)
        || RUNNERS.iter().any(versioned)
        || SHELLS.iter().any(versioned)
}

struct Walk<'a> {
    look: &'a dyn Look,
    homes: &'a [PathBuf],
    /// Every name the chain showed, in order (see [`agent_name`]).
    names: std::cell::RefCell<Vec<String>>,
    /// Whether names are recorded now (not while a launcher's own path
    /// is followed).
    recording: std::cell::Cell<bool>,
}

/// Interpreters that run a script file given as their first argument.
const INTERPRETERS: &[&str] = &["node", "nodejs", "bun", "deno", "python", "python3", "ruby"];
/// Options of those interpreters that take the next word as their value.
const VALUED: &[&str] = &[
    "-r",
    "--require",
    "--import",
    "--loader",
    "--experimental-loader",
    "--env-file",
    "--conditions",
    "-C",
    "-W",
    "-X",
    "--config",
];
/// Package runners: the first word that is not an option names a package.
const RUNNERS: &[&str] = &["npx", "bunx", "pnpx", "uvx"];
/// Shells: a `-c` line is not followed; a script file is.
const SHELLS: &[&str] = &["sh", "bash", "dash", "zsh", "ksh"];

impl<'a> Walk<'a> {
    fn new(look: &'a dyn Look, homes: &'a [PathBuf]) -> Walk<'a> {
        Walk {
            look,
            homes,
            names: Default::default(),
            recording: std::cell::Cell::new(true),
        }
    }

    fn note(&self, name: &str, why: impl Fn() -> String, out: &mut Vec<(Profile, String)>) {
        let name = name.to_ascii_lowercase();
        if self.recording.get() {
            self.names.borrow_mut().push(name.clone());
        }
        if let Some(p) = Profile::launched_as(&name) {
            if !out.iter().any(|(f, _)| *f == p) {
                out.push((p, why()));
            }
        }
    }

    fn chain(&self, argv: &[String], depth: usize, out: &mut Vec<(Profile, String)>) {
        let Some((program, args)) = argv.split_first() else {
            return;
        };
        if depth > MAX_DEPTH {
            return;
        }
        let base = stem(program);
        self.note(&base, || format!("the command runs `{base}`"), out);
        // Where a launcher really is (a pyenv or asdf shim, a version
        // manager's directory) says nothing of the agent's name: what it
        // runs does.
        let launcher = generic(&base);
        let recording = self.recording.replace(self.recording.get() && !launcher);
        // Where the program really is: an npm `.bin` link leads into its
        // package, a uv tool's into its environment.
        let named = if program.contains('/') {
            Some(PathBuf::from(program))
        } else {
            self.look.which(program)
        };
        if let Some(real) = named.as_deref().and_then(|p| self.look.real(p)) {
            self.note_path(&real, program, out);
            if let Some(text) = self.look.script(&real) {
                self.follow_script(&text, program, &real, depth, out);
            }
        }
        self.recording.set(recording);
        let rest = |i: usize| args.get(i..).unwrap_or_default();
        let subcommand = args.first().map(String::as_str);
        match base.as_str() {
            "env" => {
                let i = args
                    .iter()
                    .position(|a| !a.starts_with('-') && !a.contains('='))
                    .unwrap_or(args.len());
                self.chain(rest(i), depth + 1, out);
            }
            "npm" | "pnpm" | "yarn" | "bun" if matches!(subcommand, Some("exec" | "dlx" | "x")) => {
                self.package(rest(1), out)
            }
            b if INTERPRETERS.contains(&b) => self.interpreted(b, args, out),
            b if RUNNERS.contains(&b) => self.package(args, out),
            "uv" if matches!(subcommand, Some("tool"))
                && args.get(1).is_some_and(|a| a == "run") =>
            {
                self.package(rest(2), out)
            }
            "pipx" if matches!(subcommand, Some("run")) => self.package(rest(1), out),
            "mise" | "asdf" | "rtx" if matches!(subcommand, Some("x" | "exec")) => {
                let i = args.iter().position(|a| a == "--").map_or(2, |i| i + 1);
                self.chain(rest(i), depth + 1, out);
            }
            "zcode-acp" if subcommand == Some("shell-agent") => self.note(
                "zcode-shell-agent",
                || "the command runs `zcode-acp shell-agent`".into(),
                out,
            ),
            b if SHELLS.contains(&b) => {
                // A script file (not `-c`): its `exec` lines.
                if let Some(script) = args.iter().find(|a| !a.starts_with('-')) {
                    if args.iter().any(|a| a == "-c") {
                        return;
                    }
                    let path = PathBuf::from(script);
                    if let Some(text) = self.look.real(&path).and_then(|r| {
                        std::fs::read_to_string(&r)
                            .ok()
                            .filter(|t| t.len() as u64 <= MAX_SCRIPT)
                    }) {
                        self.follow_script(&text, script, &path, depth, out);
                    }
                }
            }
            _ => {}
        }
    }

    /// `node [options] SCRIPT`, `python3 -m MODULE`: the script's package.
    fn interpreted(&self, interpreter: &str, args: &[String], out: &mut Vec<(Profile, String)>) {
        let mut i = 0;
        while let Some(a) = args.get(i) {
            if a == "-m" && interpreter.starts_with("python") {
                if let Some(module) = args.get(i + 1) {
                    self.note(
                        module,
                        || format!("the command runs the module `{module}`"),
                        out,
                    );
                }
                return;
            }
            if matches!(a.as_str(), "-e" | "-p" | "-c" | "--eval" | "--print") {
                return; // code on the command line: no file to read
            }
            if a == "run" && interpreter == "deno" {
                i += 1;
                continue;
            }
            if VALUED.contains(&a.as_str()) {
                i += 2;
                continue;
            }
            if a.starts_with('-') {
                i += 1;
                continue;
            }
            let script = PathBuf::from(a);
            let real = self.look.real(&script).unwrap_or(script);
            self.note_path(&real, a, out);
            return;
        }
    }

    /// `npx [-y] [-p PKG] PKG[@version] ...`: the package named.
    fn package(&self, args: &[String], out: &mut Vec<(Profile, String)>) {
        let mut i = 0;
        while let Some(a) = args.get(i) {
            if matches!(a.as_str(), "-p" | "--package" | "--from" | "--spec") {
                if let Some(spec) = args.get(i + 1) {
                    self.note_package(spec, out);
                }
                i += 2;
                continue;
            }
            if let Some(spec) = a
                .strip_prefix("--package=")
                .or_else(|| a.strip_prefix("--from="))
            {
                self.note_package(spec, out);
                i += 1;
                continue;
            }
            if a.starts_with('-') {
                i += 1;
                continue;
            }
            self.note_package(a, out);
            return;
        }
    }

    fn note_package(&self, spec: &str, out: &mut Vec<(Profile, String)>) {
        let name = package_name(spec);
        self.note(
            &name,
            || format!("the command runs the package `{spec}`"),
            out,
        );
    }

    /// A file's own name, and the package or tool environment it lies in.
    fn note_path(&self, real: &Path, word: &str, out: &mut Vec<(Profile, String)>) {
        let shown = real.display().to_string();
        let parts: Vec<String> = components(real, self.homes);
        let file = parts.last().map(|f| stem(f)).unwrap_or_default();
        self.note(&file, || format!("`{word}` is {shown}"), out);
        for (i, part) in parts.iter().enumerate() {
            let container = part.as_str();
            let next = match parts.get(i + 1) {
                Some(n) if n.starts_with('@') && container == "node_modules" => parts.get(i + 2),
                other => other,
            };
            if matches!(container, "node_modules" | "tools" | "venvs") || container.starts_with('@')
            {
                if let Some(name) = next {
                    self.note(name, || format!("`{word}` is {shown}, in `{name}`"), out);
                }
            }
        }
    }

    /// A wrapper script: its `#!` interpreter's environment (a uv tool's
    /// python), and each command it `exec`s.
    fn follow_script(
        &self,
        text: &str,
        word: &str,
        at: &Path,
        depth: usize,
        out: &mut Vec<(Profile, String)>,
    ) {
        if let Some(interpreter) = text
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("#!"))
            .and_then(|l| l.split_whitespace().next())
        {
            if interpreter.starts_with('/') {
                self.note_path(Path::new(interpreter), word, out);
            }
        }
        let before = out.len();
        for line in text.lines() {
            let line = line.trim();
            if line.starts_with('#') {
                continue;
            }
            for segment in line.split([';', '&', '|']) {
                let words = shell_words(segment);
                let words: Vec<String> = match words.iter().position(|w| w == "exec") {
                    Some(i)
                        if words[..i]
                            .iter()
                            .all(|w| matches!(w.as_str(), "then" | "else" | "do")) =>
                    {
                        words[i + 1..].to_vec()
                    }
                    _ => continue,
                };
                self.chain(&words, depth + 1, out);
            }
        }
        for (_, why) in out.iter_mut().skip(before) {
            *why = format!("`{word}` is a script ({}), and in it {why}", at.display());
        }
    }
}

/// A file name without its extension and version: `codex-acp.js` ->
/// `codex-acp`; a path's last component.
fn stem(word: &str) -> String {
    let name = word.rsplit('/').next().unwrap_or(word);
    let name = name.split('@').next().unwrap_or(name);
    let name = ["js", "mjs", "cjs", "ts", "py", "sh", "exe"]
        .iter()
        .find_map(|e| name.strip_suffix(&format!(".{e}")))
        .unwrap_or(name);
    name.to_ascii_lowercase()
}

/// `@scope/name@1.2.3` -> `name`; `name@latest` -> `name`; a uv spec
/// `name==1.0` -> `name`.
fn package_name(spec: &str) -> String {
    let unscoped = match spec.strip_prefix('@') {
        Some(rest) => rest.split_once('/').map_or(rest, |(_, n)| n),
        None => spec,
    };
    unscoped
        .split(['@', '=', '<', '>', '[', '~'])
        .next()
        .unwrap_or(unscoped)
        .to_ascii_lowercase()
}

/// The lowercase components of `path`, the home directory's own left out
/// (a user called `claude` is not a Claude backend).
fn components(path: &Path, homes: &[PathBuf]) -> Vec<String> {
    let rest = homes
        .iter()
        .filter(|h| !h.as_os_str().is_empty() && h.as_os_str() != "/")
        .find_map(|h| path.strip_prefix(h).ok())
        .unwrap_or(path);
    rest.components()
        .filter_map(|c| match c {
            std::path::Component::Normal(s) => Some(s.to_string_lossy().to_ascii_lowercase()),
            _ => None,
        })
        .collect()
}

/// A script line's words: split on whitespace, quotes dropped, and a
/// leading `$var/` dropped (`"$basedir/../pkg/dist/index.js"` names
/// `../pkg/dist/index.js`).
fn shell_words(line: &str) -> Vec<String> {
    line.split(|c: char| c.is_whitespace() || "\"'`()<>".contains(c))
        .filter(|w| !w.is_empty())
        .map(|w| match w.strip_prefix('$') {
            Some(v) => v
                .split_once('/')
                .map(|(_, r)| r.to_owned())
                .unwrap_or_default(),
            None => w.to_owned(),
        })
        .filter(|w| !w.is_empty())
        .collect()
}
