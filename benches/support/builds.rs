//! Builds that use the caches shared with your own builds, bare and under
//! `zcode-acp run`, where those caches are copy-on-write overlays (the
//! user's cache is the lower layer, the sandbox's writes go to a layer of
//! its own). Cold: nothing built yet and, for cargo, no sources extracted
//! (the first build extracts them into the registry: writes into the
//! layered cache). Warm: the same build again after touching one source
//! file (cargo) or with `node_modules` in place (npm).
//!
//! Everything lives in a home directory of the benchmark's own: cargo's
//! registry index and downloaded crates are copied there from yours (read
//! only), and npm's cache is filled there by one install before timing, so
//! the timed builds run offline and never touch your own caches.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::{median, BIN};

/// One bench world: a home with caches, a workspace with a project.
struct World {
    home: PathBuf,
    ws: PathBuf,
    path_env: String,
}

impl World {
    fn new(base: &Path) -> World {
        let (home, ws) = (base.join("home"), base.join("ws"));
        for d in [&home, &ws] {
            std::fs::create_dir_all(d).unwrap();
        }
        World {
            home,
            ws,
            path_env: std::env::var("PATH").unwrap_or_default(),
        }
    }

    /// Runs `script` in the workspace, bare or sandboxed, and times it.
    fn time(&self, sandboxed: bool, script: &str) -> Duration {
        let mut cmd = if sandboxed {
            let mut c = Command::new(BIN);
            c.args(["run", "--backend-profile", "none", "--workspace"])
                .arg(&self.ws)
                .args(["--", "sh", "-c", script]);
            c
        } else {
            let mut c = Command::new("sh");
            c.args(["-c", script]);
            c
        };
        cmd.current_dir(&self.ws)
            .env_clear()
            .env("HOME", &self.home)
            .env("PATH", &self.path_env)
            .env("CARGO_HOME", self.home.join(".cargo"))
            .env("ZCODE_ACP_LOG", "error")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        // rustup's proxies find their toolchains through RUSTUP_HOME, which
        // defaults to one under HOME: keep pointing them at yours.
        if let Some(r) = std::env::var_os("RUSTUP_HOME")
            .or_else(|| dirs::home_dir().map(|h| h.join(".rustup").into_os_string()))
        {
            cmd.env("RUSTUP_HOME", r);
        }
        let start = Instant::now();
        let out = cmd.output().unwrap();
        let took = start.elapsed();
        assert!(
            out.status.success(),
            "`{script}` failed ({}): {}",
            if sandboxed { "sandboxed" } else { "bare" },
            String::from_utf8_lossy(&out.stderr)
        );
        took
    }

    /// Forgets what the sandbox wrote into its caches' layers.
    fn drop_layers(&self) {
        let _ = std::fs::remove_dir_all(self.home.join(".zcode-acp/layers"));
    }
}

/// The rows: cold and warm, cargo and npm, bare against sandboxed.
pub fn cache_builds(runs: usize) -> Vec<String> {
    let base = super::scratch_dir();
    let base = std::fs::canonicalize(base.path()).unwrap();
    let mut rows = Vec::new();
    match cargo_world(&base.join("cargo")) {
        Ok(w) => rows.extend(cargo_rows(&w, runs)),
        Err(why) => rows.push(format!("| cargo builds | skipped: {why} | | |")),
    }
    match npm_world(&base.join("npm")) {
        Ok(w) => rows.extend(npm_rows(&w, runs)),
        Err(why) => rows.push(format!("| npm installs | skipped: {why} | | |")),
    }
    rows
}

fn row(what: &str, runs: usize, bare: Duration, sandboxed: Duration) -> String {
    format!(
        "| {what}: sandboxed (caches copy-on-write) vs bare, {runs} each | {:.2} s | {:.2} s | {:.2}x |",
        bare.as_secs_f64(),
        sandboxed.as_secs_f64(),
        sandboxed.as_secs_f64() / bare.as_secs_f64()
    )
}

/// A project depending on serde (derive), serde_json and regex, at the
/// versions this repository locks, with a registry copied from yours.
fn cargo_world(base: &Path) -> Result<World, String> {
    let w = World::new(base);
    let yours = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| dirs::home_dir().map(|h| h.join(".cargo")))
        .ok_or("no cargo home")?;
    let registry = w.home.join(".cargo/registry");
    std::fs::create_dir_all(&registry).unwrap();
    for part in ["index", "cache"] {
        let ok = Command::new("cp")
            .arg("-a")
            .arg(yours.join("registry").join(part))
            .arg(&registry)
            .status()
            .map_err(|e| e.to_string())?
            .success();
        if !ok {
            return Err(format!("cannot copy {}", yours.join("registry").display()));
        }
    }
    std::fs::create_dir_all(w.ws.join("src")).unwrap();
    std::fs::write(
        w.ws.join("Cargo.toml"),
        "[package]\nname = \"bench\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n\
         [dependencies]\nserde = { version = \"1\", features = [\"derive\"] }\n\
         serde_json = \"1\"\nregex = \"1\"\n",
    )
    .unwrap();
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.lock"),
        w.ws.join("Cargo.lock"),
    )
    .unwrap();
    std::fs::write(
        w.ws.join("src/main.rs"),
        "#[derive(serde::Serialize)]\nstruct S { n: u32 }\n\
         fn main() { let re = regex::Regex::new(\"[a-z]+\").unwrap();\n\
         println!(\"{} {}\", serde_json::to_string(&S { n: 1 }).unwrap(), re.is_match(\"x\")); }\n",
    )
    .unwrap();
    Ok(w)
}

fn cargo_rows(w: &World, runs: usize) -> Vec<String> {
    let build = "cargo build --offline -q";
    let warm = format!("touch src/main.rs && {build}");
    let reset = || {
        let _ = std::fs::remove_dir_all(w.ws.join("target"));
        let _ = std::fs::remove_dir_all(w.home.join(".cargo/registry/src"));
        w.drop_layers();
    };
    let (mut cold_b, mut cold_s, mut warm_b, mut warm_s) = (vec![], vec![], vec![], vec![]);
    for _ in 0..runs {
        reset();
        cold_b.push(w.time(false, build));
        warm_b.push(w.time(false, &warm));
        reset();
        cold_s.push(w.time(true, build));
        warm_s.push(w.time(true, &warm));
    }
    vec![
        row(
            "cold `cargo build` (serde, serde_json, regex; sources not yet extracted)",
            runs,
            median(cold_b),
            median(cold_s),
        ),
        row(
            "warm `cargo build` (one source file touched)",
            runs,
            median(warm_b),
            median(warm_s),
        ),
    ]
}

/// A project depending on express, typescript and lodash, npm's cache
/// filled by one install (the only step that needs the registry).
fn npm_world(base: &Path) -> Result<World, String> {
    let w = World::new(base);
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/support/npm");
    for f in ["package.json", "package-lock.json"] {
        std::fs::copy(src.join(f), w.ws.join(f)).unwrap();
    }
    let prime = Command::new("npm")
        .args(["ci", "--no-audit", "--no-fund", "--prefer-offline"])
        .current_dir(&w.ws)
        .env("HOME", &w.home)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    match prime {
        Ok(s) if s.success() => Ok(w),
        Ok(_) => Err("the npm registry could not be reached to fill the cache".into()),
        Err(e) => Err(format!("npm: {e}")),
    }
}

fn npm_rows(w: &World, runs: usize) -> Vec<String> {
    let cold = "rm -rf node_modules && npm ci --offline --no-audit --no-fund";
    let warm = "npm install --offline --no-audit --no-fund";
    let (mut cold_b, mut cold_s, mut warm_b, mut warm_s) = (vec![], vec![], vec![], vec![]);
    for _ in 0..runs {
        cold_b.push(w.time(false, cold));
        warm_b.push(w.time(false, warm));
        w.drop_layers();
        cold_s.push(w.time(true, cold));
        warm_s.push(w.time(true, warm));
    }
    vec![
        row(
            "cold `npm ci` (express, typescript, lodash; from the cache, offline)",
            runs,
            median(cold_b),
            median(cold_s),
        ),
        row(
            "warm `npm install` (`node_modules` in place, offline)",
            runs,
            median(warm_b),
            median(warm_s),
        ),
    ]
}
