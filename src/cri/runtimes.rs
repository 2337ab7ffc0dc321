//! Every CRI runtime found on the node, keyed by the runtime name that prefixes the kubelet's
//! container IDs (`containerd://…`, `cri-o://…`, `docker://…`), and which of them is the
//! primary one: the kubelet's, as its Node reports it (`status.nodeInfo.containerRuntimeVersion`,
//! `cri-o://1.36.3`), where more than one answers (kruise #1825: kruise-daemon took the first
//! found, and pulled images into a runtime the kubelet does not use). Two of one name (k3s's own
//! containerd beside the host's) are told apart by the version the Node reports.

use std::fmt;

use super::endpoint::{Endpoint, EndpointSource};
use super::error::CriError;
use super::grpc::{RemoteRuntime, Timeouts};
use super::service::RuntimeService;
use super::types::RuntimeVersion;

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

/// The runtimes of this node. The primary one serves images and anything not tied to a
/// container ID: the only one, the one the Node reports ([`Runtimes::choose_primary`]), or else
/// the first found; [`Runtimes::primary_reason`] says which of these.
#[derive(Clone, Debug)]
pub struct Runtimes {
    found: Vec<(RuntimeVersion, RemoteRuntime)>,
    reason: PrimaryReason,
    /// The candidates whose socket is there but did not answer (a runtime restarting, or a
    /// socket left behind): one of them may be the kubelet's.
    silent: Vec<String>,
}

/// Why the primary runtime is the one it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PrimaryReason {
    /// It is the only runtime that answers.
    Only,
    /// The Node reports it as the kubelet's: `status.nodeInfo.containerRuntimeVersion` (this
    /// value).
    NodeReports(String),
    /// More than one answers and the Node could not say which the kubelet uses (why): the
    /// first found.
    FirstFound(String),
}

impl PrimaryReason {
    /// Whether the choice is a fallback: several runtimes answer and the kubelet's is unknown.
    pub fn is_fallback(&self) -> bool {
        matches!(self, PrimaryReason::FirstFound(_))
    }
}

impl fmt::Display for PrimaryReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PrimaryReason::Only => write!(f, "the only runtime that answers"),
            PrimaryReason::NodeReports(v) => write!(
                f,
                "the kubelet's: the Node reports {v} (status.nodeInfo.containerRuntimeVersion)"
            ),
            PrimaryReason::FirstFound(why) => write!(
                f,
                "the first that answers, of several: {why}, so the kubelet's runtime is unknown"
            ),
        }
    }
}

/// What the daemon learned from its Node about the kubelet's runtime.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeRuntime {
    /// The `status.nodeInfo.containerRuntimeVersion` it reports (`containerd://2.1.9`).
    Reported(String),
    /// Why it names none ("kruised may not read Node n1").
    Unknown(String),
}

impl<E: fmt::Display> From<Result<String, E>> for NodeRuntime {
    /// The Node's answer, or why there is none.
    fn from(answer: Result<String, E>) -> Self {
        match answer {
            Ok(v) => NodeRuntime::Reported(v),
            Err(why) => NodeRuntime::Unknown(why.to_string()),
        }
    }
}

impl Runtimes {
    /// The same runtimes, accepting `ExecSync` answers of at most `bytes` from each
    /// ([`RemoteRuntime::with_exec_output_limit`]).
    pub fn with_exec_output_limit(self, bytes: usize) -> Self {
        Runtimes {
            found: self
                .found
                .into_iter()
                .map(|(v, rt)| (v, rt.with_exec_output_limit(bytes)))
                .collect(),
            reason: self.reason,
            silent: self.silent,
        }
    }

    /// Probes every candidate of `source` with CRI v1 `Version` (concurrently) and keeps each
    /// that answers, in the order of the candidates. `image_endpoint` overrides the primary's image service.
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
        let mut silent = Vec::new();
        let mut tried = Vec::new();
        // every socket that answers is kept, two of one name too (a k3s node's own containerd
        // beside the host's: only the Node can tell which is the kubelet's); the candidates are
        // distinct sockets already (`EndpointSource::candidates` resolves links)
        for (rt, probe) in probes {
            match &probe.outcome {
                Ok(v) => {
                    tracing::info!(
                        endpoint = %probe.endpoint,
                        runtime = %v.runtime_name,
                        version = %v.runtime_version,
                        api = %v.runtime_api_version,
                        "found container runtime"
                    );
                    found.push((v.clone(), rt));
                }
                Err(e) => {
                    tracing::warn!(endpoint = %probe.endpoint, error = %e, "runtime candidate does not answer");
                    silent.push(probe.endpoint.to_string());
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
        let reason = if found.len() == 1 {
            PrimaryReason::Only
        } else {
            PrimaryReason::FirstFound("its Node was not asked".into())
        };
        Ok(Runtimes {
            found,
            reason,
            silent,
        })
    }

    /// A set holding one runtime, already known to answer.
    pub fn single(version: RuntimeVersion, runtime: RemoteRuntime) -> Self {
        Runtimes {
            found: vec![(version, runtime)],
            reason: PrimaryReason::Only,
            silent: Vec::new(),
        }
    }

    /// Whether which runtime is the kubelet's takes its Node: more than one answers, or one
    /// answers and another's socket is there but silent (the kubelet's may be restarting).
    pub fn ambiguous(&self) -> bool {
        self.several() || !self.silent.is_empty()
    }

    /// Why the daemon should wait rather than settle on what answers: the Node names the
    /// kubelet's runtime, none that answers is of that name, and a candidate is silent (it is
    /// likely the kubelet's, restarting). Settling would make another runtime primary for the
    /// life of the process. `None`: settle now.
    pub fn kubelets_is_silent(&self, node: &NodeRuntime) -> Option<String> {
        let NodeRuntime::Reported(reported) = node else {
            return None;
        };
        let (name, _) = split_container_id(reported);
        if self.silent.is_empty() || name.is_empty() {
            return None;
        }
        if self.found.iter().any(|(v, _)| v.runtime_name == name) {
            return None;
        }
        Some(format!(
            "the Node reports the kubelet's runtime {reported}, which does not answer here yet \
             (silent: {}; answering: {})",
            self.silent.join(", "),
            self.described(|_| true)
        ))
    }

    /// Whether more than one runtime answers: which is the kubelet's then takes its Node.
    pub fn several(&self) -> bool {
        self.found.len() > 1
    }

    /// Makes the runtime the Node reports the primary one (`node`: its
    /// `containerRuntimeVersion`, whose scheme is the runtime's name in `Version`, or why there
    /// is none). With one runtime, or when the Node names none that answers here, the primary
    /// stays the first found; [`Runtimes::primary_reason`] says which and why.
    pub fn choose_primary(&mut self, node: NodeRuntime) {
        if !self.several() {
            self.reason = PrimaryReason::Only;
            return;
        }
        let reported = match node {
            NodeRuntime::Reported(v) => v,
            NodeRuntime::Unknown(why) => {
                self.reason = PrimaryReason::FirstFound(why);
                return;
            }
        };
        let name = match split_container_id(&reported) {
            (name, _) if !name.is_empty() => name,
            _ => {
                self.reason = PrimaryReason::FirstFound(format!(
                    "its Node reports containerRuntimeVersion {reported:?}, which names no runtime"
                ));
                return;
            }
        };
        // the kubelet writes `<runtimeName>://<runtimeVersion>` of its runtime's `Version`
        // answer: the whole of it tells two runtimes of one name apart (k3s's containerd and
        // the host's); the name alone does where it is the only one of its name
        let whole = |v: &RuntimeVersion| format!("{}://{}", v.runtime_name, v.runtime_version);
        let exact: Vec<usize> = self.positions(|v| whole(v) == reported);
        let named: Vec<usize> = self.positions(|v| v.runtime_name == name);
        let chosen = match (exact.as_slice(), named.as_slice()) {
            ([i], _) | ([], [i]) => Ok(*i),
            ([], []) => Err(format!(
                "its Node reports {reported}, and no {name} answers here (only {})",
                self.described(|_| true)
            )),
            ([], _) => Err(format!(
                "its Node reports {reported}, and none of the {name} runtimes here answers as                  that version ({})",
                self.described(|v| v.runtime_name == name)
            )),
            _ => Err(format!(
                "its Node reports {reported}, and more than one runtime here answers as that ({});                  set --runtime-endpoint to the kubelet's",
                self.described(|v| whole(v) == reported)
            )),
        };
        match chosen {
            Ok(i) => {
                let kubelets = self.found.remove(i);
                self.found.insert(0, kubelets);
                self.reason = PrimaryReason::NodeReports(reported);
            }
            Err(why) => self.reason = PrimaryReason::FirstFound(why),
        }
    }

    /// Where the runtimes whose `Version` answer passes `keep` stand in the list.
    fn positions(&self, keep: impl Fn(&RuntimeVersion) -> bool) -> Vec<usize> {
        (0..self.found.len())
            .filter(|i| keep(&self.found[*i].0))
            .collect()
    }

    /// The runtimes whose `Version` answer passes `keep`, for a reason: each name alone where
    /// names differ, else `name version at endpoint`.
    fn described(&self, keep: impl Fn(&RuntimeVersion) -> bool) -> String {
        let kept: Vec<&(RuntimeVersion, RemoteRuntime)> =
            self.found.iter().filter(|(v, _)| keep(v)).collect();
        let names: std::collections::BTreeSet<&str> =
            kept.iter().map(|(v, _)| v.runtime_name.as_str()).collect();
        let parts: Vec<String> = if names.len() == kept.len() {
            kept.iter().map(|(v, _)| v.runtime_name.clone()).collect()
        } else {
            kept.iter()
                .map(|(v, rt)| {
                    format!(
                        "{} {} at {}",
                        v.runtime_name,
                        v.runtime_version,
                        rt.endpoint()
                    )
                })
                .collect()
        };
        parts.join(", ")
    }

    /// Why the primary runtime is the one it is.
    pub fn primary_reason(&self) -> &PrimaryReason {
        &self.reason
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

    /// The runtime whose name is `name`: of two with that name, the primary, else the first
    /// found (the kubelet's containers are all in its own runtime).
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

/// The daemon's handle on the node's runtimes: none until the daemon's runtime loop found them,
/// then the [`Runtimes`] it published. Cheap to clone: each controller holds one.
#[derive(Clone, Debug)]
pub struct RuntimeHandle(tokio::sync::watch::Receiver<Option<Runtimes>>);

impl RuntimeHandle {
    /// The handle on what `published` carries (the runtime loop's channel).
    pub fn new(published: tokio::sync::watch::Receiver<Option<Runtimes>>) -> Self {
        RuntimeHandle(published)
    }

    /// A handle on runtimes already found (tests, benches, one-shot commands).
    pub fn found(runtimes: Runtimes) -> Self {
        RuntimeHandle(tokio::sync::watch::channel(Some(runtimes)).1)
    }

    /// The primary runtime, once found; `None` when `cancel` fires first or the daemon's
    /// runtime loop ended without finding one. The one wait of every controller that needs
    /// the runtime before it starts.
    pub async fn wait_primary(
        &self,
        cancel: &tokio_util::sync::CancellationToken,
    ) -> Option<RemoteRuntime> {
        let mut runtimes = self.0.clone();
        loop {
            if let Some(r) = runtimes.borrow_and_update().as_ref() {
                return Some(r.primary().clone());
            }
            tokio::select! {
                () = cancel.cancelled() => return None,
                r = runtimes.changed() => r.ok()?,
            }
        }
    }

    /// The primary runtime if it is found already.
    pub fn primary_now(&self) -> Option<RemoteRuntime> {
        self.0.borrow().as_ref().map(|r| r.primary().clone())
    }

    /// The primary runtime's `Version` answer, once found.
    pub fn primary_version(&self) -> Option<RuntimeVersion> {
        self.0
            .borrow()
            .as_ref()
            .map(|r| r.primary_version().clone())
    }

    /// [`Runtimes::for_containers`] on the runtimes found; [`RuntimeLookupError::NotConnected`]
    /// before there are any.
    pub fn for_containers<'a>(
        &self,
        ids: impl IntoIterator<Item = &'a str>,
    ) -> Result<(RemoteRuntime, String), RuntimeLookupError> {
        let guard = self.0.borrow();
        let runtimes = guard.as_ref().ok_or(RuntimeLookupError::NotConnected)?;
        runtimes
            .for_containers(ids)
            .map(|(runtime, name)| (runtime.clone(), name))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A runtime answering `name` at `socket`. Its client needs a Tokio runtime (it dials
    /// lazily, on the first call, which these tests never make): the tests using it are async.
    fn runtime(name: &str, socket: &str) -> (RuntimeVersion, RemoteRuntime) {
        let version = RuntimeVersion {
            version: "0.1.0".into(),
            runtime_name: name.into(),
            runtime_version: "1".into(),
            runtime_api_version: "v1".into(),
        };
        let rt = RemoteRuntime::new(Endpoint::unix(socket), None, Timeouts::default());
        (version, rt)
    }

    /// A node with containerd (found first) and CRI-O.
    fn both() -> Runtimes {
        Runtimes {
            found: vec![
                runtime("containerd", "/run/containerd/containerd.sock"),
                runtime("cri-o", "/run/crio/crio.sock"),
            ],
            reason: PrimaryReason::FirstFound("its Node was not asked".into()),
            silent: Vec::new(),
        }
    }

    fn crio_only() -> Runtimes {
        let (v, rt) = runtime("cri-o", "/run/crio/crio.sock");
        Runtimes::single(v, rt)
    }

    fn socket(rt: &RemoteRuntime) -> String {
        rt.endpoint().to_string()
    }

    #[tokio::test]
    async fn waiting_for_the_primary_ends_when_the_runtimes_are_published_or_the_daemon_stops() {
        let (publish, published) = tokio::sync::watch::channel(None);
        let handle = RuntimeHandle::new(published);
        let cancel = tokio_util::sync::CancellationToken::new();
        assert!(matches!(
            handle.for_containers(["cri-o://c1"]),
            Err(RuntimeLookupError::NotConnected)
        ));
        let waiting = tokio::spawn({
            let (handle, cancel) = (handle.clone(), cancel.clone());
            async move { handle.wait_primary(&cancel).await }
        });
        publish.send_replace(Some(crio_only()));
        let primary = waiting.await.expect("the wait ends").expect("a runtime");
        assert_eq!(socket(&primary), "unix:///run/crio/crio.sock");
        let (runtime, name) = handle.for_containers(["cri-o://c1"]).expect("found");
        assert_eq!(
            (socket(&runtime).as_str(), name.as_str()),
            ("unix:///run/crio/crio.sock", "cri-o")
        );

        let (_publish, nothing) = tokio::sync::watch::channel(None);
        cancel.cancel();
        assert!(
            RuntimeHandle::new(nothing)
                .wait_primary(&cancel)
                .await
                .is_none()
        );
    }

    // The kubelet's container ID prefixes are `containerd://` and `cri-o://`, the runtime
    // names in `Version`: seen on containerd 2.3.4 / CRI-O 1.36.3, recorded in the project's
    // docs/runtimes.md ("Running them beside each other").

    #[test]
    fn a_kubelet_id_splits_into_the_runtime_name_and_the_runtimes_own_id() {
        assert_eq!(split_container_id("cri-o://4f1c2a"), ("cri-o", "4f1c2a"));
        assert_eq!(
            split_container_id("containerd://4f1c2a"),
            ("containerd", "4f1c2a")
        );
        assert_eq!(split_container_id("4f1c2a"), ("", "4f1c2a"));
        assert_eq!(split_container_id("docker://"), ("docker", ""));
    }

    #[tokio::test]
    async fn a_cri_o_id_goes_to_the_runtime_named_cri_o_and_a_bare_id_to_the_primary() {
        let r = both();
        let (rt, id) = r
            .for_container_id("cri-o://4f1c2a")
            .expect("cri-o is known");
        assert_eq!(
            (socket(rt).as_str(), id),
            ("unix:///run/crio/crio.sock", "4f1c2a")
        );
        let (rt, id) = r
            .for_container_id("containerd://4f1c2a")
            .expect("containerd is known");
        assert_eq!(
            (socket(rt).as_str(), id),
            ("unix:///run/containerd/containerd.sock", "4f1c2a")
        );
        let (rt, id) = r.for_container_id("4f1c2a").expect("the primary");
        assert_eq!(
            (socket(rt).as_str(), id),
            ("unix:///run/containerd/containerd.sock", "4f1c2a")
        );
        assert!(r.for_container_id("docker://4f1c2a").is_none());
    }

    #[tokio::test]
    async fn on_a_cri_o_node_a_containerd_id_names_no_runtime() {
        let r = crio_only();
        assert!(r.for_container_id("cri-o://4f1c2a").is_some());
        assert!(r.for_container_id("containerd://4f1c2a").is_none());
    }

    #[tokio::test]
    async fn a_pods_cri_o_ids_find_cri_o_by_that_name_and_no_id_yet_finds_the_primary() {
        let r = both();
        let (rt, name) = r
            .for_containers(["cri-o://a", "", "cri-o://b"])
            .expect("one runtime type");
        assert_eq!(
            (socket(rt).as_str(), name.as_str()),
            ("unix:///run/crio/crio.sock", "cri-o")
        );
        let (rt, name) = r.for_containers(["", ""]).expect("no ID yet");
        assert_eq!(
            (socket(rt).as_str(), name.as_str()),
            ("unix:///run/containerd/containerd.sock", "containerd")
        );
        let (_, name) = crio_only().for_containers([]).expect("no ID yet");
        assert_eq!(name, "cri-o");
    }

    #[tokio::test]
    async fn a_pod_with_ids_of_two_runtimes_or_of_an_unknown_one_is_refused_in_kruise_daemons_words()
     {
        let r = both();
        let e = r
            .for_containers(["cri-o://a", "containerd://b"])
            .expect_err("mixed types");
        assert_eq!(
            e.to_string(),
            "has different runtime types containerd, cri-o in Pod"
        );
        let e = crio_only()
            .for_containers(["containerd://b"])
            .expect_err("no containerd on a CRI-O node");
        assert_eq!(
            e.to_string(),
            "not found runtime service for containerd://b in daemon"
        );
    }

    // The Node's status.nodeInfo.containerRuntimeVersion is `<Version's runtimeName>://<its
    // runtimeVersion>`, as the kubelet writes it from CRI Version (`fmt.Sprintf("%s://%s",
    // runtimeType, runtimeVersion)`, kubernetes pkg/kubelet/nodestatus/setters.go
    // `VersionInfo`): `containerd://2.1.9`, `cri-o://1.36.3`, the same names as the kubelet's
    // container IDs. kruise #1825: kruise-daemon took the first runtime found.

    #[tokio::test]
    async fn the_runtime_the_node_reports_becomes_the_primary_and_says_why() {
        let mut r = both();
        r.choose_primary(NodeRuntime::Reported("cri-o://1.36.3".into()));
        assert_eq!(r.primary_version().runtime_name, "cri-o");
        assert_eq!(socket(r.primary()), "unix:///run/crio/crio.sock");
        assert_eq!(
            r.primary_reason(),
            &PrimaryReason::NodeReports("cri-o://1.36.3".into())
        );
        assert!(r.primary_reason().to_string().contains("cri-o://1.36.3"));
        let names: Vec<&str> = r.all().map(|(v, _)| v.runtime_name.as_str()).collect();
        assert_eq!(
            names,
            ["cri-o", "containerd"],
            "the other one is still there"
        );
        let (rt, name) = r.for_containers([]).expect("no ID yet: the primary");
        assert_eq!(
            (socket(rt).as_str(), name.as_str()),
            ("unix:///run/crio/crio.sock", "cri-o")
        );
        assert!(r.for_container_id("containerd://a").is_some());
    }

    #[tokio::test]
    async fn without_word_from_the_node_the_first_found_stays_primary_and_the_reason_says_why() {
        let mut r = both();
        r.choose_primary(NodeRuntime::Unknown("kruised may not read Node n1".into()));
        assert_eq!(r.primary_version().runtime_name, "containerd");
        assert!(r.primary_reason().is_fallback());
        assert!(
            r.primary_reason()
                .to_string()
                .contains("kruised may not read Node n1")
        );
        let mut r = both();
        r.choose_primary(NodeRuntime::Reported("docker://27.0.1".into()));
        assert_eq!(r.primary_version().runtime_name, "containerd");
        assert_eq!(
            r.primary_reason(),
            &PrimaryReason::FirstFound(
                "its Node reports docker://27.0.1, and no docker answers here (only containerd, cri-o)"
                    .into()
            )
        );
        let mut r = both();
        r.choose_primary(NodeRuntime::Reported(String::new()));
        assert!(r.primary_reason().is_fallback(), "{}", r.primary_reason());
    }

    /// A runtime answering `name` `version` at `socket`.
    fn runtime_at(name: &str, version: &str, socket: &str) -> (RuntimeVersion, RemoteRuntime) {
        let (mut v, rt) = runtime(name, socket);
        v.runtime_version = version.into();
        (v, rt)
    }

    /// A k3s node with the host's containerd 1.6 found first and k3s's own containerd 2.1.
    fn host_and_k3s() -> Runtimes {
        Runtimes {
            found: vec![
                runtime_at(
                    "containerd",
                    "1.6.20~ds1",
                    "/run/containerd/containerd.sock",
                ),
                runtime_at(
                    "containerd",
                    "v2.1.5-k3s1",
                    "/run/k3s/containerd/containerd.sock",
                ),
                runtime_at("cri-o", "1.36.3", "/run/crio/crio.sock"),
            ],
            reason: PrimaryReason::FirstFound("its Node was not asked".into()),
            silent: Vec::new(),
        }
    }

    // before: discovery kept the first socket of each name, so on a k3s node with the host's
    // containerd at /run/containerd images went to the host's, never to the kubelet's
    #[tokio::test]
    async fn of_two_containerds_the_one_answering_the_version_the_node_reports_is_primary() {
        let mut r = host_and_k3s();
        r.choose_primary(NodeRuntime::Reported("containerd://v2.1.5-k3s1".into()));
        assert_eq!(
            socket(r.primary()),
            "unix:///run/k3s/containerd/containerd.sock"
        );
        assert!(!r.primary_reason().is_fallback());
        let (rt, name) = r
            .for_containers(["containerd://abc"])
            .expect("a containerd ID");
        assert_eq!(
            (socket(rt).as_str(), name.as_str()),
            ("unix:///run/k3s/containerd/containerd.sock", "containerd"),
            "the kubelet's containers are looked up in the kubelet's containerd"
        );
        let mut r = host_and_k3s();
        r.choose_primary(NodeRuntime::Reported("containerd://1.6.20~ds1".into()));
        assert_eq!(
            socket(r.primary()),
            "unix:///run/containerd/containerd.sock"
        );
    }

    #[tokio::test]
    async fn of_two_containerds_neither_at_the_reported_version_the_first_stays_and_says_which() {
        let mut r = host_and_k3s();
        r.choose_primary(NodeRuntime::Reported("containerd://2.2.0".into()));
        assert_eq!(
            socket(r.primary()),
            "unix:///run/containerd/containerd.sock"
        );
        let why = r.primary_reason().to_string();
        assert!(r.primary_reason().is_fallback(), "{why}");
        assert!(
            why.contains("containerd 1.6.20~ds1 at unix:///run/containerd/containerd.sock")
                && why.contains(
                    "containerd v2.1.5-k3s1 at unix:///run/k3s/containerd/containerd.sock"
                )
                && !why.contains("cri-o"),
            "{why}"
        );
    }

    #[tokio::test]
    async fn two_runtimes_answering_the_same_name_and_version_leave_the_choice_to_the_operator() {
        let mut r = Runtimes {
            found: vec![
                runtime_at("containerd", "2.1.9", "/run/containerd/containerd.sock"),
                runtime_at("containerd", "2.1.9", "/run/k3s/containerd/containerd.sock"),
            ],
            reason: PrimaryReason::FirstFound("its Node was not asked".into()),
            silent: Vec::new(),
        };
        r.choose_primary(NodeRuntime::Reported("containerd://2.1.9".into()));
        let why = r.primary_reason().to_string();
        assert!(r.primary_reason().is_fallback(), "{why}");
        assert!(why.contains("--runtime-endpoint"), "{why}");
    }

    #[tokio::test]
    async fn a_silent_socket_beside_the_runtime_that_answers_waits_for_the_one_the_node_names() {
        // issue 43, row 13: kruised started while the kubelet's containerd restarted beside
        // CRI-O; the one that answered became primary for the life of the process
        let mut r = crio_only();
        assert!(!r.ambiguous(), "one runtime, nothing silent: no Node asked");
        r.silent
            .push("unix:///run/containerd/containerd.sock".into());
        assert!(r.ambiguous());
        let containerd = NodeRuntime::Reported("containerd://2.1.9".into());
        let why = r
            .kubelets_is_silent(&containerd)
            .expect("wait for containerd");
        assert!(
            why.contains("containerd://2.1.9") && why.contains("/run/containerd/containerd.sock"),
            "{why}"
        );
        // the Node names the one that answers, or cannot say: settle on what answers
        let crio = NodeRuntime::Reported("cri-o://1.36.3".into());
        assert_eq!(r.kubelets_is_silent(&crio), None);
        let unknown = NodeRuntime::Unknown("kruised may not read Node n1".into());
        assert_eq!(r.kubelets_is_silent(&unknown), None);
        r.silent.clear();
        assert_eq!(r.kubelets_is_silent(&containerd), None, "nothing silent");
    }

    #[tokio::test]
    async fn one_runtime_is_the_primary_whatever_the_node_says() {
        let mut r = crio_only();
        r.choose_primary(NodeRuntime::Reported("containerd://2.1.9".into()));
        assert_eq!(r.primary_version().runtime_name, "cri-o");
        assert_eq!(r.primary_reason(), &PrimaryReason::Only);
        assert!(!r.several());
    }
}
