//! Tests of the pull task against an in-memory image service, in paused time: backoff and
//! timeouts take no real time. The image service ([`Mock`]) serves the pre-pull's tests too.

use std::collections::HashMap;
use std::sync::Mutex as StdMutex;

use k8s_openapi::api::core::v1::ObjectReference;

use super::*;
use crate::controller::imagepull::keyring::Keyring;
use crate::controller::imagepull::secrets::Resolved;
use crate::cri::{CriError, FilesystemUsage, PullRequest};
use crate::k8s::crd::{ImagePullPhase, ImagePullPolicy, ImageTagPullPolicy};

const DIGEST: &str = "sha256:bc8813ea7b3603864987522f02a76101c17ad122e1c46d790efc0fca78ca7bfb";

#[derive(Default)]
pub(in crate::controller::imagepull) struct MockState {
    pub(in crate::controller::imagepull) images: Vec<Image>,
    pub(in crate::controller::imagepull) pulls: Vec<PullRequest>,
    in_flight: usize,
    pub(in crate::controller::imagepull) max_in_flight: usize,
    /// image -> error message of every pull of it
    fail: HashMap<String, String>,
    /// username -> error message (credentials that the registry refuses)
    refuse_user: HashMap<String, String>,
    pub(in crate::controller::imagepull) pull_delay: Duration,
    list_calls: usize,
    pub(in crate::controller::imagepull) fs_calls: usize,
    /// the runtime is away: every call fails as unreachable
    down: bool,
}

/// An in-memory image service.
#[derive(Clone, Default)]
pub(in crate::controller::imagepull) struct Mock(Arc<StdMutex<MockState>>);

impl Mock {
    pub(in crate::controller::imagepull) fn st(&self) -> std::sync::MutexGuard<'_, MockState> {
        self.0.lock().unwrap()
    }
    pub(in crate::controller::imagepull) fn add_image(&self, tag: &str) {
        let mut st = self.st();
        let id = format!("sha256:{:064x}", st.images.len() + 1);
        st.images.push(Image {
            id,
            repo_tags: vec![tag.to_string()],
            repo_digests: vec![],
            size: 1,
            ..Default::default()
        });
    }
}

impl ImageService for Mock {
    async fn list_images(&self) -> crate::cri::Result<Vec<Image>> {
        let mut st = self.st();
        st.list_calls += 1;
        if st.down {
            return Err(away());
        }
        Ok(st.images.clone())
    }
    async fn image_status(&self, _image: &str) -> crate::cri::Result<Option<Image>> {
        Ok(None)
    }
    async fn pull_image(
        &self,
        request: PullRequest,
        timeout: Duration,
    ) -> crate::cri::Result<String> {
        let (delay, fail) = {
            let mut st = self.st();
            st.pulls.push(request.clone());
            if st.down {
                return Err(away());
            }
            st.in_flight += 1;
            st.max_in_flight = st.max_in_flight.max(st.in_flight);
            let user = request
                .auth
                .as_ref()
                .map(|a| a.username.clone())
                .unwrap_or_default();
            let fail = st
                .fail
                .get(&request.image)
                .or_else(|| st.refuse_user.get(&user))
                .cloned();
            (st.pull_delay, fail)
        };
        // counts the pull out also when the call is dropped (a cancelled pull)
        struct Flight(Mock);
        impl Drop for Flight {
            fn drop(&mut self) {
                self.0.st().in_flight -= 1;
            }
        }
        let flight = Flight(self.clone());
        let slept = tokio::time::timeout(timeout, tokio::time::sleep(delay)).await;
        drop(flight);
        let mut st = self.st();
        if slept.is_err() {
            return Err(CriError::Timeout {
                call: "PullImage",
                after: timeout,
            });
        }
        if let Some(message) = fail {
            return Err(CriError::Other {
                call: "PullImage",
                code: "Unknown".into(),
                message,
            });
        }
        let id = format!("sha256:{:064x}", st.pulls.len());
        st.images.push(Image {
            id: id.clone(),
            repo_tags: vec![request.image.clone()],
            repo_digests: vec![],
            size: 1,
            ..Default::default()
        });
        Ok(id)
    }
    async fn remove_image(&self, _image: &str) -> crate::cri::Result<()> {
        Ok(())
    }
    async fn image_fs_info(&self) -> crate::cri::Result<Vec<FilesystemUsage>> {
        let mut st = self.st();
        st.fs_calls += 1;
        if st.down {
            return Err(away());
        }
        Ok(vec![FilesystemUsage {
            timestamp: 0,
            mountpoint: "/var/lib/containerd".into(),
            used_bytes: Some(4096),
            inodes_used: None,
        }])
    }
}

fn away() -> CriError {
    CriError::Unreachable {
        endpoint: "unix:///run/containerd/containerd.sock".into(),
        message: "connection refused".into(),
    }
}

/// Credentials from a fixed docker config, with fixed problems.
struct Fixed(Resolved);

impl Credentials for Fixed {
    async fn resolve(&self, _refs: &[ReferenceObject]) -> Resolved {
        self.0.clone()
    }
    fn invalidate(&self, _refs: &[ReferenceObject]) {}
}

fn tools_of(mock: &Mock, creds: Resolved, settings: Settings) -> Arc<PullTools<Mock, Fixed>> {
    let tracker = tokio_util::task::TaskTracker::new();
    Arc::new(PullTools {
        puller: Puller::new(mock.clone(), tracker.clone(), Metrics::unregistered()),
        credentials: Arc::new(Fixed(creds)),
        slots: settings
            .max_workers
            .map(crate::controller::imagepull::slots::Slots::new),
        settings,
        metrics: Metrics::unregistered(),
        events: None,
        free_space: |_| Some(100 << 30),
        tracker,
        present: None,
        turn: Default::default(),
        admission: None,
    })
}

fn job(image: &str, tag: &str) -> TagJob {
    TagJob {
        image: image.into(),
        spec: ImageTagSpec {
            tag: tag.into(),
            version: 1,
            ..Default::default()
        },
        pull_secrets: vec![],
        sandbox: None,
        node_image: ObjectReference::default(),
    }
}

fn with_policy(mut j: TagJob, p: ImageTagPullPolicy) -> TagJob {
    j.spec.pull_policy = Some(p);
    j
}

/// Runs a task to its end; returns its final status.
async fn finish(tools: &Arc<PullTools<Mock, Fixed>>, job: TagJob) -> ImageTagStatus {
    let cell: StatusCell = Arc::new(Mutex::new(state::waiting(&job.spec)));
    run(
        tools.clone(),
        job,
        cell.clone(),
        Arc::new(Notify::new()),
        CancellationToken::new(),
    )
    .await;
    cell.lock().unwrap().clone()
}

#[tokio::test(start_paused = true)]
async fn a_failing_tag_fails_after_backoff_limit_plus_one_attempts_with_the_runtimes_message() {
    let mock = Mock::default();
    mock.st().fail.insert(
        "r.io/app:bad".into(),
        "manifest unknown: r.io/app:bad not found".into(),
    );
    let tools = tools_of(&mock, Resolved::default(), Settings::default());
    let started = Instant::now();
    let s = finish(
        &tools,
        with_policy(
            job("r.io/app", "bad"),
            ImageTagPullPolicy {
                backoff_limit: Some(2),
                ..Default::default()
            },
        ),
    )
    .await;
    assert_eq!(s.phase, ImagePullPhase::Failed);
    assert!(
        s.message
            .contains("manifest unknown: r.io/app:bad not found"),
        "{}",
        s.message
    );
    assert_eq!(mock.st().pulls.len(), 3, "backoffLimit 2 means 3 attempts");
    // pauses of 1 s and 2 s between them, none after the last
    assert_eq!(started.elapsed().as_secs(), 3);
    assert!(s.completion_time.is_some() && s.start_time.is_some());
}

#[tokio::test(start_paused = true)]
async fn a_pull_cut_off_by_an_unreachable_runtime_resumes_when_it_answers_without_spending_an_attempt()
 {
    let mock = Mock::default();
    mock.st().down = true;
    let tools = tools_of(&mock, Resolved::default(), Settings::default());
    let started = Instant::now();
    let back = mock.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(30)).await;
        back.st().down = false;
    });
    // no retries at all: only an attempt that does not count can let this tag succeed
    let s = finish(
        &tools,
        with_policy(
            job("r.io/app", "v1"),
            ImageTagPullPolicy {
                backoff_limit: Some(0),
                ..Default::default()
            },
        ),
    )
    .await;
    assert_eq!(s.phase, ImagePullPhase::Succeeded, "{}", s.message);
    assert_eq!(
        mock.st().pulls.len(),
        2,
        "the cut-off pull, then the one that worked"
    );
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(30) && took <= Duration::from_secs(30) + RUNTIME_POLL,
        "resumed {took:?} after the start, the runtime answered after 30 s"
    );
}

#[tokio::test(start_paused = true)]
async fn a_runtime_away_past_the_active_deadline_fails_the_tag_with_its_error() {
    let mock = Mock::default();
    mock.st().down = true;
    let tools = tools_of(&mock, Resolved::default(), Settings::default());
    let s = finish(
        &tools,
        with_policy(
            job("r.io/app", "v1"),
            ImageTagPullPolicy {
                active_deadline_seconds: Some(20),
                ..Default::default()
            },
        ),
    )
    .await;
    assert_eq!(s.phase, ImagePullPhase::Failed);
    assert!(s.message.contains("activeDeadlineSeconds"), "{}", s.message);
    assert!(s.message.contains("unreachable"), "{}", s.message);
    assert_eq!(
        mock.st().pulls.len(),
        1,
        "no pull while the runtime is away"
    );
}

#[tokio::test(start_paused = true)]
async fn the_default_backoff_limit_is_three_retries() {
    let mock = Mock::default();
    mock.st().fail.insert("r.io/app:bad".into(), "nope".into());
    let tools = tools_of(&mock, Resolved::default(), Settings::default());
    let started = Instant::now();
    let s = finish(&tools, job("r.io/app", "bad")).await;
    assert_eq!(
        (s.phase, mock.st().pulls.len()),
        (ImagePullPhase::Failed, 4)
    );
    assert_eq!(started.elapsed().as_secs(), 1 + 2 + 4);
}

#[tokio::test(start_paused = true)]
async fn a_successful_pull_reports_the_image_id_under_the_spec_name() {
    let mock = Mock::default();
    let tools = tools_of(&mock, Resolved::default(), Settings::default());
    let s = finish(&tools, job("nginx", "1.25")).await;
    assert_eq!(s.phase, ImagePullPhase::Succeeded);
    assert_eq!(s.progress, 100);
    assert_eq!(s.image_id, format!("nginx@sha256:{:064x}", 1));
    let pulls = mock.st().pulls.clone();
    assert_eq!(pulls.len(), 1);
    assert_eq!(pulls[0].image, "nginx:1.25");
    assert_eq!(pulls[0].auth, None, "no secrets: anonymous");
    let sandbox = pulls[0].sandbox.clone().unwrap();
    assert_eq!(
        sandbox.annotations["apps.kruise.io/pulling-image-by"],
        "kruise-daemon"
    );
}

#[tokio::test(start_paused = true)]
async fn sandbox_labels_and_annotations_come_from_the_spec() {
    let mock = Mock::default();
    let tools = tools_of(&mock, Resolved::default(), Settings::default());
    let mut j = job("nginx", "1");
    j.sandbox = Some(SandboxConfig {
        labels: [("team".to_string(), "a".to_string())].into(),
        annotations: [("note".to_string(), "x".to_string())].into(),
    });
    finish(&tools, j).await;
    let sandbox = mock.st().pulls[0].sandbox.clone().unwrap();
    assert_eq!(sandbox.labels["team"], "a");
    assert_eq!(sandbox.annotations["note"], "x");
    assert_eq!(
        sandbox.annotations["apps.kruise.io/pulling-image-by"],
        "kruise-daemon"
    );
}

#[tokio::test(start_paused = true)]
async fn if_not_present_on_a_present_image_makes_no_pull_whatever_the_spelling() {
    let mock = Mock::default();
    mock.add_image("docker.io/library/nginx:1.25");
    let tools = tools_of(&mock, Resolved::default(), Settings::default());
    for name in ["nginx", "library/nginx", "docker.io/library/nginx"] {
        let mut j = job(name, "1.25");
        j.spec.image_pull_policy = Some(ImagePullPolicy::IfNotPresent);
        let s = finish(&tools, j).await;
        assert_eq!(s.phase, ImagePullPhase::Succeeded, "{name}");
        assert_eq!(s.image_id, format!("{name}@sha256:{:064x}", 1));
        assert_eq!(s.progress, 100);
    }
    assert!(mock.st().pulls.is_empty());
    assert_eq!(mock.st().fs_calls, 0, "no disk check without a pull");
}

#[tokio::test(start_paused = true)]
async fn always_pulls_a_present_image_again() {
    let mock = Mock::default();
    mock.add_image("docker.io/library/nginx:1.25");
    let tools = tools_of(&mock, Resolved::default(), Settings::default());
    let mut j = job("nginx", "1.25");
    j.spec.image_pull_policy = Some(ImagePullPolicy::Always);
    assert_eq!(finish(&tools, j).await.phase, ImagePullPhase::Succeeded);
    assert_eq!(mock.st().pulls.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn each_attempt_is_cut_at_the_timeout() {
    let mock = Mock::default();
    mock.st().pull_delay = Duration::from_secs(100);
    let tools = tools_of(&mock, Resolved::default(), Settings::default());
    let started = Instant::now();
    let s = finish(
        &tools,
        with_policy(
            job("r.io/app", "slow"),
            ImageTagPullPolicy {
                timeout_seconds: Some(5),
                backoff_limit: Some(1),
                ..Default::default()
            },
        ),
    )
    .await;
    assert_eq!(s.phase, ImagePullPhase::Failed);
    assert!(s.message.contains("timed out"), "{}", s.message);
    assert_eq!(mock.st().pulls.len(), 2);
    assert_eq!(started.elapsed().as_secs(), 5 + 1 + 5);
}

#[tokio::test(start_paused = true)]
async fn the_active_deadline_ends_the_retries_and_keeps_the_last_error() {
    let mock = Mock::default();
    mock.st()
        .fail
        .insert("r.io/app:bad".into(), "registry down".into());
    let tools = tools_of(&mock, Resolved::default(), Settings::default());
    let started = Instant::now();
    let s = finish(
        &tools,
        with_policy(
            job("r.io/app", "bad"),
            ImageTagPullPolicy {
                backoff_limit: Some(10),
                active_deadline_seconds: Some(5),
                ..Default::default()
            },
        ),
    )
    .await;
    assert_eq!(s.phase, ImagePullPhase::Failed);
    assert!(
        s.message
            .starts_with("pulling exceeds the activeDeadlineSeconds"),
        "{}",
        s.message
    );
    assert!(s.message.contains("registry down"), "{}", s.message);
    // attempts at 0, 1, 3 s; the next pause would pass the deadline at 5 s
    assert_eq!(mock.st().pulls.len(), 3);
    assert_eq!(started.elapsed().as_secs(), 5);
}

#[tokio::test(start_paused = true)]
async fn below_the_disk_floor_the_tag_fails_at_once_without_pulling() {
    let mock = Mock::default();
    let settings = Settings {
        image_fs_min_free: 1 << 30,
        ..Settings::default()
    };
    let tracker = tokio_util::task::TaskTracker::new();
    let tools = Arc::new(PullTools {
        puller: Puller::new(mock.clone(), tracker.clone(), Metrics::unregistered()),
        credentials: Arc::new(Fixed(Resolved::default())),
        slots: None,
        settings,
        metrics: Metrics::unregistered(),
        events: None,
        free_space: |_| Some(10 << 20),
        tracker,
        present: None,
        turn: Default::default(),
        admission: None,
    });
    let s = finish(&tools, job("r.io/app", "v1")).await;
    assert_eq!(s.phase, ImagePullPhase::Failed);
    assert!(
        s.message.contains("/var/lib/containerd") && s.message.contains("10.0 MiB"),
        "{}",
        s.message
    );
    assert!(mock.st().pulls.is_empty());
}

fn keyring(json: &str) -> Keyring {
    let mut k = Keyring::default();
    k.add_config_json(json.as_bytes()).unwrap();
    k
}

#[tokio::test(start_paused = true)]
async fn matching_credentials_are_tried_in_order_and_the_first_that_works_wins() {
    let mock = Mock::default();
    mock.st()
        .refuse_user
        .insert("old".into(), "401 Unauthorized".into());
    let creds = Resolved {
        keyring: keyring(
            r#"{"auths": {"r.io/team": {"username": "old", "password": "pw-old"},
                          "r.io": {"username": "new", "password": "pw-new"},
                          "other.io": {"username": "x", "password": "y"}}}"#,
        ),
        problems: vec![],
    };
    let tools = tools_of(&mock, creds, Settings::default());
    let s = finish(&tools, job("r.io/team/app", "v1")).await;
    assert_eq!(s.phase, ImagePullPhase::Succeeded);
    let users: Vec<_> = mock
        .st()
        .pulls
        .iter()
        .map(|p| p.auth.clone().unwrap().username)
        .collect();
    assert_eq!(users, ["old", "new"]);
}

#[tokio::test(start_paused = true)]
async fn when_every_credential_fails_the_message_has_each_error_and_no_password() {
    let mock = Mock::default();
    // a registry that (unwisely) echoes the password in its error
    mock.st()
        .refuse_user
        .insert("u".into(), "401 Unauthorized for u:pw-very-secret".into());
    let creds = Resolved {
        keyring: keyring(r#"{"auths": {"r.io": {"username": "u", "password": "pw-very-secret"}}}"#),
        problems: vec![],
    };
    let tools = tools_of(&mock, creds, Settings::default());
    let s = finish(
        &tools,
        with_policy(
            job("r.io/app", "v1"),
            ImageTagPullPolicy {
                backoff_limit: Some(0),
                ..Default::default()
            },
        ),
    )
    .await;
    assert_eq!(s.phase, ImagePullPhase::Failed);
    assert!(s.message.contains("401 Unauthorized"), "{}", s.message);
    assert!(!s.message.contains("pw-very-secret"), "{}", s.message);
    assert_eq!(
        mock.st().pulls.len(),
        1,
        "no anonymous fallback after a matching credential failed"
    );
}

#[tokio::test(start_paused = true)]
async fn a_missing_secret_is_reported_in_the_message_and_the_pull_goes_on() {
    let mock = Mock::default();
    let creds = Resolved {
        keyring: Keyring::default(),
        problems: vec!["pull secret kruise-daemon-config/gone not found".into()],
    };
    let tools = tools_of(&mock, creds.clone(), Settings::default());
    let s = finish(&tools, job("r.io/app", "v1")).await;
    assert_eq!(s.phase, ImagePullPhase::Succeeded);
    assert!(s.message.contains("gone not found"), "{}", s.message);
    assert_eq!(mock.st().pulls[0].auth, None);

    mock.st()
        .fail
        .insert("r.io/app:v2".into(), "401 Unauthorized".into());
    let s = finish(
        &tools,
        with_policy(
            job("r.io/app", "v2"),
            ImageTagPullPolicy {
                backoff_limit: Some(0),
                ..Default::default()
            },
        ),
    )
    .await;
    assert_eq!(s.phase, ImagePullPhase::Failed);
    assert!(
        s.message.contains("401") && s.message.contains("gone not found"),
        "{}",
        s.message
    );
}

#[tokio::test(start_paused = true)]
async fn identical_references_in_flight_are_pulled_once() {
    let mock = Mock::default();
    mock.st().pull_delay = Duration::from_secs(3);
    let tools = tools_of(&mock, Resolved::default(), Settings::default());
    let (a, b, c) = tokio::join!(
        finish(&tools, job("nginx", "1.25")),
        finish(&tools, job("docker.io/library/nginx", "1.25")),
        finish(&tools, job("nginx", "1.26")),
    );
    for s in [&a, &b, &c] {
        assert_eq!(s.phase, ImagePullPhase::Succeeded);
    }
    let mut images: Vec<_> = mock.st().pulls.iter().map(|p| p.image.clone()).collect();
    images.sort();
    assert_eq!(images.len(), 2, "{images:?}");
    assert!(images.contains(&"nginx:1.26".to_string()));
    assert_eq!(
        a.image_id.split_once('@').unwrap().1,
        b.image_id.split_once('@').unwrap().1
    );
}

#[tokio::test(start_paused = true)]
async fn a_digest_tag_is_pulled_by_digest() {
    let mock = Mock::default();
    let tools = tools_of(&mock, Resolved::default(), Settings::default());
    let s = finish(&tools, job("nginx", DIGEST)).await;
    assert_eq!(s.phase, ImagePullPhase::Succeeded);
    assert_eq!(mock.st().pulls[0].image, format!("nginx@{DIGEST}"));
}

#[tokio::test(start_paused = true)]
async fn with_one_slot_the_second_tag_waits_until_the_first_is_done() {
    let mock = Mock::default();
    mock.st().pull_delay = Duration::from_secs(2);
    let tools = tools_of(
        &mock,
        Resolved::default(),
        Settings {
            max_workers: Some(1),
            ..Settings::default()
        },
    );
    let cells: Vec<StatusCell> = ["a", "b", "c"]
        .iter()
        .map(|t| Arc::new(Mutex::new(state::waiting(&job("r.io/app", t).spec))))
        .collect();
    let runs = ["a", "b", "c"].iter().zip(&cells).map(|(t, cell)| {
        run(
            tools.clone(),
            job("r.io/app", t),
            cell.clone(),
            Arc::new(Notify::new()),
            CancellationToken::new(),
        )
    });
    let all = futures::future::join_all(runs);
    tokio::pin!(all);
    // one second in: one pulls, two wait
    let _ = tokio::time::timeout(Duration::from_secs(1), &mut all).await;
    let phases: Vec<_> = cells
        .iter()
        .map(|c| c.lock().unwrap().phase.clone())
        .collect();
    assert_eq!(
        phases
            .iter()
            .filter(|p| **p == ImagePullPhase::Pulling)
            .count(),
        1
    );
    assert_eq!(
        phases
            .iter()
            .filter(|p| **p == ImagePullPhase::Waiting)
            .count(),
        2
    );
    all.await;
    assert_eq!(mock.st().max_in_flight, 1);
    assert!(
        cells
            .iter()
            .all(|c| c.lock().unwrap().phase == ImagePullPhase::Succeeded)
    );
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_task_stops_its_pull_and_writes_nothing_more() {
    let mock = Mock::default();
    mock.st().pull_delay = Duration::from_secs(60);
    let tools = tools_of(&mock, Resolved::default(), Settings::default());
    let j = job("r.io/app", "v1");
    let cell: StatusCell = Arc::new(Mutex::new(state::waiting(&j.spec)));
    let cancel = CancellationToken::new();
    let task = tokio::spawn(run(
        tools.clone(),
        j,
        cell.clone(),
        Arc::new(Notify::new()),
        cancel.clone(),
    ));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(cell.lock().unwrap().phase, ImagePullPhase::Pulling);
    assert_eq!(mock.st().in_flight, 1);
    cancel.cancel();
    task.await.unwrap();
    // the shared pull is cancelled with its last waiter
    tools.tracker.close();
    tools.tracker.wait().await;
    assert_eq!(mock.st().in_flight, 0);
    assert_eq!(cell.lock().unwrap().phase, ImagePullPhase::Pulling);
}

#[test]
fn present_images_are_found_by_normalised_tag_or_digest() {
    let images = vec![Image {
        id: "sha256:1".into(),
        repo_tags: vec!["docker.io/library/nginx:1.25".into()],
        repo_digests: vec![format!("docker.io/library/nginx@{DIGEST}")],
        size: 0,
        ..Default::default()
    }];
    let r = |s: &str| Reference::parse(s).unwrap().with_default_tag();
    assert!(find_image(&images, &r("nginx:1.25")).is_some());
    assert!(find_image(&images, &r("library/nginx:1.25")).is_some());
    assert!(
        find_image(&images, &r("nginx")).is_none(),
        "latest is another tag"
    );
    assert!(find_image(&images, &r(&format!("nginx@{DIGEST}"))).is_some());
    assert!(find_image(&images, &r(&format!("other@{DIGEST}"))).is_none());
}

// === admission by size (admit.rs) ===

/// Image sizes from a fixed answer; records the users of the credentials each lookup was given.
struct FixedSize {
    size: Result<u64, String>,
    seen: StdMutex<Vec<Vec<String>>>,
}

impl admit::SizeSource for FixedSize {
    fn compressed_size<'a>(
        &'a self,
        _reference: &'a Reference,
        credentials: &'a [Credential],
    ) -> futures::future::BoxFuture<'a, Result<u64, String>> {
        self.seen
            .lock()
            .unwrap()
            .push(credentials.iter().map(|c| c.username.clone()).collect());
        let size = self.size.clone();
        Box::pin(async move { size })
    }
}

/// Tools with the size admission on: 1 GiB free of 2 GiB, a floor of 512 MiB (above what the
/// GC threshold, 85 %, keeps free: 307.2 MiB), every image
/// `size` bytes compressed (× 2.5 on disk).
fn admitting(
    mock: &Mock,
    creds: Resolved,
    size: Result<u64, String>,
) -> (Arc<PullTools<Mock, Fixed>>, Arc<FixedSize>) {
    let sizes = Arc::new(FixedSize {
        size,
        seen: StdMutex::new(Vec::new()),
    });
    let settings = Settings {
        image_fs_min_free: 512 << 20,
        ..Settings::default()
    };
    let mut tools = tools_of(mock, creds, settings);
    Arc::get_mut(&mut tools).unwrap().admission = Some(Arc::new(Admission {
        high_percent: 85,
        fs_path: None,
        space: |_| {
            Some(disk::Space {
                free: 1 << 30,
                capacity: 2 << 30,
            })
        },
        sizes: sizes.clone(),
        ratio: admit::Ratio::default(),
        visible: None,
        reserved: StdMutex::new(0),
    }));
    (tools, sizes)
}

fn once(j: TagJob) -> TagJob {
    with_policy(
        j,
        ImageTagPullPolicy {
            backoff_limit: Some(0),
            ..Default::default()
        },
    )
}

#[tokio::test(start_paused = true)]
async fn a_tag_that_passes_the_floor_but_not_with_its_size_is_not_pulled_and_its_message_has_the_numbers()
 {
    let mock = Mock::default();
    // 400 MiB × 2.5 = 1000 MiB would leave 24 MiB of the 1 GiB free, below 512 MiB
    let (tools, _) = admitting(&mock, Resolved::default(), Ok(400 << 20));
    let s = finish(&tools, once(job("r.io/big", "v1"))).await;
    assert_eq!(s.phase, ImagePullPhase::Failed);
    for part in [
        "not pulling r.io/big:v1",
        "1000.0 MiB on disk",
        "400.0 MiB compressed × ratio 2.50",
        "leave 24.0 MiB free",
        "free now 1.0 GiB",
        "below the 512.0 MiB",
    ] {
        assert!(s.message.contains(part), "{part:?} missing: {}", s.message);
    }
    assert!(mock.st().pulls.is_empty(), "never sent to the runtime");
}

#[tokio::test(start_paused = true)]
async fn the_size_is_read_with_the_credentials_the_pull_uses_and_a_small_image_is_pulled() {
    let mock = Mock::default();
    let creds = Resolved {
        keyring: keyring(r#"{"auths": {"r.io": {"username": "u", "password": "pw"}}}"#),
        problems: vec![],
    };
    let (tools, sizes) = admitting(&mock, creds, Ok(10 << 20));
    let s = finish(&tools, once(job("r.io/small", "v1"))).await;
    assert_eq!(s.phase, ImagePullPhase::Succeeded, "{}", s.message);
    assert_eq!(*sizes.seen.lock().unwrap(), vec![vec!["u".to_string()]]);
    assert_eq!(mock.st().pulls.len(), 1);
    let admission = tools.admission.as_ref().unwrap();
    assert_eq!(
        *admission.reserved.lock().unwrap(),
        0,
        "released after the pull"
    );
}

#[tokio::test(start_paused = true)]
async fn pulls_under_way_hold_their_room_so_three_at_once_admit_only_the_two_that_fit() {
    let mock = Mock::default();
    mock.st().pull_delay = Duration::from_secs(10);
    // 100 MiB × 2.5 = 250 MiB each: 1024 − 250 − 250 = 524 MiB ≥ 512, a third would leave 274
    let (tools, _) = admitting(&mock, Resolved::default(), Ok(100 << 20));
    let (a, b, c) = tokio::join!(
        finish(&tools, once(job("r.io/a", "v1"))),
        finish(&tools, once(job("r.io/b", "v1"))),
        finish(&tools, once(job("r.io/c", "v1"))),
    );
    let phases = [&a.phase, &b.phase, &c.phase];
    let failed: Vec<_> = [&a, &b, &c]
        .into_iter()
        .filter(|s| s.phase == ImagePullPhase::Failed)
        .collect();
    assert_eq!(failed.len(), 1, "{phases:?}");
    assert!(
        failed[0].message.contains("leave 274.0 MiB free"),
        "{}",
        failed[0].message
    );
    assert_eq!(mock.st().pulls.len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_registry_that_does_not_answer_the_size_fails_the_attempt_saying_so() {
    let mock = Mock::default();
    let (tools, _) = admitting(&mock, Resolved::default(), Err("GET …: 401".into()));
    let s = finish(&tools, once(job("r.io/x", "v1"))).await;
    assert_eq!(s.phase, ImagePullPhase::Failed);
    assert!(
        s.message
            .contains("its size could not be read from its registry: GET …: 401"),
        "{}",
        s.message
    );
    assert!(mock.st().pulls.is_empty());
}

#[tokio::test(start_paused = true)]
async fn an_invisible_image_filesystem_fails_the_tag_closed_at_once() {
    let mock = Mock::default();
    let (mut tools, sizes) = admitting(&mock, Resolved::default(), Ok(1));
    let mut admission =
        Arc::try_unwrap(Arc::get_mut(&mut tools).unwrap().admission.take().unwrap()).unwrap();
    admission.space = |_| None;
    Arc::get_mut(&mut tools).unwrap().admission = Some(Arc::new(admission));
    let s = finish(&tools, job("r.io/x", "v1")).await;
    assert_eq!(s.phase, ImagePullPhase::Failed);
    assert!(
        s.message
            .contains("/var/lib/containerd is not visible to kruised"),
        "{}",
        s.message
    );
    assert!(mock.st().pulls.is_empty());
    assert!(sizes.seen.lock().unwrap().is_empty(), "no registry asked");
}

/// A tag's task of one attempt (a called-off pull counted as a failed attempt would fail it),
/// its pull 10 s long, on a node where the test says how many pods wait for their own image
/// (`own`); started and given 1 s, so its pull is under way.
struct Yielding {
    mock: Mock,
    own: tokio::sync::watch::Sender<usize>,
    cell: StatusCell,
    task: tokio::task::JoinHandle<()>,
}

async fn a_tag_pulling_on_a_node_whose_pods_may_wait() -> Yielding {
    let mock = Mock::default();
    mock.st().pull_delay = Duration::from_secs(10);
    let (own, own_rx) = tokio::sync::watch::channel(0);
    let mut tools = Arc::into_inner(tools_of(&mock, Resolved::default(), Settings::default()))
        .expect("one owner");
    tools.turn =
        super::super::turn::Turn::new(None, own_rx, tokio::sync::watch::channel(0).1, None);
    let j = once(job("r.io/app", "v1"));
    let cell: StatusCell = Arc::new(Mutex::new(state::waiting(&j.spec)));
    let task = tokio::spawn(run(
        Arc::new(tools),
        j,
        cell.clone(),
        Arc::new(Notify::new()),
        CancellationToken::new(),
    ));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(mock.st().in_flight, 1, "pulling");
    Yielding {
        mock,
        own,
        cell,
        task,
    }
}

#[tokio::test(start_paused = true)]
async fn a_running_pull_is_called_off_while_a_pod_waits_for_its_image_and_pulled_again_after_without_spending_an_attempt()
 {
    let Yielding {
        mock,
        own: own_tx,
        cell,
        task,
    } = a_tag_pulling_on_a_node_whose_pods_may_wait().await;

    own_tx.send_replace(1);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(mock.st().in_flight, 0, "the pull called off");
    // far past the first pull's end: nothing pulled while the pod waits, the tag still pulling
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(
        mock.st().pulls.len(),
        1,
        "pulled again while the pod waited"
    );
    let s = cell.lock().unwrap().clone();
    assert_eq!(s.phase, ImagePullPhase::Pulling, "{s:?}");
    assert!(s.message.is_empty(), "{s:?}");

    own_tx.send_replace(0);
    task.await.unwrap();
    let s = cell.lock().unwrap().clone();
    assert_eq!(s.phase, ImagePullPhase::Succeeded, "{s:?}");
    assert_eq!(
        mock.st().pulls.len(),
        2,
        "pulled again once nothing is waited for"
    );
}

#[tokio::test(start_paused = true)]
async fn a_pull_called_off_three_times_is_let_finish_while_a_pod_waits_for_its_image() {
    use super::super::turn::MAX_CALL_OFFS;
    let Yielding {
        mock,
        own,
        cell,
        task,
    } = a_tag_pulling_on_a_node_whose_pods_may_wait().await;
    assert_eq!(MAX_CALL_OFFS, 3, "the bound this test is named after");
    for n in 1..=MAX_CALL_OFFS {
        own.send_replace(1);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(mock.st().in_flight, 0, "called off the {n}. time");
        own.send_replace(0);
        tokio::time::sleep(Duration::from_secs(1)).await;
        let st = mock.st();
        assert_eq!(
            (st.in_flight, st.pulls.len()),
            (1, n as usize + 1),
            "pulling again after call-off {n}"
        );
    }

    // a pod waits, and keeps waiting: the pull runs to its end beside it
    own.send_replace(1);
    let started = Instant::now();
    tokio::time::timeout(Duration::from_secs(60), task)
        .await
        .unwrap_or_else(|_| {
            panic!(
                "the pull not let finish; the tag: {:?}, pulls: {}",
                cell.lock().unwrap(),
                mock.st().pulls.len()
            )
        })
        .expect("the task ends");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(9) && took < Duration::from_secs(10),
        "ended {took:?} after the pod began to wait: the pull begun 1 s before runs on to its 10 s"
    );
    let s = cell.lock().unwrap().clone();
    assert_eq!(s.phase, ImagePullPhase::Succeeded, "{s:?}");
    assert_eq!(
        mock.st().pulls.len(),
        MAX_CALL_OFFS as usize + 1,
        "called off {MAX_CALL_OFFS} times, then pulled once to its end"
    );
    assert_eq!(*own.borrow(), 1, "the pod still waits");
}
