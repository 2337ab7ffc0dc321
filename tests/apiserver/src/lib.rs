//! `apiserver_double`: an in-memory Kubernetes API server for kruised's tests.
//!
//! It speaks the subset of the kube-apiserver HTTP API a node daemon relies on,
//! over plain HTTP on loopback (or, with [`Config::tls`], over TLS with HTTP/2 and HTTP/1.1
//! as the real server serves them), so the real `kube` client (`Client`, `Api<K>`,
//! `kube::runtime::watcher`) can talk to it unchanged. Its answers were checked
//! against a real kube-apiserver v1.36 with OpenKruise's CRDs: `CONFORMANCE.md`
//! lists every behaviour compared, and the tests in `tests/api` name them.
//!
//! * core `v1` pods, events, secrets, namespaces, nodes, serviceaccounts;
//!   `events.k8s.io/v1` events (shared storage with core events, converted like
//!   the real server); `apps/v1` DaemonSets (stored and patched only: no
//!   controller, no ControllerRevisions, no pods); `rbac.authorization.k8s.io/v1`
//!   ClusterRoles, Roles and their bindings;
//!   OpenKruise's custom resources as its CRDs serve them ([`kruise_kinds`]):
//!   NodeImage, ContainerRecreateRequest and ImagePullJob at `v1beta1`
//!   (storage) and `v1alpha1`, NodePodProbe and PodProbeMarker at `v1alpha1`,
//!   with a status subresource and each version's structural schema: unknown
//!   fields pruned (with `Warning` headers), defaults applied, types, formats,
//!   `required`, `enum`, bounds and patterns validated with ratcheting, and a
//!   read or write through `v1alpha1` dropping what only `v1beta1` has
//!   ([`default_kinds_v1alpha1_only`] serves `v1alpha1` alone; extend through
//!   [`Config::kinds`]);
//! * GET/LIST (selectors, `limit`/`continue`), WATCH (replay from a
//!   resourceVersion, `sendInitialEvents`, bookmarks as the watch cache sends
//!   them, `timeoutSeconds`, 410 after compaction), POST, PUT, PATCH (merge,
//!   JSON, strategic with the real list ordering, apply), DELETE with
//!   finalizers, `/status` subresources and discovery;
//! * authentication and RBAC when turned on ([`Config::tokens`], [`Config::rbac`],
//!   [`Control::add_token`], [`Control::set_rbac`]): bearer tokens to users
//!   ([`UserInfo::service_account`]), `401` for a token nobody issued, every
//!   request authorized by the ClusterRoles, Roles and bindings in the store
//!   (loaded from YAML with [`Control::apply_manifests`] or created through the
//!   API) with the real `403` bodies, the default discovery roles, and each
//!   request's user recorded ([`RequestRecord::user`], [`Control::refusals`]);
//! * admission hooks for a resource's create and update, main resource only
//!   ([`Control::add_mutating_admission`], [`Control::add_validating_admission`]):
//!   in-process closures in place of webhooks, called before the write is
//!   stored, able to change the object or refuse it with the real server's
//!   denial (`admission webhook "<name>" denied the request: <message>`);
//! * a test control API ([`Control`], also under `/_double/` over HTTP) to
//!   seed objects, compact, drop watches, inject faults and delays, hold a
//!   request or a resource's watch events until released ([`Hold`]), count and
//!   log requests, stop serving and serve again on the same address with the
//!   store kept ([`Control::stop_serving`], [`Control::start_serving`]), and wait
//!   for conditions without sleeping: what a real server cannot do on demand.
//!
//! Where it knowingly differs from kube-apiserver:
//!
//! * server-side apply is "create if absent, else strategic merge (core kinds)
//!   or merge patch (custom kinds)": no managedFields, no field ownership, no
//!   apply conflicts, no removal of fields dropped from the applied config;
//! * built-in kinds have no schema: no defaulting of pod specs (only `status:
//!   {phase: Pending, qosClass}` on create, `type: Opaque` for secrets,
//!   namespace finalizers/phase), unknown fields kept (only unknown `metadata`
//!   fields are dropped), and validation only covers names, labels,
//!   annotations, finalizers during deletion, events' namespaces and the
//!   pod-spec update rule (its message lacks the real server's diff); typed
//!   zero values the real server prints (`lastProbeTime: null`,
//!   `eventTime: null`) are absent;
//! * custom resources: CEL rules (`x-kubernetes-validations`) and `int64`
//!   ranges are not checked (kruise's CRDs have none of the former); only
//!   conversion strategy `None` exists (no webhooks), like kruise's CRDs
//!   without kruise-manager;
//! * pods are deleted at once (no kubelet, so no graceful deletion: the real
//!   server keeps them with a `deletionTimestamp`); deleting a namespace
//!   removes it and its contents at once; no garbage collection by
//!   ownerReferences (the real pod GC also deletes pods bound to missing
//!   nodes); no built-in admission plugins, and webhooks only as in-process
//!   hooks (no `AdmissionReview` over HTTPS, no match or object selectors,
//!   no reinvocation, no timeouts or `failurePolicy`: a hook's refusal always
//!   refuses); no authentication or authorization unless turned on
//!   (then any token works, and every request is allowed); with them on: no
//!   aggregated ClusterRoles (`aggregationRule`), no escalation check on writes
//!   of roles and bindings, no impersonation, no client certificates, and no
//!   authorizer but RBAC and the `system:masters` bypass (no Node authorizer);
//! * LIST with an old `resourceVersion` (any match, `Exact` included) returns
//!   the current state; GET ignores `resourceVersion`; continue tokens are
//!   opaque `{snapshot}-{rv}-{position}` strings that stay valid until
//!   [`Control::compact`] (the real server keeps serving them from its watch
//!   cache even after etcd compaction); watches older than the last
//!   compaction get the real `410 Expired` ERROR event, but only when the test
//!   compacts (or `history_limit` overflows); JSON only, never protobuf or CBOR.
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! let server = apiserver_double::ApiServer::start("127.0.0.1:0".parse().unwrap()).await?;
//! server.write_kubeconfig("/tmp/kubeconfig")?;
//! server.create("nodes", serde_json::json!({"metadata": {"name": "node-1"}})).unwrap();
//! # Ok(()) }
//! ```

mod admission;
mod auth;
mod control;
mod discovery;
mod hold;
mod http;
mod kinds;
mod list;
mod listen;
mod ops;
mod patch;
mod rbac;
mod schema;
mod selectors;
mod server;
mod status;
mod store;
mod util;
mod watch;

pub use admission::{AdmissionRequest, Denial, MutatingFn, Operation, ValidatingFn};
pub use auth::{AUTHENTICATED, DEFAULT_TOKEN, MASTERS, UNAUTHENTICATED, UserInfo};
pub use control::{Control, Fault, RequestLog, RequestRecord, WaitTimeout};
pub use hold::Hold;
pub use kinds::{
    Conversion, FieldKey, KindInfo, StatusOnCreate, default_kinds, default_kinds_v1alpha1_only,
    kruise_kinds,
};
pub use listen::{TEST_CA_PEM, Tls};
pub use patch::{ListStrategy, PatchType, merge_key, strategic_merge};
pub use schema::{Cause, Schema, kruise_schema};
pub use selectors::{FieldSelector, LabelSelector, Selectors};
pub use server::{
    ApiServer, Config, Handle, kubeconfig_for, kubeconfig_with_ca, kubeconfig_with_token,
};
pub use status::{ApiError, reason_for_code};
pub use store::{EventType, StoreView};
