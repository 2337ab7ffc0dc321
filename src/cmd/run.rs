//! `kruised run`: the daemon's flags (kruise-daemon's names where they mean the same, and
//! every other flag of kruise-daemon accepted and ignored, so kruise's Helm chart runs kruised
//! unchanged), validated into a [`DaemonConfig`] for [`crate::daemon::run`]. Flags unknown to
//! kruised are refused here; under the name `kruise-daemon` they were taken out before parsing
//! (`super::take_unknown_flags`) and arrive in [`RunArgs::unknown_flags`].

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use crate::config::{
    ConfigError, CredentialProviders, DEFAULT_BURST, DEFAULT_CONTAINERMETA_WORKERS, DEFAULT_QPS,
    DaemonConfig, FeatureGates, MAX_CONTAINERMETA_WORKERS, RestartDelay, RuntimeArgs,
    parse_duration, parse_go_bool, parse_size,
};

/// Runs the daemon until it is told to stop.
pub(crate) async fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    crate::daemon::run(args.resolve()?).await
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
    /// The node's IPs, comma-separated (the DaemonSet passes `status.hostIP`): with loopback
    /// and the pod's default gateways, connections from them (the kubelet's probes) always get
    /// an admin slot, however many tenants' pods hold.
    #[arg(long, env = "HOST_IPS", value_delimiter = ',')]
    pub node_ips: Vec<std::net::IpAddr>,
    /// kubeconfig file; default: KUBECONFIG, then in-cluster, then ~/.kube/config.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Client-side limit of API requests per second (0: the default, 20).
    #[arg(long, default_value_t = 0.0)]
    pub rest_config_qps: f64,
    /// Client-side burst of API requests (0: the default, 30).
    #[arg(long, default_value_t = 0)]
    pub rest_config_burst: u32,
    /// Time limit of each API request but watches, answer included (kubectl's
    /// --request-timeout): a call past it fails and is retried, on a new connection where the
    /// old one went silent.
    #[arg(long, value_parser = parse_duration, default_value = "30s")]
    pub api_request_timeout: Duration,
    /// Most image pulls at once; 0 or less: no limit (kruise-daemon's default is -1).
    #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
    pub max_workers_for_pull_image: i32,
    /// Most pre-pulls (NodeImage tags, next in-place batches) at once; 0: no limit. They also
    /// count against --max-workers-for-pull-image, and wait while a pod on the node waits for
    /// its own image (README, "Pre-pulling").
    #[arg(long, default_value_t = 4)]
    pub max_concurrent_prepulls: usize,
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
    /// With --image-fs-min-free set, NodeImage and next-batch pulls are admitted by the image's
    /// size (read from its registry manifest, times a ratio learned on the node) only if they
    /// keep the floor and the image filesystem's use below this percent: the kubelet's
    /// imageGCHighThresholdPercent. An in-place update's pull keeps the floor only. Past it (or
    /// below the floor), the images kruised holds pinned give way, oldest first.
    #[arg(long, default_value = "85", value_parser = clap::value_parser!(u8).range(1..=100))]
    pub image_gc_high_threshold_percent: u8,
    /// The image filesystem as the daemon sees it, for the statvfs of the size admission and of
    /// the pins giving way. Default: the mount point the runtime reports (CRI ImageFsInfo;
    /// containerd: /var/lib/containerd...), which the DaemonSet mounts read-only at the same path.
    #[arg(long, env = "KRUISED_IMAGE_FS_PATH")]
    pub image_fs_path: Option<std::path::PathBuf>,
    /// A pull that lands no byte for this long fails (and is retried as its NodeImage tag's
    /// `backoffLimit` says), whatever its `timeoutSeconds`; a pull that keeps landing bytes is
    /// not cut off by `timeoutSeconds` (then the time without a byte), only by
    /// `activeDeadlineSeconds`. Needs a runtime that shows what a pull has landed (containerd's
    /// content service, on its CRI socket); elsewhere (CRI-O) pulls have no stall timeout and
    /// `timeoutSeconds` is a wall clock, as in kruise. From 1s to 1h; `0s` turns it off.
    #[arg(long, value_parser = parse_duration, default_value = "60s")]
    pub image_pull_stall_timeout: Duration,
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
    /// Pods container meta reconciles at once (kruise-daemon's flag from kruise PR #2423, whose
    /// default is 5; kruised's is 4).
    #[arg(long, allow_negative_numbers = true)]
    pub containermeta_workers: Option<i64>,
    /// An in-place update whose pod stays unready longer than this (from `InPlaceUpdateReady`
    /// False to `Ready` again) gets a Warning event `InPlaceUpdateSlow` on the pod with its
    /// timeline; `0s` turns the event off. The default is the longest a default pod's update
    /// takes without a pull: the default termination grace (30 s) plus a start and a few
    /// default readiness probe periods (10 s).
    #[arg(long, value_parser = parse_duration, default_value = "60s")]
    pub slow_in_place_update_threshold: Duration,
    /// A warm set for new nodes (off unless given): the key of a taint on kruised's own Node
    /// (e.g. put there by the kubelet's `--register-with-taints`) that kruised removes, every
    /// taint with that key and no other, once the NodeImage tags listed when it starts have
    /// finished (succeeded, or failed for good) or --startup-taint-deadline has passed,
    /// whichever comes first, then never looks at it again. Needs `patch` on nodes
    /// (deploy/overlays/startup-taint; docs/security.md).
    #[arg(long, value_name = "KEY")]
    pub startup_taint: Option<String>,
    /// The longest the Node keeps --startup-taint, counted from the Node's creation (so a
    /// restart of kruised does not extend it): from 1s to 24h.
    #[arg(long, value_parser = parse_duration, default_value = "10m")]
    pub startup_taint_deadline: Duration,
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
    /// Flags kruised does not know, taken out of the command line because the binary runs as
    /// `kruise-daemon` (never filled by the parser itself): logged as a warning at start.
    #[arg(skip)]
    pub unknown_flags: Vec<String>,
}

/// The shortest `--relist-interval`.
const MIN_RELIST: Duration = Duration::from_secs(1);
/// The longest `--relist-interval`: a day (a relist is the safety net for lost events).
const MAX_RELIST: Duration = Duration::from_secs(24 * 3600);
/// The longest `--api-request-timeout`: an hour (a call stuck that long is a lost call).
const MAX_API_REQUEST_TIMEOUT: Duration = Duration::from_secs(3600);
/// The longest `--drain-timeout`: ten minutes (kubelets and systemd kill long before).
const MAX_DRAIN_TIMEOUT: Duration = Duration::from_secs(600);

/// The longest `--startup-taint-deadline`: a day (a node kept from pods longer is a lost node).
const MAX_STARTUP_TAINT_DEADLINE: Duration = Duration::from_secs(24 * 3600);

/// kruise's default credential provider config file.
pub const DEFAULT_PLUGIN_CONFIG_FILE: &str = "/kruise/CredentialProviderPlugin.yaml";
/// kruise's default credential provider plugin directory.
pub const DEFAULT_PLUGIN_BIN_DIR: &str = "/kruise/plugins";

/// Every flag kruise-daemon accepts (v1.9 and HEAD: `cmd/daemon/main.go`, klog v2's flag set,
/// and the manager flags its imports register; the spec's §6.1 at kruise 07169cf), and those
/// of kruise pull requests a chart may pass first (#2423), that mean nothing to kruised.
/// Booleans take `--x` or `--x=<bool>` and never the next argument, as in Go's pflag; values
/// take `--x v` or `--x=v`.
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
    /// kruise PR #2423: workers of kruise-daemon's container restart queue. kruised has no such
    /// pool: each stop runs on a task of its own, so no number of workers limits or delays it.
    #[arg(long, hide = true)]
    containermeta_restart_workers: Option<String>,
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
        seen(
            "containermeta-restart-workers",
            self.containermeta_restart_workers.is_some(),
        );
        out
    }
}

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
        if self.api_request_timeout < Duration::from_secs(1) {
            return Err(invalid(
                "--api-request-timeout",
                "must be at least 1s".into(),
            ));
        }
        // as kruise: only a positive number limits, 0 and negative mean no limit
        let max_pull_workers = usize::try_from(self.max_workers_for_pull_image)
            .ok()
            .filter(|n| *n > 0);
        let gates = FeatureGates::parse(&self.feature_gates)?;
        if self.config_namespace.is_empty() {
            return Err(invalid("--config-namespace", "empty".into()));
        }
        if !(MIN_RELIST..=MAX_RELIST).contains(&self.relist_interval) {
            return Err(invalid(
                "--relist-interval",
                "must be from 1s to 24h".into(),
            ));
        }
        if self.api_request_timeout > MAX_API_REQUEST_TIMEOUT {
            return Err(invalid(
                "--api-request-timeout",
                "must be at most 1h".into(),
            ));
        }
        if self.drain_timeout > MAX_DRAIN_TIMEOUT {
            return Err(invalid("--drain-timeout", "must be at most 10m".into()));
        }
        let (stall_min, stall_max) = crate::config::IMAGE_PULL_STALL_TIMEOUT_BOUNDS;
        let stall = self.image_pull_stall_timeout;
        if !stall.is_zero() && !(stall_min..=stall_max).contains(&stall) {
            return Err(invalid(
                "--image-pull-stall-timeout",
                format!("{stall:?}: must be from 1s to 1h, or 0s to turn it off"),
            ));
        }
        let containermeta_workers = match self.containermeta_workers {
            None => DEFAULT_CONTAINERMETA_WORKERS,
            Some(n) => usize::try_from(n)
                .ok()
                .filter(|n| (1..=MAX_CONTAINERMETA_WORKERS).contains(n))
                .ok_or_else(|| {
                    invalid(
                        "--containermeta-workers",
                        format!("{n}: must be from 1 to {MAX_CONTAINERMETA_WORKERS}"),
                    )
                })?,
        };
        let startup_taint = match self.startup_taint.as_deref().filter(|k| !k.is_empty()) {
            None => None,
            Some(key) => {
                crate::config::check_taint_key(key).map_err(|e| invalid("--startup-taint", e))?;
                let deadline = self.startup_taint_deadline;
                if !(Duration::from_secs(1)..=MAX_STARTUP_TAINT_DEADLINE).contains(&deadline) {
                    return Err(invalid(
                        "--startup-taint-deadline",
                        "must be from 1s to 24h".into(),
                    ));
                }
                Some(crate::config::StartupTaint {
                    key: key.to_string(),
                    deadline,
                })
            }
        };
        Ok(DaemonConfig {
            node_name,
            addr,
            node_ips: self.node_ips.clone(),
            kubeconfig: self.kubeconfig.clone(),
            qps,
            burst,
            api_request_timeout: self.api_request_timeout,
            max_pull_workers,
            max_prepulls: Some(self.max_concurrent_prepulls).filter(|n| *n > 0),
            gates,
            config_namespace: self.config_namespace.clone(),
            image_fs_min_free: self.image_fs_min_free,
            image_gc_high_threshold_percent: self.image_gc_high_threshold_percent,
            image_fs_path: self.image_fs_path.clone(),
            image_pull_stall_timeout: Some(stall).filter(|d| !d.is_zero()),
            relist_interval: self.relist_interval,
            drain_timeout: self.drain_timeout,
            env_restart_delay: self.env_restart_delay,
            containermeta_workers,
            slow_in_place_update: Some(self.slow_in_place_update_threshold)
                .filter(|d| !d.is_zero()),
            credential_providers: CredentialProviders {
                config_file: self.plugin_config_file.clone(),
                bin_dir: self.plugin_bin_dir.clone(),
            },
            startup_taint,
            ignored: {
                let mut ignored = self.compat.given();
                ignored.extend(self.compat.positional.iter().map(|a| format!("{a:?}")));
                ignored
            },
            unknown_flags: self.unknown_flags.clone(),
            runtime: self.runtime.resolve()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::runtime::tests::args;

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
    fn api_calls_are_limited_to_30s_unless_told_and_never_below_a_second() {
        let empty = tempfile::NamedTempFile::new().unwrap();
        let mut r = run_args();
        r.runtime.crictl_config = Some(empty.path().to_path_buf());
        // k8s::client::CALL_TIMEOUT, which this layer may not name
        assert_eq!(
            r.resolve().unwrap().api_request_timeout,
            Duration::from_secs(30)
        );
        r.api_request_timeout = Duration::from_secs(5);
        assert_eq!(
            r.resolve().unwrap().api_request_timeout,
            Duration::from_secs(5)
        );
        r.api_request_timeout = Duration::from_millis(500);
        let err = r.resolve().unwrap_err().to_string();
        assert!(err.contains("--api-request-timeout"), "{err}");
    }

    #[test]
    fn a_huge_relist_interval_timeout_or_drain_is_refused_at_start_by_name() {
        let empty = tempfile::NamedTempFile::new().unwrap();
        let base = || {
            let mut r = run_args();
            r.runtime.crictl_config = Some(empty.path().to_path_buf());
            r
        };
        let year = crate::config::MAX_DURATION;
        type Set = fn(&mut RunArgs, Duration);
        let cases: [(&str, Set); 3] = [
            ("--relist-interval", |r, d| r.relist_interval = d),
            ("--api-request-timeout", |r, d| r.api_request_timeout = d),
            ("--drain-timeout", |r, d| r.drain_timeout = d),
        ];
        for (flag, set) in cases {
            let mut r = base();
            set(&mut r, year);
            let err = r.resolve().unwrap_err().to_string();
            assert!(err.contains(flag), "{flag}: {err}");
        }
        let mut r = base();
        r.relist_interval = Duration::from_secs(24 * 3600);
        assert!(r.resolve().is_ok(), "a day is a relist interval");
    }

    #[test]
    fn the_startup_taint_is_off_unless_named_and_a_bad_key_or_deadline_is_refused_by_name() {
        let empty = tempfile::NamedTempFile::new().unwrap();
        let mut r = run_args();
        r.runtime.crictl_config = Some(empty.path().to_path_buf());
        assert_eq!(r.resolve().unwrap().startup_taint, None, "off by default");
        r.startup_taint = Some("kruised.io/warming".into());
        let t = r.resolve().unwrap().startup_taint.unwrap();
        assert_eq!(
            (t.key.as_str(), t.deadline),
            ("kruised.io/warming", Duration::from_secs(600))
        );
        r.startup_taint = Some("Not A Key".into());
        let err = r.resolve().unwrap_err().to_string();
        assert!(err.contains("--startup-taint:"), "{err}");
        r.startup_taint = Some("kruised.io/warming".into());
        for d in [Duration::ZERO, Duration::from_secs(24 * 3600 + 1)] {
            r.startup_taint_deadline = d;
            let err = r.resolve().unwrap_err().to_string();
            assert!(err.contains("--startup-taint-deadline"), "{d:?}: {err}");
        }
    }
}
