//! The Kubernetes side: well-known keys, and (with the daemon) the API client, typed resources,
//! the node's pod cache and the status writers.

pub mod client;
pub mod crd;
pub mod events;
pub mod keys;
pub mod watch;
pub mod write;
