#!/usr/bin/env bash
# Generates src/cri/generated/runtime.v1.rs from proto/runtime/v1/api.proto, and
# src/cri/containerd/generated/ from proto/containerd/ (containerd's content and images services)
# (tools/cri-gen:
# protox and tonic-prost-build, pure Rust, no protoc). Run it after changing the proto; kruised's
# unit test `the_generated_code_is_from_the_proto_in_the_tree` fails until it is run.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo run --quiet --locked --manifest-path tools/cri-gen/Cargo.toml
