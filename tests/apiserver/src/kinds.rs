//! The table of kinds the double serves, and how each one behaves.
//!
//! Add a kind by pushing a [`KindInfo`] onto [`Config::kinds`](crate::Config::kinds):
//! [`KindInfo::custom`] gives CRD semantics (status subresource, generation,
//! resourceVersion required on update, strategic merge refused), [`KindInfo::core`]
//! built-in semantics, adjusted by setting the fields.

use std::sync::Arc;

use serde_json::{Map, Value, json};

use crate::schema::{Schema, kruise_schema};

/// What happens to `.status` when an object is created over HTTP.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum StatusOnCreate {
    /// Keep whatever the client sent.
    #[default]
    Keep,
    /// Drop it (custom resources with a status subresource).
    Drop,
    /// Replace it with this value (pods start `Pending`, namespaces `Active`).
    Replace(Value),
}

/// A kind served as a different representation of another kind's storage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Conversion {
    /// `events.k8s.io/v1` `Event`, stored as core `v1` `Event` (shared storage,
    /// converted field by field like the real server does).
    EventsV1,
    /// Another served version of a custom resource whose CRD has `conversion:
    /// {strategy: None}`: stored in the entry with the same group and plural
    /// and no conversion (the storage version). Only `apiVersion` changes;
    /// everything read or written through this version is pruned to its
    /// [`KindInfo::schema`], so a write through it drops the fields only the
    /// storage version has, from storage too.
    CrdVersion,
}

/// A field selector key a kind supports beyond `metadata.name`/`metadata.namespace`.
#[derive(Clone, Debug, PartialEq)]
pub struct FieldKey {
    /// The selector key, e.g. `spec.nodeName`.
    pub key: String,
    /// Dotted path into the object, e.g. `spec.nodeName`.
    pub path: String,
    /// Value used when the path is absent (e.g. `false` for booleans).
    pub default: String,
}

/// Everything the double needs to know about one served resource.
#[derive(Clone, Debug, Default)]
pub struct KindInfo {
    /// API group, `""` for core.
    pub group: String,
    /// API version, e.g. `v1alpha1`.
    pub version: String,
    /// Plural resource name used in paths, e.g. `nodeimages`.
    pub plural: String,
    /// Singular name for discovery.
    pub singular: String,
    /// `kind`, e.g. `NodeImage`.
    pub kind: String,
    /// Whether objects live in namespaces.
    pub namespaced: bool,
    /// Custom resource semantics: strategic merge patch is refused with 415 and
    /// an update without `metadata.resourceVersion` is 422.
    pub custom: bool,
    /// Whether `metadata.generation` is kept (1 on create, +1 on spec changes).
    pub tracks_generation: bool,
    /// Whether a `/status` subresource exists (then main writes ignore `.status`).
    pub status_subresource: bool,
    /// Whether PUT on a missing object creates it (true for core events).
    pub allow_create_on_update: bool,
    /// Field selectors supported beyond `metadata.name`/`metadata.namespace`.
    pub fields: Vec<FieldKey>,
    /// What HTTP create does to `.status`.
    pub status_on_create: StatusOnCreate,
    /// Set when this kind is a view of another kind's storage.
    pub conversion: Option<Conversion>,
    /// Short names for discovery.
    pub short_names: Vec<String>,
    /// Structural schema (custom resources): objects are pruned and defaulted
    /// with it on every read and write, and HTTP writes validated against it.
    pub schema: Option<Arc<Schema>>,
    /// Whether DELETE answers with the deleted object (pods, namespaces) rather
    /// than a `Status` of `Success` (everything else, custom resources included).
    pub delete_returns_object: bool,
}

impl KindInfo {
    /// A built-in (core-like) kind with no status subresource.
    pub fn core(group: &str, version: &str, plural: &str, kind: &str, namespaced: bool) -> Self {
        KindInfo {
            group: group.to_string(),
            version: version.to_string(),
            plural: plural.to_string(),
            singular: kind.to_lowercase(),
            kind: kind.to_string(),
            namespaced,
            ..KindInfo::default()
        }
    }

    /// A custom resource with a status subresource, like a CRD with
    /// `subresources: {status: {}}`.
    pub fn custom(group: &str, version: &str, plural: &str, kind: &str, namespaced: bool) -> Self {
        KindInfo {
            custom: true,
            tracks_generation: true,
            status_subresource: true,
            status_on_create: StatusOnCreate::Drop,
            ..KindInfo::core(group, version, plural, kind, namespaced)
        }
    }

    /// Add a supported field selector key read from a dotted `path`.
    pub fn with_field(mut self, key: &str, path: &str, default: &str) -> Self {
        self.fields.push(FieldKey {
            key: key.to_string(),
            path: path.to_string(),
            default: default.to_string(),
        });
        self
    }

    /// Add field selector keys read from the path of the same name, `""` when absent.
    pub fn with_fields(self, keys: &[&str]) -> Self {
        keys.iter().fold(self, |k, key| k.with_field(key, key, ""))
    }

    pub fn with_short_names(mut self, names: &[&str]) -> Self {
        self.short_names = names.iter().map(|s| s.to_string()).collect();
        self
    }

    /// `v1` for core, `group/version` otherwise.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `name` (the plural or the kind) with the group, as error messages name it: `pods`,
    /// `NodeImage.apps.kruise.io`.
    pub fn qualified(&self, name: &str) -> String {
        if self.group.is_empty() {
            name.to_string()
        } else {
            format!("{name}.{}", self.group)
        }
    }

    /// Whether `key` is a supported field selector key.
    pub fn supports_field(&self, key: &str) -> bool {
        key == "metadata.name"
            || (key == "metadata.namespace" && self.namespaced)
            || self.fields.iter().any(|f| f.key == key)
    }
}

/// The kinds served by default: core pods, events, secrets, namespaces, nodes,
/// serviceaccounts, `events.k8s.io/v1` events, `apps/v1` DaemonSets, RBAC's four kinds and
/// OpenKruise's custom resources as the real cluster serves them with kruise's CRDs installed
/// ([`kruise_kinds`]).
pub fn default_kinds() -> Vec<KindInfo> {
    [core_kinds(), kruise_kinds()].concat()
}

/// [`default_kinds`] with the kruise resources served at `v1alpha1` only (a
/// kruise before 1.9 or a CRD without `v1beta1`), each stored as `v1alpha1`.
pub fn default_kinds_v1alpha1_only() -> Vec<KindInfo> {
    let alpha = KRUISE.iter().map(|crd| kruise_kind(crd, "v1alpha1"));
    core_kinds().into_iter().chain(alpha).collect()
}

fn core_kinds() -> Vec<KindInfo> {
    let core = |plural, kind, namespaced, short_names: &[&str]| {
        KindInfo::core("", "v1", plural, kind, namespaced).with_short_names(short_names)
    };
    // pods and namespaces: a `/status`, a phase set on create, the object answered on DELETE
    let phased = |k: KindInfo, phase: &str| KindInfo {
        status_subresource: true,
        status_on_create: StatusOnCreate::Replace(json!({"phase": phase})),
        delete_returns_object: true,
        ..k
    };
    let rbac =
        |plural, kind, namespaced| KindInfo::core(RBAC_GROUP, "v1", plural, kind, namespaced);
    vec![
        KindInfo {
            tracks_generation: true,
            ..phased(core("pods", "Pod", true, &["po"]), "Pending")
        }
        .with_fields(&["spec.nodeName", "spec.restartPolicy", "spec.schedulerName"])
        .with_fields(&["spec.serviceAccountName", "status.phase", "status.podIP"])
        .with_fields(&["status.nominatedNodeName"])
        .with_field("spec.hostNetwork", "spec.hostNetwork", "false"),
        KindInfo {
            allow_create_on_update: true,
            ..core("events", "Event", true, &["ev"])
        }
        .with_fields(&["involvedObject.kind", "involvedObject.namespace"])
        .with_fields(&["involvedObject.name", "involvedObject.uid"])
        .with_fields(&[
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
        ])
        .with_fields(&["involvedObject.fieldPath", "reason", "reportingComponent"])
        .with_field("source", "source.component", "")
        .with_fields(&["type"]),
        core("secrets", "Secret", true, &[]).with_fields(&["type"]),
        core("serviceaccounts", "ServiceAccount", true, &["sa"]),
        phased(core("namespaces", "Namespace", false, &["ns"]), "Active")
            .with_fields(&["status.phase"]),
        KindInfo {
            status_subresource: true,
            ..core("nodes", "Node", false, &["no"])
        }
        .with_field("spec.unschedulable", "spec.unschedulable", "false"),
        KindInfo {
            conversion: Some(Conversion::EventsV1),
            allow_create_on_update: true,
            ..KindInfo::core("events.k8s.io", "v1", "events", "Event", true)
                .with_fields(&["regarding.kind", "regarding.namespace", "regarding.name"])
                .with_fields(&["regarding.uid", "reason", "reportingController", "type"])
                .with_short_names(&["ev"])
        },
        // apps/v1 DaemonSets: what an operator's `kubectl apply` or `kubectl patch` changes when
        // kruised is swapped into kruise's Helm-made DaemonSet (tests/integration/swap.rs).
        // Strategic merge by the pod template's merge keys ([`crate::patch::merge_key`]:
        // containers, env and volumes by name, volumeMounts by mountPath, args replaced whole);
        // no defaulting, no validation, no controller: no pods, no ControllerRevisions
        KindInfo {
            tracks_generation: true,
            status_subresource: true,
            ..KindInfo::core("apps", "v1", "daemonsets", "DaemonSet", true)
                .with_short_names(&["ds"])
        },
        // RBAC (`rbac.authorization.k8s.io/v1`): what the authorizer reads when RBAC is on
        // (`Config::rbac`), served whether it is on or not, as on a real server
        rbac("clusterroles", "ClusterRole", false),
        rbac("clusterrolebindings", "ClusterRoleBinding", false),
        rbac("roles", "Role", true),
        rbac("rolebindings", "RoleBinding", true),
    ]
}

/// The API group of RBAC's kinds.
pub(crate) const RBAC_GROUP: &str = "rbac.authorization.k8s.io";

/// One of kruise's CRDs (openkruise/kruise `config/crd/bases`, as in the real test cluster):
/// plural, kind, namespaced, short names, and the served versions, the storage version first.
type KruiseCrd = (&'static str, &'static str, bool, Names, Names);
type Names = &'static [&'static str];

const BOTH: &[&str] = &["v1beta1", "v1alpha1"];
const ALPHA: &[&str] = &["v1alpha1"];
const KRUISE: &[KruiseCrd] = &[
    ("nodeimages", "NodeImage", false, &[], BOTH),
    (
        "containerrecreaterequests",
        "ContainerRecreateRequest",
        true,
        &["crr"],
        BOTH,
    ),
    ("imagepulljobs", "ImagePullJob", true, &[], BOTH),
    ("nodepodprobes", "NodePodProbe", false, &[], ALPHA),
    ("podprobemarkers", "PodProbeMarker", true, &[], ALPHA),
];

fn kruise_kind(&(plural, kind, namespaced, short_names, _): &KruiseCrd, version: &str) -> KindInfo {
    KindInfo {
        schema: kruise_schema(plural, version),
        ..KindInfo::custom("apps.kruise.io", version, plural, kind, namespaced)
            .with_short_names(short_names)
    }
}

/// OpenKruise's custom resources as kruise's CRDs serve them: NodeImage,
/// ContainerRecreateRequest and ImagePullJob at `v1beta1` (storage) and
/// `v1alpha1` (conversion `None`: pruned to its own schema), NodePodProbe and
/// PodProbeMarker at `v1alpha1`; every version with its CRD schema.
pub fn kruise_kinds() -> Vec<KindInfo> {
    let mut out = Vec::new();
    for crd in KRUISE {
        for (i, v) in crd.4.iter().enumerate() {
            // the first version stores; the others are served from it
            let conversion = (i > 0).then_some(Conversion::CrdVersion);
            out.push(KindInfo {
                conversion,
                ..kruise_kind(crd, v)
            });
        }
    }
    out
}

/// The registered kinds, with lookups by path and by name.
#[derive(Clone, Debug)]
pub(crate) struct Kinds {
    list: Vec<KindInfo>,
    storage: Vec<usize>,
}

impl Kinds {
    /// Build the registry; a kind with a conversion is stored with its storage kind.
    pub(crate) fn new(list: Vec<KindInfo>) -> Self {
        let storage = list
            .iter()
            .enumerate()
            .map(|(i, k)| match k.conversion {
                Some(Conversion::EventsV1) => list
                    .iter()
                    .position(|s| s.group.is_empty() && s.plural == "events")
                    .unwrap_or(i),
                Some(Conversion::CrdVersion) => list
                    .iter()
                    .position(|s| {
                        s.conversion.is_none() && s.group == k.group && s.plural == k.plural
                    })
                    .unwrap_or(i),
                None => i,
            })
            .collect();
        Kinds { list, storage }
    }

    pub(crate) fn all(&self) -> &[KindInfo] {
        &self.list
    }

    pub(crate) fn get(&self, idx: usize) -> &KindInfo {
        &self.list[idx]
    }

    pub(crate) fn len(&self) -> usize {
        self.list.len()
    }

    /// Index of the kind whose objects are stored for `idx`.
    pub(crate) fn storage_of(&self, idx: usize) -> usize {
        self.storage[idx]
    }

    /// The kind at `idx`, the index of its storage kind, and that kind.
    pub(crate) fn with_storage(&self, idx: usize) -> (&KindInfo, usize, &KindInfo) {
        let sidx = self.storage[idx];
        (&self.list[idx], sidx, &self.list[sidx])
    }

    /// Kind served at `/api[s]/{group}/{version}/{plural}`.
    pub(crate) fn find(&self, group: &str, version: &str, plural: &str) -> Option<usize> {
        self.list
            .iter()
            .position(|k| k.group == group && k.version == version && k.plural == plural)
    }

    /// Resolve a kubectl-style name: `pods`, `Pod`, `nodeimages.apps.kruise.io`,
    /// `events.events.k8s.io`, `nodeimages.v1alpha1.apps.kruise.io` or
    /// `group/version/plural`. Core wins on ties; without a version, the
    /// storage version of a custom resource.
    pub(crate) fn resolve(&self, name: &str) -> Option<usize> {
        let parts: Vec<&str> = name.split('/').collect();
        if parts.len() == 3 {
            return self.find(parts[0], parts[1], parts[2]);
        }
        if parts.len() == 2 {
            return self.find("", parts[0], parts[1]);
        }
        let by = |f: &dyn Fn(&KindInfo) -> bool| {
            self.list
                .iter()
                .position(|k| k.conversion != Some(Conversion::CrdVersion) && f(k))
                .or_else(|| self.list.iter().position(f))
        };
        by(&|k| k.group.is_empty() && (k.plural == name || k.kind == name))
            .or_else(|| by(&|k| k.plural == name || k.kind == name || k.singular == name))
            .or_else(|| by(&|k| !k.group.is_empty() && format!("{}.{}", k.plural, k.group) == name))
            .or_else(|| by(&|k| format!("{}.{}.{}", k.plural, k.version, k.group) == name))
    }
}

/// Convert an object from `kind`'s representation to its storage representation
/// (the caller sets the storage `kind`/`apiVersion`).
pub(crate) fn to_storage(kind: &KindInfo, obj: Value) -> Value {
    match kind.conversion {
        None | Some(Conversion::CrdVersion) => obj,
        Some(Conversion::EventsV1) => rename_fields(obj, EVENT_FIELDS, true, "v1"),
    }
}

/// Convert a stored object to `kind`'s representation: like the real server's
/// decoding, pruned and defaulted with the version's schema, `apiVersion` set.
pub(crate) fn from_storage(kind: &KindInfo, obj: &Value) -> Value {
    match kind.conversion {
        Some(Conversion::EventsV1) => {
            rename_fields(obj.clone(), EVENT_FIELDS, false, &kind.api_version())
        }
        None | Some(Conversion::CrdVersion) => {
            let mut out = obj.clone();
            if let Some(schema) = &kind.schema {
                schema.normalize(&mut out, None);
            }
            if kind.conversion.is_some() && out.is_object() {
                out["apiVersion"] = json!(kind.api_version());
            }
            out
        }
    }
}

/// A stored object as a write through `kind` sees it: read through `kind`'s
/// version and back in storage representation (same JSON but the fields the
/// version does not have). Writes start from this, so they drop those fields.
pub(crate) fn through_version(kind: &KindInfo, storage_kind: &KindInfo, obj: &Value) -> Value {
    match (&kind.conversion, &kind.schema) {
        (Some(Conversion::CrdVersion), _) | (None, Some(_)) => {
            let mut v = from_storage(kind, obj);
            if v.is_object() {
                v["apiVersion"] = json!(storage_kind.api_version());
            }
            v
        }
        _ => obj.clone(),
    }
}

/// `(events.k8s.io/v1 name, core v1 name)`.
const EVENT_FIELDS: &[(&str, &str)] = &[
    ("regarding", "involvedObject"),
    ("note", "message"),
    ("reportingController", "reportingComponent"),
    ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"),
];

fn rename_fields(obj: Value, table: &[(&str, &str)], forward: bool, api_version: &str) -> Value {
    let Value::Object(mut map) = obj else {
        return obj;
    };
    let mut out = Map::new();
    for (from, to) in table {
        let (from, to) = if forward { (*from, *to) } else { (*to, *from) };
        if let Some(v) = map.remove(from) {
            out.insert(to.to_string(), v);
        }
    }
    for (k, v) in map {
        out.entry(k).or_insert(v);
    }
    out.insert("apiVersion".into(), json!(api_version));
    Value::Object(out)
}
