//! Every CRI runtime found on the node, keyed by the runtime name that prefixes the kubelet's
//! container IDs (`containerd://…`, `cri-o://…`, `docker://…`).

use std::fmt;

use super::Timeouts;
use super::{CriError, Endpoint, EndpointSource, RemoteRuntime, RuntimeService, RuntimeVersion};

/// What one candidate endpoint answered during discovery.
#[derive(Debug)]
pub struct Probe {
    /// The endpoint tried.
    pub endpoint: Endpoint,
    /// Its `Version` answer, or why it failed.
    pub outcome: Result<RuntimeVersion, CriError>,
}

/// No runtime answered CRI v1. Says what was tried and what each endpoint answered.
#[derive(Debug)]
pub struct DiscoveryError {
    /// What was searched.
    pub searched: String,
    /// The candidates that exist and what they answered (empty: none existed).
    pub probes: Vec<Probe>,
}

impl fmt::Display for DiscoveryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "no container runtime answers CRI v1; searched {}",
            self.searched
        )?;
        if self.probes.is_empty() {
            write!(
                f,
                ": no socket exists there. Set --runtime-endpoint (or CONTAINER_RUNTIME_ENDPOINT) \
                 to the runtime's socket, or --host-run-dir to where the host's /var/run is mounted"
            )?;
        }
        for p in &self.probes {
            match &p.outcome {
                Ok(v) => write!(
                    f,
                    "; {}: {} {}",
                    p.endpoint, v.runtime_name, v.runtime_version
                )?,
                Err(e) => write!(f, "; {}: {e}", p.endpoint)?,
            }
        }
        Ok(())
    }
}

impl std::error::Error for DiscoveryError {}

/// The runtimes of this node. The first one found is the primary: it serves images and anything
/// not tied to a container ID.
#[derive(Clone, Debug)]
pub struct Runtimes {
    found: Vec<(RuntimeVersion, RemoteRuntime)>,
}

impl Runtimes {
    /// Probes every candidate of `source` with CRI v1 `Version` (concurrently) and keeps each
    /// that answers, first by name wins. `image_endpoint` overrides the primary's image service.
    pub async fn discover(
        source: &EndpointSource,
        image_endpoint: Option<Endpoint>,
        timeouts: Timeouts,
    ) -> Result<Self, DiscoveryError> {
        let candidates = source.candidates();
        let probes =
            futures::future::join_all(candidates.into_iter().enumerate().map(|(i, ep)| {
                let image = if i == 0 { image_endpoint.clone() } else { None };
                async move {
                    let rt = RemoteRuntime::new(ep.clone(), image, timeouts);
                    let outcome = rt.version().await;
                    (
                        rt,
                        Probe {
                            endpoint: ep,
                            outcome,
                        },
                    )
                }
            }))
            .await;
        let mut found: Vec<(RuntimeVersion, RemoteRuntime)> = Vec::new();
        let mut tried = Vec::new();
        for (rt, probe) in probes {
            match &probe.outcome {
                Ok(v) if !found.iter().any(|(f, _)| f.runtime_name == v.runtime_name) => {
                    tracing::info!(
                        endpoint = %probe.endpoint,
                        runtime = %v.runtime_name,
                        version = %v.runtime_version,
                        api = %v.runtime_api_version,
                        "found container runtime"
                    );
                    found.push((v.clone(), rt));
                }
                Ok(v) => tracing::info!(
                    endpoint = %probe.endpoint,
                    runtime = %v.runtime_name,
                    "ignoring a second socket of the same runtime"
                ),
                Err(e) => {
                    tracing::warn!(endpoint = %probe.endpoint, error = %e, "runtime candidate does not answer")
                }
            }
            tried.push(probe);
        }
        if found.is_empty() {
            return Err(DiscoveryError {
                searched: source.describe(),
                probes: tried,
            });
        }
        Ok(Runtimes { found })
    }

    /// A set holding one runtime, already known to answer.
    pub fn single(version: RuntimeVersion, runtime: RemoteRuntime) -> Self {
        Runtimes {
            found: vec![(version, runtime)],
        }
    }

    /// The primary runtime.
    pub fn primary(&self) -> &RemoteRuntime {
        &self.found[0].1
    }

    /// The primary runtime's `Version` answer.
    pub fn primary_version(&self) -> &RuntimeVersion {
        &self.found[0].0
    }

    /// All runtimes with their `Version` answers, primary first.
    pub fn all(&self) -> impl Iterator<Item = (&RuntimeVersion, &RemoteRuntime)> {
        self.found.iter().map(|(v, r)| (v, r))
    }

    /// The runtime whose name is `name`.
    pub fn by_name(&self, name: &str) -> Option<&RemoteRuntime> {
        self.found
            .iter()
            .find(|(v, _)| v.runtime_name == name)
            .map(|(_, r)| r)
    }

    /// Splits a kubelet container ID (`<runtime>://<id>`) and finds its runtime. A bare ID goes
    /// to the primary runtime.
    pub fn for_container_id<'a>(&self, container_id: &'a str) -> Option<(&RemoteRuntime, &'a str)> {
        match split_container_id(container_id) {
            ("", id) => Some((self.primary(), id)),
            (name, id) => self.by_name(name).map(|r| (r, id)),
        }
    }

    /// The runtime of a pod's containers, from their kubelet IDs (`<runtime>://<id>`; empty
    /// ones skipped), and its name as the IDs give it: the runtime their type names, the
    /// node's primary runtime when there is no ID yet. The one lookup of container meta,
    /// recreate requests and `kruised explain`.
    pub fn for_containers<'a>(
        &self,
        ids: impl IntoIterator<Item = &'a str>,
    ) -> Result<(&RemoteRuntime, String), RuntimeLookupError> {
        let ids: Vec<&str> = ids.into_iter().filter(|id| !id.is_empty()).collect();
        let types: std::collections::BTreeSet<&str> =
            ids.iter().map(|id| split_container_id(id).0).collect();
        if types.len() > 1 {
            let types: Vec<&str> = types.into_iter().collect();
            return Err(RuntimeLookupError::MixedTypes(types.join(", ")));
        }
        match ids.first() {
            Some(id) => self
                .for_container_id(id)
                .map(|(rt, _)| (rt, split_container_id(id).0.to_string()))
                .ok_or_else(|| RuntimeLookupError::NotFound((*id).to_string())),
            None => Ok((self.primary(), self.primary_version().runtime_name.clone())),
        }
    }
}

/// A kubelet container ID (`<runtime>://<id>`, as a pod's status and a recreate request give
/// it) as the runtime's name (empty for a bare ID) and the runtime's own ID.
pub fn split_container_id(container_id: &str) -> (&str, &str) {
    container_id.split_once("://").unwrap_or(("", container_id))
}

/// Why the runtime of a pod's containers is not known. The texts of the last two are
/// kruise-daemon's (a recreate request's status carries them).
#[derive(Debug, thiserror::Error)]
pub enum RuntimeLookupError {
    /// No runtime is connected yet: the work waits for one, it does not fail.
    #[error("the container runtime is not connected yet")]
    NotConnected,
    /// The containers' IDs name runtimes of more than one type.
    #[error("has different runtime types {0} in Pod")]
    MixedTypes(String),
    /// No runtime of this daemon has the ID's type.
    #[error("not found runtime service for {0} in daemon")]
    NotFound(String),
}
