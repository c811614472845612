//! What a git repository would run for the user: its hooks, and the config
//! keys that make git run a program.
//!
//! Git keeps no list of those keys; its documentation says, under
//! SECURITY in `git.adoc`, that "some configuration options and hook files
//! may cause Git to run arbitrary shell commands" and leaves it there. The
//! table below is ours, built key by key from git's own documentation
//! (`Documentation/config/*.adoc` of git 2.55, one file per section: the
//! file `core.adoc` for `core.fsmonitor`, `diff.adoc` for `diff.*.textconv`,
//! and so on): every key whose value git runs through the shell, runs as a
//! program, names a helper program, loads more config or hooks, or arms
//! one of those (`protocol.ext.allow` lets an `ext::` URL run a command).
//! A key not in the table and added in a later git runs nothing until the
//! table learns it; the audit's other rule (every hidden file, a new
//! repository's hooks) does not depend on it.
//!
//! Git reads, for one repository: its common directory's `config`, its
//! own `config` where that differs, `config.worktree` (under
//! `extensions.worktreeConfig`), and every file an `include.path` or
//! `includeIf.*.path` of those names ([`configs_of`]).

use std::path::{Path, PathBuf};

/// Config keys (lower case; `*` for a subsection, which may hold dots)
/// whose value git runs, or that make git run or load something.
const RUNS: &[&str] = &[
    // Every-day commands (core.adoc, hook.adoc, sequencer.adoc, pager.adoc).
    "core.fsmonitor",
    "core.hookspath",
    "hook.*.command",
    "hook.*.event",
    "core.editor",
    "sequence.editor",
    "core.pager",
    "core.askpass",
    "core.sshcommand",
    "core.gitproxy",
    "core.alternaterefscommand",
    "core.worktree",
    "core.attributesfile",
    "attr.tree",
    // Content drivers (filter.adoc, diff.adoc, merge.adoc).
    "filter.*.clean",
    "filter.*.smudge",
    "filter.*.process",
    "diff.external",
    "diff.*.command",
    "diff.*.textconv",
    "merge.*.driver",
    "merge.default",
    // Signing (gpg.adoc, log.adoc): `log.showSignature` runs the gpg
    // program on every `git log`.
    "gpg.program",
    "gpg.*.program",
    "gpg.ssh.defaultkeycommand",
    "log.showsignature",
    // Transports (remote.adoc, url.adoc, protocol.adoc, credential.adoc).
    "remote.*.uploadpack",
    "remote.*.receivepack",
    "remote.*.vcs",
    "url.*.insteadof",
    "url.*.pushinsteadof",
    "protocol.allow",
    "protocol.*.allow",
    "credential.helper",
    "credential.*.helper",
    "extensions.partialclone",
    "uploadpack.packobjectshook",
    "tar.*.command",
    // Porcelain and tools (interactive.adoc, difftool.adoc, mergetool.adoc,
    // trailer.adoc, submodule.adoc, gc.adoc, sendemail.adoc, imap.adoc,
    // web.adoc, browser.adoc, help.adoc, man.adoc, instaweb.adoc,
    // guitool.adoc, pull.adoc).
    "interactive.difffilter",
    "difftool.*.cmd",
    "difftool.*.path",
    "mergetool.*.cmd",
    "mergetool.*.path",
    "trailer.*.cmd",
    "trailer.*.command",
    "submodule.*.update",
    "gc.recentobjectshook",
    "sendemail.sendmailcmd",
    "sendemail.*.sendmailcmd",
    "sendemail.smtpserver",
    "sendemail.*.smtpserver",
    "sendemail.tocmd",
    "sendemail.*.tocmd",
    "sendemail.cccmd",
    "sendemail.*.cccmd",
    "sendemail.headercmd",
    "sendemail.*.headercmd",
    "imap.tunnel",
    "web.browser",
    "help.browser",
    "instaweb.browser",
    "instaweb.httpd",
    "instaweb.modulepath",
    "browser.*.cmd",
    "browser.*.path",
    "man.viewer",
    "man.*.cmd",
    "man.*.path",
    "guitool.*.cmd",
    "svn.authorsprog",
    "pull.twohead",
    "pull.octopus",
    // git-lfs, which git runs as a filter: its own keys name programs
    // (git-lfs-config.adoc).
    "lfs.customtransfer.*.path",
    "lfs.standalonetransferagent",
    "lfs.extension.*.clean",
    "lfs.extension.*.smudge",
    // More config (includeif.adoc, extensions.adoc).
    "include.path",
    "includeif.*.path",
    "extensions.worktreeconfig",
];

/// The parts of a config key as `git config --list` prints it: section,
/// subsection (None without one), name; section and name lower-cased.
fn parts(key: &str) -> Option<(String, Option<&str>, String)> {
    let (section, rest) = key.split_once('.')?;
    match rest.rsplit_once('.') {
        Some((sub, name)) => Some((
            section.to_ascii_lowercase(),
            Some(sub),
            name.to_ascii_lowercase(),
        )),
        None => Some((
            section.to_ascii_lowercase(),
            None,
            rest.to_ascii_lowercase(),
        )),
    }
}

/// Whether a config key, with this value, makes git run something.
pub fn runs(key: &str, value: &str) -> bool {
    let Some((section, sub, name)) = parts(key) else {
        return false;
    };
    match (section.as_str(), sub, name.as_str()) {
        // An alias runs a program when its value starts with `!`; one that
        // starts with global options can set config (`-c k=v`, which counts
        // as protected) or move git's programs (`--exec-path`).
        ("alias", _, _) => {
            let v = value.trim_start();
            v.starts_with('!')
                || v.starts_with("-c")
                || v.starts_with("--config-env")
                || v.starts_with("--exec-path")
        }
        // `pager.<command>`: a value that is not a boolean is a pager.
        ("pager", None, _) => !matches!(
            value.trim().to_ascii_lowercase().as_str(),
            "" | "true" | "false" | "yes" | "no" | "on" | "off" | "1" | "0"
        ),
        // A URL that runs a command (`ext::`) or a remote helper
        // (`<helper>::`).
        ("remote", Some(_), "url" | "pushurl") => value.contains("::"),
        _ => RUNS.iter().any(|pattern| {
            let Some((ps, psub, pname)) = parts(pattern) else {
                return false;
            };
            let sub_matches = match (psub, sub) {
                (None, None) => true,
                (Some("*"), Some(_)) => true,
                // `customtransfer.*`: a subsection that starts so; `ssh`
                // (`gpg.ssh.defaultkeycommand`): that one, in any case
                // (git reads `[gpg.SSH]` as `ssh`).
                (Some(p), Some(s)) => match p.strip_suffix('*') {
                    Some(pre) => s.to_ascii_lowercase().starts_with(pre) && s.len() > pre.len(),
                    None => s.eq_ignore_ascii_case(p),
                },
                _ => false,
            };
            ps == section && pname == name && sub_matches
        }),
    }
}

/// Why a config could not be read for what it would run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unread(pub String);

/// The entries of a config file that make git run something, as `(key,
/// value)`, read by git itself from this one file (includes are not
/// followed: an `include.path` is an entry of its own). Where git cannot
/// answer (none to trust on PATH, or it took too long), the file is read
/// by [`parse`] instead; a file neither can read is [`Unread`].
pub fn running_entries(config: &Path) -> Result<Vec<(String, String)>, Unread> {
    if !crate::policy::git_cmd::readable_config(config) {
        // Not a file git could read without blocking: git reading it later
        // blocks rather than runs anything.
        return Ok(Vec::new());
    }
    let bytes = crate::config::atomic::read_regular(config, true)
        .map_err(|e| Unread(format!("zcode-acp cannot read it ({e})")))?;
    Ok(running_entries_of(bytes))
}

/// What in a config's text runs, as git reads it: git is given this very
/// text (so what is judged is what was read), or where git cannot answer,
/// [`parse`] reads it. Remembered by content, so one config many
/// repositories share, or one unchanged since the last look, is read once.
pub fn running_entries_of(bytes: Vec<u8>) -> Vec<(String, String)> {
    use crate::policy::git_cmd;
    use std::hash::BuildHasher;
    type Cache = std::collections::HashMap<(u64, usize), Vec<(String, String)>>;
    static CACHE: std::sync::OnceLock<(
        std::collections::hash_map::RandomState,
        std::sync::Mutex<Cache>,
    )> = std::sync::OnceLock::new();
    // Most repositories' own config (core, remote, branch) cannot spell
    // a key that runs anything: no git is started to say so.
    if !may_name_a_runner(&bytes) {
        return Vec::new();
    }
    let (hasher, cache) = CACHE.get_or_init(Default::default);
    let key = (hasher.hash_one(&bytes), bytes.len());
    if let Some(hit) = cache.lock().ok().and_then(|c| c.get(&key).cloned()) {
        return hit;
    }
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let listed = (|| {
        git_cmd::program()?;
        let mut cmd = git_cmd::command();
        cmd.args([
            "--no-pager",
            "config",
            "--no-includes",
            "--file",
            "-",
            "--list",
            "-z",
        ]);
        let out = git_cmd::output_with_input(cmd, Some(bytes), git_cmd::LIMIT).ok()?;
        if !out.status.success() {
            return None;
        }
        Some(
            String::from_utf8_lossy(&out.stdout)
                .split('\0')
                .filter(|e| !e.is_empty())
                .map(|entry| {
                    let (key, value) = entry.split_once('\n').unwrap_or((entry, ""));
                    (key.to_owned(), value.to_owned())
                })
                .collect::<Vec<_>>(),
        )
    })();
    let entries: Vec<(String, String)> = listed
        .unwrap_or_else(|| parse(&text))
        .into_iter()
        .filter(|(k, v)| !k.is_empty() && runs(k, v))
        .collect();
    if let Ok(mut c) = cache.lock() {
        if c.len() >= 4096 {
            c.clear();
        }
        c.insert(key, entries.clone());
    }
    entries
}

/// Whether a config's text could hold a key that [`runs`]: for each such
/// key its section's and its name's letters are somewhere in it (in any
/// case). Git's syntax spells both out: a section in its header, a name at
/// the start of its line, neither escaped. What it removes before reading
/// (quotes, a backslash that continues a line) is removed here first, so
/// letters it would join are looked for joined ([`parse`] joins such lines
/// anywhere); removing can join words, never hide one. A NUL ends a key
/// where git reads it (a quoted subsection's escaped letters would then be
/// its name), so a text holding one is always handed over.
fn may_name_a_runner(bytes: &[u8]) -> bool {
    if bytes.contains(&0) {
        return true;
    }
    let text = as_read(bytes);
    let has = |word: &str| memchr::memmem::find(&text, word.as_bytes()).is_some();
    // Any key of `[alias]` and `[pager]`, and `core.pager`; a remote's URL
    // that names a helper (`helper::address`).
    if has("alias") || has("pager") || (has("url") && has("::")) {
        return true;
    }
    RUNS.iter()
        .any(|pattern| parts(pattern).is_some_and(|(section, _, name)| has(&section) && has(&name)))
}

/// A config's bytes lower-cased, without what git's reading removes:
/// quotes, and a backslash before a line's end (with blanks between, as
/// [`parse`] takes it).
fn as_read(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut rest = bytes;
    while let Some((&b, after)) = rest.split_first() {
        rest = after;
        match b {
            b'"' => {}
            // A line continued, blanks allowed before its end (as the
            // parser allows them).
            b'\\' => {
                let blank = rest
                    .iter()
                    .take_while(|c| matches!(c, b' ' | b'\t' | b'\r'))
                    .count();
                if rest.get(blank) == Some(&b'\n') {
                    rest = &rest[blank + 1..];
                } else {
                    out.push(b);
                }
            }
            _ => out.push(b.to_ascii_lowercase()),
        }
    }
    out
}

/// Every `(key, value)` of a config file in git's syntax, read by
/// zcode-acp where git cannot be asked. It errs on the side of seeing a
/// key: a line it cannot place is taken as a key of the section it is in.
pub fn parse(text: &str) -> Vec<(String, String)> {
    // Git skips a byte order mark at the start.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut out = Vec::new();
    let mut section = String::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let mut line = line.trim().to_owned();
        // Continuation lines belong to the entry before.
        while line.ends_with('\\') {
            line.pop();
            match lines.next() {
                Some(next) => line.push_str(next),
                None => break,
            }
        }
        let line = line.trim_start();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(rest) = line.strip_prefix('[') {
            let header = rest.split(']').next().unwrap_or("");
            let (name, sub) = match header.split_once(char::is_whitespace) {
                Some((name, sub)) => (name, Some(sub.trim().trim_matches('"'))),
                None => (header, None),
            };
            // `[section.sub]`, the old form, is `section.sub` too.
            section = match sub {
                Some(sub) => format!("{}.{sub}", name.to_ascii_lowercase()),
                None => name.to_ascii_lowercase(),
            };
            // A key may follow the header on the same line.
            let after = rest.split_once(']').map(|(_, a)| a.trim()).unwrap_or("");
            if !after.is_empty() && !after.starts_with('#') && !after.starts_with(';') {
                push(&mut out, &section, after);
            }
            continue;
        }
        push(&mut out, &section, line);
    }
    out
}

fn push(out: &mut Vec<(String, String)>, section: &str, line: &str) {
    let (name, value) = match line.split_once('=') {
        Some((n, v)) => (n.trim(), v.trim().trim_matches('"')),
        None => (line.trim(), "true"),
    };
    if !section.is_empty() && !name.is_empty() {
        out.push((format!("{section}.{name}"), value.to_owned()));
    }
}

/// The config files git reads for a repository, beside the global and
/// system ones: the common directory's `config`, the git directory's own
/// where it differs, each one's `config.worktree`, and what their
/// includes name, followed to [`MAX_INCLUDE_DEPTH`] (only files that
/// exist; a symlink is followed, as git does).
pub fn configs_of(git_dir: &Path, common_dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    let mut candidates = vec![common_dir.join("config"), git_dir.join("config")];
    // Read under `extensions.worktreeConfig` (checked whether or not it is
    // set: it may be set later, or in an include).
    let worktree = [
        common_dir.join(WORKTREE_CONFIG),
        git_dir.join(WORKTREE_CONFIG),
    ];
    candidates.extend(worktree);
    for f in candidates {
        if !out.contains(&f) && f.exists() {
            out.push(f);
        }
    }
    let mut frontier = out.clone();
    for _ in 0..MAX_INCLUDE_DEPTH {
        let mut next = Vec::new();
        for config in &frontier {
            for target in includes(config) {
                if !out.contains(&target) && target.exists() {
                    out.push(target.clone());
                    next.push(target);
                }
            }
        }
        if next.is_empty() {
            break;
        }
        frontier = next;
    }
    out
}

const WORKTREE_CONFIG: &str = "config.worktree";

/// How deep includes are followed (git's own limit is 10).
const MAX_INCLUDE_DEPTH: usize = 10;

/// The files a config's includes name, made absolute (relative to the
/// config's directory; `~/` to the home directory).
fn includes(config: &Path) -> Vec<PathBuf> {
    let Ok(entries) = running_entries(config) else {
        return Vec::new();
    };
    let dir = config.parent().unwrap_or(Path::new("/"));
    let home = dirs::home_dir();
    entries
        .into_iter()
        .filter(|(k, _)| {
            let k = k.to_ascii_lowercase();
            k == "include.path" || (k.starts_with("includeif.") && k.ends_with(".path"))
        })
        .filter_map(|(_, v)| {
            if let Some(rest) = v.strip_prefix("~/") {
                return home.as_ref().map(|h| h.join(rest));
            }
            let p = Path::new(&v);
            let p = if p.is_absolute() {
                p.to_path_buf()
            } else {
                dir.join(p)
            };
            // As a real path where it exists (`.git/../x` is `x`).
            Some(crate::policy::resolve_real(&p).unwrap_or(p))
        })
        .collect()
}

/// `config` with the given keys removed (every value of each), by git on
/// this one file; false when git could not do it.
pub fn unset(config: &Path, keys: &[String]) -> bool {
    use crate::policy::git_cmd;
    if git_cmd::program().is_none() {
        return false;
    }
    for key in keys {
        if !git_cmd::readable_config(config) {
            return false;
        }
        let mut cmd = crate::policy::git_cmd::command();
        cmd.args(["--no-pager", "config", "--file"])
            .arg(config)
            .args(["--unset-all", key]);
        if git_cmd::output(cmd, git_cmd::LIMIT).is_err() {
            return false;
        }
    }
    true
}

/// The hooks git would run: regular files in `hooks/` that are not the
/// `.sample` files `git init` leaves.
pub fn hooks(git_dir: &Path) -> Vec<PathBuf> {
    hooks_in(&git_dir.join("hooks"))
}

/// The hooks in a hooks directory (`core.hooksPath`'s, or a git
/// directory's `hooks`).
pub fn hooks_in(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
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
        for (k, v) in [
            ("core.fsmonitor", "x"),
            ("core.hooksPath", "x"),
            ("filter.lfs.smudge", "x"),
            ("gpg.ssh.defaultKeyCommand", "x"),
            ("gpg.SSH.defaultkeycommand", "x"),
            ("filter.a.b.process", "x"),
            ("diff.pdf.textconv", "x"),
            ("includeIf.gitdir:/x/.path", "x"),
            ("alias.st", "!sh -c evil"),
            ("alias.lg", "-c core.pager=evil log"),
            ("credential.https://example.com.helper", "evil"),
            ("credential.helper", "evil"),
            ("pager.log", "evil"),
            ("remote.origin.url", "ext::sh -c evil"),
            ("remote.origin.uploadpack", "evil"),
            ("core.sshCommand", "evil"),
            ("gc.recentObjectsHook", "evil"),
            ("trailer.sign.cmd", "evil"),
            ("hook.lint.command", "evil"),
            ("protocol.ext.allow", "always"),
            ("extensions.worktreeConfig", "true"),
            ("lfs.customtransfer.mine.path", "evil"),
            ("lfs.extension.x.smudge", "evil"),
            ("lfs.standalonetransferagent", "mine"),
            ("log.showSignature", "true"),
        ] {
            assert!(runs(k, v), "{k}");
        }
        for (k, v) in [
            ("core.bare", "false"),
            ("user.name", "x"),
            ("alias.st", "status"),
            ("remote.origin.url", "https://example.com/x.git"),
            ("filter.lfs.required", "true"),
            ("pager.log", "false"),
            ("credential.https://example.com.username", "me"),
        ] {
            assert!(!runs(k, v), "{k}");
        }
    }

    /// A config that spells no key that runs anything is not handed to git;
    /// every key that runs, in any case, makes it handed over.
    #[test]
    fn only_a_config_that_could_name_a_runner_is_read_for_one() {
        let plain = "[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = false\n\
                     [remote \"origin\"]\n\turl = git@github.com:o/r.git\n\tfetch = +refs/heads/*:refs/remotes/origin/*\n\
                     [branch \"main\"]\n\tremote = origin\n\tmerge = refs/heads/main\n";
        assert!(!may_name_a_runner(plain.as_bytes()));
        assert!(running_entries_of(plain.as_bytes().to_vec()).is_empty());
        for pattern in RUNS {
            let (section, sub, name) = parts(pattern).unwrap();
            let header = match sub {
                Some(s) => format!(
                    "[{} \"{}\"]",
                    section.to_ascii_uppercase(),
                    s.replace('*', "x")
                ),
                None => format!("[{}]", section.to_ascii_uppercase()),
            };
            let text = format!("{plain}{header}\n\t{} = !true\n", name.to_ascii_uppercase());
            assert!(may_name_a_runner(text.as_bytes()), "{pattern}");
            assert!(
                !running_entries_of(text.into_bytes()).is_empty(),
                "{pattern}"
            );
        }
        for text in [
            "[alias]\n\tx = !sh\n",
            "[pager]\n\tlog = less-evil\n",
            "[remote \"o\"]\n\turl = ext::sh -c evil\n",
            // Letters git (or the parser) joins: quotes and continued lines.
            "[remote \"o\"]\n\turl = ext:\":\"sh -c evil\n",
            "[remote \"o\"]\n\turl = ext:\"\":sh\n",
            "[remote \"o\"]\n\tpushurl = foo:\\\n:bar\n",
            "[core]\n\tfsmon\\\nitor = x\n",
            "[core]\n\tfsmon\\ \nitor = x\n",
            "[co\\\nre]\n\tfsmonitor = x\n",
            // A NUL cuts the key short: the escaped subsection is its name.
            "[core \"\\f\\s\\m\\o\\n\\i\\t\\o\\r\0\"]\n\tz = touch pwned\n",
        ] {
            assert!(may_name_a_runner(text.as_bytes()), "{text:?}");
            assert!(
                !running_entries_of(text.as_bytes().to_vec()).is_empty(),
                "{text:?}"
            );
        }
    }

    #[test]
    fn the_parser_sees_what_git_would() {
        let text = "# c\n[core]\n\tfsmonitor = \"touch /x\"\n[alias]\n\tst = !sh\n[filter \"a.b\"]\n\tclean = c \\\n  more\n[credential \"https://h\"] helper = x\n[Core]bare\n";
        let entries = parse(text);
        let keys: Vec<&str> = entries.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            [
                "core.fsmonitor",
                "alias.st",
                "filter.a.b.clean",
                "credential.https://h.helper",
                "core.bare"
            ]
        );
        assert!(entries.iter().filter(|(k, v)| runs(k, v)).count() == 4);
        // A byte-order mark is skipped, as git skips it.
        assert_eq!(
            parse("\u{feff}[core]\n\tfsmonitor = x\n"),
            vec![("core.fsmonitor".to_string(), "x".to_string())]
        );
    }

    #[test]
    fn a_repositorys_configs_follow_worktree_config_and_includes() {
        let t = tempfile::tempdir().unwrap();
        let d = std::fs::canonicalize(t.path()).unwrap();
        let git_dir = d.join("repo/.git");
        std::fs::create_dir_all(&git_dir).unwrap();
        std::fs::write(
            git_dir.join("config"),
            "[include]\n\tpath = ../extra.conf\n",
        )
        .unwrap();
        std::fs::write(d.join("repo/extra.conf"), "[core]\n\tpager = evil\n").unwrap();
        std::fs::write(
            git_dir.join("config.worktree"),
            "[core]\n\tfsmonitor = evil\n",
        )
        .unwrap();
        let configs = configs_of(&git_dir, &git_dir);
        assert_eq!(
            configs,
            vec![
                git_dir.join("config"),
                git_dir.join("config.worktree"),
                d.join("repo/extra.conf"),
            ]
        );
    }
}
