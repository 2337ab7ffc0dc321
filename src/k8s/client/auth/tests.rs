use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use tower::ServiceExt;

use super::*;

/// An executable shell script at `dir/name`.
fn script(dir: &Path, name: &str, body: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).expect("write script");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    path.display().to_string()
}

fn exec_user(command: String) -> AuthInfo {
    AuthInfo {
        exec: Some(ExecConfig {
            api_version: Some("client.authentication.k8s.io/v1".into()),
            command: Some(command),
            args: None,
            env: None,
            drop_env: None,
            install_hint: None,
            interactive_mode: Some(ExecInteractiveMode::Never),
            provide_cluster_info: false,
            cluster: None,
            other: BTreeMap::new(),
        }),
        ..AuthInfo::default()
    }
}

/// The `Authorization` header each of `n` requests through `layer` carried.
async fn headers_sent(layer: &AuthLayer, n: usize) -> Vec<String> {
    let mut seen = Vec::new();
    for _ in 0..n {
        let svc = layer.layer(tower::service_fn(|req: Request<()>| async move {
            Ok::<_, BoxError>(req.headers().get(AUTHORIZATION).cloned())
        }));
        let value = svc
            .oneshot(Request::new(()))
            .await
            .expect("request")
            .expect("an Authorization header");
        assert!(value.is_sensitive(), "credentials are marked sensitive");
        seen.push(value.to_str().expect("ascii").to_string());
    }
    seen
}

#[tokio::test]
async fn a_plugin_token_that_expires_within_the_minute_is_asked_for_again_on_the_next_request() {
    let dir = tempfile::tempdir().expect("tempdir");
    let count = dir.path().join("count");
    let expiry = Timestamp::now() + SignedDuration::from_secs(30);
    let command = script(
        dir.path(),
        "plugin",
        &format!(
            "echo x >> {count}\nn=$(wc -l < {count} | tr -d ' ')\n\
             echo '{{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\",\
             \"status\":{{\"token\":\"t'$n'\",\"expirationTimestamp\":\"{expiry}\"}}}}'",
            count = count.display()
        ),
    );
    let resolved = resolve(&exec_user(command)).await.expect("resolve");
    assert!(resolved.identity.is_none());
    let layer = resolved.layer.expect("a header");
    assert_eq!(
        headers_sent(&layer, 2).await,
        ["Bearer t2", "Bearer t3"],
        "resolving ran the plugin once; each request after it, its token expiring, again"
    );
}

#[tokio::test]
async fn a_plugin_token_far_from_its_expiry_is_reused_and_yaml_answers_are_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    let count = dir.path().join("count");
    let expiry = Timestamp::now() + SignedDuration::from_secs(3600);
    let command = script(
        dir.path(),
        "plugin",
        &format!(
            "echo x >> {count}\nprintf 'kind: ExecCredential\\nstatus:\\n  token: \"  abc  \"\\n  expirationTimestamp: {expiry}\\n'",
            count = count.display()
        ),
    );
    let layer = resolve(&exec_user(command))
        .await
        .expect("resolve")
        .layer
        .expect("a header");
    assert_eq!(headers_sent(&layer, 3).await, ["Bearer abc"; 3]);
    let runs = std::fs::read_to_string(&count).expect("count");
    assert_eq!(runs.lines().count(), 1, "one run for an hour's token");
}

#[tokio::test]
async fn the_plugin_gets_its_request_env_and_args_and_loses_drop_env() {
    let dir = tempfile::tempdir().expect("tempdir");
    let seen = dir.path().join("seen");
    let command = script(
        dir.path(),
        "plugin",
        &format!(
            "{{ echo \"$KUBERNETES_EXEC_INFO\"; echo \"$1 $FROM_CONFIG ${{HOME:-unset}}\"; }} > {seen}\n\
             echo '{{\"status\":{{\"token\":\"ok\"}}}}'",
            seen = seen.display()
        ),
    );
    let mut user = exec_user(command);
    let exec = user.exec.as_mut().expect("exec");
    exec.args = Some(vec!["first".into()]);
    exec.env = Some(vec![
        [
            ("name".to_string(), "FROM_CONFIG".to_string()),
            ("value".to_string(), "v".to_string()),
        ]
        .into_iter()
        .collect(),
    ]);
    exec.drop_env = Some(vec!["HOME".into()]);
    let layer = resolve(&user)
        .await
        .expect("resolve")
        .layer
        .expect("header");
    assert_eq!(headers_sent(&layer, 1).await, ["Bearer ok"]);
    let seen = std::fs::read_to_string(&seen).expect("seen");
    let mut lines = seen.lines();
    let info: serde_json::Value =
        serde_json::from_str(lines.next().expect("exec info")).expect("exec info is JSON");
    assert_eq!(info["kind"], "ExecCredential");
    assert_eq!(info["apiVersion"], "client.authentication.k8s.io/v1");
    assert_eq!(info["spec"]["interactive"], false, "interactiveMode: Never");
    assert_eq!(lines.next(), Some("first v unset"));
}

#[tokio::test]
async fn a_plugin_answering_with_a_certificate_gives_a_tls_identity_and_no_header() {
    let dir = tempfile::tempdir().expect("tempdir");
    let command = script(
        dir.path(),
        "plugin",
        "echo '{\"status\":{\"clientCertificateData\":\"CERT\",\"clientKeyData\":\"KEY\"}}'",
    );
    let resolved = resolve(&exec_user(command)).await.expect("resolve");
    assert!(resolved.layer.is_none());
    assert_eq!(resolved.identity.as_deref(), Some(&b"KEY\nCERT\n"[..]));
}

#[tokio::test]
async fn a_failing_or_empty_handed_plugin_is_an_error_that_names_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let failing = script(dir.path(), "failing", "echo oops >&2; exit 3");
    let err = resolve(&exec_user(failing.clone()))
        .await
        .err()
        .expect("an error");
    let message = err.to_string();
    assert!(
        message.contains(&failing) && message.contains("exit status: 3"),
        "{message}"
    );

    let empty = script(dir.path(), "empty", "echo '{\"status\":{}}'");
    let err = resolve(&exec_user(empty)).await.err().expect("an error");
    assert!(
        err.to_string()
            .contains("neither a token nor a client certificate"),
        "{err}"
    );

    let garbage = script(dir.path(), "garbage", "echo '{not: [valid'");
    let err = resolve(&exec_user(garbage)).await.err().expect("an error");
    assert!(matches!(err, AuthError::Answer { .. }), "{err:?}");
}

#[tokio::test]
async fn a_token_file_is_read_again_after_a_minute_and_its_last_token_kept_if_it_goes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("token");
    std::fs::write(&path, "first\n").expect("write");
    let user = AuthInfo {
        token_file: Some(path.display().to_string()),
        ..AuthInfo::default()
    };
    let layer = resolve(&user)
        .await
        .expect("resolve")
        .layer
        .expect("header");
    std::fs::write(&path, "second").expect("write");
    assert_eq!(
        headers_sent(&layer, 1).await,
        ["Bearer first"],
        "within the minute, the token read first"
    );
    let age = |layer: &AuthLayer| {
        let Source::File { cached, .. } = &*layer.0 else {
            panic!("a token file source")
        };
        let past = Instant::now()
            .checked_sub(TOKEN_FILE_REREAD)
            .expect("uptime");
        crate::sync::lock(cached).1 = past;
    };
    age(&layer);
    assert_eq!(headers_sent(&layer, 1).await, ["Bearer second"]);
    std::fs::remove_file(&path).expect("remove");
    age(&layer);
    assert_eq!(headers_sent(&layer, 1).await, ["Bearer second"]);
}

#[tokio::test]
async fn basic_credentials_and_tokens_go_in_the_header_as_client_go_sends_them() {
    let basic = AuthInfo {
        username: Some("Aladdin".into()),
        password: Some("open sesame".to_string().into()),
        ..AuthInfo::default()
    };
    let layer = resolve(&basic)
        .await
        .expect("resolve")
        .layer
        .expect("header");
    assert_eq!(
        headers_sent(&layer, 1).await,
        ["Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ=="]
    );
    let token = AuthInfo {
        token: Some("abc\n".to_string().into()),
        ..AuthInfo::default()
    };
    let layer = resolve(&token)
        .await
        .expect("resolve")
        .layer
        .expect("header");
    assert_eq!(headers_sent(&layer, 1).await, ["Bearer abc"]);
    let none = resolve(&AuthInfo::default()).await.expect("resolve");
    assert!(none.layer.is_none() && none.identity.is_none());
    let bad = AuthInfo {
        token: Some("a\u{7}b".to_string().into()),
        ..AuthInfo::default()
    };
    assert!(matches!(
        resolve(&bad).await.err(),
        Some(AuthError::Header { what: "token" })
    ));
}

#[tokio::test]
async fn a_gcp_command_token_is_read_at_its_dotted_keys() {
    let dir = tempfile::tempdir().expect("tempdir");
    let expiry = Timestamp::now() + SignedDuration::from_secs(3600);
    let command = script(
        dir.path(),
        "gcloud",
        &format!(
            "[ \"$1 $2\" = \"config config-helper\" ] || exit 9\n\
             echo '{{\"credential\":{{\"access_token\":\"ya29\",\"token_expiry\":\"{expiry}\"}}}}'"
        ),
    );
    let provider = AuthProviderConfig {
        name: "gcp".into(),
        config: [
            ("cmd-path", command.as_str()),
            ("cmd-args", "config config-helper --format=json"),
            ("token-key", "{.credential.access_token}"),
            ("expiry-key", "{.credential.token_expiry}"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
        other: Default::default(),
    };
    let user = AuthInfo {
        auth_provider: Some(provider),
        ..AuthInfo::default()
    };
    let layer = resolve(&user)
        .await
        .expect("resolve")
        .layer
        .expect("header");
    assert_eq!(headers_sent(&layer, 1).await, ["Bearer ya29"]);
    let Source::Expiring { cached, .. } = &*layer.0 else {
        panic!("an expiring token")
    };
    assert_eq!(cached.lock().await.1, expiry);
}

#[tokio::test]
async fn providers_kruised_cannot_serve_are_refused_by_name() {
    for (name, want) in [
        ("azure", "kubelogin"),
        ("keystone", "not supported"),
        ("gcp", "gke-gcloud-auth-plugin"),
    ] {
        let user = AuthInfo {
            auth_provider: Some(AuthProviderConfig {
                name: name.into(),
                config: Default::default(),
                other: Default::default(),
            }),
            ..AuthInfo::default()
        };
        let err = resolve(&user).await.err().expect("refused").to_string();
        assert!(
            err.starts_with(&format!("auth-provider {name}: ")) && err.contains(want),
            "{err}"
        );
    }
}

#[test]
fn dotted_paths_read_nested_keys_and_indexes_and_refuse_other_jsonpath() {
    let json = serde_json::json!({"a": {"b": [{"c": "deep"}], "s": "top"}, "n": 1});
    assert_eq!(string_at(&json, "{.a.s}"), Ok("top"));
    assert_eq!(string_at(&json, "$.a.b[0].c"), Ok("deep"));
    assert_eq!(string_at(&json, "a.b[0].c"), Ok("deep"));
    assert!(
        string_at(&json, "{.n}")
            .unwrap_err()
            .contains("not a string")
    );
    assert!(
        string_at(&json, "{.a.missing}")
            .unwrap_err()
            .contains("no \"missing\"")
    );
    assert!(
        string_at(&json, "{.a.b[3].c}")
            .unwrap_err()
            .contains("no element 3")
    );
    for unsupported in ["{.a.b[*].c}", "{..c}", "{.a.b[?(@.c)]}", "{.a.b[0]x}"] {
        assert!(
            string_at(&json, unsupported)
                .unwrap_err()
                .contains("dotted paths"),
            "{unsupported}"
        );
    }
}
