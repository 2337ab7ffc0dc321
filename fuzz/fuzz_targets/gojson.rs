//! Fuzz target `gojson`: see `kruised_fuzz::gojson` for the properties checked.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kruised_fuzz::gojson(data));
