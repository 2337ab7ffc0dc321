//! Tests of one next-batch pull against the in-memory image service of the task tests: the disk
//! floor, and whose credentials a pod's next batch may use.

use std::sync::Arc;

use serde_json::json;

use super::*;
use crate::controller::imagepull::keyring::Keyring;
use crate::controller::imagepull::metrics::Metrics;
use crate::controller::imagepull::pull::Puller;
use crate::controller::imagepull::secrets::{Resolved, lent};
use crate::controller::imagepull::settings::Settings;
use crate::controller::imagepull::task::tests::Mock;

/// Pull secrets as the config namespace holds them: name, `source-key` annotation (kruise
/// 07169cf copies a job's secret with `<ns>/<name>`, tests/support/manager/imagepull.rs), and
/// the login inside.
struct Copies(Vec<(&'static str, Option<&'static str>, Keyring)>);

impl Credentials for Copies {
    async fn resolve(&self, _refs: &[ReferenceObject]) -> Resolved {
        unreachable!("a pod's next batch never resolves pull secrets without its namespace")
    }
    async fn resolve_from(&self, refs: &[ReferenceObject], namespace: &str) -> Resolved {
        let named = self
            .0
            .iter()
            .filter(|(name, ..)| refs.iter().any(|r| r.name == *name));
        Resolved {
            keyring: lent(named.map(|(_, source, k)| (*source, k)), namespace),
            problems: vec![],
        }
    }
    fn invalidate(&self, _refs: &[ReferenceObject]) {}
}

fn login(user: &str) -> Keyring {
    let mut k = Keyring::default();
    k.add("r.io", user, &format!("pw-{user}"));
    k
}

fn tools<C: Credentials>(
    mock: &Mock,
    credentials: C,
    floor: u64,
    free: fn(&std::path::Path) -> Option<u64>,
) -> PullTools<Mock, C> {
    let tracker = tokio_util::task::TaskTracker::new();
    PullTools {
        puller: Puller::new(mock.clone(), tracker.clone(), Metrics::unregistered()),
        credentials: Arc::new(credentials),
        slots: None,
        settings: Settings {
            image_fs_min_free: floor,
            ..Settings::default()
        },
        metrics: Metrics::unregistered(),
        events: None,
        free_space: free,
        tracker,
        present: None,
        turn: Default::default(),
        admission: None,
    }
}

fn want(image: &str, namespace: &str) -> Want {
    Want {
        image: image.into(),
        reference: Reference::parse(image)
            .expect("a valid reference")
            .with_default_tag(),
        namespace: namespace.into(),
    }
}

/// The NodeImage of a node where tenant-b's ImagePullJob pulls its private `r.io/private`.
fn node_image() -> Arc<NodeImage> {
    Arc::new(
        serde_json::from_value(json!({
            "apiVersion": "apps.kruise.io/v1alpha1", "kind": "NodeImage",
            "metadata": {"name": "node-1"},
            "spec": {"images": {
                "r.io/private": {
                    "pullSecrets": [
                        {"namespace": "kruise-daemon-config", "name": "regcred-b"},
                        {"namespace": "kruise-daemon-config", "name": "by-hand"},
                        {"namespace": "kruise-daemon-config", "name": "regcred-a"}
                    ],
                    "sandboxConfig": {"labels": {"team": "b"}},
                    "tags": [{"tag": "v1", "version": 1}]
                },
                "r.io/other": {
                    "pullSecrets": [{"namespace": "kruise-daemon-config", "name": "other"}],
                    "tags": [{"tag": "v1", "version": 1}]
                }
            }}
        }))
        .expect("a NodeImage"),
    )
}

fn auth_users(mock: &Mock) -> Vec<Option<String>> {
    mock.st()
        .pulls
        .iter()
        .map(|p| p.auth.as_ref().map(|a| a.username.clone()))
        .collect()
}

#[tokio::test]
async fn another_tenants_secret_is_not_borrowed_for_a_pods_next_batch() {
    let copies = || {
        Copies(vec![
            ("regcred-b", Some("tenant-b/regcred"), login("b")),
            ("by-hand", None, login("admin")),
            ("regcred-a", Some("tenant-a/regcred"), login("a")),
            ("other", Some("tenant-c/regcred"), login("c")),
        ])
    };
    let (refs, sandbox) =
        node_image_entries(&[node_image()], &want("r.io/private:v2", "x").reference);
    let names: Vec<&str> = refs.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["regcred-b", "by-hand", "regcred-a"]);
    assert_eq!(
        sandbox.expect("the entry's sandbox config").labels["team"],
        "b"
    );

    // tenant-c's pod asks for tenant-b's private image: anonymous, though three secrets are
    // for that repository (and tenant-c owns a secret of another one)
    let mock = Mock::default();
    let e = tools(&mock, copies(), 0, |_| None);
    pull_one(&e, &want("r.io/private:v2", "tenant-c"), &refs, None)
        .await
        .expect("pulled");
    // tenant-a's pod gets tenant-a's copy only; tenant-b's its own
    pull_one(&e, &want("r.io/private:v3", "tenant-a"), &refs, None)
        .await
        .expect("pulled");
    pull_one(&e, &want("r.io/private:v4", "tenant-b"), &refs, None)
        .await
        .expect("pulled");
    assert_eq!(
        auth_users(&mock),
        [None, Some("a".to_string()), Some("b".to_string())]
    );
}

#[tokio::test]
async fn the_disk_floor_stops_a_next_batch_pre_pull() {
    let mock = Mock::default();
    // 100 MiB free, 1 GiB to keep: as for NodeImage tags (task_tests.rs)
    let e = tools(&mock, Copies(vec![]), 1 << 30, |_| Some(100 << 20));
    let err = pull_one(&e, &want("r.io/app:v2", "t"), &[], None)
        .await
        .expect_err("refused");
    let text = err.to_string();
    assert!(
        matches!(err, PrePullError::NoRoom(_)) && text.contains("--image-fs-min-free"),
        "{text}"
    );
    assert!(
        text.contains("100.0 MiB") && text.contains("1.0 GiB"),
        "{text}"
    );
    assert_eq!(mock.st().fs_calls, 1);
    assert!(mock.st().pulls.is_empty(), "nothing pulled");

    // with room the same image is pulled
    let e = tools(&mock, Copies(vec![]), 1 << 30, |_| Some(2 << 30));
    pull_one(&e, &want("r.io/app:v2", "t"), &[], None)
        .await
        .expect("pulled");
    assert_eq!(mock.st().pulls.len(), 1);
}

#[tokio::test]
async fn a_present_next_batch_image_is_neither_checked_nor_pulled() {
    let mock = Mock::default();
    mock.add_image("r.io/app:v2");
    let e = tools(&mock, Copies(vec![]), 1 << 30, |_| Some(0));
    pull_one(&e, &want("r.io/app:v2", "t"), &[], None)
        .await
        .expect("present");
    let st = mock.st();
    assert_eq!((st.fs_calls, st.pulls.len()), (0, 0));
}

/// Every image 400 MiB compressed.
struct Large;

impl crate::controller::imagepull::admit::SizeSource for Large {
    fn compressed_size<'a>(
        &'a self,
        _reference: &'a Reference,
        _credentials: &'a [crate::controller::imagepull::keyring::Credential],
    ) -> futures::future::BoxFuture<'a, Result<u64, String>> {
        Box::pin(async { Ok(400 << 20) })
    }
}

#[tokio::test]
async fn a_next_batch_image_too_large_for_its_room_is_not_pulled_but_an_in_place_pull_keeps_the_floor_only()
 {
    use crate::controller::imagepull::admit::{Admission, Ratio};
    use crate::controller::imagepull::disk::Space;
    let mock = Mock::default();
    // 1 GiB free of 2 GiB, 512 MiB to keep: 400 MiB × 2.5 would leave 24 MiB
    let mut e = tools(&mock, Copies(vec![]), 512 << 20, |_| Some(1 << 30));
    e.admission = Some(Arc::new(Admission {
        high_percent: 85,
        fs_path: None,
        space: |_| {
            Some(Space {
                free: 1 << 30,
                capacity: 2 << 30,
            })
        },
        sizes: Arc::new(Large),
        ratio: Ratio::default(),
        visible: None,
        reserved: std::sync::Mutex::new(0),
    }));
    let err = pull_one(&e, &want("r.io/app:v2", "t"), &[], None)
        .await
        .expect_err("refused");
    let text = err.to_string();
    assert!(
        text.contains("not pulling r.io/app:v2") && text.contains("leave 24.0 MiB free"),
        "{text}"
    );
    assert!(mock.st().pulls.is_empty(), "nothing pulled");

    // the pod's in-place update needs the same image now: above the floor, it is pulled
    let w = want("r.io/app:v2", "t");
    let target = Target {
        image: &w.image,
        reference: &w.reference,
        namespace: &w.namespace,
        source: Source::InPlace,
    };
    let ensured = ensure(&e, target, &[], None).await.expect("pulled");
    assert!(matches!(ensured, Ensured::Pulled), "{ensured:?}");
    assert_eq!(mock.st().pulls.len(), 1);
}
