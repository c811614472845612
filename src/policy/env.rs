//! The environment a policy is gathered in, and the grants of directories
//! it names: read by the backend profiles and by discovery alike.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::build::Writable;
use super::{resolve_real, Matcher};

/// Environment lookups, injectable for tests.
pub trait Env {
    fn var(&self, key: &str) -> Option<String>;
}

pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn var(&self, key: &str) -> Option<String> {
        std::env::var(key).ok().filter(|v| !v.is_empty())
    }
}

impl Env for HashMap<String, String> {
    fn var(&self, key: &str) -> Option<String> {
        self.get(key).cloned()
    }
}

/// A state or cache directory, refusing anything that would open the whole
/// home directory or `/`.
pub fn dir_grant(path: &Path, home: &Path, why: &str) -> Option<Writable> {
    let real = resolve_real(path).ok()?;
    if real == home || real == Path::new("/") || home.starts_with(&real) {
        tracing::warn!(path = %real.display(), "not whitelisting {why}: it would open the whole home directory");
        return None;
    }
    // A state or cache directory that is (or leads through a symlink to)
    // a place never granted: ~/.ssh, shell start-up files, autostart.
    if let Some(never) = super::offerable::never_granted(&real, Some(home)) {
        tracing::warn!(path = %real.display(), "not whitelisting {why}: {never}");
        return None;
    }
    Some(Writable {
        matcher: Matcher::Subpath(real),
        why: why.to_owned(),
        layered: false,
    })
}

/// A cache shared with the user's own builds (see [`Writable::layered`]).
pub fn cache_grant(path: &Path, home: &Path, why: &str) -> Option<Writable> {
    dir_grant(path, home, why).map(|g| Writable { layered: true, ..g })
}

/// `~/x` -> `$HOME/x`.
pub fn expand_home(p: &Path, home: &Path) -> PathBuf {
    match p.strip_prefix("~") {
        Ok(rest) => home.join(rest),
        Err(_) => p.to_path_buf(),
    }
}
