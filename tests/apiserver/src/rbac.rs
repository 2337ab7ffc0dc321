//! RBAC authorization as kube-apiserver's RBAC authorizer does it (k8s.io/kubernetes
//! `plugin/pkg/auth/authorizer/rbac`, `pkg/apis/rbac/v1/evaluation_helpers.go`), over the
//! ClusterRoles, ClusterRoleBindings, Roles and RoleBindings in the store; the default roles
//! the real server bootstraps for discovery; and loading RBAC (or any served kind) from YAML
//! manifests.
//!
//! What it leaves out: aggregated ClusterRoles (`aggregationRule`: the real controller fills
//! their rules; here they have the rules they were given), the escalation check on writes of
//! roles and bindings, impersonation, and authorizers other than RBAC (Node, webhooks) beside
//! the `system:masters` bypass.

use serde_json::{Value, json};

use crate::auth::{AUTHENTICATED, Attributes, MASTERS, UNAUTHENTICATED, UserInfo, forbidden};
use crate::kinds::RBAC_GROUP;
use crate::ops::{self, Origin, meta_str, non_empty};
use crate::status::ApiError;
use crate::store::State;

/// Whether `user` may do what `attrs` describe; the `403` to answer if not.
pub(crate) fn authorize(st: &State, user: &UserInfo, attrs: &Attributes) -> Result<(), ApiError> {
    if user.groups.iter().any(|g| g == MASTERS) {
        // the privileged-group authorizer, before RBAC
        return Ok(());
    }
    let mut errors: Vec<String> = Vec::new();
    let objects = |plural: &str| -> Vec<Value> {
        st.kinds
            .find(RBAC_GROUP, "v1", plural)
            .map(|i| {
                st.objects(st.kinds.storage_of(i))
                    .map(|o| (**o).clone())
                    .collect()
            })
            .unwrap_or_default()
    };
    // RoleBindings only for a namespaced request, and only those of its namespace
    let mut bindings = objects("clusterrolebindings");
    if !attrs.namespace.is_empty() {
        bindings.extend(objects("rolebindings"));
    }
    for binding in bindings {
        let ns = binding
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("");
        if (!ns.is_empty() && ns != attrs.namespace) || !applies_to(user, &binding["subjects"], ns)
        {
            continue;
        }
        match role_rules(st, &binding["roleRef"], ns) {
            Ok(rules) if rules.iter().any(|r| rule_allows(attrs, r)) => return Ok(()),
            Ok(_) => {}
            Err(e) => errors.push(e),
        }
    }
    // the RBAC authorizer's reason: only the errors it met (missing roles), aggregated
    errors.dedup();
    let reason = match errors.len() {
        0 => String::new(),
        1 => format!("RBAC: {}", errors[0]),
        _ => format!("RBAC: [{}]", errors.join(", ")),
    };
    Err(forbidden(user, attrs, &reason))
}

fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// Whether one of `subjects` is `user` (a User by name, a Group it is in, or a ServiceAccount
/// by its user name; a ServiceAccount without a namespace is in the binding's).
fn applies_to(user: &UserInfo, subjects: &Value, binding_ns: &str) -> bool {
    subjects.as_array().into_iter().flatten().any(|s| {
        let name = s["name"].as_str().unwrap_or("");
        match s["kind"].as_str() {
            Some("User") => user.name == name,
            Some("Group") => user.groups.iter().any(|g| g == name),
            Some("ServiceAccount") => {
                let ns = s["namespace"]
                    .as_str()
                    .filter(|n| !n.is_empty())
                    .unwrap_or(binding_ns);
                !ns.is_empty() && user.name == format!("system:serviceaccount:{ns}:{name}")
            }
            _ => false,
        }
    })
}

/// The rules of the role a binding refers to; a missing role is the error the real lister
/// gives (`clusterrole.rbac.authorization.k8s.io "x" not found`).
fn role_rules(st: &State, role_ref: &Value, ns: &str) -> Result<Vec<Value>, String> {
    let name = role_ref["name"].as_str().unwrap_or("");
    let (plural, singular, ns) = match role_ref["kind"].as_str() {
        Some("ClusterRole") => ("clusterroles", "clusterrole", ""),
        Some("Role") => ("roles", "role", ns),
        other => {
            return Err(format!(
                "unsupported role reference kind: {:?}",
                other.unwrap_or("")
            ));
        }
    };
    st.kinds
        .find(RBAC_GROUP, "v1", plural)
        .and_then(|i| st.get(st.kinds.storage_of(i), ns, name))
        .map(|role| role["rules"].as_array().cloned().unwrap_or_default())
        .ok_or_else(|| format!("{singular}.{RBAC_GROUP} {name:?} not found"))
}

/// `RuleAllows`: verb, group, resource (`pods/status`, `*`, `*/status`) and resource name for
/// resource requests; verb and URL (`/apis/*` matches by prefix) for the others.
fn rule_allows(attrs: &Attributes, rule: &Value) -> bool {
    let has = |key: &str, want: &str| strings(&rule[key]).iter().any(|v| *v == "*" || *v == want);
    if !has("verbs", &attrs.verb) {
        return false;
    }
    if !attrs.resource_request {
        return strings(&rule["nonResourceURLs"]).iter().any(|u| {
            *u == "*"
                || *u == attrs.path
                || u.strip_suffix('*')
                    .is_some_and(|prefix| attrs.path.starts_with(prefix))
        });
    }
    let combined = if attrs.subresource.is_empty() {
        attrs.resource.clone()
    } else {
        format!("{}/{}", attrs.resource, attrs.subresource)
    };
    let resource = strings(&rule["resources"]).iter().any(|r| {
        *r == "*"
            || *r == combined
            || (!attrs.subresource.is_empty()
                && r.strip_prefix("*/") == Some(attrs.subresource.as_str()))
    });
    let names = strings(&rule["resourceNames"]);
    has("apiGroups", &attrs.group)
        && resource
        && (names.is_empty() || names.contains(&attrs.name.as_str()))
}

/// The default roles and bindings kube-apiserver bootstraps that decide what every identity
/// may do without any grant (k8s.io/kubernetes `plugin/pkg/auth/authorizer/rbac/bootstrappolicy`):
/// discovery and `/version` for `system:authenticated` (`system:discovery`,
/// `system:basic-user`), health and version for everyone (`system:public-info-viewer`), and
/// `cluster-admin` for `system:masters`.
fn bootstrap_policy() -> Vec<(&'static str, Value)> {
    let meta = |name: &str| {
        json!({"name": name,
               "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"},
               "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"}})
    };
    let role = |name: &str, rules: Value| {
        (
            "clusterroles",
            json!({"metadata": meta(name), "rules": rules}),
        )
    };
    let binding = |name: &str, groups: &[&str]| {
        let subjects: Vec<Value> = groups
            .iter()
            .map(|g| json!({"apiGroup": RBAC_GROUP, "kind": "Group", "name": g}))
            .collect();
        (
            "clusterrolebindings",
            json!({"metadata": meta(name),
                   "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": name},
                   "subjects": subjects}),
        )
    };
    vec![
        role(
            "cluster-admin",
            json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
                   {"nonResourceURLs": ["*"], "verbs": ["*"]}]),
        ),
        role(
            "system:discovery",
            json!([{"nonResourceURLs": ["/api", "/api/*", "/apis", "/apis/*", "/healthz",
                    "/livez", "/openapi", "/openapi/*", "/readyz", "/version", "/version/"],
                    "verbs": ["get"]}]),
        ),
        role(
            "system:basic-user",
            json!([{"apiGroups": ["authorization.k8s.io"],
                    "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
                    "verbs": ["create"]},
                   {"apiGroups": ["authentication.k8s.io"],
                    "resources": ["selfsubjectreviews"], "verbs": ["create"]}]),
        ),
        role(
            "system:public-info-viewer",
            json!([{"nonResourceURLs": ["/healthz", "/livez", "/readyz", "/version",
                    "/version/"], "verbs": ["get"]}]),
        ),
        binding("cluster-admin", &[MASTERS]),
        binding("system:discovery", &[AUTHENTICATED]),
        binding("system:basic-user", &[AUTHENTICATED]),
        binding(
            "system:public-info-viewer",
            &[AUTHENTICATED, UNAUTHENTICATED],
        ),
    ]
}

/// Creates the [`bootstrap_policy`] objects that are missing (as the real server does at
/// every start; existing ones are left as they are).
pub(crate) fn bootstrap(st: &mut State) -> Result<(), ApiError> {
    for (plural, obj) in bootstrap_policy() {
        let Some(kidx) = st.kinds.find(RBAC_GROUP, "v1", plural) else {
            continue;
        };
        let name = obj["metadata"]["name"].as_str().unwrap_or("");
        if st.get(st.kinds.storage_of(kidx), "", name).is_none() {
            ops::create(st, kidx, None, obj, Origin::Control, false)?;
        }
    }
    Ok(())
}

/// Applies every document of a multi-document YAML `text` (deploy/rbac.yaml, a Helm chart's
/// rendered RBAC): creates each object, or sets the fields the document has on the one that
/// exists (its labels and annotations merged), as `kubectl apply` would. A kind the double
/// does not serve is an error naming it, before anything is applied.
pub(crate) fn apply_manifests(st: &mut State, text: &str) -> Result<Vec<Value>, ApiError> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(text)
        .map_err(|e| ApiError::bad_request(format!("manifests are not YAML: {e}")))?;
    let mut planned = Vec::new();
    for doc in docs.into_iter().filter(Value::is_object) {
        let api_version = doc["apiVersion"].as_str().unwrap_or("");
        let kind = doc["kind"].as_str().unwrap_or("");
        let kidx = st
            .kinds
            .all()
            .iter()
            .position(|k| k.api_version() == api_version && k.kind == kind)
            .ok_or_else(|| {
                ApiError::bad_request(format!(
                    "no kind {kind:?} is served in version {api_version:?}"
                ))
            })?;
        planned.push((kidx, doc));
    }
    let mut applied = Vec::new();
    for (kidx, doc) in planned {
        let kind = st.kinds.get(kidx).clone();
        let ns = non_empty(meta_str(&doc, "namespace")).unwrap_or("default");
        let ns = if kind.namespaced { ns } else { "" }.to_string();
        let name = meta_str(&doc, "name").unwrap_or("").to_string();
        let obj = match st.served(kidx, &ns, &name) {
            None => ops::create(st, kidx, None, doc, Origin::Control, false)?,
            Some(mut cur) => {
                for (k, v) in doc.as_object().into_iter().flatten() {
                    match k.as_str() {
                        "apiVersion" | "kind" | "status" => {}
                        "metadata" => {
                            for field in ["labels", "annotations"] {
                                for (lk, lv) in v[field].as_object().into_iter().flatten() {
                                    cur["metadata"][field][lk] = lv.clone();
                                }
                            }
                        }
                        _ => cur[k] = v.clone(),
                    }
                }
                let ns = kind.namespaced.then_some(ns.as_str());
                ops::control_update(st, kidx, ns, Some(&name), cur)?
            }
        };
        applied.push(obj);
    }
    Ok(applied)
}
