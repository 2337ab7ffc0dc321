//! The test control API: seed and mutate objects directly (still bumping the
//! RV and emitting watch events), compact history, drop watches, inject
//! failures and delays, inspect request counts and the request log, and wait
//! for conditions without sleeping. The same operations are served over HTTP
//! under `/_double/` for the standalone binary (see [`handle_http`]).

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::admission::{AdmissionRequest, Denial, Hook, Operation};
use crate::auth::{AuthState, UserInfo};
use crate::hold::lock;
use crate::http::Params;
use crate::ops::{self, Origin, Preconditions};
use crate::server::Shared;
use crate::status::ApiError;
use crate::store::StoreView;

/// An injected failure: answer the next `count` requests that match `verb`
/// and `resource` (both optional) with a `Status` of `code`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Fault {
    /// How many requests to fail.
    pub count: usize,
    /// HTTP code (500, 409, 429, 503, ...).
    pub code: u16,
    /// Only requests with this verb (`get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, `deletecollection`).
    pub verb: Option<String>,
    /// Only requests for this resource (`pods`, `pods/status`, ...).
    pub resource: Option<String>,
    /// `Retry-After` seconds (defaults to 1 for 429 and 503).
    pub retry_after_seconds: Option<u64>,
    /// Message for the `Status` (a generic one if absent).
    pub message: Option<String>,
}

/// Injected failures and delay.
#[derive(Debug, Default)]
pub(crate) struct Faults {
    rules: Vec<Fault>,
    pub delay: Duration,
}

impl Faults {
    /// Consume one matching rule, if any, and return the error to answer.
    pub(crate) fn take(&mut self, verb: &str, resource: &str) -> Option<ApiError> {
        let rule = self.rules.iter_mut().find(|r| {
            r.count > 0
                && r.verb.as_deref().is_none_or(|v| v == verb)
                && r.resource.as_deref().is_none_or(|x| x == resource)
        })?;
        rule.count -= 1;
        let message = rule
            .message
            .clone()
            .unwrap_or_else(|| format!("injected failure {} for {verb} {resource}", rule.code));
        let mut err = ApiError::from_code(rule.code, message);
        err.retry_after = rule
            .retry_after_seconds
            .or(matches!(rule.code, 429 | 503).then_some(1));
        self.rules.retain(|r| r.count > 0);
        Some(err)
    }
}

/// One request the server received (control requests under `/_double/` excluded).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestRecord {
    pub method: String,
    pub path: String,
    pub query: String,
    pub content_type: Option<String>,
    pub user_agent: Option<String>,
    /// Request body as text (lossy UTF-8).
    pub body: String,
    /// `get|list|watch|create|update|patch|delete|deletecollection`, empty for non-resource paths.
    pub verb: String,
    /// `plural` or `plural/subresource`, empty for non-resource paths.
    pub resource: String,
    /// Namespace from the path.
    pub namespace: Option<String>,
    /// Object name from the path.
    pub name: Option<String>,
    /// Who sent it, when authentication is on ([`Config::tokens`](crate::Config::tokens)):
    /// a token's user, or `system:anonymous`; `None` when it is off or the token was refused.
    pub user: Option<String>,
    /// `401` or `403` when authentication or RBAC refused the request (it was not served);
    /// `None` for every request that got past them.
    pub refused: Option<u16>,
    /// When it arrived (set for every request served; not in the JSON of `/_double/`).
    #[serde(skip)]
    pub at: Option<std::time::Instant>,
}

impl RequestRecord {
    /// The request body parsed as JSON (`Null` if it is not JSON).
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }
}

const LOG_LIMIT: usize = 10_000;

/// Request counts by `(verb, resource)` and by user, and the most recent requests.
#[derive(Debug, Default)]
pub struct RequestLog {
    counts: BTreeMap<(String, String), usize>,
    /// By `(user, verb, resource)`, every request however long the run (an audit log's sums).
    by_user: BTreeMap<(String, String, String), u64>,
    /// Requests recorded in all.
    total: u64,
    refused: Vec<RequestRecord>,
    log: VecDeque<RequestRecord>,
}

impl RequestLog {
    pub(crate) fn push(&mut self, rec: RequestRecord) {
        if !rec.verb.is_empty() {
            *self
                .counts
                .entry((rec.verb.clone(), rec.resource.clone()))
                .or_default() += 1;
        }
        if let Some(user) = &rec.user {
            *self
                .by_user
                .entry((user.clone(), rec.verb.clone(), rec.resource.clone()))
                .or_default() += 1;
        }
        self.total += 1;
        if rec.refused.is_some() && self.refused.len() < LOG_LIMIT {
            self.refused.push(rec.clone());
        }
        self.log.push_back(rec);
        while self.log.len() > LOG_LIMIT {
            self.log.pop_front();
        }
    }

    /// Requests counted for `(verb, resource)`, e.g. `("patch", "pods/status")`.
    pub fn count(&self, verb: &str, resource: &str) -> usize {
        self.counts
            .get(&(verb.to_string(), resource.to_string()))
            .copied()
            .unwrap_or(0)
    }

    /// The retained requests, oldest first (at most the last 10 000).
    pub fn records(&self) -> impl Iterator<Item = &RequestRecord> {
        self.log.iter()
    }

    /// The requests refused with `401` or `403`, oldest first (the first 10 000, however many
    /// requests came after).
    pub fn refused(&self) -> &[RequestRecord] {
        &self.refused
    }
}

/// A condition awaited with [`Control::wait_for`] did not hold in time.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("condition not met within {0:?}")]
pub struct WaitTimeout(pub Duration);

/// Test control handle; cheap to clone. Resources are named `pods`, `Pod`,
/// `nodeimages`, `nodeimages.apps.kruise.io`, `events.events.k8s.io` or
/// `group/version/plural`; namespaces are `""` for cluster-scoped kinds.
#[derive(Clone)]
pub struct Control {
    pub(crate) shared: Arc<Shared>,
}

impl Control {
    pub(crate) fn kind(&self, resource: &str) -> Result<usize, ApiError> {
        self.shared
            .kinds
            .resolve(resource)
            .ok_or_else(ApiError::no_such_resource)
    }

    fn ns_arg<'a>(&self, kidx: usize, ns: &'a str) -> Option<&'a str> {
        self.shared.kinds.get(kidx).namespaced.then_some(ns)
    }

    fn lock_requests(&self) -> MutexGuard<'_, RequestLog> {
        lock(&self.shared.requests)
    }

    fn write_auth(&self) -> std::sync::RwLockWriteGuard<'_, AuthState> {
        self.shared.auth.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Replace the bearer tokens ([`Config::tokens`](crate::Config::tokens)); `None` turns
    /// authentication off.
    pub fn set_tokens(&self, tokens: Option<BTreeMap<String, UserInfo>>) {
        self.write_auth().tokens = tokens;
    }

    /// Let `token` authenticate as `user`. Turns authentication on if it was off; then the
    /// default kubeconfig's token ([`DEFAULT_TOKEN`](crate::DEFAULT_TOKEN)) is the cluster
    /// admin's ([`UserInfo::admin`]), as a real cluster's admin kubeconfig is, unless mapped
    /// otherwise.
    pub fn add_token(&self, token: &str, user: UserInfo) {
        let mut auth = self.write_auth();
        let tokens = auth.tokens.get_or_insert_with(|| {
            BTreeMap::from([(crate::auth::DEFAULT_TOKEN.to_string(), UserInfo::admin())])
        });
        tokens.insert(token.to_string(), user);
    }

    /// Turn RBAC authorization ([`Config::rbac`](crate::Config::rbac)) on or off. Turning it
    /// on creates the real server's default discovery roles and bindings that are missing.
    pub fn set_rbac(&self, on: bool) -> Result<(), ApiError> {
        if on {
            self.shared.store.write(crate::rbac::bootstrap)?;
        }
        self.write_auth().rbac = on;
        Ok(())
    }

    /// Apply a multi-document YAML text of manifests of served kinds (`deploy/rbac.yaml`: a
    /// ServiceAccount, ClusterRoles and bindings, Roles and bindings, Namespaces): each object
    /// is created, or the fields its document has are set on the one that exists (labels and
    /// annotations merged), as `kubectl apply` does. Namespaces are created as needed; a kind
    /// the double does not serve is an error and nothing is applied. Returns the objects.
    pub fn apply_manifests(&self, yaml: &str) -> Result<Vec<Value>, ApiError> {
        self.shared
            .store
            .write(|st| crate::rbac::apply_manifests(st, yaml))
    }

    /// Register a mutating admission hook named `name` (the webhook's name in a denial) for
    /// `operations` on the main resource `group`/`resource` (plural; every version): HTTP
    /// writes call it before the object is stored, after the hooks registered before it, with
    /// the object in the request's version. It may change [`AdmissionRequest::object`] or
    /// refuse with a [`Denial`], answered as the real server answers a webhook's. Writes
    /// through this control API and `/status` writes are not admitted. The hook runs under the
    /// store lock: it reads other objects through [`AdmissionRequest::store`], never through a
    /// [`Control`].
    ///
    /// [`AdmissionRequest::object`]: crate::AdmissionRequest::object
    /// [`AdmissionRequest::store`]: crate::AdmissionRequest::store
    /// [`Denial`]: crate::Denial
    pub fn add_mutating_admission(
        &self,
        name: &str,
        group: &str,
        resource: &str,
        operations: &[Operation],
        hook: impl Fn(&mut AdmissionRequest<'_>) -> Result<(), Denial> + Send + Sync + 'static,
    ) {
        let hook = Hook::Mutating(Arc::new(hook));
        self.shared
            .store
            .write(|st| st.admission.add(name, group, resource, operations, hook));
    }

    /// Register a validating admission hook, as [`Control::add_mutating_admission`] does a
    /// mutating one: it runs after every mutating hook and the schema's validation, on the
    /// object as it would be stored, and may only refuse.
    pub fn add_validating_admission(
        &self,
        name: &str,
        group: &str,
        resource: &str,
        operations: &[Operation],
        hook: impl Fn(&AdmissionRequest<'_>) -> Result<(), Denial> + Send + Sync + 'static,
    ) {
        let hook = Hook::Validating(Arc::new(hook));
        self.shared
            .store
            .write(|st| st.admission.add(name, group, resource, operations, hook));
    }

    /// A kubeconfig (YAML) pointing at this server whose user sends `token`.
    pub fn kubeconfig_with_token(&self, token: &str) -> String {
        crate::server::kubeconfig_with_token(&format!("http://{}", self.shared.addr), token)
    }

    /// Create an object as given, `.status` included (namespace defaults to
    /// `default` and is created if missing). Emits ADDED.
    pub fn create(&self, resource: &str, obj: Value) -> Result<Value, ApiError> {
        let kidx = self.kind(resource)?;
        self.shared
            .store
            .write(|st| ops::create(st, kidx, None, obj, Origin::Control, false))
    }

    /// Replace an object wholesale (`.status` included, no resourceVersion
    /// precondition). Removing the last finalizer of a deleting object deletes it.
    pub fn update(&self, resource: &str, obj: Value) -> Result<Value, ApiError> {
        let kidx = self.kind(resource)?;
        self.shared
            .store
            .write(|st| ops::control_update(st, kidx, None, None, obj))
    }

    /// Change an object in place with `f`, atomically.
    pub fn modify(
        &self,
        resource: &str,
        namespace: &str,
        name: &str,
        f: impl FnOnce(&mut Value),
    ) -> Result<Value, ApiError> {
        let kidx = self.kind(resource)?;
        let ns = self.ns_arg(kidx, namespace);
        self.shared.store.write(|st| {
            let obj = st.served(kidx, ns.unwrap_or(""), name);
            let mut obj = obj.ok_or_else(|| ApiError::not_found(st.kinds.get(kidx), name))?;
            f(&mut obj);
            ops::control_update(st, kidx, ns, Some(name), obj)
        })
    }

    /// Apply an RFC 7386 merge patch to any part of an object (status included).
    pub fn merge_patch(
        &self,
        resource: &str,
        namespace: &str,
        name: &str,
        patch: &Value,
    ) -> Result<Value, ApiError> {
        self.modify(resource, namespace, name, |obj| {
            json_patch::merge(obj, patch)
        })
    }

    /// Delete like a client would: objects with finalizers only get a
    /// `deletionTimestamp`. Emits DELETED or MODIFIED.
    pub fn delete(&self, resource: &str, namespace: &str, name: &str) -> Result<Value, ApiError> {
        let kidx = self.kind(resource)?;
        let ns = self.ns_arg(kidx, namespace);
        self.shared
            .store
            .write(|st| ops::delete(st, kidx, ns, name, &Preconditions::default(), false))
            .map(|(v, _)| v)
    }

    /// Remove an object at once, finalizers or not. Emits DELETED.
    pub fn force_delete(&self, resource: &str, namespace: &str, name: &str) -> Option<Value> {
        let kidx = self.kind(resource).ok()?;
        self.shared
            .store
            .write(|st| ops::force_remove(st, kidx, namespace, name))
    }

    pub fn get(&self, resource: &str, namespace: &str, name: &str) -> Option<Value> {
        self.shared
            .store
            .read(|st| StoreView { state: st }.get(resource, namespace, name))
    }

    /// All objects of a resource in `namespace` (or everywhere with `None`).
    pub fn list(&self, resource: &str, namespace: Option<&str>) -> Vec<Value> {
        self.shared
            .store
            .read(|st| StoreView { state: st }.list(resource, namespace))
    }

    /// The current global resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.shared.store.read(|st| st.rv)
    }

    /// Make every resourceVersion up to now too old: new watches from such an
    /// RV get `410 Expired`, old continue tokens too. The global RV moves on by
    /// one so a fresh LIST yields a watchable RV. Returns the compaction point.
    pub fn compact(&self) -> u64 {
        self.shared.store.write(|st| st.compact())
    }

    /// Abort every open watch connection, as a network drop would.
    pub fn drop_watches(&self) {
        self.shared.drop_tx.send_modify(|g| *g += 1);
    }

    /// Number of watch streams currently open.
    pub fn open_watches(&self) -> usize {
        self.shared.open_watches.load(Ordering::SeqCst)
    }

    /// Answer the next `n` requests matching `verb` and `resource` (when
    /// given) with a `Status` of `code` (429/503 carry `Retry-After: 1`).
    pub fn fail_next(&self, n: usize, code: u16, verb: Option<&str>, resource: Option<&str>) {
        self.add_fault(Fault {
            count: n,
            code,
            verb: verb.map(str::to_string),
            resource: resource.map(str::to_string),
            ..Fault::default()
        });
    }

    /// Register a fully specified [`Fault`].
    pub fn add_fault(&self, fault: Fault) {
        if fault.count > 0 {
            lock(&self.shared.faults).rules.push(fault);
        }
    }

    pub fn clear_faults(&self) {
        lock(&self.shared.faults).rules.clear();
    }

    /// Delay every API response by `delay` (zero turns it off).
    pub fn set_delay(&self, delay: Duration) {
        lock(&self.shared.faults).delay = delay;
    }

    /// Requests counted for `(verb, resource)`, e.g. `("patch", "pods/status")`.
    pub fn request_count(&self, verb: &str, resource: &str) -> usize {
        self.lock_requests().count(verb, resource)
    }

    /// All counts by `(verb, resource)`.
    pub fn request_counts(&self) -> BTreeMap<(String, String), usize> {
        self.lock_requests().counts.clone()
    }

    /// The retained request log, oldest first.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.lock_requests().log.iter().cloned().collect()
    }

    /// Requests counted for `user` (authentication on), e.g.
    /// `"system:serviceaccount:kruise-system:kruised"`.
    pub fn request_count_by_user(&self, user: &str) -> usize {
        let log = self.lock_requests();
        let of_user = log.by_user.iter().filter(|((u, ..), _)| u == user);
        of_user.map(|(_, n)| *n as usize).sum()
    }

    /// Requests so far by `(user, verb, resource)` (authentication on), refused ones included,
    /// and how many requests there were in all: what an audit log sums up, however long the run
    /// (the request log keeps only the last 10 000).
    pub fn request_counts_by_user(&self) -> (BTreeMap<(String, String, String), u64>, u64) {
        let log = self.lock_requests();
        (log.by_user.clone(), log.total)
    }

    /// Every request refused by authentication (`401`) or RBAC (`403`), oldest first.
    pub fn refusals(&self) -> Vec<RequestRecord> {
        self.lock_requests().refused.clone()
    }

    /// Clear the request counts, the refusals and the request log.
    pub fn reset_requests(&self) {
        let mut log = self.lock_requests();
        let total = log.total;
        *log = RequestLog {
            total,
            ..RequestLog::default()
        };
    }

    /// Wait until `pred` holds for the store, re-checking after every write.
    pub async fn wait_for(
        &self,
        timeout: Duration,
        mut pred: impl FnMut(&StoreView<'_>) -> bool,
    ) -> Result<(), WaitTimeout> {
        self.wait_for_value(timeout, |v| pred(v).then_some(()))
            .await
    }

    /// Wait until `f` returns `Some`, re-checking after every write.
    pub async fn wait_for_value<T>(
        &self,
        timeout: Duration,
        mut f: impl FnMut(&StoreView<'_>) -> Option<T>,
    ) -> Result<T, WaitTimeout> {
        let rx = self.shared.store.subscribe();
        let read = || self.shared.store.read(|st| f(&StoreView { state: st }));
        wait_on(timeout, rx, read).await
    }

    /// Wait until `pred` holds for the request log, re-checking after every request.
    pub async fn wait_for_requests(
        &self,
        timeout: Duration,
        mut pred: impl FnMut(&RequestLog) -> bool,
    ) -> Result<(), WaitTimeout> {
        let rx = self.shared.requests_tx.subscribe();
        wait_on(timeout, rx, || pred(&self.lock_requests()).then_some(())).await
    }

    /// Record a request (called by the HTTP layer).
    pub(crate) fn record(&self, rec: RequestRecord) {
        self.lock_requests().push(rec);
        self.shared.requests_tx.send_modify(|n| *n += 1);
    }

    /// Delay and fault for a request (called by the HTTP layer).
    pub(crate) fn fault_for(&self, verb: &str, resource: &str) -> (Duration, Option<ApiError>) {
        let mut f = lock(&self.shared.faults);
        let delay = f.delay;
        (delay, f.take(verb, resource))
    }
}

/// Waits until `check` gives a value, checking again after every change `rx` tells of.
async fn wait_on<T>(
    timeout: Duration,
    mut rx: tokio::sync::watch::Receiver<u64>,
    mut check: impl FnMut() -> Option<T>,
) -> Result<T, WaitTimeout> {
    let deadline = Instant::now() + timeout;
    loop {
        rx.borrow_and_update();
        if let Some(v) = check() {
            return Ok(v);
        }
        match tokio::time::timeout_at(deadline, rx.changed()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) | Err(_) => return Err(WaitTimeout(timeout)),
        }
    }
}

/// Serve a `/_double/...` control request. Returns `(status, JSON body)`.
pub(crate) fn handle_http(
    control: &Control,
    method: &str,
    path: &str,
    params: &Params,
    body: &[u8],
) -> (u16, Value) {
    let created = method == "POST" && path.starts_with("/_double/objects/");
    match control_request(control, method, path, params, body) {
        Ok(v) => (if created { 201 } else { 200 }, v),
        Err(e) => (e.code, e.to_status()),
    }
}

fn control_request(
    control: &Control,
    method: &str,
    path: &str,
    params: &Params,
    body: &[u8],
) -> Result<Value, ApiError> {
    let q = |k: &str| params.get(k);
    let ns = q("namespace").unwrap_or("");
    if (method, path) == ("POST", "/_double/manifests") {
        // YAML, not JSON
        let items = control.apply_manifests(&String::from_utf8_lossy(body))?;
        return Ok(json!({"items": items}));
    }
    let bad_body = |what: &'static str| {
        move |e: serde_json::Error| ApiError::bad_request(format!("{what}: {e}"))
    };
    let body: Value = match body.is_empty() {
        true => Value::Null,
        false => serde_json::from_slice(body).map_err(bad_body("invalid JSON body"))?,
    };
    let segs: Vec<&str> = path
        .trim_start_matches("/_double/")
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let found = |object: Option<Value>, res: &str, name: &str| {
        let missing = format!("{res} {name:?} not found");
        object.ok_or_else(|| ApiError::new(404, "NotFound", missing))
    };
    let done = json!({});
    match (method, segs.as_slice()) {
        ("GET", ["objects", res]) => Ok(json!({"items": control.list(res, q("namespace"))})),
        ("GET", ["objects", res, name]) => found(control.get(res, ns, name), res, name),
        ("POST", ["objects", res]) => control.create(res, body),
        ("PUT", ["objects", res]) => control.update(res, body),
        ("PATCH", ["objects", res, name]) => control.merge_patch(res, ns, name, &body),
        ("DELETE", ["objects", res, name]) if q("force") == Some("true") => {
            found(control.force_delete(res, ns, name), res, name)
        }
        ("DELETE", ["objects", res, name]) => control.delete(res, ns, name),
        ("GET", ["resource-version"]) => Ok(json!({"resourceVersion": control.resource_version()})),
        ("POST", ["compact"]) => {
            let compacted = control.compact();
            Ok(json!({"compacted": compacted, "resourceVersion": control.resource_version()}))
        }
        ("POST", ["drop-watches"]) => {
            let open = control.open_watches();
            control.drop_watches();
            Ok(json!({"dropped": open}))
        }
        ("GET", ["watches"]) => Ok(json!({"open": control.open_watches()})),
        ("POST", ["fail-next"]) => {
            let fault = serde_json::from_value::<Fault>(body).map_err(bad_body("invalid fault"))?;
            control.add_fault(fault);
            Ok(done)
        }
        ("DELETE", ["fail-next"]) => {
            control.clear_faults();
            Ok(done)
        }
        ("PUT", ["delay"]) => {
            let ms = body.get("millis").and_then(Value::as_u64);
            let ms = ms.ok_or_else(|| ApiError::bad_request("expected {\"millis\": N}"))?;
            control.set_delay(Duration::from_millis(ms));
            Ok(json!({"millis": ms}))
        }
        ("GET", ["counts"]) => {
            let counts: Vec<Value> = control
                .request_counts()
                .into_iter()
                .map(|((verb, resource), count)| {
                    json!({"verb": verb, "resource": resource, "count": count})
                })
                .collect();
            Ok(json!({"counts": counts}))
        }
        ("GET", ["requests"]) => Ok(json!({"requests": control.requests()})),
        ("GET", ["refusals"]) => Ok(json!({"requests": control.refusals()})),
        ("PUT", ["tokens"]) => {
            let expected = r#"expected {"<token>": {"name": ..., "groups": [...]}} or null"#;
            let tokens = serde_json::from_value::<Option<BTreeMap<String, UserInfo>>>(body)
                .map_err(bad_body(expected))?;
            control.set_tokens(tokens);
            Ok(done)
        }
        ("PUT", ["rbac"]) => {
            let on = body.get("enabled").and_then(Value::as_bool);
            let on =
                on.ok_or_else(|| ApiError::bad_request("expected {\"enabled\": true|false}"))?;
            control.set_rbac(on)?;
            Ok(json!({"enabled": on}))
        }
        ("DELETE", ["counts"]) | ("DELETE", ["requests"]) => {
            control.reset_requests();
            Ok(done)
        }
        _ => Err(ApiError::no_such_resource()),
    }
}
