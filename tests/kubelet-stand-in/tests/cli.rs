//! The stand-in as a program: it refuses to start without what it needs, naming it. (Also makes
//! `cargo test` build its binary, which `scripts/demo.sh` can then run as built.)

#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use std::process::Command;

#[test]
fn a_missing_setting_is_refused_by_name() {
    let out = Command::new(env!("CARGO_BIN_EXE_kubelet-stand-in"))
        .args(["--node-name", "n1", "--log-dir", "/tmp"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--kubeconfig") && stderr.contains("--runtime-endpoint"),
        "{stderr}"
    );
}

#[test]
fn a_bad_sync_period_says_what_it_wants() {
    let out = Command::new(env!("CARGO_BIN_EXE_kubelet-stand-in"))
        .args([
            "--kubeconfig",
            "/k",
            "--node-name",
            "n1",
            "--runtime-endpoint",
        ])
        .args([
            "unix:///run/cri.sock",
            "--log-dir",
            "/tmp",
            "--sync-period",
            "soon",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("milliseconds"), "{stderr}");
}
