//! `kruised explain <namespace>/<pod>`: per container, what the daemon sees and decides: spec
//! image against what runs, the kubelet hash recorded by the runtime against both formulas of
//! the spec, the expected, current and annotated env-from-metadata hashes, the in-place update
//! state, and whether a restart is due, blocked, or not needed, and why; and its last restarts
//! and why each happened ([`restarts`]): the stops kruised recorded on the pod
//! ([`crate::controller::provenance`]) matched to the restarts the kubelet counted, so that one
//! kruised did not make shows as such (a crash, an OOM kill, the kubelet).
//!
//! Then the pod's in-place update timelines ([`crate::controller::timeline`]): the running
//! daemon's, asked of its admin server on loopback (`--daemon-addr`); when no daemon answers,
//! it says so and shows what the runtime and the pod tell of the last update (read back: the
//! manager's update time, the old container's end and the new one's start, `Ready`).
//!
//! What it sees and decides is the daemon's: containermeta's observe step and plan
//! ([`containermeta::observe_as_started`], [`containermeta::plan`]), taken as a daemon that
//! just started takes them, so the two cannot disagree.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Args;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use super::output::OutputFormat;
use crate::config::RuntimeArgs;
use crate::controller::containermeta::{
    self,
    decide::{self, RestartStep, Verdict},
};
use crate::controller::containers::newest_by_name;
use crate::controller::provenance::{self, NOT_BY_KRUISED, Restart};
use crate::controller::timeline::view::{self, PodTimelines, StepView, TimelineView};
use crate::cri::{ContainerState, RemoteRuntime, RuntimeService, Runtimes};
use crate::hash::env::expected_env_hash;
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
    /// The running daemon's admin server (its `--addr`), asked on loopback for the pod's
    /// in-place update timelines.
    #[arg(long, default_value = "127.0.0.1:10221")]
    pub daemon_addr: std::net::SocketAddr,
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
    /// The kubelet's restart count.
    pub restart_count: u32,
    /// The last restarts, the newest first, and why each happened.
    pub restarts: Vec<RestartView>,
}

/// One restart of a container and why it happened.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RestartView {
    /// The kubelet's restart count this restart reached; `None` for a stop of kruised's whose
    /// restart the kubelet has not counted yet.
    pub restart: Option<u32>,
    /// The container stopped, as the kubelet writes its ID, where still known.
    pub stopped: Option<String>,
    /// Whether kruised stopped it (its record on the pod says so).
    pub by_kruised: bool,
    /// kruised's reason, or why it is not one of kruised's.
    pub reason: String,
    /// What kruised's reason concerns (the env that changed, the request).
    pub detail: Option<String>,
    /// When kruised stopped it.
    pub time: Option<String>,
    /// How the stopped container ended (exit code, the runtime's reason), where known.
    pub exit: Option<String>,
}

/// A container of one attempt, as explain knows it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Attempt {
    /// Its ID as the kubelet writes it (`containerd://<id>`).
    pub kubelet_id: String,
    /// How it ended, if it did and the runtime or the kubelet says.
    pub exit: Option<String>,
}

/// What a restart with no record is.
const NOT_RECORDED: &str = "unknown: the runtime no longer holds the stopped container";

/// The last restarts of a container (at most [`provenance::MAX_ENTRIES`], the newest first): the
/// restarts the kubelet counted (`restart_count`; restart `k` replaced the container of attempt
/// `k - 1`, which the runtime may still hold in `attempts`, and the kubelet's `last_terminated` is
/// the last one's), each matched to kruised's record of the stop (`records`, this container's);
/// and a stop of kruised's whose restart the kubelet has not counted yet.
pub fn restarts(
    restart_count: u32,
    attempts: &BTreeMap<u32, Attempt>,
    last_terminated: Option<&Attempt>,
    records: &[Restart],
) -> Vec<RestartView> {
    let record_of = |id: &str| {
        let raw = id.split_once("://").map_or(id, |(_, raw)| raw);
        records.iter().rev().find(|r| r.runtime_id() == raw)
    };
    let view = |restart: Option<u32>, stopped: Option<&Attempt>| {
        let record = stopped.and_then(|a| record_of(&a.kubelet_id));
        let nonempty = |s: &str| (!s.is_empty()).then(|| s.to_string());
        RestartView {
            restart,
            stopped: stopped.map(|a| a.kubelet_id.clone()),
            by_kruised: record.is_some(),
            reason: match (record, stopped) {
                (Some(r), _) => r.reason.clone(),
                (None, Some(_)) => NOT_BY_KRUISED.to_string(),
                (None, None) => NOT_RECORDED.to_string(),
            },
            detail: record.and_then(|r| nonempty(&r.detail)),
            time: record.and_then(|r| nonempty(&r.time)),
            exit: stopped.and_then(|a| a.exit.clone()),
        }
    };
    let mut out = Vec::new();
    // a stop of the current container the kubelet has not followed with a restart yet
    if let Some(current) = attempts.get(&restart_count)
        && record_of(&current.kubelet_id).is_some()
    {
        out.push(view(None, Some(current)));
    }
    let shown = u32::try_from(provenance::MAX_ENTRIES).unwrap_or(u32::MAX);
    for k in (restart_count.saturating_sub(shown - 1).max(1)..=restart_count).rev() {
        let stopped = attempts
            .get(&(k - 1))
            .or(last_terminated.filter(|_| k == restart_count));
        out.push(view(Some(k), stopped));
    }
    out.truncate(provenance::MAX_ENTRIES);
    out
}

/// The containers of `name` in `containers` by attempt, with how the ended ones ended (asked of
/// the runtime for the attempts [`restarts`] can show).
async fn attempts_of(
    runtime: &RemoteRuntime,
    runtime_name: &str,
    containers: &[crate::cri::Container],
    name: &str,
    restart_count: u32,
) -> BTreeMap<u32, Attempt> {
    let shown = u32::try_from(provenance::MAX_ENTRIES).unwrap_or(u32::MAX);
    let mut out = BTreeMap::new();
    for c in containers.iter().filter(|c| c.metadata.name == name) {
        let exit = if c.state == ContainerState::Exited
            && c.metadata.attempt.saturating_add(shown) >= restart_count
        {
            runtime
                .container_status(&c.id, false)
                .await
                .ok()
                .map(|s| exit_text(s.exit_code, &s.reason))
        } else {
            None
        };
        out.insert(
            c.metadata.attempt,
            Attempt {
                kubelet_id: format!("{runtime_name}://{}", c.id),
                exit,
            },
        );
    }
    out
}

fn exit_text(code: i32, reason: &str) -> String {
    if reason.is_empty() {
        format!("exit code {code}")
    } else {
        format!("exit code {code} ({})", bounded_reason(reason))
    }
}

/// A reason written by the runtime or the kubelet, fit for one line.
fn bounded_reason(reason: &str) -> String {
    crate::controller::text::bounded_text(reason.as_bytes(), 64)
}

/// The kubelet's count and last termination of container `name`.
fn kubelet_view(pod: &Pod, name: &str) -> (u32, Option<Attempt>) {
    let Some(status) = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|s| s.iter().find(|c| c.name == name))
    else {
        return (0, None);
    };
    let last = status
        .last_state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .and_then(|t| {
            Some(Attempt {
                kubelet_id: t.container_id.clone().filter(|id| !id.is_empty())?,
                exit: Some(exit_text(
                    t.exit_code,
                    t.reason.as_deref().unwrap_or_default(),
                )),
            })
        });
    (u32::try_from(status.restart_count).unwrap_or(0), last)
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
    /// The in-place update timelines: the daemon's, or read back from the runtime and the pod.
    pub in_place_updates: Option<PodTimelines>,
}

fn step_text(step: &RestartStep) -> String {
    match step {
        RestartStep::Stop(reason)
        | RestartStep::StopAt { reason, .. }
        | RestartStep::Nothing(Verdict::Restart(reason)) => format!(
            "restart due ({}): env from metadata is stale",
            reason.as_str()
        ),
        RestartStep::KubeletRecreates { .. } | RestartStep::Nothing(Verdict::KubeletRecreates) => {
            "stale, but its spec changed too: the kubelet recreates it with the new env".into()
        }
        RestartStep::Nothing(Verdict::UpToDate) => "up to date".into(),
        RestartStep::Nothing(Verdict::Blocked(r)) => format!("stale, blocked: {r}"),
        RestartStep::Nothing(Verdict::Unknown(r)) => format!("unknown: {r}"),
    }
}

/// Builds the view of `pod` from the runtime: the daemon's own observation and plan, as a
/// daemon that just started (nothing remembered), so explain and the daemon cannot disagree.
pub async fn explain_pod(pod: &Pod, runtimes: &Runtimes) -> PodView {
    // the daemon's lookup; the node's primary runtime where it finds none (explain reports
    // what it can)
    let (runtime, runtime_name) = match runtimes.for_containers(decide::container_ids(pod)) {
        Ok((rt, name)) => (rt.clone(), name),
        Err(_) => (
            runtimes.primary().clone(),
            runtimes.primary_version().runtime_name.clone(),
        ),
    };
    let seen = containermeta::observe_as_started(
        Arc::new(pod.clone()),
        runtime.clone(),
        runtime_name.clone(),
    )
    .await
    .ok();
    let planned = seen.as_ref().map(containermeta::plan);
    let containers = seen.as_ref().map_or(&[][..], |s| s.containers.as_slice());
    let newest = newest_by_name(containers);
    let annotated = keys::parse_runtime_containers_meta(pod.annotations())
        .ok()
        .flatten();
    let state_raw = pod
        .annotations()
        .get(keys::INPLACE_UPDATE_STATE)
        .or_else(|| pod.annotations().get(keys::INPLACE_UPDATE_STATE_OLD))
        .cloned();
    let (labels, annotations) = decide::metadata_maps(pod);
    let records = provenance::of_pod(pod.annotations());
    let mut views = Vec::new();
    for spec in pod.spec.iter().flat_map(|s| s.containers.iter()) {
        let running = newest.get(spec.name.as_str()).copied();
        // the env hash the daemon's observation holds for the running container: read from
        // it, or kept from the annotation while it names the same container
        let current = seen
            .as_ref()
            .filter(|_| running.is_some())
            .filter(|s| {
                s.env_error
                    .as_ref()
                    .is_none_or(|(name, _)| *name != spec.name)
            })
            .and_then(|s| s.meta.container(&spec.name))
            .map(|m| m.hashes.extracted_env_from_metadata_hash)
            .filter(|h| *h != 0);
        let decision = planned
            .as_ref()
            .and_then(|p| p.restarts.steps.iter().find(|(name, _)| *name == spec.name))
            .map_or_else(
                || "no running container".into(),
                |(_, step)| step_text(step),
            );
        let (restart_count, last_terminated) = kubelet_view(pod, &spec.name);
        let attempts = attempts_of(
            &runtime,
            &runtime_name,
            containers,
            &spec.name,
            restart_count,
        )
        .await;
        let own: Vec<Restart> = records
            .iter()
            .filter(|r| r.container == spec.name)
            .cloned()
            .collect();
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
            restart_count,
            restarts: restarts(restart_count, &attempts, last_terminated.as_ref(), &own),
        });
    }
    PodView {
        pod: format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any()),
        managed: decide::is_managed(pod),
        in_place_update_pending: decide::in_place_update_pending(pod),
        in_place_update_state: state_raw,
        containers: views,
        in_place_updates: None,
    }
}

// === in-place update timelines ===

/// How long explain waits for the daemon's answer.
const DAEMON_WAIT: std::time::Duration = std::time::Duration::from_secs(3);
/// The largest answer taken from it (two timelines are a few KiB).
const DAEMON_ANSWER_LIMIT: u64 = 1024 * 1024;

/// Why the daemon gave no timelines.
#[derive(Debug, thiserror::Error)]
enum DaemonError {
    #[error("no daemon answered at {addr}: {error}")]
    Unreachable {
        addr: std::net::SocketAddr,
        error: String,
    },
    #[error("the daemon at {addr} answered {status}: {body}")]
    Refused {
        addr: std::net::SocketAddr,
        status: u16,
        body: String,
    },
}

/// A plain HTTP/1.1 GET of `path` on `addr`: the status and the body.
async fn http_get(addr: std::net::SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut raw = Vec::new();
    (&mut stream)
        .take(DAEMON_ANSWER_LIMIT)
        .read_to_end(&mut raw)
        .await?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other("not an HTTP answer"))?;
    Ok((status, body.to_string()))
}

/// The daemon's timelines of pod `namespace/name`: `Ok(None)` when it knows no update of it.
async fn daemon_timelines(
    addr: std::net::SocketAddr,
    namespace: &str,
    name: &str,
) -> Result<Option<PodTimelines>, DaemonError> {
    let path = format!("/debug/inplace-updates/{namespace}/{name}");
    let unreachable = |error: String| DaemonError::Unreachable { addr, error };
    let (status, body) = tokio::time::timeout(DAEMON_WAIT, http_get(addr, &path))
        .await
        .map_err(|_| unreachable(format!("no answer within {DAEMON_WAIT:?}")))?
        .map_err(|e| unreachable(e.to_string()))?;
    match status {
        200 => serde_json::from_str(&body)
            .map(Some)
            .map_err(|e| DaemonError::Refused {
                addr,
                status,
                body: format!("not a timeline: {e}"),
            }),
        404 if body.starts_with("no in-place update timeline") => Ok(None),
        _ => Err(DaemonError::Refused {
            addr,
            status,
            body: crate::controller::text::bounded_text(body.trim().as_bytes(), 200),
        }),
    }
}

/// The pod's last in-place update as the runtime and the pod tell it, without the daemon:
/// from the manager's update time (the state annotation, to the second) to `Ready` again,
/// with the end of the old container and the start of the new one of each container the
/// runtime recreated since.
pub async fn read_back(
    pod: &Pod,
    runtime: &RemoteRuntime,
    containers: &[crate::cri::Container],
) -> Option<TimelineView> {
    let state = keys::parse_inplace_update_state(pod.annotations())
        .ok()
        .flatten()?;
    let updated = state.update_timestamp?.0;
    let seen_at = i64::try_from(updated.as_nanosecond()).ok()?;
    let mut changed = Vec::new();
    let (mut stopped, mut started, mut created) = (Vec::new(), Vec::new(), Vec::new());
    for spec in pod.spec.iter().flat_map(|s| s.containers.iter()) {
        let mut of_name: Vec<&crate::cri::Container> = containers
            .iter()
            .filter(|c| c.metadata.name == spec.name)
            .collect();
        of_name.sort_by_key(|c| std::cmp::Reverse((c.metadata.attempt, c.created_at)));
        let (Some(new), Some(old)) = (of_name.first(), of_name.get(1)) else {
            continue;
        };
        if new.created_at < seen_at {
            continue;
        }
        let new_status = runtime.container_status(&new.id, false).await.ok();
        let old_status = runtime.container_status(&old.id, false).await.ok();
        stopped.push(old_status.map(|s| s.finished_at).filter(|t| *t > 0));
        started.push(new_status.map(|s| s.started_at).filter(|t| *t > 0));
        created.push(Some(new.created_at));
        changed.push(view::ContainerView {
            name: spec.name.clone(),
            image: spec.image.clone().unwrap_or_default(),
            old_container: Some(old.id.clone()),
            new_container: Some(new.id.clone()),
        });
    }
    // every container's, the last
    let last = |times: &[Option<i64>]| -> Option<i64> {
        if times.is_empty() {
            return None;
        }
        times
            .iter()
            .try_fold(i64::MIN, |acc, t| Some(acc.max((*t)?)))
    };
    let ready = pod
        .status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .find(|c| c.type_ == "Ready" && c.status == "True")
        .and_then(|c| c.last_transition_time.as_ref())
        .and_then(|t| i64::try_from(t.0.as_nanosecond()).ok())
        .filter(|t| *t >= seen_at)
        // to the second: not before the start it follows
        .map(|t| last(&started).map_or(t, |s| t.max(s)));
    let after = |t: Option<i64>| {
        t.map(|t| {
            let d = std::time::Duration::from_nanos(u64::try_from(t - seen_at).unwrap_or(0));
            (d.as_secs_f64() * 1000.0).round() / 1000.0
        })
    };
    let step = |name: &str, t: Option<i64>, source: Option<&str>| StepView {
        step: name.to_string(),
        at: t.map(view::rfc3339),
        after_seconds: after(t),
        source: t.and(source).map(str::to_string),
    };
    let steps = vec![
        step(
            "image_present",
            last(&created),
            Some("new container created: at the latest"),
        ),
        step("container_stopped", last(&stopped), None),
        step("container_started", last(&started), None),
        step(
            "ready",
            ready,
            Some("the kubelet's Ready, to the second, not before the start"),
        ),
    ];
    Some(TimelineView {
        state: "read back".to_string(),
        seen_by: "the manager's update time (to the second)".to_string(),
        seen_at: view::rfc3339(seen_at),
        joined_late: false,
        containers: changed,
        steps,
        unready_seconds: after(ready),
    })
}

/// The timelines explain shows: the daemon's; else, saying why, what it reads back.
async fn timelines_of(addr: std::net::SocketAddr, pod: &Pod, runtimes: &Runtimes) -> PodTimelines {
    let (namespace, name) = (pod.namespace().unwrap_or_default(), pod.name_any());
    let id = format!("{namespace}/{name}");
    match daemon_timelines(addr, &namespace, &name).await {
        Ok(Some(mut t)) => {
            t.source = format!("from the daemon at {addr}");
            t
        }
        Ok(None) => PodTimelines {
            pod: id,
            source: format!("the daemon at {addr} has seen no in-place update of this pod"),
            updates: Vec::new(),
        },
        Err(e) => {
            let (runtime, _) = match runtimes.for_containers(decide::container_ids(pod)) {
                Ok((rt, name)) => (rt.clone(), name),
                Err(_) => (
                    runtimes.primary().clone(),
                    runtimes.primary_version().runtime_name.clone(),
                ),
            };
            let uid = pod.uid().unwrap_or_default();
            let containers = crate::controller::containers::containers_of_pod(&runtime, &uid)
                .await
                .unwrap_or_default();
            PodTimelines {
                pod: id,
                source: format!("{e}; read back from the runtime and the pod"),
                updates: read_back(pod, &runtime, &containers)
                    .await
                    .into_iter()
                    .collect(),
            }
        }
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
        out.push_str(&format!(
            "  restarts:     {} (the kubelet's count)\n",
            c.restart_count
        ));
        for r in &c.restarts {
            out.push_str(&format!("    {}\n", restart_line(r)));
        }
    }
    if let Some(t) = &v.in_place_updates {
        out.push_str(&view::render(t));
    }
    out
}

/// One restart as a line: `#2  env-from-metadata: ROLE (annotation role), at <time>;
/// containerd://abc, exit code 137`.
fn restart_line(r: &RestartView) -> String {
    let number = r
        .restart
        .map_or_else(|| "next".to_string(), |n| format!("#{n}"));
    let mut line = format!("{number:<5} ");
    if r.by_kruised {
        line.push_str(&format!("stopped by kruised: {}", r.reason));
    } else {
        line.push_str(&r.reason);
    }
    if let Some(d) = &r.detail {
        line.push_str(&format!(" ({d})"));
    }
    if let Some(t) = &r.time {
        line.push_str(&format!(" at {t}"));
    }
    if r.restart.is_none() {
        line.push_str("; the kubelet has not counted the restart yet");
    }
    if let Some(id) = &r.stopped {
        line.push_str(&format!("; {id}"));
    }
    if let Some(e) = &r.exit {
        line.push_str(&format!(", {e}"));
    }
    line
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
    let pod = crate::k8s::pods::Pods::namespaced(client, ns)
        .get(name)
        .await
        .map_err(|e| anyhow::anyhow!("pod {ns}/{name}: {e}"))?;
    let rt = args.runtime.resolve()?;
    let runtimes = rt.discover().await?;
    let mut view = explain_pod(&pod, &runtimes).await;
    view.in_place_updates = Some(timelines_of(args.daemon_addr, &pod, &runtimes).await);
    match args.output {
        OutputFormat::Table => print!("{}", render(&view)),
        OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&view)?),
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(id: &str, exit: Option<&str>) -> Attempt {
        Attempt {
            kubelet_id: format!("containerd://{id}"),
            exit: exit.map(str::to_string),
        }
    }

    fn record(id: &str, reason: &str, detail: &str) -> Restart {
        Restart {
            container: "main".into(),
            container_id: format!("containerd://{id}"),
            reason: reason.into(),
            detail: detail.into(),
            time: "2026-01-01T00:00:00Z".into(),
        }
    }

    #[test]
    fn each_restart_the_kubelet_counted_is_matched_to_kruiseds_record_or_called_not_kruiseds() {
        // kruise #910, #1044: in-place restarts, recreate requests and crashes look alike
        // afterwards; the record on the pod tells kruised's stops from the rest
        let attempts: BTreeMap<u32, Attempt> = [
            (0, attempt("a0", Some("exit code 137"))),
            (1, attempt("a1", Some("exit code 1 (Error)"))),
            (2, attempt("a2", Some("exit code 137"))),
            (3, attempt("a3", None)),
        ]
        .into();
        let records = [
            record("a0", "env-from-metadata", "ROLE (annotation role)"),
            record("a2", RECREATE, "crr-1"),
        ];
        let got = restarts(3, &attempts, None, &records);
        let summary: Vec<(Option<u32>, bool, &str)> = got
            .iter()
            .map(|r| (r.restart, r.by_kruised, r.reason.as_str()))
            .collect();
        assert_eq!(
            summary,
            [
                (Some(3), true, RECREATE),
                (Some(2), false, NOT_BY_KRUISED),
                (Some(1), true, "env-from-metadata"),
            ]
        );
        assert_eq!(got[0].detail.as_deref(), Some("crr-1"));
        assert_eq!(got[1].exit.as_deref(), Some("exit code 1 (Error)"));
        assert_eq!(got[1].stopped.as_deref(), Some("containerd://a1"));
        assert_eq!(got[2].detail.as_deref(), Some("ROLE (annotation role)"));
    }

    const RECREATE: &str = provenance::RECREATE_REQUEST;

    #[test]
    fn the_kubelets_last_termination_stands_in_for_a_container_the_runtime_removed() {
        // the kubelet keeps one dead container per container (its GC) and reports the last one
        // in lastState.terminated
        let attempts: BTreeMap<u32, Attempt> = [(7, attempt("a7", None))].into();
        let last = attempt("a6", Some("exit code 137 (OOMKilled)"));
        let got = restarts(7, &attempts, Some(&last), &[]);
        assert_eq!(got.len(), provenance::MAX_ENTRIES, "the last five only");
        assert_eq!(got[0].restart, Some(7));
        assert_eq!(got[0].reason, NOT_BY_KRUISED);
        assert_eq!(got[0].exit.as_deref(), Some("exit code 137 (OOMKilled)"));
        assert_eq!(got[1].restart, Some(6));
        assert_eq!(got[1].stopped, None);
        assert_eq!(got[1].reason, NOT_RECORDED);
        assert_eq!(got[4].restart, Some(3));
        assert!(
            restarts(0, &attempts, None, &[]).is_empty(),
            "never restarted"
        );
    }

    #[test]
    fn a_stop_the_kubelet_has_not_counted_yet_comes_first() {
        let attempts: BTreeMap<u32, Attempt> = [
            (0, attempt("a0", Some("exit code 0"))),
            (1, attempt("a1", Some("exit code 137"))),
        ]
        .into();
        let got = restarts(1, &attempts, None, &[record("a1", "stale-recreation", "")]);
        assert_eq!(got[0].restart, None);
        assert!(got[0].by_kruised);
        assert_eq!(got[0].detail, None, "an empty detail is none");
        assert_eq!(got[1].restart, Some(1));
        assert_eq!(got[1].reason, NOT_BY_KRUISED);
        assert!(restart_line(&got[0]).contains("not counted the restart yet"));
    }

    #[test]
    fn a_record_that_names_no_container_of_the_pod_explains_nothing() {
        // the pod's author can write the annotation: a record is shown only where it names
        // the very container the kubelet restarted
        let attempts: BTreeMap<u32, Attempt> = [(0, attempt("a0", Some("exit code 1")))].into();
        let forged = [record("someone-elses", RECREATE, "forged")];
        let got = restarts(1, &attempts, None, &forged);
        assert_eq!(got.len(), 1);
        assert!(!got[0].by_kruised);
        assert_eq!(got[0].reason, NOT_BY_KRUISED);
    }

    #[test]
    fn a_restart_line_says_who_why_when_and_how_it_ended() {
        let line = restart_line(&RestartView {
            restart: Some(2),
            stopped: Some("containerd://abc".into()),
            by_kruised: true,
            reason: "env-from-metadata".into(),
            detail: Some("ROLE (annotation role)".into()),
            time: Some("2026-01-01T00:00:00Z".into()),
            exit: Some("exit code 137".into()),
        });
        assert_eq!(
            line,
            "#2    stopped by kruised: env-from-metadata (ROLE (annotation role)) at \
             2026-01-01T00:00:00Z; containerd://abc, exit code 137"
        );
    }
}
