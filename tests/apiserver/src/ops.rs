//! Write and list semantics shared by the HTTP API and the control API:
//! create, update (main resource and `/status`), patch, delete with
//! finalizers, and paged lists. Each function runs under the store lock, so a
//! read-modify-write is atomic, exactly like a single etcd transaction.

use serde_json::{Map, Value, json};

use crate::admission;
use crate::kinds::{KindInfo, StatusOnCreate, from_storage, through_version, to_storage};
use crate::patch::{self, PatchType};
use crate::status::ApiError;
use crate::store::{State, rv_of};
use crate::util;

/// Who asked for a write: a client over HTTP (full API semantics) or a test
/// through the control API (may set `.status` directly, no RV preconditions).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Origin {
    Http,
    Control,
}

/// Main resource or the `/status` subresource.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sub {
    Main,
    Status,
}

/// `DeleteOptions.preconditions`.
#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(crate) struct Preconditions {
    pub uid: Option<String>,
    pub resource_version: Option<String>,
}

pub(crate) fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = json!({});
    }
    match obj.get_mut("metadata") {
        Some(Value::Object(m)) => m,
        _ => unreachable!("metadata was just made an object"),
    }
}

pub(crate) fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata")?.get(field)?.as_str()
}

pub(crate) fn non_empty(s: Option<&str>) -> Option<&str> {
    s.filter(|s| !s.is_empty())
}

/// `422 Invalid` with one cause, of the reason apimachinery's `field.Error` words `why` with.
fn invalid(kind: &KindInfo, name: &str, field: &str, why: String) -> ApiError {
    let reason = match why.split(':').next() {
        Some("Required value") => "FieldValueRequired",
        Some("Forbidden") => "FieldValueForbidden",
        _ => "FieldValueInvalid",
    };
    ApiError::invalid(kind, name, &[(field, reason, why)])
}

/// The namespace of a write: the URL's, which the body's must match, else the body's (`""`
/// for a cluster-scoped kind).
fn namespace_of(
    kind: &KindInfo,
    url_ns: Option<&str>,
    obj: &Value,
) -> Result<Option<String>, ApiError> {
    if !kind.namespaced {
        return Ok(Some(String::new()));
    }
    match (url_ns, non_empty(meta_str(obj, "namespace"))) {
        (Some(u), Some(b)) if b != u => Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        )),
        (u, b) => Ok(u.or(b).map(str::to_string)),
    }
}

/// Check `kind`/`apiVersion` of a request body like the real decoders: built-in
/// kinds default missing ones from the URL, custom resources require both;
/// the control API fills them in.
fn check_type(kind: &KindInfo, body: &mut Value, origin: Origin) -> Result<(), ApiError> {
    if !body.is_object() {
        return Err(ApiError::bad_request(
            "the body of the request must be a JSON object",
        ));
    }
    let k = non_empty(body.get("kind").and_then(Value::as_str)).map(str::to_string);
    let av = non_empty(body.get("apiVersion").and_then(Value::as_str)).map(str::to_string);
    if origin == Origin::Control || (!kind.custom && k.is_none() && av.is_none()) {
        body["kind"] = json!(kind.kind);
        body["apiVersion"] = json!(kind.api_version());
        return Ok(());
    }
    let expected = kind.api_version();
    if kind.custom {
        let Some(k) = k else {
            return Err(ApiError::bad_request(format!(
                "the object provided is unrecognized (must be of type {}): Object 'Kind' is missing in '{body}'",
                kind.kind
            )));
        };
        let av = av.unwrap_or_default();
        if av != expected {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({av}) does not match the expected API version ({expected})"
            )));
        }
        if k != kind.kind {
            let other = KindInfo {
                kind: k.clone(),
                ..kind.clone()
            };
            let name = meta_str(body, "name").unwrap_or("").to_string();
            let why = format!("Invalid value: \"{k}\": must be {}", kind.kind);
            return Err(invalid(&other, &name, "kind", why));
        }
        return Ok(());
    }
    let k = k.unwrap_or_else(|| kind.kind.clone());
    let av = av.unwrap_or_else(|| expected.clone());
    let version = av.rsplit('/').next().unwrap_or(&av).to_string();
    // (a GA version is taken to be registered, so the kind is the problem)
    if av != expected && version != "v1" {
        return Err(ApiError::bad_request(format!(
            "{k} in version \"{version}\" cannot be handled as a {}: no kind \"{k}\" is registered for version \"{av}\" in scheme \"kubernetes/pkg/api/legacyscheme/scheme.go:30\"",
            kind.kind
        )));
    }
    if k != kind.kind || av != expected {
        return Err(ApiError::bad_request(format!(
            "{k} in version \"{version}\" cannot be handled as a {}: converting ({version}.{k}) to (core.{}): unknown conversion",
            kind.kind, kind.kind
        )));
    }
    body["kind"] = json!(k);
    body["apiVersion"] = json!(av);
    Ok(())
}

/// A request body as stored: its type checked ([`check_type`]), an HTTP one pruned like the
/// real server's decoding (with the kind's schema, else only unknown `metadata` fields; dropped
/// fields become `Warning` headers), in the storage version.
fn decode(
    st: &mut State,
    (kind, storage_kind): (&KindInfo, &KindInfo),
    mut body: Value,
    origin: Origin,
) -> Result<Value, ApiError> {
    check_type(kind, &mut body, origin)?;
    if origin == Origin::Http {
        match &kind.schema {
            Some(schema) => schema.normalize(&mut body, Some(&mut st.warnings)),
            None => crate::schema::prune_object_meta(&mut body, &mut st.warnings),
        }
    }
    let mut obj = to_storage(kind, body);
    obj["kind"] = json!(storage_kind.kind);
    obj["apiVersion"] = json!(storage_kind.api_version());
    Ok(obj)
}

/// 422 for an HTTP write whose result does not satisfy the kind's schema
/// (values unchanged from `old` are not checked, like the real server's ratcheting).
fn check_schema(
    kind: &KindInfo,
    name: &str,
    obj: &Value,
    old: Option<&Value>,
    origin: Origin,
) -> Result<(), ApiError> {
    let (Some(schema), Origin::Http) = (&kind.schema, origin) else {
        return Ok(());
    };
    let causes = schema.validate(obj, old);
    if causes.is_empty() {
        return Ok(());
    }
    Err(ApiError::invalid(kind, name, &causes))
}

/// Labels and annotations valid, and a core `v1` event written over HTTP in its object's
/// namespace (or `default` for cluster-scoped objects), like the real server's validation.
fn check_meta(w: &admission::Write<'_>, obj: &Value, origin: Origin) -> Result<(), ApiError> {
    let meta = obj.get("metadata").and_then(Value::as_object);
    let causes = meta.map(util::validate_meta).unwrap_or_default();
    if !causes.is_empty() {
        return Err(ApiError::invalid(w.kind, w.name, &causes));
    }
    let (kind, name, ns) = (w.storage_kind, w.name, w.namespace);
    if origin != Origin::Http || w.kind.conversion.is_some() || !is_core(kind, "events") {
        return Ok(());
    }
    let involved = obj
        .pointer("/involvedObject/namespace")
        .and_then(Value::as_str)
        .unwrap_or("");
    let legacy = obj.get("eventTime").is_none_or(Value::is_null);
    let ok = match (involved.is_empty(), legacy) {
        (true, true) => ns.is_empty() || ns == "default",
        (true, false) => ns == "default" || ns == "kube-system",
        (false, _) => ns == involved,
    };
    if ok {
        return Ok(());
    }
    let why = format!("Invalid value: \"{involved}\": does not match event.namespace");
    Err(invalid(kind, name, "involvedObject.namespace", why))
}

fn is_core(kind: &KindInfo, plural: &str) -> bool {
    kind.group.is_empty() && kind.plural == plural
}

fn qos_class(spec: &Value) -> &'static str {
    let (mut any, mut guaranteed) = (false, true);
    let containers = ["containers", "initContainers"]
        .iter()
        .filter_map(|f| spec.get(*f).and_then(Value::as_array))
        .flatten();
    for c in containers {
        let req = c.pointer("/resources/requests");
        let lim = c.pointer("/resources/limits");
        for r in ["cpu", "memory"] {
            let rq = req.and_then(|x| x.get(r));
            let lm = lim.and_then(|x| x.get(r));
            any |= rq.is_some() || lm.is_some();
            guaranteed &= lm.is_some() && rq.is_none_or(|q| Some(q) == lm);
        }
    }
    match (any, guaranteed) {
        (false, _) => "BestEffort",
        (true, true) => "Guaranteed",
        (true, false) => "Burstable",
    }
}

/// Why `name` cannot name an object of `kind`, if it cannot.
fn name_problem(kind: &KindInfo, name: &str) -> Option<String> {
    if kind.group == crate::kinds::RBAC_GROUP {
        // RBAC names are path segments (`system:discovery`), as the real RBAC validation has it
        return util::path_segment_problem(name)
            .map(|why| format!("Invalid value: {name:?}: {why}"));
    }
    let ok = match is_core(kind, "namespaces") {
        true => util::is_dns_label(name),
        false => util::is_dns_subdomain(name),
    };
    (!ok).then(|| format!(
        "Invalid value: {name:?}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"
    ))
}

/// Create an object. `url_ns` is the namespace segment of the request path.
pub(crate) fn create(
    st: &mut State,
    kidx: usize,
    url_ns: Option<&str>,
    body: Value,
    origin: Origin,
    dry_run: bool,
) -> Result<Value, ApiError> {
    let kinds = st.kinds.clone();
    let (kind, sidx, storage_kind) = kinds.with_storage(kidx);
    let mut obj = decode(st, (kind, storage_kind), body, origin)?;

    let ns = match namespace_of(kind, url_ns, &obj)? {
        Some(ns) => ns,
        None if origin == Origin::Control => "default".to_string(),
        None => {
            return Err(ApiError::bad_request(
                "the namespace of the object must be set",
            ));
        }
    };

    let mut name = non_empty(meta_str(&obj, "name")).unwrap_or("").to_string();
    if name.is_empty() {
        let Some(prefix) = non_empty(meta_str(&obj, "generateName")).map(str::to_string) else {
            let why = "Required value: name or generateName is required".into();
            return Err(invalid(kind, "", "metadata.name", why));
        };
        while name.is_empty() || st.get(sidx, &ns, &name).is_some() {
            name = format!("{prefix}{}", util::name_suffix());
        }
    }
    if let Some(why) = name_problem(kind, &name) {
        return Err(invalid(kind, &name, "metadata.name", why));
    }
    if origin == Origin::Http && non_empty(meta_str(&obj, "resourceVersion")).is_some() {
        // the real server answers a bare 500: no reason, no details
        let why = "resourceVersion should not be set on objects to be created";
        return Err(ApiError::new(500, "", why));
    }
    let write = admission::Write {
        kind,
        storage_kind,
        operation: admission::Operation::Create,
        namespace: &ns,
        name: &name,
        dry_run,
    };
    check_meta(&write, &obj, origin)?;
    if kind.namespaced && st.require_namespaces && !st.namespace_exists(&ns) {
        match origin {
            Origin::Http => return Err(ApiError::namespace_not_found(&ns)),
            Origin::Control => {
                if let Some(ns_idx) = kinds.find("", "v1", "namespaces") {
                    let namespace = json!({"metadata": {"name": ns}});
                    create(st, ns_idx, None, namespace, Origin::Control, dry_run)?;
                }
            }
        }
    }
    if origin == Origin::Http {
        obj = admission::mutate(st, &write, obj, None)?;
    }
    if st.get(sidx, &ns, &name).is_some() {
        return Err(ApiError::already_exists(kind, &name));
    }

    let meta = name_in(kind, &mut obj, &name, &ns);
    meta.insert("uid".into(), json!(util::new_uid()));
    meta.insert("creationTimestamp".into(), json!(util::now_rfc3339()));
    meta.remove("resourceVersion");
    meta.remove("deletionTimestamp");
    meta.remove("deletionGracePeriodSeconds");
    if storage_kind.tracks_generation {
        meta.insert("generation".into(), json!(1));
    } else {
        meta.remove("generation");
    }
    if origin == Origin::Http {
        match &kind.status_on_create {
            StatusOnCreate::Keep => {}
            StatusOnCreate::Drop => {
                obj.as_object_mut().map(|m| m.remove("status"));
            }
            StatusOnCreate::Replace(v) => {
                let mut status = v.clone();
                if is_core(storage_kind, "pods") {
                    let spec = obj.get("spec").cloned().unwrap_or(Value::Null);
                    status["qosClass"] = json!(qos_class(&spec));
                }
                obj["status"] = status;
            }
        }
    }
    if is_core(storage_kind, "secrets")
        && non_empty(obj.get("type").and_then(Value::as_str)).is_none()
    {
        obj["type"] = json!("Opaque");
    }
    if is_core(storage_kind, "namespaces") && obj.pointer("/spec/finalizers").is_none() {
        obj["spec"] = json!({"finalizers": ["kubernetes"]});
        if !obj.get("status").is_some_and(Value::is_object) {
            obj["status"] = json!({"phase": "Active"});
        }
    }
    check_schema(kind, &name, &obj, None, origin)?;
    if origin == Origin::Http {
        admission::validate(st, &write, &obj, None)?;
    }
    if dry_run {
        return Ok(from_storage(kind, &obj));
    }
    let stored = st.put(sidx, obj);
    Ok(from_storage(kind, &stored))
}

fn container_count(pod: &Value) -> usize {
    pod.pointer("/spec/containers")
        .and_then(Value::as_array)
        .map_or(0, Vec::len)
}

const POD_UPDATE_FORBIDDEN: &str = "Forbidden: pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)";

/// The pod spec with every field an update may change blanked out.
fn immutable_pod_spec(spec: Option<&Value>) -> Value {
    let mut spec = spec.cloned().unwrap_or(Value::Null);
    for list in ["containers", "initContainers"] {
        if let Some(cs) = spec.get_mut(list).and_then(Value::as_array_mut) {
            for c in cs {
                c.as_object_mut().map(|m| m.remove("image"));
            }
        }
    }
    if let Some(m) = spec.as_object_mut() {
        for f in [
            "activeDeadlineSeconds",
            "tolerations",
            "terminationGracePeriodSeconds",
            "schedulingGates",
        ] {
            m.remove(f);
        }
    }
    spec
}

fn without_meta_and_status(obj: &Value) -> Value {
    let mut o = obj.clone();
    if let Some(m) = o.as_object_mut() {
        m.remove("metadata");
        m.remove("status");
    }
    o
}

fn copy_field(dst: &mut Value, src: &Value, field: &str) {
    match src.get(field) {
        Some(v) => dst[field] = v.clone(),
        None => _ = dst.as_object_mut().map(|m| m.remove(field)),
    }
}

fn copy_meta_field(dst: &mut Value, src: &Value, field: &str) {
    match src.get("metadata").and_then(|m| m.get(field)) {
        Some(v) => _ = meta_mut(dst).insert(field.to_string(), v.clone()),
        None => _ = meta_mut(dst).remove(field),
    }
}

fn finalizers(obj: &Value) -> Vec<String> {
    let list = obj
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array);
    let names = list.into_iter().flatten().filter_map(Value::as_str);
    names.map(str::to_string).collect()
}

/// Sets the object's name, and its namespace for a namespaced kind (none otherwise); returns
/// its metadata.
pub(crate) fn name_in<'a>(
    kind: &KindInfo,
    obj: &'a mut Value,
    name: &str,
    ns: &str,
) -> &'a mut Map<String, Value> {
    let meta = meta_mut(obj);
    meta.insert("name".into(), json!(name));
    if kind.namespaced {
        meta.insert("namespace".into(), json!(ns));
    } else {
        meta.remove("namespace");
    }
    meta
}

/// An update through the control API: `.status` included, no preconditions, no admission.
pub(crate) fn control_update(
    st: &mut State,
    kidx: usize,
    ns: Option<&str>,
    name: Option<&str>,
    obj: Value,
) -> Result<Value, ApiError> {
    let (sub, origin) = (Sub::Main, Origin::Control);
    update(st, kidx, ns, name, obj, sub, origin, false, false).map(|(v, _)| v)
}

/// Replace an object (PUT). `require_rv` is false for the result of a patch,
/// which is unconditional unless the patch itself carried a resourceVersion.
/// Returns the object and whether it was created (create-on-update kinds).
#[allow(clippy::too_many_arguments)]
pub(crate) fn update(
    st: &mut State,
    kidx: usize,
    url_ns: Option<&str>,
    url_name: Option<&str>,
    body: Value,
    sub: Sub,
    origin: Origin,
    dry_run: bool,
    require_rv: bool,
) -> Result<(Value, bool), ApiError> {
    let kinds = st.kinds.clone();
    let (kind, sidx, storage_kind) = kinds.with_storage(kidx);
    let mut new = decode(st, (kind, storage_kind), body, origin)?;

    let body_name = non_empty(meta_str(&new, "name")).map(str::to_string);
    let name = match (url_name, body_name) {
        (Some(u), Some(b)) if b != u => {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({b}) does not match the name on the URL ({u})"
            )));
        }
        (Some(u), _) => u.to_string(),
        (None, Some(b)) => b,
        (None, None) => return Err(ApiError::bad_request("name is required")),
    };
    let ns = namespace_of(kind, url_ns, &new)?.unwrap_or_else(|| "default".to_string());

    let Some(stored) = st.get(sidx, &ns, &name).cloned() else {
        if kind.allow_create_on_update && sub == Sub::Main {
            meta_mut(&mut new).remove("resourceVersion");
            let served = from_storage(kind, &new);
            let url_ns = kind.namespaced.then_some(ns.as_str());
            return create(st, kidx, url_ns, served, origin, dry_run).map(|v| (v, true));
        }
        return Err(ApiError::not_found(kind, &name));
    };
    // The old object as this version sees it: a write through a version drops
    // from storage what only the other version has, as on the real server.
    let old = through_version(kind, storage_kind, &stored);

    if origin == Origin::Http {
        match non_empty(meta_str(&new, "resourceVersion")) {
            Some(rv) if rv != rv_of(&stored).to_string() => {
                return Err(ApiError::conflict(kind, &name));
            }
            Some(_) => {}
            None if require_rv && kind.custom => {
                return Err(ApiError::invalid_resource(
                    kind,
                    &name,
                    &[(
                        "metadata.resourceVersion",
                        "FieldValueInvalid",
                        "Invalid value: 0: must be specified for an update".into(),
                    )],
                ));
            }
            None => {}
        }
    }

    let mut next = match (origin, sub) {
        (Origin::Control, _) => new,
        (Origin::Http, Sub::Main) => {
            if storage_kind.status_subresource {
                copy_field(&mut new, &old, "status");
            }
            if is_core(storage_kind, "pods") && container_count(&new) != container_count(&old) {
                let why = "Forbidden: pod updates may not add or remove containers".into();
                return Err(invalid(kind, &name, "spec.containers", why));
            }
            if is_core(storage_kind, "pods")
                && immutable_pod_spec(new.get("spec")) != immutable_pod_spec(old.get("spec"))
            {
                let why = POD_UPDATE_FORBIDDEN.into();
                return Err(invalid(kind, &name, "spec", why));
            }
            new
        }
        (Origin::Http, Sub::Status) if storage_kind.custom => {
            let mut n = old.clone();
            copy_field(&mut n, &new, "status");
            n
        }
        (Origin::Http, Sub::Status) => {
            copy_field(&mut new, &old, "spec");
            copy_meta_field(&mut new, &old, "ownerReferences");
            new
        }
    };
    name_in(kind, &mut next, &name, &ns);
    let kept = "uid creationTimestamp deletionTimestamp deletionGracePeriodSeconds generation";
    for f in kept.split(' ') {
        copy_meta_field(&mut next, &old, f);
    }
    next["kind"] = json!(storage_kind.kind);
    next["apiVersion"] = json!(storage_kind.api_version());
    let write = admission::Write {
        kind,
        storage_kind,
        operation: admission::Operation::Update,
        namespace: &ns,
        name: &name,
        dry_run,
    };
    // webhooks are registered for the main resource only, as kruise-manager's are
    let admitted = origin == Origin::Http && sub == Sub::Main;
    if admitted {
        next = admission::mutate(st, &write, next, Some(&old))?;
    }

    if meta_str(&old, "deletionTimestamp").is_some() {
        let before = finalizers(&old);
        let added: Vec<String> = finalizers(&next)
            .into_iter()
            .filter(|f| !before.contains(f))
            .collect();
        if !added.is_empty() {
            let why = format!(
                "Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers {added:?}"
            );
            return Err(invalid(kind, &name, "metadata.finalizers", why));
        }
    }
    check_meta(&write, &next, origin)?;
    check_schema(kind, &name, &next, Some(&old), origin)?;
    if admitted {
        admission::validate(st, &write, &next, Some(&old))?;
    }
    if storage_kind.tracks_generation {
        let gen_old = old
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(1);
        let changed = without_meta_and_status(&old) != without_meta_and_status(&next);
        meta_mut(&mut next).insert("generation".into(), json!(gen_old + i64::from(changed)));
    }

    let mut same = next.clone();
    crate::store::set_rv(&mut same, rv_of(&stored));
    if same == *stored {
        return Ok((from_storage(kind, &stored), false));
    }
    if dry_run {
        return Ok((from_storage(kind, &next), false));
    }
    if meta_str(&next, "deletionTimestamp").is_some() && finalizers(&next).is_empty() {
        let last = st.remove(sidx, next);
        return Ok((from_storage(kind, &last), false));
    }
    let stored = st.put(sidx, next);
    Ok((from_storage(kind, &stored), false))
}

/// Patch an object (the HTTP layer has refused the patch types and bodies the kind does not
/// take). Apply (server-side apply) is approximated as "create if absent, else strategic merge
/// (core kinds) or merge patch (custom kinds)".
#[allow(clippy::too_many_arguments)]
pub(crate) fn patch(
    st: &mut State,
    kidx: usize,
    ns: Option<&str>,
    name: &str,
    sub: Sub,
    ptype: PatchType,
    body: &Value,
    field_manager: Option<&str>,
    dry_run: bool,
) -> Result<(Value, bool), ApiError> {
    let kinds = st.kinds.clone();
    let (kind, sidx, _) = kinds.with_storage(kidx);
    if ptype == PatchType::Apply {
        if non_empty(field_manager).is_none() {
            let pkind = KindInfo::core("meta.k8s.io", "v1", "patchoptions", "PatchOptions", false);
            let why = "Required value: is required for apply patch".into();
            return Err(invalid(&pkind, "", "fieldManager", why));
        }
        if !body.is_object() {
            return Err(ApiError::bad_request(
                "the double only accepts JSON bodies for apply patches",
            ));
        }
    }
    let ns_key = ns.filter(|_| kind.namespaced).unwrap_or("");
    let Some(cur) = st.get(sidx, ns_key, name).cloned() else {
        if ptype == PatchType::Apply && sub == Sub::Main {
            let mut b = body.clone();
            let meta = meta_mut(&mut b);
            meta.entry("name").or_insert(json!(name));
            return create(st, kidx, ns, b, Origin::Http, dry_run).map(|v| (v, true));
        }
        return Err(ApiError::not_found(kind, name));
    };
    let mut served = from_storage(kind, &cur);
    match ptype {
        PatchType::Json => patch::json_patch(&mut served, body)?,
        PatchType::Merge => json_patch::merge(&mut served, body),
        PatchType::Strategic => patch::strategic_merge(&mut served, body)?,
        PatchType::Apply => {
            let mut b = body.clone();
            check_type(kind, &mut b, Origin::Http)?;
            if kind.custom {
                json_patch::merge(&mut served, &b);
            } else {
                patch::strategic_merge(&mut served, &b)?;
            }
        }
    }
    // unconditional unless the patch itself carried a resourceVersion
    update(
        st,
        kidx,
        ns,
        Some(name),
        served,
        sub,
        Origin::Http,
        dry_run,
        false,
    )
}

/// Delete an object. With finalizers it only gets a `deletionTimestamp`.
/// Returns the object and whether it is gone now (200) or still there (202).
pub(crate) fn delete(
    st: &mut State,
    kidx: usize,
    ns: Option<&str>,
    name: &str,
    pre: &Preconditions,
    dry_run: bool,
) -> Result<(Value, bool), ApiError> {
    let kinds = st.kinds.clone();
    let (kind, sidx, _) = kinds.with_storage(kidx);
    let ns_key = ns.filter(|_| kind.namespaced).unwrap_or("");
    let Some(cur) = st.get(sidx, ns_key, name).cloned() else {
        return Err(ApiError::not_found(kind, name));
    };
    let (uid, rv) = (meta_str(&cur, "uid").unwrap_or("").to_string(), rv_of(&cur));
    let checks = [
        ("UID", &pre.uid, uid),
        ("ResourceVersion", &pre.resource_version, rv.to_string()),
    ];
    for (what, want, actual) in checks {
        if let Some(want) = non_empty(want.as_deref())
            && want != actual
        {
            let why = format!(
                "Precondition failed: {what} in precondition: {want}, {what} in object meta: {actual}"
            );
            return Err(ApiError::conflict_with(kind, name, &why));
        }
    }
    if !finalizers(&cur).is_empty() {
        if meta_str(&cur, "deletionTimestamp").is_some() || dry_run {
            return Ok((from_storage(kind, &cur), false));
        }
        let mut next = (*cur).clone();
        let gen_now = next.pointer("/metadata/generation").and_then(Value::as_i64);
        let meta = meta_mut(&mut next);
        meta.insert("deletionTimestamp".into(), json!(util::now_rfc3339()));
        meta.insert("deletionGracePeriodSeconds".into(), json!(0));
        if let Some(g) = gen_now.filter(|g| *g > 0) {
            meta.insert("generation".into(), json!(g + 1));
        }
        let stored = st.put(sidx, next);
        return Ok((from_storage(kind, &stored), false));
    }
    if dry_run {
        return Ok((from_storage(kind, &cur), true));
    }
    let last = st.remove(sidx, (*cur).clone());
    if is_core(kinds.get(sidx), "namespaces") {
        remove_namespace_contents(st, name);
    }
    Ok((from_storage(kind, &last), true))
}

/// Remove everything in a deleted namespace (the namespace controller's job,
/// done at once and ignoring finalizers).
fn remove_namespace_contents(st: &mut State, ns: &str) {
    let kinds = st.kinds.clone();
    let mut sidxs: Vec<usize> = (0..kinds.len())
        .filter(|i| kinds.get(*i).namespaced)
        .map(|i| kinds.storage_of(i))
        .collect();
    sidxs.sort_unstable();
    sidxs.dedup();
    for sidx in sidxs {
        let doomed: Vec<Value> = st
            .objects(sidx)
            .filter(|o| meta_str(o, "namespace") == Some(ns))
            .map(|o| (**o).clone())
            .collect();
        for o in doomed {
            st.remove(sidx, o);
        }
    }
}

/// Remove an object regardless of finalizers (control API).
pub(crate) fn force_remove(st: &mut State, kidx: usize, ns: &str, name: &str) -> Option<Value> {
    let kinds = st.kinds.clone();
    let sidx = kinds.storage_of(kidx);
    let cur = st.get(sidx, ns, name)?.clone();
    let last = st.remove(sidx, (*cur).clone());
    Some(from_storage(kinds.get(kidx), &last))
}
