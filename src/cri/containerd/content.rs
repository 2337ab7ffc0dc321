//! containerd's content service: the ingests in flight (`ListStatuses`), each a blob being
//! written into the content store with how many of its bytes have landed. A pull through CRI
//! fetches every blob of its image (manifests, config, layers) through one such ingest; an
//! ingest ends (and leaves the list) when its blob is committed. This is what the image
//! puller's progress is made of (`controller::imagepull::progress`).

use std::time::Duration;

use tonic::transport::Channel;

use super::proto::content::{ListStatusesRequest, content_client::ContentClient};
use super::wire::{channel, request};
use crate::cri::endpoint::Endpoint;
use crate::cri::error::{CriError, Result};
use crate::cri::grpc::Timeouts;

/// The name of the call, in errors.
const LIST_STATUSES: &str = "containerd Content.ListStatuses";

/// One ingest in flight.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ingest {
    /// The ingest's reference (`layer-sha256:…` for a layer of a pull).
    pub reference: String,
    /// Bytes written so far.
    pub offset: u64,
    /// The blob's size; 0 when unknown.
    pub total: u64,
}

/// The content service of a containerd.
#[derive(Clone, Debug)]
pub struct Content {
    endpoint: Endpoint,
    client: ContentClient<Channel>,
    timeout: Duration,
}

impl Content {
    /// A client of the content service at `endpoint` (the CRI socket). Does no I/O: the first
    /// call connects.
    pub fn new(endpoint: Endpoint, timeouts: Timeouts) -> Self {
        Content {
            client: ContentClient::new(channel(&endpoint, timeouts.connect)),
            endpoint,
            timeout: timeouts.call,
        }
    }

    /// The ingests in flight in [`super::NAMESPACE`]. `Unimplemented` (a runtime that is not
    /// containerd) is [`CriError::Unsupported`].
    pub async fn ingests(&self) -> Result<Vec<Ingest>> {
        let mut client = self.client.clone();
        let call = client.list_statuses(request(ListStatusesRequest::default(), self.timeout));
        let response = match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(r)) => r.into_inner(),
            Ok(Err(status)) => {
                return Err(CriError::from_status(
                    &self.endpoint.to_string(),
                    LIST_STATUSES,
                    status,
                ));
            }
            Err(_) => {
                return Err(CriError::Timeout {
                    call: LIST_STATUSES,
                    after: self.timeout,
                });
            }
        };
        Ok(response
            .statuses
            .into_iter()
            .map(|s| Ingest {
                reference: s.r#ref,
                // a negative count is nonsense from the runtime: nothing landed, size unknown
                offset: u64::try_from(s.offset).unwrap_or(0),
                total: u64::try_from(s.total).unwrap_or(0),
            })
            .collect())
    }
}
