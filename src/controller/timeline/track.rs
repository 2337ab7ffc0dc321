//! The timeline of one pod's in-place updates, pure: what each version of the pod
//! ([`PodFacts`]), each look at the runtime ([`RuntimeContainer`]) and each word of the puller
//! ([`PodTrack::image_present`]) adds, in whatever order they come, each step kept at its
//! first sighting (a duplicate changes nothing).
//!
//! The steps, each a time on the runtime's clock (`cri::clock`: nanoseconds since the epoch):
//!
//! - **seen**: the earliest of the manager's grace annotation appearing, `InPlaceUpdateReady`
//!   going False, the spec's image or env-from-metadata change ([`SeenBy`] says which);
//! - **image present**: every changed container's new image on the node (the puller says so,
//!   the runtime had it when the change was seen, or at the latest when the new container was
//!   created from it);
//! - **container stopped**: the old containers exited (the runtime's `finished_at`);
//! - **container started**: the new containers run (the runtime's `started_at`);
//! - **ready**: the first version of the pod `Ready` again with the gate not False and every
//!   changed container running as a new one;
//! - **meta written**: kruised's `runtime-containers-meta` names the new containers.
//!
//! An update ends ([`End`]) finished (ready, and the meta written or not expected any more),
//! superseded (another spec came before it finished), abandoned (the gate and the grace
//! annotation went away without a spec change) or unfinished (no end within
//! [`IN_FLIGHT_LIMIT`]). A pod holds one update in flight and the last ended one.

use std::collections::BTreeMap;
use std::time::Duration;

use super::facts::{MAX_CONTAINERS, PodFacts, SpecContainer};

/// A time on the runtime's clock: nanoseconds since the epoch.
pub type Ns = i64;

/// An update with no end this long after it was seen ends as [`End::Unfinished`].
pub const IN_FLIGHT_LIMIT: Duration = Duration::from_secs(3600);

/// How long after `ready` the meta annotation is waited for before the update finishes
/// without it (containermeta off, or its writes failing).
pub const META_WAIT: Duration = Duration::from_secs(60);

/// The puller's words kept for an update not seen yet (the puller may hear of the grace
/// annotation first).
const EARLY_IMAGES: usize = 8;

/// What showed the update first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeenBy {
    /// The manager's grace annotation (`apps.kruise.io/inplace-update-grace`) appeared.
    GraceAnnotation,
    /// `InPlaceUpdateReady` went False.
    Gate,
    /// A container's image changed in the spec.
    ImageChange,
    /// A container's env from metadata changed (labels or annotations it reads).
    EnvChange,
}

impl SeenBy {
    /// Its name, as metrics, explain and events give it.
    pub fn as_str(self) -> &'static str {
        match self {
            SeenBy::GraceAnnotation => "grace-annotation",
            SeenBy::Gate => "gate",
            SeenBy::ImageChange => "image-change",
            SeenBy::EnvChange => "env-change",
        }
    }
}

/// How a new image was known to be on the node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum PresentBy {
    /// The new container was created from it (the latest it can have been there).
    ContainerCreated,
    /// The puller said it pulled it, or found it.
    Puller,
    /// The runtime had it when the change was seen (or the image did not change).
    AlreadyPresent,
}

impl PresentBy {
    /// Its name.
    pub fn as_str(self) -> &'static str {
        match self {
            PresentBy::ContainerCreated => "new container created",
            PresentBy::Puller => "pulled by kruised",
            PresentBy::AlreadyPresent => "already on the node",
        }
    }
}

/// The steps after "seen".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Every changed container's new image is on the node.
    ImagePresent,
    /// The old containers exited.
    ContainerStopped,
    /// The new containers run.
    ContainerStarted,
    /// The pod is Ready again.
    Ready,
    /// kruised's meta annotation names the new containers.
    MetaWritten,
}

impl Step {
    /// Every step, in their usual order.
    pub const ALL: [Step; 5] = [
        Step::ImagePresent,
        Step::ContainerStopped,
        Step::ContainerStarted,
        Step::Ready,
        Step::MetaWritten,
    ];

    /// Its name (a metric label).
    pub fn as_str(self) -> &'static str {
        match self {
            Step::ImagePresent => "image_present",
            Step::ContainerStopped => "container_stopped",
            Step::ContainerStarted => "container_started",
            Step::Ready => "ready",
            Step::MetaWritten => "meta_written",
        }
    }
}

/// How an update ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// Ready, and the meta written (or no longer waited for).
    Finished,
    /// Another spec came before it finished.
    Superseded,
    /// The gate and the grace annotation went away without a spec change.
    Abandoned,
    /// No end within [`IN_FLIGHT_LIMIT`].
    Unfinished,
}

impl End {
    /// Its name.
    pub fn as_str(self) -> &'static str {
        match self {
            End::Finished => "finished",
            End::Superseded => "superseded",
            End::Abandoned => "abandoned",
            End::Unfinished => "unfinished",
        }
    }
}

/// One container an update changes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tracked {
    /// Its name.
    pub name: String,
    /// The new image.
    pub image: String,
    /// Whether the image changed (not only its env).
    pub image_changed: bool,
    /// The runtime ID of the container that ran when the update was seen.
    pub old_id: Option<String>,
    /// The runtime ID of the container that replaced it, once known.
    pub new_id: Option<String>,
    /// When its new image was known present, and how.
    pub present: Option<(Ns, PresentBy)>,
    /// When its old container exited.
    pub stopped: Option<Ns>,
    /// When its new container started.
    pub started: Option<Ns>,
    /// Whether the runtime was asked for its image already.
    image_checked: bool,
}

/// A container as the runtime reports it, for [`PodTrack::observe_runtime`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeContainer {
    /// Runtime ID.
    pub id: String,
    /// Container name.
    pub name: String,
    /// The kubelet's attempt.
    pub attempt: u32,
    /// Created (ns).
    pub created_at: Ns,
    /// Started (ns), 0 if not.
    pub started_at: Ns,
    /// Finished (ns), 0 if not.
    pub finished_at: Ns,
}

/// One in-place update of a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Update {
    /// When it was seen.
    pub seen_at: Ns,
    /// What showed it.
    pub seen_by: SeenBy,
    /// First seen while it was already under way (the daemon started during it): its steps
    /// are shown, not measured.
    pub joined_late: bool,
    /// When `InPlaceUpdateReady` went False, if it did.
    pub gate_false_at: Option<Ns>,
    /// The spec it goes to, once the spec changed.
    target: Option<Vec<SpecContainer>>,
    /// The containers it changes (known with the target, or from the grace annotation).
    pub containers: Vec<Tracked>,
    /// The container IDs when it was seen, by name.
    ids_at_seen: BTreeMap<String, String>,
    /// When the pod was Ready again.
    pub ready: Option<Ns>,
    /// When the meta annotation named the new containers.
    pub meta_written: Option<Ns>,
    /// How and when it ended.
    pub end: Option<(End, Ns)>,
}

impl Update {
    fn new(now: Ns, seen_by: SeenBy, joined_late: bool, f: &PodFacts) -> Update {
        Update {
            seen_at: now,
            seen_by,
            joined_late,
            gate_false_at: f.gate_false.then_some(now),
            target: None,
            containers: Vec::new(),
            ids_at_seen: f
                .statuses
                .iter()
                .filter(|s| !s.id.is_empty())
                .map(|s| (s.name.clone(), s.id.clone()))
                .collect(),
            ready: None,
            meta_written: None,
            end: None,
        }
    }

    /// The time of `step`: when every changed container reached it (the last of them), or,
    /// for `ready` and `meta written`, when the pod showed it.
    pub fn at(&self, step: Step) -> Option<Ns> {
        let all = |f: fn(&Tracked) -> Option<Ns>| -> Option<Ns> {
            if self.containers.is_empty() {
                return None;
            }
            self.containers
                .iter()
                .map(f)
                .try_fold(Ns::MIN, |acc, t| Some(acc.max(t?)))
        };
        match step {
            Step::ImagePresent => all(|t| t.present.map(|(at, _)| at)),
            Step::ContainerStopped => all(|t| t.stopped),
            Step::ContainerStarted => all(|t| t.started),
            Step::Ready => self.ready,
            Step::MetaWritten => self.meta_written,
        }
    }

    /// How the last image to be present was known present.
    pub fn present_by(&self) -> Option<PresentBy> {
        self.containers
            .iter()
            .filter_map(|t| t.present)
            .max_by_key(|(at, _)| *at)
            .map(|(_, by)| by)
    }

    /// `step`'s time after the update was seen (none before it: a step already done when the
    /// update was seen, such as an image pulled for the next batch, took no time of it).
    pub fn after_seen(&self, step: Step) -> Option<Duration> {
        self.at(step).map(|at| since(self.seen_at, at))
    }

    /// The unready window: from `InPlaceUpdateReady` False (for a pod without the gate, from
    /// the update seen) to `Ready` True again.
    pub fn unready(&self) -> Option<Duration> {
        let from = self.gate_false_at.unwrap_or(self.seen_at);
        self.ready.map(|ready| since(from, ready))
    }

    /// Whether the runtime has more to tell: a changed container the kubelet shows replaced
    /// (or ended) whose stop or start is not known yet.
    pub fn wants_runtime(&self, f: &PodFacts) -> bool {
        self.containers.iter().any(|t| {
            let Some(status) = f.status(&t.name) else {
                return false;
            };
            let replaced = !status.id.is_empty() && Some(&status.id) != t.old_id.as_ref();
            let ended = !status.running;
            (t.stopped.is_none() && (replaced || ended))
                || (t.started.is_none() && replaced && status.running)
        })
    }

    /// The new images not asked of the runtime yet (each once), marked asked.
    pub fn take_image_checks(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        for t in &mut self.containers {
            if t.image_changed && !t.image_checked && t.present.is_none() {
                t.image_checked = true;
                if !out.contains(&t.image) {
                    out.push(t.image.clone());
                }
            }
        }
        out
    }

    /// Container `t` of the spec `to` goes to, changed from `from`.
    fn track(&mut self, to: &SpecContainer, from: Option<&SpecContainer>, early: &[(String, Ns)]) {
        let image_changed = from.is_none_or(|f| f.image != to.image);
        let seen_at = self.seen_at;
        let old_id = self.ids_at_seen.get(&to.name).cloned();
        let t = match self.containers.iter_mut().find(|t| t.name == to.name) {
            Some(t) => {
                if t.image != to.image {
                    // the grace annotation named another image than the spec applied
                    t.present = None;
                    t.image_checked = false;
                }
                t
            }
            None => {
                if self.containers.len() >= MAX_CONTAINERS {
                    return;
                }
                self.containers.push(Tracked {
                    name: to.name.clone(),
                    image: to.image.clone(),
                    image_changed,
                    old_id: None,
                    new_id: None,
                    present: None,
                    stopped: None,
                    started: None,
                    image_checked: false,
                });
                let Some(t) = self.containers.last_mut() else {
                    return;
                };
                t
            }
        };
        t.image = to.image.clone();
        t.image_changed = image_changed;
        if t.old_id.is_none() {
            t.old_id = old_id;
        }
        if !image_changed {
            t.present = Some((seen_at, PresentBy::AlreadyPresent));
        }
        for (image, at) in early {
            if *image == t.image {
                present(t, *at, PresentBy::Puller);
            }
        }
    }
}

/// `to - from`, none when `to` is earlier.
fn since(from: Ns, to: Ns) -> Duration {
    Duration::from_nanos(u64::try_from(to.saturating_sub(from)).unwrap_or(0))
}

/// Records `t`'s image present at `at`, by `by`: an earlier time wins, and at the same time the
/// better-founded word.
fn present(t: &mut Tracked, at: Ns, by: PresentBy) {
    let better = match t.present {
        None => true,
        Some((was, was_by)) => at < was || (at == was && by > was_by),
    };
    if better {
        t.present = Some((at, by));
    }
}

/// Which containers of `to` differ from `from` (image or env), by name.
fn changed<'a>(
    from: &'a [SpecContainer],
    to: &'a [SpecContainer],
) -> Vec<(&'a SpecContainer, Option<&'a SpecContainer>)> {
    to.iter()
        .filter_map(|c| {
            let before = from.iter().find(|b| b.name == c.name);
            (before != Some(c)).then_some((c, before))
        })
        .collect()
}

/// One pod's in-place updates: the steady spec, the update in flight, the last one ended.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodTrack {
    /// The spec while no update is in flight (none before the pod was first seen).
    baseline: Option<Vec<SpecContainer>>,
    /// The update in flight.
    pub current: Option<Update>,
    /// The last update that ended.
    pub last: Option<Update>,
    /// What the puller said before the update was seen (image, when), the newest last.
    early: Vec<(String, Ns)>,
}

impl PodTrack {
    /// Takes in a version of the pod seen at `now`; returns the update it ended, if any (a
    /// superseded or abandoned one; a finished one comes from [`PodTrack::finish_if_done`]).
    pub fn observe(&mut self, f: &PodFacts, now: Ns) -> Option<Update> {
        let mut ended = None;
        if let Some(u) = &mut self.current {
            let target_changed = u.target.as_ref().is_some_and(|t| *t != f.spec);
            if target_changed {
                // a new spec before the update finished (a rollback, the next batch): the
                // current one ends, and the new one is seen now, from the spec it left
                let from = u.target.take();
                ended = self.end(End::Superseded, now);
                self.baseline = from;
            }
        }
        if self.current.is_none() {
            self.start(f, now);
        }
        let Some(u) = &mut self.current else {
            return ended;
        };
        if u.gate_false_at.is_none() && f.gate_false {
            u.gate_false_at = Some(now);
        }
        if u.target.is_none()
            && let Some(grace) = &f.grace
        {
            // the images the manager will apply after its grace period
            for (name, image) in grace {
                if let Some(now_spec) = f.spec.iter().find(|c| c.name == *name)
                    && now_spec.image != *image
                {
                    let to = SpecContainer {
                        image: image.clone(),
                        ..now_spec.clone()
                    };
                    u.track(&to, Some(now_spec), &self.early);
                }
            }
        }
        if u.target.is_none() {
            let changes = self
                .baseline
                .as_deref()
                .map_or_else(Vec::new, |b| changed(b, &f.spec));
            if !changes.is_empty() {
                for (to, before) in &changes {
                    u.track(to, *before, &self.early);
                }
                u.target = Some(f.spec.clone());
            } else if u.joined_late {
                // joined under way: the changed containers are those the kubelet replaces
                for s in &f.statuses {
                    if s.running
                        && !s.id.is_empty()
                        && u.ids_at_seen.get(&s.name) != Some(&s.id)
                        && let Some(to) = f.spec.iter().find(|c| c.name == s.name)
                    {
                        u.track(to, None, &self.early);
                    }
                }
                if !f.gate_false && f.grace.is_none() && u.containers.is_empty() {
                    return self.end(End::Abandoned, now).or(ended);
                }
            } else if !f.gate_false && f.grace.is_none() {
                // the gate and the grace annotation are gone, and the spec never changed
                return self.end(End::Abandoned, now).or(ended);
            }
        }
        // what the kubelet and kruised's annotation show of the changed containers
        for t in &mut u.containers {
            let Some(status) = f.status(&t.name) else {
                continue;
            };
            if !status.id.is_empty() && Some(&status.id) != t.old_id.as_ref() && status.running {
                t.new_id.get_or_insert_with(|| status.id.clone());
            }
        }
        let replaced = |u: &Update| {
            !u.containers.is_empty()
                && u.containers.iter().all(|t| {
                    f.status(&t.name).is_some_and(|s| {
                        s.running && !s.id.is_empty() && Some(&s.id) != t.old_id.as_ref()
                    })
                })
        };
        let all_replaced = replaced(u);
        if u.ready.is_none() && f.ready && !f.gate_false && all_replaced {
            u.ready = Some(now);
        }
        if u.meta_written.is_none()
            && all_replaced
            && u.containers.iter().all(|t| {
                f.meta_ids
                    .get(&t.name)
                    .is_some_and(|id| f.status(&t.name).is_some_and(|s| s.id == *id))
            })
        {
            u.meta_written = Some(now);
        }
        ended
    }

    /// Starts an update if this version of the pod shows one.
    fn start(&mut self, f: &PodFacts, now: Ns) {
        let Some(baseline) = &self.baseline else {
            // first sight: an update under way is joined late; otherwise this is the baseline
            if f.gate_false || f.grace.is_some() {
                let seen_by = if f.gate_false {
                    SeenBy::Gate
                } else {
                    SeenBy::GraceAnnotation
                };
                self.current = Some(Update::new(now, seen_by, true, f));
            }
            self.baseline = Some(f.spec.clone());
            return;
        };
        let changes = changed(baseline, &f.spec);
        let graced = f.grace.as_ref().is_some_and(|g| {
            g.iter()
                .any(|(name, image)| f.spec.iter().any(|c| c.name == *name && c.image != *image))
        });
        let seen_by = if graced || (f.grace.is_some() && changes.is_empty() && !f.gate_false) {
            SeenBy::GraceAnnotation
        } else if f.gate_false {
            SeenBy::Gate
        } else if changes
            .iter()
            .any(|(to, from)| from.is_none_or(|b| b.image != to.image))
        {
            SeenBy::ImageChange
        } else if !changes.is_empty() {
            SeenBy::EnvChange
        } else {
            // steady: the spec as it is now is what a coming update starts from
            self.baseline = Some(f.spec.clone());
            return;
        };
        self.current = Some(Update::new(now, seen_by, false, f));
    }

    /// Ends the update in flight as `how`, keeping it as the last.
    fn end(&mut self, how: End, now: Ns) -> Option<Update> {
        let mut u = self.current.take()?;
        if let Some(target) = u.target.take() {
            self.baseline = Some(target);
        }
        u.end = Some((how, now));
        self.last = Some(u.clone());
        self.early.clear();
        Some(u)
    }

    /// Ends the update in flight if it is done at `now`: ready with the meta written, ready
    /// [`META_WAIT`] ago without it, or in flight for [`IN_FLIGHT_LIMIT`].
    pub fn finish_if_done(&mut self, now: Ns) -> Option<Update> {
        let u = self.current.as_ref()?;
        let limit = |d: Duration| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX);
        match u.ready {
            Some(_) if u.meta_written.is_some() => self.end(End::Finished, now),
            Some(ready) if now.saturating_sub(ready) >= limit(META_WAIT) => {
                self.end(End::Finished, now)
            }
            _ if now.saturating_sub(u.seen_at) >= limit(IN_FLIGHT_LIMIT) => {
                self.end(End::Unfinished, now)
            }
            _ => None,
        }
    }

    /// Takes in what the runtime holds of the pod's containers: the old containers' ends, the
    /// new ones' starts, and (at the latest) their images present at their creation.
    pub fn observe_runtime(&mut self, containers: &[RuntimeContainer]) {
        let Some(u) = &mut self.current else {
            return;
        };
        for t in &mut u.containers {
            let of_name = || containers.iter().filter(|c| c.name == t.name);
            let newest = of_name()
                .filter(|c| Some(&c.id) != t.old_id.as_ref())
                .filter(|c| c.created_at >= u.seen_at || t.old_id.is_some())
                .max_by_key(|c| (c.attempt, c.created_at));
            let Some(new) = newest else {
                // not replaced yet; the old one may have exited already
                if let Some(old) = of_name().find(|c| Some(&c.id) == t.old_id.as_ref())
                    && old.finished_at > 0
                {
                    t.stopped.get_or_insert(old.finished_at);
                }
                continue;
            };
            // the old container: the one seen running, or the attempt before the new one
            let old = match &t.old_id {
                Some(id) => of_name().find(|c| c.id == *id),
                None => of_name()
                    .filter(|c| c.attempt < new.attempt)
                    .max_by_key(|c| (c.attempt, c.created_at)),
            };
            if let Some(old) = old
                && old.finished_at > 0
            {
                t.stopped.get_or_insert(old.finished_at);
            }
            t.new_id.get_or_insert_with(|| new.id.clone());
            present(t, new.created_at, PresentBy::ContainerCreated);
            if new.started_at > 0 {
                t.started.get_or_insert(new.started_at);
            }
        }
    }

    /// The puller's word: `image` is on the node since `at`. Kept for a coming update when
    /// none names it yet.
    pub fn image_present(&mut self, image: &str, at: Ns, by: PresentBy) {
        let mut taken = false;
        if let Some(u) = &mut self.current {
            for t in u.containers.iter_mut().filter(|t| t.image == image) {
                present(t, at, by);
                taken = true;
            }
        }
        if !taken && by == PresentBy::Puller {
            self.early.retain(|(i, _)| i != image);
            if self.early.len() >= EARLY_IMAGES {
                self.early.remove(0);
            }
            self.early.push((image.to_string(), at));
        }
    }
}

/// A finished update of one container, for the tests of the files that show and measure
/// updates: seen at 0, its image present at 1 s, stopped 2 s, started 3 s, ready 4 s, meta 5 s.
#[cfg(test)]
pub fn example(joined_late: bool) -> Update {
    const S: Ns = 1_000_000_000;
    let t0 = 1_800_000_000 * S;
    Update {
        seen_at: t0,
        seen_by: SeenBy::Gate,
        joined_late,
        gate_false_at: Some(t0),
        target: None,
        containers: vec![Tracked {
            name: "main".into(),
            image: "app:v2".into(),
            image_changed: true,
            old_id: Some("c1".into()),
            new_id: Some("c2".into()),
            present: Some((t0 + S, PresentBy::Puller)),
            stopped: Some(t0 + 2 * S),
            started: Some(t0 + 3 * S),
            image_checked: true,
        }],
        ids_at_seen: BTreeMap::new(),
        ready: Some(t0 + 4 * S),
        meta_written: Some(t0 + 5 * S),
        end: Some((End::Finished, t0 + 5 * S)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::timeline::facts::StatusContainer;

    const S: Ns = 1_000_000_000;
    const T0: Ns = 1_800_000_000 * S;

    /// A pod version: `main` (and `side`, unchanged) with `image`, the kubelet running `id`.
    #[derive(Clone)]
    struct Pod {
        image: &'static str,
        id: &'static str,
        running: bool,
        gate_false: bool,
        ready: bool,
        grace: Option<&'static str>,
        meta_id: &'static str,
    }

    const STEADY: Pod = Pod {
        image: "app:v1",
        id: "c1",
        running: true,
        gate_false: false,
        ready: true,
        grace: None,
        meta_id: "c1",
    };

    fn facts(p: &Pod) -> PodFacts {
        let spec = |name: &str, image: &str| SpecContainer {
            name: name.into(),
            image: image.into(),
            env_hash: 7,
        };
        let status = |name: &str, id: &str, running| StatusContainer {
            name: name.into(),
            id: id.into(),
            running,
        };
        PodFacts {
            grace: p
                .grace
                .map(|image| [("main".to_string(), image.to_string())].into()),
            gate_false: p.gate_false,
            ready: p.ready,
            spec: vec![spec("main", p.image), spec("side", "side:v1")],
            statuses: vec![status("main", p.id, p.running), status("side", "s1", true)],
            meta_ids: [
                ("main".to_string(), p.meta_id.to_string()),
                ("side".to_string(), "s1".to_string()),
            ]
            .into(),
        }
    }

    fn rc(id: &str, attempt: u32, created: Ns, started: Ns, finished: Ns) -> RuntimeContainer {
        RuntimeContainer {
            id: id.into(),
            name: "main".into(),
            attempt,
            created_at: created,
            started_at: started,
            finished_at: finished,
        }
    }

    /// The runtime after the kubelet replaced c1 (exited at +5 s) by c2 (created +6 s,
    /// started +7 s).
    fn replaced() -> Vec<RuntimeContainer> {
        vec![
            rc("c1", 0, T0 - 100 * S, T0 - 100 * S, T0 + 5 * S),
            rc("c2", 1, T0 + 6 * S, T0 + 7 * S, 0),
        ]
    }

    fn after(u: &Update, step: Step) -> Option<u64> {
        u.after_seen(step).map(|d| d.as_secs())
    }

    /// The manager's update with a grace period, as kruise makes it, then the kubelet's.
    fn graced_update(t: &mut PodTrack) {
        assert_eq!(t.observe(&facts(&STEADY), T0 - 50 * S), None);
        let gate = Pod {
            gate_false: true,
            ..STEADY
        };
        t.observe(&facts(&gate), T0);
        let graced = Pod {
            grace: Some("app:v2"),
            ..gate.clone()
        };
        t.observe(&facts(&graced), T0 + S);
        // after the grace period: the spec, the annotation gone
        let patched = Pod {
            image: "app:v2",
            ..gate.clone()
        };
        t.observe(&facts(&patched), T0 + 4 * S);
    }

    #[test]
    fn an_update_with_a_grace_period_records_every_step_from_the_gate_going_false() {
        let mut t = PodTrack::default();
        graced_update(&mut t);
        let u = t.current.as_ref().expect("in flight");
        assert_eq!(
            u.seen_by,
            SeenBy::Gate,
            "the gate went False before the annotation came"
        );
        assert_eq!(u.containers.len(), 1, "main only");
        assert_eq!(u.containers[0].old_id.as_deref(), Some("c1"));
        // the kubelet: main ended, then replaced
        let ended = Pod {
            image: "app:v2",
            gate_false: true,
            ready: false,
            running: false,
            ..STEADY
        };
        t.observe(&facts(&ended), T0 + 5 * S);
        assert!(
            t.current
                .as_ref()
                .expect("in flight")
                .wants_runtime(&facts(&ended))
        );
        let started = Pod {
            id: "c2",
            running: true,
            ..ended.clone()
        };
        t.observe(&facts(&started), T0 + 7 * S);
        t.observe_runtime(&replaced());
        let meta = Pod {
            meta_id: "c2",
            ..started.clone()
        };
        t.observe(&facts(&meta), T0 + 8 * S);
        assert_eq!(t.finish_if_done(T0 + 8 * S), None, "not ready yet");
        let ready = Pod {
            gate_false: false,
            ready: true,
            ..meta
        };
        t.observe(&facts(&ready), T0 + 9 * S);
        let u = t.finish_if_done(T0 + 9 * S).expect("finished");
        assert_eq!(u.end, Some((End::Finished, T0 + 9 * S)));
        assert_eq!(
            after(&u, Step::ImagePresent),
            Some(6),
            "at the latest, its creation"
        );
        assert_eq!(u.present_by(), Some(PresentBy::ContainerCreated));
        assert_eq!(after(&u, Step::ContainerStopped), Some(5));
        assert_eq!(after(&u, Step::ContainerStarted), Some(7));
        assert_eq!(after(&u, Step::MetaWritten), Some(8));
        assert_eq!(after(&u, Step::Ready), Some(9));
        assert_eq!(u.unready(), Some(Duration::from_secs(9)));
        assert_eq!(u.containers[0].new_id.as_deref(), Some("c2"));
        assert_eq!(t.last, Some(u), "kept as the last");
        assert_eq!(t.current, None);
    }

    #[test]
    fn steps_arriving_in_another_order_or_twice_keep_their_first_times() {
        let mut t = PodTrack::default();
        t.observe(&facts(&STEADY), T0 - 50 * S);
        // the puller heard of the image before the watch showed the update
        t.image_present("app:v2", T0 - S, PresentBy::Puller);
        // no gate: the spec's change shows the update
        let patched = Pod {
            image: "app:v2",
            ..STEADY
        };
        t.observe(&facts(&patched), T0);
        let u = t.current.as_ref().expect("in flight");
        assert_eq!(u.seen_by, SeenBy::ImageChange);
        assert_eq!(
            after(u, Step::ImagePresent),
            Some(0),
            "present before it was seen"
        );
        // the runtime first, then the kubelet's report, then kruised's meta before Ready
        t.observe_runtime(&replaced());
        t.observe_runtime(&replaced());
        let meta = Pod {
            id: "c2",
            meta_id: "c2",
            ready: false,
            ..patched.clone()
        };
        t.observe(&facts(&meta), T0 + 8 * S);
        t.observe(&facts(&meta), T0 + 9 * S);
        assert_eq!(t.finish_if_done(T0 + 9 * S), None);
        let ready = Pod {
            ready: true,
            ..meta
        };
        t.observe(&facts(&ready), T0 + 10 * S);
        t.image_present("app:v2", T0 + 3 * S, PresentBy::Puller);
        let u = t.finish_if_done(T0 + 10 * S).expect("finished");
        assert_eq!(after(&u, Step::MetaWritten), Some(8), "its first sighting");
        assert_eq!(after(&u, Step::Ready), Some(10));
        assert_eq!(u.present_by(), Some(PresentBy::Puller), "the earliest word");
        assert_eq!(after(&u, Step::ContainerStopped), Some(5));
        assert_eq!(
            u.unready(),
            Some(Duration::from_secs(10)),
            "from the update seen"
        );
        // a version seen again after the end starts nothing
        assert_eq!(t.observe(&facts(&ready), T0 + 11 * S), None);
        assert_eq!(t.current, None);
    }

    #[test]
    fn a_daemon_started_mid_update_joins_it_late_and_still_shows_its_steps() {
        let mut t = PodTrack::default();
        // first sight: the gate False and the spec already patched
        let patched = Pod {
            image: "app:v2",
            gate_false: true,
            ready: false,
            ..STEADY
        };
        t.observe(&facts(&patched), T0 + 3 * S);
        let u = t.current.as_ref().expect("joined");
        assert!(u.joined_late);
        let started = Pod {
            id: "c2",
            ..patched.clone()
        };
        t.observe(&facts(&started), T0 + 7 * S);
        t.observe_runtime(&replaced());
        let done = Pod {
            gate_false: false,
            ready: true,
            meta_id: "c2",
            ..started
        };
        t.observe(&facts(&done), T0 + 9 * S);
        let u = t.finish_if_done(T0 + 9 * S).expect("finished");
        assert!(u.joined_late, "shown, not measured");
        assert_eq!(u.containers[0].name, "main");
        assert_eq!(u.at(Step::ContainerStopped), Some(T0 + 5 * S));
        assert_eq!(u.at(Step::ContainerStarted), Some(T0 + 7 * S));
    }

    #[test]
    fn a_gate_that_comes_back_without_a_spec_change_abandons_the_update() {
        let mut t = PodTrack::default();
        t.observe(&facts(&STEADY), T0);
        let gate = Pod {
            gate_false: true,
            ..STEADY
        };
        t.observe(&facts(&gate), T0 + S);
        let u = t.observe(&facts(&STEADY), T0 + 2 * S).expect("ended");
        assert_eq!(u.end, Some((End::Abandoned, T0 + 2 * S)));
    }

    #[test]
    fn a_new_spec_before_the_end_supersedes_the_update_and_starts_the_next() {
        let mut t = PodTrack::default();
        t.observe(&facts(&STEADY), T0);
        let v2 = Pod {
            image: "app:v2",
            ..STEADY
        };
        t.observe(&facts(&v2), T0 + S);
        let v3 = Pod {
            image: "app:v3",
            ..STEADY
        };
        let u = t.observe(&facts(&v3), T0 + 2 * S).expect("superseded");
        assert_eq!(u.end, Some((End::Superseded, T0 + 2 * S)));
        let next = t.current.as_ref().expect("the next in flight");
        assert_eq!(next.seen_at, T0 + 2 * S);
        assert_eq!(next.containers[0].image, "app:v3");
    }

    #[test]
    fn an_env_only_change_has_its_image_present_when_seen() {
        let mut t = PodTrack::default();
        t.observe(&facts(&STEADY), T0);
        let mut changed = facts(&STEADY);
        changed.spec[0].env_hash = 8;
        t.observe(&changed, T0 + S);
        let u = t.current.as_ref().expect("in flight");
        assert_eq!(u.seen_by, SeenBy::EnvChange);
        assert_eq!(u.at(Step::ImagePresent), Some(T0 + S));
        assert_eq!(u.present_by(), Some(PresentBy::AlreadyPresent));
    }

    #[test]
    fn a_pod_updated_a_thousand_times_holds_one_update_in_flight_and_one_ended() {
        let mut t = PodTrack::default();
        t.observe(&facts(&STEADY), T0);
        let images = ["app:v2", "app:v3"];
        for i in 0..1000 {
            let p = Pod {
                image: images[i % 2],
                grace: Some(images[(i + 1) % 2]),
                gate_false: i % 3 == 0,
                ..STEADY
            };
            t.observe(&facts(&p), T0 + i as Ns * S);
            t.image_present(&format!("other:{i}"), T0, PresentBy::Puller);
        }
        assert!(t.early.len() <= EARLY_IMAGES);
        let held = t.current.iter().chain(t.last.iter()).count();
        assert!(held <= 2);
        assert!(
            t.current
                .iter()
                .all(|u| u.containers.len() <= MAX_CONTAINERS)
        );
    }

    #[test]
    fn an_update_with_no_end_is_ended_unfinished_after_the_limit() {
        let mut t = PodTrack::default();
        t.observe(&facts(&STEADY), T0);
        let v2 = Pod {
            image: "app:v2",
            ..STEADY
        };
        t.observe(&facts(&v2), T0 + S);
        assert_eq!(t.finish_if_done(T0 + 2 * S), None);
        let limit = Ns::try_from(IN_FLIGHT_LIMIT.as_nanos()).expect("fits");
        let u = t.finish_if_done(T0 + S + limit).expect("ended");
        assert_eq!(u.end.map(|(how, _)| how), Some(End::Unfinished));
    }
}
