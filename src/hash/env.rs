//! kruise's `ExtractedEnvFromMetadataHash` (`pkg/util/containermeta/env_hash.go`), which must match
//! kruise-manager bit for bit, and parsers for the environment of a running container.
//!
//! The hash covers the container's env vars that have no literal `value`, take `valueFrom.fieldRef`
//! with a `fieldPath` of the form `metadata.labels['k']` or `metadata.annotations['k']`, and are not
//! named `SIDECARSET_VERSION` / `SIDECARSET_VERSION_ALT`. They become `[]v1.EnvVar{{Name, Value}}`,
//! stable-sorted by name, marshalled with Go's `encoding/json` and hashed with `DeepHashObject`
//! (FNV-1a 32). No such env vars marshal as `null`, whose hash is [`NO_ENV_HASH`].

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, EnvVar};

use super::deep_hash_bytes;
use crate::gojson::{Dialect, GoStruct, GoValue, marshal_with};

/// Env var names kruise never treats as metadata references (`excludeEnvs`).
pub const EXCLUDED_ENV_NAMES: [&str; 2] = ["SIDECARSET_VERSION", "SIDECARSET_VERSION_ALT"];

/// The hash of a container without metadata-referencing env vars (`json.Marshal` of a nil slice is
/// `null`): 86995377 (0x052f71b1).
pub const NO_ENV_HASH: u64 = 86_995_377;

/// The pod metadata an env var is taken from.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MetaRef {
    /// `metadata.labels['<key>']`.
    Label(String),
    /// `metadata.annotations['<key>']`.
    Annotation(String),
}

impl MetaRef {
    /// The label or annotation key.
    pub fn key(&self) -> &str {
        match self {
            MetaRef::Label(k) | MetaRef::Annotation(k) => k,
        }
    }

    /// The value this reference resolves to on a pod; a missing key gives `""`, as a Go map lookup.
    pub fn resolve<'a>(
        &self,
        labels: &'a BTreeMap<String, String>,
        annotations: &'a BTreeMap<String, String>,
    ) -> &'a str {
        let map = match self {
            MetaRef::Label(_) => labels,
            MetaRef::Annotation(_) => annotations,
        };
        map.get(self.key()).map_or("", String::as_str)
    }
}

/// k8s `fieldpath.SplitMaybeSubscriptedPath`: `path['subscript']` → `(path, subscript)`.
///
/// Only single quotes are recognised (k8s has never accepted double quotes here). The subscript is
/// everything between the first `['` and the trailing `']`, so `metadata.annotations['a[b]c']` gives
/// `a[b]c` and `metadata.labels['']` gives an empty key. `None` for unsubscripted paths and for an
/// empty path before `['`.
pub fn split_maybe_subscripted_path(field_path: &str) -> Option<(&str, &str)> {
    let inner = field_path.strip_suffix("']")?;
    let (path, subscript) = inner.split_once("['")?;
    if path.is_empty() {
        return None;
    }
    Some((path, subscript))
}

/// The metadata reference of one env var, if kruise's filter selects it.
pub fn env_meta_ref(env: &EnvVar) -> Option<MetaRef> {
    if env.value.as_deref().is_some_and(|v| !v.is_empty()) {
        return None;
    }
    let field_ref = env.value_from.as_ref()?.field_ref.as_ref()?;
    if EXCLUDED_ENV_NAMES.contains(&env.name.as_str()) {
        return None;
    }
    match split_maybe_subscripted_path(&field_ref.field_path)? {
        ("metadata.labels", key) => Some(MetaRef::Label(key.to_owned())),
        ("metadata.annotations", key) => Some(MetaRef::Annotation(key.to_owned())),
        _ => None,
    }
}

/// The env vars of `container` that take their value from a pod label or annotation, as
/// `(env name, reference)` in declaration order. Empty ⇒ the hash is [`NO_ENV_HASH`] and there is no
/// need to read the running container's environment.
pub fn env_meta_refs(container: &Container) -> Vec<(String, MetaRef)> {
    container
        .env
        .iter()
        .flatten()
        .filter_map(|env| env_meta_ref(env).map(|r| (env.name.clone(), r)))
        .collect()
}

/// kruise `GetExpectHash`: the hash with values resolved from the pod's labels and annotations
/// (missing key ⇒ `""`).
pub fn expected_env_hash(
    container: &Container,
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
) -> u64 {
    env_hash_with(container, Dialect::Go122, |_, r| {
        r.resolve(labels, annotations).to_owned()
    })
}

/// kruise `GetCurrentHash`: the hash with values taken from the running container's environment;
/// `lookup(env name)` gives the value, `None` counting as `""` (kruise reads a Go map).
pub fn current_env_hash(container: &Container, lookup: impl Fn(&str) -> Option<String>) -> u64 {
    env_hash_with(container, Dialect::Go122, |name, _| {
        lookup(name).unwrap_or_default()
    })
}

/// The hash with each selected env var's value supplied by `value_of(env name, reference)`, encoded
/// with the escaping of the given Go release (kruise ≥ 1.8 is built with Go ≥ 1.22; the releases only
/// differ for values containing U+0008 or U+000C).
pub fn env_hash_with(
    container: &Container,
    dialect: Dialect,
    mut value_of: impl FnMut(&str, &MetaRef) -> String,
) -> u64 {
    let pairs = env_meta_refs(container)
        .into_iter()
        .map(|(name, r)| {
            let value = value_of(&name, &r);
            (name, value)
        })
        .collect();
    hash_env_pairs(pairs, dialect)
}

/// kruise `hashEnvs` after the stable sort: `DeepHash(json.Marshal([]v1.EnvVar))` of
/// `(name, value)` pairs, `value` omitted when empty; no pairs ⇒ `null` ⇒ [`NO_ENV_HASH`].
pub fn hash_env_pairs(mut pairs: Vec<(String, String)>, dialect: Dialect) -> u64 {
    // Go's sort.SliceStable by `Name <` (byte order); Rust's `sort_by` is stable too.
    pairs.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    let value = if pairs.is_empty() {
        GoValue::Null
    } else {
        GoValue::Array(
            pairs
                .into_iter()
                .map(|(name, value)| {
                    GoStruct::new()
                        .field("name", name)
                        .omitempty("value", Some(GoValue::String(value)))
                        .build()
                })
                .collect(),
        )
    };
    deep_hash_bytes(&marshal_with(&value, dialect))
}

/// Parses an OCI `process.env` style list (`KEY=VALUE` per element). Each element is split at its
/// FIRST `=` (values may contain `=`, kruise #1108); elements without `=` are skipped; a repeated key
/// keeps its last value (as kruise's map does).
pub fn parse_env_list(entries: &[String]) -> BTreeMap<String, String> {
    entries
        .iter()
        .filter_map(|e| e.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// Parses the stdout of `env` run in the container (`KEY=VALUE\n` per variable).
///
/// This text form is ambiguous: `env` prints a value containing a newline across several lines, and
/// nothing distinguishes such a continuation from the next variable. The rule used: a line with `=`
/// starts a new variable (split at its first `=`); a line without `=` continues the previous value,
/// joined with `\n`; lines before any variable are dropped. So a value whose continuation line
/// contains `=` is cut short (and a bogus variable appears) — prefer [`parse_env_list`] on the OCI
/// spec when available. One trailing newline (the terminator of the last line) is removed; nothing
/// else is trimmed. Invalid UTF-8 becomes U+FFFD. A repeated key keeps its last value.
///
/// kruise itself trims the whole output and every line (`strings.TrimSpace`) and drops lines
/// without `=`; this parser keeps surrounding blanks and multi-line values so that the current hash
/// matches the expected one for such values instead of forcing restarts.
pub fn parse_env_text(stdout: &[u8]) -> BTreeMap<String, String> {
    let text = String::from_utf8_lossy(stdout);
    let text = text.strip_suffix('\n').unwrap_or(&text);
    let mut vars = BTreeMap::new();
    if text.is_empty() {
        return vars;
    }
    let mut current: Option<String> = None;
    for line in text.split('\n') {
        if let Some((k, v)) = line.split_once('=') {
            vars.insert(k.to_owned(), v.to_owned());
            current = Some(k.to_owned());
        } else if let Some(value) = current.as_ref().and_then(|k| vars.get_mut(k)) {
            value.push('\n');
            value.push_str(line);
        }
    }
    vars
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{EnvVarSource, ObjectFieldSelector, ResourceFieldSelector};

    fn field_env(name: &str, path: &str) -> EnvVar {
        EnvVar {
            name: name.into(),
            value: None,
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    api_version: None,
                    field_path: path.into(),
                }),
                ..Default::default()
            }),
        }
    }

    fn value_env(name: &str, value: &str) -> EnvVar {
        EnvVar {
            name: name.into(),
            value: Some(value.into()),
            value_from: None,
        }
    }

    fn container(env: Vec<EnvVar>) -> Container {
        Container {
            name: "c".into(),
            env: Some(env),
            ..Default::default()
        }
    }

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn lookup(env: &BTreeMap<String, String>) -> impl Fn(&str) -> Option<String> + '_ {
        |name| env.get(name).cloned()
    }

    #[test]
    fn container_without_metadata_envs_hashes_as_json_null() {
        let c = container(vec![value_env("A", "1")]);
        assert_eq!(expected_env_hash(&c, &map(&[]), &map(&[])), NO_ENV_HASH);
        assert_eq!(current_env_hash(&c, |_| None), NO_ENV_HASH);
        assert_eq!(
            expected_env_hash(&Container::default(), &map(&[]), &map(&[])),
            86_995_377
        );
    }

    #[test]
    fn label_env_with_value_matches_vector() {
        let c = container(vec![field_env("e2", "metadata.labels['l1']")]);
        assert_eq!(
            expected_env_hash(&c, &map(&[("l1", "foo")]), &map(&[])),
            2_053_173_458
        );
        assert_eq!(
            hash_env_pairs(vec![("e2".into(), "foo".into())], Dialect::Go122),
            2_053_173_458
        );
    }

    #[test]
    fn missing_label_hashes_like_an_env_without_value() {
        let c = container(vec![field_env("e2", "metadata.labels['l1']")]);
        assert_eq!(expected_env_hash(&c, &map(&[]), &map(&[])), 1_885_397_378);
        assert_eq!(current_env_hash(&c, |_| None), 1_885_397_378);
    }

    #[test]
    fn hash_is_deep_hash_of_go_json_of_sorted_env_vars() {
        let c = container(vec![
            field_env("b", "metadata.annotations['x']"),
            field_env("a", "metadata.labels['y']"),
        ]);
        let json = br#"[{"name":"a","value":"\u003cy\u003e"},{"name":"b","value":"x\u0026"}]"#;
        assert_eq!(
            expected_env_hash(&c, &map(&[("y", "<y>")]), &map(&[("x", "x&")])),
            deep_hash_bytes(json)
        );
    }

    #[test]
    fn kruise_test_cases_compare_as_in_env_hash_test_go() {
        let labels = map(&[("l1", "foo"), ("l2", "bar")]);
        let c1 = container(vec![
            value_env("e1", "a"),
            field_env("e2", "metadata.labels['l1']"),
        ]);
        let c2 = container(vec![
            value_env("e1", "a"),
            field_env("e2", "metadata.labels['l1']"),
            value_env("e3", "c"),
        ]);
        let real = map(&[("e2", "bar")]);
        assert_ne!(
            expected_env_hash(&c1, &labels, &map(&[])),
            current_env_hash(&c2, lookup(&real))
        );

        let c2 = container(vec![
            field_env("e2", "metadata.labels['l1']"),
            value_env("e1", "a"),
        ]);
        let real = map(&[("e2", "foo")]);
        assert_eq!(
            expected_env_hash(&c1, &labels, &map(&[])),
            current_env_hash(&c2, lookup(&real))
        );
    }

    #[test]
    fn only_label_and_annotation_field_refs_without_value_are_selected() {
        let mut with_value = field_env("HAS_VALUE", "metadata.labels['a']");
        with_value.value = Some("literal".into());
        let mut empty_value = field_env("EMPTY_VALUE", "metadata.labels['a']");
        empty_value.value = Some(String::new());
        let resource = EnvVar {
            name: "RES".into(),
            value: None,
            value_from: Some(EnvVarSource {
                resource_field_ref: Some(ResourceFieldSelector {
                    resource: "limits.cpu".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        };
        let c = container(vec![
            with_value,
            empty_value,
            resource,
            value_env("PLAIN", "x"),
            field_env("NAME", "metadata.name"),
            field_env("LABELS", "metadata.labels"),
            field_env("DQ", "metadata.labels[\"a\"]"),
            field_env("SPEC", "spec['a']"),
            field_env("SIDECARSET_VERSION", "metadata.annotations['v']"),
            field_env("SIDECARSET_VERSION_ALT", "metadata.annotations['v']"),
            field_env("ANN", "metadata.annotations['a[b]c']"),
            field_env("EMPTY_KEY", "metadata.labels['']"),
        ]);
        assert_eq!(
            env_meta_refs(&c),
            vec![
                ("EMPTY_VALUE".to_owned(), MetaRef::Label("a".into())),
                ("ANN".to_owned(), MetaRef::Annotation("a[b]c".into())),
                ("EMPTY_KEY".to_owned(), MetaRef::Label(String::new())),
            ]
        );
    }

    #[test]
    fn subscripted_paths_split_like_kubernetes() {
        let split = split_maybe_subscripted_path;
        assert_eq!(
            split("metadata.annotations['myKey']"),
            Some(("metadata.annotations", "myKey"))
        );
        assert_eq!(
            split("metadata.annotations['a[b]c']"),
            Some(("metadata.annotations", "a[b]c"))
        );
        assert_eq!(split("metadata.labels['']"), Some(("metadata.labels", "")));
        assert_eq!(
            split("metadata.labels['a['b']"),
            Some(("metadata.labels", "a['b"))
        );
        assert_eq!(split("metadata.labels"), None);
        assert_eq!(split("['x']"), None);
        assert_eq!(split("['']"), None);
        assert_eq!(split("a[']"), None);
        assert_eq!(split("metadata.labels[\"k\"]"), None);
    }

    #[test]
    fn envs_are_stably_sorted_by_name_in_byte_order() {
        let c = container(vec![
            field_env("b", "metadata.labels['1']"),
            field_env("a", "metadata.labels['2']"),
            field_env("B", "metadata.labels['3']"),
            field_env("a", "metadata.labels['4']"),
        ]);
        let labels = map(&[("1", "one"), ("2", "two"), ("3", "three"), ("4", "four")]);
        let json = br#"[{"name":"B","value":"three"},{"name":"a","value":"two"},{"name":"a","value":"four"},{"name":"b","value":"one"}]"#;
        assert_eq!(
            expected_env_hash(&c, &labels, &map(&[])),
            deep_hash_bytes(json)
        );
    }

    #[test]
    fn current_hash_looks_values_up_by_env_name() {
        let c = container(vec![
            field_env("FROM_LABEL", "metadata.labels['l']"),
            field_env("FROM_ANN", "metadata.annotations['a']"),
        ]);
        let labels = map(&[("l", "lv")]);
        let annotations = map(&[("a", "x=y z")]);
        let running = parse_env_text(b"PATH=/bin\nFROM_ANN=x=y z\nFROM_LABEL=lv\n");
        assert_eq!(
            current_env_hash(&c, lookup(&running)),
            expected_env_hash(&c, &labels, &annotations)
        );
    }

    #[test]
    fn backspace_escape_depends_on_go_release() {
        let pairs = vec![("E".to_owned(), "\u{8}".to_owned())];
        assert_eq!(
            hash_env_pairs(pairs.clone(), Dialect::Go122),
            deep_hash_bytes(br#"[{"name":"E","value":"\b"}]"#)
        );
        assert_eq!(
            hash_env_pairs(pairs, Dialect::PreGo122),
            deep_hash_bytes(br#"[{"name":"E","value":"\u0008"}]"#)
        );
    }

    #[test]
    fn env_list_entries_split_at_the_first_equals_sign() {
        let parsed = parse_env_list(&[
            "A=b=c".to_owned(),
            "EMPTY=".to_owned(),
            "NOEQ".to_owned(),
            "ML=line1\nline2".to_owned(),
            " SP = v ".to_owned(),
            "A=last".to_owned(),
        ]);
        assert_eq!(
            parsed,
            map(&[
                ("A", "last"),
                ("EMPTY", ""),
                ("ML", "line1\nline2"),
                (" SP ", " v "),
            ])
        );
    }

    #[test]
    fn env_text_lines_without_equals_continue_the_previous_value() {
        let parsed = parse_env_text(b"orphan\nA=1\nML=first\nsecond\n\nB=x=y\nTRAIL=v \n");
        assert_eq!(
            parsed,
            map(&[
                ("A", "1"),
                ("ML", "first\nsecond\n"),
                ("B", "x=y"),
                ("TRAIL", "v ")
            ])
        );
    }

    #[test]
    fn env_text_handles_empty_output_and_missing_final_newline() {
        assert!(parse_env_text(b"").is_empty());
        assert!(parse_env_text(b"\n").is_empty());
        assert_eq!(parse_env_text(b"A=1"), map(&[("A", "1")]));
        assert_eq!(parse_env_text(b"A=1\n\n"), map(&[("A", "1\n")]));
        assert_eq!(parse_env_text(b"A=\xff"), map(&[("A", "\u{fffd}")]));
    }
}
