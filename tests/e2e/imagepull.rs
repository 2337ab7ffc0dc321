//! End-to-end tests of the image puller against real containerd and the lab registries
//! (`tests/cri-lab.sh`): the puller in-process over the lab's CRI socket, and the `kruised`
//! binary for the authenticated registry.
//!
//! Repositories used here and nowhere else: `imagepull/busybox` (removed and pulled again) and
//! `imagepull/present`; `test/busybox` is only pulled, never removed; on the authenticated
//! registry `secure/busybox`.

use crate::pull_support;
use crate::support;

use std::io::{Read, Write};
use std::time::Duration;

use crate::pull_support::{LIMIT, NODE, PullNode, b64, fast, owner, tag};
use crate::support::{Lab, Plane, wait};
use kruised::cri::{ImageService, PullRequest};
use kruised::k8s::crd::ImagePullPhase;
use serde_json::json;

/// The lab registry's access log.
fn registry_log(lab: &Lab, name: &str) -> String {
    std::fs::read_to_string(lab.dir.join("logs").join(name)).unwrap_or_default()
}

/// Requests for paths under `/v2/<repo>/` in the registry log after byte `offset`.
fn requests_since(lab: &Lab, offset: usize, repo: &str) -> Vec<String> {
    let log = registry_log(lab, "registry.log");
    let needle = format!(" /v2/{repo}/");
    log.get(offset..)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let i = l.find(&needle)?;
            let method = l[..i].rsplit('"').next()?.to_string();
            let path = l[i + 1..].split(' ').next()?;
            Some(format!("{method} {path}"))
        })
        .collect()
}

fn log_len(lab: &Lab) -> usize {
    registry_log(lab, "registry.log").len()
}

/// Plain HTTP GET of a manifest from the lab registry.
fn layer_digests(lab: &Lab, repo: &str, tag: &str) -> Vec<String> {
    let mut s = std::net::TcpStream::connect(&lab.registry).unwrap();
    write!(
        s,
        "GET /v2/{repo}/manifests/{tag} HTTP/1.0\r\nHost: {}\r\nAccept: application/vnd.oci.image.manifest.v1+json, \
         application/vnd.docker.distribution.manifest.v2+json\r\n\r\n",
        lab.registry
    )
    .unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    let (_, body) = body.split_once("\r\n\r\n").unwrap();
    let manifest: serde_json::Value = serde_json::from_str(body).unwrap();
    manifest["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["digest"].as_str().unwrap().to_string())
        .collect()
}

async fn image_id(node: &PullNode, image: &str) -> String {
    node.runtime
        .image_status(image)
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("{image} is not on the node"))
        .id
}

#[tokio::test]
async fn v1_and_v2_end_succeeded_with_counters_and_image_ids_and_v2_fetches_only_its_new_layer() {
    let Some(lab) = Lab::get() else { return };
    let node = PullNode::start(fast(), lab.endpoint()).await;
    let name = format!("{}/imagepull/busybox", lab.registry);
    for t in ["v1", "v2"] {
        node.runtime
            .remove_image(&format!("{name}:{t}"))
            .await
            .unwrap();
    }
    let (layers_v1, layers_v2) = (
        layer_digests(&lab, "imagepull/busybox", "v1"),
        layer_digests(&lab, "imagepull/busybox", "v2"),
    );
    let new: Vec<_> = layers_v2
        .iter()
        .filter(|d| !layers_v1.contains(d))
        .cloned()
        .collect();
    assert_eq!(new.len(), 1, "v2 differs from v1 in one layer");

    node.create_node_image(json!({ &name: {"tags": [
        {"tag": "v1", "version": 1, "ownerReferences": [owner()]}
    ]}}));
    node.wait_status("v1 Succeeded", |s| s.succeeded == 1).await;

    let offset = log_len(&lab);
    node.set_images(json!({ &name: {"tags": [
        {"tag": "v1", "version": 1, "ownerReferences": [owner()]},
        {"tag": "v2", "version": 1}
    ]}}));
    let s = node.wait_status("v2 Succeeded", |s| s.succeeded == 2).await;
    assert_eq!(
        (s.desired, s.succeeded, s.failed, s.pulling, s.waiting),
        (2, 2, 0, 0, 0)
    );
    for t in ["v1", "v2"] {
        let ts = tag(&s, &name, t);
        assert_eq!(ts.phase, ImagePullPhase::Succeeded);
        let id = image_id(&node, &format!("{name}:{t}")).await;
        assert_eq!(ts.image_id, format!("{name}@{id}"));
        assert!(ts.completion_time.is_some() && ts.start_time.is_some());
    }
    let blobs: Vec<_> = requests_since(&lab, offset, "imagepull/busybox")
        .into_iter()
        .filter(|r| r.starts_with("GET") && r.contains("/blobs/"))
        .collect();
    let layers_fetched: Vec<_> = blobs
        .iter()
        .filter(|r| layers_v2.iter().any(|d| r.ends_with(d.as_str())))
        .collect();
    assert_eq!(
        layers_fetched.len(),
        1,
        "only the new layer is fetched for v2: {blobs:?}"
    );
    assert!(layers_fetched[0].ends_with(new[0].as_str()));
    wait::events(&node.api, LIMIT, "PullImageSucceed", 3).await;
}

#[tokio::test]
async fn a_bad_tag_fails_after_backoff_limit_plus_one_attempts_with_the_registrys_error() {
    let Some(lab) = Lab::get() else { return };
    let node = PullNode::start(fast(), lab.endpoint()).await;
    let name = format!("{}/imagepull/busybox", lab.registry);
    let offset = log_len(&lab);
    node.create_node_image(json!({ &name: {"tags": [
        {"tag": "no-such-tag", "version": 1, "pullPolicy": {"backoffLimit": 2}}
    ]}}));
    let s = node.wait_status("Failed", |s| s.failed == 1).await;
    let t = tag(&s, &name, "no-such-tag");
    assert!(lab.runtime.says_no_such_tag(&t.message), "{}", t.message);
    assert!(t.message.contains("no-such-tag"), "{}", t.message);
    let pulls: Vec<_> = node
        .pulls()
        .into_iter()
        .filter(|p| p.ends_with(":no-such-tag"))
        .collect();
    assert_eq!(pulls.len(), 3, "backoffLimit 2: three attempts");
    let asked = requests_since(&lab, offset, "imagepull/busybox")
        .into_iter()
        .filter(|r| r.ends_with("/manifests/no-such-tag"))
        .count();
    assert!(
        asked >= 3,
        "the registry was asked on every attempt ({asked})"
    );
    wait::events(&node.api, LIMIT, "PullImageFailed", 1).await;
}

#[tokio::test]
async fn bumping_the_version_pulls_again_from_the_registry() {
    let Some(lab) = Lab::get() else { return };
    let node = PullNode::start(fast(), lab.endpoint()).await;
    let name = format!("{}/test/busybox", lab.registry);
    node.create_node_image(json!({ &name: {"tags": [{"tag": "v1", "version": 1}]}}));
    node.wait_status("version 1 Succeeded", |s| s.succeeded == 1)
        .await;
    let offset = log_len(&lab);
    node.set_images(json!({ &name: {"tags": [{"tag": "v1", "version": 2}]}}));
    let s = node
        .wait_status("version 2 Succeeded", |s| {
            s.succeeded == 1
                && s.image_statuses
                    .get(&name)
                    .is_some_and(|i| i.tags[0].version == 2)
        })
        .await;
    assert_eq!(tag(&s, &name, "v1").phase, ImagePullPhase::Succeeded);
    assert_eq!(
        node.pulls()
            .iter()
            .filter(|p| p.ends_with("/test/busybox:v1"))
            .count(),
        2
    );
    let asked = requests_since(&lab, offset, "test/busybox")
        .into_iter()
        .filter(|r| r.ends_with("/manifests/v1"))
        .count();
    assert!(asked >= 1, "the new version asked the registry again");
}

#[tokio::test]
async fn if_not_present_on_a_present_image_does_not_touch_the_registry() {
    let Some(lab) = Lab::get() else { return };
    let node = PullNode::start(fast(), lab.endpoint()).await;
    let name = format!("{}/imagepull/present", lab.registry);
    support::within(
        LIMIT,
        "pull of imagepull/present:v1",
        node.runtime.pull_image(
            PullRequest {
                image: format!("{name}:v1"),
                ..Default::default()
            },
            LIMIT,
        ),
    )
    .await
    .unwrap();
    let offset = log_len(&lab);
    node.create_node_image(json!({ &name: {"tags": [
        {"tag": "v1", "version": 1, "imagePullPolicy": "IfNotPresent"}
    ]}}));
    let s = node.wait_status("Succeeded", |s| s.succeeded == 1).await;
    let id = image_id(&node, &format!("{name}:v1")).await;
    assert_eq!(tag(&s, &name, "v1").image_id, format!("{name}@{id}"));
    assert!(node.pulls().is_empty(), "no PullImage: {:?}", node.pulls());
    assert_eq!(
        requests_since(&lab, offset, "imagepull/present"),
        Vec::<String>::new()
    );
}

#[tokio::test]
async fn the_daemon_pulls_from_a_registry_with_a_login_only_with_the_right_secret_and_never_shows_the_password()
 {
    let Some(lab) = Lab::get() else { return };
    let (user, password) = lab.auth_credentials();
    let wrong = format!("not-{password}");
    let name = format!("{}/secure/busybox", lab.auth_registry);
    lab.runtime()
        .remove_image(&format!("{name}:v1"))
        .await
        .unwrap();

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
    let mut d = plane.start_daemon(&lab, NODE, &[], LIMIT).await;

    let s = wait::node_image(api, LIMIT, NODE, "Failed with the wrong secret", |s| {
        s.failed == 1
    })
    .await;
    let message = tag(&s, &name, "v1").message.to_lowercase();
    assert!(
        lab.runtime.says_unauthorized(&message),
        "an authentication error: {message}"
    );

    // the right secret, and a new version to pull again
    pull_support::use_the_right_secret(api, &name);
    let s = wait::node_image(api, LIMIT, NODE, "Succeeded with the right secret", |s| {
        s.succeeded == 1
    })
    .await;
    let t = tag(&s, &name, "v1");
    assert_eq!(t.version, 2);
    let id = lab
        .runtime()
        .image_status(&format!("{name}:v1"))
        .await
        .unwrap()
        .unwrap()
        .id;
    assert_eq!(t.image_id, format!("{name}@{id}"));
    wait::events(api, LIMIT, "PullImageSucceed", 1).await;
    wait::events(api, LIMIT, "PullImageFailed", 1).await;

    let (code, metrics) = support::daemon::http_get(d.admin, "/metrics").await;
    assert_eq!(code, 200);
    for want in [
        r#"kruised_imagepull_pulls_total{source="nodeimage",result="succeeded"} 1"#,
        r#"kruised_imagepull_pulls_total{source="nodeimage",result="failed"} 1"#,
        "kruised_imagepull_pull_duration_seconds_count",
        "kruised_imagepull_queue_length 0",
    ] {
        assert!(metrics.contains(want), "{want} missing from\n{metrics}");
    }

    d.terminate();
    let status = d.wait_exit(Duration::from_secs(10)).await;
    assert!(status.success(), "exit status {status}");
    let seen = [
        ("the daemon's log", serde_json::to_string(&d.log()).unwrap()),
        (
            "the NodeImage",
            serde_json::to_string(&api.get("nodeimages", "", NODE)).unwrap(),
        ),
        (
            "the events",
            serde_json::to_string(&api.list("events", None)).unwrap(),
        ),
    ];
    for secret in [
        password.clone(),
        wrong.clone(),
        b64(&format!("{user}:{password}")),
        b64(&format!("{user}:{wrong}")),
    ] {
        for (what, text) in &seen {
            assert!(!text.contains(&secret), "{what} shows a credential: {text}");
        }
    }
    assert!(
        d.log()
            .iter()
            .any(|l| l["message"].as_str().is_some_and(|m| m.contains("pulled"))),
        "the log says what happened: {:#?}",
        d.log()
    );
}

/// A credential provider plugin for the lab's authenticated registry: answers with `password`
/// (no cache, so every pull asks again) and counts its calls.
fn write_plugin(dir: &std::path::Path, registry: &str, user: &str, password: &str) {
    use std::os::unix::fs::PermissionsExt;
    let answer = json!({
        "kind": "CredentialProviderResponse",
        "apiVersion": "credentialprovider.kubelet.k8s.io/v1",
        "cacheKeyType": "Registry", "cacheDuration": "0s",
        "auth": {registry: {"username": user, "password": password}}
    });
    let script = format!(
        "#!/bin/sh\ncat > /dev/null\necho call >> {calls}\ncat <<'JSON'\n{answer}\nJSON\n",
        calls = dir.join("calls").display()
    );
    let path = dir.join("lab-login");
    std::fs::write(&path, script).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[tokio::test]
async fn a_credential_provider_plugin_logs_in_where_no_pull_secret_matches_and_its_password_stays_hidden()
 {
    let Some(lab) = Lab::get() else { return };
    let (user, password) = lab.auth_credentials();
    let wrong = format!("not-{password}");
    let name = format!("{}/secure/plugin", lab.auth_registry);
    lab.runtime()
        .remove_image(&format!("{name}:v1"))
        .await
        .unwrap();

    let plane = Plane::start().await;
    let (api, dir) = (&plane.api, &plane.dir);
    let bin = dir.path().join("plugins");
    std::fs::create_dir(&bin).unwrap();
    write_plugin(&bin, &lab.auth_registry, &user, &password);
    let config = dir.path().join("CredentialProviderPlugin.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n\
             - name: lab-login\n  matchImages: [\"{}\"]\n  defaultCacheDuration: 1m\n  \
             apiVersion: credentialprovider.kubelet.k8s.io/v1\n",
            lab.auth_registry
        ),
    )
    .unwrap();
    // no pull secret at all: only the plugin can log in
    pull_support::create_node_image(
        api,
        json!({ &name: {"tags": [{"tag": "v1", "version": 1, "pullPolicy": {"backoffLimit": 0}}]}}),
        None,
    );
    let mut d = plane
        .start_daemon(
            &lab,
            NODE,
            &[
                "--plugin-config-file",
                config.to_str().unwrap(),
                "--plugin-bin-dir",
                bin.to_str().unwrap(),
            ],
            LIMIT,
        )
        .await;
    d.wait_for_log("credential provider plugins registered", LIMIT)
        .await;
    let s = wait::node_image(api, LIMIT, NODE, "Succeeded through the plugin", |s| {
        s.succeeded == 1
    })
    .await;
    let id = lab
        .runtime()
        .image_status(&format!("{name}:v1"))
        .await
        .unwrap()
        .unwrap()
        .id;
    assert_eq!(tag(&s, &name, "v1").image_id, format!("{name}@{id}"));
    let calls = std::fs::read_to_string(bin.join("calls")).unwrap();
    assert_eq!(calls.lines().count(), 1, "the plugin ran once");

    // a wrong answer: the pull fails with the registry's reason
    write_plugin(&bin, &lab.auth_registry, &user, &wrong);
    lab.runtime()
        .remove_image(&format!("{name}:v1"))
        .await
        .unwrap();
    api.modify("nodeimages", "", NODE, |o| {
        o["spec"]["images"][&name]["tags"][0]["version"] = json!(2);
    })
    .unwrap();
    let s = wait::node_image(api, LIMIT, NODE, "Failed with the wrong answer", |s| {
        s.failed == 1
    })
    .await;
    let message = tag(&s, &name, "v1").message.to_lowercase();
    assert!(
        lab.runtime.says_unauthorized(&message),
        "an authentication error: {message}"
    );

    d.terminate();
    assert!(d.wait_exit(Duration::from_secs(10)).await.success());
    let seen = [
        ("the daemon's log", serde_json::to_string(&d.log()).unwrap()),
        (
            "the NodeImage",
            serde_json::to_string(&api.get("nodeimages", "", NODE)).unwrap(),
        ),
        (
            "the events",
            serde_json::to_string(&api.list("events", None)).unwrap(),
        ),
    ];
    for secret in [
        password.clone(),
        wrong.clone(),
        b64(&format!("{user}:{password}")),
    ] {
        for (what, text) in &seen {
            assert!(!text.contains(&secret), "{what} shows a credential: {text}");
        }
    }
}

/// A credential provider plugin that answers for `registry` only when `$HOME/.aws/config`
/// exists, as ECR's reads its credentials from `$HOME/.aws`, and writes down each HOME it was
/// run with (`homes` beside it).
fn write_home_plugin(dir: &std::path::Path, registry: &str, user: &str, password: &str) {
    use std::os::unix::fs::PermissionsExt;
    let answer = json!({
        "kind": "CredentialProviderResponse",
        "apiVersion": "credentialprovider.kubelet.k8s.io/v1",
        "cacheKeyType": "Registry", "cacheDuration": "0s",
        "auth": {registry: {"username": user, "password": password}}
    });
    let script = format!(
        "#!/bin/sh\ncat > /dev/null\necho \"$HOME\" >> {homes}\n\
         [ -f \"$HOME/.aws/config\" ] || {{ echo \"no $HOME/.aws/config\" >&2; exit 1; }}\n\
         cat <<'JSON'\n{answer}\nJSON\n",
        homes = dir.join("homes").display()
    );
    let path = dir.join("aws-login");
    std::fs::write(&path, script).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

// Field report: ECR's and other plugins look for `$HOME/.aws`, kruise's chart mounts the AWS
// credentials at /root/.aws, and kruised's image set no HOME (the runtime gives a user without a
// passwd entry `/`: the plugins looked in /.aws). kruised runs a plugin with its own environment,
// as the kubelet does (the provider's `env` on top); the image and deploy/daemonset.yaml set
// HOME=/root. Here kruised's HOME is a directory of the test's, standing for /root. The image
// stays on the node (the other plugin test removes it; a pull without credentials fails at the
// registry either way), so the two tests can run at once.
#[tokio::test]
async fn a_credential_provider_plugin_finds_its_credentials_under_the_home_kruised_runs_it_with() {
    let Some(lab) = Lab::get() else { return };
    let (user, password) = lab.auth_credentials();
    let name = format!("{}/secure/plugin", lab.auth_registry);
    let plane = Plane::start().await;
    let (api, dir) = (&plane.api, &plane.dir);
    let bin = dir.path().join("plugins");
    std::fs::create_dir(&bin).unwrap();
    write_home_plugin(&bin, &lab.auth_registry, &user, &password);
    let home = dir.path().join("home");
    std::fs::create_dir(&home).unwrap();
    let config = dir.path().join("CredentialProviderPlugin.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n\
             - name: aws-login\n  matchImages: [\"{}\"]\n  defaultCacheDuration: 1m\n  \
             apiVersion: credentialprovider.kubelet.k8s.io/v1\n",
            lab.auth_registry
        ),
    )
    .unwrap();
    pull_support::create_node_image(
        api,
        json!({ &name: {"tags": [{"tag": "v1", "version": 1, "pullPolicy": {"backoffLimit": 0}}]}}),
        None,
    );
    let admin = support::daemon::free_addr().to_string();
    let mut args: Vec<String> = [
        "--log-format",
        "json",
        "run",
        "--node-name",
        NODE,
        "--addr",
        &admin,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(support::daemon_args(
        &plane.kubeconfig(),
        &lab.endpoint().to_string(),
    ));
    args.extend([
        "--plugin-config-file".to_string(),
        config.display().to_string(),
        "--plugin-bin-dir".to_string(),
        bin.display().to_string(),
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let home_text = home.display().to_string();
    let mut d = support::daemon::Daemon::start_exe(
        &support::daemon::kruised_bin(),
        &args,
        &[("HOME", home_text.as_str())],
    );
    d.wait_for_log("credential provider plugins registered", LIMIT)
        .await;

    // nothing under $HOME/.aws yet: the plugin has no answer, the registry refuses the pull
    let s = wait::node_image(api, LIMIT, NODE, "Failed without credentials", |s| {
        s.failed == 1
    })
    .await;
    let message = tag(&s, &name, "v1").message.to_lowercase();
    assert!(
        lab.runtime.says_unauthorized(&message),
        "an authentication error: {message}"
    );
    d.wait_for_log("credential provider plugin failed", LIMIT)
        .await;

    // the credentials where the chart mounts them for kruised: $HOME/.aws
    std::fs::create_dir(home.join(".aws")).unwrap();
    std::fs::write(home.join(".aws/config"), "[default]\nregion = eu-west-1\n").unwrap();
    api.modify("nodeimages", "", NODE, |o| {
        o["spec"]["images"][&name]["tags"][0]["version"] = json!(2);
    })
    .unwrap();
    wait::node_image(
        api,
        LIMIT,
        NODE,
        "Succeeded with the plugin's answer",
        |s| s.succeeded == 1,
    )
    .await;
    let homes = std::fs::read_to_string(bin.join("homes")).unwrap();
    assert!(
        homes.lines().count() >= 2 && homes.lines().all(|h| h == home_text),
        "the plugin ran with kruised's HOME each time: {homes}"
    );
    d.terminate();
    assert!(d.wait_exit(Duration::from_secs(10)).await.success());
}
