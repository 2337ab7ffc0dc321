//! Fuzz target `keyring`: see `kruised_fuzz::keyring` for the properties checked.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kruised_fuzz::keyring(data));
