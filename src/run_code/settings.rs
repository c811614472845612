//! The `runCode` section of the user config, and the limits a run gets.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::Language;

/// As the user wrote it (`"runCode": {...}` in the user config).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunCodeSettings {
    /// A per-language argv prefix (`{"python": ["uv", "run", "python"]}`);
    /// the source file's path is appended.
    #[serde(default)]
    pub interpreters: BTreeMap<Language, Vec<String>>,
    /// Languages never offered, even where their interpreter exists.
    #[serde(default)]
    pub disable: Vec<Language>,
    /// Names of environment variables passed to the code, beyond PATH,
    /// LANG and TZ.
    #[serde(default)]
    pub env: Vec<String>,
    /// The wall-clock ceiling when a call gives none (default 30 s).
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// The most a call may ask for (default 10 minutes).
    #[serde(default)]
    pub max_timeout_ms: Option<u64>,
    /// The memory ceiling of a run's whole tree (default 1024 MiB).
    #[serde(default)]
    pub memory_mb: Option<u64>,
    /// What is kept of stdout and of stderr each (default 32 KiB).
    #[serde(default)]
    pub max_output_bytes: Option<usize>,
    /// The largest output file returned (default 256 KiB).
    #[serde(default)]
    pub max_output_file_bytes: Option<u64>,
    /// All output files returned together (default 1 MiB).
    #[serde(default)]
    pub max_outputs_total_bytes: Option<u64>,
    /// Run code unconfined where no sandbox can be armed (default: refuse
    /// with `no_confinement`). Every result then says `confinement: none`,
    /// and the text the model reads starts with UNCONFINED.
    #[serde(default)]
    pub allow_unconfined: bool,
    /// Tool calls one run may make (default 1000).
    #[serde(default)]
    pub max_tool_calls: Option<u32>,
    /// The largest tool argument, answer or `result()` value in bytes of
    /// JSON (default 1 MiB).
    #[serde(default)]
    pub max_tool_bytes: Option<usize>,
    /// How long one tool call may take (default 30 s).
    #[serde(default)]
    pub tool_call_timeout_ms: Option<u64>,
    /// Tool calls in flight at once (default 8).
    #[serde(default)]
    pub concurrent_tool_calls: Option<usize>,
}

/// The keys [`RunCodeSettings`] knows, for the warning about a misspelled one.
impl RunCodeSettings {
    /// The `runCode` section of the user config (default where it is
    /// missing); its unknown keys named in the log, its errors in words.
    pub fn from_user_config(user: &crate::config::UserConfig) -> anyhow::Result<RunCodeSettings> {
        let Some(value) = &user.run_code else {
            return Ok(RunCodeSettings::default());
        };
        if let Some(map) = value.as_object() {
            for key in map.keys().filter(|k| !KNOWN_KEYS.contains(&k.as_str())) {
                tracing::warn!(
                    "the user config has `runCode.{key}`, which zcode-acp does not know (it knows {}); it is ignored",
                    KNOWN_KEYS.join(", ")
                );
            }
        }
        serde_json::from_value(value.clone())
            .map_err(|e| anyhow::anyhow!("the user config's `runCode` cannot be read: {e}"))
    }
}

pub const KNOWN_KEYS: &[&str] = &[
    "interpreters",
    "disable",
    "env",
    "timeoutMs",
    "maxTimeoutMs",
    "memoryMb",
    "maxOutputBytes",
    "maxOutputFileBytes",
    "maxOutputsTotalBytes",
    "allowUnconfined",
    "maxToolCalls",
    "maxToolBytes",
    "toolCallTimeoutMs",
    "concurrentToolCalls",
];

/// The ceilings every run gets, resolved from the settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub default_timeout_ms: u64,
    pub max_timeout_ms: u64,
    pub memory_bytes: u64,
    pub output_bytes: usize,
    pub output_file_bytes: u64,
    pub outputs_total_bytes: u64,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            default_timeout_ms: 30_000,
            max_timeout_ms: 600_000,
            memory_bytes: 1024 << 20,
            output_bytes: 32 << 10,
            output_file_bytes: 256 << 10,
            outputs_total_bytes: 1 << 20,
        }
    }
}

impl RunCodeSettings {
    pub fn tool_limits(&self) -> super::tools::ToolLimits {
        let d = super::tools::ToolLimits::default();
        super::tools::ToolLimits {
            max_calls: self.max_tool_calls.unwrap_or(d.max_calls),
            max_bytes: self.max_tool_bytes.unwrap_or(d.max_bytes).max(1024),
            call_timeout_ms: self
                .tool_call_timeout_ms
                .unwrap_or(d.call_timeout_ms)
                .max(1),
            concurrent: self.concurrent_tool_calls.unwrap_or(d.concurrent).max(1),
            ..d
        }
    }

    pub fn limits(&self) -> Limits {
        let d = Limits::default();
        let max_timeout_ms = self.max_timeout_ms.unwrap_or(d.max_timeout_ms).max(1);
        Limits {
            default_timeout_ms: self
                .timeout_ms
                .unwrap_or(d.default_timeout_ms)
                .clamp(1, max_timeout_ms),
            max_timeout_ms,
            memory_bytes: self
                .memory_mb
                .map(|mb| mb.max(16) << 20)
                .unwrap_or(d.memory_bytes),
            output_bytes: self.max_output_bytes.unwrap_or(d.output_bytes),
            output_file_bytes: self.max_output_file_bytes.unwrap_or(d.output_file_bytes),
            outputs_total_bytes: self
                .max_outputs_total_bytes
                .unwrap_or(d.outputs_total_bytes),
        }
    }
}
