//! Authentication: bearer tokens mapped to users ([`UserInfo`]), anonymous requests, `401` for
//! a token nobody issued; and the request attributes the authorizer judges ([`Attributes`]),
//! derived from the request the way kube-apiserver's `RequestInfoFactory` derives them.
//!
//! Both are off by default ([`Config::tokens`](crate::Config::tokens) `None`): any token, or
//! none, is accepted and no user is recorded.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::selectors::FieldSelector;
use crate::status::ApiError;
use crate::util::{path_segment_problem, segments};

/// The group of every authenticated user.
pub const AUTHENTICATED: &str = "system:authenticated";
/// The group of anonymous requests.
pub const UNAUTHENTICATED: &str = "system:unauthenticated";
/// The group the real server authorizes for everything, whatever RBAC says.
pub const MASTERS: &str = "system:masters";
/// The token in the kubeconfig [`Handle::kubeconfig`](crate::Handle::kubeconfig) writes.
pub const DEFAULT_TOKEN: &str = "apiserver-double-token";

/// Who a request comes from: a user name and its groups, as an authenticator says.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserInfo {
    /// `system:serviceaccount:kruise-system:kruised`, `alice`, `system:anonymous`.
    pub name: String,
    /// Its groups, `system:authenticated` included for authenticated users.
    pub groups: Vec<String>,
}

impl UserInfo {
    /// An authenticated user with `groups` (and `system:authenticated`, which the real server
    /// adds to every authenticated user).
    pub fn new(name: &str, groups: &[&str]) -> UserInfo {
        let mut groups: Vec<String> = groups.iter().map(|g| g.to_string()).collect();
        if !groups.iter().any(|g| g == AUTHENTICATED) {
            groups.push(AUTHENTICATED.to_string());
        }
        UserInfo {
            name: name.to_string(),
            groups,
        }
    }

    /// A ServiceAccount's token, as the real server authenticates it:
    /// `system:serviceaccount:<namespace>:<name>` in `system:serviceaccounts`,
    /// `system:serviceaccounts:<namespace>` and `system:authenticated`.
    pub fn service_account(namespace: &str, name: &str) -> UserInfo {
        UserInfo::new(
            &format!("system:serviceaccount:{namespace}:{name}"),
            &[
                "system:serviceaccounts",
                &format!("system:serviceaccounts:{namespace}"),
            ],
        )
    }

    /// A cluster administrator (`system:masters`, allowed everything, like the admin
    /// kubeconfig of a real cluster).
    pub fn admin() -> UserInfo {
        UserInfo::new("kubernetes-admin", &[MASTERS])
    }

    /// A request without credentials: `system:anonymous` in `system:unauthenticated`.
    pub fn anonymous() -> UserInfo {
        UserInfo {
            name: "system:anonymous".to_string(),
            groups: vec![UNAUTHENTICATED.to_string()],
        }
    }
}

/// Authentication and authorization settings in effect (changeable while the server runs).
#[derive(Clone, Debug, Default)]
pub(crate) struct AuthState {
    /// Tokens and their users; `None`: authentication off.
    pub tokens: Option<BTreeMap<String, UserInfo>>,
    /// Whether requests are authorized with RBAC.
    pub rbac: bool,
}

impl AuthState {
    /// Who sent a request with this `Authorization` header: `Ok(None)` when authentication is
    /// off, the token's user, or `system:anonymous` without a bearer token (the real server's
    /// anonymous authenticator). A bearer token nobody issued is `401 Unauthorized`, also when
    /// anonymous requests are allowed (the real server fails on a token it cannot verify).
    pub(crate) fn authenticate(
        &self,
        authorization: Option<&str>,
    ) -> Result<Option<UserInfo>, ApiError> {
        let Some(tokens) = &self.tokens else {
            return Ok(None);
        };
        // as kube-apiserver answers a token it cannot verify
        // (`apierrors.NewUnauthorized("Unauthorized")`: no details)
        let unauthorized = || ApiError::new(401, "Unauthorized", "Unauthorized");
        match bearer_token(authorization) {
            None => Ok(Some(UserInfo::anonymous())),
            Some(token) => tokens
                .get(token)
                .cloned()
                .map(Some)
                .ok_or_else(unauthorized),
        }
    }
}

/// The token of `Authorization: Bearer <token>`: as client-go's bearer authenticator reads
/// it, any other scheme and an empty token are no bearer token at all.
fn bearer_token(header: Option<&str>) -> Option<&str> {
    let header = header?.trim();
    let mut parts = header.splitn(3, ' ');
    let scheme = parts.next()?;
    let token = parts.next()?;
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// What the authorizer judges, as kube-apiserver's `RequestInfoFactory` derives it from the
/// request: resource requests under `/api/v1` and `/apis/<group>/<version>` with verb, group,
/// namespace, resource, subresource and name; everything else (discovery documents,
/// `/version`, `/healthz`) a non-resource request with the lowercased method as verb.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Attributes {
    /// Whether this is a resource request.
    pub resource_request: bool,
    /// The request path (for non-resource requests).
    pub path: String,
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, `deletecollection`.
    pub verb: String,
    /// The API group, `""` for core.
    pub group: String,
    /// The namespace, `""` for cluster-scoped requests.
    pub namespace: String,
    /// The resource (`pods`).
    pub resource: String,
    /// The subresource (`status`).
    pub subresource: String,
    /// The object's name: from the path, or from a `metadata.name=` field selector of a list
    /// or watch.
    pub name: String,
}

/// Go's `strconv.ParseBool` true values, which the parameter codec uses for `watch`.
fn go_true(v: &str) -> bool {
    matches!(v, "1" | "t" | "T" | "true" | "TRUE" | "True")
}

/// A resource path as kube-apiserver's `RequestInfoFactory.NewRequestInfo` splits it
/// (k8s.io/apiserver `pkg/endpoints/request/requestinfo.go`): `/api/<version>` or
/// `/apis/<group>/<version>`, then `watch/` (the old watch paths), `namespaces/<ns>/` unless
/// `status` or `finalize` follows, then the resource, its name and subresource.
#[derive(Clone, Debug, Default)]
pub(crate) struct ResourcePath {
    pub group: String,
    pub version: String,
    pub watch: bool,
    /// The namespace of a `namespaces/<ns>/<resource>` path.
    pub namespace: Option<String>,
    /// Empty after a bare `watch`, which the real server answers with an error.
    pub resource: String,
    pub name: Option<String>,
    pub subresource: Option<String>,
    /// Segments after the subresource.
    pub extra: bool,
}

impl ResourcePath {
    /// `None` for a non-resource path (discovery documents, `/version`, `/healthz`).
    pub(crate) fn parse(path: &str) -> Option<ResourcePath> {
        let segs = segments(path);
        let segs: Vec<&str> = segs.iter().map(String::as_str).collect();
        let (group, version, rest) = match segs.as_slice() {
            ["api", v, rest @ ..] => ("", *v, rest),
            ["apis", g, v, rest @ ..] => (*g, *v, rest),
            _ => return None,
        };
        let (watch, rest) = match rest {
            [] => return None,
            ["watch", rest @ ..] => (true, rest),
            rest => (false, rest),
        };
        let (namespace, rest) = match rest {
            ["namespaces", ns, r, ..] if !matches!(*r, "status" | "finalize") => {
                (Some(ns.to_string()), &rest[2..])
            }
            rest => (None, rest),
        };
        let at = |i: usize| rest.get(i).map(|s| s.to_string());
        Some(ResourcePath {
            group: group.to_string(),
            version: version.to_string(),
            watch,
            namespace,
            resource: at(0).unwrap_or_default(),
            name: at(1),
            subresource: at(2),
            extra: rest.len() > 3,
        })
    }
}

/// The attributes of a request, derived as kube-apiserver's `RequestInfoFactory.NewRequestInfo`
/// does.
pub(crate) fn attributes(method: &str, path: &str, query: &[(String, String)]) -> Attributes {
    let mut info = Attributes {
        path: path.to_string(),
        verb: method.to_lowercase(),
        ..Attributes::default()
    };
    let Some(p) = ResourcePath::parse(path) else {
        return info;
    };
    (info.resource_request, info.group) = (true, p.group);
    if p.resource.is_empty() {
        // the real server answers a bare `watch/` with an error; nothing is allowed
        return info;
    }
    info.verb = match method {
        _ if p.watch => "watch",
        "POST" => "create",
        "GET" | "HEAD" => "get",
        "PUT" => "update",
        "PATCH" => "patch",
        "DELETE" => "delete",
        _ => "",
    }
    .into();
    let name = p.name.unwrap_or_default();
    // `namespaces/<name>` is in the namespace `<name>`
    let own = (p.resource == "namespaces").then(|| name.clone());
    info.namespace = p.namespace.or(own).unwrap_or_default();
    (info.resource, info.name) = (p.resource, name);
    info.subresource = p.subresource.unwrap_or_default();
    if info.name.is_empty() && info.verb == "get" {
        let param = |k: &str| query.iter().find(|(key, _)| key == k).map(|(_, v)| v);
        let watch = param("watch").is_some_and(|v| go_true(v));
        info.verb = if watch { "watch" } else { "list" }.into();
        // the value a field selector requires `metadata.name` to equal (`RequiresExactMatch`)
        let selector = param("fieldSelector").and_then(|s| FieldSelector::parse(s).ok());
        if let Some(name) = selector.as_ref().and_then(|s| s.required("metadata.name"))
            && path_segment_problem(name).is_none()
        {
            info.name = name.to_string();
        }
    }
    if info.name.is_empty() && info.verb == "delete" {
        info.verb = "deletecollection".into();
    }
    info
}

/// `403 Forbidden`, worded and shaped as kube-apiserver's `responsewriters.Forbidden` and
/// `apierrors.NewForbidden` make it (k8s.io/apiserver
/// `pkg/endpoints/handlers/responsewriters/errors.go`, `forbiddenMessage`): the qualified
/// resource and name, then `User "<name>" cannot <verb> resource "<resource[/sub]>" in API
/// group "<group>" in the namespace "<ns>"` (or `at the cluster scope`), or for a
/// non-resource request `forbidden: User "<name>" cannot <verb> path "<path>"`; the
/// authorizer's reason after a colon. `details` name the object and the plain resource.
pub(crate) fn forbidden(user: &UserInfo, attrs: &Attributes, reason: &str) -> ApiError {
    let who = &user.name;
    let mut msg = if !attrs.resource_request {
        format!("User {who:?} cannot {} path {:?}", attrs.verb, attrs.path)
    } else {
        let mut resource = attrs.resource.clone();
        if !attrs.subresource.is_empty() {
            resource = format!("{resource}/{}", attrs.subresource);
        }
        let scope = if attrs.namespace.is_empty() {
            "at the cluster scope".to_string()
        } else {
            format!("in the namespace {:?}", attrs.namespace)
        };
        format!(
            "User {who:?} cannot {} resource {resource:?} in API group {:?} {scope}",
            attrs.verb, attrs.group
        )
    };
    // the real server keeps its messages from looking like HTML
    msg = msg
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;");
    if !reason.is_empty() {
        msg = format!("{msg}: {reason}");
    }
    let qualified = match (attrs.resource.as_str(), attrs.group.as_str()) {
        ("", _) => String::new(),
        (r, "") => r.to_string(),
        (r, g) => format!("{r}.{g}"),
    };
    let message = if qualified.is_empty() {
        format!("forbidden: {msg}")
    } else if attrs.name.is_empty() {
        format!("{qualified} is forbidden: {msg}")
    } else {
        format!("{qualified} {:?} is forbidden: {msg}", attrs.name)
    };
    let (name, group, kind) = (&attrs.name, &attrs.group, &attrs.resource);
    let details = crate::status::details(&[("name", name), ("group", group), ("kind", kind)]);
    ApiError::new(403, "Forbidden", message).with_details(details)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn request_attributes_are_derived_like_the_real_request_info_factory() {
        let a = attributes("PATCH", "/api/v1/namespaces/default/pods/web-0/status", &[]);
        assert_eq!(
            (
                a.verb.as_str(),
                a.group.as_str(),
                a.namespace.as_str(),
                a.resource.as_str(),
                a.subresource.as_str(),
                a.name.as_str()
            ),
            ("patch", "", "default", "pods", "status", "web-0")
        );
        let w = attributes(
            "GET",
            "/apis/apps.kruise.io/v1beta1/nodeimages",
            &q(&[("watch", "true"), ("fieldSelector", "metadata.name=node-a")]),
        );
        assert_eq!(
            (w.verb.as_str(), w.name.as_str(), w.namespace.as_str()),
            ("watch", "node-a", "")
        );
        let l = attributes(
            "GET",
            "/api/v1/pods",
            &q(&[("fieldSelector", "spec.nodeName=node-a")]),
        );
        assert_eq!((l.verb.as_str(), l.name.as_str()), ("list", ""));
        let ns = attributes("GET", "/api/v1/namespaces/kube-system", &[]);
        assert_eq!(
            (
                ns.resource.as_str(),
                ns.name.as_str(),
                ns.namespace.as_str()
            ),
            ("namespaces", "kube-system", "kube-system")
        );
        let dc = attributes("DELETE", "/api/v1/namespaces/default/events", &[]);
        assert_eq!(dc.verb, "deletecollection");
        let old = attributes("GET", "/api/v1/watch/namespaces/default/pods", &[]);
        assert_eq!(
            (old.verb.as_str(), old.resource.as_str()),
            ("watch", "pods")
        );
        for discovery in [
            "/api",
            "/api/v1",
            "/apis",
            "/apis/apps.kruise.io/v1beta1",
            "/version",
        ] {
            let d = attributes("GET", discovery, &[]);
            assert!(!d.resource_request, "{discovery} is a non-resource request");
            assert_eq!(d.verb, "get");
        }
    }

    #[test]
    fn only_an_exact_metadata_name_term_names_the_object() {
        let name = |selector: &str| {
            let query = [("fieldSelector".to_string(), selector.to_string())];
            attributes("GET", "/api/v1/namespaces/default/pods", &query).name
        };
        assert_eq!(name("metadata.name=a"), "a");
        assert_eq!(name("x=y,metadata.name==b"), "b");
        assert_eq!(name("metadata.name!=a"), "");
        assert_eq!(name("metadata.namespace=a"), "");
        assert_eq!(name("metadata.name=a\\,b"), "a,b");
    }

    #[test]
    fn only_a_non_empty_bearer_token_is_a_token() {
        assert_eq!(bearer_token(Some("Bearer abc")), Some("abc"));
        assert_eq!(bearer_token(Some("bearer abc")), Some("abc"));
        assert_eq!(bearer_token(Some("Bearer ")), None);
        assert_eq!(bearer_token(Some("Basic dXNlcjpwdw==")), None);
        assert_eq!(bearer_token(None), None);
    }
}
