//! Container commands: `ps` (with kruised's `--kruise` columns), `inspect`, `stop` and
//! `exec -s`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};

use crate::controller::containers::newest_by_name;
use crate::cri::clock::now_ns;
use crate::cri::{
    Container, ContainerFilter, ContainerState, ContainerStatus, CriError, ImageService,
    RemoteRuntime, RuntimeService,
};
use crate::k8s::keys;

use super::args::{
    ContainerFilterArgs, ExecArgs, InspectArgs, ListOutput, PsArgs, StatusOutput, StopArgs,
};
use super::filter::{
    count, label_or_unknown, matches, newest_first, parse_container_state, parse_labels, regex,
};
use super::format::{age, truncate_id};
use super::json::{Json, info_value};
use super::output::{err_out, ids_to_inspect, map_block, out, print_doc, print_list};
use super::table::Table;
use super::wire;

/// `exec -s` without `--timeout`: crictl waits as long as the command runs; the CRI needs a
/// number, so "no limit" is a day.
const EXEC_NO_LIMIT: Duration = Duration::from_secs(24 * 3600);

/// The name crictl shows for a container state.
pub(super) fn state_name(s: ContainerState) -> &'static str {
    match s {
        ContainerState::Created => "Created",
        ContainerState::Running => "Running",
        ContainerState::Exited => "Exited",
        ContainerState::Unknown => "Unknown",
    }
}

/// Whether `image` is an image ID (`sha256:` and 64 hex digits), as the kubelet passes it.
fn is_digest(image: &str) -> bool {
    image
        .strip_prefix("sha256:")
        .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The containers the filters select, newest first (crictl's `ListContainers`).
pub(super) async fn list_containers(
    rt: &RemoteRuntime,
    f: &ContainerFilterArgs,
) -> anyhow::Result<Vec<Container>> {
    let labels = parse_labels(&f.label)?;
    let name = regex(f.name.as_deref())?;
    let namespace = regex(f.namespace.as_deref())?;
    let mut state = match &f.state {
        Some(s) => Some(parse_container_state(s)?),
        None if !f.all => Some(ContainerState::Running),
        None => None,
    };
    let n = count(f.latest, f.last);
    if n > 0 {
        // --latest and --last look at every state
        state = None;
    }
    let filter = ContainerFilter {
        id: f.id.clone(),
        state,
        pod_sandbox_id: f.pod.clone(),
        labels,
    };
    tracing::debug!(?filter, "ListContainers");
    let mut list = rt
        .list_containers(filter)
        .await
        .context("call list containers RPC")?;
    tracing::debug!(count = list.len(), "ListContainers response");
    list.retain(|c| {
        matches(name.as_ref(), &c.metadata.name)
            && matches(
                namespace.as_ref(),
                label_or_unknown(&c.labels, keys::KUBELET_POD_NAMESPACE),
            )
    });
    if let Some(image) = &f.image {
        let want = image_id(rt, image, &mut HashMap::new()).await?;
        let mut ids = HashMap::new();
        let mut kept = Vec::new();
        for c in list {
            let id = image_id(rt, &c.image, &mut ids).await?;
            if want.is_some() && id == want {
                kept.push(c);
            }
        }
        list = kept;
    }
    newest_first(&mut list, |c| c.created_at, n);
    Ok(list)
}

/// The image ID `image` resolves to, if the runtime has it (cached per name).
async fn image_id(
    rt: &RemoteRuntime,
    image: &str,
    cache: &mut HashMap<String, Option<String>>,
) -> anyhow::Result<Option<String>> {
    if let Some(id) = cache.get(image) {
        return Ok(id.clone());
    }
    let id = rt
        .image_status(image)
        .await
        .with_context(|| format!("image status of {image:?}"))?
        .map(|i| i.id);
    cache.insert(image.to_string(), id.clone());
    Ok(id)
}

/// The first tag of `image`, or `image` itself (`ps -r`).
async fn repo_image(rt: &RemoteRuntime, image: &str) -> anyhow::Result<String> {
    let status = rt
        .image_status(image)
        .await
        .context("failed to fetch repo image")?;
    Ok(status
        .and_then(|i| i.repo_tags.into_iter().next())
        .unwrap_or_else(|| image.to_string()))
}

/// The IDs of the containers kruised considers current: per pod (by uid), the newest
/// container of each name, as the container meta controller picks it.
async fn current_containers(rt: &RemoteRuntime) -> anyhow::Result<HashSet<String>> {
    let all = rt
        .list_containers(ContainerFilter::default())
        .await
        .context("call list containers RPC")?;
    let mut by_pod: BTreeMap<String, Vec<Container>> = BTreeMap::new();
    for c in all {
        let pod = c
            .labels
            .get(keys::KUBELET_POD_UID)
            .cloned()
            .unwrap_or_else(|| c.pod_sandbox_id.clone());
        by_pod.entry(pod).or_default().push(c);
    }
    Ok(by_pod
        .values()
        .flat_map(|group| {
            newest_by_name(group)
                .into_values()
                .map(|c| c.id.clone())
                .collect::<Vec<_>>()
        })
        .collect())
}

/// `ps`.
pub(super) async fn ps(rt: &RemoteRuntime, a: PsArgs) -> anyhow::Result<ExitCode> {
    let list = list_containers(rt, &a.filter)
        .await
        .context("list containers")?;
    match a.output {
        ListOutput::Json | ListOutput::Yaml => {
            print_list(
                "containers",
                list.iter().map(wire::container).collect(),
                a.output == ListOutput::Yaml,
            )?;
            return Ok(ExitCode::SUCCESS);
        }
        ListOutput::Table => {}
    }
    if a.quiet {
        out(&list
            .iter()
            .map(|c| format!("{}\n", c.id))
            .collect::<String>())?;
        return Ok(ExitCode::SUCCESS);
    }
    let now = now_ns();
    if a.verbose {
        let mut s = String::new();
        for c in &list {
            s.push_str(&format!("ID: {}\nPodID: {}\n", c.id, c.pod_sandbox_id));
            s.push_str(&format!(
                "Namespace: {}\n",
                label_or_unknown(&c.labels, keys::KUBELET_POD_NAMESPACE)
            ));
            if !c.metadata.name.is_empty() {
                s.push_str(&format!("Name: {}\n", c.metadata.name));
            }
            s.push_str(&format!("Attempt: {}\n", c.metadata.attempt));
            s.push_str(&format!("State: {}\n", state_name(c.state)));
            s.push_str(&format!("Image: {}\n", c.image));
            s.push_str(&format!("Created: {}\n", age(now, c.created_at)));
            s.push_str(&map_block("Labels", &c.labels));
            s.push_str(&map_block("Annotations", &c.annotations));
            s.push('\n');
        }
        out(&s)?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut header = vec![
        "CONTAINER",
        "IMAGE",
        "CREATED",
        "STATE",
        "NAME",
        "ATTEMPT",
        "POD ID",
        "POD",
        "NAMESPACE",
    ];
    let current = if a.kruise {
        header.extend(["KUBELET HASH", "CURRENT"]);
        Some(current_containers(rt).await?)
    } else {
        None
    };
    let mut t = Table::new(&header);
    for c in &list {
        let (mut id, mut pod_id, mut image) =
            (c.id.clone(), c.pod_sandbox_id.clone(), c.image.clone());
        if !a.no_trunc {
            id = truncate_id(&id, "").to_string();
            pod_id = truncate_id(&pod_id, "").to_string();
            if is_digest(&image) {
                image = truncate_id(&image, "sha256:").to_string();
            }
        }
        if a.resolve_image_path {
            image = repo_image(rt, &image).await?;
        }
        let mut row = vec![
            id,
            image,
            age(now, c.created_at),
            state_name(c.state).to_string(),
            c.metadata.name.clone(),
            c.metadata.attempt.to_string(),
            pod_id,
            label_or_unknown(&c.labels, keys::KUBELET_POD_NAME).to_string(),
            label_or_unknown(&c.labels, keys::KUBELET_POD_NAMESPACE).to_string(),
        ];
        if let Some(current) = &current {
            row.push(
                c.annotations
                    .get(keys::KUBELET_CONTAINER_HASH)
                    .cloned()
                    .unwrap_or_else(|| "-".into()),
            );
            row.push(if !c.labels.contains_key(keys::KUBELET_CONTAINER_NAME) {
                "-".into()
            } else {
                current.contains(&c.id).to_string()
            });
        }
        t.row(row);
    }
    out(&t.render())?;
    Ok(ExitCode::SUCCESS)
}

/// The `{"info": ..., "status": ...}` object of one status.
pub(super) fn status_object(status: Json, info: &crate::cri::StringMap) -> Json {
    let mut members: Vec<(String, Json)> = info
        .iter()
        .map(|(k, v)| (k.clone(), info_value(v)))
        .collect();
    members.retain(|(k, _)| k != "status");
    members.push(("status".into(), status));
    Json::Obj(members)
}

/// One object, or an array of several (crictl's "old behaviour").
pub(super) fn one_or_many(mut v: Vec<Json>) -> Json {
    if v.len() == 1 {
        v.remove(0)
    } else {
        Json::Arr(v)
    }
}

/// Go's `%v` of a `map[string]string`: `map[k1:v1 k2:v2]`.
pub(super) fn go_map(m: &crate::cri::StringMap) -> String {
    let items: Vec<String> = m.iter().map(|(k, v)| format!("{k}:{v}")).collect();
    format!("map[{}]", items.join(" "))
}

fn status_table(s: &ContainerStatus, verbose: bool, now: i64) -> String {
    let mut t = format!("ID: {}\n", s.id);
    if !s.metadata.name.is_empty() {
        t.push_str(&format!("Name: {}\n", s.metadata.name));
    }
    if s.metadata.attempt != 0 {
        t.push_str(&format!("Attempt: {}\n", s.metadata.attempt));
    }
    t.push_str(&format!("State: {}\n", s.state.cri_name()));
    t.push_str(&format!("Created: {}\n", age(now, s.created_at)));
    if s.state != ContainerState::Created {
        t.push_str(&format!("Started: {}\n", age(now, s.started_at)));
    }
    if s.state == ContainerState::Exited {
        if s.finished_at > 0 {
            t.push_str(&format!("Finished: {}\n", age(now, s.finished_at)));
        }
        t.push_str(&format!("Exit Code: {}\n", s.exit_code));
    }
    t.push_str(&map_block("Labels", &s.labels));
    t.push_str(&map_block("Annotations", &s.annotations));
    if verbose && !s.info.is_empty() {
        t.push_str(&format!("Info: {}\n", go_map(&s.info)));
    }
    t
}

/// `inspect`.
pub(super) async fn inspect(rt: &RemoteRuntime, a: InspectArgs) -> anyhow::Result<ExitCode> {
    let listed = async {
        anyhow::Ok(
            list_containers(rt, &a.filter)
                .await
                .context("list containers")?
                .into_iter()
                .map(|c| c.id)
                .collect(),
        )
    };
    let Some(ids) = ids_to_inspect(&a.ids, listed).await? else {
        return Ok(ExitCode::SUCCESS);
    };
    let verbose = !a.quiet;
    let mut statuses = Vec::new();
    for id in &ids {
        let s = rt
            .container_status(id, verbose)
            .await
            .with_context(|| format!("get the status of container {id:?}"))?;
        statuses.push(s);
    }
    match a.output {
        StatusOutput::Table => {
            let now = now_ns();
            out(&statuses
                .iter()
                .map(|s| status_table(s, verbose, now))
                .collect::<String>())?;
        }
        StatusOutput::Json | StatusOutput::Yaml => {
            let docs = statuses
                .iter()
                .map(|s| status_object(wire::inspect_container_status(s), &s.info))
                .collect();
            print_doc(&one_or_many(docs), a.output == StatusOutput::Yaml, true)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `stop`.
pub(super) async fn stop(rt: &RemoteRuntime, a: StopArgs) -> anyhow::Result<ExitCode> {
    let ids = if a.all {
        let running = rt
            .list_containers(ContainerFilter {
                state: Some(ContainerState::Running),
                ..Default::default()
            })
            .await
            .context("list containers")?;
        if running.is_empty() {
            err_out(b"No running containers found.\n");
            return Ok(ExitCode::SUCCESS);
        }
        running.into_iter().map(|c| c.id).collect()
    } else {
        a.ids.clone()
    };
    if ids.is_empty() {
        bail!("you must specify at least one CONTAINER-ID or use --all");
    }
    let grace = Duration::from_secs(a.timeout);
    let mut failures = Vec::new();
    for id in &ids {
        match rt.stop_container(id, grace).await {
            Ok(()) => out(&format!("{id}\n"))?,
            Err(e) => failures.push(format!("stopping the container {id:?}: {e}")),
        }
    }
    if !failures.is_empty() {
        bail!(failures.join("; "));
    }
    Ok(ExitCode::SUCCESS)
}

/// The process exit status for a command's exit code (outside 0..=255: 1).
fn exit_status(code: i32) -> ExitCode {
    match u8::try_from(code) {
        Ok(c) => ExitCode::from(c),
        Err(_) => ExitCode::FAILURE,
    }
}

/// `exec -s`: the command's output on stdout and stderr, and its exit status.
pub(super) async fn exec(rt: &RemoteRuntime, a: ExecArgs) -> anyhow::Result<ExitCode> {
    if a.interactive || a.tty {
        bail!(
            "exec -i/-t needs a streaming session, which kruised does not offer; \
             use exec -s (synchronous) instead"
        );
    }
    let timeout = if a.timeout == 0 {
        EXEC_NO_LIMIT
    } else {
        Duration::from_secs(a.timeout)
    };
    tracing::debug!(container = %a.container, cmd = ?a.command, ?timeout, "ExecSync");
    let context = || format!("execing command in container {} synchronously", a.container);
    let timed_out = || {
        anyhow::anyhow!(
            "command timed out: {:?} timed out after {}s",
            a.command.join(" "),
            a.timeout
        )
        .context(context())
    };
    let r = match rt.exec_sync(&a.container, a.command.clone(), timeout).await {
        // the runtime enforces the command's limit: containerd answers DeadlineExceeded, CRI-O
        // an exit code of its own (cri::dialect); both read the same here
        Ok(r) if a.timeout > 0 && crate::cri::dialect::exec_timed_out(&r) => {
            return Err(timed_out());
        }
        Ok(r) => r,
        Err(CriError::Timeout { .. }) if a.timeout > 0 => return Err(timed_out()),
        Err(e) => return Err(anyhow::Error::new(e).context(context())),
    };
    out(&String::from_utf8_lossy(&r.stdout))?;
    err_out(&r.stderr);
    Ok(exit_status(r.exit_code))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_ids_are_recognised_by_their_digest_form() {
        assert!(is_digest(&format!("sha256:{}", "a".repeat(64))));
        assert!(!is_digest("sha256:abc"));
        assert!(!is_digest("127.0.0.1:5200/test/busybox:v1"));
    }

    #[test]
    fn exit_codes_map_to_the_process_status() {
        assert_eq!(exit_status(0), ExitCode::SUCCESS);
        assert_eq!(exit_status(3), ExitCode::from(3));
        assert_eq!(exit_status(-1), ExitCode::FAILURE);
        assert_eq!(exit_status(256), ExitCode::FAILURE);
    }

    #[test]
    fn go_maps_print_sorted_with_spaces() {
        let mut m = crate::cri::StringMap::new();
        m.insert("info".into(), "{\"pid\":1}".into());
        m.insert("a".into(), "x".into());
        assert_eq!(go_map(&m), "map[a:x info:{\"pid\":1}]");
    }
}
