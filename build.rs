//! kruised's build script, with no dependency of its own:
//!
//! - checks that the committed CRI code (`src/cri/generated/runtime.v1.rs`) was generated from
//!   the proto in the tree (`proto/runtime/v1/api.proto`), and so each of containerd's own
//!   services kruised calls (`GENERATED_CONTAINERD`: content, images): the generated file's
//!   second line is the proto's fingerprint, written by `scripts/gen-cri.sh`; a proto changed
//!   without running it
//!   fails the build, saying so;
//! - stamps the commit into the binary (`KRUISED_COMMIT`, read by `build_info::COMMIT`: `kruised
//!   version` and `kruised_build_info`): `$KRUISED_COMMIT` when set (scripts/build-image.sh sets
//!   it, with `-dirty` for a tree with uncommitted changes, as the image's revision label), else
//!   `git rev-parse HEAD` where the source is a git checkout, else `unknown`.
//!
//! Release-based builds (`release`, `dist`) follow every new commit. Debug builds (the tests')
//! keep the commit of the build script's last run: watching the repository's HEAD there would
//! rebuild the whole crate after every commit of the edit-test loop.

use std::path::Path;
use std::process::Command;

include!("proto/fingerprint.rs");

const PROTO: &str = "proto/runtime/v1/api.proto";
const GENERATED: &str = "src/cri/generated/runtime.v1.rs";
/// containerd's services, each `(proto, generated code)` (`src/cri/containerd`): the content
/// service (pull progress) and the images service (pinning).
const GENERATED_CONTAINERD: &[(&str, &str)] = &[
    (
        "proto/containerd/services/content/v1/content.proto",
        "src/cri/containerd/generated/containerd.services.content.v1.rs",
    ),
    (
        "proto/containerd/images/v1/images.proto",
        "src/cri/containerd/generated/containerd.services.images.v1.rs",
    ),
];

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=proto/fingerprint.rs");
    println!("cargo:rerun-if-changed={PROTO}");
    println!("cargo:rerun-if-changed={GENERATED}");
    check_generated(PROTO, GENERATED);
    for (proto, generated) in GENERATED_CONTAINERD {
        println!("cargo:rerun-if-changed={proto}");
        println!("cargo:rerun-if-changed={generated}");
        check_generated(proto, generated);
    }
    // the shipped build's linker (scripts/lib/link-ordered.sh) reads these; cargo does not know
    // that, so a new list or wrapper would not link the binary again without this
    println!("cargo:rerun-if-changed=scripts/lib/hot-functions.txt");
    println!("cargo:rerun-if-changed=scripts/lib/link-ordered.sh");
    println!("cargo:rerun-if-env-changed=KRUISED_COMMIT");
    let commit = std::env::var("KRUISED_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .unwrap_or_else(git_commit);
    println!("cargo:rustc-env=KRUISED_COMMIT={commit}");
}

fn check_generated(proto_path: &str, generated_path: &str) {
    let proto =
        std::fs::read(proto_path).unwrap_or_else(|e| panic!("cannot read {proto_path}: {e}"));
    let generated = std::fs::read_to_string(generated_path)
        .unwrap_or_else(|e| panic!("cannot read {generated_path}: {e}"));
    let want = fingerprint_line(&proto);
    if !generated.lines().take(3).any(|l| l == want) {
        panic!(
            "{proto_path} is not the proto {generated_path} was generated from (its fingerprint \
             line is not `{want}`): run scripts/gen-cri.sh"
        );
    }
}

/// `git rev-parse HEAD` of the source tree, or `unknown` (a tarball, no git).
fn git_commit() -> String {
    let root = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into());
    let git = Path::new(&root).join(".git");
    if !git.exists() {
        return "unknown".into();
    }
    if std::env::var("PROFILE").as_deref() == Ok("release") {
        // HEAD, and the branch it points to (a new commit moves the branch, not HEAD)
        println!("cargo:rerun-if-changed={}", git.join("HEAD").display());
        if let Ok(head) = std::fs::read_to_string(git.join("HEAD"))
            && let Some(branch) = head.trim().strip_prefix("ref: ")
        {
            println!("cargo:rerun-if-changed={}", git.join(branch).display());
            println!(
                "cargo:rerun-if-changed={}",
                git.join("packed-refs").display()
            );
        }
    }
    Command::new("git")
        .args(["-C", &root, "rev-parse", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into())
}
