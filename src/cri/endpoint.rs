//! Runtime endpoints: parsing (`unix:///path`, a bare path, kruise's `--socket-file`) and the
//! well-known sockets tried when none is given.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use super::error::CriError;

/// Sockets tried, in this order, under the host run directory when no endpoint is configured.
/// The second element names the runtime that usually listens there (for messages only: the
/// runtime's own `Version` answer is what counts).
pub const WELL_KNOWN_SOCKETS: &[(&str, &str)] = &[
    ("containerd/containerd.sock", "containerd"),
    ("containerd.sock", "containerd"),
    ("k3s/containerd/containerd.sock", "containerd (k3s)"),
    ("crio/crio.sock", "cri-o"),
    ("crio.sock", "cri-o"),
    ("cri-dockerd.sock", "cri-dockerd"),
    ("cri-dockerd/cri-dockerd.sock", "cri-dockerd"),
];

/// The host's run directory as the daemon sees it (in a DaemonSet the host's `/var/run` is
/// usually mounted elsewhere, e.g. `/hostvarrun`).
pub const DEFAULT_HOST_RUN_DIR: &str = "/var/run";
/// Where kruise's DaemonSet mounts the host's `/var/run` (kruise-daemon looks only there).
pub const KRUISE_HOST_RUN_DIR: &str = "/hostvarrun";

/// A CRI endpoint: a unix socket.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Endpoint {
    path: PathBuf,
}

impl Endpoint {
    /// An endpoint for the unix socket at `path`.
    pub fn unix(path: impl Into<PathBuf>) -> Self {
        Endpoint { path: path.into() }
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unix://{}", self.path.display())
    }
}

impl FromStr for Endpoint {
    type Err = CriError;

    /// Accepts `unix:///abs/path` and `/abs/path`, like crictl. Other schemes are refused with
    /// a message that says what is supported.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let invalid = |reason: &str| CriError::InvalidEndpoint {
            endpoint: s.to_string(),
            reason: reason.to_string(),
        };
        let path = if let Some(rest) = s.strip_prefix("unix://") {
            rest
        } else if s.contains("://") {
            return Err(invalid(
                "only unix sockets are supported (unix:///path/to/socket or /path/to/socket)",
            ));
        } else {
            s
        };
        if path.is_empty() {
            return Err(invalid("the socket path is empty"));
        }
        if !path.starts_with('/') {
            return Err(invalid("the socket path must be absolute"));
        }
        Ok(Endpoint::unix(path))
    }
}

/// Where to look for the runtime.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EndpointSource {
    /// Exactly this endpoint (`--runtime-endpoint`, `CONTAINER_RUNTIME_ENDPOINT`, crictl.yaml).
    Explicit(Endpoint),
    /// kruise-daemon's `--socket-file NAME`: the socket `NAME` under the host run directory.
    SocketFile {
        /// The host run directory.
        host_run_dir: PathBuf,
        /// The socket's name relative to it.
        name: String,
    },
    /// Every well-known socket that exists under the host run directories, in order.
    Detect {
        /// The host run directories (kruise's `/hostvarrun` mount, then `/var/run`).
        host_run_dirs: Vec<PathBuf>,
    },
}

impl EndpointSource {
    /// The endpoints to try, in order. For detection only sockets that exist are returned; two
    /// names for the same socket (a symlink) are tried once.
    pub fn candidates(&self) -> Vec<Endpoint> {
        match self {
            EndpointSource::Explicit(e) => vec![e.clone()],
            EndpointSource::SocketFile { host_run_dir, name } => {
                // kruise-daemon users often pass an absolute path here (kruise #1196); accept it
                // as the absolute path it obviously is instead of joining it.
                let path = Path::new(name);
                if path.is_absolute() {
                    vec![Endpoint::unix(path)]
                } else {
                    vec![Endpoint::unix(host_run_dir.join(path))]
                }
            }
            EndpointSource::Detect { host_run_dirs } => {
                let mut seen = Vec::new();
                let mut out = Vec::new();
                for (dir, (rel, _)) in host_run_dirs
                    .iter()
                    .flat_map(|d| WELL_KNOWN_SOCKETS.iter().map(move |s| (d, s)))
                {
                    let path = dir.join(rel);
                    let Ok(canonical) = std::fs::canonicalize(&path) else {
                        continue;
                    };
                    if seen.contains(&canonical) {
                        continue;
                    }
                    seen.push(canonical);
                    out.push(Endpoint::unix(path));
                }
                out
            }
        }
    }

    /// Describes what would be tried, for the message when nothing answers.
    pub fn describe(&self) -> String {
        match self {
            EndpointSource::Explicit(e) => format!("the configured endpoint {e}"),
            EndpointSource::SocketFile { host_run_dir, name } => {
                format!("--socket-file {name} under {}", host_run_dir.display())
            }
            EndpointSource::Detect { host_run_dirs } => format!(
                "the well-known sockets under {} ({})",
                host_run_dirs
                    .iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(" and "),
                WELL_KNOWN_SOCKETS
                    .iter()
                    .map(|(rel, _)| *rel)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_urls_and_bare_paths_parse_to_the_same_endpoint() {
        let a: Endpoint = "unix:///run/containerd/containerd.sock".parse().unwrap();
        let b: Endpoint = "/run/containerd/containerd.sock".parse().unwrap();
        assert_eq!(a, b);
        assert_eq!(a.to_string(), "unix:///run/containerd/containerd.sock");
    }

    #[test]
    fn tcp_and_relative_endpoints_are_refused_with_a_reason() {
        let err = "tcp://127.0.0.1:1234".parse::<Endpoint>().unwrap_err();
        assert!(err.to_string().contains("only unix sockets"), "{err}");
        let err = "unix://run/x.sock".parse::<Endpoint>().unwrap_err();
        assert!(err.to_string().contains("absolute"), "{err}");
        assert!("".parse::<Endpoint>().is_err());
    }

    #[test]
    fn socket_file_is_relative_to_the_host_run_dir() {
        let src = EndpointSource::SocketFile {
            host_run_dir: "/hostvarrun".into(),
            name: "k3s/containerd/containerd.sock".into(),
        };
        assert_eq!(
            src.candidates(),
            vec![Endpoint::unix("/hostvarrun/k3s/containerd/containerd.sock")]
        );
    }

    #[test]
    fn absolute_socket_file_is_taken_as_is() {
        let src = EndpointSource::SocketFile {
            host_run_dir: "/hostvarrun".into(),
            name: "/var/run/crio/crio.sock".into(),
        };
        assert_eq!(
            src.candidates(),
            vec![Endpoint::unix("/var/run/crio/crio.sock")]
        );
    }

    #[test]
    fn detection_lists_existing_sockets_in_order_and_once_per_target() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path();
        std::fs::create_dir_all(base.join("containerd")).unwrap();
        std::fs::create_dir_all(base.join("crio")).unwrap();
        std::fs::write(base.join("containerd/containerd.sock"), b"").unwrap();
        // containerd.sock is a symlink to the same socket: tried once
        std::os::unix::fs::symlink(
            base.join("containerd/containerd.sock"),
            base.join("containerd.sock"),
        )
        .unwrap();
        std::fs::write(base.join("crio/crio.sock"), b"").unwrap();
        let src = EndpointSource::Detect {
            host_run_dirs: vec![base.to_path_buf()],
        };
        assert_eq!(
            src.candidates(),
            vec![
                Endpoint::unix(base.join("containerd/containerd.sock")),
                Endpoint::unix(base.join("crio/crio.sock")),
            ]
        );
    }

    #[test]
    fn detection_in_an_empty_dir_finds_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let src = EndpointSource::Detect {
            host_run_dirs: vec![dir.path().to_path_buf()],
        };
        assert!(src.candidates().is_empty());
        assert!(src.describe().contains("containerd/containerd.sock"));
    }
}
