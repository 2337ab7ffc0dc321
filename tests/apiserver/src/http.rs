//! The HTTP front: routing of kube-apiserver paths, request accounting, fault
//! injection and delays, and the handlers for every verb. JSON only; protobuf
//! is never offered, so clients fall back to JSON as they do with CRDs.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use hyper::{Request, Response, StatusCode};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::auth::{self, ResourcePath, UserInfo};
use crate::control::{self, Control, RequestRecord};
use crate::discovery;
use crate::kinds::{KindInfo, Kinds};
use crate::list;
use crate::ops::{self, Origin, Preconditions, Sub};
use crate::patch::PatchType;
use crate::selectors::Selectors;
use crate::server::Shared;
use crate::status::ApiError;
use crate::store::{State, Store};
use crate::util::{parse_query, segments};
use crate::watch::{self, Start, WatchRequest};

/// Response body type for every response (watch bodies may abort with an error).
pub(crate) type Body = BoxBody<Bytes, io::Error>;

/// The real server refuses bodies over 3 MiB.
const MAX_BODY: usize = 3 * 1024 * 1024;
/// Watch duration when `timeoutSeconds` is absent (the real server picks 30–60 min).
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);

fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

fn json_response(code: u16, v: &Value) -> Response<Body> {
    let mut r = Response::new(full(v.to_string()));
    *r.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// A JSON response with one `Warning: 299 - "..."` header per warning, like
/// the real server's unknown-field warnings.
fn warned(code: u16, v: &Value, warnings: &[String]) -> Response<Body> {
    let mut r = json_response(code, v);
    for w in warnings {
        let text = format!("299 - \"{}\"", w.replace('\\', "\\\\").replace('"', "\\\""));
        if let Ok(h) = HeaderValue::from_str(&text) {
            r.headers_mut().append(hyper::header::WARNING, h);
        }
    }
    r
}

fn error_response(e: &ApiError) -> Response<Body> {
    let mut r = json_response(e.code, &e.to_status());
    if let Some(secs) = e.retry_after
        && let Ok(v) = HeaderValue::from_str(&secs.to_string())
    {
        r.headers_mut().insert(RETRY_AFTER, v);
    }
    r
}

/// Decoded query parameters.
pub(crate) struct Params(Vec<(String, String)>);

impl Params {
    pub(crate) fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    fn flag(&self, key: &str) -> bool {
        matches!(self.get(key), Some("true" | "1"))
    }

    fn dry_run(&self) -> bool {
        self.0.iter().any(|(k, v)| k == "dryRun" && v == "All")
    }

    fn selectors(&self, kind: &KindInfo) -> Result<Selectors, ApiError> {
        Selectors::parse(kind, self.get("labelSelector"), self.get("fieldSelector"))
    }
}

/// A path under `/api/v1` or `/apis/{g}/{v}` that names a served resource.
#[derive(Clone, Debug)]
struct ResTarget {
    kidx: usize,
    path: ResourcePath,
}

/// What a path names: a document (`/version`, discovery; `None`: nothing is served there), a
/// health check, or a served resource.
enum Target {
    Document(Option<Value>),
    Health,
    Resource(ResTarget),
}

/// The served resource `path` names: a namespaced kind's objects by `namespaces/<ns>/`, a
/// cluster-scoped kind's without.
fn resource_target(kinds: &Kinds, path: ResourcePath) -> Option<ResTarget> {
    let kidx = kinds.find(&path.group, &path.version, &path.resource)?;
    let namespaced = kinds.get(kidx).namespaced;
    let in_ns = path.namespace.is_some();
    let named_without_ns = namespaced && !in_ns && path.name.is_some();
    (!path.extra && (namespaced || !in_ns) && !named_without_ns).then_some(ResTarget { kidx, path })
}

fn route(shared: &Shared, path: &str) -> Target {
    let kinds = shared.kinds.all();
    let segs = segments(path);
    let segs: Vec<&str> = segs.iter().map(String::as_str).collect();
    Target::Document(match segs.as_slice() {
        ["version"] => Some(discovery::version(&shared.config.git_version)),
        ["healthz"] | ["readyz"] | ["livez"] => return Target::Health,
        ["api"] => Some(discovery::api_versions(shared.addr)),
        ["apis"] => Some(discovery::group_list(kinds)),
        ["apis", g] => discovery::group(kinds, g),
        ["api", "v1"] => discovery::resource_list(kinds, "", "v1"),
        ["apis", g, v] => discovery::resource_list(kinds, g, v),
        _ => match ResourcePath::parse(path).and_then(|p| resource_target(&shared.kinds, p)) {
            Some(t) => return Target::Resource(t),
            None => None,
        },
    })
}

fn verb_of(method: &str, t: &ResTarget, params: &Params) -> String {
    let watch = t.path.watch || params.flag("watch");
    match (method, t.path.name.is_some()) {
        ("GET", _) if watch => "watch",
        ("GET", false) => "list",
        ("GET", true) => "get",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", false) => "deletecollection",
        ("DELETE", true) => "delete",
        (other, _) => return other.to_lowercase(),
    }
    .to_string()
}

/// Serve one HTTP request.
pub(crate) async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Response<Body> {
    let (parts, incoming) = req.into_parts();
    let method = parts.method.as_str().to_string();
    let path = parts.uri.path().to_string();
    let raw_query = parts.uri.query().unwrap_or("").to_string();
    let header = |name| parts.headers.get(name).and_then(|v| v.to_str().ok());
    let authorization = header(hyper::header::AUTHORIZATION).map(str::to_string);
    let user_agent = header(hyper::header::USER_AGENT).map(str::to_string);
    let ctype = header(CONTENT_TYPE).map(str::to_string);
    let body = match Limited::new(incoming, MAX_BODY).collect().await {
        Ok(c) => c.to_bytes(),
        Err(e)
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            return error_response(&ApiError::from_code(413, "the request body is too large"));
        }
        Err(e) => {
            return error_response(&ApiError::bad_request(format!(
                "reading the request body: {e}"
            )));
        }
    };
    let params = Params(parse_query(&raw_query));
    let control = Control {
        shared: shared.clone(),
    };
    if path == "/_double" || path.starts_with("/_double/") {
        let (code, v) = control::handle_http(&control, &method, &path, &params, &body);
        return json_response(code, &v);
    }
    let target = route(&shared, &path);
    let mut record = RequestRecord {
        method: method.clone(),
        path: path.clone(),
        query: raw_query,
        content_type: ctype.clone(),
        user_agent,
        body: String::from_utf8_lossy(&body).into_owned(),
        at: Some(std::time::Instant::now()),
        ..RequestRecord::default()
    };
    if let Target::Resource(t) = &target {
        let plural = &shared.kinds.get(t.kidx).plural;
        record.verb = verb_of(&method, t, &params);
        record.resource = t
            .path
            .subresource
            .as_ref()
            .map_or(plural.clone(), |s| format!("{plural}/{s}"));
        (record.namespace, record.name) = (t.path.namespace.clone(), t.path.name.clone());
    }
    let (verb, resource) = (record.verb.clone(), record.resource.clone());
    tracing::debug!(%method, %path, query = %record.query, %verb, %resource, "request");
    // as the real server's filters: authentication, then authorization, before anything else
    if let Err(e) = authenticate_and_authorize(&shared, &params, authorization, &mut record) {
        record.refused = Some(e.code);
        control.record(record);
        return error_response(&e);
    }
    control.record(record);
    let held = crate::hold::lock(&shared.holds).request(&verb, &resource, &body);
    if let Some(released) = held {
        crate::hold::until_released(released).await;
    }
    let (delay, fault) = control.fault_for(&verb, &resource);
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    if let Some(e) = fault {
        return error_response(&e);
    }
    match dispatch(&shared, &method, target, &params, ctype.as_deref(), &body).await {
        Ok(r) => r,
        Err(e) => error_response(&e),
    }
}

/// Authenticates the request (when authentication is on) and authorizes it with RBAC (when on),
/// noting the user in `record`; the `401` or `403` to answer if either refuses it.
fn authenticate_and_authorize(
    shared: &Shared,
    params: &Params,
    authorization: Option<String>,
    record: &mut RequestRecord,
) -> Result<(), ApiError> {
    let auth = shared.auth.read().unwrap_or_else(|e| e.into_inner());
    let user = auth.authenticate(authorization.as_deref())?;
    record.user = user.as_ref().map(|u| u.name.clone());
    if !auth.rbac {
        return Ok(());
    }
    drop(auth);
    let user = user.unwrap_or_else(UserInfo::anonymous);
    let attrs = auth::attributes(&record.method, &record.path, &params.0);
    shared
        .store
        .read(|st| crate::rbac::authorize(st, &user, &attrs))
}

async fn dispatch(
    shared: &Arc<Shared>,
    method: &str,
    target: Target,
    params: &Params,
    ctype: Option<&str>,
    body: &[u8],
) -> Result<Response<Body>, ApiError> {
    match target {
        Target::Resource(t) => resource(shared, method, t, params, ctype, body).await,
        _ if method != "GET" => Err(ApiError::method_not_allowed()),
        Target::Health => Ok(Response::new(full("ok"))),
        Target::Document(doc) => doc
            .map(|d| json_response(200, &d))
            .ok_or_else(ApiError::no_such_resource),
    }
}

fn parse_json(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!("couldn't get version/kind; json parse error: {e}"))
    })
}

/// The Go type name `encoding/json` uses for a JSON value in unmarshal errors.
fn go_json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// `422` for invalid list/watch options, worded like the real server: `resourceVersionMatch`
/// forbidden `why`, and `unsupported` a value it cannot have.
fn list_options_invalid(why: Option<&str>, unsupported: Option<&str>) -> ApiError {
    let field = "resourceVersionMatch";
    let forbidden = why.map(|why| (field, "FieldValueForbidden", format!("Forbidden: {why}")));
    let unsupported = unsupported.map(|m| {
        let why = format!("Unsupported value: \"{m}\": supported values: \"NotOlderThan\"");
        (field, "FieldValueNotSupported", why)
    });
    let causes: Vec<_> = forbidden.into_iter().chain(unsupported).collect();
    let lo = KindInfo::core("meta.k8s.io", "v1", "listoptions", "ListOptions", false);
    ApiError::invalid(&lo, "", &causes)
}

fn parse_rv(v: Option<&str>) -> Result<Option<u64>, ApiError> {
    match v {
        None | Some("") | Some("0") => Ok(None),
        Some(s) => s
            .parse()
            .map(Some)
            .map_err(|_| ApiError::bad_request(format!("invalid resource version {s:?}"))),
    }
}

/// Wait (bounded) until the store reaches `rv`, else 504 like the real server.
async fn wait_for_rv(shared: &Shared, rv: u64) -> Result<(), ApiError> {
    let mut rx = shared.store.subscribe();
    let reached = rx.wait_for(|now| *now >= rv);
    let _ = tokio::time::timeout(shared.config.too_large_rv_wait, reached).await;
    let current = shared.store.read(|st| st.rv);
    if current >= rv {
        return Ok(());
    }
    let mut e = ApiError::new(504, "Timeout", format!("Timeout: Too large resource version: {rv}, current: {current}"))
        .with_details(json!({"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}]}));
    e.retry_after = Some(1);
    Err(e)
}

/// A write under the store lock, answered with the `Warning`s it produced: `201` when it
/// created the object, else `200`.
fn written(
    store: &Store,
    write: impl FnOnce(&mut State) -> Result<(Value, bool), ApiError>,
) -> Result<Response<Body>, ApiError> {
    let (result, warnings) = store.write(|st| (write(st), std::mem::take(&mut st.warnings)));
    let (v, created) = result?;
    Ok(warned(if created { 201 } else { 200 }, &v, &warnings))
}

async fn resource(
    shared: &Arc<Shared>,
    method: &str,
    t: ResTarget,
    params: &Params,
    ctype: Option<&str>,
    body: &[u8],
) -> Result<Response<Body>, ApiError> {
    let kind = shared.kinds.get(t.kidx).clone();
    let sub = match t.path.subresource.as_deref() {
        None => Sub::Main,
        Some("status") if kind.status_subresource => Sub::Status,
        Some(_) => return Err(ApiError::no_such_resource()),
    };
    let watch = t.path.watch || params.flag("watch");
    let ns = t.path.namespace.as_deref();
    let kidx = t.kidx;
    let dry_run = params.dry_run();
    let store = &shared.store;
    match (method, t.path.name.as_deref()) {
        ("GET", _) if watch => start_watch(shared, &kind, &t, params).await,
        ("GET", None) => {
            let sel = params.selectors(&kind)?;
            let rv_param = params.get("resourceVersion").filter(|v| !v.is_empty());
            let cont = params.get("continue").filter(|v| !v.is_empty());
            if cont.is_some() && rv_param.is_some() {
                return Err(ApiError::bad_request(
                    "specifying resource version is not allowed when using continue",
                ));
            }
            let rv_match = params.get("resourceVersionMatch").filter(|m| !m.is_empty());
            if rv_match.is_some() && rv_param.is_none() {
                let why = "resourceVersionMatch is forbidden unless resourceVersion is provided";
                return Err(list_options_invalid(Some(why), None));
            }
            if cont.is_none()
                && let Some(rv) = parse_rv(rv_param)?
            {
                wait_for_rv(shared, rv).await?;
            }
            // resourceVersion=0 is served from the watch cache, which ignores limit
            let limit = params.get("limit").filter(|_| rv_param != Some("0"));
            let bad = |l| ApiError::bad_request(format!("invalid limit {l:?}"));
            let limit = limit.map(|l| l.parse::<usize>().map_err(|_| bad(l)));
            let limit = limit.transpose()?;
            let list = store.write(|st| list::list(st, kidx, ns, &sel, limit, cont))?;
            Ok(json_response(200, &list))
        }
        ("GET", Some(name)) => {
            let obj = store.read(|st| st.served(kidx, ns.unwrap_or(""), name));
            obj.map(|o| json_response(200, &o))
                .ok_or_else(|| ApiError::not_found(&kind, name))
        }
        ("POST", None) => {
            if kind.namespaced && ns.is_none() {
                return Err(ApiError::method_not_allowed());
            }
            let obj = parse_json(body)?;
            written(store, |st| {
                ops::create(st, kidx, ns, obj, Origin::Http, dry_run).map(|v| (v, true))
            })
        }
        ("PUT", Some(name)) => {
            let obj = parse_json(body)?;
            written(store, |st| {
                let (sub, origin) = (sub, Origin::Http);
                ops::update(st, kidx, ns, Some(name), obj, sub, origin, dry_run, true)
            })
        }
        ("PATCH", Some(name)) => {
            let ptype = ctype.and_then(PatchType::from_content_type);
            let ptype = match ptype {
                Some(PatchType::Strategic) | None if kind.custom => {
                    return Err(ApiError::unsupported_patch(
                        "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
                    ));
                }
                Some(p) => p,
                None => {
                    let e = ApiError::from_code(415, "415: Unsupported Media Type");
                    return Err(e.with_details(json!({})));
                }
            };
            let patch: Value = serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
            let (fits, go_type) = match ptype {
                PatchType::Json => (patch.is_array(), "jsonpatch.Patch"),
                PatchType::Merge | PatchType::Strategic => {
                    (patch.is_object(), "map[string]interface {}")
                }
                PatchType::Apply => (true, ""),
            };
            if !fits {
                let got = go_json_type(&patch);
                return Err(ApiError::bad_request(format!(
                    "error decoding patch: json: cannot unmarshal {got} into Go value of type {go_type}"
                )));
            }
            let manager = params.get("fieldManager");
            written(store, |st| {
                ops::patch(st, kidx, ns, name, sub, ptype, &patch, manager, dry_run)
            })
        }
        ("DELETE", Some(name)) if sub == Sub::Main => {
            let opts = if body.is_empty() {
                json!({})
            } else {
                parse_json(body)?
            };
            let pre = opts.get("preconditions").cloned().unwrap_or_default();
            let pre: Preconditions = serde_json::from_value(pre).unwrap_or_default();
            let dry = dry_run
                || opts
                    .get("dryRun")
                    .and_then(Value::as_array)
                    .is_some_and(|a| a.iter().any(|x| x == "All"));
            let (v, gone) = store.write(|st| ops::delete(st, kidx, ns, name, &pre, dry))?;
            if gone && !kind.delete_returns_object {
                // the real server answers a Status for kinds that do not return the object
                let mut details = crate::status::resource_details(&kind, name);
                details["uid"] = v.pointer("/metadata/uid").cloned().unwrap_or(Value::Null);
                let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                    "status": "Success", "details": details});
                return Ok(json_response(200, &status));
            }
            Ok(json_response(200, &v))
        }
        ("DELETE", None) => {
            let sel = params.selectors(&kind)?;
            let out =
                store.write(|st| list::delete_collection(st, &kind, kidx, ns, &sel, dry_run))?;
            Ok(json_response(200, &out))
        }
        _ => Err(ApiError::method_not_allowed()),
    }
}

async fn start_watch(
    shared: &Arc<Shared>,
    kind: &KindInfo,
    t: &ResTarget,
    params: &Params,
) -> Result<Response<Body>, ApiError> {
    let selectors = params.selectors(kind)?;
    let rv = parse_rv(params.get("resourceVersion"))?;
    let bookmarks = params.flag("allowWatchBookmarks");
    let send_initial = params
        .get("sendInitialEvents")
        .map(|v| v == "true" || v == "1");
    let rv_match = params.get("resourceVersionMatch").filter(|m| !m.is_empty());
    let forbidden = match (send_initial, rv_match) {
        (None, Some(_)) => {
            Some("resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided")
        }
        (Some(_), None) => {
            Some("sendInitialEvents requires setting resourceVersionMatch to NotOlderThan")
        }
        _ => None,
    };
    let unsupported = rv_match.filter(|m| *m != "NotOlderThan");
    if forbidden.is_some() || unsupported.is_some() {
        return Err(list_options_invalid(forbidden, unsupported));
    }
    let timeout = params
        .get("timeoutSeconds")
        .and_then(|s| s.parse::<u64>().ok())
        .filter(|s| *s > 0)
        .map(Duration::from_secs)
        .unwrap_or(DEFAULT_WATCH_TIMEOUT);
    // A resourceVersion ahead of the store is not an error for a watch: the
    // real watch cache answers 200 and sends what comes after it.
    let current = shared.store.read(|st| st.rv);
    let start = match (send_initial, rv) {
        (Some(true), _) | (None, None) => Start::Initial,
        (Some(false), r) => Start::From(r.unwrap_or(current)),
        (None, Some(r)) => Start::From(r),
    };
    let req = WatchRequest {
        kidx: t.kidx,
        namespace: t.path.namespace.clone(),
        name: t.path.name.clone(),
        selectors,
        start,
        bookmarks,
        timeout,
    };
    let (tx, rx) = mpsc::channel::<watch::Chunk>(64);
    let guard = watch::OpenGuard::new(shared.open_watches.clone());
    tokio::spawn(watch::run(shared.clone(), req, tx, guard));
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|chunk| (chunk.map(Frame::data), rx))
    });
    let mut r = Response::new(StreamBody::new(stream).boxed());
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    Ok(r)
}
