//! Discovery documents (`/api`, `/apis`, `/api/v1`, `/apis/{group}[/{version}]`)
//! and `/version`, generated from the kind table.

use std::net::SocketAddr;
use std::sync::OnceLock;

use regex::Regex;
use serde_json::{Value, json};

use crate::kinds::KindInfo;

const VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

/// `/version`.
pub(crate) fn version(git_version: &str) -> Value {
    let trimmed = git_version.trim_start_matches('v');
    let mut parts = trimmed.split('.');
    let major = parts.next().unwrap_or("1");
    let minor = parts.next().unwrap_or("0");
    json!({
        "major": major,
        "minor": minor,
        "gitVersion": git_version,
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-04-23T00:00:00Z",
        "goVersion": "go1.24.2",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

/// `/api`.
pub(crate) fn api_versions(addr: SocketAddr) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": addr.to_string()}],
    })
}

/// Kubernetes version priority: GA before beta before alpha, higher numbers
/// first, anything else last (alphabetically).
fn version_priority(v: &str) -> (u8, i64, i64, String) {
    static RE: OnceLock<Regex> = OnceLock::new();
    let re = RE.get_or_init(|| {
        Regex::new(r"^v(\d+)(?:(beta|alpha)(\d+))?$").expect("the version pattern compiles")
    });
    let number = |c: &regex::Captures<'_>, i| c.get(i).map_or(Some(0), |m| m.as_str().parse().ok());
    let parsed = re.captures(v).and_then(|c| {
        let level = c
            .get(2)
            .map_or(0, |l| if l.as_str() == "beta" { 1 } else { 2 });
        Some((level, -number(&c, 1)?, -number(&c, 3)?, String::new()))
    });
    parsed.unwrap_or((3, 0, 0, v.to_string()))
}

/// Served groups with their versions, preferred (highest priority) first.
fn groups(kinds: &[KindInfo]) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for k in kinds.iter().filter(|k| !k.group.is_empty()) {
        match out.iter_mut().find(|(g, _)| *g == k.group) {
            Some((_, vs)) => {
                if !vs.contains(&k.version) {
                    vs.push(k.version.clone());
                }
            }
            None => out.push((k.group.clone(), vec![k.version.clone()])),
        }
    }
    for (_, vs) in &mut out {
        vs.sort_by_key(|v| version_priority(v));
    }
    out
}

fn group_doc(name: &str, versions: &[String]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v}))
        .collect();
    json!({"name": name, "versions": vs, "preferredVersion": vs.first().cloned().unwrap_or(Value::Null)})
}

/// `/apis`.
pub(crate) fn group_list(kinds: &[KindInfo]) -> Value {
    let gs: Vec<Value> = groups(kinds)
        .iter()
        .map(|(g, vs)| group_doc(g, vs))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": gs})
}

/// `/apis/{group}`, if the group is served.
pub(crate) fn group(kinds: &[KindInfo], name: &str) -> Option<Value> {
    let gs = groups(kinds);
    let (g, vs) = gs.iter().find(|(g, _)| g == name)?;
    let mut doc = group_doc(g, vs);
    doc["kind"] = json!("APIGroup");
    doc["apiVersion"] = json!("v1");
    Some(doc)
}

/// `/api/v1` or `/apis/{group}/{version}`, if served.
pub(crate) fn resource_list(kinds: &[KindInfo], group: &str, version: &str) -> Option<Value> {
    let mut resources = Vec::new();
    for k in kinds
        .iter()
        .filter(|k| k.group == group && k.version == version)
    {
        let mut r = json!({
            "name": k.plural,
            "singularName": k.singular,
            "namespaced": k.namespaced,
            "kind": k.kind,
            "verbs": VERBS,
        });
        if !k.short_names.is_empty() {
            r["shortNames"] = json!(k.short_names);
        }
        resources.push(r);
        if k.status_subresource {
            resources.push(json!({
                "name": format!("{}/status", k.plural),
                "singularName": "",
                "namespaced": k.namespaced,
                "kind": k.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
    }
    if resources.is_empty() {
        return None;
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}),
    )
}
