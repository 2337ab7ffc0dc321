//! Fuzz target `http_response`: see `kruised_fuzz::http_response` for the properties checked.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kruised_fuzz::http_response(data));
