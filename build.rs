//! Compiles the CRI v1 API (`proto/runtime/v1/api.proto`) with protox, a pure-Rust protobuf
//! compiler, so no `protoc` is needed. Output goes to `OUT_DIR` only.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    const PROTO: &str = "proto/runtime/v1/api.proto";
    println!("cargo:rerun-if-changed={PROTO}");
    println!("cargo:rerun-if-env-changed=CARGO_FEATURE_TEST_UTIL");
    let descriptors = protox::compile([PROTO], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        // server stubs only for the fake runtime of the tests (feature test-util)
        .build_server(std::env::var_os("CARGO_FEATURE_TEST_UTIL").is_some())
        // maps as BTreeMap: deterministic order for output and comparisons
        .btree_map(".")
        // credentials must never reach a log through a derived Debug
        .skip_debug(["runtime.v1.AuthConfig"])
        .compile_fds(descriptors)?;
    Ok(())
}
