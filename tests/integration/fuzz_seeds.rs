//! The fuzz targets' properties (`fuzz/src/lib.rs`) over their seed inputs (`fuzz/seeds/`), as
//! ordinary regression tests: no instrumented build, no libFuzzer. What a fuzzing run finds is
//! added to the seeds, so it stays found. Long fuzzing is `fuzz/run.sh SECONDS`
//! (docs/RELIABILITY.md).

#[path = "../../fuzz/src/lib.rs"]
#[allow(dead_code, reason = "each property is one target's")]
mod properties;

use std::path::Path;

/// Runs `property` over every seed of `target`, naming the seed that fails.
fn replay(target: &str, property: fn(&[u8])) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/seeds")
        .join(target);
    let mut seeds: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    seeds.sort();
    assert!(!seeds.is_empty(), "no seeds in {}", dir.display());
    for seed in seeds {
        let data = std::fs::read(&seed).unwrap();
        if let Err(panic) = std::panic::catch_unwind(|| property(&data)) {
            panic!("{} breaks the {target} property: {panic:?}", seed.display());
        }
    }
}

#[test]
fn annotation_keys_hold_their_properties_on_every_seed() {
    replay("keys", properties::keys);
}

#[test]
fn image_references_hold_their_properties_on_every_seed() {
    replay("reference", properties::reference);
}

#[test]
fn keyrings_hold_their_properties_on_every_seed() {
    replay("keyring", properties::keyring);
}

#[test]
fn credential_provider_answers_hold_their_properties_on_every_seed() {
    replay("credprovider", properties::credprovider);
}

#[test]
fn go_json_holds_its_properties_on_every_seed() {
    replay("gojson", properties::gojson);
}

#[test]
fn endpoints_hold_their_properties_on_every_seed() {
    replay("endpoint", properties::endpoint);
}

#[test]
fn http_answers_of_probes_and_hooks_hold_their_properties_on_every_seed() {
    replay("http_response", properties::http_response);
}

#[test]
fn http_requests_of_probes_and_hooks_hold_their_properties_on_every_seed() {
    replay("http_request", properties::http_request);
}
