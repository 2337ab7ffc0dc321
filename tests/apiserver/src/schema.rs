//! Structural schemas of custom resources and what kube-apiserver's CRD
//! handler does with them: pruning of unknown fields (with a warning per
//! field on writes), removal of `null` values, defaulting, and validation of
//! types, formats, `required`, `enum`, bounds, patterns and list-map keys,
//! with ratcheting (a value equal to the old object's is not validated again).
//!
//! The messages follow the real server's wording (measured on v1.36, see
//! `CONFORMANCE.md`). [`kruise_schema`] gives the schemas of OpenKruise's
//! CRDs, embedded from `src/schemas/kruise.json` (see `src/schemas/README.md`).

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use serde::Deserialize;
use serde_json::{Map, Value};

/// A validation failure: `(field path, reason, message)`.
pub type Cause = (String, &'static str, String);

/// A compiled `pattern`.
#[derive(Clone, Debug, Deserialize)]
#[serde(from = "String")]
struct Pattern(String, Option<regex::Regex>);

impl From<String> for Pattern {
    fn from(p: String) -> Self {
        let re = regex::Regex::new(&p).ok();
        Pattern(p, re)
    }
}

/// One node of an OpenAPI v3 structural schema (`openAPIV3Schema`; other keywords ignored).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Schema {
    #[serde(rename = "type")]
    ty: Option<String>,
    format: Option<String>,
    properties: Option<BTreeMap<String, Schema>>,
    items: Option<Box<Schema>>,
    #[serde(rename = "additionalProperties")]
    additional: Option<Box<Schema>>,
    required: Vec<String>,
    #[serde(rename = "enum")]
    enumeration: Vec<Value>,
    default: Option<Value>,
    nullable: bool,
    minimum: Option<f64>,
    maximum: Option<f64>,
    min_length: Option<usize>,
    max_length: Option<usize>,
    pattern: Option<Pattern>,
    #[serde(rename = "x-kubernetes-int-or-string")]
    int_or_string: bool,
    #[serde(rename = "x-kubernetes-preserve-unknown-fields")]
    preserve_unknown: bool,
    #[serde(rename = "x-kubernetes-list-type")]
    list_type: Option<String>,
    #[serde(rename = "x-kubernetes-list-map-keys")]
    list_map_keys: Vec<String>,
}

/// The fields of an object's root that its schema neither prunes nor checks.
const ROOT_FIELDS: &[&str] = &["apiVersion", "kind", "metadata"];

/// The fields of `ObjectMeta`; anything else under `metadata` is dropped.
const OBJECT_META: &[&str] = &[
    "name",
    "generateName",
    "namespace",
    "selfLink",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
];

/// Drop unknown `metadata` fields like the real server's `ObjectMeta`
/// decoding, pushing an `unknown field "metadata.x"` warning for each.
pub(crate) fn prune_object_meta(obj: &mut Value, warnings: &mut Vec<String>) {
    if let Some(Value::Object(meta)) = obj.get_mut("metadata") {
        let unknown: Vec<String> = meta
            .keys()
            .filter(|k| !OBJECT_META.contains(&k.as_str()))
            .cloned()
            .collect();
        for k in unknown {
            meta.remove(&k);
            warnings.push(format!("unknown field \"metadata.{k}\""));
        }
    }
}

fn path_join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// The path as the real server names it inside messages: without the
/// top-level field (`status.desired` is "desired in body ...").
fn body_name(path: &str) -> &str {
    match path.split_once('.') {
        Some((_, rest)) => rest,
        None => path,
    }
}

fn top_field(path: &str) -> &str {
    path.split(['.', '[']).next().unwrap_or(path)
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "float64",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn is_integral(v: &Value) -> bool {
    match v {
        Value::Number(n) => {
            n.is_i64() || n.is_u64() || n.as_f64().is_some_and(|f| f.fract() == 0.0)
        }
        _ => false,
    }
}

/// `FieldValueTypeInvalid`: the value at `path`, of type (or text) `got`, is not a `want`.
fn type_invalid(path: &str, got: &str, want: &str) -> Cause {
    let name = body_name(path);
    let why = format!("Invalid value: \"{got}\": {name} in body must be of type {want}: \"{got}\"");
    (path.to_string(), "FieldValueTypeInvalid", why)
}

fn type_matches(ty: &str, v: &Value) -> bool {
    match ty {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "boolean" => v.is_boolean(),
        "number" => v.is_number(),
        "integer" => is_integral(v),
        _ => true,
    }
}

fn number_text(f: f64) -> String {
    if f.fract() == 0.0 && f.abs() < 1e15 {
        format!("{}", f as i64)
    } else {
        f.to_string()
    }
}

/// What `strfmt` accepts as a `date-time`: RFC 3339 and the ISO 8601 variants
/// (seconds, fraction and zone optional; `T` or a space); `""` is valid.
fn is_date_time(s: &str) -> bool {
    static RE: OnceLock<regex::Regex> = OnceLock::new();
    let re = RE.get_or_init(|| {
        regex::Regex::new(
            r"^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}(:[0-9]{2}(\.[0-9]+)?)?([Zz]|[+-](:*[0-9]){4}:*)?$",
        )
        .expect("the date-time pattern compiles")
    });
    s.is_empty() || re.is_match(s)
}

impl Schema {
    /// Prune, drop `null`s and default a whole object (the root: `apiVersion`,
    /// `kind` and `metadata` are kept, `metadata` coerced to `ObjectMeta`).
    /// With `warnings`, every dropped unknown field is reported like the real
    /// server's `Warning: 299 - "unknown field \"spec.x\""` headers.
    pub fn normalize(&self, obj: &mut Value, warnings: Option<&mut Vec<String>>) {
        let Value::Object(map) = obj else {
            return;
        };
        let kept: Vec<(String, Value)> = ROOT_FIELDS
            .iter()
            .filter_map(|k| map.remove_entry(*k))
            .collect();
        let mut sink = Vec::new();
        self.normalize_node(obj, "", &mut sink);
        if let Value::Object(map) = obj {
            map.extend(kept);
        }
        prune_object_meta(obj, &mut sink);
        if let Some(w) = warnings {
            sink.sort();
            w.extend(sink);
        }
    }

    fn normalize_node(&self, v: &mut Value, path: &str, warn: &mut Vec<String>) {
        match v {
            Value::Object(map) => {
                if self.preserve_unknown && self.properties.is_none() && self.additional.is_none() {
                    return;
                }
                if let Some(props) = &self.properties {
                    let mut unknown = Vec::new();
                    map.retain(|k, x| {
                        if x.is_null() && !props.get(k).is_some_and(|p| p.nullable) {
                            return false;
                        }
                        let known = props.contains_key(k) || self.preserve_unknown;
                        if !known {
                            unknown.push(k.clone());
                        }
                        known
                    });
                    for k in unknown {
                        warn.push(format!("unknown field \"{}\"", path_join(path, &k)));
                    }
                    for (k, p) in props {
                        if !map.contains_key(k)
                            && let Some(d) = &p.default
                        {
                            map.insert(k.clone(), d.clone());
                        }
                        if let Some(x) = map.get_mut(k) {
                            p.normalize_node(x, &path_join(path, k), warn);
                        }
                    }
                } else if let Some(add) = &self.additional {
                    map.retain(|_, x| !x.is_null() || add.nullable);
                    for (k, x) in map.iter_mut() {
                        add.normalize_node(x, &path_join(path, k), warn);
                    }
                } else if self.ty.as_deref() == Some("object") && !self.preserve_unknown {
                    for k in map.keys() {
                        warn.push(format!("unknown field \"{}\"", path_join(path, k)));
                    }
                    map.clear();
                }
            }
            Value::Array(items) => {
                if let Some(item) = &self.items {
                    for (i, x) in items.iter_mut().enumerate() {
                        item.normalize_node(x, &format!("{path}[{i}]"), warn);
                    }
                }
            }
            _ => {}
        }
    }

    /// Validate a (normalized) object against the schema. Values equal to
    /// those at the same place in `old` are not checked (ratcheting).
    pub fn validate(&self, obj: &Value, old: Option<&Value>) -> Vec<Cause> {
        let mut causes = Vec::new();
        if let Value::Object(map) = obj {
            self.check_object(map, old, "", &mut causes);
        }
        causes
    }

    fn validate_node(&self, v: &Value, old: Option<&Value>, path: &str, out: &mut Vec<Cause>) {
        if old == Some(v) {
            return;
        }
        if self.int_or_string {
            if !(is_integral(v) || v.is_string()) {
                out.push(type_invalid(path, type_name(v), "integer,string"));
            }
            return;
        }
        if let Some(ty) = &self.ty
            && !type_matches(ty, v)
        {
            let want = match (ty.as_str(), &self.format, v) {
                ("integer", Some(f), Value::Number(_)) => f.as_str(),
                _ => ty.as_str(),
            };
            out.push(type_invalid(path, type_name(v), want));
            return;
        }
        if !self.enumeration.is_empty() && !self.enumeration.contains(v) {
            let supported: Vec<String> = self.enumeration.iter().map(Value::to_string).collect();
            let why = format!(
                "Unsupported value: {v}: supported values: {}",
                supported.join(", ")
            );
            out.push((path.to_string(), "FieldValueNotSupported", why));
        }
        match v {
            Value::Number(n) => self.check_number(n, v, path, out),
            Value::String(s) => self.check_string(s, path, out),
            Value::Object(map) => self.check_object(map, old, path, out),
            Value::Array(items) => self.check_array(items, old, path, out),
            _ => {}
        }
    }

    fn check_number(&self, n: &serde_json::Number, v: &Value, path: &str, out: &mut Vec<Cause>) {
        let f = n.as_f64().unwrap_or(0.0);
        if self.format.as_deref() == Some("int32")
            && !(-2_147_483_648.0..=2_147_483_647.0).contains(&f)
        {
            let name = body_name(path);
            let why = format!(
                "Invalid value: \"\": Checked value must be of type integer with format int32 in {name}"
            );
            out.push((top_field(path).to_string(), "FieldValueInvalid", why));
        }
        let mut invalid = |why: String| out.push((path.to_string(), "FieldValueInvalid", why));
        if let Some(min) = self.minimum.filter(|min| f < *min).map(number_text) {
            invalid(format!(
                "Invalid value: {v}: {path} in body should be greater than or equal to {min}"
            ));
        }
        if let Some(max) = self.maximum.filter(|max| f > *max).map(number_text) {
            invalid(format!(
                "Invalid value: {v}: {path} in body should be less than or equal to {max}"
            ));
        }
    }

    fn check_string(&self, s: &str, path: &str, out: &mut Vec<Cause>) {
        if self.format.as_deref() == Some("date-time") && !is_date_time(s) {
            out.push(type_invalid(path, s, "date-time"));
        }
        let (name, chars) = (body_name(path), s.chars().count());
        if let Some(max) = self.max_length.filter(|max| chars > *max) {
            let why = format!("Too long: may not be more than {max} bytes");
            out.push((path.to_string(), "FieldValueTooLong", why));
        }
        let mut invalid = |why: String| out.push((path.to_string(), "FieldValueInvalid", why));
        if let Some(min) = self.min_length.filter(|min| chars < *min) {
            invalid(format!(
                "Invalid value: \"{s}\": {name} in body should be at least {min} chars long"
            ));
        }
        if let Some(Pattern(p, Some(re))) = &self.pattern
            && !re.is_match(s)
        {
            invalid(format!(
                "Invalid value: \"{s}\": {name} in body should match '{p}'"
            ));
        }
    }

    fn check_object(
        &self,
        map: &Map<String, Value>,
        old: Option<&Value>,
        path: &str,
        out: &mut Vec<Cause>,
    ) {
        let old_child = |k: &str| old.and_then(|o| o.get(k));
        if let Some(props) = &self.properties {
            // the root's apiVersion, kind and metadata are not the schema's to check
            let own = props
                .iter()
                .filter(|(k, _)| !path.is_empty() || !ROOT_FIELDS.contains(&k.as_str()));
            for (k, p) in own {
                match map.get(k) {
                    Some(x) => p.validate_node(x, old_child(k), &path_join(path, k), out),
                    None if self.required.contains(k) => out.push((
                        path_join(path, k),
                        "FieldValueRequired",
                        "Required value".into(),
                    )),
                    None => {}
                }
            }
        } else if let Some(add) = &self.additional {
            for (k, x) in map {
                add.validate_node(x, old_child(k), &path_join(path, k), out);
            }
        }
    }

    fn check_array(&self, items: &[Value], old: Option<&Value>, path: &str, out: &mut Vec<Cause>) {
        let Some(item) = &self.items else { return };
        let key_of = |x: &Value| -> Value {
            Value::Object(
                self.list_map_keys
                    .iter()
                    .filter_map(|k| x.get(k).map(|v| (k.clone(), v.clone())))
                    .collect(),
            )
        };
        let is_map = self.list_type.as_deref() == Some("map") && !self.list_map_keys.is_empty();
        let old_items = old.and_then(Value::as_array);
        let mut seen: Vec<Value> = Vec::new();
        for (i, x) in items.iter().enumerate() {
            let here = format!("{path}[{i}]");
            let old_x = match (is_map, old_items) {
                (true, Some(olds)) => olds.iter().find(|o| key_of(o) == key_of(x)),
                _ => None,
            };
            item.validate_node(x, old_x, &here, out);
            let identity = match self.list_type.as_deref() {
                Some("map") if is_map => Some(key_of(x)),
                Some("set") => Some(x.clone()),
                _ => None,
            };
            if let Some(id) = identity {
                if seen.contains(&id) {
                    out.push((
                        here,
                        "FieldValueDuplicate",
                        format!("Duplicate value: {id}"),
                    ));
                } else {
                    seen.push(id);
                }
            }
        }
    }
}

/// The schemas of OpenKruise's CRDs, by plural and version (see `src/schemas/README.md`).
pub fn kruise_schema(plural: &str, version: &str) -> Option<Arc<Schema>> {
    type Versions = BTreeMap<String, Arc<Schema>>;
    static ALL: OnceLock<BTreeMap<String, Versions>> = OnceLock::new();
    let all = ALL.get_or_init(|| {
        serde_json::from_str(include_str!("schemas/kruise.json")).expect("the kruise schemas parse")
    });
    all.get(plural)?.get(version).cloned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn date_times_like_strfmt() {
        for ok in [
            "",
            "2025-01-01T00:00:00Z",
            "2025-01-01T00:00:00.123456789Z",
            "2025-01-01T00:00:00+02:00",
            "2025-01-01 00:00:00",
            "2025-01-01T00:00Z",
        ] {
            assert!(is_date_time(ok), "{ok}");
        }
        for bad in [
            "not-a-date",
            "2025-01-01",
            "2025-01-01T00:00:00.Z",
            "2025-1-01T00:00:00Z",
        ] {
            assert!(!is_date_time(bad), "{bad}");
        }
    }

    #[test]
    fn the_embedded_kruise_schemas_parse() {
        for (plural, versions) in [
            ("nodeimages", &["v1alpha1", "v1beta1"][..]),
            ("containerrecreaterequests", &["v1alpha1", "v1beta1"][..]),
            ("imagepulljobs", &["v1alpha1", "v1beta1"][..]),
            ("nodepodprobes", &["v1alpha1"][..]),
            ("podprobemarkers", &["v1alpha1"][..]),
        ] {
            for v in versions {
                let s = kruise_schema(plural, v).unwrap_or_else(|| panic!("{plural} {v}"));
                assert!(
                    s.properties
                        .as_ref()
                        .is_some_and(|p| p.contains_key("spec"))
                );
            }
        }
        let mut obj = json!({"apiVersion": "x", "kind": "NodeImage", "metadata": {"name": "n", "x": 1},
            "spec": {"images": {"a": {"tags": [{"tag": "1", "version": null}]}}}, "junk": 1});
        let mut w = Vec::new();
        kruise_schema("nodeimages", "v1beta1")
            .unwrap_or_default()
            .normalize(&mut obj, Some(&mut w));
        assert_eq!(
            obj,
            json!({"apiVersion": "x", "kind": "NodeImage", "metadata": {"name": "n"},
                "spec": {"images": {"a": {"tags": [{"tag": "1"}]}}}})
        );
        assert_eq!(
            w,
            ["unknown field \"junk\"", "unknown field \"metadata.x\""]
        );
    }

    #[test]
    fn bounds_patterns_duplicates_and_int32_are_worded_like_the_real_server() {
        let crr = kruise_schema("containerrecreaterequests", "v1beta1").unwrap_or_default();
        let cond = |t: &str, reason: &str| {
            json!({"type": t, "status": "True", "reason": reason, "message": "m",
                "lastTransitionTime": "2025-01-01T00:00:00Z"})
        };
        let obj = json!({"spec": {"podName": "p", "containers": [{"name": "c"}],
                "activeDeadlineSeconds": -1},
            "status": {"phase": "Pending", "conditions": [cond("A", "bad reason!"), cond("A", "R")]}});
        let causes = crr.validate(&obj, None);
        assert_eq!(
            causes,
            vec![
                (
                    "spec.activeDeadlineSeconds".to_string(),
                    "FieldValueInvalid",
                    "Invalid value: -1: spec.activeDeadlineSeconds in body should be greater than or equal to 0".to_string()
                ),
                (
                    "status.conditions[0].reason".to_string(),
                    "FieldValueInvalid",
                    "Invalid value: \"bad reason!\": conditions[0].reason in body should match '^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$'".to_string()
                ),
                (
                    "status.conditions[1]".to_string(),
                    "FieldValueDuplicate",
                    "Duplicate value: {\"type\":\"A\"}".to_string()
                ),
            ]
        );
        assert!(
            crr.validate(&obj, Some(&obj)).is_empty(),
            "all unchanged: ratcheted"
        );
        let ni = kruise_schema("nodeimages", "v1beta1").unwrap_or_default();
        assert_eq!(
            ni.validate(&json!({"status": {"desired": 4_294_967_296_i64}}), None),
            vec![(
                "status".to_string(),
                "FieldValueInvalid",
                "Invalid value: \"\": Checked value must be of type integer with format int32 in desired".to_string()
            )]
        );
    }
}
