//! `metav1.Status` errors, shaped like the ones kube-apiserver returns.
//!
//! Every failure the double reports, over HTTP or through the control API, is an
//! [`ApiError`]; [`ApiError::to_status`] renders it as the JSON `Status` object a
//! real server would send, with the same `reason`, `code` and message wording.

use serde_json::{Value, json};

use crate::kinds::KindInfo;

/// A failed API call, rendered as a `metav1.Status` by [`ApiError::to_status`].
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    /// HTTP status code (also `Status.code`).
    pub code: u16,
    /// `Status.reason`, e.g. `NotFound`, `Conflict`, `Invalid`.
    pub reason: String,
    /// Human readable `Status.message`.
    pub message: String,
    /// `Status.details`, if any.
    pub details: Option<Value>,
    /// Seconds for the `Retry-After` header and `details.retryAfterSeconds`.
    pub retry_after: Option<u64>,
}

impl ApiError {
    /// An error with the given code, reason and message and no details.
    pub fn new(code: u16, reason: &str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason: reason.to_string(),
            message: message.into(),
            details: None,
            retry_after: None,
        }
    }

    /// An error for `code` with the reason the real server uses for that code.
    pub fn from_code(code: u16, message: impl Into<String>) -> Self {
        ApiError::new(code, reason_for_code(code), message)
    }

    /// Attach `Status.details`.
    pub fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    /// An error about the object `name` of `kind`, with details naming it.
    fn about(kind: &KindInfo, name: &str, code: u16, reason: &str, message: String) -> Self {
        ApiError::new(code, reason, message).with_details(resource_details(kind, name))
    }

    /// `404 NotFound`: `pods "x" not found`.
    pub fn not_found(kind: &KindInfo, name: &str) -> Self {
        let what = format!("{} \"{name}\" not found", kind.qualified(&kind.plural));
        ApiError::about(kind, name, 404, "NotFound", what)
    }

    /// `404 NotFound` for a namespace that does not exist.
    pub fn namespace_not_found(ns: &str) -> Self {
        ApiError::new(404, "NotFound", format!("namespaces \"{ns}\" not found"))
            .with_details(json!({"name": ns, "kind": "namespaces"}))
    }

    /// `404 NotFound` for a path the server does not serve.
    pub fn no_such_resource() -> Self {
        let why = "the server could not find the requested resource";
        ApiError::new(404, "NotFound", why).with_details(json!({}))
    }

    /// `405 MethodNotAllowed`.
    pub fn method_not_allowed() -> Self {
        let why = "the server does not allow this method on the requested resource";
        ApiError::new(405, "MethodNotAllowed", why).with_details(json!({}))
    }

    /// `409 AlreadyExists`.
    pub fn already_exists(kind: &KindInfo, name: &str) -> Self {
        let what = format!("{} \"{name}\" already exists", kind.qualified(&kind.plural));
        ApiError::about(kind, name, 409, "AlreadyExists", what)
    }

    /// `409 Conflict` for a stale `metadata.resourceVersion`.
    pub fn conflict(kind: &KindInfo, name: &str) -> Self {
        let why = "the object has been modified; please apply your changes to the latest version \
                   and try again";
        ApiError::conflict_with(kind, name, why)
    }

    /// `409 Conflict` with a custom explanation after the colon.
    pub fn conflict_with(kind: &KindInfo, name: &str, why: &str) -> Self {
        let on = kind.qualified(&kind.plural);
        let what = format!("Operation cannot be fulfilled on {on} \"{name}\": {why}");
        ApiError::about(kind, name, 409, "Conflict", what)
    }

    /// `422 Invalid` with one cause per `(field, reason, message)`.
    pub fn invalid<F: AsRef<str>>(
        kind: &KindInfo,
        name: &str,
        causes: &[(F, &str, String)],
    ) -> Self {
        let joined = causes
            .iter()
            .map(|(field, _, msg)| format!("{}: {msg}", field.as_ref()))
            .collect::<Vec<_>>();
        let message = if joined.len() == 1 {
            joined.join("")
        } else {
            format!("[{}]", joined.join(", "))
        };
        let mut details = details(&[("kind", &kind.kind), ("name", name), ("group", &kind.group)]);
        details["causes"] = json!(
            causes
                .iter()
                .map(|(field, reason, msg)| json!({
                    "reason": reason, "message": msg, "field": field.as_ref(),
                }))
                .collect::<Vec<_>>()
        );
        let qualified = kind.qualified(&kind.kind);
        let what = format!("{qualified} \"{name}\" is invalid: {message}");
        ApiError::new(422, "Invalid", what).with_details(details)
    }

    /// `422 Invalid` named after the resource rather than the kind, as the
    /// generic registry words it (`nodeimages.apps.kruise.io "x" is invalid: ...`).
    pub fn invalid_resource(kind: &KindInfo, name: &str, causes: &[(&str, &str, String)]) -> Self {
        let plural = KindInfo {
            kind: kind.plural.clone(),
            ..kind.clone()
        };
        ApiError::invalid(&plural, name, causes)
    }

    /// `400 BadRequest`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(400, "BadRequest", message)
    }

    /// `415 UnsupportedMediaType` for a patch type the resource does not accept.
    pub fn unsupported_patch(accepted: &str) -> Self {
        ApiError::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: {accepted}"
            ),
        )
    }

    /// `410 Expired`, as sent for watches and continue tokens that are too old.
    pub fn expired(message: impl Into<String>) -> Self {
        ApiError::new(410, "Expired", message)
    }

    /// The JSON `Status` object for this error.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "code": self.code,
        });
        if !self.reason.is_empty() {
            status["reason"] = json!(self.reason);
        }
        let mut details = self.details.clone();
        if let Some(secs) = self.retry_after {
            let d = details.get_or_insert_with(|| json!({}));
            d["retryAfterSeconds"] = json!(secs);
        }
        if let Some(d) = details {
            status["details"] = d;
        }
        status
    }
}

/// The `Status.reason` kube-apiserver uses for an HTTP code.
pub fn reason_for_code(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        406 => "NotAcceptable",
        409 => "Conflict",
        410 => "Expired",
        413 => "RequestEntityTooLarge",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "Unknown",
    }
}

/// `Status.details` with those of `fields` that are not empty.
pub(crate) fn details(fields: &[(&str, &str)]) -> Value {
    let set = fields.iter().filter(|(_, v)| !v.is_empty());
    Value::Object(set.map(|(k, v)| (k.to_string(), json!(v))).collect())
}

pub(crate) fn resource_details(kind: &KindInfo, name: &str) -> Value {
    let mut d = json!({"name": name, "kind": kind.plural});
    if !kind.group.is_empty() {
        d["group"] = json!(kind.group);
    }
    d
}
