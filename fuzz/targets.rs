//! The fuzz targets' bodies, shared by the fuzzer (`fuzz/src/bin/*`, run by
//! `bash scripts/fuzz`) and the test that replays every input the fuzzer
//! ever found and every seed (`tests/fuzz_regressions.rs`, run by CI). Each
//! checks what must hold for any input, not only that nothing panics.

use std::path::Path;

use zcode_acp::relay::envelope::{recover, Frame, FrameKind};
use zcode_acp::relay::framing::{FrameReader, ReadItem};

/// The largest frame the reader is given in the fuzzer (small, so inputs
/// reach the too-large path).
const MAX: usize = 64;

/// The frame reader: frames are lines without their terminator, never
/// above the limit; a longer line is reported with its true size.
pub fn frame_reader(data: &[u8]) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let mut reader = FrameReader::new(tokio::io::BufReader::with_capacity(16, data), MAX);
        let mut seen = 0usize;
        loop {
            match reader.next().await {
                Ok(ReadItem::Eof) | Err(_) => break,
                Ok(ReadItem::Frame(f)) => {
                    assert!(f.len() <= MAX && !f.contains(&b'\n'), "{f:?}");
                    seen += f.len();
                }
                Ok(ReadItem::TooLarge { prefix, size }) => {
                    assert!(size > MAX && prefix.len() <= size);
                    seen += size;
                }
            }
            assert!(seen <= data.len());
        }
    });
}

/// The envelope: what parses can have its id spliced and still parse as
/// the same kind of message; recovery never finds an id that the parsed
/// frame does not have.
pub fn envelope(data: &[u8]) {
    let found = recover(data);
    let Ok(frame) = Frame::parse(data.to_vec()) else {
        return;
    };
    let _ = frame.session_id();
    let _ = frame.params_raw();
    match &frame.kind {
        FrameKind::Request { id, method } => {
            assert_eq!(found.id.as_ref(), Some(id));
            let spliced = Frame::parse(frame.with_id("4242")).expect("a spliced id parses");
            assert_eq!(
                spliced.kind,
                FrameKind::Request {
                    id: zcode_acp::relay::RawId("4242".into()),
                    method: method.clone()
                }
            );
        }
        FrameKind::Response { id, .. } => {
            if id.as_str() != "null" {
                assert_eq!(found.id.as_ref(), Some(id));
            }
        }
        FrameKind::Notification { .. } => assert_eq!(found.id, None),
    }
}

/// A project's sandbox.json: parsed or refused, never a panic.
pub fn sandbox_json(data: &[u8]) {
    let _ = zcode_acp::config::project::parse(data);
}

/// The user config: parsed or refused with a message in the user's terms
/// (the message may quote the user's own text, which may hold anything).
pub fn user_config(data: &[u8]) {
    if let Err(e) = zcode_acp::config::parse_user_config(data) {
        let text = e.to_string();
        let input = String::from_utf8_lossy(data);
        let ours = |word: &str| text.contains(word) && !input.contains(word);
        assert!(!ours("BackendSpec") && !ours("untagged"), "{text}");
    }
}

/// SBPL quoting: a string literal reads back as exactly the path, with no
/// quote that could end it early; a regex literal holds no quote and
/// escapes every special character.
pub fn sbpl_quote(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let path = Path::new(text);
    if let Ok(quoted) = zcode_acp::seatbelt::quote::string(path) {
        assert!(quoted.len() >= 2 && quoted.starts_with('"') && quoted.ends_with('"'));
        let inner = &quoted[1..quoted.len() - 1];
        let mut back = String::new();
        let mut chars = inner.chars();
        while let Some(c) = chars.next() {
            match c {
                '\\' => back.push(chars.next().expect("no escape at the end")),
                '"' => panic!("an unescaped quote would end the literal: {quoted}"),
                c => back.push(c),
            }
        }
        assert_eq!(back, text);
    }
    if let Ok(regex) = zcode_acp::seatbelt::quote::regex_literal(path) {
        assert!(!regex.contains('"'));
        let mut back = String::new();
        let mut chars = regex.chars();
        while let Some(c) = chars.next() {
            match c {
                '\\' => back.push(chars.next().expect("no escape at the end")),
                c if "\\.^$|?*+()[]{}".contains(c) => panic!("unescaped {c} in {regex}"),
                c => back.push(c),
            }
        }
        assert_eq!(back, text);
    }
}

/// A target's body.
pub type Target = fn(&[u8]);

/// Every target by name, for the replay test.
pub const TARGETS: &[(&str, Target)] = &[
    ("frame_reader", frame_reader),
    ("envelope", envelope),
    ("sandbox_json", sandbox_json),
    ("user_config", user_config),
    ("sbpl_quote", sbpl_quote),
];
