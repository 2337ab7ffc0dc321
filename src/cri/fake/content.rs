//! containerd's content service as the fake runtime serves it: the ingests a test sets
//! ([`super::FakeRuntime::set_ingests`]), in namespace `k8s.io` only; `Unimplemented` while
//! none are set, as a runtime that is not containerd answers.

use tonic::{Request, Response, Status};

use super::Svc;
use crate::cri::containerd::proto::content as proto;
use crate::cri::containerd::{NAMESPACE, NAMESPACE_HEADER};

/// The service, for the fake's server.
pub(super) fn server(svc: Svc) -> proto::content_server::ContentServer<Svc> {
    proto::content_server::ContentServer::new(svc)
}

#[tonic::async_trait]
impl proto::content_server::Content for Svc {
    async fn list_statuses(
        &self,
        request: Request<proto::ListStatusesRequest>,
    ) -> Result<Response<proto::ListStatusesResponse>, Status> {
        let Some(ingests) = self.0.lock().ingests.clone() else {
            return Err(Status::unimplemented(
                "unknown service containerd.services.content.v1.Content",
            ));
        };
        self.0.enter("ListStatuses").await?;
        let namespace = request
            .metadata()
            .get(NAMESPACE_HEADER)
            .and_then(|v| v.to_str().ok());
        // another namespace's content is not the CRI plugin's: nothing in flight there
        let statuses = if namespace == Some(NAMESPACE) {
            ingests
                .into_iter()
                .map(|i| proto::Status {
                    r#ref: i.reference,
                    offset: i64::try_from(i.offset).unwrap_or(i64::MAX),
                    total: i64::try_from(i.total).unwrap_or(i64::MAX),
                    expected: String::new(),
                })
                .collect()
        } else {
            Vec::new()
        };
        Ok(Response::new(proto::ListStatusesResponse { statuses }))
    }
}
