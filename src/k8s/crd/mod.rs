//! Typed `apps.kruise.io/v1alpha1` resources the daemon reads and writes (NodeImage,
//! ContainerRecreateRequest, NodePodProbe), and their CustomResourceDefinitions.
//!
//! The JSON shapes follow kruise's Go types (`apis/apps/v1alpha1`) field for field: the same names,
//! the same optionality and the same `omitempty`. Parsing is deliberately lenient, like Go's
//! `encoding/json`: unknown fields are ignored, missing or `null` fields take their zero value and
//! phases that this version does not know are kept as [`ImagePullPhase::Other`] and the like, so a
//! newer kruise-manager never breaks the daemon.
//!
//! v1alpha1 is served by every kruise release from 1.8 on (the conversion webhook translates to the
//! v1beta1 storage versions), which is why the daemon speaks v1alpha1 for all three resources.

mod crr;
mod nodeimage;
mod nodepodprobe;

#[cfg(feature = "test-util")]
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
};
#[cfg(feature = "test-util")]
use kube::CustomResourceExt;
use serde::{Deserialize, Deserializer};

pub use crr::{
    ContainerRecreateRequest, ContainerRecreateRequestContainer,
    ContainerRecreateRequestContainerContext, ContainerRecreateRequestContainerRecreateState,
    ContainerRecreateRequestPhase, ContainerRecreateRequestSpec, ContainerRecreateRequestStatus,
    ContainerRecreateRequestStrategy, ContainerStatusSnapshot, CrrCondition,
    DEFAULT_TERMINATION_GRACE_PERIOD, FailurePolicy, ProbeHandler,
};
pub use nodeimage::{
    DEFAULT_PULL_BACKOFF_LIMIT, DEFAULT_PULL_TIMEOUT, ImagePullPhase, ImagePullPolicy, ImageSpec,
    ImageStatus, ImageTagPullPolicy, ImageTagSpec, ImageTagStatus, NodeImage, NodeImageSpec,
    NodeImageStatus, ReferenceObject, SandboxConfig, SyncStatus, SyncStatusPhase,
};
pub use nodepodprobe::{
    ContainerProbe, ContainerProbeSpec, ContainerProbeState, NodePodProbe, NodePodProbeSpec,
    NodePodProbeStatus, PodProbe, PodProbeStatus, ProbeState,
};

/// The longest duration read from the API (a grace period, a deadline, a TTL, a probe's
/// period): a year. Anyone who may write a pod or a request writes these as int64 seconds, up to
/// about 292 billion years; each is clamped here once, so every `Instant + d` that follows stays
/// far from overflow (which panics), and a year is past any grace or deadline a cluster means.
pub const MAX_API_DURATION: std::time::Duration =
    std::time::Duration::from_secs(365 * 24 * 60 * 60);

/// `seconds` from the API as a duration: negative is zero, more than [`MAX_API_DURATION`] is
/// that.
pub fn api_seconds(seconds: i64) -> std::time::Duration {
    std::time::Duration::from_secs(u64::try_from(seconds).unwrap_or(0)).min(MAX_API_DURATION)
}

/// The version the daemon speaks for all three resources.
pub const VERSION: &str = "v1alpha1";

/// The three CustomResourceDefinitions as `kruised crds` prints them: `deploy/crds.yaml`, which
/// [`crds_yaml`] generates from the Rust types (in test builds only: the JSON schema generator and
/// the YAML writer it needs are not in the shipped binary). The test
/// `checked_in_crds_match_the_rust_types` fails when the two differ.
pub const CRDS_YAML: &str = include_str!("../../../deploy/crds.yaml");

/// A CRD manifest could not be rendered.
#[cfg(feature = "test-util")]
#[derive(Debug, thiserror::Error)]
pub enum CrdError {
    /// The CustomResourceDefinitions could not be written as YAML.
    #[error("cannot render the CustomResourceDefinitions as YAML: {0}")]
    Yaml(#[source] serde_saphyr::SerializeError),
}

/// The CustomResourceDefinitions of the three resources, in a fixed order (NodeImage,
/// ContainerRecreateRequest, NodePodProbe).
///
/// The schemas carry no `default`s: schemars derives one for every `#[serde(default)]` field, but
/// kruise's CRDs have none, and the apiserver would otherwise fill them into stored objects.
#[cfg(feature = "test-util")]
pub fn crds() -> Vec<CustomResourceDefinition> {
    let mut crds = vec![
        NodeImage::crd(),
        ContainerRecreateRequest::crd(),
        NodePodProbe::crd(),
    ];
    for version in crds.iter_mut().flat_map(|c| &mut c.spec.versions) {
        if let Some(schema) = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
        {
            strip_defaults(schema);
        }
    }
    crds
}

/// Removes `default` from a schema and every schema nested in it.
#[cfg(feature = "test-util")]
fn strip_defaults(schema: &mut JSONSchemaProps) {
    schema.default = None;
    let maps = [
        schema.properties.as_mut(),
        schema.pattern_properties.as_mut(),
        schema.definitions.as_mut(),
    ];
    for nested in maps.into_iter().flatten().flat_map(|m| m.values_mut()) {
        strip_defaults(nested);
    }
    let lists = [
        schema.all_of.as_mut(),
        schema.any_of.as_mut(),
        schema.one_of.as_mut(),
    ];
    for nested in lists.into_iter().flatten().flatten() {
        strip_defaults(nested);
    }
    if let Some(not) = schema.not.as_mut() {
        strip_defaults(not);
    }
    match schema.items.as_mut() {
        Some(JSONSchemaPropsOrArray::Schema(s)) => strip_defaults(s),
        Some(JSONSchemaPropsOrArray::Schemas(list)) => list.iter_mut().for_each(strip_defaults),
        None => {}
    }
    for or_bool in [
        schema.additional_properties.as_mut(),
        schema.additional_items.as_mut(),
    ]
    .into_iter()
    .flatten()
    {
        if let JSONSchemaPropsOrBool::Schema(s) = or_bool {
            strip_defaults(s);
        }
    }
}

/// Header of [`crds_yaml`]: says where the file comes from.
#[cfg(feature = "test-util")]
const CRDS_YAML_HEADER: &str = "\
# apps.kruise.io/v1alpha1 CustomResourceDefinitions for kruised, generated from the Rust types.
# Regenerate with `kruised crds > deploy/crds.yaml` or `KRUISED_BLESS=1 cargo test --test crds`.
# On a cluster with OpenKruise installed, use OpenKruise's own CRDs instead.
";

/// The three CustomResourceDefinitions as one multi-document YAML stream (`---` separated), the
/// same bytes on every call.
///
/// These are for standalone use: clusters without OpenKruise (kruised's own tests, or running the
/// daemon against hand-written objects). On an OpenKruise cluster the CRDs installed by
/// kruise-manager's chart are authoritative: they also carry the v1beta1 versions and the
/// conversion webhook, which these do not, and must not be replaced by these.
#[cfg(feature = "test-util")]
pub fn crds_yaml() -> Result<String, CrdError> {
    let body = serde_saphyr::to_string_multiple(&crds()).map_err(CrdError::Yaml)?;
    Ok(format!("{CRDS_YAML_HEADER}---\n{body}"))
}

// === serde helpers shared by the resource and annotation types ===

/// Deserializes `null` (Go's nil slice or map) as the default value, the way Go's
/// `encoding/json` leaves a nil slice or map for `null`. Pair it with `#[serde(default)]` so a
/// missing field is accepted too.
pub(crate) fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

/// Go's `omitempty` test for an `int32`.
pub(crate) fn is_zero_i32(v: &i32) -> bool {
    *v == 0
}

/// Go's `omitempty` test for an `int64`.
pub(crate) fn is_zero_i64(v: &i64) -> bool {
    *v == 0
}

/// Go's `omitempty` test for a `bool`.
pub(crate) fn is_false(v: &bool) -> bool {
    !*v
}

/// Defines a string-valued enum for a Go `type X string` with a known set of constants.
///
/// The generated type keeps any other string as `Other(String)` (so parsing never fails and the
/// value round-trips), serializes as the plain string, has the schema `type: string` (as kruise's
/// CRDs do: no `enum` restriction) and defaults to the value of `""` (Go's zero value).
macro_rules! string_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $value:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Debug, PartialEq, Eq, Hash)]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )+
            /// A value this version does not know (from a newer kruise, or garbage), kept verbatim.
            Other(String),
        }

        impl $name {
            /// The wire value.
            pub fn as_str(&self) -> &str {
                match self {
                    $( Self::$variant => $value, )+
                    Self::Other(s) => s,
                }
            }
        }

        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                match s {
                    $( $value => Self::$variant, )+
                    other => Self::Other(other.to_owned()),
                }
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::from("")
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                // `null` is Go's zero value too.
                let s = Option::<String>::deserialize(deserializer)?;
                Ok(Self::from(s.as_deref().unwrap_or("")))
            }
        }

        #[cfg(feature = "test-util")]
        impl schemars::JsonSchema for $name {
            fn inline_schema() -> bool {
                true
            }

            fn schema_name() -> std::borrow::Cow<'static, str> {
                stringify!($name).into()
            }

            fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
                schemars::json_schema!({ "type": "string" })
            }
        }
    };
}
pub(crate) use string_enum;

#[cfg(test)]
mod tests {

    proptest::proptest! {
        /// Grace periods, deadlines and TTLs come from anyone who may write a pod or a
        /// request, as int64 seconds: each is a duration of at most a year, never a panic.
        #[test]
        fn any_seconds_from_the_api_are_a_duration_of_at_most_a_year(s in proptest::num::i64::ANY) {
            let d = super::api_seconds(s);
            proptest::prop_assert!(d <= super::MAX_API_DURATION);
            proptest::prop_assert_eq!(d.is_zero(), s <= 0);
            // and an Instant holds it
            proptest::prop_assert!(tokio::time::Instant::now().checked_add(d).is_some());
        }
    }

    use super::*;

    #[test]
    fn the_printed_crds_are_the_checked_in_file_the_generator_writes() {
        assert_eq!(CRDS_YAML, crds_yaml().unwrap());
    }

    #[test]
    fn crds_yaml_is_the_same_on_every_call() {
        let a = crds_yaml().unwrap();
        let b = crds_yaml().unwrap();
        assert_eq!(a, b);
        assert_eq!(a.matches("\nkind: CustomResourceDefinition\n").count(), 3);
    }

    #[test]
    fn crds_yaml_parses_back_into_the_same_definitions() {
        let yaml = crds_yaml().unwrap();
        let parsed: Vec<CustomResourceDefinition> = serde_saphyr::from_multiple(&yaml).unwrap();
        assert_eq!(parsed, crds());
    }

    #[test]
    fn crd_schemas_carry_no_defaults() {
        let yaml = crds_yaml().unwrap();
        assert!(!yaml.contains("default:"), "{yaml}");
    }

    #[test]
    fn unknown_phase_values_round_trip_verbatim() {
        let p: ImagePullPhase = serde_json::from_str(r#""Queued""#).unwrap();
        assert_eq!(p, ImagePullPhase::Other("Queued".into()));
        assert_eq!(serde_json::to_string(&p).unwrap(), r#""Queued""#);
        let p: ImagePullPhase = serde_json::from_str("null").unwrap();
        assert_eq!(p, ImagePullPhase::Other(String::new()));
    }

    #[test]
    fn null_slices_deserialize_as_empty() {
        let s: ImageStatus = serde_json::from_str(r#"{"tags":null}"#).unwrap();
        assert!(s.tags.is_empty());
    }
}
