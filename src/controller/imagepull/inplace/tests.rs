//! Tests of one in-place attempt against the in-memory image service of the task tests, in
//! paused time: joining a pull already in flight, and the order of the pull slots.

use std::sync::Arc;

use super::*;
use crate::controller::imagepull::metrics::Metrics;
use crate::controller::imagepull::pull::{PullSpec, Puller};
use crate::controller::imagepull::reference::Reference;
use crate::controller::imagepull::secrets::Resolved;
use crate::controller::imagepull::settings::Settings;
use crate::controller::imagepull::slots::{Priority, Slots};
use crate::controller::imagepull::task::tests::Mock;
use crate::k8s::crd::ReferenceObject;

/// No pull secrets at all: every pull is anonymous.
struct Anonymous;

impl Credentials for Anonymous {
    async fn resolve(&self, _refs: &[ReferenceObject]) -> Resolved {
        Resolved::default()
    }
    fn invalidate(&self, _refs: &[ReferenceObject]) {}
}

fn tools(mock: &Mock, slots: Option<Arc<Slots>>) -> Arc<PullTools<Mock, Anonymous>> {
    let tracker = tokio_util::task::TaskTracker::new();
    Arc::new(PullTools {
        puller: Puller::new(mock.clone(), tracker.clone(), Metrics::unregistered()),
        credentials: Arc::new(Anonymous),
        slots,
        settings: Settings::default(),
        metrics: Metrics::unregistered(),
        events: None,
        free_space: |_| None,
        tracker,
        present: None,
        turn: Default::default(),
        admission: None,
    })
}

fn reference(image: &str) -> Reference {
    Reference::parse(image)
        .expect("a valid reference")
        .with_default_tag()
}

/// Pulls `image` for namespace `t` as `source` asks.
async fn ensure_for(
    tools: &PullTools<Mock, Anonymous>,
    image: &str,
    source: Source,
) -> Result<Ensured, PrePullError> {
    let r = reference(image);
    let target = Target {
        image,
        reference: &r,
        namespace: "t",
        source,
    };
    ensure(tools, target, &[], None).await
}

/// Lets every task run until it waits on time.
async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn an_in_place_pull_joins_a_nodeimage_pull_of_the_same_image_in_flight() {
    let mock = Mock::default();
    mock.st().pull_delay = Duration::from_secs(10);
    let tools = tools(&mock, None);
    // a NodeImage tag pulls `docker.io/library/app:v2` anonymously, as the task does
    let spec = PullSpec {
        image: "docker.io/library/app:v2".into(),
        key: reference("app:v2").pull_key(),
        credentials: vec![],
        secrets: vec![],
        sandbox: None,
        source: Source::NodeImage,
    };
    let puller = tools.puller.clone();
    let node_image = tokio::spawn(async move { puller.pull(spec, Duration::from_secs(60)).await });
    settle().await;
    assert_eq!(mock.st().pulls.len(), 1, "the NodeImage pull started");
    // a pod's spec names the same image in its short spelling
    let how = ensure_for(&tools, "app:v2", Source::InPlace)
        .await
        .expect("pulled");
    assert_eq!(how, Ensured::Pulled);
    node_image
        .await
        .expect("the NodeImage pull's task")
        .expect("the NodeImage pull");
    assert_eq!(mock.st().pulls.len(), 1, "one transfer for both");
    // and the next time it is present
    let how = ensure_for(&tools, "docker.io/library/app:v2", Source::InPlace)
        .await
        .expect("present");
    assert_eq!(how, Ensured::Present);
    assert_eq!(mock.st().pulls.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn an_in_place_pull_takes_a_freed_slot_before_next_batch_and_nodeimage_work_waiting_longer() {
    let mock = Mock::default();
    mock.st().pull_delay = Duration::from_secs(10);
    let slots = Slots::new(1);
    let tools = tools(&mock, Some(slots.clone()));
    // the one slot is busy (a NodeImage pull); a next-batch pull waits, then an in-place one
    let busy = slots.acquire(Priority::Normal).await;
    let next_batch = tokio::spawn({
        let tools = tools.clone();
        async move { ensure_for(&tools, "r.io/next:v2", Source::NextBatch).await }
    });
    settle().await;
    let in_place = tokio::spawn({
        let tools = tools.clone();
        async move { ensure_for(&tools, "r.io/app:v2", Source::InPlace).await }
    });
    settle().await;
    assert!(mock.st().pulls.is_empty(), "both wait for the slot");
    drop(busy);
    in_place
        .await
        .expect("the in-place task")
        .expect("the in-place pull");
    next_batch
        .await
        .expect("the next-batch task")
        .expect("the next-batch pull");
    let order: Vec<String> = mock.st().pulls.iter().map(|p| p.image.clone()).collect();
    assert_eq!(order, ["r.io/app:v2", "r.io/next:v2"]);
    assert_eq!(mock.st().max_in_flight, 1, "one slot, one pull at a time");
}

#[test]
fn an_image_on_the_node_is_told_to_the_timelines_for_each_pod_that_asked() {
    let told: Arc<std::sync::Mutex<Vec<(String, String, String)>>> = Arc::default();
    let mut with_hook = Arc::into_inner(tools(&Mock::default(), None)).expect("one owner");
    with_hook.present = Some({
        let told = told.clone();
        Arc::new(move |ns: &str, pod: &str, image: &str, _at: i64| {
            let mut t = told
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            t.push((ns.into(), pod.into(), image.into()));
        })
    });
    let want = Want {
        image: "app:v2".into(),
        reference: reference("app:v2"),
        namespace: "t".into(),
        pods: [
            ("web-0".to_string(), plan::Why::Grace),
            ("web-1".to_string(), plan::Why::SpecChange),
        ]
        .into(),
    };
    let (web0, gone) = ("web-0".to_string(), "gone".to_string());
    image_present(
        &with_hook,
        &want,
        &[&web0, &gone],
        Ensured::Pulled,
        Duration::from_secs(9),
    );
    let told = told
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    assert_eq!(
        *told,
        vec![("t".into(), "web-0".into(), "app:v2".into())],
        "only pods that asked, each once"
    );
}
