//! In-process admission: mutating and validating hooks registered for a resource's create and
//! update (main resource only, as kruise-manager's webhook registrations are), called in the
//! write before it is stored, able to change the object or to refuse the request.
//!
//! Where the real server calls a webhook over HTTPS with an `AdmissionReview`, the double calls
//! a closure under the store lock, in the order the real server's admission chain has:
//! mutating hooks (in registration order) on the decoded object, then pruning, defaulting and
//! validation of the result, then validating hooks, then storage. A refusal is answered as
//! kube-apiserver answers a webhook's denial (`k8s.io/apiserver` `pkg/admission/plugin/webhook/
//! errors/statuserror.go`, `ToStatusErr`): the hook's code (at least 400), its reason (none if it
//! gave none, as controller-runtime's `admission.Errored` gives none), and the message
//! `admission webhook "<name>" denied the request: <message>`.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::kinds::{KindInfo, from_storage, to_storage};
use crate::status::ApiError;
use crate::store::{State, StoreView};

/// What a request does to its object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    /// `POST` (and `PUT` of a kind that creates on update).
    Create,
    /// `PUT`, or `PATCH` with the patch applied.
    Update,
}

/// One request as an admission hook sees it (an `AdmissionRequest`).
pub struct AdmissionRequest<'a> {
    pub operation: Operation,
    /// The API group of the resource (`""` for core).
    pub group: &'a str,
    /// The version the request was made in (`request.resource.version`): `object` and
    /// `old_object` are in it.
    pub version: &'a str,
    /// The resource's plural name, e.g. `containerrecreaterequests`.
    pub resource: &'a str,
    /// The object's namespace (`""` for cluster-scoped kinds).
    pub namespace: &'a str,
    /// The object's name (`""` on a create with `generateName`: the real server names the
    /// object after admission).
    pub name: &'a str,
    /// The object as it will be stored if every hook allows it; a mutating hook changes it.
    pub object: Value,
    /// The object as stored now (updates only).
    pub old_object: Option<Value>,
    /// Whether the request is a dry run.
    pub dry_run: bool,
    /// The rest of the store as it is now, for hooks that read other objects (kruise's CRR
    /// webhook reads the pod and its node). The hook runs under the store lock: read through
    /// this view, never through [`Control`](crate::Control), which would wait for the lock.
    pub store: StoreView<'a>,
}

/// A hook's refusal (`allowed: false` and its `result` Status).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Denial {
    /// `result.code`; below 400 becomes 400, as the real server makes it.
    pub code: u16,
    /// `result.reason`; empty for none.
    pub reason: String,
    /// `result.message`.
    pub message: String,
}

impl Denial {
    /// A refusal with `code` and `message` and no reason: controller-runtime's
    /// `admission.Errored(code, err)`, which kruise's handlers answer with.
    pub fn errored(code: u16, message: impl Into<String>) -> Denial {
        Denial {
            code,
            reason: String::new(),
            message: message.into(),
        }
    }

    /// controller-runtime's `admission.Denied(message)`: 403, reason `Forbidden`.
    pub fn denied(message: impl Into<String>) -> Denial {
        Denial {
            code: 403,
            reason: "Forbidden".into(),
            message: message.into(),
        }
    }

    /// The error the real server answers for this refusal by the webhook `hook`
    /// (`ToStatusErr`): code at least 400, the reason as given, the message prefixed.
    pub fn to_api_error(&self, hook: &str) -> ApiError {
        let denied_by = format!("admission webhook {hook:?} denied the request");
        let message = if !self.message.is_empty() {
            format!("{denied_by}: {}", self.message)
        } else if !self.reason.is_empty() {
            format!("{denied_by}: {}", self.reason)
        } else {
            format!("{denied_by} without explanation")
        };
        ApiError::new(self.code.max(400), &self.reason, message)
    }
}

/// A mutating hook: may change `request.object`, or refuse.
pub type MutatingFn = dyn Fn(&mut AdmissionRequest<'_>) -> Result<(), Denial> + Send + Sync;
/// A validating hook: may only refuse.
pub type ValidatingFn = dyn Fn(&AdmissionRequest<'_>) -> Result<(), Denial> + Send + Sync;

/// A registered hook.
#[derive(Clone)]
pub(crate) enum Hook {
    Mutating(Arc<MutatingFn>),
    Validating(Arc<ValidatingFn>),
}

/// One registration: the webhook's name, what it matches, and the hook.
#[derive(Clone)]
struct Registration {
    name: String,
    group: String,
    resource: String,
    operations: Vec<Operation>,
    hook: Hook,
}

/// Every registered hook (kept in the store's state, read under its lock).
#[derive(Clone, Default)]
pub(crate) struct Admission {
    hooks: Vec<Registration>,
}

impl Admission {
    pub(crate) fn add(
        &mut self,
        name: &str,
        group: &str,
        resource: &str,
        ops: &[Operation],
        hook: Hook,
    ) {
        self.hooks.push(Registration {
            name: name.to_string(),
            group: group.to_string(),
            resource: resource.to_string(),
            operations: ops.to_vec(),
            hook,
        });
    }

    /// The hooks registered for the resource and operation, in registration order.
    fn matching(
        &self,
        group: &str,
        resource: &str,
        op: Operation,
    ) -> impl Iterator<Item = &Registration> {
        self.hooks.iter().filter(move |r| {
            r.group == group && r.resource == resource && r.operations.contains(&op)
        })
    }

    /// Runs the request's mutating hooks, or its validating ones, in registration order: each
    /// mutating hook sees what the ones before it made; the first refusal ends the request (the
    /// real server calls validating hooks in parallel and reports one refusal).
    fn run(&self, request: &mut AdmissionRequest<'_>, mutating: bool) -> Result<(), ApiError> {
        for r in self.matching(request.group, request.resource, request.operation) {
            let verdict = match &r.hook {
                Hook::Mutating(hook) if mutating => hook(request),
                Hook::Validating(hook) if !mutating => hook(request),
                _ => Ok(()),
            };
            verdict.map_err(|d| d.to_api_error(&r.name))?;
        }
        Ok(())
    }
}

/// One HTTP write of the main resource, as [`mutate`] and [`validate`] need it.
pub(crate) struct Write<'a> {
    /// The kind (version) the request was made through.
    pub kind: &'a KindInfo,
    pub storage_kind: &'a KindInfo,
    pub operation: Operation,
    pub namespace: &'a str,
    pub name: &'a str,
    pub dry_run: bool,
}

impl Write<'_> {
    fn request<'s>(
        &'s self,
        st: &'s State,
        object: Value,
        old: Option<&Value>,
    ) -> AdmissionRequest<'s> {
        AdmissionRequest {
            operation: self.operation,
            group: &self.kind.group,
            version: &self.kind.version,
            resource: &self.kind.plural,
            namespace: self.namespace,
            name: self.name,
            object,
            old_object: old.map(|o| from_storage(self.kind, o)),
            dry_run: self.dry_run,
            store: StoreView { state: st },
        }
    }

    fn hooked(&self, st: &State) -> bool {
        let (group, plural) = (&self.kind.group, &self.kind.plural);
        st.admission
            .matching(group, plural, self.operation)
            .next()
            .is_some()
    }
}

/// The mutating hooks on `obj` and `old` (storage representation): each sees the object in
/// the request's version with its name and namespace; what they return is pruned and defaulted
/// again with the version's schema, as the real server does after mutating webhooks, and
/// returned in storage representation.
pub(crate) fn mutate(
    st: &State,
    w: &Write<'_>,
    obj: Value,
    old: Option<&Value>,
) -> Result<Value, ApiError> {
    if !w.hooked(st) {
        return Ok(obj);
    }
    let mut served = from_storage(w.kind, &obj);
    crate::ops::name_in(w.kind, &mut served, w.name, w.namespace);
    let mut request = w.request(st, served, old);
    st.admission.run(&mut request, true)?;
    let mut out = request.object;
    if let Some(schema) = &w.kind.schema {
        schema.normalize(&mut out, None);
    }
    let mut out = to_storage(w.kind, out);
    if out.is_object() {
        out["kind"] = json!(w.storage_kind.kind);
        out["apiVersion"] = json!(w.storage_kind.api_version());
    }
    Ok(out)
}

/// The validating hooks on the object about to be stored (`obj`, storage representation).
pub(crate) fn validate(
    st: &State,
    w: &Write<'_>,
    obj: &Value,
    old: Option<&Value>,
) -> Result<(), ApiError> {
    if !w.hooked(st) {
        return Ok(());
    }
    let mut request = w.request(st, from_storage(w.kind, obj), old);
    st.admission.run(&mut request, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_denial_is_worded_as_kube_apiservers_to_status_err() {
        let e = Denial::errored(400, "podName can not be empty").to_api_error("m.kb.io");
        assert_eq!(e.code, 400);
        assert_eq!(e.reason, "");
        assert_eq!(
            e.message,
            "admission webhook \"m.kb.io\" denied the request: podName can not be empty"
        );
        let e = Denial::errored(200, "").to_api_error("m.kb.io");
        assert_eq!(e.code, 400, "a refusal is never below 400");
        assert_eq!(
            e.message,
            "admission webhook \"m.kb.io\" denied the request without explanation"
        );
        let e = Denial {
            code: 403,
            reason: "Forbidden".into(),
            message: String::new(),
        }
        .to_api_error("v.kb.io");
        assert_eq!(
            e.message,
            "admission webhook \"v.kb.io\" denied the request: Forbidden"
        );
        assert_eq!(e.to_status()["reason"], "Forbidden");
    }
}
