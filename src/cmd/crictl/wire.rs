//! The runtime's objects in proto3 JSON form, as crictl prints them: the CRI message's fields
//! in proto order with their JSON names, every scalar emitted even when zero, unset messages
//! left out, 64-bit integers as strings and enums by name.

use crate::cri::{
    Container, ContainerEvent, ContainerEventKind, ContainerMetadata, ContainerResources,
    ContainerState, ContainerStats, ContainerStatus, ContainerUser, FilesystemUsage, IdMapping,
    Image, ImageSpec, Mount, MountPropagation, NamespaceMode, NamespaceOption, PodSandbox,
    PodSandboxStatus, PsiStats, RuntimeCondition, RuntimeStatus, SandboxMetadata, SandboxState,
};

use super::format::{ZERO_TIME, rfc3339_nano};
use super::json::Json;

fn opt(members: &mut Vec<(&'static str, Json)>, key: &'static str, v: Option<Json>) {
    if let Some(v) = v {
        members.push((key, v));
    }
}

/// A `UInt64Value`/`Int64Value` wrapper message.
fn wrapped(v: Option<impl ToString>) -> Option<Json> {
    v.map(|v| Json::obj(vec![("value", Json::int64(v))]))
}

/// The CRI name of a container state.
pub fn container_state(s: ContainerState) -> Json {
    Json::str(s.cri_name())
}

/// The CRI name of a sandbox state.
pub fn sandbox_state(s: SandboxState) -> Json {
    Json::str(s.cri_name())
}

fn namespace_mode(m: NamespaceMode) -> Json {
    match m {
        NamespaceMode::Pod => Json::str("POD"),
        NamespaceMode::Container => Json::str("CONTAINER"),
        NamespaceMode::Node => Json::str("NODE"),
        NamespaceMode::Target => Json::str("TARGET"),
        NamespaceMode::Other(v) => Json::int(v),
    }
}

fn propagation(p: MountPropagation) -> Json {
    match p {
        MountPropagation::Private => Json::str("PROPAGATION_PRIVATE"),
        MountPropagation::HostToContainer => Json::str("PROPAGATION_HOST_TO_CONTAINER"),
        MountPropagation::Bidirectional => Json::str("PROPAGATION_BIDIRECTIONAL"),
        MountPropagation::Other(v) => Json::int(v),
    }
}

fn container_metadata(m: &ContainerMetadata) -> Json {
    Json::obj(vec![
        ("name", Json::str(&m.name)),
        ("attempt", Json::int(m.attempt)),
    ])
}

fn sandbox_metadata(m: &SandboxMetadata) -> Json {
    Json::obj(vec![
        ("name", Json::str(&m.name)),
        ("uid", Json::str(&m.uid)),
        ("namespace", Json::str(&m.namespace)),
        ("attempt", Json::int(m.attempt)),
    ])
}

/// An `ImageSpec`; `image` is the name the domain keeps beside the spec.
fn image_spec(image: &str, s: &ImageSpec) -> Json {
    Json::obj(vec![
        ("image", Json::str(image)),
        ("annotations", Json::map(&s.annotations)),
        ("userSpecifiedImage", Json::str(&s.user_specified_image)),
        ("runtimeHandler", Json::str(&s.runtime_handler)),
        ("imageRef", Json::str(&s.image_ref)),
    ])
}

/// A `Container` of `ListContainers`.
pub fn container(c: &Container) -> Json {
    Json::obj(vec![
        ("id", Json::str(&c.id)),
        ("podSandboxId", Json::str(&c.pod_sandbox_id)),
        ("metadata", container_metadata(&c.metadata)),
        ("image", image_spec(&c.image, &c.image_spec)),
        ("imageRef", Json::str(&c.image_ref)),
        ("state", container_state(c.state)),
        ("createdAt", Json::int64(c.created_at)),
        ("labels", Json::map(&c.labels)),
        ("annotations", Json::map(&c.annotations)),
        ("imageId", Json::str(&c.image_id)),
    ])
}

/// A `PodSandbox` of `ListPodSandbox`.
pub fn sandbox(p: &PodSandbox) -> Json {
    Json::obj(vec![
        ("id", Json::str(&p.id)),
        ("metadata", sandbox_metadata(&p.metadata)),
        ("state", sandbox_state(p.state)),
        ("createdAt", Json::int64(p.created_at)),
        ("labels", Json::map(&p.labels)),
        ("annotations", Json::map(&p.annotations)),
        ("runtimeHandler", Json::str(&p.runtime_handler)),
    ])
}

/// An `Image`.
pub fn image(i: &Image) -> Json {
    let mut m = vec![
        ("id", Json::str(&i.id)),
        ("repoTags", Json::strs(&i.repo_tags)),
        ("repoDigests", Json::strs(&i.repo_digests)),
        ("size", Json::int64(i.size)),
    ];
    opt(&mut m, "uid", wrapped(i.uid));
    m.push(("username", Json::str(&i.username)));
    opt(
        &mut m,
        "spec",
        i.spec.as_ref().map(|s| image_spec(&s.image, s)),
    );
    m.push(("pinned", Json::Bool(i.pinned)));
    Json::obj(m)
}

fn id_mappings(v: &[IdMapping]) -> Json {
    Json::Arr(
        v.iter()
            .map(|m| {
                Json::obj(vec![
                    ("hostId", Json::int(m.host_id)),
                    ("containerId", Json::int(m.container_id)),
                    ("length", Json::int(m.length)),
                ])
            })
            .collect(),
    )
}

fn mount(m: &Mount) -> Json {
    let mut v = vec![
        ("containerPath", Json::str(&m.container_path)),
        ("hostPath", Json::str(&m.host_path)),
        ("readonly", Json::Bool(m.readonly)),
        ("selinuxRelabel", Json::Bool(m.selinux_relabel)),
        ("propagation", propagation(m.propagation)),
        ("uidMappings", id_mappings(&m.uid_mappings)),
        ("gidMappings", id_mappings(&m.gid_mappings)),
        ("recursiveReadOnly", Json::Bool(m.recursive_read_only)),
    ];
    opt(
        &mut v,
        "image",
        m.image.as_ref().map(|s| image_spec(&s.image, s)),
    );
    v.push(("imageSubPath", Json::str(&m.image_sub_path)));
    v.push(("mountOptions", Json::strs(&m.mount_options)));
    Json::obj(v)
}

fn resources(r: &ContainerResources) -> Json {
    let mut v = Vec::new();
    opt(
        &mut v,
        "linux",
        r.linux.as_ref().map(|l| {
            Json::obj(vec![
                ("cpuPeriod", Json::int64(l.cpu_period)),
                ("cpuQuota", Json::int64(l.cpu_quota)),
                ("cpuShares", Json::int64(l.cpu_shares)),
                ("memoryLimitInBytes", Json::int64(l.memory_limit_in_bytes)),
                ("oomScoreAdj", Json::int64(l.oom_score_adj)),
                ("cpusetCpus", Json::str(&l.cpuset_cpus)),
                ("cpusetMems", Json::str(&l.cpuset_mems)),
                (
                    "hugepageLimits",
                    Json::Arr(
                        l.hugepage_limits
                            .iter()
                            .map(|h| {
                                Json::obj(vec![
                                    ("pageSize", Json::str(&h.page_size)),
                                    ("limit", Json::int64(h.limit)),
                                ])
                            })
                            .collect(),
                    ),
                ),
                ("unified", Json::map(&l.unified)),
                (
                    "memorySwapLimitInBytes",
                    Json::int64(l.memory_swap_limit_in_bytes),
                ),
            ])
        }),
    );
    opt(
        &mut v,
        "windows",
        r.windows.as_ref().map(|w| {
            Json::obj(vec![
                ("cpuShares", Json::int64(w.cpu_shares)),
                ("cpuCount", Json::int64(w.cpu_count)),
                ("cpuMaximum", Json::int64(w.cpu_maximum)),
                ("memoryLimitInBytes", Json::int64(w.memory_limit_in_bytes)),
                ("rootfsSizeInBytes", Json::int64(w.rootfs_size_in_bytes)),
                (
                    "affinityCpus",
                    Json::Arr(
                        w.affinity_cpus
                            .iter()
                            .map(|a| {
                                Json::obj(vec![
                                    ("cpuMask", Json::int64(a.cpu_mask)),
                                    ("cpuGroup", Json::int(a.cpu_group)),
                                ])
                            })
                            .collect(),
                    ),
                ),
            ])
        }),
    );
    Json::obj(v)
}

fn user(u: &ContainerUser) -> Json {
    let mut v = Vec::new();
    opt(
        &mut v,
        "linux",
        u.linux.as_ref().map(|l| {
            Json::obj(vec![
                ("uid", Json::int64(l.uid)),
                ("gid", Json::int64(l.gid)),
                (
                    "supplementalGroups",
                    Json::Arr(l.supplemental_groups.iter().map(Json::int64).collect()),
                ),
            ])
        }),
    );
    Json::obj(v)
}

/// A `ContainerStatus` in proto3 JSON form.
pub fn container_status(s: &ContainerStatus) -> Json {
    let d = &s.detail;
    let mut v = vec![
        ("id", Json::str(&s.id)),
        ("metadata", container_metadata(&s.metadata)),
        ("state", container_state(s.state)),
        ("createdAt", Json::int64(s.created_at)),
        ("startedAt", Json::int64(s.started_at)),
        ("finishedAt", Json::int64(s.finished_at)),
        ("exitCode", Json::int(s.exit_code)),
        ("image", image_spec(&s.image, &d.image_spec)),
        ("imageRef", Json::str(&s.image_ref)),
        ("reason", Json::str(&s.reason)),
        ("message", Json::str(&s.message)),
        ("labels", Json::map(&s.labels)),
        ("annotations", Json::map(&s.annotations)),
        ("mounts", Json::Arr(d.mounts.iter().map(mount).collect())),
        ("logPath", Json::str(&s.log_path)),
    ];
    opt(&mut v, "resources", d.resources.as_ref().map(resources));
    v.push(("imageId", Json::str(&s.image_id)));
    opt(&mut v, "user", d.user.as_ref().map(user));
    v.push((
        "stopSignal",
        Json::str(if d.stop_signal.is_empty() {
            "RUNTIME_DEFAULT"
        } else {
            &d.stop_signal
        }),
    ));
    Json::obj(v)
}

/// Every field of the CRI `ContainerStatus`, for crictl's `marshalMapInOrder` (unset ones are
/// `null`).
const CONTAINER_STATUS_FIELDS: &[&str] = &[
    "id",
    "metadata",
    "state",
    "createdAt",
    "startedAt",
    "finishedAt",
    "exitCode",
    "image",
    "imageRef",
    "reason",
    "message",
    "labels",
    "annotations",
    "mounts",
    "logPath",
    "resources",
    "imageId",
    "user",
    "stopSignal",
];

/// Every field of the CRI `PodSandboxStatus`.
const SANDBOX_STATUS_FIELDS: &[&str] = &[
    "id",
    "metadata",
    "state",
    "createdAt",
    "network",
    "linux",
    "labels",
    "annotations",
    "runtimeHandler",
];

fn with_nulls(v: Json, fields: &[&str]) -> Json {
    let Json::Obj(members) = v else {
        return v;
    };
    Json::Obj(
        fields
            .iter()
            .map(|f| {
                let value = members
                    .iter()
                    .find(|(k, _)| k == f)
                    .map(|(_, v)| v.clone())
                    .unwrap_or(Json::Null);
                (f.to_string(), value)
            })
            .collect(),
    )
}

/// A container status as `crictl inspect` shows it: times in RFC 3339 (`startedAt` only once
/// started, `finishedAt` only once exited), every field present.
pub fn inspect_container_status(s: &ContainerStatus) -> Json {
    let mut v = container_status(s);
    v.set("createdAt", Json::str(rfc3339_nano(s.created_at)));
    let started = if s.state == ContainerState::Created {
        ZERO_TIME.to_string()
    } else {
        rfc3339_nano(s.started_at)
    };
    let finished = s.state == ContainerState::Exited
        || (s.state == ContainerState::Unknown && s.finished_at > 0);
    let finished = if finished {
        rfc3339_nano(s.finished_at)
    } else {
        ZERO_TIME.to_string()
    };
    v.set("startedAt", Json::str(started));
    v.set("finishedAt", Json::str(finished));
    with_nulls(v, CONTAINER_STATUS_FIELDS)
}

fn namespace_option(o: &NamespaceOption) -> Json {
    let mut v = vec![
        ("network", namespace_mode(o.network)),
        ("pid", namespace_mode(o.pid)),
        ("ipc", namespace_mode(o.ipc)),
        ("targetId", Json::str(&o.target_id)),
    ];
    opt(
        &mut v,
        "usernsOptions",
        o.userns_options.as_ref().map(|u| {
            Json::obj(vec![
                ("mode", namespace_mode(u.mode)),
                ("uids", id_mappings(&u.uids)),
                ("gids", id_mappings(&u.gids)),
            ])
        }),
    );
    Json::obj(v)
}

/// A `PodSandboxStatus` in proto3 JSON form.
pub fn sandbox_status(s: &PodSandboxStatus) -> Json {
    let p = &s.sandbox;
    let mut v = vec![
        ("id", Json::str(&p.id)),
        ("metadata", sandbox_metadata(&p.metadata)),
        ("state", sandbox_state(p.state)),
        ("createdAt", Json::int64(p.created_at)),
    ];
    if s.detail.network_reported {
        v.push((
            "network",
            Json::obj(vec![
                ("ip", Json::str(&s.ip)),
                (
                    "additionalIps",
                    Json::Arr(
                        s.additional_ips
                            .iter()
                            .map(|ip| Json::obj(vec![("ip", Json::str(ip))]))
                            .collect(),
                    ),
                ),
            ]),
        ));
    }
    opt(
        &mut v,
        "linux",
        s.detail.namespace_options.as_ref().map(|o| {
            Json::obj(vec![(
                "namespaces",
                Json::obj(vec![("options", namespace_option(o))]),
            )])
        }),
    );
    v.push(("labels", Json::map(&p.labels)));
    v.push(("annotations", Json::map(&p.annotations)));
    v.push(("runtimeHandler", Json::str(&p.runtime_handler)));
    Json::obj(v)
}

/// A sandbox status as `crictl inspectp` shows it: `createdAt` in RFC 3339, every field
/// present.
pub fn inspect_sandbox_status(s: &PodSandboxStatus) -> Json {
    let mut v = sandbox_status(s);
    v.set("createdAt", Json::str(rfc3339_nano(s.sandbox.created_at)));
    with_nulls(v, SANDBOX_STATUS_FIELDS)
}

/// A `FilesystemUsage`.
pub fn filesystem_usage(f: &FilesystemUsage) -> Json {
    let mut v = vec![
        ("timestamp", Json::int64(f.timestamp)),
        (
            "fsId",
            Json::obj(vec![("mountpoint", Json::str(&f.mountpoint))]),
        ),
    ];
    opt(&mut v, "usedBytes", wrapped(f.used_bytes));
    opt(&mut v, "inodesUsed", wrapped(f.inodes_used));
    Json::obj(v)
}

fn psi(p: &PsiStats) -> Json {
    let data = |d: &crate::cri::PsiData| {
        Json::obj(vec![
            ("Total", Json::int64(d.total)),
            ("Avg10", Json::double(d.avg10)),
            ("Avg60", Json::double(d.avg60)),
            ("Avg300", Json::double(d.avg300)),
        ])
    };
    let mut v = Vec::new();
    opt(&mut v, "Full", p.full.as_ref().map(data));
    opt(&mut v, "Some", p.some.as_ref().map(data));
    Json::obj(v)
}

/// A `ContainerStats`.
pub fn container_stats(s: &ContainerStats) -> Json {
    let mut v = Vec::new();
    opt(
        &mut v,
        "attributes",
        s.attributes.as_ref().map(|a| {
            Json::obj(vec![
                ("id", Json::str(&a.id)),
                ("metadata", container_metadata(&a.metadata)),
                ("labels", Json::map(&a.labels)),
                ("annotations", Json::map(&a.annotations)),
            ])
        }),
    );
    opt(
        &mut v,
        "cpu",
        s.cpu.as_ref().map(|c| {
            let mut m = vec![("timestamp", Json::int64(c.timestamp))];
            opt(
                &mut m,
                "usageCoreNanoSeconds",
                wrapped(c.usage_core_nano_seconds),
            );
            opt(&mut m, "usageNanoCores", wrapped(c.usage_nano_cores));
            opt(&mut m, "psi", c.psi.as_ref().map(psi));
            Json::obj(m)
        }),
    );
    opt(
        &mut v,
        "memory",
        s.memory.as_ref().map(|c| {
            let mut m = vec![("timestamp", Json::int64(c.timestamp))];
            opt(&mut m, "workingSetBytes", wrapped(c.working_set_bytes));
            opt(&mut m, "availableBytes", wrapped(c.available_bytes));
            opt(&mut m, "usageBytes", wrapped(c.usage_bytes));
            opt(&mut m, "rssBytes", wrapped(c.rss_bytes));
            opt(&mut m, "pageFaults", wrapped(c.page_faults));
            opt(&mut m, "majorPageFaults", wrapped(c.major_page_faults));
            opt(&mut m, "psi", c.psi.as_ref().map(psi));
            Json::obj(m)
        }),
    );
    opt(
        &mut v,
        "writableLayer",
        s.writable_layer.as_ref().map(filesystem_usage),
    );
    opt(
        &mut v,
        "swap",
        s.swap.as_ref().map(|w| {
            let mut m = vec![("timestamp", Json::int64(w.timestamp))];
            opt(
                &mut m,
                "swapAvailableBytes",
                wrapped(w.swap_available_bytes),
            );
            opt(&mut m, "swapUsageBytes", wrapped(w.swap_usage_bytes));
            Json::obj(m)
        }),
    );
    opt(
        &mut v,
        "io",
        s.io.as_ref().map(|i| {
            let mut m = vec![("timestamp", Json::int64(i.timestamp))];
            opt(&mut m, "psi", i.psi.as_ref().map(psi));
            Json::obj(m)
        }),
    );
    Json::obj(v)
}

/// A `ContainerEventResponse`.
pub fn container_event(e: &ContainerEvent) -> Json {
    let kind = match e.kind {
        ContainerEventKind::Created => "CONTAINER_CREATED_EVENT",
        ContainerEventKind::Started => "CONTAINER_STARTED_EVENT",
        ContainerEventKind::Stopped => "CONTAINER_STOPPED_EVENT",
        ContainerEventKind::Deleted => "CONTAINER_DELETED_EVENT",
    };
    let mut v = vec![
        ("containerId", Json::str(&e.container_id)),
        ("containerEventType", Json::str(kind)),
        ("createdAt", Json::int64(e.created_at)),
    ];
    opt(
        &mut v,
        "podSandboxStatus",
        e.sandbox_status.as_deref().map(sandbox_status),
    );
    v.push((
        "containersStatuses",
        Json::Arr(e.container_statuses.iter().map(container_status).collect()),
    ));
    Json::obj(v)
}

fn condition(c: &RuntimeCondition) -> Json {
    Json::obj(vec![
        ("type", Json::str(&c.kind)),
        ("status", Json::Bool(c.status)),
        ("reason", Json::str(&c.reason)),
        ("message", Json::str(&c.message)),
    ])
}

/// A `RuntimeStatus` (the conditions).
pub fn runtime_status(s: &RuntimeStatus) -> Json {
    Json::obj(vec![(
        "conditions",
        Json::Arr(s.conditions.iter().map(condition).collect()),
    )])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::StringMap;

    fn status(state: ContainerState) -> ContainerStatus {
        ContainerStatus {
            id: "c1".into(),
            metadata: ContainerMetadata {
                name: "app".into(),
                attempt: 0,
            },
            state,
            created_at: 1_796_058_712_009_086_313,
            started_at: 1_796_058_712_131_995_365,
            finished_at: 0,
            exit_code: 0,
            image: "busybox:v1".into(),
            image_ref: "busybox@sha256:1".into(),
            image_id: String::new(),
            reason: String::new(),
            message: String::new(),
            labels: StringMap::new(),
            annotations: StringMap::new(),
            log_path: "/var/log/pods/x/app/0.log".into(),
            info: StringMap::new(),
            detail: Default::default(),
        }
    }

    #[test]
    fn inspect_status_has_every_field_times_in_rfc3339_and_null_for_unset_messages() {
        let v = inspect_container_status(&status(ContainerState::Running));
        let Json::Obj(m) = &v else { panic!() };
        let keys: Vec<&str> = m.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, CONTAINER_STATUS_FIELDS);
        assert_eq!(
            v.get("createdAt"),
            Some(&Json::str("2026-11-30T17:11:52.009086313Z"))
        );
        assert_eq!(v.get("finishedAt"), Some(&Json::str(ZERO_TIME)));
        assert_eq!(v.get("user"), Some(&Json::Null));
        assert_eq!(v.get("resources"), Some(&Json::Null));
        assert_eq!(v.get("stopSignal"), Some(&Json::str("RUNTIME_DEFAULT")));
        let created = inspect_container_status(&status(ContainerState::Created));
        assert_eq!(created.get("startedAt"), Some(&Json::str(ZERO_TIME)));
    }

    #[test]
    fn list_container_json_keeps_proto_order_and_int64_as_strings() {
        let c = Container {
            id: "c1".into(),
            pod_sandbox_id: "p1".into(),
            metadata: ContainerMetadata {
                name: "app".into(),
                attempt: 2,
            },
            image: "busybox:v1".into(),
            image_ref: "sha256:1".into(),
            state: ContainerState::Exited,
            created_at: 42,
            labels: StringMap::new(),
            annotations: StringMap::new(),
            image_id: String::new(),
            image_spec: Default::default(),
        };
        let text = container(&c).to_protojson();
        assert!(text.contains("\"createdAt\": \"42\""), "{text}");
        assert!(text.contains("\"attempt\": 2"), "{text}");
        assert!(text.contains("\"state\": \"CONTAINER_EXITED\""), "{text}");
        let order = [
            "\"id\"",
            "\"podSandboxId\"",
            "\"metadata\"",
            "\"userSpecifiedImage\"",
            "\"imageRef\"",
            "\"state\"",
            "\"labels\"",
            "\"imageId\"",
        ];
        let pos: Vec<usize> = order.iter().map(|k| text.find(k).unwrap()).collect();
        assert!(pos.windows(2).all(|w| w[0] < w[1]), "{text}");
    }
}
