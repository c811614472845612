//! Issue 15's network rows: an HTTPS server of the benchmark's own on this
//! machine's loopback (allowed in the bench home's user config, so the
//! sandbox reaches it), downloaded from and connected to by `curl` bare
//! and inside `zcode-acp run`: once through the sandbox's proxy (CONNECT,
//! as a public host is reached) and once through the port's mirror on the
//! sandbox's loopback. Every timing is curl's own, taken inside one
//! sandbox, so arming it is not counted.

use std::io::BufRead;
use std::process::{Command, Stdio};

use super::BIN;

/// The server: a fixed blob over TLS, one thread per connection.
const SERVER: &str = r#"
import http.server, ssl, sys
blob = b"z" * (64 << 20)
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        body = blob if self.path == "/blob" else b"ok"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(sys.argv[1], sys.argv[2])
s.socket = ctx.wrap_socket(s.socket, server_side=True)
print(s.server_address[1], flush=True)
s.serve_forever()
"#;

struct Server(std::process::Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn skipped(why: &str) -> Vec<String> {
    vec![format!(
        "| HTTPS through the sandbox's network | skipped: {why} | | |"
    )]
}

/// curl's figures for `n` fetches of `url` (`%{what}`, one per line), by
/// `sh` bare or inside `zcode-acp run`.
fn curl_figures(
    home: &std::path::Path,
    sandboxed: bool,
    n: usize,
    curl_args: &str,
    what: &str,
) -> Vec<f64> {
    // A failed fetch prints `fail`, never a figure (curl's own would be
    // 0, which would pass for a fast one).
    let script = format!(
        "for i in $(seq {n}); do f=$(curl -fsk -o /dev/null -w '%{{{what}}}' {curl_args}) && echo \"$f\" || echo fail; done"
    );
    let mut cmd = if sandboxed {
        let mut c = Command::new(BIN);
        c.args(["run", "--workspace"])
            .arg(home)
            .args(["--", "sh", "-c", &script]);
        c
    } else {
        let mut c = Command::new("sh");
        c.args(["-c", &script]);
        c
    };
    let out = cmd
        .current_dir(home)
        .env("HOME", home)
        .env_remove("XDG_CONFIG_HOME")
        .stderr(Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && !text.contains("fail"),
        "a fetch failed ({}sandboxed): {text}",
        if sandboxed { "" } else { "not " }
    );
    text.lines().filter_map(|l| l.trim().parse().ok()).collect()
}

fn median_of(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

pub fn rows(downloads: usize, connects: usize) -> Vec<String> {
    let home = super::scratch_dir();
    let home = std::fs::canonicalize(home.keep()).unwrap();
    std::fs::create_dir_all(home.join("ws")).unwrap();
    let (cert, key) = (home.join("cert.pem"), home.join("key.pem"));
    let made = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=localhost",
            "-days",
            "1",
        ])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if !made.is_ok_and(|s| s.success()) {
        return skipped("openssl could not make a certificate");
    }
    let Ok(mut child) = Command::new("python3")
        .args(["-c", SERVER])
        .arg(&cert)
        .arg(&key)
        .stdout(Stdio::piped())
        .spawn()
    else {
        return skipped("python3 is missing");
    };
    let mut line = String::new();
    let _ = std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line);
    let _server = Server(child);
    let Ok(port) = line.trim().parse::<u16>() else {
        return skipped("the HTTPS server did not start");
    };
    let config = home.join(".config/zcode-acp");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(
        config.join("config.json"),
        format!(r#"{{"network": {{"hostLoopback": [{port}]}}}}"#),
    )
    .unwrap();
    let url = |path: &str| format!("https://127.0.0.1:{port}/{path}");
    let proxied = |path: &str| format!("--noproxy '' -p {}", url(path));
    let mut rows = Vec::new();

    // Three rounds, each bare, through the proxy and through the mirror in
    // turn, so drift hits every column alike.
    let measure = |n: usize, path: &str, what: &str| {
        let (mut bare, mut proxy, mut mirror) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..3 {
            let per = n.div_ceil(3);
            bare.extend(curl_figures(&home, false, per, &url(path), what));
            proxy.extend(curl_figures(&home, true, per, &proxied(path), what));
            mirror.extend(curl_figures(&home, true, per, &url(path), what));
        }
        (median_of(bare), median_of(proxy), median_of(mirror))
    };

    // Throughput, in bytes per second.
    let (bare, proxy, mirror) = measure(downloads, "blob", "speed_download");
    let mbs = |b: f64| b / 1e6;
    crate::goals::at_least(
        "HTTPS download through the sandbox's proxy vs bare",
        proxy / bare,
        0.8,
    );
    rows.push(format!(
        "| HTTPS download of 64 MiB from this machine, median of {downloads}: bare vs inside through the sandbox's proxy (goal: 0.8x at least) | {:.0} MB/s | {:.0} MB/s | {:.2}x |",
        mbs(bare), mbs(proxy), proxy / bare
    ));
    rows.push(format!(
        "| the same, inside through the allowed port's mirror on the sandbox's loopback | {:.0} MB/s | {:.0} MB/s | {:.2}x |",
        mbs(bare), mbs(mirror), mirror / bare
    ));

    // Connection setup: TCP and TLS (`time_appconnect`), in seconds.
    let (bare, proxy, mirror) = measure(connects, "small", "time_appconnect");
    let ms = |s: f64| s * 1e3;
    crate::goals::record(
        "HTTPS connection setup: what the proxy adds",
        format!("{:+.2} ms", ms(proxy - bare)),
        "2 ms at most",
        ms(proxy - bare) <= 2.0,
    );
    rows.push(format!(
        "| HTTPS connection setup (TCP+TLS), median of {connects}: bare vs through the proxy; adds {:.2} ms (goal: 2 ms at most) | {:.2} ms | {:.2} ms | {:.2}x |",
        ms(proxy - bare), ms(bare), ms(proxy), proxy / bare
    ));
    rows.push(format!(
        "| the same, through the mirror; adds {:.2} ms | {:.2} ms | {:.2} ms | {:.2}x |",
        ms(mirror - bare),
        ms(bare),
        ms(mirror),
        mirror / bare
    ));
    let _ = std::fs::remove_dir_all(&home);
    rows
}
