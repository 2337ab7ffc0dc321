//! Fuzz target `keys`: see `kruised_fuzz::keys` for the properties checked.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kruised_fuzz::keys(data));
