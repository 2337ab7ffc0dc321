//! The probe tasks: one per (pod, probe, container), started, updated in place or stopped as
//! the spec changes ([`sync_workers`]), each running its probe on its period ([`probe_task`]):
//! observe the container, decide whether the probe runs and what its outcome makes of the
//! result, run it, keep the result.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::apply::set_result;
use super::controller::ProbeController;
use super::decide::{self, Age, Due, ProbeKey, ProbeSpec, TaskKey, Thresholds};
use super::observe;
use super::prober::{self, Handler, Outcome};
use crate::controller::target::PodIps;
use crate::cri::{ContainerState, RemoteRuntime};
use crate::k8s::crd::ProbeState;
use crate::k8s::time::now_seconds;

struct Worker {
    spec: watch::Sender<ProbeSpec>,
    cancel: CancellationToken,
}

/// The probe tasks follow the spec; the container listing runs while there are probes.
pub async fn sync_workers(shared: Arc<ProbeController>, runtime: RemoteRuntime) {
    let mut generation = shared.probes.generation();
    let mut workers: HashMap<TaskKey, Worker> = HashMap::new();
    let mut refresher: Option<CancellationToken> = None;
    // the probes over a cap now, and the last time that was logged (with how many)
    let mut refused: BTreeSet<ProbeKey> = BTreeSet::new();
    let mut logged: Option<(Instant, usize)> = None;
    loop {
        let npp = observe::node_probes(&shared);
        let capped = decide::cap(
            decide::wanted(npp.as_deref()),
            decide::PROBES_PER_POD,
            decide::PROBES_PER_NODE,
        );
        let wanted = capped.run;
        // stop what left the spec and forget its result
        workers.retain(|key, w| {
            if wanted.contains_key(key) {
                return true;
            }
            w.cancel.cancel();
            shared.memory.forget(&(key.0.clone(), key.1.clone()));
            false
        });
        // a probe refused before and not now (gone, or within the caps again) forgets why; one
        // over a cap says so in the status (Unknown: it never ran), never silently dropped
        for key in refused.difference(&capped.refused.keys().cloned().collect()) {
            shared.memory.forget(key);
        }
        let now = now_seconds();
        for (key, why) in &capped.refused {
            shared
                .memory
                .record(key, ProbeState::Unknown, why.clone(), now.clone());
        }
        refused = capped.refused.into_keys().collect();
        log_refused(&refused, &mut logged);
        for (key, spec) in wanted {
            match workers.get(&key) {
                Some(w) => {
                    w.spec.send_if_modified(|s| {
                        if *s == spec {
                            return false;
                        }
                        *s = spec.clone();
                        true
                    });
                }
                None => {
                    let (tx, rx) = watch::channel(spec);
                    let cancel = shared.cancel.child_token();
                    shared.tracker.spawn(
                        probe_task(
                            shared.clone(),
                            runtime.clone(),
                            (key.0.clone(), key.1.clone()),
                            rx,
                            cancel.clone(),
                        )
                        .instrument(tracing::debug_span!("probe", pod = %key.0, probe = %key.1)),
                    );
                    workers.insert(key, Worker { spec: tx, cancel });
                }
            }
        }
        shared.metrics.probes(workers.len(), refused.len());
        shared.memory.changed();
        match (workers.is_empty(), &refresher) {
            (false, None) => {
                let t = shared.cancel.child_token();
                shared.tracker.spawn(
                    observe::refresh_containers(shared.clone(), runtime.clone(), t.clone())
                        .in_current_span(),
                );
                refresher = Some(t);
            }
            (true, Some(t)) => {
                t.cancel();
                refresher = None;
            }
            _ => {}
        }
        tokio::select! {
            () = shared.cancel.cancelled() => return,
            r = generation.changed() => if r.is_err() { return },
        }
    }
}

/// The least time between two log lines about probes over the caps.
const REFUSED_LOG_INTERVAL: std::time::Duration = std::time::Duration::from_secs(60);

/// Logs how many probes are over the caps when that number changed, at most once a
/// [`REFUSED_LOG_INTERVAL`] (a tenant's spec changing at every sync would otherwise fill the
/// log); each probe's status says it too.
fn log_refused(refused: &BTreeSet<ProbeKey>, logged: &mut Option<(Instant, usize)>) {
    let count = refused.len();
    let due = count > 0
        && logged.is_none_or(|(at, last)| last != count && at.elapsed() >= REFUSED_LOG_INTERVAL);
    if !due {
        return;
    }
    let pods: BTreeSet<&str> = refused.iter().map(|k| k.0.as_str()).collect();
    tracing::warn!(
        refused = count,
        pods = pods.len(),
        per_pod = decide::PROBES_PER_POD,
        per_node = decide::PROBES_PER_NODE,
        "probes over kruised's caps are not run; the NodePodProbe status says so for each"
    );
    *logged = Some((Instant::now(), count));
}

/// One probe, until its token is cancelled.
async fn probe_task(
    shared: Arc<ProbeController>,
    runtime: RemoteRuntime,
    key: ProbeKey,
    mut spec: watch::Receiver<ProbeSpec>,
    cancel: CancellationToken,
) {
    // the container probed, and its age as first seen (decide::Age)
    let mut container_id: Option<String> = None;
    let mut age: Option<Age> = None;
    // the pod's IPs, and the IP the spec gave when they were found
    let mut pod_ips: Option<(String, PodIps)> = None;
    let mut thresholds = Thresholds::default();
    let mut handler = Handler::of(&spec.borrow().probe);
    // spread the first runs of many probes over a period, as the kubelet does after a restart
    let period = decide::seconds(spec.borrow().probe.period_seconds);
    if shared.started.elapsed() < period {
        let delay = period.mul_f64(crate::backoff::random_unit());
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(delay) => {}
        }
    }
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            _ = tick.tick() => {}
            r = spec.changed() => {
                if r.is_err() { return }
                let s = spec.borrow_and_update().clone();
                let new_handler = Handler::of(&s.probe);
                if new_handler != handler && container_id.is_some() {
                    set_result(&shared, &key, &s, ProbeState::Unknown, String::new());
                    thresholds.reset();
                }
                handler = new_handler;
                let p = decide::seconds(s.probe.period_seconds);
                if p != tick.period() {
                    tick = tokio::time::interval_at(Instant::now() + p, p);
                    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                }
                continue;
            }
        }
        let s = spec.borrow().clone();
        let Some(c) = shared.memory.container(&key.0, &s.container) else {
            continue;
        };
        if container_id.as_deref() != Some(c.id.as_str()) {
            container_id = Some(c.id.clone());
            // the container's creation time is the runtime's: compared on its clock, once
            age = None;
            pod_ips = None;
            thresholds.reset();
            set_result(&shared, &key, &s, ProbeState::Unknown, String::new());
        }
        let now = Instant::now();
        let up = age
            .get_or_insert_with(|| Age::first_seen(c.created_at, crate::cri::clock::now_ns(), now))
            .at(now);
        match decide::due(&s, c.state == ContainerState::Running, up) {
            Due::NotRunning(message) => {
                set_result(&shared, &key, &s, ProbeState::Failed, message);
                continue;
            }
            Due::TooEarly => continue,
            Due::Run => {}
        }
        let Some(h) = handler else { continue };
        let timeout = decide::timeout(&s.probe);
        // where network probes may go: the pod's IPs, asked of the runtime once per container
        // (the sandbox's) beside the one kruise-manager wrote from the pod's status
        if h != Handler::Exec && pod_ips.as_ref().is_none_or(|(ip, _)| *ip != s.ip) {
            pod_ips = Some((s.ip.clone(), observe::pod_ips(&runtime, &c, &s.ip).await));
        }
        let ips = pod_ips
            .as_ref()
            .map(|(_, ips)| ips.clone())
            .unwrap_or_default();
        // a slot of the node's first (slots.rs: shared fairly by namespace and pod); a wait
        // for one ends with the probe (left the spec, the daemon stopping)
        let slots = if h == Handler::Exec {
            &shared.exec_slots
        } else {
            &shared.network_slots
        };
        let ns = s.pod.namespace.clone().unwrap_or_default();
        let Some(_slot) = slots.take(&ns, &key.0, &cancel).await else {
            return;
        };
        let started = Instant::now();
        // boxed: a run's state (its read buffer, a TLS or gRPC connection's) is allocated while
        // it runs, in a slot, not carried by every probe's task while it sleeps or waits
        let run = Box::pin(prober::run(&runtime, &s.probe, &c.id, &ips, timeout));
        let outcome = tokio::select! {
            () = cancel.cancelled() => return,
            o = run => o,
        };
        shared.metrics.probed(h, &outcome, started.elapsed());
        if let Outcome::Error(e) = &outcome {
            tracing::debug!(error = %decide::log_message(e), "probe could not run");
        }
        if let Some((state, message)) = decide::judge(&mut thresholds, outcome, &s.probe) {
            set_result(&shared, &key, &s, state, message);
        }
    }
}
