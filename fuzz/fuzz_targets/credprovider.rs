//! Fuzz target `credprovider`: see `kruised_fuzz::credprovider` for the properties checked.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kruised_fuzz::credprovider(data));
