//! Fuzz target `endpoint`: see `kruised_fuzz::endpoint` for the properties checked.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kruised_fuzz::endpoint(data));
