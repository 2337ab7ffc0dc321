//! What the CRI runtimes answer differently, in one place, so the daemon decides the same on
//! each. Seen on the runtimes the suite runs (`tests/cri-lab.sh`):
//!
//! | field | containerd 1.6 | containerd 2.x | CRI-O |
//! |---|---|---|---|
//! | `ImageStatus.id` | `sha256:<hex>` | `sha256:<hex>` | `<hex>` |
//! | container `image_ref` (`ListContainers`) | `sha256:<hex>` | `sha256:<hex>` | `repo@sha256:<digest>` |
//! | container `image_ref` (`ContainerStatus`) | `repo@sha256:<digest>` | `repo@sha256:<digest>` | `repo@sha256:<digest>` |
//! | container `image_id` | empty | `sha256:<hex>` | `<hex>` |
//! | `Version.runtime_name` (the container ID prefix) | `containerd` | `containerd` | `cri-o` |
//! | `ExecSync` past its timeout | `DeadlineExceeded` | `DeadlineExceeded` | exit -1, "command timed out" |
//! | `GetContainerEvents` | unimplemented | a stream | a stream, or none (`enable_pod_events`) |
//! | a call while the CRI plugin starts | Unknown, "server is not initialized yet" | the same | refused (no socket yet) |
//! | a call past its deadline, ended by tonic | Cancelled, "Timeout expired" | the same | the same |
//!
//! The image a container runs is named by the image ID (with or without `sha256:`) or by one
//! of the image's repo digests, depending on the runtime and the call.

use super::types::{Container, ExecResult, Image};

/// What CRI-O answers for an `ExecSync` whose command outlived its timeout: an exit code of
/// -1 and this on stderr (conmon's `TimedOutMessage`). containerd fails the call with
/// `DeadlineExceeded` instead.
const CRIO_EXEC_TIMED_OUT: &[u8] = b"command timed out";

/// What containerd answers (status Unknown) while its CRI plugin is still starting: it accepts
/// connections before the plugin is up. The text is the only sign: no code tells it apart.
const CONTAINERD_NOT_INITIALIZED: &str = "server is not initialized yet";

/// What tonic answers (status Cancelled) for a call it ended itself at its `grpc-timeout`: the
/// text is the only sign that it was the deadline, not the runtime, that called it off.
const TONIC_TIMEOUT_EXPIRED: &str = "Timeout expired";

/// Whether tonic itself ended the call at its deadline (its `grpc-timeout` enforcement), rather
/// than the runtime calling it off.
pub fn deadline_expired(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::Cancelled && status.message() == TONIC_TIMEOUT_EXPIRED
}

/// Whether a call failed because the runtime is still starting (containerd's way; CRI-O's
/// socket does not exist until it answers).
pub fn runtime_starting(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::Unknown && status.message().contains(CONTAINERD_NOT_INITIALIZED)
}

/// Whether an `ExecSync` answer says the command was killed at its timeout (CRI-O's way).
pub fn exec_timed_out(r: &ExecResult) -> bool {
    r.exit_code == -1 && r.stderr == CRIO_EXEC_TIMED_OUT
}

/// An image ID without its `sha256:` prefix (CRI-O reports IDs without it).
fn bare_id(id: &str) -> &str {
    id.strip_prefix("sha256:").unwrap_or(id)
}

/// Whether `s` is an image ID (64 hex digits, with or without `sha256:`), not a name.
pub fn is_image_id(s: &str) -> bool {
    let hex = bare_id(s);
    hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Whether two image IDs name the same image, whichever runtime wrote each.
pub fn same_image_id(a: &str, b: &str) -> bool {
    !a.is_empty() && bare_id(a) == bare_id(b)
}

/// The image ID a container runs, as `sha256:<hex>` on every runtime; `None` when the runtime
/// names the image only by a digest or a name (`ContainerStatus` on containerd 1.6).
pub fn container_image_id(c: &Container) -> Option<String> {
    [&c.image_id, &c.image_ref, &c.image]
        .into_iter()
        .find(|s| is_image_id(s))
        .map(|s| format!("sha256:{}", bare_id(s)))
}

/// Whether container `c` runs `image`: its image ID, or one of the image's repo digests, in
/// whichever field its runtime reports it. Tags are never compared: a tag may have moved.
pub fn runs_image(image: &Image, c: &Container) -> bool {
    [&c.image_id, &c.image_ref, &c.image]
        .into_iter()
        .filter(|s| !s.is_empty())
        .any(|s| same_image_id(s, &image.id) || image.repo_digests.iter().any(|d| d == s))
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "6edf3ef45fce40a290a35e451487c6a93d275799bdd9c7ff8b78b97f7399f5e7";
    const OTHER: &str = "b117f3c315ff9904d7c3856cee87046aad35da412fa239a59f7b43b9b1a3ced1";
    const DIGEST: &str = "127.0.0.1:5000/test/busybox@sha256:c6227c8e0ba84c08b74e1c86df5c138e9680e2c5b6e2b8d9157751db200ce533";

    fn image(id: &str) -> Image {
        Image {
            id: id.to_string(),
            repo_tags: vec!["127.0.0.1:5000/test/busybox:v1".into()],
            repo_digests: vec![DIGEST.into()],
            ..Default::default()
        }
    }

    fn container(image: &str, image_ref: &str, image_id: &str) -> Container {
        Container {
            id: "c1".into(),
            pod_sandbox_id: "s1".into(),
            metadata: Default::default(),
            image: image.into(),
            image_ref: image_ref.into(),
            state: crate::cri::ContainerState::Running,
            created_at: 0,
            labels: Default::default(),
            annotations: Default::default(),
            image_id: image_id.into(),
            image_spec: Default::default(),
        }
    }

    /// The same container as each runtime lists it (`ListContainers`), with the ID the kubelet
    /// passed as the image (the image ID it resolved).
    fn as_listed() -> [(&'static str, Image, Container); 3] {
        let sha = format!("sha256:{HEX}");
        [
            ("containerd 1.6", image(&sha), container(&sha, &sha, "")),
            (
                "containerd 2.3",
                image(&sha),
                container("127.0.0.1:5000/test/busybox:v1", &sha, &sha),
            ),
            ("CRI-O", image(HEX), container(HEX, DIGEST, HEX)),
        ]
    }

    #[test]
    fn a_container_runs_its_image_on_every_runtime() {
        for (runtime, image, c) in as_listed() {
            assert!(runs_image(&image, &c), "{runtime}");
            assert_eq!(
                container_image_id(&c),
                Some(format!("sha256:{HEX}")),
                "{runtime}"
            );
        }
    }

    #[test]
    fn a_container_does_not_run_another_image_on_any_runtime() {
        for (runtime, _, c) in as_listed() {
            let mut other = image(&format!("sha256:{OTHER}"));
            other.repo_digests = vec!["127.0.0.1:5000/test/busybox@sha256:0000".into()];
            assert!(!runs_image(&other, &c), "{runtime}");
        }
    }

    #[test]
    fn a_repo_digest_alone_identifies_the_image() {
        // containerd 1.6's ContainerStatus: the repo digest, no image ID
        let c = container("127.0.0.1:5000/test/busybox:v1", DIGEST, "");
        assert!(runs_image(&image(&format!("sha256:{HEX}")), &c));
        assert_eq!(container_image_id(&c), None);
    }

    #[test]
    fn a_tag_is_never_taken_for_identity() {
        let c = container("127.0.0.1:5000/test/busybox:v1", "", "");
        assert!(!runs_image(&image(HEX), &c));
    }

    #[test]
    fn crios_answer_to_a_timed_out_exec_is_a_timeout_and_an_exit_of_minus_one_is_not() {
        let answer = |code: i32, stderr: &[u8]| ExecResult {
            stdout: vec![],
            stderr: stderr.to_vec(),
            exit_code: code,
        };
        assert!(exec_timed_out(&answer(-1, b"command timed out")));
        assert!(!exec_timed_out(&answer(-1, b"")));
        assert!(!exec_timed_out(&answer(1, b"command timed out")));
    }

    #[test]
    fn image_ids_compare_with_or_without_their_prefix() {
        assert!(same_image_id(&format!("sha256:{HEX}"), HEX));
        assert!(same_image_id(HEX, &format!("sha256:{HEX}")));
        assert!(!same_image_id("", ""));
        assert!(is_image_id(HEX) && is_image_id(&format!("sha256:{HEX}")));
        assert!(!is_image_id(DIGEST) && !is_image_id("busybox:v1"));
    }
}
