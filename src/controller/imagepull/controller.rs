//! The NodeImage loop: keeps one pull task per tag of the NodeImage named after the node, and
//! writes the status when it changes.
//!
//! - On every change of the watched NodeImage (spec or status), [`plan`](super::state::plan)
//!   says which tasks to stop, which finished statuses to adopt and which tasks to start.
//! - Tasks announce phase changes; the status is then written, coalesced: the first change after
//!   a quiet period is written within [`status_coalesce`] (50 ms), later ones at most every
//!   [`status_min_interval`] (500 ms), and the moment no task is left running the final state is
//!   written at once. A 10-tag NodeImage thus costs a handful of writes, and a finished pull is
//!   reported without delay. A change of tags' `progress` alone (`progress.rs`: each new
//!   integer percent) is written at most every [`progress_min_interval`] (1 s, kruise's pace).
//! - Before writing, the wanted status is compared with the freshest stored one (the watch cache
//!   or the answer to our last write, whichever has the newer `resourceVersion`): an unchanged
//!   status is never written, also not after a restart or a resync.
//! - A NodeImage being deleted is left alone (as kruise does); one that disappears stops every
//!   task.
//!
//! [`status_coalesce`]: super::Settings::status_coalesce
//! [`status_min_interval`]: super::Settings::status_min_interval
//! [`progress_min_interval`]: super::Settings::progress_min_interval

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use tokio::sync::{Notify, broadcast, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::secrets::Credentials;
use super::state::{self, TagKey, Tracked};
use super::status;
use super::task::{self, PullTools, StatusCell, TagJob};
use crate::backoff::Backoff;
use crate::cri::ImageService;
use crate::k8s::crd::{ImagePullPhase, ImageTagStatus, NodeImage};
use crate::k8s::time::later;
use crate::k8s::watch::Watched;
use crate::k8s::write;

/// A tag the controller tracks.
struct Entry {
    version: i64,
    status: StatusCell,
    /// The running task; `None` for an adopted status or a finished task.
    task: Option<CancellationToken>,
}

impl Entry {
    fn snapshot(&self) -> ImageTagStatus {
        self.status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// The NodeImage controller of one node.
pub struct Controller<I, C> {
    tools: Arc<PullTools<I, C>>,
    node: String,
    api: Api<NodeImage>,
    cache: Watched<NodeImage>,
    entries: BTreeMap<TagKey, Entry>,
    /// Our last write.
    written: Option<status::LastWrite>,
    last_write: Option<Instant>,
    /// The pause after a failed write ([`Backoff::status_write`]).
    write_retry: Backoff,
    changed: Arc<Notify>,
    busy: watch::Sender<usize>,
}

fn resource_version(o: &NodeImage) -> u64 {
    o.resource_version()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

impl<I, C> Controller<I, C>
where
    I: ImageService + Clone + 'static,
    C: Credentials,
{
    /// A controller for the NodeImage named `node`. `busy` receives the number of tasks not yet
    /// finished (the next-batch pre-puller waits for 0).
    pub fn new(
        tools: Arc<PullTools<I, C>>,
        node: &str,
        api: Api<NodeImage>,
        cache: Watched<NodeImage>,
        busy: watch::Sender<usize>,
    ) -> Self {
        Controller {
            tools,
            node: node.to_string(),
            api,
            cache,
            entries: BTreeMap::new(),
            written: None,
            last_write: None,
            write_retry: Backoff::status_write(),
            changed: Arc::new(Notify::new()),
            busy,
        }
    }

    fn object(&self) -> Option<Arc<NodeImage>> {
        self.cache.store().get(&ObjectRef::new(&self.node))
    }

    /// Runs until `cancel`; then stops every task.
    pub async fn run(mut self, cancel: CancellationToken) {
        let mut changes = self.cache.subscribe();
        tokio::select! {
            () = cancel.cancelled() => return,
            () = self.cache.wait_synced() => {}
        }
        self.reconcile();
        let mut flush_at = Some(Instant::now());
        loop {
            tokio::select! {
                () = cancel.cancelled() => break,
                r = changes.recv() => match r {
                    Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {
                        self.reconcile();
                        flush_at = Some(self.next_flush(flush_at));
                    }
                    Err(broadcast::error::RecvError::Closed) => break,
                },
                () = self.changed.notified() => {
                    flush_at = Some(self.next_flush(flush_at));
                }
                () = sleep_until(flush_at), if flush_at.is_some() => {
                    flush_at = self.flush().await;
                }
            }
            self.publish_counts();
        }
        for e in self.entries.values() {
            if let Some(t) = &e.task {
                t.cancel();
            }
        }
        tracing::debug!("image puller stopped");
    }

    /// Applies the plan for the current object.
    fn reconcile(&mut self) {
        let obj = self.object();
        let Some(obj) = obj.filter(|o| o.metadata.deletion_timestamp.is_none()) else {
            if self.object().is_none() && !self.entries.is_empty() {
                tracing::info!("NodeImage gone: stopping every pull");
                for e in self.entries.values() {
                    if let Some(t) = &e.task {
                        t.cancel();
                    }
                }
                let gone: Vec<_> = self.entries.values().map(Entry::snapshot).collect();
                self.entries.clear();
                self.unpin_removed(&gone);
                self.written = None;
            }
            return;
        };
        // tasks that finished are no longer active
        for e in self.entries.values_mut() {
            if e.task.is_some() && state::is_terminal(&e.snapshot().phase) {
                e.task = None;
            }
        }
        let tracked: BTreeMap<TagKey, Tracked> = self
            .entries
            .iter()
            .map(|(k, e)| {
                (
                    k.clone(),
                    Tracked {
                        version: e.version,
                        active: e.task.is_some(),
                    },
                )
            })
            .collect();
        let plan = state::plan(&obj.spec, obj.status.as_ref(), &tracked);
        let mut removed = Vec::new();
        for key in &plan.stop {
            if let Some(e) = self.entries.remove(key) {
                let stays = plan.start.iter().any(|(k, _)| k == key)
                    || plan.adopt.iter().any(|(k, _)| k == key);
                if !stays {
                    removed.push(e.snapshot());
                }
                if let Some(t) = e.task {
                    tracing::info!(image = %key.0, tag = %key.1, version = e.version, "stopping pull");
                    t.cancel();
                }
            }
        }
        self.unpin_removed(&removed);
        for (key, s) in plan.adopt {
            tracing::debug!(image = %key.0, tag = %key.1, version = s.version, phase = %s.phase, "tag already done for its version");
            self.entries.insert(
                key,
                Entry {
                    version: s.version,
                    status: Arc::new(Mutex::new(s)),
                    task: None,
                },
            );
        }
        let node_image = write::object_ref(obj.as_ref());
        // made in the pre-pulls' order, they queue in it (`turn.rs`)
        let mut start = plan.start;
        start.sort_by_cached_key(|((image, _), spec)| self.tools.turn.rank_of(image, spec));
        for ((image, tag), spec) in start {
            let Some(ispec) = obj.spec.images.get(&image) else {
                continue;
            };
            let cell: StatusCell = Arc::new(Mutex::new(state::waiting(&spec)));
            let cancel = CancellationToken::new();
            let job = TagJob {
                image: image.clone(),
                spec: spec.clone(),
                pull_secrets: ispec.pull_secrets.clone(),
                sandbox: ispec.sandbox_config.clone(),
                node_image: node_image.clone(),
            };
            let span =
                tracing::info_span!("tag", image = %image, tag = %tag, version = spec.version);
            self.tools.tracker.spawn(
                task::run(
                    self.tools.clone(),
                    job,
                    cell.clone(),
                    self.changed.clone(),
                    cancel.clone(),
                )
                .instrument(span),
            );
            self.entries.insert(
                (image, tag),
                Entry {
                    version: spec.version,
                    status: cell,
                    task: Some(cancel),
                },
            );
        }
    }

    /// Unpins the images of tags that left the spec (`removed`, their last statuses), oldest
    /// first, unless a tag still tracked names them ([`super::pin`]).
    fn unpin_removed(&self, removed: &[ImageTagStatus]) {
        let Some(pins) = self.tools.puller.pins().cloned() else {
            return;
        };
        let image_id = |s: &ImageTagStatus| {
            let id = s
                .image_id
                .rsplit('@')
                .next()
                .unwrap_or_default()
                .to_string();
            crate::cri::dialect::is_image_id(&id).then_some(id)
        };
        let kept: Vec<String> = self
            .entries
            .values()
            .filter_map(|e| image_id(&e.snapshot()))
            .collect();
        let ids: Vec<String> = removed
            .iter()
            .filter_map(image_id)
            .filter(|id| !kept.contains(id))
            .collect();
        if !ids.is_empty() {
            self.tools
                .tracker
                .spawn(async move { pins.release(&ids).await });
        }
    }

    /// Counts tasks by phase for the metrics and the pre-puller.
    fn publish_counts(&self) {
        let (mut waiting, mut pulling, mut succeeded, mut failed) = (0, 0, 0, 0);
        for e in self.entries.values() {
            match e.snapshot().phase {
                ImagePullPhase::Waiting => waiting += 1,
                ImagePullPhase::Pulling => pulling += 1,
                ImagePullPhase::Succeeded => succeeded += 1,
                ImagePullPhase::Failed => failed += 1,
                ImagePullPhase::Other(_) => {}
            }
        }
        self.tools
            .metrics
            .phases(waiting, pulling, succeeded, failed);
        self.busy.send_if_modified(|b| {
            let now = waiting + pulling;
            std::mem::replace(b, now) != now
        });
    }

    /// When to write after a change, given the write already planned.
    fn next_flush(&self, planned: Option<Instant>) -> Instant {
        let now = Instant::now();
        let s = &self.tools.settings;
        let all_done = self
            .entries
            .values()
            .all(|e| state::is_terminal(&e.snapshot().phase));
        let only_progress = !all_done && self.only_progress_moved();
        let at = write_at(now, self.last_write, all_done, only_progress, s);
        planned.map_or(at, |p| p.min(at))
    }

    /// Whether the status to write differs from the last one written at most in tags'
    /// progress: a change that moved nothing else (a tag's progress, or the watch echoing
    /// this process's own write) waits for the progress pace, so that progress that moves
    /// right after a write is not written at the status pace.
    fn only_progress_moved(&self) -> bool {
        let (Some(obj), Some(written)) = (self.object(), &self.written) else {
            return false;
        };
        let tags: BTreeMap<TagKey, ImageTagStatus> = self
            .entries
            .iter()
            .map(|(k, e)| (k.clone(), e.snapshot()))
            .collect();
        status::at_most_progress_differs(&written.sent, &status::build(&obj.spec, &tags))
    }

    /// Writes the status if it differs from the stored one; returns when to try again after a
    /// failed write.
    async fn flush(&mut self) -> Option<Instant> {
        let obj = self.object()?;
        if obj.metadata.deletion_timestamp.is_some() {
            return None;
        }
        let tags: BTreeMap<TagKey, ImageTagStatus> = self
            .entries
            .iter()
            .map(|(k, e)| (k.clone(), e.snapshot()))
            .collect();
        let want = status::build(&obj.spec, &tags);
        let patch = status::decide(
            &want,
            obj.status.as_ref(),
            resource_version(&obj),
            self.written.as_ref(),
        )?;
        match write::patch_status(&self.api, &self.node, &patch).await {
            Ok(o) => {
                tracing::debug!(
                    desired = want.desired,
                    succeeded = want.succeeded,
                    failed = want.failed,
                    pulling = want.pulling,
                    waiting = want.waiting,
                    "status written"
                );
                self.written = Some(status::LastWrite {
                    resource_version: resource_version(&o),
                    stored: o.status.unwrap_or_default(),
                    sent: want,
                });
                self.last_write = Some(Instant::now());
                self.write_retry.reset();
                None
            }
            Err(e) if write::is_not_found(&e) => None,
            Err(e) => {
                let pause = self.write_retry.pause();
                tracing::warn!(error = %e, retry_in = ?pause, "status write failed");
                Some(later(Instant::now(), pause))
            }
        }
    }
}

/// When to write a change made at `now`, the last write having been at `last_write`: at once
/// when every task is done; a change of tags' progress alone at most every
/// `progress_min_interval`; any other within `status_coalesce`, at most every
/// `status_min_interval`.
fn write_at(
    now: Instant,
    last_write: Option<Instant>,
    all_done: bool,
    only_progress: bool,
    s: &super::settings::Settings,
) -> Instant {
    if all_done {
        return now;
    }
    let least = if only_progress {
        s.progress_min_interval
    } else {
        s.status_min_interval
    };
    match last_write {
        Some(last) if now < last + least => last + least,
        _ => now + s.status_coalesce,
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn progress_alone_is_written_at_most_once_a_second_and_phase_changes_at_their_pace() {
        let s = super::super::settings::Settings::default();
        let t0 = Instant::now();
        let ms = |n: u64| Duration::from_millis(n);
        // a quiet period: any change within the coalescing delay
        assert_eq!(write_at(t0, None, false, true, &s), t0 + ms(50));
        assert_eq!(
            write_at(t0 + ms(5000), Some(t0), false, true, &s),
            t0 + ms(5050)
        );
        // progress 200 ms after a write: a second after it
        assert_eq!(
            write_at(t0 + ms(200), Some(t0), false, true, &s),
            t0 + ms(1000)
        );
        // a phase change then: at the status pace (500 ms)
        assert_eq!(
            write_at(t0 + ms(200), Some(t0), false, false, &s),
            t0 + ms(500)
        );
        // every task done: at once
        assert_eq!(
            write_at(t0 + ms(200), Some(t0), true, false, &s),
            t0 + ms(200)
        );
    }
}
