//! The admission of NodeImage pulls by the image's size (issue 42, item 2) against real
//! containerd and the lab's registries: the size read from the manifest with the tag's pull
//! secret, and a real "disk full" on a small loop-mounted ext4.
//!
//! The ext4 is a stand-in image filesystem (`--image-fs-path`): containerd's root stays in the
//! lab, so what an admitted pull takes is written onto the stand-in by the test, the size the
//! daemon estimated for it. Repositories used here and nowhere else: `admit/small`,
//! `admit/refused`, and `secure/admit` on the registry that wants a login.

use std::io::{Read, Write};

use crate::pull_support::{self, LIMIT, NODE, b64, tag};
use crate::support::loop_fs::LoopFs;
use crate::support::{self, Lab, Plane, wait};
use kruised::controller::imagepull::disk;
use kruised::cri::ImageService;
use serde_json::{Value, json};

/// The compressed size of `repo:reference` as its manifest says (config + layers), read over
/// plain HTTP from a lab registry, with `login` (`user:password`) if given.
fn manifest_size(registry: &str, repo: &str, reference: &str, login: Option<&str>) -> u64 {
    let mut s = std::net::TcpStream::connect(registry).unwrap();
    let auth = login
        .map(|l| format!("Authorization: Basic {}\r\n", b64(l)))
        .unwrap_or_default();
    write!(
        s,
        "GET /v2/{repo}/manifests/{reference} HTTP/1.0\r\nHost: {registry}\r\n{auth}Accept: \
         application/vnd.oci.image.manifest.v1+json, \
         application/vnd.docker.distribution.manifest.v2+json\r\n\r\n"
    )
    .unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    let (head, body) = body.split_once("\r\n\r\n").unwrap();
    assert!(
        head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
        "{head}"
    );
    let m: Value = serde_json::from_str(body).unwrap();
    let layers: u64 = m["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["size"].as_u64().unwrap())
        .sum();
    layers + m["config"]["size"].as_u64().unwrap()
}

/// The daemon's log lines whose message is `message`.
fn lines(d: &support::daemon::Daemon, message: &str) -> Vec<Value> {
    d.log()
        .into_iter()
        .filter(|l| l["message"].as_str() == Some(message))
        .collect()
}

async fn remove(lab: &Lab, images: &[&str]) {
    let rt = lab.runtime();
    for i in images {
        rt.remove_image(i).await.unwrap();
    }
}

#[tokio::test]
async fn a_tag_behind_a_login_is_sized_with_its_pull_secret_refused_unread_with_a_wrong_one_and_admitted_with_the_right_one()
 {
    let Some(lab) = Lab::get() else { return };
    let (user, password) = lab.auth_credentials();
    let wrong = format!("not-{password}");
    let name = format!("{}/secure/admit", lab.auth_registry);
    remove(&lab, &[&format!("{name}:v1")]).await;
    let compressed = manifest_size(
        &lab.auth_registry,
        "secure/admit",
        "v1",
        Some(&format!("{user}:{password}")),
    );

    let plane = Plane::start().await;
    let api = &plane.api;
    pull_support::create_tag_behind_a_login(
        api,
        &lab.auth_registry,
        &user,
        &password,
        &wrong,
        &name,
    );
    // a floor of 1 MiB on the lab's image filesystem (containerd's root, as ImageFsInfo names
    // it); the GC threshold at 100 %: the machine's disk may be fuller than a node's
    let mut d = plane
        .start_daemon(
            &lab,
            NODE,
            &[
                "--image-fs-min-free",
                "1Mi",
                "--image-gc-high-threshold-percent",
                "100",
            ],
            LIMIT,
        )
        .await;

    let s = wait::node_image(api, LIMIT, NODE, "Failed with the wrong secret", |s| {
        s.failed == 1
    })
    .await;
    let message = tag(&s, &name, "v1").message;
    assert!(
        message.contains("its size could not be read from its registry") && message.contains("401"),
        "the manifest was read with the wrong secret and refused: {message}"
    );
    assert_eq!(
        lab.runtime()
            .image_status(&format!("{name}:v1"))
            .await
            .unwrap(),
        None,
        "a pull that was not admitted never reached the runtime"
    );

    pull_support::use_the_right_secret(api, &name);
    wait::node_image(api, LIMIT, NODE, "Succeeded with the right secret", |s| {
        s.succeeded == 1
    })
    .await;
    let admitted = lines(&d, "pull admitted by size");
    assert_eq!(admitted.len(), 1, "{admitted:#?}");
    assert_eq!(
        admitted[0]["compressed"].as_u64(),
        Some(compressed),
        "the size is the manifest's, read with the right secret: {:#?}",
        admitted[0]
    );
    assert!(
        !lines(&d, "learned the image size ratio").is_empty(),
        "the ratio learns from the pull: {:#?}",
        d.log()
    );

    let (code, body) = support::daemon::http_get(d.admin, "/readyz?verbose").await;
    assert_eq!(code, 200, "{body}");
    assert!(
        body.contains("image-fs") && body.contains("is visible"),
        "/readyz?verbose says what the check sees: {body}"
    );

    d.terminate();
    let status = d.wait_exit(std::time::Duration::from_secs(10)).await;
    assert!(status.success(), "exit status {status}");
    let log = serde_json::to_string(&d.log()).unwrap();
    let stored = serde_json::to_string(&api.get("nodeimages", "", NODE)).unwrap();
    for secret in [&password, &wrong] {
        assert!(!log.contains(secret.as_str()), "the log shows a password");
        assert!(
            !stored.contains(secret.as_str()),
            "the status shows a password"
        );
    }
}

#[tokio::test]
async fn on_a_nearly_full_image_filesystem_an_image_that_passes_the_floor_is_refused_with_its_numbers_and_a_small_one_is_admitted()
 {
    let Some(lab) = Lab::get() else { return };
    let Some(fs) = LoopFs::new(32 << 20) else {
        return;
    };
    let small = format!("{}/admit/small", lab.registry);
    let refused = format!("{}/admit/refused", lab.registry);
    remove(&lab, &[&format!("{small}:v1"), &format!("{refused}:v1")]).await;
    let compressed = manifest_size(&lab.registry, "admit/small", "v1", None);

    // room for the small image at the default ratio (2.5) and 1 MiB more above the floor
    let start = fs.space();
    let estimate = (compressed * 5).div_ceil(2);
    let floor = start.free - estimate - (1 << 20);
    let plane = Plane::start().await;
    let api = &plane.api;
    pull_support::create_node_image(
        api,
        json!({ &small: {"tags": [{"tag": "v1", "version": 1, "pullPolicy": {"backoffLimit": 0}}]}}),
        None,
    );
    let floor_arg = floor.to_string();
    let path_arg = fs.mount.display().to_string();
    let d = plane
        .start_daemon(
            &lab,
            NODE,
            &[
                "--image-fs-min-free",
                &floor_arg,
                "--image-fs-path",
                &path_arg,
                // the floor decides here, not the kubelet's GC threshold
                "--image-gc-high-threshold-percent",
                "100",
            ],
            LIMIT,
        )
        .await;
    wait::node_image(api, LIMIT, NODE, "the small image Succeeded", |s| {
        s.succeeded == 1
    })
    .await;
    let admitted = lines(&d, "pull admitted by size");
    assert_eq!(admitted.len(), 1, "{admitted:#?}");
    let unpacked = admitted[0]["unpacked"].as_u64().unwrap();
    assert_eq!(unpacked, estimate, "{:#?}", admitted[0]);

    // what the admitted pull takes lands on the image filesystem: it stays at or above the floor
    fs.fill("admitted-small", unpacked);
    let after = fs.space().free;
    assert!(
        after >= floor,
        "the admitted pull took the filesystem below the floor: {after} < {floor}"
    );
    // other use fills it to 512 KiB above the floor: less than any image of this size needs
    fs.fill("other", after - floor - (512 << 10));
    let free_now = fs.space().free;
    assert!(free_now > floor, "{free_now} > {floor}");

    api.modify("nodeimages", "", NODE, |o| {
        o["spec"]["images"][&refused] =
            json!({"tags": [{"tag": "v1", "version": 1, "pullPolicy": {"backoffLimit": 0}}]});
    })
    .unwrap();
    let s = wait::node_image(api, LIMIT, NODE, "the second image Failed", |s| {
        s.failed == 1
    })
    .await;
    let message = tag(&s, &refused, "v1").message;
    for part in [
        format!("not pulling {refused}:v1"),
        format!("{} compressed", disk::human(compressed)),
        "× ratio".to_string(),
        format!("free now {}", disk::human(free_now)),
        format!("below the {} the daemon keeps free", disk::human(floor)),
        "--image-fs-min-free".to_string(),
    ] {
        assert!(message.contains(&part), "{part:?} missing from {message:?}");
    }
    assert_eq!(
        lab.runtime()
            .image_status(&format!("{refused}:v1"))
            .await
            .unwrap(),
        None,
        "the refused image was never pulled"
    );
    let refusals = lines(&d, "pull not admitted");
    eprintln!(
        "admission on a {} ext4, floor {}: admitted 1 ({} estimated, {} free after), refused {} \
         ({} free); admitted pulls below the floor: 0",
        disk::human(start.capacity),
        disk::human(floor),
        disk::human(unpacked),
        disk::human(after),
        refusals.len(),
        disk::human(free_now),
    );
    assert_eq!(refusals.len(), 1, "{refusals:#?}");
}

#[tokio::test]
async fn where_the_image_filesystem_is_not_visible_pre_pulls_fail_closed_and_readyz_says_why_while_ready()
 {
    let Some(lab) = Lab::get() else { return };
    let small = format!("{}/admit/small", lab.registry);
    let plane = Plane::start().await;
    let api = &plane.api;
    pull_support::create_node_image(
        api,
        json!({ &small: {"tags": [{"tag": "v1", "version": 1, "pullPolicy": {"backoffLimit": 3}}]}}),
        None,
    );
    let d = plane
        .start_daemon(
            &lab,
            NODE,
            &[
                "--image-fs-min-free",
                "1Gi",
                "--image-fs-path",
                "/no/such/image/fs",
            ],
            LIMIT,
        )
        .await;
    let s = wait::node_image(api, LIMIT, NODE, "Failed closed", |s| s.failed == 1).await;
    let message = tag(&s, &small, "v1").message;
    assert!(
        message.contains("/no/such/image/fs is not visible to kruised")
            && message.contains("--image-fs-path"),
        "{message}"
    );
    let (code, body) = support::daemon::http_get(d.admin, "/readyz?verbose").await;
    assert_eq!(code, 200, "the daemon stays ready: {body}");
    assert!(body.contains("/no/such/image/fs is not visible"), "{body}");
}
