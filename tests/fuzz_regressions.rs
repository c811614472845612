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
                let outcome = std::panic::catch_unwind(|| target(&data));
                assert!(outcome.is_ok(), "{name} fails on {}", path.display());
                replayed += 1;
            }
        }
    }
    // The seeds alone are a dozen: an empty replay would prove nothing.
    assert!(replayed >= 10, "only {replayed} inputs were replayed");
}
