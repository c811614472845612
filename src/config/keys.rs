//! Keys a settings file has that zcode-acp does not know, and the known
//! key each one probably meant: a misspelled `"enable": true` would
//! otherwise leave the sandbox off without a word.

/// The known key `key` probably meant: the same letters in another case,
/// or at most two edits away (one for keys of four letters or fewer).
pub fn probably_meant<'k>(key: &str, known: &[&'k str]) -> Option<&'k str> {
    if let Some(k) = known.iter().find(|k| k.eq_ignore_ascii_case(key)) {
        return Some(k);
    }
    let key = key.to_ascii_lowercase();
    known
        .iter()
        .map(|k| (edit_distance(&key, &k.to_ascii_lowercase()), *k))
        .filter(|(d, k)| *d <= if k.len() <= 4 { 1 } else { 2 })
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// Keys named in one note, at most.
const MAX_NAMED: usize = 5;
/// The longest key shown whole.
const MAX_SHOWN: usize = 40;

/// A key as the notice shows it: control characters and backticks
/// written out, cut at [`MAX_SHOWN`] characters.
fn shown_key(key: &str) -> String {
    let mut out: String = key
        .chars()
        .take(MAX_SHOWN)
        .flat_map(|c| {
            if c.is_control() || c == '`' {
                c.escape_default().collect::<Vec<_>>()
            } else {
                vec![c]
            }
        })
        .collect();
    if key.chars().count() > MAX_SHOWN {
        out.push('…');
    }
    out
}

/// Levenshtein distance, counted in characters (the command line's typo
/// hints use it too).
pub fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substitution = diagonal + usize::from(ca != cb);
            diagonal = row[j + 1];
            row[j + 1] = substitution.min(row[j] + 1).min(row[j + 1] + 1);
        }
    }
    row[b.len()]
}

/// One sentence naming the unknown `keys` of `file` (each with the key it
/// probably meant), for the log, `doctor` and the editor's notice; `prefix`
/// is the section they are in (`"sandbox."`, or empty for the top).
pub fn unknown_keys_note(
    file: &std::path::Path,
    prefix: &str,
    keys: &[String],
    known: &[&str],
) -> Option<String> {
    if keys.is_empty() {
        return None;
    }
    // The file may be anyone's (a project's): a few keys, each short and
    // written out, so no key can flood the notice or dress as its text.
    let mut named: Vec<String> = keys
        .iter()
        .take(MAX_NAMED)
        .map(|k| {
            let shown = shown_key(k);
            match probably_meant(k, known) {
                Some(meant) => format!("`{prefix}{shown}` (did you mean `{prefix}{meant}`?)"),
                None => format!("`{prefix}{shown}`"),
            }
        })
        .collect();
    if keys.len() > MAX_NAMED {
        named.push(format!("{} more", keys.len() - MAX_NAMED));
    }
    let (it, they) = if keys.len() == 1 {
        ("it is", "a setting")
    } else {
        ("they are", "settings")
    };
    Some(format!(
        "{} has {}, not {they} zcode-acp knows ({}): {it} ignored",
        file.display(),
        named.join(", "),
        known.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_misspelling_is_matched_to_the_key_it_meant() {
        // A project's sandbox.json's keys.
        let known = crate::config::project::KEYS;
        assert_eq!(probably_meant("enable", known), Some("enabled"));
        assert_eq!(probably_meant("Enabled", known), Some("enabled"));
        assert_eq!(probably_meant("strict_git", known), Some("strictGit"));
        assert_eq!(probably_meant("alow", known), Some("allow"));
        assert_eq!(probably_meant("codexec", known), Some("codeExec"));
        assert_eq!(probably_meant("future", known), None);
        assert_eq!(probably_meant("den", known), Some("deny"));
        assert_eq!(probably_meant("do", known), None);
    }

    #[test]
    fn the_note_names_each_key_and_what_it_meant() {
        let note = unknown_keys_note(
            std::path::Path::new("/w/.zcode/acp/sandbox.json"),
            "",
            &["enable".into(), "colour".into()],
            &["enabled", "allow"],
        )
        .unwrap();
        assert!(
            note.contains("`enable` (did you mean `enabled`?)"),
            "{note}"
        );
        assert!(
            note.contains("`colour`,") || note.contains("`colour` "),
            "{note}"
        );
        assert!(note.contains("they are ignored"), "{note}");
        assert!(unknown_keys_note(std::path::Path::new("/x"), "", &[], &["a"]).is_none());
    }

    /// A project's file is anyone's: its keys cannot flood the notice or
    /// write lines of their own into it.
    #[test]
    fn a_hostile_key_is_cut_and_written_out() {
        let spoof = "x`\n\n**Sandbox: armed.** `".to_owned();
        let long = "k".repeat(10_000);
        let mut keys: Vec<String> = vec![spoof, long];
        keys.extend((0..1000).map(|i| format!("extra{i}")));
        let note = unknown_keys_note(
            std::path::Path::new("/w/sandbox.json"),
            "",
            &keys,
            &["enabled"],
        )
        .unwrap();
        assert!(!note.contains('\n'), "{note}");
        assert!(note.len() < 800, "{} bytes", note.len());
        assert!(note.contains("997 more"), "{note}");
        assert_eq!(note.matches('`').count() % 2, 0, "{note}");
    }
}
