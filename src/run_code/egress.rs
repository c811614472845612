//! The egress guard-rail for shell sources: a run that would publish or
//! push (`gh`, `git push`, `git remote`, `npm publish`) is refused before
//! it starts.
//!
//! A guard-rail against accidents, not a security boundary: the scan reads
//! the source as a shell would split it (quotes, `;`, `&&`, `|`, subshells,
//! `$(...)`, `env`/`command`/absolute paths, `sh -c "..."`), but code can
//! always build a command at run time (`x=pu; git ${x}sh`), and python or
//! node can run anything. The sandbox is what holds.

/// The verb a source would run, if any (`"git push"`).
pub fn denied_verb(source: &str) -> Option<String> {
    scan(source, 0)
}

fn scan(source: &str, depth: usize) -> Option<String> {
    if depth > 4 {
        return None;
    }
    let (commands, substituted) = commands(source);
    for command in commands {
        if let Some(verb) = judge(&command, depth) {
            return Some(verb);
        }
    }
    // `"$(git push)"`: what a double-quoted string substitutes runs too.
    substituted
        .iter()
        .find_map(|script| scan(script, depth + 1))
}

/// Splits `source` into simple commands, each a list of words with quotes
/// removed. Separators: newline, `;`, `&`, `|`, parentheses, braces,
/// backquotes and `$(`. Also the double-quoted strings that substitute a
/// command (`"$(...)"`, backquotes), to be scanned as scripts.
fn commands(source: &str) -> (Vec<Vec<String>>, Vec<String>) {
    let mut substituted = Vec::new();
    let mut heredocs: Vec<String> = Vec::new();
    let mut out = Vec::new();
    let mut words: Vec<String> = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = source.chars().peekable();
    let end_word = |words: &mut Vec<String>, word: &mut String, in_word: &mut bool| {
        if *in_word {
            words.push(std::mem::take(word));
            *in_word = false;
        }
    };
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let Some(n) = chars.next() {
                    if n != '\n' {
                        word.push(n);
                        in_word = true;
                    }
                }
            }
            '\'' => {
                in_word = true;
                for n in chars.by_ref() {
                    if n == '\'' {
                        break;
                    }
                    word.push(n);
                }
            }
            '"' => {
                in_word = true;
                let mut raw = String::new();
                while let Some(n) = chars.next() {
                    match n {
                        '"' => break,
                        '\\' => {
                            if let Some(m) = chars.next() {
                                word.push(m);
                                raw.push(m);
                            }
                        }
                        _ => {
                            word.push(n);
                            raw.push(n);
                        }
                    }
                }
                if raw.contains("$(") || raw.contains('`') {
                    substituted.push(raw);
                }
            }
            '$' if chars.peek() == Some(&'{') => {
                // `${#x[@]}`: a parameter expansion is part of a word.
                in_word = true;
                word.push('$');
                let mut depth = 0;
                for n in chars.by_ref() {
                    word.push(n);
                    match n {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        _ => {}
                    }
                }
            }
            '<' if chars.peek() == Some(&'<') => {
                // A here-document: its body is data, unless a shell reads it.
                chars.next();
                let strip_tabs = chars.peek() == Some(&'-');
                if strip_tabs {
                    chars.next();
                }
                if chars.peek() == Some(&'<') {
                    // `<<<`: a here-string, a word like any other.
                    chars.next();
                    continue;
                }
                while chars.peek().is_some_and(|c| *c == ' ' || *c == '\t') {
                    chars.next();
                }
                let mut delimiter = String::new();
                while let Some(&n) = chars.peek() {
                    if n.is_whitespace() || ";|&<>()".contains(n) {
                        break;
                    }
                    chars.next();
                    if !"'\"\\".contains(n) {
                        delimiter.push(n);
                    }
                }
                heredocs.push(delimiter);
            }
            '\n' if !heredocs.is_empty() => {
                end_word(&mut words, &mut word, &mut in_word);
                let reads_it = words
                    .first()
                    .map(|w| SHELLS.contains(&basename(w)))
                    .unwrap_or(false);
                out.push(std::mem::take(&mut words));
                for delimiter in std::mem::take(&mut heredocs) {
                    let mut body = String::new();
                    let mut line = String::new();
                    for n in chars.by_ref() {
                        if n != '\n' {
                            line.push(n);
                            continue;
                        }
                        if line.trim_start_matches('\t') == delimiter {
                            break;
                        }
                        body.push_str(&line);
                        body.push('\n');
                        line.clear();
                    }
                    if reads_it {
                        substituted.push(body);
                    }
                }
            }
            '#' if !in_word => {
                for n in chars.by_ref() {
                    if n == '\n' {
                        break;
                    }
                }
                end_word(&mut words, &mut word, &mut in_word);
                out.push(std::mem::take(&mut words));
            }
            '$' if chars.peek() == Some(&'(') => {
                chars.next();
                end_word(&mut words, &mut word, &mut in_word);
                out.push(std::mem::take(&mut words));
            }
            '\n' | ';' | '&' | '|' | '(' | ')' | '`' | '{' | '}' => {
                end_word(&mut words, &mut word, &mut in_word);
                out.push(std::mem::take(&mut words));
            }
            c if c.is_whitespace() => end_word(&mut words, &mut word, &mut in_word),
            c => {
                word.push(c);
                in_word = true;
            }
        }
    }
    end_word(&mut words, &mut word, &mut in_word);
    out.push(words);
    out.retain(|w| !w.is_empty());
    (out, substituted)
}

/// Options of wrappers that take the next word as their value.
const OPTIONS_WITH_VALUES: &[(&str, &[&str])] = &[
    (
        "sudo",
        &["-u", "-g", "-C", "-D", "-h", "-p", "-r", "-t", "-U"],
    ),
    ("doas", &["-u", "-C"]),
    ("timeout", &["-s", "-k", "--signal", "--kill-after"]),
    ("env", &["-u", "-C", "--unset", "--chdir"]),
    ("nice", &["-n", "--adjustment"]),
    ("exec", &["-a"]),
    ("stdbuf", &["-i", "-o", "-e"]),
    ("xargs", &["-I", "-n", "-L", "-P", "-d", "-E", "-s", "-a"]),
];

/// Words that run the rest of the command as a command.
const WRAPPERS: &[&str] = &[
    "env", "command", "exec", "builtin", "nohup", "time", "sudo", "doas", "nice", "timeout",
    "stdbuf", "setsid", "xargs", "watch", "then", "do", "else", "if", "while", "until", "!",
];

/// Programs that run a script given to them.
const SHELLS: &[&str] = &["sh", "bash", "dash", "zsh", "ksh"];

fn judge(words: &[String], depth: usize) -> Option<String> {
    let mut i = 0;
    let mut wrapper = "";
    // Leading assignments, wrappers and their options.
    while i < words.len() {
        let w = words[i].as_str();
        let base = basename(w);
        // `env -S 'git push'` splits its value into a command.
        if wrapper == "env" && (w == "-S" || w == "--split-string") {
            return words.get(i + 1).and_then(|script| scan(script, depth + 1));
        }
        let takes_value = OPTIONS_WITH_VALUES
            .iter()
            .any(|(name, opts)| *name == wrapper && opts.contains(&w));
        // `command -v gh`, `type`: they look a command up, never run it.
        if wrapper == "command" && (w == "-v" || w == "-V") {
            return None;
        }
        let skipped = is_assignment(w)
            || is_redirection(w)
            || w.starts_with('-')
            || (i > 0 && is_number(w))
            || WRAPPERS.contains(&base);
        if !skipped {
            break;
        }
        if WRAPPERS.contains(&base) {
            wrapper = base;
        }
        i += if takes_value { 2 } else { 1 };
    }
    let cmd = basename(words.get(i)?);
    let rest = &words[i + 1..];
    match cmd {
        "gh" => Some("gh".into()),
        "git" => {
            let sub = git_subcommand(rest)?;
            let pushes_through =
                matches!(sub, "subtree" | "lfs") && rest.iter().any(|w| w == "push");
            (matches!(sub, "push" | "remote" | "send-email") || pushes_through)
                .then(|| format!("git {sub}"))
        }
        // Options may take values (`--access public`): any `publish`
        // word is taken as the verb (`npm run publish` publishes too).
        "npm" | "pnpm" | "yarn" => rest
            .iter()
            .any(|w| w == "publish")
            .then(|| format!("{cmd} publish")),
        "sh" | "bash" | "dash" | "zsh" | "ksh" | "eval" => {
            // `bash -c "git push"`, `eval "..."`: the string is a script.
            let script = if cmd == "eval" {
                Some(rest.join(" "))
            } else {
                rest.iter()
                    .position(|w| w.starts_with('-') && !w.starts_with("--") && w.contains('c'))
                    .and_then(|p| rest[p + 1..].iter().find(|w| *w != "--").cloned())
            };
            script.and_then(|s| scan(&s, depth + 1))
        }
        // `find . -exec git push \;`: what follows -exec is a command.
        "find" => rest
            .iter()
            .position(|w| w == "-exec" || w == "-execdir" || w == "-ok")
            .and_then(|p| judge(&rest[p + 1..], depth + 1)),
        _ => None,
    }
}

/// git's subcommand, past its global options (`-C DIR`, `-c K=V`, ...).
fn git_subcommand(args: &[String]) -> Option<&str> {
    let mut i = 0;
    while i < args.len() {
        let a = args[i].as_str();
        match a {
            "-C" | "-c" | "--git-dir" | "--work-tree" | "--namespace" | "--exec-path" => i += 2,
            _ if a.starts_with('-') => i += 1,
            _ => return Some(a),
        }
    }
    None
}

fn basename(word: &str) -> &str {
    word.rsplit('/').next().unwrap_or(word)
}

fn is_assignment(word: &str) -> bool {
    match word.split_once('=') {
        Some((name, _)) => {
            !name.is_empty()
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && !name.starts_with(|c: char| c.is_ascii_digit())
        }
        None => false,
    }
}

/// `2>/dev/null`, `>out`, `<in`: a redirection in front of the command.
fn is_redirection(word: &str) -> bool {
    let rest = word.trim_start_matches(|c: char| c.is_ascii_digit() || c == '&');
    rest.starts_with('>') || rest.starts_with('<')
}

fn is_number(word: &str) -> bool {
    word.chars()
        .all(|c| c.is_ascii_digit() || c == '.' || c == 's')
}

#[cfg(test)]
mod tests {
    use super::denied_verb;

    #[test]
    fn the_verbs_are_found_however_they_are_written() {
        for (src, verb) in [
            ("gh pr create", "gh"),
            ("git push origin main", "git push"),
            ("git -C repo push", "git push"),
            ("git remote add x y", "git remote"),
            ("npm publish", "npm publish"),
            ("npm --access public publish", "npm publish"),
            ("echo hi; git push", "git push"),
            ("true && /usr/bin/git push", "git push"),
            ("false || (git push)", "git push"),
            ("echo $(gh auth token)", "gh"),
            ("echo `gh auth token`", "gh"),
            ("env FOO=1 git push", "git push"),
            ("command git push", "git push"),
            ("GIT_TRACE=1 git push", "git push"),
            ("cat x | xargs gh", "gh"),
            ("bash -c 'git push'", "git push"),
            ("sh -ec \"npm publish\"", "npm publish"),
            ("eval \"git push\"", "git push"),
            ("if true; then git push; fi", "git push"),
            ("timeout 5 git push", "git push"),
            ("'git' 'push'", "git push"),
            ("out=\"$(git push origin)\"", "git push"),
            ("echo \"`gh repo view`\"", "gh"),
            ("sudo -u me git push", "git push"),
            ("timeout -s KILL 5 git push", "git push"),
            ("env -u X npm publish", "npm publish"),
            ("env -S 'git push'", "git push"),
            ("exec -a name git push", "git push"),
            ("pnpm publish", "pnpm publish"),
            ("git subtree push --prefix d origin b", "git subtree"),
            ("git send-email x.patch", "git send-email"),
            ("bash <<'EOF'\ngit push\nEOF", "git push"),
            ("cat <<EOF\nit's here\nEOF\ngit push", "git push"),
            ("[ ${#f[@]} -gt 0 ] && git push", "git push"),
            ("bash --norc -c 'git push'", "git push"),
            ("bash -c -- 'git push'", "git push"),
            ("2>/dev/null git push", "git push"),
            ("watch git push", "git push"),
            ("find . -exec git push \\;", "git push"),
            ("g\\it push", "git push"),
        ] {
            assert_eq!(denied_verb(src).as_deref(), Some(verb), "{src}");
        }
    }

    #[test]
    fn ordinary_commands_pass() {
        for src in [
            "git status",
            "git log --oneline | head",
            "echo 'git push is refused'",
            "# git push\necho done",
            "npm test",
            "ls gh-pages",
            "python3 -c 'print(1)'",
            "git commit -m 'push later'",
            "echo \"today is $(date)\"",
            "git commit -m \"$(cat msg.txt)\"",
            "sudo -u me ls",
            "command -v gh",
            "cat > deploy.sh <<EOF\ngit push origin main\nEOF\necho written",
            "cat <<-END\n\tgh is great\n\tEND",
        ] {
            assert_eq!(denied_verb(src), None, "{src}");
        }
    }
}
