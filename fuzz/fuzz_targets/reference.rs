//! Fuzz target `reference`: see `kruised_fuzz::reference` for the properties checked.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kruised_fuzz::reference(data));
