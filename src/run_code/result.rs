//! A run's result: the structured object clients read, and the text the
//! model reads, which carries every cut and every caveat visibly.

use serde::Serialize;

use super::stage::Output;
use super::tools::rpc::LogEntry;

/// Stable error codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    Timeout,
    Memory,
    NoInterpreter,
    LanguageDisabled,
    EgressDenied,
    NoConfinement,
    BadRequest,
    /// A tool the call listed does not exist, or its server cannot be reached.
    UnknownTool,
    /// The run could not be started or watched (disk, spawn).
    Internal,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct RunError {
    pub code: ErrorCode,
    pub message: String,
}

/// The result of one `run_code` call.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunResult {
    pub ok: bool,
    pub language: String,
    /// The argv prefix that ran the source (empty when nothing ran).
    pub interpreter: Vec<String>,
    pub stdout: String,
    pub stderr: String,
    /// Null when the process was killed by a signal, or never ran.
    pub exit_code: Option<i32>,
    pub signal: Option<String>,
    pub timed_out: bool,
    /// Whether stdout or stderr was cut.
    pub truncated: bool,
    pub duration_ms: u64,
    /// What confined the run: `linux: namespaces+landlock`, `macos:
    /// seatbelt`, `inherited: ...`, or `none`.
    pub confinement: String,
    /// Null when the run never started; otherwise what landed in the
    /// output directory (empty: nothing did).
    pub outputs: Option<Vec<Output>>,
    /// What the code passed to `result()` (null: nothing).
    pub result: Option<serde_json::Value>,
    /// What the code passed to `log()`, and what zcode-acp refused it.
    pub logs: Vec<LogEntry>,
    /// Tool calls made (null: the call listed no tools).
    pub tool_calls: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<RunError>,
    /// Said in the structured result too (some agents hand the model that
    /// rather than the text): a run nothing confined.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
}

/// What an unconfined run's result says, in both forms.
pub const UNCONFINED: &str = "UNCONFINED: nothing sandboxed this run (the user's config accepts unconfined runs where no sandbox can be armed).";

impl RunResult {
    /// A call refused before anything ran.
    pub fn refused(
        language: &str,
        confinement: String,
        code: ErrorCode,
        message: String,
    ) -> RunResult {
        RunResult {
            ok: false,
            language: language.to_owned(),
            interpreter: Vec::new(),
            stdout: String::new(),
            stderr: String::new(),
            exit_code: None,
            signal: None,
            timed_out: false,
            truncated: false,
            duration_ms: 0,
            confinement,
            outputs: None,
            result: None,
            logs: Vec::new(),
            tool_calls: None,
            error: Some(RunError { code, message }),
            warning: None,
        }
    }

    /// The text the model reads.
    pub fn text(&self) -> String {
        let mut t = String::new();
        if self.confinement == "none" {
            t.push_str(UNCONFINED);
            t.push('\n');
        } else {
            t.push_str(&format!("confinement: {}\n", self.confinement));
        }
        if let Some(e) = &self.error {
            t.push_str(&format!(
                "error: {}: {}\n",
                serde_json::to_value(e.code)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default(),
                e.message
            ));
        }
        if self.interpreter.is_empty() {
            return t;
        }
        let ended = match (&self.exit_code, &self.signal) {
            (Some(code), _) => format!("exit code {code}"),
            (None, Some(sig)) => format!("killed by {sig}"),
            (None, None) => "no exit status".into(),
        };
        t.push_str(&format!(
            "{} ran with {}: {ended} after {} ms\n",
            self.language,
            self.interpreter.join(" "),
            self.duration_ms
        ));
        for (name, text) in [("stdout", &self.stdout), ("stderr", &self.stderr)] {
            if text.is_empty() {
                t.push_str(&format!("{name}: (empty)\n"));
            } else {
                t.push_str(&format!("--- {name} ---\n{text}"));
                if !text.ends_with('\n') {
                    t.push('\n');
                }
            }
        }
        if let Some(n) = self.tool_calls {
            t.push_str(&format!("tool calls: {n}\n"));
        }
        if let Some(v) = &self.result {
            t.push_str(&format!("result: {v}\n"));
        }
        if !self.logs.is_empty() {
            t.push_str("--- logs ---\n");
            for l in &self.logs {
                t.push_str(&format!("[{} +{} ms] {}\n", l.level, l.t, l.message));
            }
        }
        match &self.outputs {
            Some(outputs) if outputs.is_empty() => {
                t.push_str("outputs: none (nothing was written to $ZCODE_RUN_OUTPUTS)\n")
            }
            Some(outputs) => {
                t.push_str("--- outputs ---\n");
                for o in outputs {
                    match (&o.skipped, &o.text) {
                        (Some(why), _) => t.push_str(&format!(
                            "{} ({} bytes): NOT RETURNED: {why}\n",
                            o.path, o.bytes
                        )),
                        (None, Some(text)) => t.push_str(&format!(
                            "{} ({} bytes, {}):\n{text}{}",
                            o.path,
                            o.bytes,
                            o.mime_type,
                            if text.ends_with('\n') { "" } else { "\n" }
                        )),
                        (None, None) => t.push_str(&format!(
                            "{} ({} bytes, {}): returned as a resource\n",
                            o.path, o.bytes, o.mime_type
                        )),
                    }
                }
            }
            None => {}
        }
        t
    }
}
