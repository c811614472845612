//! Logging: stderr (and optionally a file), never stdout.
//!
//! stdout carries the ACP protocol; a single stray log line there would be
//! read by the editor as a broken frame.

use std::path::Path;

use tracing_subscriber::filter::FilterExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{fmt, EnvFilter, Layer};

/// Events with this target go to the log file only: what the user is told
/// on stderr directly is not said there twice.
pub const FILE_ONLY: &str = "zcode_acp::file_only";

/// The log file (`--log-file`), while this process writes to it.
static LOG_FILE: std::sync::Mutex<Option<std::fs::File>> = std::sync::Mutex::new(None);

/// Writes to the log file, or nowhere once it was let go of.
struct LogFile;

impl std::io::Write for LogFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match LOG_FILE.lock().as_deref_mut() {
            Ok(Some(file)) => file.write(buf),
            _ => Ok(buf.len()),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match LOG_FILE.lock().as_deref_mut() {
            Ok(Some(file)) => file.flush(),
            _ => Ok(()),
        }
    }
}

/// Stops writing to the log file, leaving its descriptor to the caller
/// (not closed here): a forked child that closes or reuses the
/// descriptors it inherited (the sandbox's network proxy) must not write
/// its log lines into whatever takes that number next.
pub fn let_go_of_the_log_file() {
    use std::os::fd::IntoRawFd;
    if let Ok(mut slot) = LOG_FILE.lock() {
        if let Some(file) = slot.take() {
            let _ = file.into_raw_fd();
        }
    }
}

/// Installs the global subscriber. The level comes from `ZCODE_ACP_LOG`,
/// else `RUST_LOG`, else `info` (the MCP SDK's own chatter at `warn`).
pub fn init(log_file: Option<&Path>) -> anyhow::Result<()> {
    let directives = std::env::var("ZCODE_ACP_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .unwrap_or_else(|_| "info,rmcp=warn".into());
    let filter = || EnvFilter::try_new(&directives).unwrap_or_else(|_| EnvFilter::new("info"));
    let stderr = fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .with_filter(filter().and(tracing_subscriber::filter::filter_fn(|m| {
            m.target() != FILE_ONLY
        })));
    let file = match log_file {
        Some(path) => {
            let f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| anyhow::anyhow!("cannot open the log file {}: {e}", path.display()))?;
            if let Ok(mut slot) = LOG_FILE.lock() {
                *slot = Some(f);
            }
            Some(
                fmt::layer()
                    .with_writer(|| LogFile)
                    .with_ansi(false)
                    .with_filter(filter()),
            )
        }
        None => None,
    };
    tracing_subscriber::registry()
        .with(stderr)
        .with(file)
        .try_init()?;
    Ok(())
}
