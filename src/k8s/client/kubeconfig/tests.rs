use super::*;

/// A kubeconfig with every kind of field kube reads: inline and file credentials, an exec
/// plugin with its environment and mode, an auth provider, extensions, preferences, and a key
/// kube does not know.
const RICH: &str = r#"
apiVersion: v1
kind: Config
current-context: 1.10
preferences:
  colors: true
clusters:
- name: 1.10
  cluster:
    server: https://10.0.0.1:6443
    certificate-authority: pki/ca.crt
    proxy-url: http://proxy:3128
    tls-server-name: api.internal
    insecure-skip-tls-verify: false
    disable-compression: true
    extensions:
    - name: client.authentication.k8s.io/exec
      extension: {audience: x, retries: 3, on: true}
users:
- name: admin
  user:
    client-certificate: pki/admin.crt
    client-key: /abs/admin.key
    tokenFile: token
    as: someone
    as-groups: [a, "b"]
    exec:
      apiVersion: client.authentication.k8s.io/v1
      command: ./bin/get-token
      args: ["--region", 1.10]
      env:
      - name: DEBUG
        value: true
      interactiveMode: Never
      provideClusterInfo: true
- name: bare
  user:
    exec:
      apiVersion: client.authentication.k8s.io/v1
      command: aws
- name: gcp
  user:
    auth-provider:
      name: gcp
      config: {cmd-path: gcloud, token-key: '{.credential.access_token}'}
contexts:
- name: 1.10
  context: {cluster: 1.10, user: admin, namespace: "007"}
unknown-key: [1, two]
"#;

fn write(dir: &Path, name: &str, text: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn json(config: &Kubeconfig) -> serde_json::Value {
    serde_json::to_value(config).unwrap()
}

#[test]
fn a_kubeconfig_reads_as_kubes_own_reader_reads_it_where_that_keeps_the_text() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "config", RICH.as_bytes());
    let ours = read_from(&path).unwrap();
    let dir_s = dir.path().to_str().unwrap();
    // where the two readers agree: kube reads a name of 1.10 as a number, and a string field
    // cannot hold it, so compare with that text quoted
    let quoted = RICH
        .replace(" 1.10", " \"1.10\"")
        .replace("value: true", "value: \"true\"");
    let kubes = Kubeconfig::read_from(write(dir.path(), "quoted", quoted.as_bytes())).unwrap();
    assert_eq!(json(&ours), json(&kubes));
    assert_eq!(ours.current_context.as_deref(), Some("1.10"));
    let cluster = ours.clusters[0].cluster.as_ref().unwrap();
    assert_eq!(
        cluster.certificate_authority.as_deref(),
        Some(format!("{dir_s}/pki/ca.crt").as_str())
    );
    let admin = ours.auth_infos[0].auth_info.as_ref().unwrap();
    assert_eq!(admin.client_key.as_deref(), Some("/abs/admin.key"));
    assert_eq!(
        admin.token_file.as_deref(),
        Some(format!("{dir_s}/token").as_str())
    );
    let exec = admin.exec.as_ref().unwrap();
    assert_eq!(
        exec.command.as_deref(),
        Some(format!("{dir_s}/./bin/get-token").as_str())
    );
    assert_eq!(exec.args.as_ref().unwrap()[1], "1.10");
    assert_eq!(exec.env.as_ref().unwrap()[0]["value"], "true");
    assert!(exec.provide_cluster_info);
    let bare = ours.auth_infos[1].auth_info.as_ref().unwrap();
    assert_eq!(bare.exec.as_ref().unwrap().command.as_deref(), Some("aws"));
    assert_eq!(
        ours.contexts[0]
            .context
            .as_ref()
            .unwrap()
            .namespace
            .as_deref(),
        Some("007")
    );
    assert_eq!(ours.other["unknown-key"], serde_json::json!([1, "two"]));
}

#[test]
fn documents_and_files_merge_the_first_to_set_a_value_winning() {
    let dir = tempfile::tempdir().unwrap();
    let one = "current-context: a\nclusters:\n- name: c\n  cluster: {server: https://one}\n";
    let two = "current-context: b\nclusters:\n- name: c\n  cluster: {server: https://two}\n\
               - name: d\n  cluster: {server: https://three}\n";
    let both = write(dir.path(), "both", format!("{one}---\n{two}").as_bytes());
    let merged = read_from(&both).unwrap();
    assert_eq!(merged.current_context.as_deref(), Some("a"));
    let servers: Vec<_> = merged
        .clusters
        .iter()
        .map(|c| c.cluster.as_ref().unwrap().server.clone().unwrap())
        .collect();
    assert_eq!(servers, ["https://one", "https://three"]);

    let first = write(dir.path(), "first", two.as_bytes());
    let second = write(dir.path(), "second", one.as_bytes());
    let list = std::env::join_paths([first.as_path(), Path::new(""), second.as_path()]).unwrap();
    let merged = read_default_of(Some(list), None).unwrap();
    assert_eq!(merged.current_context.as_deref(), Some("b"));
    assert_eq!(merged.clusters.len(), 2);
}

#[test]
fn without_kubeconfig_the_file_in_the_home_directory_is_read() {
    let home = tempfile::tempdir().unwrap();
    std::fs::create_dir(home.path().join(".kube")).unwrap();
    write(
        &home.path().join(".kube"),
        "config",
        b"current-context: home\n",
    );
    let read = read_default_of(None, Some(home.path().into())).unwrap();
    assert_eq!(read.current_context.as_deref(), Some("home"));
    let empty = std::ffi::OsString::new();
    let read = read_default_of(Some(empty), Some(home.path().into())).unwrap();
    assert_eq!(read.current_context.as_deref(), Some("home"));
    assert!(matches!(
        read_default_of(None, None),
        Err(KubeconfigReadError::NoPath)
    ));
}

#[test]
fn a_utf16_file_with_its_mark_and_a_utf8_file_with_its_mark_are_read() {
    let dir = tempfile::tempdir().unwrap();
    let text = "current-context: x\n";
    let mut le = vec![0xFF, 0xFE];
    le.extend(text.encode_utf16().flat_map(u16::to_le_bytes));
    let mut be = vec![0xFE, 0xFF];
    be.extend(text.encode_utf16().flat_map(u16::to_be_bytes));
    let mut utf8 = vec![0xEF, 0xBB, 0xBF];
    utf8.extend(text.bytes());
    for (name, bytes) in [("le", le), ("be", be), ("utf8", utf8)] {
        let read = read_from(&write(dir.path(), name, &bytes)).unwrap();
        assert_eq!(read.current_context.as_deref(), Some("x"), "{name}");
    }
    let odd = write(dir.path(), "odd", &[0xFF, 0xFE, b'#']);
    assert!(
        read_from(&odd).is_ok(),
        "an odd byte is read as a last unit, not a panic"
    );
}

#[test]
fn a_file_that_is_missing_too_large_or_not_a_kubeconfig_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing");
    let err = read_from(&missing).unwrap_err().to_string();
    assert!(
        err.starts_with(&format!("cannot read {}", missing.display())),
        "{err}"
    );

    let big = write(
        dir.path(),
        "big",
        &vec![b'#'; MAX_KUBECONFIG_BYTES as usize + 1],
    );
    let err = read_from(&big).unwrap_err().to_string();
    assert!(err.contains("larger than 16 MiB"), "{err}");

    let bad = write(
        dir.path(),
        "bad",
        b"clusters:\n- name: a\n  cluster: [oops]\n",
    );
    let err = read_from(&bad).unwrap_err().to_string();
    assert!(
        err.starts_with(&format!(
            "{} is not a kubeconfig: clusters[0].cluster:",
            bad.display()
        )),
        "{err}"
    );

    let broken = write(dir.path(), "broken", b"clusters: [\n");
    let err = read_from(&broken).unwrap_err().to_string();
    assert!(err.contains("line"), "{err}");

    let kinds = write(dir.path(), "kinds", b"kind: Config\n---\nkind: Other\n");
    assert!(matches!(
        read_from(&kinds),
        Err(KubeconfigReadError::Merge(_))
    ));
}
