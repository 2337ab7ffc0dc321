//! kubelet's container hash (`io.kubernetes.container.hash`), both formulas kruise accepts.
//!
//! * kubelet ≥ 1.31 ([`hash_container`]): `DeepHashObject(json.Marshal(map[string]string{"name", "image"}))`.
//! * kubelet ≤ 1.30 ([`hash_container_legacy`]): `DeepHashObject(json.Marshal(v1.Container))`, the whole
//!   container as `k8s.io/api` v0.30 declares it (field order, `omitempty` flags and field set of
//!   `core/v1/types.go` at tag v0.30.14, commit e619809ab08129f17d21e98adfd8f00740c10343).
//!
//! kubelet writes the hash as lowercase hex without padding ([`format_hash`]); kruise reads it back with
//! `strconv.ParseUint(s, 16, 64)` ([`parse_hash`]).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::deep_hash_bytes;
use crate::gojson::{GoStruct, GoValue, marshal};

/// kubelet ≥ 1.31 `HashContainer`: hash of `{"image":…,"name":…}`.
pub fn hash_container(c: &core::Container) -> u64 {
    deep_hash_bytes(&container_json(c))
}

/// kubelet ≤ 1.30 `HashContainer` (also kruise-manager's copied `hashContainer`): hash of the Go JSON
/// of the full `v1.Container`.
pub fn hash_container_legacy(c: &core::Container) -> u64 {
    deep_hash_bytes(&legacy_container_json(c))
}

/// The bytes kubelet ≥ 1.31 hashes: `json.Marshal(map[string]string{"name": …, "image": …})`.
pub fn container_json(c: &core::Container) -> Vec<u8> {
    let fields: BTreeMap<String, GoValue> = [
        ("name".to_owned(), GoValue::from(c.name.as_str())),
        (
            "image".to_owned(),
            GoValue::from(c.image.as_deref().unwrap_or_default()),
        ),
    ]
    .into();
    marshal(&GoValue::Map(fields))
}

/// The bytes kubelet ≤ 1.30 hashes: `json.Marshal(container)` with k8s.io/api v0.30 types.
///
/// Fields newer than 1.30 (`resources.claims[].request`, `lifecycle.stopSignal`) are not emitted.
/// Quantities are emitted as their string; quantities served by the API server are already in the
/// canonical form Go's `Quantity.MarshalJSON` would print.
pub fn legacy_container_json(c: &core::Container) -> Vec<u8> {
    marshal(&container_v1_30(c))
}

/// kubelet's annotation text for a hash: `strconv.FormatUint(h, 16)`.
pub fn format_hash(hash: u64) -> String {
    format!("{hash:x}")
}

/// `strconv.ParseUint(s, 16, 64)`: hex digits of either case only (no sign, no `0x`, no `_`), at
/// least one, no overflow. kruise stores 0 when this fails or the annotation is missing.
pub fn parse_hash(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(s, 16).ok()
}

// ---- Go JSON of k8s.io/api v0.30 core/v1 types -------------------------------------------------

fn string(s: &str) -> GoValue {
    GoValue::from(s)
}

fn opt_string(s: &Option<String>) -> Option<GoValue> {
    s.as_deref().map(GoValue::from)
}

fn opt_bool(b: &Option<bool>) -> Option<GoValue> {
    b.map(GoValue::Bool)
}

fn opt_i32(i: &Option<i32>) -> Option<GoValue> {
    i.map(GoValue::from)
}

fn opt_i64(i: &Option<i64>) -> Option<GoValue> {
    i.map(GoValue::Int)
}

fn opt_list<T>(items: &Option<Vec<T>>, f: impl Fn(&T) -> GoValue) -> Option<GoValue> {
    items
        .as_ref()
        .map(|items| GoValue::Array(items.iter().map(f).collect()))
}

fn opt_struct<T>(v: &Option<T>, f: impl Fn(&T) -> GoValue) -> Option<GoValue> {
    v.as_ref().map(f)
}

fn strings(items: &Option<Vec<String>>) -> Option<GoValue> {
    opt_list(items, |s| string(s))
}

fn quantity(q: &Quantity) -> GoValue {
    GoValue::from(q.0.as_str())
}

fn resource_list(list: &Option<BTreeMap<String, Quantity>>) -> Option<GoValue> {
    list.as_ref().map(|m| {
        GoValue::Map(
            m.iter()
                .map(|(name, q)| (name.clone(), quantity(q)))
                .collect(),
        )
    })
}

fn int_or_string(v: &IntOrString) -> GoValue {
    match v {
        IntOrString::Int(i) => GoValue::from(*i),
        IntOrString::String(s) => string(s),
    }
}

fn container_v1_30(c: &core::Container) -> GoValue {
    GoStruct::new()
        .field("name", string(&c.name))
        .omitempty("image", opt_string(&c.image))
        .omitempty("command", strings(&c.command))
        .omitempty("args", strings(&c.args))
        .omitempty("workingDir", opt_string(&c.working_dir))
        .omitempty("ports", opt_list(&c.ports, container_port))
        .omitempty("envFrom", opt_list(&c.env_from, env_from_source))
        .omitempty("env", opt_list(&c.env, env_var))
        // `json:"resources,omitempty"` on a struct never omits.
        .field(
            "resources",
            c.resources.as_ref().map_or_else(
                || resource_requirements(&core::ResourceRequirements::default()),
                resource_requirements,
            ),
        )
        .omitempty(
            "resizePolicy",
            opt_list(&c.resize_policy, container_resize_policy),
        )
        .ptr_omitempty("restartPolicy", opt_string(&c.restart_policy))
        .omitempty("volumeMounts", opt_list(&c.volume_mounts, volume_mount))
        .omitempty("volumeDevices", opt_list(&c.volume_devices, volume_device))
        .ptr_omitempty("livenessProbe", opt_struct(&c.liveness_probe, probe))
        .ptr_omitempty("readinessProbe", opt_struct(&c.readiness_probe, probe))
        .ptr_omitempty("startupProbe", opt_struct(&c.startup_probe, probe))
        .ptr_omitempty("lifecycle", opt_struct(&c.lifecycle, lifecycle))
        .omitempty(
            "terminationMessagePath",
            opt_string(&c.termination_message_path),
        )
        .omitempty(
            "terminationMessagePolicy",
            opt_string(&c.termination_message_policy),
        )
        .omitempty("imagePullPolicy", opt_string(&c.image_pull_policy))
        .ptr_omitempty(
            "securityContext",
            opt_struct(&c.security_context, security_context),
        )
        .omitempty("stdin", opt_bool(&c.stdin))
        .omitempty("stdinOnce", opt_bool(&c.stdin_once))
        .omitempty("tty", opt_bool(&c.tty))
        .build()
}

fn container_port(p: &core::ContainerPort) -> GoValue {
    GoStruct::new()
        .omitempty("name", opt_string(&p.name))
        .omitempty("hostPort", opt_i32(&p.host_port))
        .field("containerPort", p.container_port)
        .omitempty("protocol", opt_string(&p.protocol))
        .omitempty("hostIP", opt_string(&p.host_ip))
        .build()
}

/// `LocalObjectReference` (embedded inline): `Name string json:"name,omitempty"`.
fn local_object_reference(name: &str) -> GoStruct {
    GoStruct::new().omitempty("name", Some(string(name)))
}

fn env_from_source(e: &core::EnvFromSource) -> GoValue {
    GoStruct::new()
        .omitempty("prefix", opt_string(&e.prefix))
        .ptr_omitempty(
            "configMapRef",
            opt_struct(&e.config_map_ref, |r| {
                GoStruct::new()
                    .inline(local_object_reference(&r.name))
                    .ptr_omitempty("optional", opt_bool(&r.optional))
                    .build()
            }),
        )
        .ptr_omitempty(
            "secretRef",
            opt_struct(&e.secret_ref, |r| {
                GoStruct::new()
                    .inline(local_object_reference(&r.name))
                    .ptr_omitempty("optional", opt_bool(&r.optional))
                    .build()
            }),
        )
        .build()
}

fn env_var(e: &core::EnvVar) -> GoValue {
    GoStruct::new()
        .field("name", string(&e.name))
        .omitempty("value", opt_string(&e.value))
        .ptr_omitempty("valueFrom", opt_struct(&e.value_from, env_var_source))
        .build()
}

fn env_var_source(s: &core::EnvVarSource) -> GoValue {
    GoStruct::new()
        .ptr_omitempty(
            "fieldRef",
            opt_struct(&s.field_ref, |f| {
                GoStruct::new()
                    .omitempty("apiVersion", opt_string(&f.api_version))
                    .field("fieldPath", string(&f.field_path))
                    .build()
            }),
        )
        .ptr_omitempty(
            "resourceFieldRef",
            opt_struct(&s.resource_field_ref, |r| {
                GoStruct::new()
                    .omitempty("containerName", opt_string(&r.container_name))
                    .field("resource", string(&r.resource))
                    // A zero `resource.Quantity` struct is not omitted; it marshals as "0".
                    .field(
                        "divisor",
                        r.divisor.as_ref().map_or_else(|| string("0"), quantity),
                    )
                    .build()
            }),
        )
        .ptr_omitempty(
            "configMapKeyRef",
            opt_struct(&s.config_map_key_ref, |k| {
                GoStruct::new()
                    .inline(local_object_reference(&k.name))
                    .field("key", string(&k.key))
                    .ptr_omitempty("optional", opt_bool(&k.optional))
                    .build()
            }),
        )
        .ptr_omitempty(
            "secretKeyRef",
            opt_struct(&s.secret_key_ref, |k| {
                GoStruct::new()
                    .inline(local_object_reference(&k.name))
                    .field("key", string(&k.key))
                    .ptr_omitempty("optional", opt_bool(&k.optional))
                    .build()
            }),
        )
        .build()
}

fn resource_requirements(r: &core::ResourceRequirements) -> GoValue {
    GoStruct::new()
        .omitempty("limits", resource_list(&r.limits))
        .omitempty("requests", resource_list(&r.requests))
        // v0.30 ResourceClaim has only `name` (`request` arrived in 1.31/1.32).
        .omitempty(
            "claims",
            opt_list(&r.claims, |c| {
                GoStruct::new().field("name", string(&c.name)).build()
            }),
        )
        .build()
}

fn container_resize_policy(p: &core::ContainerResizePolicy) -> GoValue {
    GoStruct::new()
        .field("resourceName", string(&p.resource_name))
        .field("restartPolicy", string(&p.restart_policy))
        .build()
}

fn volume_mount(m: &core::VolumeMount) -> GoValue {
    GoStruct::new()
        .field("name", string(&m.name))
        .omitempty("readOnly", opt_bool(&m.read_only))
        .ptr_omitempty("recursiveReadOnly", opt_string(&m.recursive_read_only))
        .field("mountPath", string(&m.mount_path))
        .omitempty("subPath", opt_string(&m.sub_path))
        .ptr_omitempty("mountPropagation", opt_string(&m.mount_propagation))
        .omitempty("subPathExpr", opt_string(&m.sub_path_expr))
        .build()
}

fn volume_device(d: &core::VolumeDevice) -> GoValue {
    GoStruct::new()
        .field("name", string(&d.name))
        .field("devicePath", string(&d.device_path))
        .build()
}

fn exec_action(e: &core::ExecAction) -> GoValue {
    GoStruct::new()
        .omitempty("command", strings(&e.command))
        .build()
}

fn http_get_action(h: &core::HTTPGetAction) -> GoValue {
    GoStruct::new()
        .omitempty("path", opt_string(&h.path))
        .field("port", int_or_string(&h.port))
        .omitempty("host", opt_string(&h.host))
        .omitempty("scheme", opt_string(&h.scheme))
        .omitempty(
            "httpHeaders",
            opt_list(&h.http_headers, |hd| {
                GoStruct::new()
                    .field("name", string(&hd.name))
                    .field("value", string(&hd.value))
                    .build()
            }),
        )
        .build()
}

fn tcp_socket_action(t: &core::TCPSocketAction) -> GoValue {
    GoStruct::new()
        .field("port", int_or_string(&t.port))
        .omitempty("host", opt_string(&t.host))
        .build()
}

fn grpc_action(g: &core::GRPCAction) -> GoValue {
    GoStruct::new()
        .field("port", g.port)
        // `Service *string json:"service"`: no omitempty, so nil is `null`.
        .ptr("service", opt_string(&g.service))
        .build()
}

fn probe(p: &core::Probe) -> GoValue {
    GoStruct::new()
        // Embedded ProbeHandler (inline).
        .ptr_omitempty("exec", opt_struct(&p.exec, exec_action))
        .ptr_omitempty("httpGet", opt_struct(&p.http_get, http_get_action))
        .ptr_omitempty("tcpSocket", opt_struct(&p.tcp_socket, tcp_socket_action))
        .ptr_omitempty("grpc", opt_struct(&p.grpc, grpc_action))
        .omitempty("initialDelaySeconds", opt_i32(&p.initial_delay_seconds))
        .omitempty("timeoutSeconds", opt_i32(&p.timeout_seconds))
        .omitempty("periodSeconds", opt_i32(&p.period_seconds))
        .omitempty("successThreshold", opt_i32(&p.success_threshold))
        .omitempty("failureThreshold", opt_i32(&p.failure_threshold))
        .ptr_omitempty(
            "terminationGracePeriodSeconds",
            opt_i64(&p.termination_grace_period_seconds),
        )
        .build()
}

fn lifecycle(l: &core::Lifecycle) -> GoValue {
    // v0.30 has no `stopSignal` (added in 1.33).
    GoStruct::new()
        .ptr_omitempty("postStart", opt_struct(&l.post_start, lifecycle_handler))
        .ptr_omitempty("preStop", opt_struct(&l.pre_stop, lifecycle_handler))
        .build()
}

fn lifecycle_handler(h: &core::LifecycleHandler) -> GoValue {
    GoStruct::new()
        .ptr_omitempty("exec", opt_struct(&h.exec, exec_action))
        .ptr_omitempty("httpGet", opt_struct(&h.http_get, http_get_action))
        .ptr_omitempty("tcpSocket", opt_struct(&h.tcp_socket, tcp_socket_action))
        .ptr_omitempty(
            "sleep",
            opt_struct(&h.sleep, |s| {
                GoStruct::new().field("seconds", s.seconds).build()
            }),
        )
        .build()
}

fn security_context(s: &core::SecurityContext) -> GoValue {
    GoStruct::new()
        .ptr_omitempty(
            "capabilities",
            opt_struct(&s.capabilities, |c| {
                GoStruct::new()
                    .omitempty("add", strings(&c.add))
                    .omitempty("drop", strings(&c.drop))
                    .build()
            }),
        )
        .ptr_omitempty("privileged", opt_bool(&s.privileged))
        .ptr_omitempty(
            "seLinuxOptions",
            opt_struct(&s.se_linux_options, |o| {
                GoStruct::new()
                    .omitempty("user", opt_string(&o.user))
                    .omitempty("role", opt_string(&o.role))
                    .omitempty("type", opt_string(&o.type_))
                    .omitempty("level", opt_string(&o.level))
                    .build()
            }),
        )
        .ptr_omitempty(
            "windowsOptions",
            opt_struct(&s.windows_options, |w| {
                GoStruct::new()
                    .ptr_omitempty(
                        "gmsaCredentialSpecName",
                        opt_string(&w.gmsa_credential_spec_name),
                    )
                    .ptr_omitempty("gmsaCredentialSpec", opt_string(&w.gmsa_credential_spec))
                    .ptr_omitempty("runAsUserName", opt_string(&w.run_as_user_name))
                    .ptr_omitempty("hostProcess", opt_bool(&w.host_process))
                    .build()
            }),
        )
        .ptr_omitempty("runAsUser", opt_i64(&s.run_as_user))
        .ptr_omitempty("runAsGroup", opt_i64(&s.run_as_group))
        .ptr_omitempty("runAsNonRoot", opt_bool(&s.run_as_non_root))
        .ptr_omitempty(
            "readOnlyRootFilesystem",
            opt_bool(&s.read_only_root_filesystem),
        )
        .ptr_omitempty(
            "allowPrivilegeEscalation",
            opt_bool(&s.allow_privilege_escalation),
        )
        .ptr_omitempty("procMount", opt_string(&s.proc_mount))
        .ptr_omitempty(
            "seccompProfile",
            opt_struct(&s.seccomp_profile, |p| {
                GoStruct::new()
                    .field("type", string(&p.type_))
                    .ptr_omitempty("localhostProfile", opt_string(&p.localhost_profile))
                    .build()
            }),
        )
        .ptr_omitempty(
            "appArmorProfile",
            opt_struct(&s.app_armor_profile, |p| {
                GoStruct::new()
                    .field("type", string(&p.type_))
                    .ptr_omitempty("localhostProfile", opt_string(&p.localhost_profile))
                    .build()
            }),
        )
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The container of kubelet's `TestHashContainer` (pkg/kubelet/container/helpers_test.go).
    fn kubelet_test_container() -> core::Container {
        core::Container {
            name: "test_container".into(),
            image: Some("foo/image:v1".into()),
            args: Some(vec!["/bin/sh".into(), "-c".into(), "echo abc".into()]),
            ports: Some(vec![core::ContainerPort {
                container_port: 8001,
                ..Default::default()
            }]),
            ..Default::default()
        }
    }

    fn legacy_text(c: &core::Container) -> String {
        String::from_utf8(legacy_container_json(c)).unwrap()
    }

    #[test]
    fn legacy_hash_matches_kubelet_vector() {
        let c = kubelet_test_container();
        assert_eq!(
            legacy_text(&c),
            r#"{"name":"test_container","image":"foo/image:v1","args":["/bin/sh","-c","echo abc"],"ports":[{"containerPort":8001}],"resources":{}}"#
        );
        assert_eq!(hash_container_legacy(&c), 0x3c42_280f);
    }

    #[test]
    fn name_and_image_hash_matches_kubelet_1_31_vector() {
        let c = kubelet_test_container();
        assert_eq!(
            container_json(&c),
            br#"{"image":"foo/image:v1","name":"test_container"}"#.to_vec()
        );
        assert_eq!(hash_container(&c), 0x8e45_cbd0);
    }

    #[test]
    fn name_and_image_hash_ignores_every_other_field() {
        let mut c = kubelet_test_container();
        let before = hash_container(&c);
        c.args = None;
        c.stdin = Some(true);
        assert_eq!(hash_container(&c), before);
        assert_ne!(hash_container_legacy(&c), 0x3c42_280f);
    }

    #[test]
    fn hash_is_written_as_unpadded_lowercase_hex() {
        assert_eq!(format_hash(0x3c42_280f), "3c42280f");
        assert_eq!(format_hash(0x0052_f71b), "52f71b");
    }

    #[test]
    fn hash_annotation_parses_like_go_parse_uint_base_16() {
        assert_eq!(parse_hash("8e45cbd0"), Some(0x8e45_cbd0));
        assert_eq!(parse_hash("8E45CBD0"), Some(0x8e45_cbd0));
        assert_eq!(parse_hash("ffffffffffffffff"), Some(u64::MAX));
        for bad in ["", "+1", "-1", "0x1", "1_0", " 1", "g", "10000000000000000"] {
            assert_eq!(parse_hash(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn empty_container_still_emits_name_and_resources() {
        assert_eq!(
            legacy_text(&core::Container::default()),
            r#"{"name":"","resources":{}}"#
        );
    }

    #[test]
    fn omitempty_values_are_dropped_and_pointer_zero_values_kept() {
        let c = core::Container {
            name: "c".into(),
            image: Some(String::new()),
            command: Some(vec![]),
            stdin: Some(false),
            tty: Some(true),
            restart_policy: Some(String::new()),
            security_context: Some(core::SecurityContext {
                privileged: Some(false),
                run_as_user: Some(0),
                ..Default::default()
            }),
            resources: Some(core::ResourceRequirements {
                limits: Some(BTreeMap::new()),
                requests: Some(
                    [
                        ("memory".to_owned(), Quantity("64Mi".into())),
                        ("cpu".to_owned(), Quantity("100m".into())),
                    ]
                    .into(),
                ),
                claims: Some(vec![core::ResourceClaim {
                    name: "gpu".into(),
                    request: Some("newer-than-1.30".into()),
                }]),
            }),
            ..Default::default()
        };
        assert_eq!(
            legacy_text(&c),
            concat!(
                r#"{"name":"c","resources":{"requests":{"cpu":"100m","memory":"64Mi"},"claims":[{"name":"gpu"}]},"#,
                r#""restartPolicy":"","securityContext":{"privileged":false,"runAsUser":0},"tty":true}"#
            )
        );
    }

    #[test]
    fn env_and_env_from_follow_go_field_order() {
        let c = core::Container {
            name: "c".into(),
            env_from: Some(vec![core::EnvFromSource {
                prefix: Some("P_".into()),
                config_map_ref: Some(core::ConfigMapEnvSource {
                    name: "cm".into(),
                    optional: Some(true),
                }),
                secret_ref: Some(core::SecretEnvSource {
                    name: String::new(),
                    optional: None,
                }),
            }]),
            env: Some(vec![
                core::EnvVar {
                    name: "A".into(),
                    value: Some("<1>".into()),
                    value_from: None,
                },
                core::EnvVar {
                    name: "B".into(),
                    value: None,
                    value_from: Some(core::EnvVarSource {
                        field_ref: Some(core::ObjectFieldSelector {
                            api_version: Some("v1".into()),
                            field_path: "metadata.labels['x']".into(),
                        }),
                        resource_field_ref: Some(core::ResourceFieldSelector {
                            container_name: None,
                            divisor: None,
                            resource: "limits.cpu".into(),
                        }),
                        config_map_key_ref: Some(core::ConfigMapKeySelector {
                            key: "k".into(),
                            name: "cm".into(),
                            optional: Some(false),
                        }),
                        secret_key_ref: Some(core::SecretKeySelector {
                            key: "k".into(),
                            name: String::new(),
                            optional: None,
                        }),
                    }),
                },
            ]),
            ..Default::default()
        };
        assert_eq!(
            legacy_text(&c),
            concat!(
                r#"{"name":"c","envFrom":[{"prefix":"P_","configMapRef":{"name":"cm","optional":true},"secretRef":{}}],"#,
                r#""env":[{"name":"A","value":"\u003c1\u003e"},{"name":"B","valueFrom":{"#,
                r#""fieldRef":{"apiVersion":"v1","fieldPath":"metadata.labels['x']"},"#,
                r#""resourceFieldRef":{"resource":"limits.cpu","divisor":"0"},"#,
                r#""configMapKeyRef":{"name":"cm","key":"k","optional":false},"#,
                r#""secretKeyRef":{"key":"k"}}}],"resources":{}}"#
            )
        );
    }

    #[test]
    fn probes_lifecycle_and_mounts_follow_go_field_order() {
        let handler = core::LifecycleHandler {
            exec: Some(core::ExecAction {
                command: Some(vec!["sh".into()]),
            }),
            http_get: Some(core::HTTPGetAction {
                host: None,
                http_headers: Some(vec![core::HTTPHeader {
                    name: "X".into(),
                    value: String::new(),
                }]),
                path: Some("/healthz".into()),
                port: IntOrString::String("http".into()),
                scheme: Some("HTTP".into()),
            }),
            sleep: Some(core::SleepAction { seconds: 0 }),
            tcp_socket: Some(core::TCPSocketAction {
                host: Some("h".into()),
                port: IntOrString::Int(80),
            }),
        };
        let c = core::Container {
            name: "c".into(),
            liveness_probe: Some(core::Probe {
                grpc: Some(core::GRPCAction {
                    port: 9000,
                    service: None,
                }),
                initial_delay_seconds: Some(0),
                period_seconds: Some(10),
                termination_grace_period_seconds: Some(0),
                ..Default::default()
            }),
            lifecycle: Some(core::Lifecycle {
                post_start: None,
                pre_stop: Some(handler),
                stop_signal: Some("SIGTERM".into()),
            }),
            volume_mounts: Some(vec![core::VolumeMount {
                mount_path: "/data".into(),
                mount_propagation: Some("None".into()),
                name: "v".into(),
                read_only: Some(true),
                recursive_read_only: Some("Disabled".into()),
                sub_path: Some(String::new()),
                sub_path_expr: Some("$(X)".into()),
            }]),
            volume_devices: Some(vec![core::VolumeDevice {
                device_path: "/dev/x".into(),
                name: "d".into(),
            }]),
            resize_policy: Some(vec![core::ContainerResizePolicy {
                resource_name: "cpu".into(),
                restart_policy: "NotRequired".into(),
            }]),
            ..Default::default()
        };
        assert_eq!(
            legacy_text(&c),
            concat!(
                r#"{"name":"c","resources":{},"resizePolicy":[{"resourceName":"cpu","restartPolicy":"NotRequired"}],"#,
                r#""volumeMounts":[{"name":"v","readOnly":true,"recursiveReadOnly":"Disabled","mountPath":"/data","#,
                r#""mountPropagation":"None","subPathExpr":"$(X)"}],"#,
                r#""volumeDevices":[{"name":"d","devicePath":"/dev/x"}],"#,
                r#""livenessProbe":{"grpc":{"port":9000,"service":null},"periodSeconds":10,"terminationGracePeriodSeconds":0},"#,
                r#""lifecycle":{"preStop":{"exec":{"command":["sh"]},"#,
                r#""httpGet":{"path":"/healthz","port":"http","scheme":"HTTP","httpHeaders":[{"name":"X","value":""}]},"#,
                r#""tcpSocket":{"port":80,"host":"h"},"sleep":{"seconds":0}}}}"#
            )
        );
    }

    #[test]
    fn security_context_follows_go_field_order() {
        let c = core::Container {
            name: "c".into(),
            security_context: Some(core::SecurityContext {
                allow_privilege_escalation: Some(false),
                app_armor_profile: Some(core::AppArmorProfile {
                    localhost_profile: None,
                    type_: "RuntimeDefault".into(),
                }),
                capabilities: Some(core::Capabilities {
                    add: Some(vec!["NET_ADMIN".into()]),
                    drop: Some(vec!["ALL".into()]),
                }),
                privileged: None,
                proc_mount: Some("Default".into()),
                read_only_root_filesystem: Some(true),
                run_as_group: Some(1000),
                run_as_non_root: Some(true),
                run_as_user: Some(1000),
                se_linux_options: Some(core::SELinuxOptions {
                    level: Some("s0".into()),
                    role: None,
                    type_: Some("t".into()),
                    user: Some("u".into()),
                }),
                seccomp_profile: Some(core::SeccompProfile {
                    localhost_profile: Some("p.json".into()),
                    type_: "Localhost".into(),
                }),
                windows_options: Some(core::WindowsSecurityContextOptions {
                    gmsa_credential_spec: None,
                    gmsa_credential_spec_name: Some(String::new()),
                    host_process: Some(false),
                    run_as_user_name: None,
                }),
            }),
            ..Default::default()
        };
        assert_eq!(
            legacy_text(&c),
            concat!(
                r#"{"name":"c","resources":{},"securityContext":{"capabilities":{"add":["NET_ADMIN"],"drop":["ALL"]},"#,
                r#""seLinuxOptions":{"user":"u","type":"t","level":"s0"},"#,
                r#""windowsOptions":{"gmsaCredentialSpecName":"","hostProcess":false},"#,
                r#""runAsUser":1000,"runAsGroup":1000,"runAsNonRoot":true,"readOnlyRootFilesystem":true,"#,
                r#""allowPrivilegeEscalation":false,"procMount":"Default","#,
                r#""seccompProfile":{"type":"Localhost","localhostProfile":"p.json"},"#,
                r#""appArmorProfile":{"type":"RuntimeDefault"}}}"#
            )
        );
    }

    #[test]
    fn remaining_scalar_fields_follow_go_field_order() {
        let c = core::Container {
            name: "c".into(),
            image: Some("i".into()),
            command: Some(vec!["a".into()]),
            working_dir: Some("/w".into()),
            ports: Some(vec![core::ContainerPort {
                container_port: 0,
                host_ip: Some("0.0.0.0".into()),
                host_port: Some(0),
                name: Some("p".into()),
                protocol: Some("TCP".into()),
            }]),
            restart_policy: Some("Always".into()),
            termination_message_path: Some("/dev/termination-log".into()),
            termination_message_policy: Some("File".into()),
            image_pull_policy: Some("IfNotPresent".into()),
            stdin: Some(true),
            stdin_once: Some(true),
            tty: Some(false),
            ..Default::default()
        };
        assert_eq!(
            legacy_text(&c),
            concat!(
                r#"{"name":"c","image":"i","command":["a"],"workingDir":"/w","#,
                r#""ports":[{"name":"p","containerPort":0,"protocol":"TCP","hostIP":"0.0.0.0"}],"#,
                r#""resources":{},"restartPolicy":"Always","terminationMessagePath":"/dev/termination-log","#,
                r#""terminationMessagePolicy":"File","imagePullPolicy":"IfNotPresent","stdin":true,"stdinOnce":true}"#
            )
        );
    }
}
