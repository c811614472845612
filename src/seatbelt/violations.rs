//! Reading the sandbox's refusals from the macOS system log.
//!
//! Seatbelt logs every refused operation as a kernel message such as
//! `Sandbox: touch(4242) deny(1) file-write-create /Users/me/notes.txt`,
//! followed by the message of the rule that refused it. The bridge's
//! profiles tag every write denial with a message unique to the bridge, so
//! `log stream` filtered on that tag yields this agent's refusals only.
//! What a line names is still only a hint: the policy decides whether it
//! may start a prompt.

use std::path::PathBuf;

use serde::Deserialize;

/// The system log tool (a fixed path: `PATH` is not trusted).
pub const LOG: &str = "/usr/bin/log";

/// One write the sandbox refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub process: String,
    pub pid: u32,
    pub operation: String,
    pub path: PathBuf,
}

/// `log stream` for the kernel's messages carrying `tag`, one JSON object
/// a line. The kernel's only (process 0, where Seatbelt reports): any
/// process may write a message holding the tag to the log (`logger`), and
/// the tag is no secret from the sandboxed command.
pub fn stream_argv(tag: &str) -> Vec<String> {
    vec![
        LOG.to_owned(),
        "stream".to_owned(),
        "--style".to_owned(),
        "ndjson".to_owned(),
        "--predicate".to_owned(),
        format!("processIdentifier == 0 AND eventMessage CONTAINS \"{tag}\""),
    ]
}

/// Whether `text` contains `tag` as a whole word (a longer tag that merely
/// starts with ours belongs to someone else).
fn has_tag(text: &str, tag: &str) -> bool {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
    text.match_indices(tag).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + tag.len()..].chars().next();
        !before.is_some_and(word) && !after.is_some_and(word)
    })
}

/// A write refusal of ours in one line of `log stream --style ndjson`, or
/// None for anything else (other events, other sandboxes, reads).
pub fn parse_line(line: &str, tag: &str) -> Option<Violation> {
    #[derive(Deserialize)]
    struct Entry {
        #[serde(rename = "eventMessage")]
        event_message: String,
        #[serde(rename = "processID")]
        process_id: u64,
    }
    let entry: Entry = serde_json::from_str(line).ok()?;
    // The kernel's (see `stream_argv`), checked again here.
    if entry.process_id != 0 {
        return None;
    }
    parse_message(&entry.event_message, tag)
}

/// The same, for the text of one log message.
pub fn parse_message(message: &str, tag: &str) -> Option<Violation> {
    if !has_tag(message, tag) {
        return None;
    }
    let body = &message[message.find("Sandbox: ")? + "Sandbox: ".len()..];
    let first = body.lines().next()?;
    // `NAME(PID) deny(COUNT) OPERATION TARGET`; NAME may hold spaces and
    // parentheses, so split at the last `(` before ` deny(`.
    let (who, rest) = first.split_once(") deny(")?;
    let (process, pid) = who.rsplit_once('(')?;
    let pid = pid.parse().ok()?;
    let (_count, rest) = rest.split_once(") ")?;
    let (operation, target) = rest.split_once(' ')?;
    if !(operation.starts_with("file-write") || operation == "file-link") {
        return None;
    }
    let target = target.trim_end();
    let target = target.strip_suffix(tag).unwrap_or(target).trim_end();
    if !target.starts_with('/') {
        return None;
    }
    Some(Violation {
        process: process.to_owned(),
        pid,
        operation: operation.to_owned(),
        path: PathBuf::from(target),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TAG: &str = "zcode-acp-00000000000000ab";

    fn line(message: &str) -> String {
        serde_json::json!({
            "timestamp": "2026-11-29 21:00:00.000000+0000",
            "messageType": "Error",
            "processID": 0,
            "senderImagePath": "/System/Library/Extensions/Sandbox.kext/Contents/MacOS/Sandbox",
            "eventMessage": message,
        })
        .to_string()
    }

    #[test]
    fn a_tagged_write_refusal_is_read_with_its_path() {
        for message in [
            format!("Sandbox: touch(4242) deny(1) file-write-create /Users/me/out/new file {TAG}"),
            format!("Sandbox: touch(4242) deny(1) file-write-create /Users/me/out/new file\n{TAG}"),
        ] {
            assert_eq!(
                parse_line(&line(&message), TAG),
                Some(Violation {
                    process: "touch".into(),
                    pid: 4242,
                    operation: "file-write-create".into(),
                    path: "/Users/me/out/new file".into(),
                }),
                "{message:?}"
            );
        }
    }

    #[test]
    fn a_coalesced_report_still_names_the_path() {
        // The OS folds a process's repeats into one line with a prefix.
        let v = parse_message(
            &format!(
                "1 duplicate report for Sandbox: bash(9) deny(1) file-write-data /Users/me/x {TAG}"
            ),
            TAG,
        )
        .unwrap();
        assert_eq!((v.pid, v.path), (9, PathBuf::from("/Users/me/x")));
    }

    #[test]
    fn process_names_may_hold_spaces_and_parentheses() {
        let v = parse_message(
            &format!(
                "Sandbox: Code Helper (Plugin)(77) deny(3) file-write-unlink /etc/hosts {TAG}"
            ),
            TAG,
        )
        .unwrap();
        assert_eq!(v.process, "Code Helper (Plugin)");
        assert_eq!(v.pid, 77);
        assert_eq!(v.path, PathBuf::from("/etc/hosts"));
    }

    #[test]
    fn other_sandboxes_reads_and_noise_are_ignored() {
        // Another bridge's tag that merely starts with ours.
        assert!(parse_message(
            &format!("Sandbox: touch(1) deny(1) file-write-create /x {TAG}ff"),
            TAG
        )
        .is_none());
        // Untagged: some other sandboxed program.
        assert!(parse_message("Sandbox: touch(1) deny(1) file-write-create /x", TAG).is_none());
        // Not a write.
        assert!(parse_message(
            &format!("Sandbox: cat(1) deny(1) file-read-data /x {TAG}"),
            TAG
        )
        .is_none());
        assert!(parse_message(
            &format!("Sandbox: a(1) deny(1) mach-lookup com.apple.x {TAG}"),
            TAG
        )
        .is_none());
        assert!(parse_line("not json", TAG).is_none());
        // The same words written to the log by a process (`logger`).
        let forged = serde_json::json!({
            "processID": 4242,
            "eventMessage": format!("Sandbox: touch(1) deny(1) file-write-create /x {TAG}"),
        })
        .to_string();
        assert!(parse_line(&forged, TAG).is_none());
        assert!(parse_line(r#"{"eventMessage": 3}"#, TAG).is_none());
        assert!(parse_message(
            &format!("Sandbox: x(y) deny(1) file-write-data /x {TAG}"),
            TAG
        )
        .is_none());
    }

    #[test]
    fn the_stream_is_filtered_on_the_tag() {
        let argv = stream_argv(TAG);
        assert_eq!(argv[0], LOG);
        assert_eq!(
            argv.last().unwrap(),
            &format!("processIdentifier == 0 AND eventMessage CONTAINS \"{TAG}\"")
        );
    }
}
