//! The MCP server's stdio, with a bound on a request's size that still
//! answers. The SDK reads lines up to a maximum and drops a longer one
//! with no answer at all; here every line is passed to it as it comes
//! (never held whole), and one longer than [`MAX_LINE`] is cut where the
//! SDK is sure to drop it, read on to its end in constant memory for its
//! `id`, `method` and tool name, and answered with a clear refusal,
//! written between the SDK's own frames.
//!
//! [`Scan`] and [`LineGuard`] are pure; [`guard`] wires them to the
//! standard streams.

use std::pin::Pin;

use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

/// The longest request read, in bytes as sent (JSON, escapes included,
/// with its newline). Every request within `run_code`'s own limits
/// (source 1 MiB, stdin 8 MiB, files 32 MiB in all) fits unless its text
/// is mostly escaped (a control character is sent as 6 bytes).
pub const MAX_LINE: usize = 64 << 20;

/// The longest field value kept while scanning (an id, a method name).
const MAX_FIELD: usize = 256;

/// What an over-long request said about itself.
#[derive(Debug, Clone, PartialEq)]
pub struct Oversized {
    /// Its top-level `id`, if it had one (else it is a notification).
    pub id: Option<Value>,
    pub method: Option<String>,
    /// `params.name`: the tool, for `tools/call`.
    pub tool: Option<String>,
    /// Its length as sent, with its newline.
    pub bytes: usize,
}

/// A field of interest, whose value is being read.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Field {
    Id,
    Method,
    Tool,
}

/// One JSON line read a byte at a time, in constant memory, for its
/// top-level `id` and `method` and for `params.name`.
#[derive(Debug, Default)]
pub struct Scan {
    /// The kinds of the first containers open (true: an object); deeper
    /// ones are only counted.
    stack: Vec<bool>,
    deeper: usize,
    in_string: bool,
    escaped: bool,
    /// In an object, before a key.
    want_key: bool,
    /// The key being read, at depth 1 or 2.
    key: Option<Vec<u8>>,
    /// The last keys read at depth 1 and 2.
    key1: Vec<u8>,
    key2: Vec<u8>,
    /// After the `:` of a field of interest, before its value.
    pending: Option<Field>,
    /// A value being read, raw.
    value: Option<(Field, Vec<u8>)>,
    id: Option<Vec<u8>>,
    method: Option<Vec<u8>>,
    tool: Option<Vec<u8>>,
}

impl Scan {
    fn depth(&self) -> usize {
        self.stack.len() + self.deeper
    }

    fn in_object(&self) -> bool {
        self.deeper == 0 && self.stack.last() == Some(&true)
    }

    pub fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            // Most of a large request is the inside of strings nobody
            // keeps: skipped to the next quote or backslash at once.
            if self.in_string && !self.escaped && self.key.is_none() && self.value.is_none() {
                match memchr::memchr2(b'"', b'\\', bytes) {
                    Some(i) => bytes = &bytes[i..],
                    None => return,
                }
            }
            self.byte(bytes[0]);
            bytes = &bytes[1..];
        }
    }

    fn byte(&mut self, b: u8) {
        if self.in_string {
            self.string_byte(b);
            return;
        }
        match b {
            b'"' => {
                self.in_string = true;
                if self.want_key && self.in_object() && self.depth() <= 2 {
                    self.key = Some(Vec::new());
                } else if let Some(field) = self.pending.take() {
                    self.value = Some((field, vec![b'"']));
                }
            }
            b'{' | b'[' => {
                self.end_scalar();
                // A field of interest whose value is not a scalar: none.
                self.pending = None;
                if self.depth() == 1 {
                    self.key2.clear();
                }
                if self.stack.len() < 3 && self.deeper == 0 {
                    self.stack.push(b == b'{');
                } else {
                    self.deeper += 1;
                }
                self.want_key = b == b'{';
            }
            b'}' | b']' => {
                self.end_scalar();
                if self.deeper > 0 {
                    self.deeper -= 1;
                } else {
                    self.stack.pop();
                }
                self.want_key = false;
            }
            b':' => self.after_key(),
            b',' => {
                self.end_scalar();
                self.want_key = self.in_object();
            }
            b if b.is_ascii_whitespace() => self.end_scalar(),
            _ => {
                if let Some(field) = self.pending.take() {
                    self.value = Some((field, Vec::new()));
                }
                if let Some((_, v)) = &mut self.value {
                    if v.len() < MAX_FIELD {
                        v.push(b);
                    }
                }
            }
        }
    }

    fn string_byte(&mut self, b: u8) {
        let ends = !self.escaped && b == b'"';
        self.escaped = !self.escaped && b == b'\\';
        // A key is kept without its quotes, a value as raw JSON (with them).
        let kept = match (&mut self.key, &mut self.value) {
            (Some(key), _) if !ends => Some(key),
            (None, Some((_, value))) => Some(value),
            _ => None,
        };
        if let Some(kept) = kept.filter(|k| k.len() < MAX_FIELD) {
            kept.push(b);
        }
        if !ends {
            return;
        }
        self.in_string = false;
        if let Some(key) = self.key.take() {
            match self.depth() {
                1 => self.key1 = key,
                _ => self.key2 = key,
            }
            self.want_key = false;
        } else if let Some((field, v)) = self.value.take() {
            self.keep(field, v);
        }
    }

    /// The `:` after a key: a field of interest's value comes next.
    fn after_key(&mut self) {
        self.pending = match (self.depth(), self.key1.as_slice(), self.key2.as_slice()) {
            (1, b"id", _) => Some(Field::Id),
            (1, b"method", _) => Some(Field::Method),
            (2, b"params", b"name") => Some(Field::Tool),
            _ => None,
        };
    }

    fn end_scalar(&mut self) {
        if let Some((field, v)) = self.value.take() {
            self.keep(field, v);
        }
    }

    fn keep(&mut self, field: Field, raw: Vec<u8>) {
        let slot = match field {
            Field::Id => &mut self.id,
            Field::Method => &mut self.method,
            Field::Tool => &mut self.tool,
        };
        // The first one counts, as a JSON parser that keeps the last one
        // would be a different reading: a duplicate key is not guessed at.
        if slot.is_none() {
            *slot = Some(raw);
        }
    }

    /// What was found, for a line of `bytes`.
    pub fn found(mut self, bytes: usize) -> Oversized {
        self.end_scalar();
        let text = |raw: Option<Vec<u8>>| {
            raw.and_then(|r| serde_json::from_slice::<Value>(&r).ok())
                .and_then(|v| v.as_str().map(str::to_owned))
        };
        let id = self
            .id
            .and_then(|r| serde_json::from_slice::<Value>(&r).ok())
            .filter(|v| v.is_string() || v.is_number());
        Oversized {
            id,
            method: text(self.method),
            tool: text(self.tool),
            bytes,
        }
    }
}

/// What to do with a piece of the input.
#[derive(Debug, PartialEq)]
pub enum Piece {
    /// Pass these bytes to the SDK.
    Pass(Vec<u8>),
    /// An over-long line ended: answer it.
    Refuse(Oversized),
}

/// Splits the input into lines as it comes, passing each on, and cuts a
/// line longer than `max` (with its newline) after `max` bytes: the SDK,
/// reading lines up to `max`, drops it for certain, and its end is read
/// through and refused here.
pub struct LineGuard {
    max: usize,
    /// Bytes of the current line so far.
    len: usize,
    scan: Scan,
}

impl LineGuard {
    pub fn new(max: usize) -> LineGuard {
        LineGuard {
            max,
            len: 0,
            scan: Scan::default(),
        }
    }

    pub fn feed(&mut self, mut chunk: &[u8]) -> Vec<Piece> {
        let mut steps = Vec::new();
        while !chunk.is_empty() {
            let (line, ended) = match memchr::memchr(b'\n', chunk) {
                Some(i) => (&chunk[..=i], true),
                None => (chunk, false),
            };
            chunk = &chunk[line.len()..];
            self.scan.feed(line);
            let before = self.len;
            self.len += line.len();
            let over = self.len > self.max;
            // What fits of it goes on; past `max`, only its newline.
            let room = self.max.saturating_sub(before).min(line.len());
            let mut pass = line[..room].to_vec();
            if over && ended {
                pass.push(b'\n');
            }
            if !pass.is_empty() {
                steps.push(Piece::Pass(pass));
            }
            if ended {
                let scan = std::mem::take(&mut self.scan);
                if over {
                    steps.push(Piece::Refuse(scan.found(self.len)));
                }
                self.len = 0;
            }
        }
        steps
    }
}

type Reader = Pin<Box<dyn AsyncRead + Send>>;
type Writer = Pin<Box<dyn AsyncWrite + Send>>;

/// The streams the SDK is given instead of `input` and `output`, and the
/// task that copies its frames out (to be awaited once it is done, so
/// the last frames are written). `answer` makes the frame that refuses
/// an over-long request (None: nothing can be answered).
pub fn guard<F>(
    input: Reader,
    output: Writer,
    answer: F,
) -> (Reader, Writer, tokio::task::JoinHandle<()>)
where
    F: Fn(Oversized) -> Option<Vec<u8>> + Send + 'static,
{
    let (sdk_in, ours_in) = tokio::io::duplex(256 << 10);
    let (ours_out, sdk_out) = tokio::io::duplex(256 << 10);
    let (refusals, refused) = mpsc::unbounded_channel::<Vec<u8>>();
    tokio::spawn(pass_input(input, ours_in, refusals, answer));
    let out = tokio::spawn(pass_output(sdk_out, output, refused));
    (Box::pin(sdk_in), Box::pin(ours_out), out)
}

async fn pass_input<F>(
    mut input: Reader,
    mut sdk: tokio::io::DuplexStream,
    refusals: mpsc::UnboundedSender<Vec<u8>>,
    answer: F,
) where
    F: Fn(Oversized) -> Option<Vec<u8>>,
{
    let mut guard = LineGuard::new(MAX_LINE);
    let mut chunk = vec![0u8; 64 << 10];
    loop {
        let n = match input.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        for step in guard.feed(&chunk[..n]) {
            match step {
                Piece::Pass(bytes) => {
                    if sdk.write_all(&bytes).await.is_err() {
                        return;
                    }
                }
                Piece::Refuse(over) => {
                    tracing::warn!(
                        bytes = over.bytes,
                        "a request longer than {MAX_LINE} bytes was refused unread"
                    );
                    if let Some(frame) = answer(over) {
                        let _ = refusals.send(frame);
                    }
                }
            }
        }
    }
    // The SDK sees the end of its input.
    let _ = sdk.shutdown().await;
}

/// Copies the SDK's frames to `output` whole, and the refusals between
/// them (never inside one).
async fn pass_output(
    mut sdk: tokio::io::DuplexStream,
    mut output: Writer,
    mut refused: mpsc::UnboundedReceiver<Vec<u8>>,
) {
    let mut partial: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; 64 << 10];
    let mut refusals_open = true;
    loop {
        tokio::select! {
            n = sdk.read(&mut chunk) => {
                let n = match n { Ok(0) | Err(_) => break, Ok(n) => n };
                partial.extend_from_slice(&chunk[..n]);
                // Whole frames out; the rest waits for its end.
                if let Some(last) = memchr::memrchr(b'\n', &partial) {
                    let rest = partial.split_off(last + 1);
                    if output.write_all(&partial).await.is_err() {
                        return;
                    }
                    partial = rest;
                    let _ = output.flush().await;
                }
            }
            frame = refused.recv(), if refusals_open && partial.is_empty() => match frame {
                Some(mut frame) => {
                    frame.push(b'\n');
                    if output.write_all(&frame).await.is_err() {
                        return;
                    }
                    let _ = output.flush().await;
                }
                None => refusals_open = false,
            },
        }
    }
    let _ = output.write_all(&partial).await;
    let _ = output.flush().await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn scan(line: &str) -> Oversized {
        let mut s = Scan::default();
        // A byte at a time and at once read the same.
        for b in line.as_bytes() {
            s.feed(std::slice::from_ref(b));
        }
        let one = s.found(line.len());
        let mut s = Scan::default();
        s.feed(line.as_bytes());
        assert_eq!(s.found(line.len()), one, "{line}");
        one
    }

    #[test]
    fn the_top_level_id_method_and_tool_are_read_wherever_they_are() {
        let o = scan(
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"run_code","arguments":{"id":99,"method":"x","name":"y","source":"\"}{"}}}"#,
        );
        assert_eq!(o.id, Some(json!(7)));
        assert_eq!(o.method.as_deref(), Some("tools/call"));
        assert_eq!(o.tool.as_deref(), Some("run_code"));
        // The id last, after the large part; a string id; spaces.
        let o = scan(
            r#"{ "params" : { "arguments" : {"files": [{"id": 1}]}, "name" : "run_code" }, "method" : "tools/call", "id" : "a\"b" }"#,
        );
        assert_eq!(o.id, Some(json!("a\"b")));
        assert_eq!(o.tool.as_deref(), Some("run_code"));
        // Nested keys named id or name are not taken.
        let o = scan(r#"{"method":"notifications/x","params":{"a":{"name":"no","id":3}}}"#);
        assert_eq!(o.id, None);
        assert_eq!(o.tool, None);
        // An id that is not a number or string is no id to answer.
        assert_eq!(scan(r#"{"id":{"x":1},"method":"m"}"#).id, None);
        assert_eq!(scan(r#"{"id":null,"method":"m"}"#).id, None);
        assert_eq!(scan(r#"{"id":-12.5e3}"#).id, Some(json!(-12.5e3)));
        // Deep nesting costs nothing.
        let deep = format!(
            "{{\"id\":1,\"params\":{}{}}}",
            "[".repeat(10_000),
            "]".repeat(10_000)
        );
        assert_eq!(scan(&deep).id, Some(json!(1)));
    }

    #[test]
    fn a_line_past_the_bound_is_cut_where_the_sdk_drops_it_and_refused_once_it_ends() {
        let mut g = LineGuard::new(20);
        let short = b"{\"id\":1}\n";
        assert_eq!(g.feed(short), vec![Piece::Pass(short.to_vec())]);
        // Exactly the bound, newline included: passed whole.
        let exact = format!("{{\"id\":2,\"x\":\"{}\"}}\n", "a".repeat(4));
        assert_eq!(exact.len(), 20);
        assert_eq!(
            g.feed(exact.as_bytes()),
            vec![Piece::Pass(exact.as_bytes().to_vec())]
        );
        // One more: 20 bytes pass, then its newline (21 > 20, dropped by
        // a reader bounded at 20), then the refusal.
        let long = format!("{{\"id\":3,\"x\":\"{}\"}}\n", "a".repeat(5));
        let mut passed = Vec::new();
        let mut refused = Vec::new();
        for piece in long.as_bytes().chunks(4) {
            for step in g.feed(piece) {
                match step {
                    Piece::Pass(b) => passed.extend(b),
                    Piece::Refuse(o) => refused.push(o),
                }
            }
        }
        assert_eq!(passed.len(), 21);
        assert_eq!(&passed[..20], &long.as_bytes()[..20]);
        assert_eq!(passed[20], b'\n');
        assert_eq!(refused.len(), 1);
        assert_eq!(refused[0].id, Some(json!(3)));
        assert_eq!(refused[0].bytes, long.len());
        // And the next line is its own again.
        assert_eq!(g.feed(short), vec![Piece::Pass(short.to_vec())]);
    }
}
