//! containerd's images service (`containerd.services.images.v1.Images`): the labels of image
//! records, in the CRI's namespace. kruised pins the images it pre-pulls with
//! [`PINNED_LABEL`] and records that it did with [`PINNED_BY_LABEL`], on the image's record
//! named by its ID (`sha256:<config digest>`), which the CRI plugin makes for every image it
//! pulls beside the tag and digest records; the CRI reports an image pinned when any of its
//! records carries the label.

use std::collections::BTreeMap;
use std::time::Duration;

use tonic::transport::Channel;

use super::proto::images as proto;
use super::wire::{channel, request};
use crate::cri::endpoint::Endpoint;
use crate::cri::error::{CriError, Result};
use crate::cri::grpc::RemoteRuntime;

use proto::images_client::ImagesClient;

/// The label containerd's CRI plugin (1.7 and later) reports as `Image.pinned`, and its value.
pub const PINNED_LABEL: &str = "io.cri-containerd.pinned";
/// The value of [`PINNED_LABEL`] that pins.
pub const PINNED: &str = "pinned";
/// kruised's record that it pinned the image (so it unpins only what it pinned), its value
/// [`PINNED_BY`].
pub const PINNED_BY_LABEL: &str = "kruised.io/pinned-by";
/// The value of [`PINNED_BY_LABEL`].
pub const PINNED_BY: &str = "kruised";

/// One image record as containerd keeps it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImageRecord {
    /// The record's name (a reference, or the image ID).
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// When the record was made (seconds since the epoch).
    pub created_at: i64,
    /// What it points at (its manifest or index).
    pub target: Target,
}

/// What an image record points at (containerd's `Descriptor`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Target {
    /// Its media type.
    pub media_type: String,
    /// Its digest.
    pub digest: String,
    /// Its size in bytes.
    pub size: i64,
}

impl ImageRecord {
    /// Whether it carries the pinned label.
    pub fn pinned(&self) -> bool {
        self.labels.get(PINNED_LABEL).is_some_and(|v| v == PINNED)
    }

    /// Whether kruised pinned it.
    pub fn pinned_by_kruised(&self) -> bool {
        self.labels
            .get(PINNED_BY_LABEL)
            .is_some_and(|v| v == PINNED_BY)
    }
}

impl From<proto::Image> for ImageRecord {
    fn from(i: proto::Image) -> Self {
        ImageRecord {
            name: i.name,
            labels: i.labels,
            created_at: i.created_at.map_or(0, |t| t.seconds),
            target: i.target.map_or_else(Target::default, |t| Target {
                media_type: t.media_type,
                digest: t.digest,
                size: t.size,
            }),
        }
    }
}

/// A client of containerd's images service over the runtime's socket.
#[derive(Clone, Debug)]
pub struct Images {
    endpoint: Endpoint,
    client: ImagesClient<Channel>,
    timeout: Duration,
}

impl Images {
    /// A client on the socket of `runtime`'s image service (containerd's, which serves the CRI
    /// and its own API on one socket). Does no I/O: the first call connects.
    pub fn of(runtime: &RemoteRuntime) -> Self {
        let endpoint = runtime.image_endpoint().clone();
        let timeouts = runtime.timeouts();
        Images {
            client: ImagesClient::new(channel(&endpoint, timeouts.connect)),
            endpoint,
            timeout: timeouts.call,
        }
    }

    fn error(&self, call: &'static str, status: tonic::Status) -> CriError {
        CriError::from_status(&self.endpoint.to_string(), call, status)
    }

    /// The record named `name`; `None` when there is none.
    pub async fn get(&self, name: &str) -> Result<Option<ImageRecord>> {
        let req = request(
            proto::GetImageRequest {
                name: name.to_string(),
            },
            self.timeout,
        );
        match self.client.clone().get(req).await {
            Ok(r) => Ok(r.into_inner().image.map(ImageRecord::from)),
            Err(s) if s.code() == tonic::Code::NotFound => Ok(None),
            Err(s) => Err(self.error("images.Get", s)),
        }
    }

    /// The records kruised pinned ([`PINNED_BY_LABEL`]).
    pub async fn pinned_by_kruised(&self) -> Result<Vec<ImageRecord>> {
        let req = request(
            proto::ListImagesRequest {
                filters: vec![format!("labels.\"{PINNED_BY_LABEL}\"=={PINNED_BY}")],
            },
            self.timeout,
        );
        let images = self
            .client
            .clone()
            .list(req)
            .await
            .map_err(|s| self.error("images.List", s))?
            .into_inner()
            .images;
        Ok(images.into_iter().map(ImageRecord::from).collect())
    }

    /// Sets (`Some`) or removes (`None`) the labels `labels` of `record` (as [`Images::get`]
    /// gave it), leaving its other labels as they are. `NotFound` when the record is gone.
    pub async fn set_labels(
        &self,
        record: &ImageRecord,
        labels: &[(&str, Option<&str>)],
    ) -> Result<()> {
        let t = &record.target;
        let req = request(
            proto::UpdateImageRequest {
                image: Some(proto::Image {
                    name: record.name.clone(),
                    // an absent value removes the label (containerd drops empty label values)
                    labels: labels
                        .iter()
                        .filter_map(|(k, v)| v.map(|v| (k.to_string(), v.to_string())))
                        .collect(),
                    // the mask leaves the target as it is, but it must be there: containerd
                    // 2.1.9 dereferences it before reading the mask, and an update without
                    // one crashes the whole daemon (nil pointer, seen in the lab)
                    target: Some(proto::Descriptor {
                        media_type: t.media_type.clone(),
                        digest: t.digest.clone(),
                        size: t.size,
                    }),
                    ..Default::default()
                }),
                update_mask: Some(proto::FieldMask {
                    paths: labels.iter().map(|(k, _)| format!("labels.{k}")).collect(),
                }),
            },
            self.timeout,
        );
        self.client
            .clone()
            .update(req)
            .await
            .map(drop)
            .map_err(|s| self.error("images.Update", s))
    }
}
