//! Pod commands: `pods` and `inspectp`.

use std::process::ExitCode;

use anyhow::Context;

use crate::cri::clock::now_ns;
use crate::cri::{
    PodSandbox, PodSandboxStatus, RemoteRuntime, RuntimeService, SandboxFilter, SandboxState,
};

use super::args::{InspectpArgs, ListOutput, PodFilterArgs, PodsArgs, StatusOutput};
use super::containers::{go_map, one_or_many, status_object};
use super::filter::{count, matches, newest_first, parse_labels, parse_sandbox_state, regex};
use super::format::{age, go_time_string, truncate_id};
use super::output::{ids_to_inspect, map_block, out, print_doc, print_list};
use super::table::Table;
use super::wire;

/// The name crictl shows for a sandbox state.
fn state_name(s: SandboxState) -> &'static str {
    match s {
        SandboxState::Ready => "Ready",
        SandboxState::NotReady => "NotReady",
    }
}

fn runtime_handler(p: &PodSandbox) -> &str {
    if p.runtime_handler.is_empty() {
        "(default)"
    } else {
        &p.runtime_handler
    }
}

/// The sandboxes the filters select, newest first (crictl's `ListPodSandboxes`).
async fn list_pods(rt: &RemoteRuntime, f: &PodFilterArgs) -> anyhow::Result<Vec<PodSandbox>> {
    let filter = SandboxFilter {
        id: f.id.clone(),
        state: f.state.as_deref().map(parse_sandbox_state).transpose()?,
        labels: parse_labels(&f.label)?,
    };
    let name = regex(f.name.as_deref())?;
    let namespace = regex(f.namespace.as_deref())?;
    tracing::debug!(?filter, "ListPodSandbox");
    let mut list = rt
        .list_pod_sandboxes(filter)
        .await
        .context("call list sandboxes RPC")?;
    tracing::debug!(count = list.len(), "ListPodSandbox response");
    list.retain(|p| {
        matches(name.as_ref(), &p.metadata.name)
            && matches(namespace.as_ref(), &p.metadata.namespace)
    });
    newest_first(&mut list, |p| p.created_at, count(f.latest, f.last));
    Ok(list)
}

/// `pods`.
pub(super) async fn pods(rt: &RemoteRuntime, a: PodsArgs) -> anyhow::Result<ExitCode> {
    let list = list_pods(rt, &a.filter)
        .await
        .context("list pod sandboxes")?;
    match a.output {
        ListOutput::Json | ListOutput::Yaml => {
            print_list(
                "items",
                list.iter().map(wire::sandbox).collect(),
                a.output == ListOutput::Yaml,
            )?;
            return Ok(ExitCode::SUCCESS);
        }
        ListOutput::Table => {}
    }
    if a.quiet {
        out(&list
            .iter()
            .map(|p| format!("{}\n", p.id))
            .collect::<String>())?;
        return Ok(ExitCode::SUCCESS);
    }
    let now = now_ns();
    if a.verbose {
        let mut s = String::new();
        for p in &list {
            s.push_str(&format!("ID: {}\n", p.id));
            let m = &p.metadata;
            for (title, v) in [
                ("Name", &m.name),
                ("UID", &m.uid),
                ("Namespace", &m.namespace),
            ] {
                if !v.is_empty() {
                    s.push_str(&format!("{title}: {v}\n"));
                }
            }
            if m.attempt != 0 {
                s.push_str(&format!("Attempt: {}\n", m.attempt));
            }
            s.push_str(&format!("Status: {}\n", state_name(p.state)));
            s.push_str(&format!("Created: {}\n", go_time_string(p.created_at)));
            s.push_str(&map_block("Labels", &p.labels));
            s.push_str(&map_block("Annotations", &p.annotations));
            s.push_str(&format!("Runtime: {}\n\n", runtime_handler(p)));
        }
        out(&s)?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut t = Table::new(&[
        "POD ID",
        "CREATED",
        "STATE",
        "NAME",
        "NAMESPACE",
        "ATTEMPT",
        "RUNTIME",
    ]);
    for p in &list {
        let id = if a.no_trunc {
            p.id.clone()
        } else {
            truncate_id(&p.id, "").to_string()
        };
        t.row(vec![
            id,
            age(now, p.created_at),
            state_name(p.state).to_string(),
            p.metadata.name.clone(),
            p.metadata.namespace.clone(),
            p.metadata.attempt.to_string(),
            runtime_handler(p).to_string(),
        ]);
    }
    out(&t.render())?;
    Ok(ExitCode::SUCCESS)
}

fn status_table(s: &PodSandboxStatus, verbose: bool) -> String {
    let p = &s.sandbox;
    let m = &p.metadata;
    let mut t = format!("ID: {}\n", p.id);
    for (title, v) in [
        ("Name", &m.name),
        ("UID", &m.uid),
        ("Namespace", &m.namespace),
    ] {
        if !v.is_empty() {
            t.push_str(&format!("{title}: {v}\n"));
        }
    }
    t.push_str(&format!("Attempt: {}\n", m.attempt));
    t.push_str(&format!("Status: {}\n", p.state.cri_name()));
    t.push_str(&format!("Created: {}\n", go_time_string(p.created_at)));
    if s.detail.network_reported {
        t.push_str(&format!("IP Addresses: {}\n", s.ip));
        for ip in &s.additional_ips {
            t.push_str(&format!("Additional IP: {ip}\n"));
        }
    }
    t.push_str(&map_block("Labels", &p.labels));
    t.push_str(&map_block("Annotations", &p.annotations));
    if verbose && !s.info.is_empty() {
        t.push_str(&format!("Info: {}\n", go_map(&s.info)));
    }
    t
}

/// `inspectp`.
pub(super) async fn inspectp(rt: &RemoteRuntime, a: InspectpArgs) -> anyhow::Result<ExitCode> {
    let listed = async {
        anyhow::Ok(
            list_pods(rt, &a.filter)
                .await
                .context("list pod sandboxes")?
                .into_iter()
                .map(|p| p.id)
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
            .pod_sandbox_status(id, verbose)
            .await
            .with_context(|| format!("get the status of pod sandbox {id:?}"))?;
        statuses.push(s);
    }
    match a.output {
        StatusOutput::Table => {
            out(&statuses
                .iter()
                .map(|s| status_table(s, verbose))
                .collect::<String>())?;
        }
        StatusOutput::Json | StatusOutput::Yaml => {
            let docs = statuses
                .iter()
                .map(|s| status_object(wire::inspect_sandbox_status(s), &s.info))
                .collect();
            print_doc(&one_or_many(docs), a.output == StatusOutput::Yaml, true)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
