//! The name a TLS client asks a server for (SNI), read from its first
//! record: a tunnel to a host the default list opens must be for that
//! host. Behind one shared front (a CDN) a client could otherwise open a
//! tunnel to a listed name and ask, inside it, for any other site there.
//!
//! Pure: bytes in, a name out.

/// The largest TLS record (2^14 bytes of payload and its 5-byte header,
/// with room for the expansion a record may carry).
pub const MAX_RECORD: usize = 5 + (1 << 14) + 2048;

/// What the first bytes of a tunnel say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hello {
    /// More bytes are needed (this many in all, at least).
    Incomplete(usize),
    /// A ClientHello asking for this name (none: it names no server).
    Tls(Option<String>),
    /// Not a TLS ClientHello.
    NotTls,
}

/// Reads the ClientHello at the start of `bytes`.
pub fn client_hello(bytes: &[u8]) -> Hello {
    if bytes.len() < 5 {
        return Hello::Incomplete(5);
    }
    // A handshake record (22), TLS 1.0 to 1.3 on the record layer.
    if bytes[0] != 22 || bytes[1] != 3 {
        return Hello::NotTls;
    }
    let len = u16::from_be_bytes([bytes[3], bytes[4]]) as usize;
    if len == 0 || 5 + len > MAX_RECORD {
        return Hello::NotTls;
    }
    if bytes.len() < 5 + len {
        return Hello::Incomplete(5 + len);
    }
    match parse_hello(&bytes[5..5 + len]) {
        Some(name) => Hello::Tls(name),
        None => Hello::NotTls,
    }
}

/// A cursor over a handshake message.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    fn u8(&mut self) -> Option<usize> {
        self.take(1).map(|b| b[0] as usize)
    }
    fn u16(&mut self) -> Option<usize> {
        self.take(2)
            .map(|b| u16::from_be_bytes([b[0], b[1]]) as usize)
    }
    fn u24(&mut self) -> Option<usize> {
        self.take(3)
            .map(|b| ((b[0] as usize) << 16) | ((b[1] as usize) << 8) | b[2] as usize)
    }
}

/// The server name of a ClientHello (Some(None): it has none); None: not
/// a ClientHello this reads whole (one split over records is refused).
fn parse_hello(record: &[u8]) -> Option<Option<String>> {
    let mut r = Reader(record);
    if r.u8()? != 1 {
        return None; // not a ClientHello
    }
    let len = r.u24()?;
    let mut h = Reader(r.take(len)?);
    h.take(2 + 32)?; // version, random
    let session = h.u8()?;
    h.take(session)?;
    let suites = h.u16()?;
    h.take(suites)?;
    let compression = h.u8()?;
    h.take(compression)?;
    if h.0.is_empty() {
        return Some(None); // no extensions
    }
    let ext_len = h.u16()?;
    let mut exts = Reader(h.take(ext_len)?);
    let mut name = None;
    while !exts.0.is_empty() {
        let kind = exts.u16()?;
        let len = exts.u16()?;
        let data = exts.take(len)?;
        if kind != 0 {
            continue;
        }
        if name.is_some() {
            return None; // two server_name extensions: not judged
        }
        let mut list = Reader(data);
        let list_len = list.u16()?;
        let mut entries = Reader(list.take(list_len)?);
        while !entries.0.is_empty() {
            let kind = entries.u8()?;
            let n = entries.u16()?;
            let host = entries.take(n)?;
            if kind == 0 {
                if name.is_some() {
                    return None; // two host names: not judged
                }
                let host = std::str::from_utf8(host).ok()?;
                name = Some(host.to_ascii_lowercase());
            }
        }
    }
    Some(name)
}

#[cfg(test)]
/// A minimal ClientHello naming `host` (none: no server_name).
pub(crate) fn hello_naming(host: Option<&str>) -> Vec<u8> {
    let mut exts = Vec::new();
    if let Some(host) = host {
        let name = host.as_bytes();
        let mut list = vec![0u8];
        list.extend((name.len() as u16).to_be_bytes());
        list.extend(name);
        let mut data = (list.len() as u16).to_be_bytes().to_vec();
        data.extend(list);
        exts.extend(0u16.to_be_bytes());
        exts.extend((data.len() as u16).to_be_bytes());
        exts.extend(data);
    }
    // Another extension (supported_versions) around it.
    exts.extend(43u16.to_be_bytes());
    exts.extend(3u16.to_be_bytes());
    exts.extend([2, 3, 4]);
    let mut body = vec![3, 3];
    body.extend([7u8; 32]);
    body.push(0); // session id
    body.extend(2u16.to_be_bytes());
    body.extend([0x13, 0x01]);
    body.extend([1, 0]); // compression
    body.extend((exts.len() as u16).to_be_bytes());
    body.extend(exts);
    let mut hs = vec![1];
    hs.extend(&(body.len() as u32).to_be_bytes()[1..]);
    hs.extend(body);
    let mut rec = vec![22, 3, 1];
    rec.extend((hs.len() as u16).to_be_bytes());
    rec.extend(hs);
    rec
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_name_asked_for_is_read() {
        assert_eq!(
            client_hello(&hello_naming(Some("Registry.NPMjs.org"))),
            Hello::Tls(Some("registry.npmjs.org".into()))
        );
        assert_eq!(client_hello(&hello_naming(None)), Hello::Tls(None));
    }

    #[test]
    fn what_is_not_a_whole_hello_is_told_apart() {
        let h = hello_naming(Some("a.example"));
        assert_eq!(client_hello(&h[..3]), Hello::Incomplete(5));
        assert_eq!(client_hello(&h[..10]), Hello::Incomplete(h.len()));
        assert_eq!(
            client_hello(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
            Hello::NotTls
        );
        let mut cut = h.clone();
        // A record shorter than the hello it says it holds.
        cut[4] -= 10;
        cut.truncate(cut.len() - 10);
        assert_eq!(client_hello(&cut), Hello::NotTls);
        // Never a panic on any prefix or any byte changed.
        for i in 0..h.len() {
            let _ = client_hello(&h[..i]);
            let mut x = h.clone();
            x[i] ^= 0xff;
            let _ = client_hello(&x);
        }
    }
}
