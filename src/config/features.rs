//! kruise's feature gates (`--feature-gates`, the syntax and names kruise's chart passes to
//! manager and daemon alike), reduced to what changes what the daemon does.

use super::{ConfigError, parse_go_bool};

/// kruise's feature gates that change what the daemon does, with kruise's defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FeatureGates {
    /// Watch the node's pods: container meta and env-from-metadata restarts.
    pub daemon_watching_pod: bool,
    /// Restart containers whose env-from-metadata changed (needs DaemonWatchingPod).
    pub in_place_update_env_from_metadata: bool,
    /// Run NodePodProbe probes.
    pub pod_probe_marker: bool,
    /// Pre-pull the images of later in-place batches (kruised's own; not in kruise).
    pub prepull_next_batch: bool,
    /// Pull an in-place update's new images as soon as the node can know them: the manager's
    /// grace annotation, the pod spec's image change (kruised's own; not in kruise).
    pub prepull_in_place_update: bool,
}

impl Default for FeatureGates {
    fn default() -> Self {
        FeatureGates {
            daemon_watching_pod: true,
            in_place_update_env_from_metadata: true,
            pod_probe_marker: true,
            prepull_next_batch: true,
            prepull_in_place_update: true,
        }
    }
}

/// Every gate kruise defines (`pkg/features/kruise_features.go`). The chart passes one
/// `--feature-gates` value to manager and daemon, so the manager's gates must be accepted too;
/// those do nothing here.
const KRUISE_GATES: &[&str] = &[
    "KruiseDaemon",
    "PodWebhook",
    "CloneSetShortHash",
    "KruisePodReadinessGate",
    "PreDownloadImageForInPlaceUpdate",
    "CloneSetPartitionRollback",
    "ResourcesDeletionProtection",
    "PodUnavailableBudgetDeleteGate",
    "PodUnavailableBudgetUpdateGate",
    "WorkloadSpread",
    "DaemonWatchingPod",
    "TemplateNoDefaults",
    "InPlaceUpdateEnvFromMetadata",
    "StatefulSetAutoDeletePVC",
    "SidecarSetPatchPodMetadataDefaultsAllowed",
    "SidecarTerminator",
    "PodProbeMarkerGate",
    "PreDownloadImageForDaemonSetUpdate",
    "CloneSetEventHandlerOptimization",
    "PreparingUpdateAsUpdate",
    "ImagePullJobGate",
    "ResourceDistributionGate",
    "DeletionProtectionForCRDCascadingGate",
    "EnhancedLivenessProbe",
    "RecreatePodWhenChangeVCTInCloneSetGate",
    "StatefulSetStartOrdinal",
    "PodIndexLabel",
    "EnableExternalCerts",
    "StatefulSetAutoResizePVCGate",
    "InPlaceWorkloadVerticalScaling",
    "EnablePodProbeMarkerOnServerless",
    "EnableSortSidecarContainerByName",
    "InPlacePodVerticalScaling",
    "ForceDeleteTimeoutExpectationGate",
    "DefaultHostNetworkHostPortsInPodTemplates",
    "DaemonSetPruneIneligibleNodes",
    "AllAlpha",
    "AllBeta",
];

/// kruised's own gate for pre-pulling the next in-place batch.
const PREPULL_NEXT_BATCH: &str = "PrePullNextBatch";
/// kruised's own gate for pulling an in-place update's images off its critical path.
const PREPULL_IN_PLACE_UPDATE: &str = "PrePullInPlaceUpdate";

impl FeatureGates {
    /// Parses `A=true,B=false`. Unknown names and values that are not booleans are refused.
    /// `KruiseDaemon=false` turns every daemon capability off, as it does in kruise.
    pub fn parse(s: &str) -> Result<Self, ConfigError> {
        let mut g = FeatureGates::default();
        let mut daemon = true;
        // component-base: AllBeta=<v> sets every beta gate not set explicitly (the daemon's
        // gates are all beta in kruise); AllAlpha touches none of them
        let mut all_beta = None;
        let mut explicit = std::collections::HashSet::new();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let invalid = |reason: String| ConfigError::Invalid {
                setting: format!("--feature-gates {item}"),
                reason,
            };
            let (name, value) = item
                .split_once('=')
                .ok_or_else(|| invalid("missing bool value: expected NAME=true|false".into()))?;
            let (name, value) = (name.trim(), value.trim());
            let on = parse_go_bool(value).map_err(invalid)?;
            explicit.insert(name.to_string());
            match name {
                "DaemonWatchingPod" => g.daemon_watching_pod = on,
                "InPlaceUpdateEnvFromMetadata" => g.in_place_update_env_from_metadata = on,
                "PodProbeMarkerGate" => g.pod_probe_marker = on,
                "KruiseDaemon" => daemon = on,
                "AllBeta" => all_beta = Some(on),
                PREPULL_NEXT_BATCH => g.prepull_next_batch = on,
                PREPULL_IN_PLACE_UPDATE => g.prepull_in_place_update = on,
                n if KRUISE_GATES.contains(&n) => {}
                _ => return Err(invalid(format!("unrecognized feature gate: {name}"))),
            }
        }
        if let Some(on) = all_beta {
            let unset = |n: &str| !explicit.contains(n);
            if unset("DaemonWatchingPod") {
                g.daemon_watching_pod = on;
            }
            if unset("InPlaceUpdateEnvFromMetadata") {
                g.in_place_update_env_from_metadata = on;
            }
            if unset("PodProbeMarkerGate") {
                g.pod_probe_marker = on;
            }
            if unset("KruiseDaemon") {
                daemon = on;
            }
        }
        if !daemon {
            g.daemon_watching_pod = false;
            g.in_place_update_env_from_metadata = false;
            g.pod_probe_marker = false;
            g.prepull_next_batch = false;
            g.prepull_in_place_update = false;
        }
        if !g.daemon_watching_pod {
            // all three need the pod watch
            g.in_place_update_env_from_metadata = false;
            g.prepull_next_batch = false;
            g.prepull_in_place_update = false;
        }
        Ok(g)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn feature_gates_follow_kruise_names_and_defaults() {
        assert_eq!(FeatureGates::parse("").unwrap(), FeatureGates::default());
        let g = FeatureGates::parse("DaemonWatchingPod=false, PodProbeMarkerGate=true").unwrap();
        assert!(!g.daemon_watching_pod && !g.in_place_update_env_from_metadata);
        assert!(g.pod_probe_marker);
        // the manager's gates arrive in the same flag from the chart: accepted, no effect
        assert_eq!(
            FeatureGates::parse("ImagePullJobGate=true,AllAlpha=false").unwrap(),
            FeatureGates::default()
        );
        let off = FeatureGates::parse("KruiseDaemon=false").unwrap();
        assert!(!off.daemon_watching_pod && !off.pod_probe_marker);
    }

    #[test]
    fn the_in_place_update_pull_is_on_by_default_and_needs_the_pod_watch() {
        assert!(FeatureGates::default().prepull_in_place_update);
        let off = FeatureGates::parse("PrePullInPlaceUpdate=false").unwrap();
        assert!(!off.prepull_in_place_update && off.prepull_next_batch);
        let no_watch = FeatureGates::parse("DaemonWatchingPod=false").unwrap();
        assert!(!no_watch.prepull_in_place_update);
    }

    #[test]
    fn unknown_feature_gates_and_bad_values_are_refused_by_name() {
        let err = FeatureGates::parse("NoSuchGate=true")
            .unwrap_err()
            .to_string();
        assert!(err.contains("NoSuchGate"), "{err}");
        let err = FeatureGates::parse("DaemonWatchingPod=yes")
            .unwrap_err()
            .to_string();
        assert!(err.contains("DaemonWatchingPod=yes"), "{err}");
        assert!(FeatureGates::parse("DaemonWatchingPod").is_err());
    }

    #[test]
    fn gate_values_parse_like_go_strconv_parse_bool() {
        for v in ["1", "t", "T", "TRUE", "true", "True"] {
            let g =
                FeatureGates::parse(&format!("PodProbeMarkerGate=false,PodProbeMarkerGate={v}"));
            assert!(g.unwrap().pod_probe_marker, "{v}");
        }
        for v in ["0", "f", "F", "FALSE", "false", "False"] {
            let g = FeatureGates::parse(&format!("PodProbeMarkerGate={v}"));
            assert!(!g.unwrap().pod_probe_marker, "{v}");
        }
        for v in ["yes", "tRuE", "2", ""] {
            assert!(
                FeatureGates::parse(&format!("PodProbeMarkerGate={v}")).is_err(),
                "{v:?} is no Go boolean"
            );
        }
    }

    #[test]
    fn every_gate_kruise_defines_at_1_9_and_head_is_accepted() {
        // the manager's gates arrive in the same flag (kruise's chart passes one value to both)
        let all = KRUISE_GATES
            .iter()
            .map(|g| format!("{g}=true"))
            .collect::<Vec<_>>()
            .join(",");
        assert!(FeatureGates::parse(&all).is_ok());
        for g in [
            "ImagePullJobGate",
            "ForceDeleteTimeoutExpectationGate",
            "DefaultHostNetworkHostPortsInPodTemplates",
            "DaemonSetPruneIneligibleNodes",
            "EnablePodProbeMarkerOnServerless",
        ] {
            assert!(KRUISE_GATES.contains(&g), "{g}");
        }
        let chart =
            FeatureGates::parse("ImagePullJobGate=true,ForceDeleteTimeoutExpectationGate=true")
                .unwrap();
        assert_eq!(chart, FeatureGates::default());
    }

    #[test]
    fn all_beta_false_turns_the_daemon_gates_off_unless_set_explicitly() {
        let g = FeatureGates::parse("AllBeta=false").unwrap();
        assert!(
            !g.daemon_watching_pod && !g.pod_probe_marker && !g.in_place_update_env_from_metadata
        );
        let g =
            FeatureGates::parse("AllBeta=false,KruiseDaemon=true,PodProbeMarkerGate=true").unwrap();
        assert!(g.pod_probe_marker && !g.daemon_watching_pod);
        // as in kruise, KruiseDaemon=false (here through AllBeta) overrides everything
        let g = FeatureGates::parse("AllBeta=false,PodProbeMarkerGate=true").unwrap();
        assert!(!g.pod_probe_marker);
        assert_eq!(
            FeatureGates::parse("AllAlpha=true").unwrap(),
            FeatureGates::default()
        );
    }
}
