//! `kruised explain <namespace>/<pod>`: per container, what the daemon sees and decides: spec
//! image against what runs, the kubelet hash recorded by the runtime against both formulas of
//! the spec, the expected, current and annotated env-from-metadata hashes, the in-place update
//! state, and whether a restart is due, blocked, or not needed, and why.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, ResourceExt};

use super::OutputFormat;
use crate::config::RuntimeArgs;
use crate::controller::containermeta::env::read_env;
use crate::controller::containermeta::{
    self,
    decide::{self, Observation, Step, Verdict},
};
use crate::controller::containers_of_pod;
use crate::cri::Runtimes;
use crate::hash::env::{current_env_hash, expected_env_hash};
use crate::hash::kubelet::{format_hash, hash_container, hash_container_legacy};
use crate::k8s::{client, keys};

/// Arguments of `kruised explain`.
#[derive(Debug, Args)]
pub struct ExplainArgs {
    /// The pod, as `namespace/name` (or `name` in the default namespace).
    pub pod: String,
    /// kubeconfig file; default: KUBECONFIG, then in-cluster, then ~/.kube/config.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// How to reach the container runtime.
    #[command(flatten)]
    pub runtime: RuntimeArgs,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t)]
    pub output: OutputFormat,
}

/// What the daemon sees and decides for one container.
#[derive(Clone, Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerView {
    /// Container name.
    pub name: String,
    /// Image in the pod spec.
    pub spec_image: String,
    /// Runtime container ID, if one runs.
    pub container_id: Option<String>,
    /// Image the runtime runs (image ID on containerd).
    pub running_image: Option<String>,
    /// Kubelet hash recorded on the running container.
    pub recorded_hash: Option<String>,
    /// Kubelet ≥ 1.31 hash of the spec.
    pub spec_hash: String,
    /// Kubelet ≤ 1.30 hash of the spec.
    pub spec_hash_legacy: String,
    /// Env-from-metadata hash the pod's labels and annotations give.
    pub expected_env_hash: u64,
    /// Env-from-metadata hash of the running container's env, if read.
    pub current_env_hash: Option<u64>,
    /// Env-from-metadata hash in the pod's annotation.
    pub annotated_env_hash: Option<u64>,
    /// The decision and its reason.
    pub decision: String,
}

/// What `kruised explain` prints.
#[derive(Clone, Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodView {
    /// `namespace/name`.
    pub pod: String,
    /// Whether kruise manages the pod.
    pub managed: bool,
    /// Whether `InPlaceUpdateReady` is False.
    pub in_place_update_pending: bool,
    /// The in-place update state annotation, as found (or the parse error).
    pub in_place_update_state: Option<String>,
    /// Per container.
    pub containers: Vec<ContainerView>,
}

fn step_text(step: &Step) -> String {
    match step {
        Step::Stop(reason)
        | Step::StopAt { reason, .. }
        | Step::Nothing(Verdict::Restart(reason)) => format!(
            "restart due ({}): env from metadata is stale",
            reason.as_str()
        ),
        Step::KubeletRecreates { .. } | Step::Nothing(Verdict::KubeletRecreates) => {
            "stale, but its spec changed too: the kubelet recreates it with the new env".into()
        }
        Step::Nothing(Verdict::UpToDate) => "up to date".into(),
        Step::Nothing(Verdict::Blocked(r)) => format!("stale, blocked: {r}"),
        Step::Nothing(Verdict::Unknown(r)) => format!("unknown: {r}"),
    }
}

/// Builds the view of `pod` from the runtime.
pub async fn explain_pod(pod: &Pod, runtimes: &Runtimes) -> PodView {
    let uid = pod.uid().unwrap_or_default();
    // the daemon's lookup; the node's primary runtime where it finds none (explain reports
    // what it can)
    let (runtime, runtime_name) = match runtimes.for_containers(decide::container_ids(pod)) {
        Ok((rt, name)) => (rt.clone(), name),
        Err(_) => (
            runtimes.primary().clone(),
            runtimes.primary_version().runtime_name.clone(),
        ),
    };
    let containers = containers_of_pod(&runtime, &uid).await.unwrap_or_default();
    let newest = decide::newest_by_name(&containers);
    let annotated = keys::parse_runtime_containers_meta(pod.annotations())
        .ok()
        .flatten();
    let state_raw = pod
        .annotations()
        .get(keys::INPLACE_UPDATE_STATE)
        .or_else(|| pod.annotations().get(keys::INPLACE_UPDATE_STATE_OLD))
        .cloned();
    let (labels, annotations) = decide::metadata_maps(pod);
    let (meta, _) = decide::build_meta(pod, &runtime_name, &newest, annotated.as_ref(), true);
    let mut views = Vec::new();
    for spec in pod.spec.iter().flat_map(|s| s.containers.iter()) {
        let running = newest.get(spec.name.as_str()).copied();
        let current = match running {
            Some(c) => read_env(&runtime, &c.id)
                .await
                .ok()
                .map(|(env, _)| current_env_hash(spec, |n| env.get(n).cloned())),
            None => None,
        };
        // the daemon's own plan, with nothing remembered (as a daemon that just started)
        let decision = match (running, meta.container(&spec.name)) {
            (Some(c), Some(m)) => {
                let mut m = m.clone();
                if let Some(h) = current {
                    m.hashes.extracted_env_from_metadata_hash = h;
                }
                let observed = Observation {
                    spec,
                    meta: &m,
                    running: c,
                    image_id_matches: containermeta::image_id_matches(&runtime, spec, c).await,
                    already_stopped: false,
                    previous_stop: None,
                    kubelet_expected_since: None,
                };
                let now = tokio::time::Instant::now();
                let plan = decide::plan_restarts(pod, &[observed], now, now);
                plan.steps.first().map_or_else(
                    || "no running container".into(),
                    |(_, step)| step_text(step),
                )
            }
            _ => "no running container".into(),
        };
        views.push(ContainerView {
            name: spec.name.clone(),
            spec_image: spec.image.clone().unwrap_or_default(),
            container_id: running.map(|c| format!("{runtime_name}://{}", c.id)),
            // the image ID, as `sha256:<hex>` on every runtime
            running_image: running.map(|c| {
                crate::cri::dialect::container_image_id(c).unwrap_or_else(|| c.image_ref.clone())
            }),
            recorded_hash: running
                .and_then(|c| c.annotations.get(keys::KUBELET_CONTAINER_HASH).cloned()),
            spec_hash: format_hash(hash_container(spec)),
            spec_hash_legacy: format_hash(hash_container_legacy(spec)),
            expected_env_hash: expected_env_hash(spec, &labels, &annotations),
            current_env_hash: current,
            annotated_env_hash: annotated
                .as_ref()
                .and_then(|a| a.container(&spec.name))
                .map(|m| m.hashes.extracted_env_from_metadata_hash),
            decision,
        });
    }
    PodView {
        pod: format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any()),
        managed: decide::is_managed(pod),
        in_place_update_pending: decide::in_place_update_pending(pod),
        in_place_update_state: state_raw,
        containers: views,
    }
}

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "-".to_string(), |v| v.to_string())
}

/// The view as text.
pub fn render(v: &PodView) -> String {
    let mut out = format!(
        "Pod: {}\nManaged by kruise: {}\nInPlaceUpdateReady=False: {}\nIn-place update state: {}\n",
        v.pod,
        v.managed,
        v.in_place_update_pending,
        v.in_place_update_state.as_deref().unwrap_or("-")
    );
    for c in &v.containers {
        out.push_str(&format!(
            "\nContainer {}\n  image:        spec {}  running {}\n  container:    {}\n  kubelet hash: recorded {}  spec >=1.31 {}  spec <=1.30 {}\n  env hash:     expected {}  current {}  annotated {}\n  decision:     {}\n",
            c.name,
            c.spec_image,
            opt(c.running_image.as_ref()),
            opt(c.container_id.as_ref()),
            opt(c.recorded_hash.as_ref()),
            c.spec_hash,
            c.spec_hash_legacy,
            c.expected_env_hash,
            opt(c.current_env_hash),
            opt(c.annotated_env_hash),
            c.decision
        ));
    }
    out
}

pub(crate) async fn run(args: ExplainArgs) -> anyhow::Result<ExitCode> {
    let (ns, name) = args
        .pod
        .split_once('/')
        .unwrap_or(("default", args.pod.as_str()));
    let client = client::build(&client::ClientSettings {
        kubeconfig: args.kubeconfig.clone(),
        qps: crate::config::DEFAULT_QPS,
        burst: crate::config::DEFAULT_BURST,
        versions: Default::default(),
    })
    .await?;
    let pod = Api::<Pod>::namespaced(client, ns)
        .get(name)
        .await
        .map_err(|e| anyhow::anyhow!("pod {ns}/{name}: {e}"))?;
    let rt = args.runtime.resolve()?;
    let runtimes = Runtimes::discover(&rt.source, rt.image_endpoint.clone(), rt.timeouts).await?;
    let view = explain_pod(&pod, &runtimes).await;
    match args.output {
        OutputFormat::Table => print!("{}", render(&view)),
        OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&view)?),
    }
    Ok(ExitCode::SUCCESS)
}
