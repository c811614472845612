//! Bounded capture of a stream: the first bytes are kept, the rest is read
//! and counted (so the writer never blocks on a full pipe), and the text
//! says where it was cut.

use tokio::io::{AsyncRead, AsyncReadExt};

/// What was read from one stream.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Captured {
    pub kept: Vec<u8>,
    /// Everything the stream carried.
    pub total: u64,
}

impl Captured {
    pub fn truncated(&self) -> bool {
        self.total > self.kept.len() as u64
    }

    /// The kept bytes as text (invalid UTF-8 replaced, a character cut at
    /// the end dropped), with a visible marker where the stream was cut.
    pub fn text(&self, stream: &str) -> String {
        let mut text = String::from_utf8_lossy(&self.kept).into_owned();
        if self.truncated() {
            // A multi-byte character cut in half reads as U+FFFD: drop it.
            while text.ends_with('\u{FFFD}') {
                text.pop();
            }
            if !text.is_empty() && !text.ends_with('\n') {
                text.push('\n');
            }
            text.push_str(&marker(stream, self.kept.len() as u64, self.total));
        }
        text
    }
}

/// The marker the model reads where output was cut.
pub fn marker(stream: &str, kept: u64, total: u64) -> String {
    format!("[zcode-acp: {stream} truncated: the first {kept} of {total} bytes are shown]")
}

/// Reads `reader` to its end, keeping at most `cap` bytes.
pub async fn read_bounded<R: AsyncRead + Unpin>(reader: R, cap: usize) -> Captured {
    let out = std::sync::Mutex::new(Captured::default());
    read_into(reader, cap, &out).await;
    out.into_inner().unwrap_or_default()
}

/// Reads `reader` to its end into `into`, keeping at most `cap` bytes:
/// what was read so far stays readable by others while it runs (a run's
/// streams, when its reader is given up on).
pub async fn read_into<R: AsyncRead + Unpin>(
    mut reader: R,
    cap: usize,
    into: &std::sync::Mutex<Captured>,
) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        match reader.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                let Ok(mut c) = into.lock() else { return };
                c.total += n as u64;
                let room = cap.saturating_sub(c.kept.len());
                c.kept.extend_from_slice(&buf[..n.min(room)]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn what_is_cut_is_said() {
        let data = "héllo wörld\n".repeat(100);
        let got = read_bounded(data.as_bytes(), 20).await;
        assert_eq!(got.total, data.len() as u64);
        assert!(got.truncated());
        let text = got.text("stdout");
        assert!(text.starts_with("héllo wörld\nhéllo"), "{text}");
        assert!(!text.contains('\u{FFFD}'), "{text}");
        assert!(
            text.ends_with(&marker("stdout", 20, data.len() as u64)),
            "{text}"
        );
    }

    #[tokio::test]
    async fn what_fits_is_whole_and_unmarked() {
        let got = read_bounded(&b"ok\n"[..], 20).await;
        assert!(!got.truncated());
        assert_eq!(got.text("stdout"), "ok\n");
    }
}
