//! The kubelet, as the tests play it: one home for everything the kubelet does, used by every
//! layer that plays it (the end-to-end tests' [`Kubelet`] on a real runtime, [`FakeNode`]'s
//! kubelet, the manager double's and the settle tests' [`KubeletTiming`], the
//! fleet's kubelets, and `tests/kubelet-stand-in`, the demo's kubelet):
//!
//! - [`spec`]: the pod and containers it creates, their CRI configs with its labels and
//!   annotations and the env resolved from the pod (its metadata included) at creation, the
//!   kubelet hash of a container's spec, its pull policy;
//! - [`cri`]: creating sandboxes and containers, and creating them again as the kubelet does:
//!   kill, the image step (a pull as the policy says), start;
//! - [`status`]: the pod status it reports, the one writer of `containerStatuses` and `Ready`;
//! - [`sync`]: its sync loop on an in-process node, at once or with the real one's timing;
//! - [`run`]: its sync loop through CRI for nodes whose pods it watches through a client (the
//!   demo's one node on a real runtime, the fleet's on the fake one).
//!
//! [`FakeNode`]: crate::node::FakeNode

pub mod cri;
pub mod run;
pub mod spec;
pub mod status;
pub mod sync;

pub use cri::{ImageError, ImageStep, Kubelet, RunningPod};
pub use spec::{ContainerSpec, PodSpec, PullPolicy};
pub use sync::KubeletTiming;
