//! What a tunnel through the proxy (CONNECT, SOCKS) must start with
//! before its bytes are passed on: a tunnel that only the default list
//! opens carries TLS for that very name, and one to a name someone allowed
//! on the TLS port carries no TLS for another name (see
//! `policy::network::TunnelCheck`). Behind a shared front (a CDN) another
//! name would reach another site.

use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// Whether a tunnel is checked, and how strictly (see [`own_name_only`]).
pub(super) fn checked(check: crate::policy::network::TunnelCheck) -> Option<bool> {
    use crate::policy::network::TunnelCheck;
    match check {
        TunnelCheck::Open => None,
        TunnelCheck::OwnNameOnly => Some(true),
        TunnelCheck::NoOtherName => Some(false),
    }
}

/// Reads a tunnel's first bytes until its TLS ClientHello is whole, and
/// returns them (to be sent on) when it asks for `host` itself. `strict`
/// (what the default list alone opens): nothing else passes. Otherwise (a
/// name someone allowed, on the TLS port) a tunnel whose first byte is not
/// a TLS record's passes (another protocol), but one that starts like TLS
/// (any record type) must be one whole ClientHello asking for `host`: a
/// hello split over records, one naming no server or another one, an alert
/// first, are all ways to reach another site behind a shared front. The
/// first bytes must come within 10 s either way.
pub(super) async fn own_name_only(
    client: &mut TcpStream,
    host: &str,
    mut first: Vec<u8>,
    strict: bool,
) -> Option<Vec<u8>> {
    use crate::network::sni::{client_hello, Hello, MAX_RECORD};
    // TLS's record types: change_cipher_spec, alert, handshake, data.
    const TLS_RECORDS: std::ops::RangeInclusive<u8> = 20..=23;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let want = host.trim_end_matches('.').to_ascii_lowercase();
    loop {
        if !strict && first.first().is_some_and(|b| !TLS_RECORDS.contains(b)) {
            return Some(first);
        }
        let why = match client_hello(&first) {
            Hello::Incomplete(need) if need <= MAX_RECORD => {
                let mut chunk = vec![0u8; need.saturating_sub(first.len()).max(1)];
                match tokio::time::timeout_at(deadline, client.read(&mut chunk)).await {
                    Ok(Ok(n)) if n > 0 => {
                        first.extend_from_slice(&chunk[..n]);
                        continue;
                    }
                    Ok(_) => return None,
                    Err(_) => "it sent nothing within 10 s".to_owned(),
                }
            }
            Hello::Tls(Some(name)) if name.trim_end_matches('.') == want => return Some(first),
            // The client's bytes: quoted, so no name can write lines.
            Hello::Tls(Some(name)) => format!("its TLS asks for {name:?}"),
            Hello::Tls(None) => "its TLS names no server".to_owned(),
            Hello::Incomplete(_) | Hello::NotTls if strict => {
                "it does not start with TLS".to_owned()
            }
            Hello::Incomplete(_) | Hello::NotTls => {
                "it starts like TLS but not with one whole ClientHello".to_owned()
            }
        };
        let opened = if strict {
            "which the default list opens for"
        } else {
            "which was allowed for"
        };
        tracing::warn!("the sandbox closed a tunnel to {host}, {opened} {host} itself only: {why}");
        return None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    /// A tunnel the default list alone opens carries TLS for that very
    /// name, or nothing: another name behind the same front is refused,
    /// as is a tunnel that does not start with TLS.
    #[tokio::test]
    async fn a_default_list_tunnel_must_ask_for_its_own_name() {
        use tokio::io::AsyncWriteExt;
        let hello = |host| crate::network::sni::hello_naming(Some(host));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let at = listener.local_addr().unwrap();
        for (sent, allowed) in [
            (hello("Registry.npmjs.org"), true),
            (hello("evil.workers.dev"), false),
            (
                b"GET / HTTP/1.1\r\nHost: evil.example\r\n\r\n".to_vec(),
                false,
            ),
        ] {
            let mut client = TcpStream::connect(at).await.unwrap();
            let (mut server, _) = listener.accept().await.unwrap();
            // Split in two, as TCP may deliver it.
            let (a, b) = sent.split_at(7);
            client.write_all(a).await.unwrap();
            let b = b.to_vec();
            let writer = tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                let _ = client.write_all(&b).await;
                client
            });
            let got = own_name_only(&mut server, "registry.npmjs.org", Vec::new(), true).await;
            assert_eq!(
                got.is_some(),
                allowed,
                "{:?}",
                String::from_utf8_lossy(&sent)
            );
            if let Some(first) = got {
                assert_eq!(first, sent, "the bytes read are sent on whole");
            }
            drop(writer.await);
        }
    }

    /// A tunnel to a name someone allowed carries what it likes but a
    /// ClientHello for another name (another site behind a shared front).
    #[tokio::test]
    async fn an_allowed_names_tunnel_may_not_ask_for_another_name() {
        use tokio::io::AsyncWriteExt;
        let hello = |host| crate::network::sni::hello_naming(Some(host));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let at = listener.local_addr().unwrap();
        let named = hello("git.example.com");
        // The same hello split over two records (as TLS allows): a way to
        // hide the name from a proxy that reads the first record only.
        let mut split = named[..5].to_vec();
        split[3..5].copy_from_slice(&10u16.to_be_bytes());
        split.extend_from_slice(&named[5..15]);
        split.extend_from_slice(&[22, 3, 1]);
        split.extend_from_slice(&((named.len() - 15) as u16).to_be_bytes());
        split.extend_from_slice(&named[15..]);
        for (sent, allowed) in [
            (named.clone(), true),
            (crate::network::sni::hello_naming(None), false),
            (hello("evil.workers.dev"), false),
            (split, false),
            (b"\x15\x03\x03\x00\x02\x01\x00".to_vec(), false),
            (b"SSH-2.0-OpenSSH_9.2\r\n".to_vec(), true),
            (b"\x01".to_vec(), true),
        ] {
            let mut client = TcpStream::connect(at).await.unwrap();
            let (mut server, _) = listener.accept().await.unwrap();
            client.write_all(&sent).await.unwrap();
            let got = own_name_only(&mut server, "git.example.com", Vec::new(), false).await;
            assert_eq!(
                got.is_some(),
                allowed,
                "{:?}",
                String::from_utf8_lossy(&sent)
            );
            drop(client);
        }
    }
}
