//! Pod probes as kruise-manager 07169cf runs them: a NodePodProbe per Ready node
//! (`pkg/controller/nodepodprobe/node_pod_probe_controller.go`), each PodProbeMarker's probes
//! written into the NodePodProbes of its pods' nodes (`pkg/controller/podprobemarker/
//! pod_probe_marker_controller.go`), and what the daemon reports in NodePodProbe status turned
//! into the pods' conditions, labels and annotations (`updatePodProbeStatus`,
//! node_pod_probe_controller.go:221-374).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};

use super::imagepull::{has_finalizer, matches_labels, with_finalizer};
use super::nodeimage::ready_node;
use super::workload::put_condition;
use super::{
    Inner, Res, Wake, array_mut, condition, deleting, label, name_of, ns_of, pod_active, uid_of,
};

/// The PodProbeMarker's finalizer (pod_probe_marker_controller.go:66,162-169).
const FINALIZER: &str = "kruise.io/node-pod-probe-cleanup";

/// A NodePodProbe per Ready, non-virtual node, created empty; one whose node is gone deleted;
/// entries of pods gone or replaced removed (:137-219).
pub(crate) async fn reconcile_nodes(m: &Inner) -> Wake {
    let nodes = m.list(Res::Nodes, None);
    let probes = m.list(Res::NodePodProbes, None);
    for node in nodes.iter().filter(|n| ready_node(n)) {
        if !probes.iter().any(|p| name_of(p) == name_of(node)) {
            // `{metadata: {name}}` as Go's encoding/json sends it: struct fields are never
            // omitted, so `spec: {}` is there (the status the API server drops on create)
            let npp = json!({"apiVersion": "apps.kruise.io/v1alpha1", "kind": "NodePodProbe",
                             "metadata": {"name": name_of(node)}, "spec": {}});
            m.create("a NodePodProbe for a Ready node", Res::NodePodProbes, &npp)
                .await;
        }
    }
    for npp in &probes {
        let node = nodes.iter().find(|n| name_of(n) == name_of(npp));
        if node.is_none_or(deleting) {
            m.delete(
                "delete the NodePodProbe of a gone node",
                Res::NodePodProbes,
                npp,
            )
            .await;
            continue;
        }
        let entries = npp["spec"]["podProbes"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let live: Vec<Value> = entries
            .iter()
            .filter(|e| live_pod(m, e).is_some())
            .cloned()
            .collect();
        if live.len() != entries.len() {
            let mut next = npp.clone();
            next["spec"]["podProbes"] = json!(live);
            m.replace("drop the probes of gone pods", Res::NodePodProbes, &next)
                .await;
        }
    }
    Wake::default()
}

/// The pod a NodePodProbe entry (spec or status) names, if it is that pod still and active.
fn live_pod(m: &Inner, entry: &Value) -> Option<Value> {
    let ns = entry["namespace"].as_str().unwrap_or("");
    let pod = m.get(Res::Pods, ns, entry["name"].as_str().unwrap_or(""))?;
    (pod_active(&pod) && pod["metadata"]["uid"] == entry["uid"]).then_some(pod)
}

/// The pods a marker probes (`getMatchingPods`, :435-477): its namespace and selector, active,
/// `Initialized=True`, on a node that exists and is not a virtual kubelet's.
fn matching_pods(m: &Inner, ppm: &Value) -> Vec<Value> {
    m.list(Res::Pods, Some(ns_of(ppm)))
        .into_iter()
        .filter(|p| matches_labels(&ppm["spec"]["selector"], &p["metadata"]["labels"]))
        .filter(pod_active)
        .filter(|p| condition(p, "Initialized").is_some_and(|c| c["status"] == "True"))
        .filter(|p| {
            let node = p["spec"]["nodeName"].as_str().unwrap_or("");
            !node.is_empty()
                && m.get(Res::Nodes, "", node)
                    .is_some_and(|n| label(&n, "type") != Some("virtual-kubelet"))
        })
        .collect()
}

/// A named port resolved from the container's ports (:378-413); `None` when it does not resolve.
fn resolve_port(probe: &Value, pod: &Value, container: &str) -> Option<Value> {
    let mut probe = probe.clone();
    for handler in ["tcpSocket", "httpGet"] {
        let Some(name) = probe[handler]["port"].as_str().map(String::from) else {
            continue;
        };
        if let Ok(n) = name.parse::<i64>() {
            probe[handler]["port"] = json!(n);
            continue;
        }
        let port = pod["spec"]["containers"]
            .as_array()?
            .iter()
            .find(|c| c["name"] == container)?["ports"]
            .as_array()?
            .iter()
            .find(|p| p["name"] == name.as_str())?["containerPort"]
            .clone();
        probe[handler]["port"] = port;
    }
    Some(probe)
}

/// Each marker into the NodePodProbes (`updateNodePodProbes`, :292-376), its finalizer, its
/// status; a deleted marker's probes removed (:221-237,479-519).
pub(crate) async fn reconcile_markers(m: &Inner) -> Wake {
    for ppm in m.list(Res::PodProbeMarkers, None) {
        let has = has_finalizer(&ppm, FINALIZER);
        let pods = matching_pods(m, &ppm);
        let nodes: BTreeSet<String> = pods
            .iter()
            .filter_map(|p| p["spec"]["nodeName"].as_str().map(String::from))
            .collect();
        if deleting(&ppm) {
            if has {
                remove_probes(m, &ppm, &nodes).await;
                let next = with_finalizer(&ppm, FINALIZER, false);
                m.replace("remove the marker's finalizer", Res::PodProbeMarkers, &next)
                    .await;
            }
            continue;
        }
        if !has {
            let next = with_finalizer(&ppm, FINALIZER, true);
            m.replace("add the marker's finalizer", Res::PodProbeMarkers, &next)
                .await;
            continue;
        }
        for node in &nodes {
            let on_node: Vec<&Value> = pods
                .iter()
                .filter(|p| p["spec"]["nodeName"] == node.as_str())
                .collect();
            write_probes(m, &ppm, node, &on_node).await;
        }
        // :200-217
        let status = json!({"observedGeneration": ppm["metadata"]["generation"],
                            "matchedPods": pods.len()});
        if ppm["status"] != status {
            let mut next = ppm.clone();
            next["status"] = status;
            m.replace_status("the marker's status", Res::PodProbeMarkers, &next)
                .await;
        }
    }
    Wake::default()
}

async fn write_probes(m: &Inner, ppm: &Value, node: &str, pods: &[&Value]) {
    // the manager never creates a NodePodProbe here: without one, skip silently
    let Some(npp) = m.get(Res::NodePodProbes, "", node) else {
        return;
    };
    let mut next = npp.clone();
    let entries = array_mut(&mut next["spec"]["podProbes"]);
    for pod in pods {
        let probes: Vec<Value> = ppm["spec"]["probes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| {
                let container = p["containerName"].as_str().unwrap_or("");
                let probe = resolve_port(&p["probe"], pod, container)?;
                Some(
                    json!({"name": format!("{}#{}", name_of(ppm), p["name"].as_str().unwrap_or("")),
                            "containerName": container, "probe": probe}),
                )
            })
            .collect();
        let found = entries.iter_mut().find(|e| {
            e["name"] == name_of(pod) && e["namespace"] == ns_of(pod) && e["uid"] == uid_of(pod)
        });
        match found {
            Some(e) => {
                if e["IP"].as_str().unwrap_or("").is_empty() {
                    e["IP"] = pod["status"]["podIP"].clone();
                }
                let list = array_mut(&mut e["probes"]);
                for p in probes {
                    match list.iter_mut().find(|x| x["name"] == p["name"]) {
                        Some(x) => *x = p,
                        None => list.push(p),
                    }
                }
            }
            None => entries.push(json!({"name": name_of(pod), "namespace": ns_of(pod),
                                        "uid": uid_of(pod), "IP": pod["status"]["podIP"],
                                        "probes": probes})),
        }
    }
    if next != npp {
        m.replace("the marker's probes", Res::NodePodProbes, &next)
            .await;
    }
}

async fn remove_probes(m: &Inner, ppm: &Value, nodes: &BTreeSet<String>) {
    let marker = format!("{}#", name_of(ppm));
    for node in nodes {
        let Some(npp) = m.get(Res::NodePodProbes, "", node) else {
            continue;
        };
        let mut next = npp.clone();
        if let Some(entries) = next["spec"]["podProbes"].as_array_mut() {
            for e in entries.iter_mut().filter(|e| e["namespace"] == ns_of(ppm)) {
                if let Some(p) = e["probes"].as_array_mut() {
                    p.retain(|p| !p["name"].as_str().unwrap_or("").contains(&marker));
                }
            }
            entries.retain(|e| e["probes"].as_array().is_some_and(|p| !p.is_empty()));
        }
        if next != npp {
            m.replace(
                "remove a deleted marker's probes",
                Res::NodePodProbes,
                &next,
            )
            .await;
        }
    }
}

/// NodePodProbe status onto the pods (:221-374): one `PUT pods/status` per pod with every
/// condition and label or annotation change.
pub(crate) async fn reconcile_statuses(m: &Inner) -> Wake {
    for npp in m.list(Res::NodePodProbes, None) {
        for entry in npp["status"]["podProbeStatuses"]
            .as_array()
            .into_iter()
            .flatten()
        {
            if let Some(pod) = live_pod(m, entry) {
                reflect(m, &pod, entry).await;
            }
        }
    }
    Wake::default()
}

async fn reflect(m: &Inner, pod: &Value, entry: &Value) {
    let mut conditions: Vec<Value> = Vec::new();
    let mut used = BTreeSet::new();
    // (labels or annotations, key) → Some(value) to set, None to delete; later probes win
    let mut changes: BTreeMap<(&str, String), Option<String>> = BTreeMap::new();
    for st in entry["probeStates"].as_array().into_iter().flatten() {
        let state = st["state"].as_str().unwrap_or("");
        if state.is_empty() {
            continue;
        }
        let full = st["name"].as_str().unwrap_or("");
        let Some((marker, probe_name)) = full.split_once('#') else {
            continue;
        };
        let Some(ppm) = m.get(Res::PodProbeMarkers, ns_of(pod), marker) else {
            continue;
        };
        if deleting(&ppm) {
            continue;
        }
        let Some(probe) = ppm["spec"]["probes"]
            .as_array()
            .and_then(|p| p.iter().find(|p| p["name"] == probe_name))
        else {
            continue;
        };
        if let Some(t) = probe["podConditionType"].as_str().filter(|t| !t.is_empty())
            && used.insert(t.to_string())
        {
            let mut c = json!({"type": t,
                    "status": if state == "Succeeded" { "True" } else { "False" },
                    "lastProbeTime": st["lastProbeTime"],
                    "lastTransitionTime": st["lastTransitionTime"]});
            if let Some(msg) = st["message"].as_str().filter(|s| !s.is_empty()) {
                c["message"] = json!(msg);
            }
            conditions.push(c);
        }
        let policies = probe["markerPolicy"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        // the other states' keys removed first, then this state's set
        for this in [false, true] {
            for p in policies.iter().filter(|p| (p["state"] == state) == this) {
                for field in ["labels", "annotations"] {
                    for (k, v) in p[field].as_object().into_iter().flatten() {
                        let v = v.as_str().filter(|_| this).map(String::from);
                        changes.insert((field, k.clone()), v);
                    }
                }
            }
        }
    }
    if conditions.is_empty() && changes.is_empty() {
        return;
    }
    let mut next = pod.clone();
    for c in conditions {
        set_if_msg_changed(&mut next, c);
    }
    for field in ["labels", "annotations"] {
        let map = &mut next["metadata"][field];
        if !map.is_object() {
            *map = json!({});
        }
        let map = map.as_object_mut().expect("an object");
        for ((_, k), v) in changes.iter().filter(|((f, _), _)| *f == field) {
            match v {
                Some(v) => {
                    map.insert(k.clone(), json!(v));
                }
                None => {
                    map.remove(k);
                }
            }
        }
    }
    if next != *pod {
        // metadata too, through the status subresource (kruise #1597)
        m.replace_status("probe results onto the pod", Res::Pods, &next)
            .await;
    }
}

/// `SetPodConditionIfMsgChanged` (pkg/util/pods.go:340-350): replaced when its status or
/// message differs, appended when missing, else left alone (times included).
fn set_if_msg_changed(pod: &mut Value, c: Value) {
    let now = condition(pod, c["type"].as_str().unwrap_or_default());
    if now.is_none_or(|x| x["status"] != c["status"] || x["message"] != c["message"]) {
        put_condition(pod, c);
    }
}
