//! Where the container runtime is and how long calls to it may take: crictl's flags and
//! environment, kruise-daemon's `--socket-file`, crictl.yaml, then detection, validated into a
//! [`RuntimeConfig`]. `kruised run`, `version`, `explain` and `crictl` share it.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use clap::Args;

use super::{ConfigError, parse_duration};
use crate::cri::endpoint::{DEFAULT_HOST_RUN_DIR, KRUISE_HOST_RUN_DIR};
use crate::cri::{Endpoint, EndpointSource, Timeouts};

/// crictl's configuration file, read when no endpoint is given by flag or environment.
pub const DEFAULT_CRICTL_CONFIG: &str = "/etc/crictl.yaml";

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

impl RuntimeConfig {
    /// The runtimes these settings find, each probed with CRI `Version`: the one way the
    /// daemon and every command (`version`, `explain`, `crictl`) reach the runtime.
    pub async fn discover(&self) -> Result<crate::cri::Runtimes, crate::cri::DiscoveryError> {
        crate::cri::Runtimes::discover(&self.source, self.image_endpoint.clone(), self.timeouts)
            .await
    }
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
    crate::yaml::from_str(&text)
        .map(Option::unwrap_or_default)
        .map_err(|e| ConfigError::File {
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Runtime flags that never read the machine's real crictl.yaml.
    pub(crate) fn args() -> RuntimeArgs {
        RuntimeArgs {
            host_run_dir: Some("/hostvarrun".into()),
            // never read the machine's real /etc/crictl.yaml in tests
            crictl_config: Some("/nonexistent/crictl.yaml".into()),
            ..Default::default()
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
