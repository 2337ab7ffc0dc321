//! The small types both the daemon's runtime types (`types.rs`) and crictl's details
//! (`detail.rs`) are made of: labels and annotations, a container's identity, a filesystem's
//! usage.

use std::collections::BTreeMap;

/// Labels or annotations, ordered so output and comparisons are stable.
pub type StringMap = BTreeMap<String, String>;

/// Name and attempt of a container (the kubelet's container identity).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerMetadata {
    /// Container name in the pod spec.
    pub name: String,
    /// Restart attempt (the kubelet's restart count when it created this container).
    pub attempt: u32,
}

/// Usage of a filesystem that holds images.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FilesystemUsage {
    /// When the usage was sampled (ns since the epoch).
    pub timestamp: i64,
    /// Mount point of the filesystem.
    pub mountpoint: String,
    /// Bytes used by images, if reported.
    pub used_bytes: Option<u64>,
    /// Inodes used by images, if reported.
    pub inodes_used: Option<u64>,
}
