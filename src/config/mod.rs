//! The daemon's settings, validated once from the command line: [`DaemonConfig`] (what
//! `kruised run` runs with), [`features`] (kruise's feature gates) and [`runtime`] (where the
//! container runtime is: flags, environment, crictl.yaml, detection), with the parsers of the
//! values kruise-daemon and crictl write (Go booleans, durations, sizes).

pub mod features;
pub mod runtime;

use std::path::PathBuf;
use std::time::Duration;

pub use features::FeatureGates;
pub use runtime::{CrictlFile, DEFAULT_CRICTL_CONFIG, RuntimeArgs, RuntimeConfig};

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
    /// The node's IPs (`--node-ips`): connections from them always get an admin slot.
    pub node_ips: Vec<std::net::IpAddr>,
    /// kubeconfig file, if given.
    pub kubeconfig: Option<PathBuf>,
    /// Client-side request rate.
    pub qps: f64,
    /// Client-side burst.
    pub burst: u32,
    /// Time limit of each API call but watches.
    pub api_request_timeout: Duration,
    /// Most pulls at once; `None`: unlimited.
    pub max_pull_workers: Option<usize>,
    /// Most pre-pulls at once; `None`: unlimited.
    pub max_prepulls: Option<usize>,
    /// Feature gates in effect.
    pub gates: FeatureGates,
    /// Namespace of pull secrets.
    pub config_namespace: String,
    /// Free space floor of the image filesystem, bytes (0: no check).
    pub image_fs_min_free: u64,
    /// The kubelet's image GC high threshold, percent (admission by size).
    pub image_gc_high_threshold_percent: u8,
    /// The image filesystem's path as the daemon sees it; `None`: the runtime's mount point.
    pub image_fs_path: Option<std::path::PathBuf>,
    /// A pull that lands nothing for this long fails; `None`: never (`0s`).
    pub image_pull_stall_timeout: Option<Duration>,
    /// Relist interval.
    pub relist_interval: Duration,
    /// Drain deadline.
    pub drain_timeout: Duration,
    /// When stale-env restarts happen.
    pub env_restart_delay: RestartDelay,
    /// Pods container meta reconciles at once.
    pub containermeta_workers: usize,
    /// An in-place update whose unready window is longer gets an event on its pod; `None`:
    /// never (`--slow-in-place-update-threshold 0s`).
    pub slow_in_place_update: Option<Duration>,
    /// The kubelet's credential provider plugins, where they are.
    pub credential_providers: CredentialProviders,
    /// The startup taint kruised removes from its Node once the warm set is pulled
    /// (`--startup-taint`); `None`: off.
    pub startup_taint: Option<StartupTaint>,
    /// kruise-daemon flags given that mean nothing here, and stray arguments (logged once).
    pub ignored: Vec<String>,
    /// Flags unknown to kruised, accepted because it runs as `kruise-daemon` (`--name` each;
    /// logged as a warning and counted in `kruised_unknown_flags`).
    pub unknown_flags: Vec<String>,
    /// The runtime.
    pub runtime: RuntimeConfig,
}

/// Where the kubelet's credential provider plugins are (`--plugin-config-file`,
/// `--plugin-bin-dir`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CredentialProviders {
    /// The `CredentialProviderConfig` file; no plugins when it does not exist.
    pub config_file: PathBuf,
    /// The directory of the plugins' executables.
    pub bin_dir: PathBuf,
}

/// `--startup-taint` and its deadline: which taint of its own Node kruised removes, at the
/// latest how long after the Node's creation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StartupTaint {
    /// The taint's key (every taint with it, whatever its value and effect).
    pub key: String,
    /// The longest the Node keeps it, counted from the Node's creation.
    pub deadline: Duration,
}

/// Checks a taint key as the API server does (a qualified name: an optional DNS subdomain
/// prefix and `/`, then a name of at most 63 alphanumerics, `-`, `_`, `.`, alphanumeric at both
/// ends); says what is wrong.
pub fn check_taint_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && alnum(name.chars().next())
        && alnum(name.chars().last())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !name_ok {
        return Err(format!(
            "{key:?} is not a taint key: the name (after an optional `prefix/`) must be 1 to 63 \
             letters, digits, '-', '_' or '.', beginning and ending with a letter or digit"
        ));
    }
    if let Some(p) = prefix {
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && l.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        if p.is_empty() || p.len() > 253 || !p.split('.').all(label_ok) {
            return Err(format!(
                "{key:?} is not a taint key: its prefix {p:?} must be a DNS subdomain \
                 (lowercase, e.g. kruised.io)"
            ));
        }
    }
    Ok(())
}

/// Default client-side request rate (controller-runtime 0.20's default, as kruise-daemon has).
pub const DEFAULT_QPS: f64 = 20.0;
/// Default client-side burst.
pub const DEFAULT_BURST: u32 = 30;
/// Pods container meta reconciles at once unless `--containermeta-workers` says otherwise
/// (kruised's number since it began; kruise-daemon's is 5).
pub const DEFAULT_CONTAINERMETA_WORKERS: usize = 4;
/// The most `--containermeta-workers` may ask for: far more than a node's pods need at once.
pub const MAX_CONTAINERMETA_WORKERS: usize = 256;

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

/// `--image-pull-stall-timeout`'s default: a registry or link that sends nothing for a minute
/// is not coming back within the pull's timeout either.
pub const DEFAULT_IMAGE_PULL_STALL_TIMEOUT: Duration = Duration::from_secs(60);
/// `--image-pull-stall-timeout`'s bounds (or 0, off): below a second is one poll of the
/// runtime's ingests; above an hour is no stall detection.
pub const IMAGE_PULL_STALL_TIMEOUT_BOUNDS: (Duration, Duration) =
    (Duration::from_secs(1), Duration::from_secs(3600));

/// The longest duration any flag takes (a year): past it a deadline computed from "now" would
/// overflow the clock and panic the task that computes it.
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// Parses `1h`, `2m`, `30s`, `500ms`, or a bare number of seconds; at most [`MAX_DURATION`].
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
    if secs > MAX_DURATION.as_secs_f64() {
        return Err(format!("{s:?} is too long: at most 8760h (a year)"));
    }
    Duration::try_from_secs_f64(secs).map_err(|e| format!("{s:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn taint_keys_are_checked_like_the_api_server_checks_them() {
        for ok in [
            "warming",
            "kruised.io/warming",
            "node.example.com/image-warm_set.1",
        ] {
            assert!(check_taint_key(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "/warming",
            "kruised.io/",
            "-warming",
            "Kruised.IO/w",
            "a/b/c",
            "w arm",
        ] {
            assert!(check_taint_key(bad).is_err(), "{bad:?}");
        }
        assert!(check_taint_key(&"w".repeat(64)).is_err());
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
    fn a_duration_past_a_year_is_refused_by_the_parser_not_a_panic_later() {
        assert_eq!(parse_duration("8760h").unwrap(), MAX_DURATION);
        for huge in [
            "16000000000000000000",
            "16000000000000000000s",
            "8761h",
            "1000000000000000000000000000000h",
        ] {
            let err = parse_duration(huge).unwrap_err();
            assert!(err.contains("too long"), "{huge}: {err}");
        }
    }
}
