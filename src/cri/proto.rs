//! The generated CRI v1 messages and services. Private: nothing generated leaves `cri`.
//! Generated from `proto/runtime/v1/api.proto` by `scripts/gen-cri.sh` (tools/cri-gen), not by
//! the build: the build then compiles no protobuf compiler.

include!("generated/runtime.v1.rs");
