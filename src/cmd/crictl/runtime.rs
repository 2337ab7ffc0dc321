//! Runtime-wide commands: `info`, `version` and `events`.

use std::process::ExitCode;

use anyhow::Context;
use futures::StreamExt;

use crate::cri::{RemoteRuntime, RuntimeHandler, RuntimeService};

use super::args::{DataOutput, EventsArgs, InfoArgs};
use super::json::{Json, info_value};
use super::output::{out, print_doc};
use super::wire;

/// Go's `encoding/json` of the CRI runtime handlers (snake_case, `omitempty`), as crictl
/// writes them.
fn handlers(h: &[RuntimeHandler]) -> Json {
    Json::Arr(
        h.iter()
            .map(|h| {
                let mut m = Vec::new();
                if !h.name.is_empty() {
                    m.push(("name", Json::str(&h.name)));
                }
                if let Some(f) = &h.features {
                    let mut fm = Vec::new();
                    if f.recursive_read_only_mounts {
                        fm.push(("recursive_read_only_mounts", Json::Bool(true)));
                    }
                    if f.user_namespaces {
                        fm.push(("user_namespaces", Json::Bool(true)));
                    }
                    m.push(("features", Json::obj(fm)));
                }
                Json::obj(m)
            })
            .collect(),
    )
}

/// `info`.
pub(super) async fn info(rt: &RemoteRuntime, a: InfoArgs) -> anyhow::Result<ExitCode> {
    let s = rt
        .runtime_status(!a.quiet)
        .await
        .context("getting status of runtime")?;
    let mut doc: Vec<(String, Json)> = vec![("status".into(), wire::runtime_status(&s))];
    if !s.handlers.is_empty() {
        doc.push(("runtimeHandlers".into(), handlers(&s.handlers)));
    }
    if let Some(f) = s.features {
        let mut fm = Vec::new();
        if f.supplemental_groups_policy {
            fm.push(("supplemental_groups_policy", Json::Bool(true)));
        }
        if f.user_namespaces_host_network {
            fm.push(("user_namespaces_host_network", Json::Bool(true)));
        }
        if f.mount_options {
            fm.push(("mount_options", Json::Bool(true)));
        }
        doc.push(("features".into(), Json::obj(fm)));
    }
    for (k, v) in &s.info {
        doc.retain(|(key, _)| key != k);
        doc.push((k.clone(), info_value(v)));
    }
    print_doc(&Json::Obj(doc), a.output == DataOutput::Yaml, true)?;
    Ok(ExitCode::SUCCESS)
}

/// `version`: the runtime's answer, in crictl's layout (two spaces after each colon).
pub(super) async fn version(rt: &RemoteRuntime) -> anyhow::Result<ExitCode> {
    let v = rt.version().await.context("getting the runtime version")?;
    out(&format!(
        "Version:  {}\nRuntimeName:  {}\nRuntimeVersion:  {}\nRuntimeApiVersion:  {}\n",
        v.version, v.runtime_name, v.runtime_version, v.runtime_api_version
    ))?;
    Ok(ExitCode::SUCCESS)
}

/// `events`: each container event as it arrives, until the runtime ends the stream.
pub(super) async fn events(rt: &RemoteRuntime, a: EventsArgs) -> anyhow::Result<ExitCode> {
    // as crictl: no deadline on the stream, which on a quiet node sends nothing for as long as
    // it stays quiet
    let mut stream = rt.container_events();
    while let Some(event) = stream.next().await {
        let event = event.context("getting container events")?;
        print_doc(
            &wire::container_event(&event),
            a.output == DataOutput::Yaml,
            false,
        )?;
    }
    Ok(ExitCode::SUCCESS)
}
