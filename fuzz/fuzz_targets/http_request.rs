//! Fuzz target `http_request`: see `kruised_fuzz::http_request` for the properties checked.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kruised_fuzz::http_request(data));
