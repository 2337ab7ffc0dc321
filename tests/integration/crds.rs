//! The checked-in CRD manifests (`deploy/crds.yaml`) against the Rust types, `kruised crds` (which
//! prints that file) and the shape of each CustomResourceDefinition.

use std::path::PathBuf;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, CustomResourceDefinitionVersion, JSONSchemaProps,
    JSONSchemaPropsOrArray,
};
use kruised::k8s::crd::{self, crds, crds_yaml};

/// How to bring `deploy/crds.yaml` up to date (`kruised crds` prints the checked-in file, so it
/// cannot).
const REGENERATE: &str =
    "KRUISED_BLESS=1 cargo test --test integration crds::checked_in_crds_match_the_rust_types";

fn checked_in_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("deploy/crds.yaml")
}

fn crd_named(name: &str) -> CustomResourceDefinition {
    crds()
        .into_iter()
        .find(|c| c.metadata.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("no CRD {name}"))
}

fn only_version(crd: &CustomResourceDefinition) -> &CustomResourceDefinitionVersion {
    assert_eq!(crd.spec.versions.len(), 1, "one version");
    &crd.spec.versions[0]
}

fn schema(crd: &CustomResourceDefinition) -> &JSONSchemaProps {
    only_version(crd)
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .expect("a schema")
}

fn property<'a>(schema: &'a JSONSchemaProps, name: &str) -> &'a JSONSchemaProps {
    schema
        .properties
        .as_ref()
        .and_then(|p| p.get(name))
        .unwrap_or_else(|| panic!("no property {name}"))
}

fn items(schema: &JSONSchemaProps) -> &JSONSchemaProps {
    match schema.items.as_ref() {
        Some(JSONSchemaPropsOrArray::Schema(s)) => s,
        other => panic!("not a list schema: {other:?}"),
    }
}

/// (name, type, jsonPath) of each printer column.
fn columns(crd: &CustomResourceDefinition) -> Vec<(String, String, String)> {
    only_version(crd)
        .additional_printer_columns
        .iter()
        .flatten()
        .map(|c| (c.name.clone(), c.type_.clone(), c.json_path.clone()))
        .collect()
}

fn cols(want: &[(&str, &str, &str)]) -> Vec<(String, String, String)> {
    want.iter()
        .map(|(n, t, p)| ((*n).into(), (*t).into(), (*p).into()))
        .collect()
}

#[test]
fn checked_in_crds_match_the_rust_types() {
    let want = crds_yaml().expect("CRDs render");
    let path = checked_in_path();
    if std::env::var("KRUISED_BLESS").as_deref() == Ok("1") {
        std::fs::write(&path, &want).expect("write deploy/crds.yaml");
        return;
    }
    let have = std::fs::read_to_string(&path).unwrap_or_else(|err| {
        panic!(
            "cannot read {}: {err}; generate it with `{REGENERATE}`",
            path.display()
        )
    });
    if have != want {
        let line = have
            .lines()
            .zip(want.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| have.lines().count().min(want.lines().count()));
        panic!(
            "{} is stale (first difference at line {}); regenerate it with `{REGENERATE}`",
            path.display(),
            line + 1
        );
    }
}

#[test]
fn kruised_crds_prints_the_generated_crds_byte_for_byte() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kruised"))
        .arg("crds")
        .output()
        .expect("run kruised crds");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let want = crds_yaml().expect("CRDs render");
    assert!(
        out.stdout == want.as_bytes(),
        "`kruised crds` differs from the generator's output; regenerate with `{REGENERATE}`"
    );
}

#[test]
fn every_crd_is_apps_kruise_io_v1alpha1_served_and_stored_with_a_status_subresource() {
    let all = crds();
    assert_eq!(all.len(), 3);
    for c in &all {
        assert_eq!(c.spec.group, kruised::k8s::keys::KRUISE_GROUP);
        assert_eq!(c.spec.group, "apps.kruise.io");
        let v = only_version(c);
        assert_eq!(v.name, crd::VERSION);
        assert_eq!(v.name, "v1alpha1");
        assert!(
            v.served && v.storage,
            "{:?} served and storage",
            c.metadata.name
        );
        assert!(
            v.subresources
                .as_ref()
                .and_then(|s| s.status.as_ref())
                .is_some(),
            "{:?} has a status subresource",
            c.metadata.name
        );
        assert!(
            c.spec.conversion.is_none(),
            "standalone CRDs convert nothing"
        );
    }
}

#[test]
fn node_image_is_cluster_scoped_with_kruise_printer_columns() {
    let c = crd_named("nodeimages.apps.kruise.io");
    assert_eq!(c.spec.scope, "Cluster");
    assert_eq!(c.spec.names.kind, "NodeImage");
    assert_eq!(c.spec.names.plural, "nodeimages");
    assert_eq!(c.spec.names.short_names, None);
    assert_eq!(
        columns(&c),
        cols(&[
            ("DESIRED", "integer", ".status.desired"),
            ("PULLING", "integer", ".status.pulling"),
            ("SUCCEED", "integer", ".status.succeeded"),
            ("FAILED", "integer", ".status.failed"),
            ("AGE", "date", ".metadata.creationTimestamp"),
        ])
    );
    let status = property(schema(&c), "status");
    for counter in ["desired", "succeeded", "failed", "pulling", "waiting"] {
        assert_eq!(property(status, counter).type_.as_deref(), Some("integer"));
    }
    let tag = items(property(
        property(status, "imageStatuses")
            .additional_properties
            .as_ref()
            .map(|a| match a {
                k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaPropsOrBool::Schema(s) => &**s,
                other => panic!("imageStatuses values: {other:?}"),
            })
            .expect("imageStatuses is a map"),
        "tags",
    ));
    // Phases are plain strings, as in kruise's CRDs: an enum would reject newer phases.
    let phase = property(tag, "phase");
    assert_eq!(phase.type_.as_deref(), Some("string"));
    assert!(phase.enum_.is_none());
}

#[test]
fn container_recreate_request_is_namespaced_with_short_name_crr_and_kruise_printer_columns() {
    let c = crd_named("containerrecreaterequests.apps.kruise.io");
    assert_eq!(c.spec.scope, "Namespaced");
    assert_eq!(c.spec.names.kind, "ContainerRecreateRequest");
    assert_eq!(c.spec.names.short_names, Some(vec!["crr".to_owned()]));
    assert_eq!(
        columns(&c),
        cols(&[
            ("PHASE", "string", ".status.phase"),
            ("POD", "string", ".spec.podName"),
            (
                "NODE",
                "string",
                r".metadata.labels.crr\.apps\.kruise\.io/node-name"
            ),
            ("AGE", "date", ".metadata.creationTimestamp"),
        ])
    );
    let containers = items(property(property(schema(&c), "spec"), "containers"));
    let pre_stop = property(containers, "preStop");
    for handler in ["exec", "httpGet", "tcpSocket"] {
        property(pre_stop, handler);
    }
}

#[test]
fn node_pod_probe_is_cluster_scoped_and_its_schema_keeps_the_capitalised_ip_key() {
    let c = crd_named("nodepodprobes.apps.kruise.io");
    assert_eq!(c.spec.scope, "Cluster");
    assert_eq!(c.spec.names.kind, "NodePodProbe");
    assert!(columns(&c).is_empty(), "kruise defines no printer columns");
    let pod_probe = items(property(property(schema(&c), "spec"), "podProbes"));
    let preserves_unknown = pod_probe.x_kubernetes_preserve_unknown_fields == Some(true);
    let has_ip = pod_probe.properties.as_ref().is_some_and(|p| {
        p.get("IP")
            .is_some_and(|ip| ip.type_.as_deref() == Some("string"))
    });
    assert!(
        has_ip || preserves_unknown,
        "the apiserver would prune `IP`"
    );
    assert!(
        pod_probe
            .properties
            .as_ref()
            .is_some_and(|p| !p.contains_key("ip")),
        "no lowercase `ip`"
    );
    let probe = property(items(property(pod_probe, "probes")), "probe");
    for field in [
        "exec",
        "httpGet",
        "tcpSocket",
        "periodSeconds",
        "failureThreshold",
    ] {
        property(probe, field);
    }
}

#[test]
fn deploy_manifests_parse_and_grant_only_what_the_daemon_uses() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy");
    let rbac = std::fs::read_to_string(format!("{dir}/rbac.yaml")).unwrap();
    let docs: Vec<serde_json::Value> = rbac
        .split("\n---\n")
        .map(|d| serde_saphyr::from_str(d).unwrap())
        .collect();
    let cluster_role = docs.iter().find(|d| d["kind"] == "ClusterRole").unwrap();
    for rule in cluster_role["rules"].as_array().unwrap() {
        for r in rule["resources"].as_array().unwrap() {
            assert_ne!(
                r, "secrets",
                "secrets only in the config namespace (kruise CVE fix #1482)"
            );
        }
    }
    let ds: serde_json::Value =
        serde_saphyr::from_str(&std::fs::read_to_string(format!("{dir}/daemonset.yaml")).unwrap())
            .unwrap();
    let spec = &ds["spec"]["template"]["spec"];
    assert!(spec.get("hostNetwork").is_none(), "no hostNetwork");
    assert_eq!(
        spec["containers"][0]["livenessProbe"]["httpGet"]["path"],
        "/healthz"
    );
    let k: serde_json::Value = serde_saphyr::from_str(
        &std::fs::read_to_string(format!("{dir}/kustomization.yaml")).unwrap(),
    )
    .unwrap();
    for r in k["resources"].as_array().unwrap() {
        assert!(
            std::path::Path::new(&format!("{dir}/{}", r.as_str().unwrap())).exists(),
            "{r}"
        );
    }
}
