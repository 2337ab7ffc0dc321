//! The node's probe slots: exec probes (one `ExecSync` call each) and network probes (one
//! HTTP, TCP or gRPC connection each) run only in a slot of their kind, so what the tenants'
//! probes cost at once is bounded whatever their number, and shared so that no namespace can
//! take another's turn.
//!
//! A slot is taken for a namespace and a pod ([`Slots::take`]) and given back when dropped
//! ([`Slot`]). The rules ([`Limits`]): at most `node` slots in all, `namespace` for one
//! namespace, `pod` for one pod; and a namespace's second and later slots come out of `shared`
//! of the node's, so the rest is kept for namespaces holding none: a namespace's first probe
//! waits only while every slot is held, which takes `node - shared` or more other namespaces
//! holding slots at once. A freed slot goes to the waiting probe whose namespace holds the fewest (the
//! longest waiting of those first). A wait ends when its token is cancelled (the probe left the
//! spec, the daemon stops), holding nothing.
//!
//! Only the namespaces and pods holding a slot are remembered (at most `node` of each).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::sync::lock;

/// How many slots of a kind there are and how they are shared; see the module.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Slots on the node.
    pub node: usize,
    /// Slots one namespace holds at most.
    pub namespace: usize,
    /// Slots one pod holds at most.
    pub pod: usize,
    /// Of the node's slots, how many may be namespaces' second and later ones.
    pub shared: usize,
}

/// Exec probes at once: 16 on the node, 4 a namespace (and so a pod); 8 kept for namespaces'
/// first probes: up to 7 namespaces running exec probes at once never delay an eighth's first.
pub const EXEC: Limits = Limits {
    node: 16,
    namespace: 4,
    pod: 4,
    shared: 8,
};

/// Network probes (HTTP, TCP, gRPC) at once: 64 connections on the node, 16 a namespace, 8 a
/// pod; 32 kept for namespaces' first probes. Each holds at most
/// [`super::prober::NETWORK_PROBE_MEMORY`] of the target's answer.
pub const NETWORK: Limits = Limits {
    node: 64,
    namespace: 16,
    pod: 8,
    shared: 32,
};

/// A probe waiting for a slot.
#[derive(Debug)]
struct Waiter {
    namespace: String,
    pod: String,
    granted: oneshot::Sender<()>,
}

/// What is held, and who waits.
#[derive(Debug, Default)]
struct Held {
    total: usize,
    /// Slots held beyond each namespace's first.
    beyond_first: usize,
    namespaces: HashMap<String, usize>,
    pods: HashMap<String, usize>,
    waiting: VecDeque<Waiter>,
}

impl Held {
    fn of(map: &HashMap<String, usize>, key: &str) -> usize {
        map.get(key).copied().unwrap_or(0)
    }

    fn may_take(&self, limits: &Limits, namespace: &str, pod: &str) -> bool {
        let in_namespace = Self::of(&self.namespaces, namespace);
        self.total < limits.node
            && in_namespace < limits.namespace
            && Self::of(&self.pods, pod) < limits.pod
            && (in_namespace == 0 || self.beyond_first < limits.shared)
    }

    fn take(&mut self, namespace: &str, pod: &str) {
        let in_namespace = self.namespaces.entry(namespace.to_string()).or_default();
        if *in_namespace > 0 {
            self.beyond_first += 1;
        }
        *in_namespace += 1;
        *self.pods.entry(pod.to_string()).or_default() += 1;
        self.total += 1;
    }

    fn give_back(&mut self, namespace: &str, pod: &str) {
        fn down(map: &mut HashMap<String, usize>, key: &str) -> usize {
            let left = map.get(key).copied().unwrap_or(0).saturating_sub(1);
            if left == 0 {
                map.remove(key);
            } else {
                map.insert(key.to_string(), left);
            }
            left
        }
        if down(&mut self.namespaces, namespace) > 0 {
            self.beyond_first = self.beyond_first.saturating_sub(1);
        }
        down(&mut self.pods, pod);
        self.total = self.total.saturating_sub(1);
    }

    /// Gives free slots to waiting probes: each time to the one whose namespace holds the
    /// fewest, the longest waiting of those first.
    fn grant(&mut self, limits: &Limits) {
        loop {
            self.waiting.retain(|w| !w.granted.is_closed());
            let next = self
                .waiting
                .iter()
                .enumerate()
                .filter(|(_, w)| self.may_take(limits, &w.namespace, &w.pod))
                .min_by_key(|(i, w)| (Self::of(&self.namespaces, &w.namespace), *i))
                .map(|(i, _)| i);
            let Some(w) = next.and_then(|i| self.waiting.remove(i)) else {
                return;
            };
            self.take(&w.namespace, &w.pod);
            if w.granted.send(()).is_err() {
                // it stopped waiting since the check: the slot is free again
                self.give_back(&w.namespace, &w.pod);
            }
        }
    }
}

/// The node's slots of one kind; see the module.
#[derive(Debug)]
pub struct Slots {
    limits: Limits,
    held: Mutex<Held>,
}

/// A slot held: given back when dropped.
#[derive(Debug)]
pub struct Slot<'a> {
    slots: &'a Slots,
    namespace: String,
    pod: String,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.slots.give_back(&self.namespace, &self.pod);
    }
}

/// A wait for a slot; if it ends without the slot (cancelled, or its future dropped) a slot
/// granted meanwhile is given back.
struct Waiting<'s, 'n> {
    slots: &'s Slots,
    namespace: &'n str,
    pod: &'n str,
    granted: oneshot::Receiver<()>,
    done: bool,
}

impl Drop for Waiting<'_, '_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        self.granted.close();
        if self.granted.try_recv().is_ok() {
            self.slots.give_back(self.namespace, self.pod);
        }
    }
}

impl Slots {
    /// No slot held.
    pub fn new(limits: Limits) -> Self {
        Slots {
            limits,
            held: Mutex::new(Held::default()),
        }
    }

    /// Its limits.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// A slot for a probe of `pod` in `namespace`, once the rules allow it; `None` when
    /// `cancel` is cancelled first (nothing is held then).
    pub async fn take<'s>(
        &'s self,
        namespace: &str,
        pod: &str,
        cancel: &CancellationToken,
    ) -> Option<Slot<'s>> {
        let granted = {
            let mut held = lock(&self.held);
            if held.may_take(&self.limits, namespace, pod) {
                held.take(namespace, pod);
                return Some(self.slot(namespace, pod));
            }
            let (tx, rx) = oneshot::channel();
            held.waiting.push_back(Waiter {
                namespace: namespace.to_string(),
                pod: pod.to_string(),
                granted: tx,
            });
            rx
        };
        let mut waiting = Waiting {
            slots: self,
            namespace,
            pod,
            granted,
            done: false,
        };
        tokio::select! {
            () = cancel.cancelled() => None,
            r = &mut waiting.granted => {
                waiting.done = r.is_ok();
                r.ok().map(|()| self.slot(namespace, pod))
            }
        }
    }

    fn slot(&self, namespace: &str, pod: &str) -> Slot<'_> {
        Slot {
            slots: self,
            namespace: namespace.to_string(),
            pod: pod.to_string(),
        }
    }

    fn give_back(&self, namespace: &str, pod: &str) {
        let mut held = lock(&self.held);
        held.give_back(namespace, pod);
        held.grant(&self.limits);
    }

    /// Slots held now, in all.
    pub fn held(&self) -> usize {
        lock(&self.held).total
    }

    /// Slots held now by `namespace`.
    pub fn held_by(&self, namespace: &str) -> usize {
        Held::of(&lock(&self.held).namespaces, namespace)
    }

    /// Probes waiting now.
    pub fn waiting(&self) -> usize {
        let mut held = lock(&self.held);
        held.waiting.retain(|w| !w.granted.is_closed());
        held.waiting.len()
    }

    /// Namespaces and pods remembered (those holding a slot).
    pub fn remembered(&self) -> (usize, usize) {
        let held = lock(&self.held);
        (held.namespaces.len(), held.pods.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt as _;

    fn never() -> CancellationToken {
        CancellationToken::new()
    }

    /// Takes a slot that must be free now.
    fn now<'s>(slots: &'s Slots, ns: &str, pod: &str) -> Option<Slot<'s>> {
        slots
            .take(ns, pod, &never())
            .now_or_never()
            .unwrap_or_else(|| panic!("{ns}/{pod} had to wait"))
    }

    #[test]
    fn four_namespaces_sleeping_through_their_exec_probes_leave_other_namespaces_a_slot_at_once() {
        // issue 43, row 14: four namespaces held all 16 exec slots, a fifth's probes waited up
        // to 61 s a run
        let slots = Slots::new(EXEC);
        let mut hogs = Vec::new();
        for ns in ["a", "b", "c", "d"] {
            for pod in 0..4 {
                let pod = format!("{ns}-{pod}");
                if let Some(s) = slots.take(ns, &pod, &never()).now_or_never().flatten() {
                    hogs.push(s);
                }
            }
        }
        assert_eq!(
            hogs.len(),
            EXEC.node - EXEC.shared + 4,
            "four namespaces: their first slots and the shared eight"
        );
        // every other namespace's first probe runs at once, up to the node's limit
        let others: Vec<_> = ["e", "f", "g", "h"]
            .iter()
            .map(|ns| now(&slots, ns, ns).expect("a slot"))
            .collect();
        assert_eq!(slots.held(), EXEC.node);
        drop(others);
        assert_eq!(slots.held(), hogs.len());
    }

    #[test]
    fn one_pod_holds_at_most_its_limit_one_namespace_its_own_and_the_node_its_own() {
        let slots = Slots::new(NETWORK);
        let mut held = Vec::new();
        while let Some(Some(s)) = slots.take("a", "one-pod", &never()).now_or_never() {
            held.push(s);
        }
        assert_eq!(held.len(), NETWORK.pod, "one pod");
        let mut pod = 0;
        while let Some(Some(s)) = slots.take("a", &format!("p{pod}"), &never()).now_or_never() {
            held.push(s);
            pod += 1;
        }
        assert_eq!(held.len(), NETWORK.namespace, "one namespace");
        let mut ns = 0;
        while let Some(Some(s)) = slots
            .take(&format!("ns{ns}"), &format!("ns{ns}-p"), &never())
            .now_or_never()
        {
            held.push(s);
            ns += 1;
        }
        assert_eq!(held.len(), NETWORK.node, "the node");
        assert_eq!(slots.held(), NETWORK.node);
    }

    #[tokio::test]
    async fn a_freed_slot_goes_to_the_waiting_namespace_holding_the_fewest() {
        let limits = Limits {
            node: 2,
            namespace: 2,
            pod: 2,
            shared: 1,
        };
        let slots = Slots::new(limits);
        let a1 = now(&slots, "a", "pa").expect("a slot");
        let _a2 = now(&slots, "a", "pa").expect("a slot");
        let never = never();
        let mut greedy = Box::pin(slots.take("a", "pa", &never));
        assert!(futures::poll!(&mut greedy).is_pending(), "the node is full");
        let mut newcomer = Box::pin(slots.take("b", "pb", &never));
        assert!(futures::poll!(&mut newcomer).is_pending());
        drop(a1);
        let b = futures::poll!(&mut newcomer);
        assert!(
            matches!(b, std::task::Poll::Ready(Some(_))),
            "b holds none: the freed slot is b's though a waited longer"
        );
        assert!(futures::poll!(&mut greedy).is_pending(), "b holds it");
        drop(b);
        assert!(
            matches!(futures::poll!(&mut greedy), std::task::Poll::Ready(Some(_))),
            "and gives it back"
        );
    }

    #[tokio::test]
    async fn a_wait_for_a_slot_ends_when_its_probe_is_removed_and_holds_nothing() {
        // issue 43, row 16: a probe removed (or the daemon stopping) while it waited for an exec
        // slot waited on until a slot freed, and then ran
        let slots = Slots::new(EXEC);
        let held: Vec<_> = (0..EXEC.namespace)
            .map(|_| now(&slots, "a", "p").expect("a slot"))
            .collect();
        let removed = CancellationToken::new();
        let mut wait = Box::pin(slots.take("a", "p", &removed));
        assert!(futures::poll!(&mut wait).is_pending());
        assert_eq!(slots.waiting(), 1);
        removed.cancel();
        assert!(matches!(
            futures::poll!(&mut wait),
            std::task::Poll::Ready(None)
        ));
        drop(wait);
        assert_eq!(slots.waiting(), 0, "no longer waiting");
        drop(held);
        assert_eq!(slots.held(), 0, "the freed slots went to no one");
        // a wait dropped after its slot was granted gives it back
        let full = Slots::new(Limits {
            node: 1,
            namespace: 1,
            pod: 1,
            shared: 0,
        });
        let only = now(&full, "x", "px").expect("a slot");
        let never = never();
        let mut wait = Box::pin(full.take("y", "py", &never));
        assert!(futures::poll!(&mut wait).is_pending());
        drop(only);
        drop(wait);
        assert_eq!(full.held(), 0, "granted, never taken, given back");
    }

    #[test]
    fn a_namespace_or_pod_holding_no_slot_is_forgotten() {
        let slots = Slots::new(EXEC);
        let a = now(&slots, "a", "pa").expect("a slot");
        drop(now(&slots, "b", "pb"));
        assert_eq!(slots.remembered(), (1, 1), "only a is held");
        assert_eq!(slots.held_by("a"), 1);
        drop(a);
        assert_eq!(slots.remembered(), (0, 0));
    }
}
