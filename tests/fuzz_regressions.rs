//! Replays every seed of the fuzz targets and every input the fuzzer ever
//! found (`tests/fuzz_regressions/<target>/`) through the same checks the
//! fuzzer runs (`fuzz/targets.rs`): what was fixed stays fixed, in CI,
//! without the fuzzer.

#[path = "../fuzz/targets.rs"]
mod targets;

use std::path::Path;

#[test]
fn every_seed_and_every_input_the_fuzzer_found_passes_its_target() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut replayed = 0;
    for (name, target) in targets::TARGETS {
        for dir in [
            root.join("fuzz/seeds").join(name),
            root.join("tests/fuzz_regressions").join(name),
        ] {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries {
                let path = entry.unwrap().path();
                let data = std::fs::read(&path).unwrap();
                // On a thread of its own, so an input the fuzzer flagged as
                // a hang fails here too if it really hangs (a liveness
                // bound, far above what any input takes).
                let (tx, rx) = std::sync::mpsc::channel();
                std::thread::spawn(move || {
                    let outcome = std::panic::catch_unwind(|| target(&data));
                    let _ = tx.send(outcome.is_ok());
                });
                match rx.recv_timeout(std::time::Duration::from_secs(30)) {
                    Ok(ok) => assert!(ok, "{name} fails on {}", path.display()),
                    Err(_) => panic!("{name} hangs on {}", path.display()),
                }
                replayed += 1;
            }
        }
    }
    // The seeds alone are a dozen: an empty replay would prove nothing.
    assert!(replayed >= 10, "only {replayed} inputs were replayed");
}
