//! `kruised hash`: the hashes kruise and the kubelet compute for each container of a pod, to
//! check by hand what the daemon and the manager compare.

use std::io::Read;
use std::path::Path;
use std::process::ExitCode;

use clap::Args;
use k8s_openapi::api::core::v1::Pod;

use super::output::OutputFormat;
use crate::hash::env::expected_env_hash;
use crate::hash::kubelet::{format_hash, hash_container, hash_container_legacy};

/// Arguments of `kruised hash`.
#[derive(Debug, Args)]
pub struct HashArgs {
    /// The Pod manifest; `-` or nothing reads stdin.
    pub file: Option<String>,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t)]
    pub output: OutputFormat,
}

/// The hashes of one container.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerHashes {
    /// Container name.
    pub name: String,
    /// Kubelet ≥ 1.31 (`name` + `image`), hex as in `io.kubernetes.container.hash`.
    pub kubelet_hash: String,
    /// Kubelet ≤ 1.30 (the whole container), hex.
    pub kubelet_hash_legacy: String,
    /// kruise's env-from-metadata hash expected from the pod's labels and annotations.
    pub env_from_metadata_hash: u64,
}

/// Why a pod could not be read.
#[derive(Debug, thiserror::Error)]
pub enum HashError {
    /// The input could not be read.
    #[error("reading {what}: {source}")]
    Read {
        /// File or stdin.
        what: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The input is neither a JSON nor a YAML Pod.
    #[error("{what} is not a Pod in JSON or YAML: {reason}")]
    Parse {
        /// File or stdin.
        what: String,
        /// The parser's message.
        reason: String,
    },
}

/// Parses a Pod from JSON or YAML text.
///
/// Both go through a `serde_json::Value` and then the JSON byte deserializer the API client
/// already uses for pods: deserializing a `Pod` straight from YAML would compile a second copy
/// of every Kubernetes type's parser into the binary (about 4 MB of code).
pub fn parse_pod(text: &str, what: &str) -> Result<Pod, HashError> {
    let parse_error = |reason: String| HashError::Parse {
        what: what.to_string(),
        reason,
    };
    let value = match serde_json::from_str::<serde_json::Value>(text) {
        Ok(v) => v,
        Err(json_err) => match crate::yaml::from_str::<serde_json::Value>(text) {
            Ok(Some(v)) => v,
            Ok(None) => return Err(parse_error("no document".to_string())),
            Err(yaml_err) => {
                return Err(parse_error(if text.trim_start().starts_with('{') {
                    json_err.to_string()
                } else {
                    yaml_err.to_string()
                }));
            }
        },
    };
    // from the `Value`, as the watch reads pods: one deserialiser of the pod's types in the
    // binary (`k8s::pods`)
    serde_json::from_value::<Pod>(value).map_err(|e| parse_error(e.to_string()))
}

/// The hashes of every container of `pod`.
pub fn pod_hashes(pod: &Pod) -> Vec<ContainerHashes> {
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    pod.spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .map(|c| ContainerHashes {
            name: c.name.clone(),
            kubelet_hash: format_hash(hash_container(c)),
            kubelet_hash_legacy: format_hash(hash_container_legacy(c)),
            env_from_metadata_hash: expected_env_hash(c, &labels, &annotations),
        })
        .collect()
}

/// Formats the hashes as a table.
pub fn table(rows: &[ContainerHashes]) -> String {
    let width = rows
        .iter()
        .map(|r| r.name.len())
        .max()
        .unwrap_or(0)
        .max("CONTAINER".len());
    let mut out = format!(
        "{:<width$}  {:<20}  {:<20}  {}\n",
        "CONTAINER", "KUBELET HASH >=1.31", "KUBELET HASH <=1.30", "ENV-FROM-METADATA HASH"
    );
    for r in rows {
        out.push_str(&format!(
            "{:<width$}  {:<20}  {:<20}  {}\n",
            r.name, r.kubelet_hash, r.kubelet_hash_legacy, r.env_from_metadata_hash
        ));
    }
    out
}

pub(crate) fn run(args: HashArgs) -> anyhow::Result<ExitCode> {
    let (text, what) = match args.file.as_deref() {
        None | Some("-") => {
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .map_err(|source| HashError::Read {
                    what: "stdin".into(),
                    source,
                })?;
            (s, "stdin".to_string())
        }
        Some(path) => (
            std::fs::read_to_string(Path::new(path)).map_err(|source| HashError::Read {
                what: path.to_string(),
                source,
            })?,
            path.to_string(),
        ),
    };
    let pod = parse_pod(&text, &what)?;
    let rows = pod_hashes(&pod);
    match args.output {
        OutputFormat::Table => print!("{}", table(&rows)),
        OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&rows)?),
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KUBELET_TEST_POD: &str = "
apiVersion: v1
kind: Pod
metadata:
  name: p
  annotations:
    x: foo
spec:
  containers:
  - name: test_container
    image: foo/image:v1
    args: [/bin/sh, -c, echo abc]
    ports:
    - containerPort: 8001
";

    #[test]
    fn yaml_pods_hash_to_the_kubelets_published_vectors() {
        let pod = parse_pod(KUBELET_TEST_POD, "test").unwrap();
        let rows = pod_hashes(&pod);
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].kubelet_hash, "8e45cbd0");
        assert_eq!(rows[0].kubelet_hash_legacy, "3c42280f");
        assert_eq!(
            rows[0].env_from_metadata_hash, 86_995_377,
            "no env from metadata"
        );
        let t = table(&rows);
        assert!(t.starts_with("CONTAINER"), "{t}");
        assert!(t.contains("test_container  8e45cbd0"), "{t}");
    }

    #[test]
    fn json_pods_parse_too_and_garbage_is_an_error_naming_the_input() {
        let pod = parse_pod(
            r#"{"metadata":{"name":"p"},"spec":{"containers":[{"name":"c","image":"i"}]}}"#,
            "x",
        )
        .unwrap();
        assert_eq!(pod_hashes(&pod)[0].name, "c");
        let err = parse_pod("{not json", "pod.json").unwrap_err().to_string();
        assert!(err.contains("pod.json"), "{err}");
    }

    #[test]
    fn json_output_uses_the_documented_field_names() {
        let pod = parse_pod(KUBELET_TEST_POD, "test").unwrap();
        let v = serde_json::to_value(pod_hashes(&pod)).unwrap();
        assert_eq!(
            v,
            serde_json::json!([{"name": "test_container", "kubeletHash": "8e45cbd0",
                "kubeletHashLegacy": "3c42280f", "envFromMetadataHash": 86_995_377u64}])
        );
    }
}
