//! The fake's image service: pulls (with injected registry failures and delays), listings and
//! removals, with image IDs and removal as the dialect has them.

use std::collections::BTreeMap;

use tonic::{Request, Response, Status};

use super::super::proto::image_service_server::ImageService as ImageRpc;
use super::super::{FilesystemUsage, convert, proto};
use super::Svc;
use super::state::now_ns;

#[tonic::async_trait]
impl ImageRpc for Svc {
    async fn list_images(
        &self,
        _r: Request<proto::ListImagesRequest>,
    ) -> Result<Response<proto::ListImagesResponse>, Status> {
        self.0.enter("ListImages").await?;
        let images = self
            .0
            .lock()
            .images
            .values()
            .cloned()
            .map(Into::into)
            .collect();
        Ok(Response::new(proto::ListImagesResponse { images }))
    }

    async fn image_status(
        &self,
        r: Request<proto::ImageStatusRequest>,
    ) -> Result<Response<proto::ImageStatusResponse>, Status> {
        self.0.enter("ImageStatus").await?;
        let name = r.into_inner().image.map(|i| i.image).unwrap_or_default();
        let image = self.0.lock().find_image(&name).cloned().map(Into::into);
        // as containerd and CRI-O do: OK with no image when unknown
        Ok(Response::new(proto::ImageStatusResponse {
            image,
            info: BTreeMap::new(),
        }))
    }

    async fn pull_image(
        &self,
        r: Request<proto::PullImageRequest>,
    ) -> Result<Response<proto::PullImageResponse>, Status> {
        self.0.enter("PullImage").await?;
        let req = convert::pull_request_from(r.into_inner());
        let failure = {
            let mut st = self.0.lock();
            st.pulls.push(req.clone());
            st.pulls_in_flight += 1;
            st.max_concurrent_pulls = st.max_concurrent_pulls.max(st.pulls_in_flight);
            st.pull_failures.get(&req.image).cloned()
        };
        // counted out when it ends, and as cancelled when its caller goes away first (the
        // server drops the call)
        struct Flight<'a>(&'a Svc, bool);
        impl Drop for Flight<'_> {
            fn drop(&mut self) {
                let mut st = self.0.0.lock();
                st.pulls_in_flight -= 1;
                if !self.1 {
                    st.pulls_cancelled += 1;
                    drop(st);
                    self.0.0.touch();
                }
            }
        }
        let mut flight = Flight(self, false);
        // let concurrent pulls overlap, as real ones do
        tokio::task::yield_now().await;
        let (delay, ended) = {
            let st = self.0.lock();
            (st.delays.get("PullImage.body").copied(), st.pulls_ended)
        };
        if let Some(d) = delay {
            // `FakeRuntime::end_pulls_in_flight` cuts it short
            let mut changes = self.0.changed.subscribe();
            let ended_now = async {
                while self.0.lock().pulls_ended == ended {
                    if changes.changed().await.is_err() {
                        std::future::pending::<()>().await;
                    }
                }
            };
            tokio::select! {
                () = tokio::time::sleep(d) => {}
                () = ended_now => {}
            }
        }
        flight.1 = true;
        drop(flight);
        let mut st = self.0.lock();
        if let Some((code, message)) = failure {
            drop(st);
            self.0.touch();
            return Err(Status::new(code, message));
        }
        // every runtime answers the image ID (bare hex on CRI-O)
        let id = st.add_image(&req.image);
        drop(st);
        self.0.touch();
        Ok(Response::new(proto::PullImageResponse { image_ref: id }))
    }

    async fn remove_image(
        &self,
        r: Request<proto::RemoveImageRequest>,
    ) -> Result<Response<proto::RemoveImageResponse>, Status> {
        self.0.enter("RemoveImage").await?;
        let name = r.into_inner().image.map(|i| i.image).unwrap_or_default();
        self.0.lock().remove_image(&name);
        self.0.touch();
        Ok(Response::new(proto::RemoveImageResponse {}))
    }

    async fn image_fs_info(
        &self,
        _r: Request<proto::ImageFsInfoRequest>,
    ) -> Result<Response<proto::ImageFsInfoResponse>, Status> {
        self.0.enter("ImageFsInfo").await?;
        let used: u64 = self.0.lock().images.values().map(|i| i.size).sum();
        Ok(Response::new(proto::ImageFsInfoResponse {
            image_filesystems: vec![
                FilesystemUsage {
                    timestamp: now_ns(),
                    mountpoint: "/var/lib/fake/images".into(),
                    used_bytes: Some(used),
                    inodes_used: Some(0),
                }
                .into(),
            ],
            container_filesystems: vec![],
        }))
    }
}
