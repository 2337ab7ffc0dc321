//! The command line: flags and environment, compatible with kruise-daemon where the meaning is
//! the same and with crictl for the runtime, validated into typed settings once.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::cri::{Endpoint, EndpointSource, Timeouts, endpoint::DEFAULT_HOST_RUN_DIR};
use crate::telemetry::LogFormat;

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

/// kruised: the node side of OpenKruise in-place updates and image pre-pulling.
#[derive(Debug, Parser)]
#[command(name = "kruised", version, about, propagate_version = true)]
pub struct Cli {
    /// Log format.
    #[arg(
        long,
        global = true,
        value_enum,
        default_value_t,
        env = "KRUISED_LOG_FORMAT"
    )]
    pub log_format: LogFormat,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print kruised's version and the container runtime's.
    Version(VersionArgs),
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
    /// kruise-daemon compatible: the runtime socket's name relative to --host-run-dir.
    #[arg(long, env = "KRUISED_SOCKET_FILE")]
    pub socket_file: Option<String>,
    /// Where the host's /var/run is visible (in a DaemonSet, where it is mounted).
    #[arg(long, env = "KRUISED_HOST_RUN_DIR", default_value = DEFAULT_HOST_RUN_DIR)]
    pub host_run_dir: PathBuf,
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
}

/// The keys of crictl.yaml that matter here; others are ignored, as crictl ignores them.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
struct CrictlFile {
    runtime_endpoint: Option<String>,
    image_endpoint: Option<String>,
    timeout: Option<u64>,
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
    /// Validates the flags into a [`RuntimeConfig`]. Precedence: flag or environment, then
    /// crictl.yaml, then detection.
    pub fn resolve(&self) -> Result<RuntimeConfig, ConfigError> {
        if self.runtime_endpoint.is_some() && self.socket_file.is_some() {
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
        let file_path = self
            .crictl_config
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_CRICTL_CONFIG));
        let file = if self.runtime_endpoint.is_some() && self.image_endpoint.is_some() {
            CrictlFile::default()
        } else {
            read_crictl_file(&file_path, self.crictl_config.is_some())?
        };
        let source = if let Some(e) = flag_endpoint {
            EndpointSource::Explicit(e)
        } else if let Some(name) = &self.socket_file {
            if name.is_empty() {
                return Err(ConfigError::Invalid {
                    setting: "--socket-file".into(),
                    reason: "empty".into(),
                });
            }
            EndpointSource::SocketFile {
                host_run_dir: self.host_run_dir.clone(),
                name: name.clone(),
            }
        } else if let Some(e) = file.runtime_endpoint.as_deref().filter(|e| !e.is_empty()) {
            EndpointSource::Explicit(endpoint(
                &format!("runtime-endpoint in {}", file_path.display()),
                e,
            )?)
        } else {
            EndpointSource::Detect {
                host_run_dir: self.host_run_dir.clone(),
            }
        };
        let image_endpoint = match (flag_image_endpoint, &file.image_endpoint) {
            (Some(e), _) => Some(e),
            (None, Some(e)) if !e.is_empty() => Some(endpoint(
                &format!("image-endpoint in {}", file_path.display()),
                e,
            )?),
            _ => None,
        };
        let mut timeouts = Timeouts::default();
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
        })
    }
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

    fn args() -> RuntimeArgs {
        RuntimeArgs {
            host_run_dir: "/hostvarrun".into(),
            // never read the machine's real /etc/crictl.yaml in tests
            crictl_config: Some("/nonexistent/crictl.yaml".into()),
            ..Default::default()
        }
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
                host_run_dir: "/hostvarrun".into()
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

    #[test]
    fn cli_parses_version_with_runtime_flags() {
        let cli = Cli::try_parse_from([
            "kruised",
            "--log-format",
            "json",
            "version",
            "--runtime-endpoint",
            "unix:///run/x.sock",
            "--timeout",
            "1s",
        ])
        .unwrap();
        assert_eq!(cli.log_format, LogFormat::Json);
        let Command::Version(v) = cli.command;
        assert_eq!(
            v.runtime.runtime_endpoint.as_deref(),
            Some("unix:///run/x.sock")
        );
        assert_eq!(v.runtime.timeout, Some(Duration::from_secs(1)));
    }
}
