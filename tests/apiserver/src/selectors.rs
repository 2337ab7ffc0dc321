//! Label and field selectors with kube-apiserver's grammar and semantics.
//!
//! Label selectors: `k=v`, `k==v`, `k!=v`, `k`, `!k`, `k in (a,b)`,
//! `k notin (a,b)`, `k>n`, `k<n`, comma means AND. `!=` and `notin` match
//! objects without the label, like the real server.
//!
//! Field selectors: `key=v`, `key==v`, `key!=v`, comma means AND, with `\`
//! escaping. Keys a kind does not support answer `400 BadRequest` with
//! `field label not supported: <key>`, custom resources included.

use std::sync::OnceLock;

use regex::Regex;
use serde_json::Value;

use crate::kinds::KindInfo;
use crate::status::ApiError;

#[derive(Clone, Debug, PartialEq)]
enum LabelOp {
    Eq(String),
    NotEq(String),
    In(Vec<String>),
    NotIn(Vec<String>),
    Exists,
    NotExists,
    Gt(i64),
    Lt(i64),
}

/// A parsed label selector (AND of requirements).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LabelSelector {
    reqs: Vec<(String, LabelOp)>,
}

/// The characters that end a key or a value.
const WORD: &str = r"[^\s=!(),<>]";

/// The top-level terms of a selector: split at the commas outside parentheses.
fn terms(s: &str) -> Vec<&str> {
    let (mut out, mut depth, mut from) = (Vec::new(), 0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[from..i]);
                from = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[from..]);
    out
}

impl LabelSelector {
    /// Parse a `labelSelector` query value.
    pub fn parse(s: &str) -> Result<Self, String> {
        static TERM: OnceLock<Regex> = OnceLock::new();
        let term = TERM.get_or_init(|| {
            let w = WORD;
            Regex::new(&format!(
                r"^\s*(?:!\s*(?P<absent>{w}+)|(?P<key>{w}+)\s*(?:(?P<eq>==|=|!=)\s*(?P<value>{w}*)|(?P<cmp>[<>])\s*(?P<n>\S+)|\s(?P<set>in|notin)\s*\((?P<values>[^()]*)\))?)\s*$"
            ))
            .expect("the label selector grammar compiles")
        });
        let mut reqs = Vec::new();
        for t in terms(s).into_iter().filter(|_| !s.trim().is_empty()) {
            let c = term
                .captures(t)
                .ok_or_else(|| format!("unable to parse requirement: {t:?}"))?;
            let text = |name: &str| c.name(name).map_or("", |m| m.as_str()).to_string();
            let values = || {
                let values = text("values");
                let values = values
                    .split([',', ' ', '\t', '\n'])
                    .filter(|v| !v.is_empty());
                values.map(str::to_string).collect()
            };
            let number = || {
                text("n").parse().map_err(|_| {
                    "unable to parse requirement: for 'Gt', 'Lt' operators, the value must be an integer"
                })
            };
            let op = |name: &str| c.name(name).map(|m| m.as_str());
            let req = match (op("absent"), op("eq"), op("cmp"), op("set")) {
                (Some(key), ..) => (key.to_string(), LabelOp::NotExists),
                (_, Some("!="), ..) => (text("key"), LabelOp::NotEq(text("value"))),
                (_, Some(_), ..) => (text("key"), LabelOp::Eq(text("value"))),
                (_, _, Some(">"), _) => (text("key"), LabelOp::Gt(number()?)),
                (_, _, Some(_), _) => (text("key"), LabelOp::Lt(number()?)),
                (.., Some("in")) => (text("key"), LabelOp::In(values())),
                (.., Some(_)) => (text("key"), LabelOp::NotIn(values())),
                _ => (text("key"), LabelOp::Exists),
            };
            reqs.push(req);
        }
        if let Some((k, _)) = reqs.iter().find(|(k, _)| k.len() > 317) {
            return Err(format!("invalid label key {k:?}"));
        }
        Ok(LabelSelector { reqs })
    }

    /// Whether the selector has no requirements (matches everything).
    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    /// Whether an object's `metadata.labels` satisfy every requirement.
    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels").and_then(Value::as_object);
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        let number = |k: &str| get(k).and_then(|x| x.parse::<i64>().ok());
        self.reqs.iter().all(|(k, op)| match op {
            LabelOp::Eq(v) => get(k) == Some(v.as_str()),
            LabelOp::NotEq(v) => get(k) != Some(v.as_str()),
            LabelOp::In(vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            LabelOp::NotIn(vs) => get(k).is_none_or(|x| !vs.iter().any(|v| v == x)),
            LabelOp::Exists => get(k).is_some(),
            LabelOp::NotExists => get(k).is_none(),
            LabelOp::Gt(n) => number(k).is_some_and(|x| x > *n),
            LabelOp::Lt(n) => number(k).is_some_and(|x| x < *n),
        })
    }
}

/// A parsed field selector (AND of `key=value` / `key!=value` terms).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FieldSelector {
    reqs: Vec<(String, bool, String)>,
}

fn split_unescaped(s: &str, sep: char) -> Vec<String> {
    let mut parts = Vec::new();
    let mut cur = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            cur.push(c);
            if let Some(n) = chars.next() {
                cur.push(n);
            }
        } else if c == sep {
            parts.push(std::mem::take(&mut cur));
        } else {
            cur.push(c);
        }
    }
    parts.push(cur);
    parts
}

impl FieldSelector {
    /// Parse a `fieldSelector` query value.
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut reqs = Vec::new();
        if s.trim().is_empty() {
            return Ok(FieldSelector { reqs });
        }
        for term in split_unescaped(s, ',') {
            // the key (escapes kept) up to the first unescaped `=`, `==` or `!=`; the value
            // after it with its escapes undone
            let (mut key, mut neg, mut value) = (String::new(), None, String::new());
            let mut chars = term.chars().peekable();
            while let Some(c) = chars.next() {
                let into = if neg.is_some() { &mut value } else { &mut key };
                match c {
                    '\\' if neg.is_none() => {
                        key.extend([Some(c), chars.next()].into_iter().flatten())
                    }
                    '\\' => value.extend(chars.next()),
                    '=' | '!' if neg.is_none() && (c == '=' || chars.peek() == Some(&'=')) => {
                        chars.next_if_eq(&'=');
                        neg = Some(c == '!');
                    }
                    _ => into.push(c),
                }
            }
            let neg =
                neg.ok_or_else(|| format!("invalid selector: '{s}'; can't understand '{term}'"))?;
            reqs.push((key.trim().to_string(), neg, value));
        }
        Ok(FieldSelector { reqs })
    }

    /// Whether the selector has no terms.
    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    /// The value the selector requires for `key` with `=`, if any.
    pub fn required(&self, key: &str) -> Option<&str> {
        self.reqs
            .iter()
            .find(|(k, neg, _)| k == key && !neg)
            .map(|(_, _, v)| v.as_str())
    }

    /// 400 for keys `kind` does not support, worded like the real server (the
    /// same for custom resources; cluster-scoped kinds have no `metadata.namespace`).
    pub fn check(&self, kind: &KindInfo) -> Result<(), ApiError> {
        for (key, _, _) in &self.reqs {
            if !kind.supports_field(key) {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {key}"
                )));
            }
        }
        Ok(())
    }

    /// Whether `obj` (in `kind`'s representation) satisfies every term.
    pub fn matches(&self, kind: &KindInfo, obj: &Value) -> bool {
        self.reqs.iter().all(|(key, neg, want)| {
            let got = field_value(kind, obj, key);
            (got == *want) != *neg
        })
    }
}

fn field_value(kind: &KindInfo, obj: &Value, key: &str) -> String {
    let (path, default) = match key {
        "metadata.name" => ("metadata.name", ""),
        "metadata.namespace" => ("metadata.namespace", ""),
        _ => match kind.fields.iter().find(|f| f.key == key) {
            Some(f) => (f.path.as_str(), f.default.as_str()),
            None => return String::new(),
        },
    };
    let mut cur = obj;
    for seg in path.split('.') {
        match cur.get(seg) {
            Some(v) => cur = v,
            None => return default.to_string(),
        }
    }
    match cur {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::Null => default.to_string(),
        other => other.to_string(),
    }
}

/// The selectors of one list or watch request.
#[derive(Clone, Debug, Default)]
pub struct Selectors {
    /// `labelSelector`.
    pub labels: LabelSelector,
    /// `fieldSelector`.
    pub fields: FieldSelector,
}

impl Selectors {
    /// Parse both selectors and check the field keys against `kind`.
    pub fn parse(
        kind: &KindInfo,
        label: Option<&str>,
        field: Option<&str>,
    ) -> Result<Self, ApiError> {
        let labels = LabelSelector::parse(label.unwrap_or("")).map_err(ApiError::bad_request)?;
        let fields = FieldSelector::parse(field.unwrap_or("")).map_err(ApiError::bad_request)?;
        fields.check(kind)?;
        Ok(Selectors { labels, fields })
    }

    /// Whether `obj` (in `kind`'s representation) matches both selectors.
    pub fn matches(&self, kind: &KindInfo, obj: &Value) -> bool {
        self.labels.matches(obj) && self.fields.matches(kind, obj)
    }

    /// Whether neither selector has any terms.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.fields.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(labels: Value) -> Value {
        json!({"metadata": {"name": "a", "labels": labels}, "spec": {"nodeName": "n1"}})
    }

    #[test]
    fn label_selector_grammar_matches_like_the_real_server() {
        let o = obj(json!({"app": "web", "tier": "fe", "n": "5"}));
        let yes = [
            "app=web",
            "app==web",
            "app!=db",
            "app",
            "!missing",
            "app in (web,db)",
            "tier notin (be)",
            "missing notin (x)",
            "app=web,tier=fe",
            "n>3",
            "n<6",
            "app in ( web , db )",
        ];
        let no = [
            "app=db",
            "app!=web",
            "missing",
            "!app",
            "app in (db)",
            "app notin (web)",
            "app=web,tier=be",
            "n>5",
        ];
        for s in yes {
            assert!(
                LabelSelector::parse(s).unwrap().matches(&o),
                "{s} should match"
            );
        }
        for s in no {
            assert!(
                !LabelSelector::parse(s).unwrap().matches(&o),
                "{s} should not match"
            );
        }
        assert!(LabelSelector::parse("app in (a").is_err());
        assert!(LabelSelector::parse("=x").is_err());
    }

    #[test]
    fn field_selector_handles_escapes_and_negation() {
        let kind = crate::kinds::default_kinds().remove(0);
        let o = obj(json!({}));
        let sel = FieldSelector::parse("metadata.name=a,spec.nodeName!=n2").unwrap();
        assert!(sel.matches(&kind, &o));
        let sel = FieldSelector::parse("spec.nodeName==n2").unwrap();
        assert!(!sel.matches(&kind, &o));
        let sel = FieldSelector::parse(r"metadata.name=a\,b").unwrap();
        assert_eq!(sel.required("metadata.name"), Some("a,b"));
        assert!(
            FieldSelector::parse("spec.foo=1")
                .unwrap()
                .check(&kind)
                .is_err()
        );
        assert!(FieldSelector::parse("nonsense").is_err());
    }
}
