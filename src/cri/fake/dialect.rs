//! Which runtime the fake answers as. What containerd 1.6, containerd 2.x and CRI-O each answer
//! differently was seen on containerd 1.6.20, containerd 2.3.4 and CRI-O 1.36.3 by the
//! end-to-end layer, and is recorded in `docs/runtimes.md`, the README ("Runtimes") and
//! `cri/dialect.rs` (how kruised
//! reads each). The binaries of the last two are no longer at hand; a dialect keeps what they
//! answered in a layer that always runs.
//!
//! | | containerd 1.6 | containerd 2.x | CRI-O |
//! |---|---|---|---|
//! | `Version.runtime_name` | `containerd` | `containerd` | `cri-o` |
//! | image ID (`ImageStatus`, `ListImages`, `PullImage`) | `sha256:<hex>` | `sha256:<hex>` | `<hex>` |
//! | container `image` | the image ID | the tag | the image ID |
//! | container `image_ref` (`ListContainers`) | the image ID | the image ID | the repo digest |
//! | container `image_ref` (`ContainerStatus`) | the repo digest | the repo digest | the repo digest |
//! | container `image_id` | empty | `sha256:<hex>` | `<hex>` |
//! | `GetContainerEvents` | Unimplemented | a stream | a stream; ends at once without `enable_pod_events` |
//! | sandbox events (`containerId` = the sandbox ID) | - | created, started, stopped, deleted | started, stopped |
//! | `containersStatuses` of an event | - | the sandbox's containers | always empty |
//! | `ExecSync` past its timeout | `DeadlineExceeded` | `DeadlineExceeded` | exit -1, "command timed out" |
//! | `RemoveImage` of a tag | the image, every tag | the image, every tag | that tag only |
//! | `ListContainerStats` of an exited container | listed | listed | not listed |
//!
//! Not recorded, so chosen here: CRI-O's `image` in `ContainerStatus` (as in its listing), the
//! gRPC codes and the full sentences of failed pulls and of containerd's exec timeout (the
//! recorded words are in them), and which container events a sandbox's removal sends (none).

use tonic::{Code, Status};

use super::super::proto;

/// A runtime the fake answers as, chosen when it starts ([`super::FakeRuntime::start_as`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Dialect {
    /// What the fake answered before it had dialects, and what [`super::FakeRuntime::start`]
    /// still answers under the name it is given: containerd 1.6's image fields (its own
    /// `sha256:` ID in `ContainerStatus.image_ref` too, and no repo digests), with container
    /// events carrying only the sandbox's ID. No real runtime answers exactly so; the tests
    /// written before the dialects keep it.
    #[default]
    Plain,
    /// containerd 1.6.20 (Debian bookworm): no container events.
    Containerd16,
    /// containerd 2.x (seen on 2.3.4): container and sandbox events with the sandbox's status
    /// and its containers' statuses; the tag in a container's `image`.
    Containerd2,
    /// CRI-O 1.36 with `enable_pod_events = true` (the end-to-end lab's setting): bare-hex image
    /// IDs, repo digests in `ListContainers`, events with empty container statuses.
    CriO,
    /// CRI-O 1.36 as it comes (`enable_pod_events = false`): `GetContainerEvents` ends at once,
    /// status OK, with no event.
    CriOWithoutPodEvents,
}

/// The three image fields of a container, as one call answers them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct ImageFields {
    pub image: String,
    pub image_ref: String,
    pub image_id: String,
}

/// The image a container was created from, as the fake knows it; each dialect names it from
/// these parts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImageOfContainer {
    /// The image ID as the runtime reports it (`sha256:<hex>`, or `<hex>` on CRI-O).
    pub id: String,
    /// The image's tag (`repo:tag`): the one the container was created by, else the image's
    /// first.
    pub tag: String,
    /// The image's repo digest (`repo@sha256:<digest>`) for that tag's repository; empty on
    /// [`Dialect::Plain`].
    pub repo_digest: String,
}

/// Which call answers a container's image fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Call {
    /// `ListContainers`.
    List,
    /// `ContainerStatus` (and the statuses in an event).
    Status,
}

impl Dialect {
    /// The name in `Version` (and so the kubelet's container ID prefix).
    pub fn runtime_name(self) -> &'static str {
        match self {
            Dialect::Plain | Dialect::Containerd16 | Dialect::Containerd2 => "containerd",
            Dialect::CriO | Dialect::CriOWithoutPodEvents => "cri-o",
        }
    }

    /// The runtime's version in `Version`.
    pub fn runtime_version(self) -> &'static str {
        match self {
            Dialect::Plain => "0.0.0-fake",
            Dialect::Containerd16 => "1.6.20~ds1",
            Dialect::Containerd2 => "v2.3.4",
            Dialect::CriO | Dialect::CriOWithoutPodEvents => "1.36.3",
        }
    }

    /// `Err` with its answer to `GetContainerEvents` where it does not have the call: what
    /// containerd 1.6 (Go gRPC) answers for a call its CRI v1 service lacks (its CRI API
    /// predates it). CRI-O without pod events has the call and ends it at once
    /// ([`super::FakeState::events_off`]).
    pub(super) fn events_call(self) -> Result<(), Status> {
        if self != Dialect::Containerd16 {
            return Ok(());
        }
        let message = "unknown method GetContainerEvents for service runtime.v1.RuntimeService";
        Err(Status::unimplemented(message))
    }

    fn is_crio(self) -> bool {
        matches!(self, Dialect::CriO | Dialect::CriOWithoutPodEvents)
    }

    /// Whether its images have full 64-digit IDs and repo digests (every real runtime; the
    /// plain fake keeps its old IDs, which the older tests print).
    pub(super) fn real_images(self) -> bool {
        self != Dialect::Plain
    }

    /// An image ID in this runtime's form, from its hex digits.
    pub(super) fn image_id(self, hex: &str) -> String {
        if self.is_crio() {
            hex.to_string()
        } else {
            format!("sha256:{hex}")
        }
    }

    /// A container's image fields as `call` answers them.
    pub(super) fn image_fields(self, image: &ImageOfContainer, call: Call) -> ImageFields {
        let by_id = self == Dialect::Plain || (call == Call::List && !self.is_crio());
        let by_tag = self == Dialect::Containerd2;
        ImageFields {
            image: if by_tag { &image.tag } else { &image.id }.clone(),
            image_ref: if by_id { &image.id } else { &image.repo_digest }.clone(),
            image_id: match self {
                Dialect::Plain | Dialect::Containerd16 => String::new(),
                _ => image.id.clone(),
            },
        }
    }

    /// Whether a sandbox's event of `kind` is sent (its `containerId` is the sandbox's ID).
    pub(super) fn sends_sandbox_event(self, kind: super::super::ContainerEventKind) -> bool {
        use super::super::ContainerEventKind as K;
        match self {
            Dialect::Containerd2 => true,
            Dialect::CriO | Dialect::CriOWithoutPodEvents => {
                matches!(kind, K::Started | K::Stopped)
            }
            Dialect::Plain | Dialect::Containerd16 => false,
        }
    }

    /// Whether an event carries the sandbox's whole status (else only its ID).
    pub(super) fn sends_sandbox_status(self) -> bool {
        !matches!(self, Dialect::Plain | Dialect::Containerd16)
    }

    /// Whether an event carries the statuses of the sandbox's containers.
    pub(super) fn sends_container_statuses(self) -> bool {
        self == Dialect::Containerd2
    }

    /// Whether it runs `sleep` (the plain fake answers it as a missing binary, as before).
    pub(super) fn runs_sleep(self) -> bool {
        self != Dialect::Plain
    }

    /// The answer to an `ExecSync` whose command outlived its `timeout` (in seconds).
    pub(super) fn exec_timed_out(self, timeout: i64) -> Result<proto::ExecSyncResponse, Status> {
        if self.is_crio() {
            // conmon's answer (`cri::dialect`)
            Ok(proto::ExecSyncResponse {
                stdout: vec![],
                stderr: b"command timed out".to_vec(),
                exit_code: -1,
            })
        } else {
            // the code was seen on containerd 1.6 and 2.3; the sentence is containerd's form
            Err(Status::deadline_exceeded(format!(
                "failed to exec in container: timeout {timeout}s exceeded: context deadline exceeded"
            )))
        }
    }

    /// Whether `RemoveImage` of one of an image's tags removes that tag only (CRI-O) rather
    /// than the image with every tag (containerd).
    pub(super) fn removes_only_the_tag(self) -> bool {
        self.is_crio()
    }

    /// Whether `ListContainerStats` lists exited containers (CRI-O has no figures for them).
    pub(super) fn lists_stats_of_exited(self) -> bool {
        !self.is_crio()
    }

    /// What a pull of a tag the registry does not have fails with: code and message. The words
    /// the end-to-end layer accepted on each runtime are "not found" (containerd) and "manifest
    /// unknown" (CRI-O) (`tests/support/lib.rs`, `LabRuntime::says_no_such_tag`); the rest of
    /// each sentence is the runtime's usual wording around them.
    pub fn missing_tag(self, image: &str) -> (Code, String) {
        let (repo, tag) = split_tag(image);
        if self.is_crio() {
            (
                Code::Unknown,
                format!(
                    "initializing source docker://{image}: reading manifest {tag} in {repo}: \
                     manifest unknown"
                ),
            )
        } else {
            (
                Code::NotFound,
                format!(
                    "failed to pull and unpack image \"{image}\": failed to resolve reference \
                     \"{image}\": {image}: not found"
                ),
            )
        }
    }

    /// What a pull without the login the registry wants fails with: code and message. The
    /// words the end-to-end layer accepted are "401 Unauthorized" (containerd 1.6),
    /// "authorization failed" (containerd 2.x) and "authentication required" (CRI-O)
    /// (`tests/support/lib.rs`, `LabRuntime::says_unauthorized`).
    pub fn unauthorized(self, image: &str) -> (Code, String) {
        let (repo, tag) = split_tag(image);
        let message = match self {
            Dialect::Plain | Dialect::Containerd16 => format!(
                "failed to pull and unpack image \"{image}\": failed to resolve reference \
                 \"{image}\": unexpected status from HEAD request: 401 Unauthorized"
            ),
            Dialect::Containerd2 => format!(
                "failed to pull and unpack image \"{image}\": failed to resolve image: pull \
                 access denied, repository does not exist or may require authorization: \
                 authorization failed: no basic auth credentials"
            ),
            Dialect::CriO | Dialect::CriOWithoutPodEvents => format!(
                "initializing source docker://{image}: reading manifest {tag} in {repo}: \
                 authentication required"
            ),
        };
        (Code::Unknown, message)
    }
}

/// `repo:tag` as repository and tag (`latest` when there is none).
pub(super) fn split_tag(image: &str) -> (&str, &str) {
    let image = image.split('@').next().unwrap_or(image);
    match image.rsplit_once(':') {
        Some((repo, tag)) if !tag.contains('/') => (repo, tag),
        _ => (image, "latest"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::dialect as reader;
    use crate::cri::{Container, ContainerState, Image};

    const HEX: &str = "6edf3ef45fce40a290a35e451487c6a93d275799bdd9c7ff8b78b97f7399f5e7";
    const DIGEST: &str =
        "r.io/app@sha256:c6227c8e0ba84c08b74e1c86df5c138e9680e2c5b6e2b8d9157751db200ce533";

    const DIALECTS: [Dialect; 4] = [
        Dialect::Containerd16,
        Dialect::Containerd2,
        Dialect::CriO,
        Dialect::CriOWithoutPodEvents,
    ];

    fn container(f: ImageFields) -> Container {
        Container {
            id: "c1".into(),
            pod_sandbox_id: "s1".into(),
            metadata: Default::default(),
            image: f.image,
            image_ref: f.image_ref,
            state: ContainerState::Running,
            created_at: 0,
            labels: Default::default(),
            annotations: Default::default(),
            image_id: f.image_id,
            image_spec: Default::default(),
        }
    }

    #[test]
    fn a_tag_splits_after_the_registry_port() {
        assert_eq!(
            split_tag("127.0.0.1:5000/test/busybox:v1"),
            ("127.0.0.1:5000/test/busybox", "v1")
        );
        assert_eq!(
            split_tag("127.0.0.1:5000/test/busybox"),
            ("127.0.0.1:5000/test/busybox", "latest")
        );
        assert_eq!(split_tag("r.io/app@sha256:ab"), ("r.io/app", "latest"));
    }

    /// The fake's fields are the ones `cri::dialect` was written from: kruised reads each
    /// runtime's container as running its image, by the image's own ID.
    #[test]
    fn each_dialects_container_fields_read_as_the_image_the_runtime_reports() {
        for d in DIALECTS {
            let id = d.image_id(HEX);
            let of = ImageOfContainer {
                id: id.clone(),
                tag: "r.io/app:v1".into(),
                repo_digest: DIGEST.into(),
            };
            let image = Image {
                id: id.clone(),
                repo_tags: vec![of.tag.clone()],
                repo_digests: vec![DIGEST.into()],
                ..Default::default()
            };
            for call in [Call::List, Call::Status] {
                let c = container(d.image_fields(&of, call));
                assert!(reader::runs_image(&image, &c), "{d:?} {call:?}: {c:?}");
                if call == Call::List {
                    assert_eq!(
                        reader::container_image_id(&c),
                        Some(format!("sha256:{HEX}")),
                        "{d:?}"
                    );
                }
            }
            assert_eq!(
                d.image_fields(&of, Call::Status).image_ref,
                DIGEST,
                "{d:?}: ContainerStatus reports the repo digest on every runtime"
            );
            assert!(reader::is_image_id(&id), "{d:?}: {id}");
        }
    }

    #[test]
    fn each_dialects_exec_timeout_reads_as_a_timeout() {
        for d in DIALECTS {
            match d.exec_timed_out(1) {
                Ok(r) => {
                    let r = crate::cri::ExecResult {
                        stdout: r.stdout,
                        stderr: r.stderr,
                        exit_code: r.exit_code,
                    };
                    assert!(reader::exec_timed_out(&r), "{d:?}");
                }
                Err(s) => assert_eq!(s.code(), Code::DeadlineExceeded, "{d:?}"),
            }
        }
    }
}
