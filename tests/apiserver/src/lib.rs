//! `apiserver_double`: an in-memory Kubernetes API server for kruised's tests.
//!
//! It speaks the subset of the kube-apiserver HTTP API a node daemon relies on,
//! over plain HTTP on loopback, so the real `kube` client (`Client`, `Api<K>`,
//! `kube::runtime::watcher`) can talk to it unchanged:
//!
//! * core `v1` pods, events, secrets, namespaces, nodes; `events.k8s.io/v1`
//!   events (shared storage with core events, converted like the real server);
//!   `apps.kruise.io/v1alpha1` NodeImage, ContainerRecreateRequest and
//!   NodePodProbe as custom resources with a status subresource
//!   ([`default_kinds`]; extend through [`Config::kinds`]);
//! * GET/LIST (selectors, `limit`/`continue`), WATCH (replay from a
//!   resourceVersion, bookmarks, `timeoutSeconds`, 410 after compaction),
//!   POST, PUT, PATCH (merge, JSON, strategic, apply), DELETE with
//!   finalizers, `/status` subresources and discovery;
//! * a test control API ([`Control`], also under `/_double/` over HTTP) to
//!   seed objects, compact, drop watches, inject faults and delays, count and
//!   log requests, and wait for conditions without sleeping.
//!
//! Where it knowingly differs from kube-apiserver:
//!
//! * server-side apply is "create if absent, else strategic merge (core kinds)
//!   or merge patch (custom kinds)": no managedFields, no field ownership, no
//!   apply conflicts, no removal of fields dropped from the applied config;
//! * no defaulting of pod specs (only `status: {phase: Pending, qosClass}` on
//!   create, `type: Opaque` for secrets, namespace finalizers/phase), and
//!   validation only covers names, labels, annotations, finalizers during
//!   deletion and the pod-spec update rule (images, activeDeadlineSeconds,
//!   tolerations, terminationGracePeriodSeconds and schedulingGates may change);
//! * pods are deleted at once (no kubelet, so no graceful deletion); deleting a
//!   namespace removes it and its contents at once; no garbage collection by
//!   ownerReferences; no admission, authentication or RBAC (any token works);
//! * LIST with an old `resourceVersion` (any match) returns the current state;
//!   GET ignores `resourceVersion`; JSON only, never protobuf or CBOR.
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! let server = apiserver_double::ApiServer::start("127.0.0.1:0".parse().unwrap()).await?;
//! server.write_kubeconfig("/tmp/kubeconfig")?;
//! server.create("nodes", serde_json::json!({"metadata": {"name": "node-1"}})).unwrap();
//! # Ok(()) }
//! ```

mod control;
mod discovery;
mod http;
mod kinds;
mod list;
mod ops;
mod patch;
mod selectors;
mod server;
mod status;
mod store;
mod util;
mod watch;

pub use control::{Control, Fault, RequestLog, RequestRecord, WaitTimeout};
pub use kinds::{Conversion, FieldKey, KindInfo, StatusOnCreate, default_kinds};
pub use patch::{ListStrategy, PatchType, merge_key};
pub use selectors::{FieldSelector, LabelSelector, Selectors};
pub use server::{ApiServer, Config, Handle, kubeconfig_for};
pub use status::{ApiError, reason_for_code};
pub use store::{EventType, StoreView};
