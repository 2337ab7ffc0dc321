//! PATCH bodies: JSON merge patch (RFC 7386), JSON patch (RFC 6902) and
//! strategic merge patch.
//!
//! Strategic merge follows the real server for the built-in kinds the double
//! serves: maps merge recursively, `null` deletes a key, `$patch: replace` and
//! `$patch: delete` work at map and list-element level, `$deleteFromPrimitiveList/<f>`
//! removes values, `$setElementOrder/<f>` orders the merged list, `$retainKeys`
//! is accepted and ignored, and lists merge by the patch merge key Kubernetes declares for that
//! field name (see [`merge_key`]); every other list is replaced. The merge keys
//! are looked up by field name only, which is exact for the kinds served here.
//! Merged lists are ordered like apimachinery's `normalizeElementOrder`: the
//! patch's elements in patch order, interleaved with the elements only the
//! server has in their old order, a new element going before any server-only one.

use serde_json::{Map, Value};

use crate::status::ApiError;

/// The patch formats the real server accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchType {
    /// `application/json-patch+json`.
    Json,
    /// `application/merge-patch+json`.
    Merge,
    /// `application/strategic-merge-patch+json`.
    Strategic,
    /// `application/apply-patch+yaml` (server-side apply, approximated).
    Apply,
}

impl PatchType {
    /// Parse a `Content-Type` header value (parameters ignored).
    pub fn from_content_type(ct: &str) -> Option<Self> {
        match ct.split(';').next().unwrap_or("").trim() {
            "application/json-patch+json" => Some(PatchType::Json),
            "application/merge-patch+json" => Some(PatchType::Merge),
            "application/strategic-merge-patch+json" => Some(PatchType::Strategic),
            "application/apply-patch+yaml" => Some(PatchType::Apply),
            _ => None,
        }
    }
}

/// Merge strategy for a list field in a strategic merge patch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListStrategy {
    /// Merge elements that have the same value for this key.
    Key(&'static str),
    /// Union of primitive values (e.g. `finalizers`).
    Primitives,
}

/// The strategic merge strategy Kubernetes declares for a list field name;
/// `None` means the list is replaced as a whole (`containerStatuses` is one).
pub fn merge_key(field: &str) -> Option<ListStrategy> {
    Some(match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "env"
        | "volumes"
        | "imagePullSecrets"
        | "schedulingGates"
        | "resourceClaims"
        | "resourceClaimStatuses" => ListStrategy::Key("name"),
        "volumeMounts" => ListStrategy::Key("mountPath"),
        "volumeDevices" => ListStrategy::Key("devicePath"),
        "ports" => ListStrategy::Key("containerPort"),
        "conditions" | "addresses" => ListStrategy::Key("type"),
        "ownerReferences" => ListStrategy::Key("uid"),
        "podIPs" | "hostIPs" | "hostAliases" => ListStrategy::Key("ip"),
        "topologySpreadConstraints" => ListStrategy::Key("topologyKey"),
        "finalizers" | "podCIDRs" => ListStrategy::Primitives,
        _ => return None,
    })
}

/// Apply an RFC 6902 JSON patch in place; failures are `422` like the real server.
pub fn json_patch(target: &mut Value, patch: &Value) -> Result<(), ApiError> {
    let ops: json_patch::Patch = serde_json::from_value(patch.clone())
        .map_err(|e| ApiError::bad_request(format!("invalid JSON patch: {e}")))?;
    json_patch::patch(target, &ops).map_err(|e| {
        tracing::debug!(error = %e, "JSON patch failed");
        // the real server does not say which operation failed
        ApiError::new(
            422,
            "Invalid",
            "the server rejected our request due to an error in our request",
        )
        .with_details(serde_json::json!({}))
    })
}

/// Apply a strategic merge patch in place.
pub fn strategic_merge(target: &mut Value, patch: &Value) -> Result<(), ApiError> {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            if smp_map(t, p).map_err(ApiError::bad_request)? == MapOutcome::Deleted {
                t.clear();
            }
            Ok(())
        }
        _ => Err(ApiError::bad_request(
            "strategic merge patch must be a JSON object",
        )),
    }
}

#[derive(Debug, PartialEq, Eq)]
enum MapOutcome {
    Kept,
    Deleted,
}

fn directive(m: &Map<String, Value>) -> Option<&str> {
    m.get("$patch").and_then(Value::as_str)
}

/// Remove every directive key, recursively, from a value that is inserted as is.
fn strip(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), strip(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(
            a.iter()
                .filter(|e| e.as_object().and_then(directive).is_none())
                .map(strip)
                .collect(),
        ),
        other => other.clone(),
    }
}

fn smp_map(
    orig: &mut Map<String, Value>,
    patch: &Map<String, Value>,
) -> Result<MapOutcome, String> {
    match directive(patch) {
        None | Some("merge") => {}
        Some("replace") => {
            let Value::Object(m) = strip(&Value::Object(patch.clone())) else {
                return Err("internal: strip changed type".into());
            };
            *orig = m;
            return Ok(MapOutcome::Kept);
        }
        Some("delete") => return Ok(MapOutcome::Deleted),
        Some(other) => return Err(format!("unknown patch type: {other} in map: {patch:?}")),
    }
    let orders: Vec<(&str, &Vec<Value>)> = patch
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix("$setElementOrder/")?, v.as_array()?)))
        .collect();
    let before: Vec<Option<Value>> = orders.iter().map(|(f, _)| orig.get(*f).cloned()).collect();
    for (k, v) in patch {
        if k == "$patch" || k == "$retainKeys" || k.starts_with("$setElementOrder/") {
            continue;
        }
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            let remove = v.as_array().cloned().unwrap_or_default();
            if let Some(Value::Array(list)) = orig.get_mut(field) {
                list.retain(|x| !remove.contains(x));
            }
            continue;
        }
        match v {
            Value::Null => {
                orig.remove(k);
            }
            Value::Object(pm) => match orig.get_mut(k) {
                Some(Value::Object(om)) => {
                    if smp_map(om, pm)? == MapOutcome::Deleted {
                        orig.remove(k);
                    }
                }
                _ => {
                    if directive(pm) == Some("delete") {
                        orig.remove(k);
                    } else {
                        orig.insert(k.clone(), strip(v));
                    }
                }
            },
            Value::Array(pa) => {
                let strategy = merge_key(k);
                match (strategy, orig.get_mut(k)) {
                    (Some(ListStrategy::Key(key)), Some(Value::Array(oa))) => {
                        merge_keyed(oa, pa, key)?
                    }
                    (Some(ListStrategy::Primitives), Some(Value::Array(oa))) => {
                        let original = oa.clone();
                        let mut merged = original.clone();
                        for e in pa {
                            if !merged.contains(e) {
                                merged.push(e.clone());
                            }
                        }
                        *oa = normalize_order(merged, pa, &original, |v| v.clone());
                    }
                    _ => {
                        orig.insert(k.clone(), strip(v));
                    }
                }
            }
            other => {
                orig.insert(k.clone(), other.clone());
            }
        }
    }
    for ((field, order), before) in orders.into_iter().zip(before) {
        let key = match merge_key(field) {
            Some(ListStrategy::Key(key)) => Some(key),
            _ => None,
        };
        if let Some(Value::Array(list)) = orig.get_mut(field) {
            let server = match before {
                Some(Value::Array(b)) => b,
                _ => Vec::new(),
            };
            let id = |v: &Value| match key {
                Some(key) => v.get(key).cloned().unwrap_or(Value::Null),
                None => v.clone(),
            };
            *list = normalize_order(std::mem::take(list), order, &server, id);
        }
    }
    Ok(MapOutcome::Kept)
}

fn merge_keyed(orig: &mut Vec<Value>, patch: &[Value], key: &str) -> Result<(), String> {
    let replace = patch
        .iter()
        .any(|e| e.as_object().and_then(directive) == Some("replace"));
    if replace {
        *orig = patch
            .iter()
            .filter(|e| e.as_object().and_then(directive).is_none())
            .map(strip)
            .collect();
        return Ok(());
    }
    let mut merged = orig.clone();
    let mut kept: Vec<Value> = Vec::new();
    for pe in patch {
        let Some(pm) = pe.as_object() else {
            return Err(format!("patch list element is not an object: {pe}"));
        };
        let Some(kv) = pm.get(key) else {
            return Err(format!(
                "map: {pe} does not contain declared merge key: {key}"
            ));
        };
        if directive(pm) == Some("delete") {
            merged.retain(|o| o.get(key) != Some(kv));
            continue;
        }
        kept.push(pe.clone());
        let pos = merged.iter().position(|o| o.get(key) == Some(kv));
        match pos.and_then(|p| merged.get_mut(p)) {
            Some(Value::Object(om)) => {
                if smp_map(om, pm)? == MapOutcome::Deleted
                    && let Some(p) = pos
                {
                    merged.remove(p);
                }
            }
            _ => merged.push(strip(pe)),
        }
    }
    let id = |v: &Value| v.get(key).cloned().unwrap_or(Value::Null);
    *orig = normalize_order(merged, &kept, orig, id);
    Ok(())
}

/// apimachinery's `normalizeElementOrder`: the merged elements that are in the
/// patch, in patch order, merged with those only the server has, in server
/// order; of two elements both in the server list the earlier goes first,
/// otherwise the patch's element does.
fn normalize_order(
    merged: Vec<Value>,
    patch: &[Value],
    server: &[Value],
    id: impl Fn(&Value) -> Value,
) -> Vec<Value> {
    let patch_ids: Vec<Value> = patch.iter().map(&id).collect();
    let server_ids: Vec<Value> = server.iter().map(&id).collect();
    let index = |ids: &[Value], v: &Value| ids.iter().position(|x| *x == id(v));
    let (mut from_patch, mut server_only): (Vec<Value>, Vec<Value>) = merged
        .into_iter()
        .partition(|v| index(&patch_ids, v).is_some());
    from_patch.sort_by_key(|v| index(&patch_ids, v));
    server_only.sort_by_key(|v| index(&server_ids, v));
    let mut out = Vec::with_capacity(from_patch.len() + server_only.len());
    let (mut left, mut right) = (
        server_only.into_iter().peekable(),
        from_patch.into_iter().peekable(),
    );
    loop {
        let take_left = match (left.peek(), right.peek()) {
            (None, None) => break,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(l), Some(r)) => matches!(
                (index(&server_ids, l), index(&server_ids, r)),
                (Some(li), Some(ri)) if li < ri
            ),
        };
        let next = if take_left { left.next() } else { right.next() };
        out.extend(next);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn smp(orig: Value, patch: Value) -> Value {
        let mut o = orig;
        strategic_merge(&mut o, &patch).unwrap();
        o
    }

    #[test]
    fn containers_merge_by_name_and_env_by_name() {
        let orig = json!({"spec": {"containers": [
            {"name": "a", "image": "a:1", "env": [{"name": "X", "value": "1"}]},
            {"name": "b", "image": "b:1"}]}});
        let out = smp(
            orig,
            json!({"spec": {"containers": [
            {"name": "b", "image": "b:2"},
            {"name": "a", "env": [{"name": "Y", "value": "2"}]},
            {"name": "c", "image": "c:1"}]}}),
        );
        assert_eq!(
            out,
            json!({"spec": {"containers": [
            {"name": "b", "image": "b:2"},
            {"name": "a", "image": "a:1", "env": [{"name": "Y", "value": "2"}, {"name": "X", "value": "1"}]},
            {"name": "c", "image": "c:1"}]}}),
            "patch order first, like the real server"
        );
    }

    #[test]
    fn directives_replace_delete_and_primitive_lists() {
        let orig = json!({"metadata": {"labels": {"a": "1", "b": "2"}, "finalizers": ["x", "y"]},
            "status": {"conditions": [{"type": "Ready", "status": "False"}, {"type": "Other", "status": "True"}]}});
        let out = smp(
            orig,
            json!({
            "metadata": {"labels": {"$patch": "replace", "c": "3"}, "$deleteFromPrimitiveList/finalizers": ["x"]},
            "status": {"$setElementOrder/conditions": [{"type": "Ready"}], "conditions": [{"type": "Other", "$patch": "delete"}, {"type": "Ready", "status": "True"}]}}),
        );
        assert_eq!(
            out,
            json!({"metadata": {"labels": {"c": "3"}, "finalizers": ["y"]},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}})
        );
        let out = smp(
            json!({"metadata": {"finalizers": ["x"]}}),
            json!({"metadata": {"finalizers": ["y", "x"]}}),
        );
        assert_eq!(
            out,
            json!({"metadata": {"finalizers": ["y", "x"]}}),
            "patch order, like the real server"
        );
        let out = smp(
            json!({"metadata": {"finalizers": ["a", "x"]}}),
            json!({"metadata": {"finalizers": ["z"]}}),
        );
        assert_eq!(
            out,
            json!({"metadata": {"finalizers": ["z", "a", "x"]}}),
            "a new value goes first"
        );
    }

    #[test]
    fn container_statuses_are_replaced_like_the_real_server() {
        let out = smp(
            json!({"status": {"containerStatuses": [{"name": "a", "ready": true}, {"name": "b", "ready": true}]}}),
            json!({"status": {"containerStatuses": [{"name": "a", "ready": false}]}}),
        );
        assert_eq!(
            out,
            json!({"status": {"containerStatuses": [{"name": "a", "ready": false}]}})
        );
    }

    #[test]
    fn missing_merge_key_is_rejected() {
        let mut o = json!({"spec": {"containers": [{"name": "a"}]}});
        assert!(
            strategic_merge(&mut o, &json!({"spec": {"containers": [{"image": "x"}]}})).is_err()
        );
    }
}
