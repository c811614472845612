//! The egress guard-rail for shell sources: a run that would publish or
//! push (`gh`, `git push`, `git remote`, `npm publish`) is refused before
//! it starts.
//!
//! A guard-rail against accidents, not a security boundary: the scan reads
//! the source as a shell would split it (quotes, `;`, `&&`, `|`, subshells,
//! `$(...)`, `env`/`command`/absolute paths, `sh -c "..."`, and the literal
//! text a shell is fed on stdin: here-documents, here-strings, `echo ... |
//! sh`), but code can always build a command at run time (`x=pu; git
//! ${x}sh`), and python or node can run anything. The sandbox is what
//! holds.

/// The verb a source would run, if any (`"git push"`).
pub fn denied_verb(source: &str) -> Option<String> {
    scan(source, 0)
}

fn scan(source: &str, depth: usize) -> Option<String> {
    if depth > 4 {
        return None;
    }
    let (commands, substituted) = commands(source);
    for (i, command) in commands.iter().enumerate() {
        if let Some(verb) = judge(&command.words, depth) {
            return Some(verb);
        }
        // A shell that reads its script from stdin runs what it is fed:
        // a here-document or here-string, or what a literal `echo`,
        // `printf` or `cat <<EOF` before it in a pipe writes.
        if reads_its_script(&command.words) {
            let producer = i
                .checked_sub(1)
                .filter(|_| command.piped)
                .and_then(|p| written(&commands[p]));
            let fed = command.stdin.iter().cloned().chain(producer);
            if let Some(verb) = fed.into_iter().find_map(|script| scan(&script, depth + 1)) {
                return Some(verb);
            }
        }
    }
    // `"$(git push)"`: what a double-quoted string substitutes runs too.
    substituted
        .iter()
        .find_map(|script| scan(script, depth + 1))
}

/// A simple command: its words with quotes removed, what is given to it
/// as literal text on stdin (here-documents, here-strings), and whether
/// its stdin is the previous command's output (`a | b`).
#[derive(Debug, Default)]
struct Command {
    words: Vec<String>,
    stdin: Vec<String>,
    piped: bool,
}

/// Splits `source` into simple commands. Separators: newline, `;`, `&`,
/// `|`, parentheses, braces, backquotes and `$(`. Also the double-quoted
/// strings that substitute a command (`"$(...)"`, backquotes), to be
/// scanned as scripts.
fn commands(source: &str) -> (Vec<Command>, Vec<String>) {
    let mut t = Tokens::default();
    let mut chars = source.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let Some(n) = chars.next() {
                    if n != '\n' {
                        t.push(n);
                    }
                }
            }
            '\'' => {
                t.in_word = true;
                for n in chars.by_ref() {
                    if n == '\'' {
                        break;
                    }
                    t.word.push(n);
                }
            }
            '"' => {
                t.in_word = true;
                let mut raw = String::new();
                while let Some(n) = chars.next() {
                    match n {
                        '"' => break,
                        '\\' => {
                            if let Some(m) = chars.next() {
                                t.word.push(m);
                                raw.push(m);
                            }
                        }
                        _ => {
                            t.word.push(n);
                            raw.push(n);
                        }
                    }
                }
                if raw.contains("$(") || raw.contains('`') {
                    t.substituted.push(raw);
                }
            }
            '$' if chars.peek() == Some(&'{') => {
                // `${#x[@]}`: a parameter expansion is part of a word.
                t.push('$');
                let mut depth = 0;
                for n in chars.by_ref() {
                    t.word.push(n);
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
                chars.next();
                if chars.peek() == Some(&'<') {
                    // `<<<`: a here-string, the next word, given on stdin.
                    chars.next();
                    t.end_word();
                    t.here_string = true;
                    continue;
                }
                // A here-document: its body is data, given on stdin.
                if chars.peek() == Some(&'-') {
                    chars.next();
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
                // Its command is the one being read: the next one kept.
                t.heredocs.push((delimiter, t.out.len()));
            }
            '\n' if !t.heredocs.is_empty() => {
                t.end_command(false);
                for (delimiter, owner) in std::mem::take(&mut t.heredocs) {
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
                    if let Some(command) = t.out.get_mut(owner) {
                        command.stdin.push(body);
                    }
                }
            }
            '#' if !t.in_word => {
                for n in chars.by_ref() {
                    if n == '\n' {
                        break;
                    }
                }
                t.end_command(false);
            }
            '$' if chars.peek() == Some(&'(') => {
                chars.next();
                t.end_command(false);
            }
            '|' => {
                // `||` is a list, `|` and `|&` a pipe.
                let pipe = chars.peek() != Some(&'|');
                if !pipe || chars.peek() == Some(&'&') {
                    chars.next();
                }
                t.end_command(pipe);
            }
            '\n' | ';' | '&' | '(' | ')' | '`' | '{' | '}' => t.end_command(false),
            c if c.is_whitespace() => t.end_word(),
            c => t.push(c),
        }
    }
    t.end_command(false);
    (t.out, t.substituted)
}

/// The tokenizer's state.
#[derive(Default)]
struct Tokens {
    out: Vec<Command>,
    substituted: Vec<String>,
    words: Vec<String>,
    word: String,
    in_word: bool,
    /// The next word is a here-string.
    here_string: bool,
    /// What the command being read is given on stdin.
    stdin: Vec<String>,
    /// The command being read is fed by a pipe.
    piped: bool,
    /// Here-documents whose bodies start at the next newline, with the
    /// index their command has (or will have) in `out`.
    heredocs: Vec<(String, usize)>,
}

impl Tokens {
    fn push(&mut self, c: char) {
        self.word.push(c);
        self.in_word = true;
    }

    fn end_word(&mut self) {
        if !self.in_word {
            return;
        }
        let word = std::mem::take(&mut self.word);
        self.in_word = false;
        if std::mem::take(&mut self.here_string) {
            self.stdin.push(word);
        } else {
            self.words.push(word);
        }
    }

    /// Ends the command being read; `pipe`: the next one reads its output.
    fn end_command(&mut self, pipe: bool) {
        self.end_word();
        let stdin = std::mem::take(&mut self.stdin);
        if self.words.is_empty() && stdin.is_empty() {
            // `a | (b)`: the pipe feeds the command inside.
            self.piped |= pipe;
            return;
        }
        self.out.push(Command {
            words: std::mem::take(&mut self.words),
            stdin,
            piped: std::mem::replace(&mut self.piped, pipe),
        });
    }
}

/// The literal text a command writes to stdout, when that is plain to
/// see: `echo`'s and `printf`'s arguments, or what `cat` is given on its
/// stdin as literal text.
fn written(command: &Command) -> Option<String> {
    let Head::Command(i) = head(&command.words) else {
        return None;
    };
    let args = &command.words[i + 1..];
    match basename(&command.words[i]) {
        "echo" | "printf" => {
            let text: Vec<&str> = args
                .iter()
                .map(String::as_str)
                .skip_while(|a| matches!(*a, "-n" | "-e" | "-E" | "-ne" | "-en"))
                .collect();
            Some(text.join(" ").replace("\\n", "\n"))
        }
        "cat" if args.iter().all(|a| a.starts_with('-')) => Some(command.stdin.join("\n")),
        _ => None,
    }
}

/// Whether `words` run a shell that reads its script from stdin (no
/// `-c`, no script file, or `-s`).
fn reads_its_script(words: &[String]) -> bool {
    let Head::Command(i) = head(words) else {
        return false;
    };
    if !SHELLS.contains(&basename(&words[i])) {
        return false;
    }
    let rest = &words[i + 1..];
    let short = |w: &String| w.starts_with('-') && !w.starts_with("--");
    if rest.iter().any(|w| short(w) && w.contains('s')) {
        return true;
    }
    !rest.iter().any(|w| short(w) && w.contains('c')) && rest.iter().all(|w| w.starts_with('-'))
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
    "stdbuf", "setsid", "xargs", "watch", "coproc", "then", "do", "else", "if", "while", "until",
    "!",
];

/// Programs that run a script given to them.
const SHELLS: &[&str] = &["sh", "bash", "dash", "zsh", "ksh"];

/// Where a command's own name is, past leading assignments, wrappers
/// and their options.
enum Head<'a> {
    Command(usize),
    /// `env -S 'git push'`: a string split into a command.
    Split(&'a str),
    /// `command -v gh`: looked up, never run.
    Lookup,
    None,
}

fn head(words: &[String]) -> Head<'_> {
    let mut i = 0;
    let mut wrapper = "";
    while i < words.len() {
        let w = words[i].as_str();
        let base = basename(w);
        if wrapper == "env" && (w == "-S" || w == "--split-string") {
            return words.get(i + 1).map_or(Head::None, |s| Head::Split(s));
        }
        let takes_value = OPTIONS_WITH_VALUES
            .iter()
            .any(|(name, opts)| *name == wrapper && opts.contains(&w));
        if wrapper == "command" && (w == "-v" || w == "-V") {
            return Head::Lookup;
        }
        let skipped = is_assignment(w)
            || is_redirection(w)
            || w.starts_with('-')
            || (i > 0 && is_number(w))
            || WRAPPERS.contains(&base);
        if !skipped {
            return Head::Command(i);
        }
        if WRAPPERS.contains(&base) {
            wrapper = base;
        }
        i += if takes_value { 2 } else { 1 };
    }
    Head::None
}

fn judge(words: &[String], depth: usize) -> Option<String> {
    let i = match head(words) {
        Head::Command(i) => i,
        Head::Split(script) => return scan(script, depth + 1),
        Head::Lookup | Head::None => return None,
    };
    let cmd = basename(&words[i]);
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
        // word is taken as the verb (`npm run publish` publishes too), and
        // npm takes any start of a command's name for it (`npm pu`).
        "npm" | "pnpm" | "yarn" => {
            let abbreviated = cmd == "npm"
                && npm_verbs(rest)
                    .iter()
                    .any(|v| v.len() >= 2 && "publish".starts_with(v));
            (abbreviated || rest.iter().any(|w| w == "publish")).then(|| format!("{cmd} publish"))
        }
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

/// The words npm may take as its command: the first that is not an
/// option, and the next one too when the first may be an option's value
/// (`npm --access public publish`).
fn npm_verbs(args: &[String]) -> Vec<&str> {
    let mut verbs = Vec::new();
    let mut after_option = false;
    for a in args {
        if a.starts_with('-') {
            after_option = a.starts_with("--") && !a.contains('=');
            continue;
        }
        verbs.push(a.as_str());
        if verbs.len() == 2 || !after_option {
            break;
        }
    }
    verbs
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
            // Fed to a shell on stdin.
            ("bash <<< 'git push origin main'", "git push"),
            ("sh <<<\"gh pr create\"", "gh"),
            ("echo 'git push' | sh", "git push"),
            ("echo -n \"npm publish\" |& bash -s", "npm publish"),
            ("printf 'cd x\\ngit push\\n' | sudo sh -e", "git push"),
            ("cat <<EOF | bash\ngit push\nEOF", "git push"),
            ("echo 'git push' |\n  (sh)", "git push"),
            ("sudo bash <<EOF\ngit remote add x y\nEOF", "git remote"),
            ("coproc git push", "git push"),
            ("coproc up { git push; }", "git push"),
            // npm takes any start of a command's name.
            ("npm publ", "npm publish"),
            ("npm pub --dry-run", "npm publish"),
            ("npm publis", "npm publish"),
            ("npm pu", "npm publish"),
            ("npm --access public pub", "npm publish"),
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
            // Text that no shell runs, or a shell that runs a file.
            "echo 'git push' | cat",
            "echo 'git push' > notes.txt",
            "echo 'git push' | bash deploy.sh",
            "cat <<< 'git push'",
            "echo 'git push' || sh",
            "npm pack",
            "npm install pub",
            "npm run publisher",
            "npm p",
        ] {
            assert_eq!(denied_verb(src), None, "{src}");
        }
    }
}
