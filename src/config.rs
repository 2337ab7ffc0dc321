//! The command line: flags and environment, compatible with kruise-daemon where the meaning is
//! the same and with crictl for the runtime, validated into typed settings once.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use clap::Args;

use crate::cri::endpoint::{DEFAULT_HOST_RUN_DIR, KRUISE_HOST_RUN_DIR};
use crate::cri::{Endpoint, EndpointSource, Timeouts};

/// crictl's configuration file, read when no endpoint is given by flag or environment.
pub const DEFAULT_CRICTL_CONFIG: &str = "/etc/crictl.yaml";

/// A refused setting: names the setting and says why.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A value cannot be used.
    #[error("{setting}: {reason}")]
    Invalid {
        /// The flag, variable or file key.
        setting: String,
        /// Why it is refused.
        reason: String,
    },
    /// Two settings contradict each other.
    #[error("{a} and {b} cannot be used together: {reason}")]
    Conflict {
        /// One setting.
        a: &'static str,
        /// The other.
        b: &'static str,
        /// Why.
        reason: &'static str,
    },
    /// A configuration file could not be read or parsed.
    #[error("cannot read {path}: {reason}")]
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
}

/// Arguments of `kruised run`. Flags keep kruise-daemon's names where they mean the same.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The node this daemon serves (kruise-daemon: the NODE_NAME env, from the downward API).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,
    /// Address of the admin server: /healthz, /readyz, /metrics. Go-style `:10221` binds all
    /// interfaces.
    #[arg(long, default_value = ":10221")]
    pub addr: String,
    /// kubeconfig file; default: KUBECONFIG, then in-cluster, then ~/.kube/config.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Client-side limit of API requests per second (0: the default, 20).
    #[arg(long, default_value_t = 0.0)]
    pub rest_config_qps: f64,
    /// Client-side burst of API requests (0: the default, 30).
    #[arg(long, default_value_t = 0)]
    pub rest_config_burst: u32,
    /// Most image pulls at once; 0 or less: no limit (kruise-daemon's default is -1).
    #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
    pub max_workers_for_pull_image: i32,
    /// Feature gates, kruise syntax: `A=true,B=false`; kruise's gate names.
    #[arg(long, default_value = "")]
    pub feature_gates: String,
    /// Namespace of image pull secrets (kruise's convention).
    #[arg(
        long,
        env = "KRUISED_CONFIG_NAMESPACE",
        default_value = "kruise-daemon-config"
    )]
    pub config_namespace: String,
    /// Free space the image filesystem must keep: a pull that would start below it fails with a
    /// message instead of filling the disk. `0` turns the check off. E.g. `5Gi`, `500Mi`.
    #[arg(long, value_parser = parse_size, default_value = "0")]
    pub image_fs_min_free: u64,
    /// How often the runtime is relisted in the absence of events.
    #[arg(long, value_parser = parse_duration, default_value = "5m")]
    pub relist_interval: Duration,
    /// How long SIGTERM waits for in-flight work before exiting.
    #[arg(long, value_parser = parse_duration, default_value = "8s")]
    pub drain_timeout: Duration,
    /// When a container whose env from metadata went stale is stopped: `auto` (as soon as the
    /// kubelet is known to recreate it with the new values), or a fixed delay after the change
    /// (kruise-daemon waits 1s; `0s` stops at once, for benchmarks).
    #[arg(long, default_value = "auto")]
    pub env_restart_delay: RestartDelay,
    /// How to reach the container runtime.
    #[command(flatten)]
    pub runtime: RuntimeArgs,
    /// kubelet credential provider plugins (kruise-daemon's flag): a `CredentialProviderConfig`
    /// file (`kubelet.config.k8s.io/v1`). Used when it exists; kruise's default path.
    #[arg(long, default_value = DEFAULT_PLUGIN_CONFIG_FILE)]
    pub plugin_config_file: PathBuf,
    /// Where the credential provider plugins' executables are (kruise-daemon's flag).
    #[arg(long, default_value = DEFAULT_PLUGIN_BIN_DIR)]
    pub plugin_bin_dir: PathBuf,
    /// kruise-daemon's and klog's other flags: accepted so that kruise's Helm chart runs
    /// kruised unchanged, logged once as ignored.
    #[command(flatten)]
    pub compat: KruiseDaemonCompat,
}

/// kruise's default credential provider config file.
pub const DEFAULT_PLUGIN_CONFIG_FILE: &str = "/kruise/CredentialProviderPlugin.yaml";
/// kruise's default credential provider plugin directory.
pub const DEFAULT_PLUGIN_BIN_DIR: &str = "/kruise/plugins";

/// Go's `strconv.ParseBool`, which kruise-daemon's boolean flags and feature gates use.
pub fn parse_go_bool(s: &str) -> Result<bool, String> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(format!(
            "{s:?} is not a boolean (1, t, true, 0, f, false, ...)"
        )),
    }
}

/// Every flag kruise-daemon accepts (v1.9 and HEAD: `cmd/daemon/main.go`, klog v2's flag set,
/// and the manager flags its imports register) that means nothing to kruised. Booleans take
/// `--x` or `--x=<bool>` and never the next argument, as in Go's pflag; values take `--x v` or
/// `--x=v`.
#[derive(Clone, Debug, Default, Args)]
#[command(next_help_heading = "kruise-daemon compatibility (accepted, ignored)")]
pub struct KruiseDaemonCompat {
    /// Go pprof server (kruised has none).
    #[arg(long, hide = true, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    pub enable_pprof: Option<bool>,
    /// Go pprof address.
    #[arg(long, hide = true)]
    pub pprof_addr: Option<String>,
    /// klog verbosity (`-v=4` too): kruised's log level is RUST_LOG.
    #[arg(short = 'v', long = "v", hide = true, allow_negative_numbers = true)]
    pub v: Option<i32>,
    #[arg(long = "logtostderr", hide = true, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    logtostderr: Option<bool>,
    #[arg(long = "alsologtostderr", hide = true, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    alsologtostderr: Option<bool>,
    #[arg(long = "add_dir_header", hide = true, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    add_dir_header: Option<bool>,
    #[arg(long = "skip_headers", hide = true, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    skip_headers: Option<bool>,
    #[arg(long = "one_output", hide = true, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    one_output: Option<bool>,
    #[arg(long = "skip_log_headers", hide = true, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    skip_log_headers: Option<bool>,
    #[arg(long = "log_dir", hide = true)]
    log_dir: Option<String>,
    #[arg(long = "log_file", hide = true)]
    log_file: Option<String>,
    #[arg(long = "log_file_max_size", hide = true)]
    log_file_max_size: Option<String>,
    #[arg(long = "stderrthreshold", hide = true)]
    stderrthreshold: Option<String>,
    #[arg(long = "vmodule", hide = true)]
    vmodule: Option<String>,
    #[arg(long = "log_backtrace_at", hide = true)]
    log_backtrace_at: Option<String>,
    #[arg(long, hide = true, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    cloneset_scaling_exclude_preparing_delete: Option<bool>,
    #[arg(long, hide = true, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    disable_no_deepcopy: Option<bool>,
    #[arg(long, hide = true)]
    sidecarset_workers: Option<String>,
    #[arg(long, hide = true)]
    statefulset_workers: Option<String>,
    #[arg(long, hide = true)]
    protection_log_path: Option<String>,
    #[arg(long, hide = true)]
    expectation_timeout: Option<String>,
    #[arg(long, hide = true)]
    rate_limiter_base_delay: Option<String>,
    #[arg(long, hide = true)]
    rate_limiter_max_delay: Option<String>,
    #[arg(long, hide = true)]
    rate_limiter_qps: Option<String>,
    #[arg(long, hide = true)]
    rate_limiter_bucket_size: Option<String>,
    /// Arguments that are no flag (Go's pflag collects them and kruise-daemon ignores them,
    /// e.g. the `false` of `--enable-pprof false`).
    #[arg(hide = true)]
    pub positional: Vec<String>,
}

impl KruiseDaemonCompat {
    /// The compatibility flags that were given, as `--name`, for the log line saying they are
    /// ignored.
    pub fn given(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut seen = |name: &str, given: bool| {
            if given {
                out.push(format!("--{name}"));
            }
        };
        seen("enable-pprof", self.enable_pprof.is_some());
        seen("pprof-addr", self.pprof_addr.is_some());
        seen("v", self.v.is_some());
        seen("logtostderr", self.logtostderr.is_some());
        seen("alsologtostderr", self.alsologtostderr.is_some());
        seen("add_dir_header", self.add_dir_header.is_some());
        seen("skip_headers", self.skip_headers.is_some());
        seen("one_output", self.one_output.is_some());
        seen("skip_log_headers", self.skip_log_headers.is_some());
        seen("log_dir", self.log_dir.is_some());
        seen("log_file", self.log_file.is_some());
        seen("log_file_max_size", self.log_file_max_size.is_some());
        seen("stderrthreshold", self.stderrthreshold.is_some());
        seen("vmodule", self.vmodule.is_some());
        seen("log_backtrace_at", self.log_backtrace_at.is_some());
        seen(
            "cloneset-scaling-exclude-preparing-delete",
            self.cloneset_scaling_exclude_preparing_delete.is_some(),
        );
        seen("disable-no-deepcopy", self.disable_no_deepcopy.is_some());
        seen("sidecarset-workers", self.sidecarset_workers.is_some());
        seen("statefulset-workers", self.statefulset_workers.is_some());
        seen("protection-log-path", self.protection_log_path.is_some());
        seen("expectation-timeout", self.expectation_timeout.is_some());
        seen(
            "rate-limiter-base-delay",
            self.rate_limiter_base_delay.is_some(),
        );
        seen(
            "rate-limiter-max-delay",
            self.rate_limiter_max_delay.is_some(),
        );
        seen("rate-limiter-qps", self.rate_limiter_qps.is_some());
        seen(
            "rate-limiter-bucket-size",
            self.rate_limiter_bucket_size.is_some(),
        );
        out
    }
}

/// How restarts wait for the kubelet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RestartDelay {
    /// As soon as the kubelet is known to hold the new pod
    /// (`controller::containermeta::settle` says how that is known).
    Auto,
    /// A fixed delay after the change (`Duration::ZERO`: at once).
    Fixed(Duration),
}

impl std::str::FromStr for RestartDelay {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "auto" {
            return Ok(RestartDelay::Auto);
        }
        parse_duration(s)
            .map(RestartDelay::Fixed)
            .map_err(|e| format!("{e} (or \"auto\")"))
    }
}

/// Settings of `kruised run`, validated.
#[derive(Clone, Debug)]
pub struct DaemonConfig {
    /// The node.
    pub node_name: String,
    /// Admin server address.
    pub addr: std::net::SocketAddr,
    /// kubeconfig file, if given.
    pub kubeconfig: Option<PathBuf>,
    /// Client-side request rate.
    pub qps: f64,
    /// Client-side burst.
    pub burst: u32,
    /// Most pulls at once; `None`: unlimited.
    pub max_pull_workers: Option<usize>,
    /// Feature gates in effect.
    pub gates: FeatureGates,
    /// Namespace of pull secrets.
    pub config_namespace: String,
    /// Free space floor of the image filesystem, bytes (0: no check).
    pub image_fs_min_free: u64,
    /// Relist interval.
    pub relist_interval: Duration,
    /// Drain deadline.
    pub drain_timeout: Duration,
    /// When stale-env restarts happen.
    pub env_restart_delay: RestartDelay,
    /// Credential provider plugin config file (used if it exists) and plugin directory.
    pub credential_providers: (PathBuf, PathBuf),
    /// kruise-daemon flags given that mean nothing here, and stray arguments (logged once).
    pub ignored: Vec<String>,
    /// The runtime.
    pub runtime: RuntimeConfig,
}

/// Default client-side request rate (controller-runtime 0.20's default, as kruise-daemon has).
pub const DEFAULT_QPS: f64 = 20.0;
/// Default client-side burst.
pub const DEFAULT_BURST: u32 = 30;

impl RunArgs {
    /// Validates the flags into a [`DaemonConfig`].
    pub fn resolve(&self) -> Result<DaemonConfig, ConfigError> {
        let invalid = |setting: &str, reason: String| ConfigError::Invalid {
            setting: setting.to_string(),
            reason,
        };
        let node_name = self
            .node_name
            .clone()
            .filter(|n| !n.trim().is_empty())
            .ok_or_else(|| {
                invalid(
                    "NODE_NAME",
                    "required: set the NODE_NAME environment variable (spec.nodeName through the \
                     downward API) or --node-name"
                        .into(),
                )
            })?;
        let addr =
            crate::addr::parse_addr(&self.addr).map_err(|e| invalid("--addr", e.to_string()))?;
        if !self.rest_config_qps.is_finite() || self.rest_config_qps < 0.0 {
            return Err(invalid("--rest-config-qps", "must be 0 or more".into()));
        }
        let qps = if self.rest_config_qps == 0.0 {
            DEFAULT_QPS
        } else {
            self.rest_config_qps
        };
        let burst = if self.rest_config_burst == 0 {
            DEFAULT_BURST
        } else {
            self.rest_config_burst
        };
        // as kruise: only a positive number limits, 0 and negative mean no limit
        let max_pull_workers = usize::try_from(self.max_workers_for_pull_image)
            .ok()
            .filter(|n| *n > 0);
        let gates = FeatureGates::parse(&self.feature_gates)?;
        if self.config_namespace.is_empty() {
            return Err(invalid("--config-namespace", "empty".into()));
        }
        if self.relist_interval < Duration::from_secs(1) {
            return Err(invalid("--relist-interval", "must be at least 1s".into()));
        }
        Ok(DaemonConfig {
            node_name,
            addr,
            kubeconfig: self.kubeconfig.clone(),
            qps,
            burst,
            max_pull_workers,
            gates,
            config_namespace: self.config_namespace.clone(),
            image_fs_min_free: self.image_fs_min_free,
            relist_interval: self.relist_interval,
            drain_timeout: self.drain_timeout,
            env_restart_delay: self.env_restart_delay,
            credential_providers: (self.plugin_config_file.clone(), self.plugin_bin_dir.clone()),
            ignored: {
                let mut ignored = self.compat.given();
                ignored.extend(self.compat.positional.iter().map(|a| format!("{a:?}")));
                ignored
            },
            runtime: self.runtime.resolve()?,
        })
    }
}

/// kruise's feature gates that change what the daemon does, with kruise's defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FeatureGates {
    /// Watch the node's pods: container meta and env-from-metadata restarts.
    pub daemon_watching_pod: bool,
    /// Restart containers whose env-from-metadata changed (needs DaemonWatchingPod).
    pub in_place_update_env_from_metadata: bool,
    /// Run NodePodProbe probes.
    pub pod_probe_marker: bool,
    /// Pre-pull the images of later in-place batches (kruised's own; not in kruise).
    pub prepull_next_batch: bool,
}

impl Default for FeatureGates {
    fn default() -> Self {
        FeatureGates {
            daemon_watching_pod: true,
            in_place_update_env_from_metadata: true,
            pod_probe_marker: true,
            prepull_next_batch: true,
        }
    }
}

/// Every gate kruise defines (`pkg/features/kruise_features.go`). The chart passes one
/// `--feature-gates` value to manager and daemon, so the manager's gates must be accepted too;
/// those do nothing here.
const KRUISE_GATES: &[&str] = &[
    "KruiseDaemon",
    "PodWebhook",
    "CloneSetShortHash",
    "KruisePodReadinessGate",
    "PreDownloadImageForInPlaceUpdate",
    "CloneSetPartitionRollback",
    "ResourcesDeletionProtection",
    "PodUnavailableBudgetDeleteGate",
    "PodUnavailableBudgetUpdateGate",
    "WorkloadSpread",
    "DaemonWatchingPod",
    "TemplateNoDefaults",
    "InPlaceUpdateEnvFromMetadata",
    "StatefulSetAutoDeletePVC",
    "SidecarSetPatchPodMetadataDefaultsAllowed",
    "SidecarTerminator",
    "PodProbeMarkerGate",
    "PreDownloadImageForDaemonSetUpdate",
    "CloneSetEventHandlerOptimization",
    "PreparingUpdateAsUpdate",
    "ImagePullJobGate",
    "ResourceDistributionGate",
    "DeletionProtectionForCRDCascadingGate",
    "EnhancedLivenessProbe",
    "RecreatePodWhenChangeVCTInCloneSetGate",
    "StatefulSetStartOrdinal",
    "PodIndexLabel",
    "EnableExternalCerts",
    "StatefulSetAutoResizePVCGate",
    "InPlaceWorkloadVerticalScaling",
    "EnablePodProbeMarkerOnServerless",
    "EnableSortSidecarContainerByName",
    "InPlacePodVerticalScaling",
    "ForceDeleteTimeoutExpectationGate",
    "DefaultHostNetworkHostPortsInPodTemplates",
    "DaemonSetPruneIneligibleNodes",
    "AllAlpha",
    "AllBeta",
];

/// kruised's own gate for pre-pulling the next in-place batch.
const PREPULL_NEXT_BATCH: &str = "PrePullNextBatch";

impl FeatureGates {
    /// Parses `A=true,B=false`. Unknown names and values that are not booleans are refused.
    /// `KruiseDaemon=false` turns every daemon capability off, as it does in kruise.
    pub fn parse(s: &str) -> Result<Self, ConfigError> {
        let mut g = FeatureGates::default();
        let mut daemon = true;
        // component-base: AllBeta=<v> sets every beta gate not set explicitly (the daemon's
        // gates are all beta in kruise); AllAlpha touches none of them
        let mut all_beta = None;
        let mut explicit = std::collections::HashSet::new();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let invalid = |reason: String| ConfigError::Invalid {
                setting: format!("--feature-gates {item}"),
                reason,
            };
            let (name, value) = item
                .split_once('=')
                .ok_or_else(|| invalid("missing bool value: expected NAME=true|false".into()))?;
            let (name, value) = (name.trim(), value.trim());
            let on = parse_go_bool(value).map_err(invalid)?;
            explicit.insert(name.to_string());
            match name {
                "DaemonWatchingPod" => g.daemon_watching_pod = on,
                "InPlaceUpdateEnvFromMetadata" => g.in_place_update_env_from_metadata = on,
                "PodProbeMarkerGate" => g.pod_probe_marker = on,
                "KruiseDaemon" => daemon = on,
                "AllBeta" => all_beta = Some(on),
                PREPULL_NEXT_BATCH => g.prepull_next_batch = on,
                n if KRUISE_GATES.contains(&n) => {}
                _ => return Err(invalid(format!("unrecognized feature gate: {name}"))),
            }
        }
        if let Some(on) = all_beta {
            let unset = |n: &str| !explicit.contains(n);
            if unset("DaemonWatchingPod") {
                g.daemon_watching_pod = on;
            }
            if unset("InPlaceUpdateEnvFromMetadata") {
                g.in_place_update_env_from_metadata = on;
            }
            if unset("PodProbeMarkerGate") {
                g.pod_probe_marker = on;
            }
            if unset("KruiseDaemon") {
                daemon = on;
            }
        }
        if !daemon {
            g.daemon_watching_pod = false;
            g.in_place_update_env_from_metadata = false;
            g.pod_probe_marker = false;
            g.prepull_next_batch = false;
        }
        if !g.daemon_watching_pod {
            // both need the pod watch
            g.in_place_update_env_from_metadata = false;
            g.prepull_next_batch = false;
        }
        Ok(g)
    }
}

/// Output format of the inspection commands.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    /// A table.
    #[default]
    Table,
    /// JSON.
    Json,
}

/// Arguments of `kruised hash`.
#[derive(Debug, Args)]
pub struct HashArgs {
    /// The Pod manifest; `-` or nothing reads stdin.
    pub file: Option<String>,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t)]
    pub output: OutputFormat,
}

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

/// Arguments of `kruised version`.
#[derive(Debug, Args)]
pub struct VersionArgs {
    /// How to reach the runtime.
    #[command(flatten)]
    pub runtime: RuntimeArgs,
    /// Print only kruised's own version; do not contact the runtime.
    #[arg(long)]
    pub client_only: bool,
}

/// How to reach the container runtime (crictl's flags, plus kruise-daemon's `--socket-file`).
#[derive(Clone, Debug, Default, Args)]
pub struct RuntimeArgs {
    /// CRI runtime endpoint, e.g. unix:///run/containerd/containerd.sock. Default: crictl.yaml,
    /// else detection over the well-known sockets under --host-run-dir.
    #[arg(short = 'r', long, env = "CONTAINER_RUNTIME_ENDPOINT")]
    pub runtime_endpoint: Option<String>,
    /// CRI image endpoint, if different from the runtime endpoint.
    #[arg(short = 'i', long, env = "IMAGE_SERVICE_ENDPOINT")]
    pub image_endpoint: Option<String>,
    /// kruise-daemon compatible: the runtime socket's name relative to the host run directory;
    /// empty (kruise's chart passes `--socket-file=`): detect.
    #[arg(long, env = "KRUISED_SOCKET_FILE")]
    pub socket_file: Option<String>,
    /// Where the host's /var/run is visible. Default: kruise's mount /hostvarrun when it exists,
    /// then /var/run.
    #[arg(long, env = "KRUISED_HOST_RUN_DIR")]
    pub host_run_dir: Option<PathBuf>,
    /// Timeout of ordinary CRI calls (crictl's --timeout): e.g. 2s, 500ms.
    #[arg(short = 't', long, value_parser = parse_duration)]
    pub timeout: Option<Duration>,
    /// crictl configuration file.
    #[arg(short = 'c', long = "config", env = "CRI_CONFIG_FILE")]
    pub crictl_config: Option<PathBuf>,
}

/// Where the runtime is and how long calls may take, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeConfig {
    /// Where to find the runtime.
    pub source: EndpointSource,
    /// A separate image service, if any.
    pub image_endpoint: Option<Endpoint>,
    /// Call limits.
    pub timeouts: Timeouts,
    /// What was ignored on the way (a broken crictl.yaml at the default path), to log.
    pub warnings: Vec<String>,
}

/// crictl's configuration file (`crictl.yaml`): crictl's keys, all optional. Any other key is
/// refused, naming the key, as crictl refuses it.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct CrictlFile {
    /// The runtime endpoint.
    pub runtime_endpoint: Option<String>,
    /// The image endpoint.
    pub image_endpoint: Option<String>,
    /// Timeout of calls, whole seconds.
    pub timeout: Option<u64>,
    /// crictl's debug mode.
    pub debug: Option<bool>,
    /// crictl's `create` pulls the image first (accepted; kruised has no `create`).
    pub pull_image_on_create: Option<bool>,
    /// crictl's `run` does not pull (accepted; kruised has no `run`).
    pub disable_pull_on_run: Option<bool>,
    /// crictl's connection retries (accepted; kruised fails within the timeout instead).
    pub max_retries: Option<i64>,
}

fn endpoint(setting: &str, value: &str) -> Result<Endpoint, ConfigError> {
    Endpoint::from_str(value).map_err(|e| ConfigError::Invalid {
        setting: setting.to_string(),
        reason: e.to_string(),
    })
}

fn read_crictl_file(path: &Path, required: bool) -> Result<CrictlFile, ConfigError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => {
            return Ok(CrictlFile::default());
        }
        Err(e) => {
            return Err(ConfigError::File {
                path: path.to_path_buf(),
                reason: e.to_string(),
            });
        }
    };
    if text.trim().is_empty() {
        return Ok(CrictlFile::default());
    }
    serde_saphyr::from_str(&text).map_err(|e| ConfigError::File {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

impl RuntimeArgs {
    /// The directories where the host's `/var/run` may be: the one given, else kruise's mount
    /// `/hostvarrun` when it exists, then `/var/run`. Never empty.
    pub fn host_run_dirs(&self) -> Vec<PathBuf> {
        match &self.host_run_dir {
            Some(d) => vec![d.clone()],
            None if Path::new(KRUISE_HOST_RUN_DIR).is_dir() => {
                vec![KRUISE_HOST_RUN_DIR.into(), DEFAULT_HOST_RUN_DIR.into()]
            }
            None => vec![DEFAULT_HOST_RUN_DIR.into()],
        }
    }

    /// The crictl configuration file in effect: `--config` / `CRI_CONFIG_FILE`, else
    /// `/etc/crictl.yaml`.
    pub fn crictl_file_path(&self) -> PathBuf {
        self.crictl_config
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_CRICTL_CONFIG))
    }

    /// Reads the crictl configuration file. A missing default file reads as empty; a missing
    /// file named by `--config` is an error, and so are bad YAML and unknown keys.
    pub fn crictl_file(&self) -> Result<CrictlFile, ConfigError> {
        read_crictl_file(&self.crictl_file_path(), self.crictl_config.is_some())
    }

    /// Validates the flags into a [`RuntimeConfig`]. Precedence: flag or environment, then
    /// crictl.yaml, then detection.
    pub fn resolve(&self) -> Result<RuntimeConfig, ConfigError> {
        self.resolve_with(Timeouts::default())
    }

    /// [`RuntimeArgs::resolve`] with `defaults` as the time limits when neither `--timeout`
    /// nor crictl.yaml sets one (`kruised crictl` uses crictl's 2 s).
    pub fn resolve_with(&self, defaults: Timeouts) -> Result<RuntimeConfig, ConfigError> {
        if self.runtime_endpoint.is_some()
            && self.socket_file.as_deref().is_some_and(|n| !n.is_empty())
        {
            return Err(ConfigError::Conflict {
                a: "--runtime-endpoint",
                b: "--socket-file",
                reason: "both name the runtime socket; give one",
            });
        }
        // validate what the flags say before reading any file, so their errors come first
        let flag_endpoint = self
            .runtime_endpoint
            .as_deref()
            .map(|e| endpoint("--runtime-endpoint", e))
            .transpose()?;
        let flag_image_endpoint = self
            .image_endpoint
            .as_deref()
            .map(|e| endpoint("--image-endpoint", e))
            .transpose()?;
        let file_path = self.crictl_file_path();
        let mut warnings = Vec::new();
        let file = if self.runtime_endpoint.is_some() && self.image_endpoint.is_some() {
            CrictlFile::default()
        } else {
            match self.crictl_file() {
                Ok(f) => f,
                // as crictl: only a file named explicitly must be right; a broken default one is
                // skipped (said in the log), so a typo there never keeps the daemon from starting
                Err(e) if self.crictl_config.is_none() => {
                    warnings.push(format!("ignoring {}: {e}", file_path.display()));
                    CrictlFile::default()
                }
                Err(e) => return Err(e),
            }
        };
        let host_run_dirs = self.host_run_dirs();
        let socket_file = self.socket_file.as_deref().filter(|n| !n.is_empty());
        let source = if let Some(e) = flag_endpoint {
            EndpointSource::Explicit(e)
        } else if let Some(name) = socket_file {
            EndpointSource::SocketFile {
                host_run_dir: host_run_dirs[0].clone(),
                name: name.to_string(),
            }
        } else if let Some(e) = file.runtime_endpoint.as_deref().filter(|e| !e.is_empty()) {
            EndpointSource::Explicit(endpoint(
                &format!("runtime-endpoint in {}", file_path.display()),
                e,
            )?)
        } else {
            EndpointSource::Detect { host_run_dirs }
        };
        let image_endpoint = match (flag_image_endpoint, &file.image_endpoint) {
            (Some(e), _) => Some(e),
            (None, Some(e)) if !e.is_empty() => Some(endpoint(
                &format!("image-endpoint in {}", file_path.display()),
                e,
            )?),
            _ => None,
        };
        let mut timeouts = defaults;
        if let Some(t) = self.timeout.or(file.timeout.map(Duration::from_secs)) {
            if t.is_zero() {
                return Err(ConfigError::Invalid {
                    setting: "--timeout".into(),
                    reason: "must be more than zero".into(),
                });
            }
            timeouts.call = t;
            timeouts.connect = t;
        }
        Ok(RuntimeConfig {
            source,
            image_endpoint,
            timeouts,
            warnings,
        })
    }
}

/// Parses a size: bytes, or with a unit `Ki` `Mi` `Gi` `Ti` (powers of 1024) or `K` `M` `G` `T`
/// (powers of 1000), as Kubernetes quantities write them.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size (e.g. 0, 500Mi, 5Gi)"))?;
    let factor: u64 = match unit {
        "" => 1,
        "K" | "k" => 1000,
        "M" => 1000_u64.pow(2),
        "G" => 1000_u64.pow(3),
        "T" => 1000_u64.pow(4),
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        _ => {
            return Err(format!(
                "{s:?}: unknown unit {unit:?} (use Ki, Mi, Gi, Ti, K, M, G, T)"
            ));
        }
    };
    n.checked_mul(factor)
        .ok_or_else(|| format!("{s:?} is too large"))
}

/// Parses `1h`, `2m`, `30s`, `500ms`, or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (e.g. 500ms, 2s, 1m)"))?;
    let secs = match unit {
        "" | "s" => value,
        "ms" => value / 1000.0,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (use ms, s, m or h)")),
    };
    Duration::try_from_secs_f64(secs).map_err(|e| format!("{s:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_args() -> RunArgs {
        use clap::Parser;
        #[derive(Parser)]
        struct Wrap {
            #[command(flatten)]
            run: RunArgs,
        }
        let mut w = Wrap::parse_from(["run", "--node-name", "n1"]);
        w.run.runtime = args();
        w.run
    }

    fn args() -> RuntimeArgs {
        RuntimeArgs {
            host_run_dir: Some("/hostvarrun".into()),
            // never read the machine's real /etc/crictl.yaml in tests
            crictl_config: Some("/nonexistent/crictl.yaml".into()),
            ..Default::default()
        }
    }

    #[test]
    fn feature_gates_follow_kruise_names_and_defaults() {
        assert_eq!(FeatureGates::parse("").unwrap(), FeatureGates::default());
        let g = FeatureGates::parse("DaemonWatchingPod=false, PodProbeMarkerGate=true").unwrap();
        assert!(!g.daemon_watching_pod && !g.in_place_update_env_from_metadata);
        assert!(g.pod_probe_marker);
        // the manager's gates arrive in the same flag from the chart: accepted, no effect
        assert_eq!(
            FeatureGates::parse("ImagePullJobGate=true,AllAlpha=false").unwrap(),
            FeatureGates::default()
        );
        let off = FeatureGates::parse("KruiseDaemon=false").unwrap();
        assert!(!off.daemon_watching_pod && !off.pod_probe_marker);
    }

    #[test]
    fn unknown_feature_gates_and_bad_values_are_refused_by_name() {
        let err = FeatureGates::parse("NoSuchGate=true")
            .unwrap_err()
            .to_string();
        assert!(err.contains("NoSuchGate"), "{err}");
        let err = FeatureGates::parse("DaemonWatchingPod=yes")
            .unwrap_err()
            .to_string();
        assert!(err.contains("DaemonWatchingPod=yes"), "{err}");
        assert!(FeatureGates::parse("DaemonWatchingPod").is_err());
    }

    #[test]
    fn gate_values_parse_like_go_strconv_parse_bool() {
        for v in ["1", "t", "T", "TRUE", "true", "True"] {
            let g =
                FeatureGates::parse(&format!("PodProbeMarkerGate=false,PodProbeMarkerGate={v}"));
            assert!(g.unwrap().pod_probe_marker, "{v}");
        }
        for v in ["0", "f", "F", "FALSE", "false", "False"] {
            let g = FeatureGates::parse(&format!("PodProbeMarkerGate={v}"));
            assert!(!g.unwrap().pod_probe_marker, "{v}");
        }
        for v in ["yes", "tRuE", "2", ""] {
            assert!(
                FeatureGates::parse(&format!("PodProbeMarkerGate={v}")).is_err(),
                "{v:?} is no Go boolean"
            );
        }
    }

    #[test]
    fn every_gate_kruise_defines_at_1_9_and_head_is_accepted() {
        // the manager's gates arrive in the same flag (kruise's chart passes one value to both)
        let all = KRUISE_GATES
            .iter()
            .map(|g| format!("{g}=true"))
            .collect::<Vec<_>>()
            .join(",");
        assert!(FeatureGates::parse(&all).is_ok());
        for g in [
            "ImagePullJobGate",
            "ForceDeleteTimeoutExpectationGate",
            "DefaultHostNetworkHostPortsInPodTemplates",
            "DaemonSetPruneIneligibleNodes",
            "EnablePodProbeMarkerOnServerless",
        ] {
            assert!(KRUISE_GATES.contains(&g), "{g}");
        }
        let chart =
            FeatureGates::parse("ImagePullJobGate=true,ForceDeleteTimeoutExpectationGate=true")
                .unwrap();
        assert_eq!(chart, FeatureGates::default());
    }

    #[test]
    fn all_beta_false_turns_the_daemon_gates_off_unless_set_explicitly() {
        let g = FeatureGates::parse("AllBeta=false").unwrap();
        assert!(
            !g.daemon_watching_pod && !g.pod_probe_marker && !g.in_place_update_env_from_metadata
        );
        let g =
            FeatureGates::parse("AllBeta=false,KruiseDaemon=true,PodProbeMarkerGate=true").unwrap();
        assert!(g.pod_probe_marker && !g.daemon_watching_pod);
        // as in kruise, KruiseDaemon=false (here through AllBeta) overrides everything
        let g = FeatureGates::parse("AllBeta=false,PodProbeMarkerGate=true").unwrap();
        assert!(!g.pod_probe_marker);
        assert_eq!(
            FeatureGates::parse("AllAlpha=true").unwrap(),
            FeatureGates::default()
        );
    }

    #[test]
    fn zero_and_negative_pull_workers_mean_no_limit() {
        let empty = tempfile::NamedTempFile::new().unwrap();
        for (n, limit) in [
            (-1, None),
            (0, None),
            (-5, None),
            (1, Some(1)),
            (4, Some(4)),
        ] {
            let mut r = RunArgs {
                max_workers_for_pull_image: n,
                ..run_args()
            };
            r.runtime.crictl_config = Some(empty.path().to_path_buf());
            assert_eq!(r.resolve().unwrap().max_pull_workers, limit, "{n}");
        }
    }

    #[test]
    fn an_empty_socket_file_means_detection() {
        let empty = tempfile::NamedTempFile::new().unwrap();
        let mut a = args();
        a.crictl_config = Some(empty.path().to_path_buf());
        a.socket_file = Some(String::new());
        assert_eq!(
            a.resolve().unwrap().source,
            EndpointSource::Detect {
                host_run_dirs: vec!["/hostvarrun".into()]
            }
        );
        a.socket_file = Some("k3s/containerd/containerd.sock".into());
        assert_eq!(
            a.resolve().unwrap().source,
            EndpointSource::SocketFile {
                host_run_dir: "/hostvarrun".into(),
                name: "k3s/containerd/containerd.sock".into()
            }
        );
        // kruise's chart passes --socket-file= beside no endpoint: no conflict
        a.socket_file = Some(String::new());
        a.runtime_endpoint = Some("unix:///run/x.sock".into());
        assert!(a.resolve().is_ok());
    }

    #[test]
    fn without_a_host_run_dir_detection_looks_at_kruises_mount_first_when_it_exists() {
        let a = RuntimeArgs::default();
        let dirs = a.host_run_dirs();
        assert_eq!(dirs.last(), Some(&PathBuf::from("/var/run")));
        if Path::new("/hostvarrun").is_dir() {
            assert_eq!(dirs[0], PathBuf::from("/hostvarrun"));
        } else {
            assert_eq!(dirs.len(), 1);
        }
    }

    #[test]
    fn sizes_parse_like_kubernetes_quantities() {
        assert_eq!(parse_size("0").unwrap(), 0);
        assert_eq!(parse_size("5Gi").unwrap(), 5 << 30);
        assert_eq!(parse_size("500M").unwrap(), 500_000_000);
        assert!(parse_size("5GB").is_err());
        assert!(parse_size("-1").is_err());
    }

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("2s").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("1m").unwrap(), Duration::from_secs(60));
        assert_eq!(parse_duration("3").unwrap(), Duration::from_secs(3));
        assert!(parse_duration("2 weeks").is_err());
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn runtime_endpoint_and_socket_file_together_are_refused() {
        let a = RuntimeArgs {
            runtime_endpoint: Some("unix:///run/x.sock".into()),
            socket_file: Some("x.sock".into()),
            ..args()
        };
        let err = a.resolve().unwrap_err().to_string();
        assert!(
            err.contains("--runtime-endpoint") && err.contains("--socket-file"),
            "{err}"
        );
    }

    #[test]
    fn an_explicit_crictl_config_that_is_missing_is_an_error() {
        let err = args().resolve().unwrap_err().to_string();
        assert!(err.contains("/nonexistent/crictl.yaml"), "{err}");
    }

    #[test]
    fn crictl_yaml_supplies_endpoints_and_timeout_when_no_flag_does() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("crictl.yaml");
        std::fs::write(
            &path,
            "runtime-endpoint: unix:///run/k3s/containerd/containerd.sock\n\
             image-endpoint: unix:///run/images.sock\ntimeout: 7\ndebug: false\n",
        )
        .unwrap();
        let a = RuntimeArgs {
            crictl_config: Some(path),
            ..args()
        };
        let c = a.resolve().unwrap();
        assert_eq!(
            c.source,
            EndpointSource::Explicit(Endpoint::unix("/run/k3s/containerd/containerd.sock"))
        );
        assert_eq!(c.image_endpoint, Some(Endpoint::unix("/run/images.sock")));
        assert_eq!(c.timeouts.call, Duration::from_secs(7));
    }

    #[test]
    fn an_unknown_key_in_crictl_yaml_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("crictl.yaml");
        std::fs::write(&path, "runtime-endpoint: /run/x.sock\nbogus-key: 1\n").unwrap();
        let a = RuntimeArgs {
            crictl_config: Some(path),
            ..args()
        };
        let err = a.resolve().unwrap_err().to_string();
        assert!(err.contains("bogus-key"), "{err}");
        // crictl's own keys are all accepted
        let path = dir.path().join("all.yaml");
        std::fs::write(
            &path,
            "runtime-endpoint: /run/x.sock\nimage-endpoint: /run/y.sock\ntimeout: 3\n\
             debug: true\npull-image-on-create: false\ndisable-pull-on-run: false\n\
             max-retries: 0\n",
        )
        .unwrap();
        let a = RuntimeArgs {
            crictl_config: Some(path),
            ..args()
        };
        assert_eq!(a.crictl_file().unwrap().debug, Some(true));
        assert_eq!(
            a.resolve().unwrap().timeouts,
            Timeouts {
                connect: Duration::from_secs(3),
                call: Duration::from_secs(3)
            }
        );
    }

    #[test]
    fn the_default_timeouts_apply_only_when_nothing_sets_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("crictl.yaml");
        std::fs::write(&path, "").unwrap();
        let two = Timeouts {
            connect: Duration::from_secs(2),
            call: Duration::from_secs(2),
        };
        let a = RuntimeArgs {
            crictl_config: Some(path),
            ..args()
        };
        assert_eq!(a.resolve_with(two).unwrap().timeouts, two);
        let a = RuntimeArgs {
            timeout: Some(Duration::from_millis(500)),
            ..a
        };
        assert_eq!(
            a.resolve_with(two).unwrap().timeouts.call,
            Duration::from_millis(500)
        );
    }

    #[test]
    fn flags_win_over_crictl_yaml() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("crictl.yaml");
        std::fs::write(&path, "runtime-endpoint: unix:///run/file.sock\n").unwrap();
        let a = RuntimeArgs {
            runtime_endpoint: Some("/run/flag.sock".into()),
            crictl_config: Some(path),
            ..args()
        };
        assert_eq!(
            a.resolve().unwrap().source,
            EndpointSource::Explicit(Endpoint::unix("/run/flag.sock"))
        );
    }

    #[test]
    fn no_endpoint_anywhere_means_detection_under_the_host_run_dir() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("crictl.yaml");
        std::fs::write(&path, "").unwrap();
        let a = RuntimeArgs {
            crictl_config: Some(path),
            ..args()
        };
        assert_eq!(
            a.resolve().unwrap().source,
            EndpointSource::Detect {
                host_run_dirs: vec!["/hostvarrun".into()]
            }
        );
    }

    #[test]
    fn a_bad_endpoint_names_the_setting() {
        let a = RuntimeArgs {
            runtime_endpoint: Some("tcp://1.2.3.4:5".into()),
            ..args()
        };
        let err = a.resolve().unwrap_err().to_string();
        assert!(err.starts_with("--runtime-endpoint:"), "{err}");
    }
}
