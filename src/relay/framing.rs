//! Newline-delimited frame reading with an upper bound.
//!
//! ACP frames are single lines of JSON. A frame can legitimately be tens of
//! megabytes (file contents, images), so the reader grows its buffer as
//! needed, but never past `max_frame_bytes`: past that it keeps a short prefix
//! (enough to recover a request id for an error answer), discards the rest of
//! the line, and reports the oversize frame instead of buffering without end.

use tokio::io::{AsyncBufRead, AsyncBufReadExt};

/// How many leading bytes of an oversize frame are kept for id recovery.
const OVERSIZE_PREFIX: usize = 64 * 1024;

/// One item read from a newline-delimited stream.
#[derive(Debug, PartialEq, Eq)]
pub enum ReadItem {
    /// A complete frame, without its line terminator (`\n` or `\r\n`).
    Frame(Vec<u8>),
    /// A frame longer than the configured bound; it was discarded.
    TooLarge {
        /// The first bytes of the frame, for id recovery.
        prefix: Vec<u8>,
        /// How many bytes the frame had in total.
        size: usize,
    },
    /// The stream ended.
    Eof,
}

/// Splits a byte stream into frames, without doing any I/O itself, so the
/// async readers (the agent's stdout) and the blocking one (the editor's
/// stdin, read on a thread of its own) share one set of rules.
#[derive(Debug)]
pub struct Splitter {
    max_frame_bytes: usize,
    line: Vec<u8>,
    size: usize,
    oversize: bool,
}

impl Splitter {
    pub fn new(max_frame_bytes: usize) -> Self {
        Self {
            max_frame_bytes,
            line: Vec::new(),
            size: 0,
            oversize: false,
        }
    }

    /// Takes bytes from the front of `available`: how many it consumed, and
    /// the frame they completed, if they did. Blank lines are skipped: some
    /// peers send them as keep-alives, and they carry nothing to route.
    pub fn feed(&mut self, available: &[u8]) -> (usize, Option<ReadItem>) {
        let mut consumed = 0;
        while consumed < available.len() {
            let rest = &available[consumed..];
            let (chunk, used, complete) = match memchr::memchr(b'\n', rest) {
                Some(i) => (&rest[..i], i + 1, true),
                None => (rest, rest.len(), false),
            };
            self.take(chunk);
            consumed += used;
            if complete {
                if let Some(item) = self.end_line() {
                    return (consumed, Some(item));
                }
            }
        }
        (consumed, None)
    }

    /// The stream ended: a final frame without a trailing newline still
    /// counts.
    pub fn finish(&mut self) -> ReadItem {
        self.end_line().unwrap_or(ReadItem::Eof)
    }

    fn take(&mut self, chunk: &[u8]) {
        self.size += chunk.len();
        if !self.oversize && self.size > self.max_frame_bytes {
            self.oversize = true;
            self.line.truncate(OVERSIZE_PREFIX);
        }
        if self.oversize {
            let room = OVERSIZE_PREFIX.saturating_sub(self.line.len());
            self.line.extend_from_slice(&chunk[..room.min(chunk.len())]);
        } else {
            self.line.extend_from_slice(chunk);
        }
    }

    /// The line read so far as an item, the splitter reset; none for a
    /// blank line.
    fn end_line(&mut self) -> Option<ReadItem> {
        let mut line = std::mem::take(&mut self.line);
        let size = std::mem::take(&mut self.size);
        if std::mem::take(&mut self.oversize) {
            return Some(ReadItem::TooLarge { prefix: line, size });
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            return None;
        }
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        Some(ReadItem::Frame(line))
    }
}

/// Reads frames from an async buffered reader.
pub struct FrameReader<R> {
    inner: R,
    splitter: Splitter,
}

impl<R: AsyncBufRead + Unpin> FrameReader<R> {
    pub fn new(inner: R, max_frame_bytes: usize) -> Self {
        Self {
            inner,
            splitter: Splitter::new(max_frame_bytes),
        }
    }

    /// Reads the next non-empty frame.
    pub async fn next(&mut self) -> std::io::Result<ReadItem> {
        loop {
            let available = self.inner.fill_buf().await?;
            if available.is_empty() {
                return Ok(self.splitter.finish());
            }
            let (consumed, item) = self.splitter.feed(available);
            self.inner.consume(consumed);
            if let Some(item) = item {
                return Ok(item);
            }
        }
    }
}

impl<R: tokio::io::AsyncRead + Unpin> FrameReader<tokio::io::BufReader<R>> {
    /// The next frame if it is already whole in the buffer, without
    /// reading: a reader hands on in one go what one read brought.
    pub fn next_buffered(&mut self) -> Option<ReadItem> {
        let available = self.inner.buffer();
        if available.is_empty() {
            return None;
        }
        let (consumed, item) = self.splitter.feed(available);
        self.inner.consume(consumed);
        item
    }
}

/// Reads frames from a blocking reader through a buffer of its own.
pub struct BlockingFrameReader<R> {
    inner: R,
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    splitter: Splitter,
}

impl<R: std::io::Read> BlockingFrameReader<R> {
    pub fn new(inner: R, capacity: usize, max_frame_bytes: usize) -> Self {
        Self {
            inner,
            buf: vec![0; capacity.max(1)].into_boxed_slice(),
            start: 0,
            end: 0,
            splitter: Splitter::new(max_frame_bytes),
        }
    }

    /// Reads the next non-empty frame, blocking until one is whole.
    pub fn read_frame(&mut self) -> std::io::Result<ReadItem> {
        loop {
            if self.start == self.end {
                let n = loop {
                    match self.inner.read(&mut self.buf) {
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                        other => break other?,
                    }
                };
                if n == 0 {
                    return Ok(self.splitter.finish());
                }
                (self.start, self.end) = (0, n);
            }
            let (consumed, item) = self.splitter.feed(&self.buf[self.start..self.end]);
            self.start += consumed;
            if let Some(item) = item {
                return Ok(item);
            }
        }
    }
}

/// Parses a number of milliseconds (`3000`), refusing negatives plainly.
pub fn parse_millis(text: &str) -> Result<u64, String> {
    let t = text.trim();
    if t.starts_with('-') {
        return Err(format!(
            "`{text}` is negative; give a number of milliseconds such as 3000"
        ));
    }
    t.parse()
        .map_err(|_| format!("`{text}` is not a number of milliseconds; write it like 3000"))
}

/// Parses a byte size such as `16777216`, `64K`, `16MiB` or `1G`.
pub fn parse_byte_size(text: &str) -> Result<usize, String> {
    let t = text.trim();
    if t.starts_with('-') {
        return Err(format!(
            "`{text}` is negative; a size is a positive number such as 64K or 16MiB"
        ));
    }
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: usize = digits
        .parse()
        .map_err(|_| format!("`{text}` is not a size; write it like 16777216, 64K or 16MiB"))?;
    let mult: usize = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        other => return Err(format!("unknown size unit `{other}`; use K, M or G")),
    };
    n.checked_mul(mult)
        .filter(|v| *v > 0)
        .ok_or_else(|| format!("`{text}` is out of range"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::BufReader;

    /// Reads `input` with both readers (buffers of `cap` bytes), checks
    /// that they agree, and returns what they read.
    async fn read_all(input: &[u8], max: usize, cap: usize) -> Vec<ReadItem> {
        let mut r = FrameReader::new(BufReader::with_capacity(cap, input), max);
        let mut out = Vec::new();
        loop {
            let item = r.next().await.unwrap();
            let eof = item == ReadItem::Eof;
            out.push(item);
            if eof {
                break;
            }
        }
        let mut b = BlockingFrameReader::new(input, cap, max);
        let mut blocking = Vec::new();
        loop {
            let item = b.read_frame().unwrap();
            let eof = item == ReadItem::Eof;
            blocking.push(item);
            if eof {
                break;
            }
        }
        assert_eq!(out, blocking, "the async and the blocking reader disagree");
        out
    }

    #[tokio::test]
    async fn splits_lines_and_strips_crlf() {
        let items = read_all(b"{\"a\":1}\r\n\n  \n{\"b\":2}", 1024, 3).await;
        assert_eq!(
            items,
            vec![
                ReadItem::Frame(b"{\"a\":1}".to_vec()),
                ReadItem::Frame(b"{\"b\":2}".to_vec()),
                ReadItem::Eof
            ]
        );
    }

    #[tokio::test]
    async fn oversize_frame_is_reported_and_the_next_one_survives() {
        let mut input = vec![b'x'; 100];
        input.push(b'\n');
        input.extend_from_slice(b"ok\n");
        let items = read_all(&input, 50, 7).await;
        match &items[0] {
            ReadItem::TooLarge { prefix, size } => {
                assert_eq!(*size, 100);
                assert_eq!(prefix.len(), 100.min(OVERSIZE_PREFIX));
            }
            other => panic!("expected TooLarge, got {other:?}"),
        }
        assert_eq!(items[1], ReadItem::Frame(b"ok".to_vec()));
    }

    #[tokio::test]
    async fn frame_exactly_at_the_bound_passes() {
        let mut input = vec![b'y'; 64];
        input.push(b'\n');
        let items = read_all(&input, 64, 5).await;
        assert_eq!(items[0], ReadItem::Frame(vec![b'y'; 64]));
    }

    #[test]
    fn byte_sizes() {
        assert_eq!(parse_byte_size("16MiB").unwrap(), 16 << 20);
        assert_eq!(parse_byte_size("64K").unwrap(), 64 << 10);
        assert_eq!(parse_byte_size("123").unwrap(), 123);
        assert!(parse_byte_size("-5").unwrap_err().contains("negative"));
        assert_eq!(parse_millis("250"), Ok(250));
        assert!(parse_millis("-5").unwrap_err().contains("negative"));
        assert!(parse_byte_size("0").is_err());
        assert!(parse_byte_size("12Q").is_err());
        assert!(parse_byte_size("lots").is_err());
    }
}
