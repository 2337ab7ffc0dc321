//! `kruised crictl`: crictl-compatible debugging of the node's container runtime, with crictl's
//! global flags, environment and config file, commands, table layouts and JSON/YAML shapes
//! (issue 12). The same binary runs as `crictl` when invoked under that name.
//!
//! - [`args`]: the command line;
//! - [`format`], [`table`], [`json`], [`yaml`], [`wire`]: crictl's output formats, as pure
//!   functions;
//! - [`filter`]: labels, states, regular expressions, orderings;
//! - one file per command group: [`containers`], [`pods`], [`images`], [`runtime`], [`logs`],
//!   [`stats`].
//!
//! Where crictl does something unhelpful, kruised follows the issue instead (README,
//! "Differences from crictl"): `exec -s` exits with the command's status, and a runtime that
//! does not answer fails within `--timeout` instead of being retried.

pub mod args;
mod containers;
pub mod filter;
pub mod format;
mod images;
pub mod json;
mod logs;
mod pods;
mod runtime;
mod stats;
pub mod table;
pub mod wire;
pub mod yaml;

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Args;

pub use args::CrictlArgs;
use args::{CrictlCommand, GlobalArgs};

use crate::build_info::VERSION;
use crate::cri::{RemoteRuntime, Timeouts};
use json::Json;

/// crictl's default `--timeout`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);

/// Whether the command line or crictl.yaml asks for debug mode (read before logging starts;
/// errors in the file are reported later, by the command).
pub fn debug_requested(args: &CrictlArgs) -> bool {
    args.global.debug
        || args
            .global
            .runtime
            .crictl_file()
            .ok()
            .and_then(|f| f.debug)
            .unwrap_or(false)
}

/// The clap command of `crictl` on its own (for its help and completions).
pub fn command() -> clap::Command {
    CrictlArgs::augment_args(clap::Command::new("crictl"))
        .about("crictl-compatible debugging of the node's container runtime (kruised)")
        .version(VERSION)
}

/// Runs a crictl command.
pub async fn run(args: CrictlArgs) -> anyhow::Result<ExitCode> {
    if args.global.version {
        out(&format!("crictl version {VERSION}\n"))?;
        return Ok(ExitCode::SUCCESS);
    }
    let Some(cmd) = args.command else {
        out(&command().render_help().to_string())?;
        return Ok(ExitCode::SUCCESS);
    };
    if let CrictlCommand::Completion(c) = &cmd {
        let mut buf = Vec::new();
        clap_complete::generate(c.shell, &mut command(), "crictl", &mut buf);
        out(&String::from_utf8_lossy(&buf))?;
        return Ok(ExitCode::SUCCESS);
    }
    let rt = connect(&args.global).await?;
    match cmd {
        CrictlCommand::Ps(a) => containers::ps(&rt, a).await,
        CrictlCommand::Inspect(a) => containers::inspect(&rt, a).await,
        CrictlCommand::Stop(a) => containers::stop(&rt, a).await,
        CrictlCommand::Exec(a) => containers::exec(&rt, a).await,
        CrictlCommand::Pods(a) => pods::pods(&rt, a).await,
        CrictlCommand::Inspectp(a) => pods::inspectp(&rt, a).await,
        CrictlCommand::Images(a) => images::images(&rt, a).await,
        CrictlCommand::Inspecti(a) => images::inspecti(&rt, a).await,
        CrictlCommand::Imagefsinfo(a) => images::imagefsinfo(&rt, a).await,
        CrictlCommand::Pull(a) => images::pull(&rt, a).await,
        CrictlCommand::Rmi(a) => images::rmi(&rt, a).await,
        CrictlCommand::Info(a) => runtime::info(&rt, a).await,
        CrictlCommand::Version => runtime::version(&rt).await,
        CrictlCommand::Events(a) => runtime::events(&rt, a).await,
        CrictlCommand::Logs(a) => logs::logs(&rt, a).await,
        CrictlCommand::Stats(a) => stats::stats(&rt, a).await,
        CrictlCommand::Completion(_) => Ok(ExitCode::SUCCESS),
    }
}

/// Finds the runtime the way the daemon does (flags, environment, crictl.yaml, detection) and
/// checks that it answers, within `--timeout` (default 2 s).
async fn connect(g: &GlobalArgs) -> anyhow::Result<RemoteRuntime> {
    let cfg = g.runtime.resolve_with(Timeouts {
        connect: DEFAULT_TIMEOUT,
        call: DEFAULT_TIMEOUT,
    })?;
    tracing::debug!(source = ?cfg.source, image = ?cfg.image_endpoint, timeouts = ?cfg.timeouts, "connecting");
    let runtimes = cfg
        .discover()
        .await
        .context("connect to the container runtime")?;
    Ok(runtimes.primary().clone())
}

/// Writes `text` to stdout; a closed pipe (`| head`) is not an error.
pub(crate) fn out(text: &str) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => r.context("write to stdout"),
    }
}

/// The IDs an inspect command works on: those given, else those `listed` finds; `None`, after
/// crictl's message, when there are none.
pub(crate) async fn ids_to_inspect(
    given: &[String],
    listed: impl Future<Output = anyhow::Result<Vec<String>>>,
) -> anyhow::Result<Option<Vec<String>>> {
    let ids = if given.is_empty() {
        listed.await?
    } else {
        given.to_vec()
    };
    if ids.is_empty() {
        err_out(b"No IDs provided or nothing found per filter\n");
        return Ok(None);
    }
    Ok(Some(ids))
}

/// Writes bytes to stderr.
pub(crate) fn err_out(bytes: &[u8]) {
    let mut stderr = std::io::stderr().lock();
    let _ = stderr.write_all(bytes).and_then(|()| stderr.flush());
}

/// Prints a list output as proto3 JSON or YAML: `{"<key>": [...]}`.
pub(crate) fn print_list(key: &str, items: Vec<Json>, yaml: bool) -> anyhow::Result<()> {
    let doc = Json::Obj(vec![(key.to_string(), Json::Arr(items))]);
    print_doc(&doc, yaml, false)
}

/// Prints a document crictl's way: proto3 JSON (`go == false`) or Go JSON of a sorted map,
/// or YAML of either; each followed by crictl's `Println` newline.
pub(crate) fn print_doc(doc: &Json, yaml: bool, go: bool) -> anyhow::Result<()> {
    let text = if yaml {
        let doc = if go {
            go_numbers(doc.clone())
        } else {
            doc.clone()
        };
        format!("{}\n", yaml::to_yaml(&doc))
    } else if go {
        format!("{}\n", doc.to_gojson())
    } else {
        format!("{}\n", doc.to_protojson())
    };
    out(&text)
}

/// Numbers as Go writes them after reading them into `float64` (the YAML of the status
/// outputs sees the JSON that Go wrote).
fn go_numbers(v: Json) -> Json {
    match v {
        Json::Num(n) => match Json::Num(n.clone()).to_gojson().as_str() {
            "" => Json::Num(n),
            text => Json::Num(text.to_string()),
        },
        Json::Arr(a) => Json::Arr(a.into_iter().map(go_numbers).collect()),
        Json::Obj(m) => Json::Obj(m.into_iter().map(|(k, v)| (k, go_numbers(v))).collect()),
        other => other,
    }
}

/// The `Labels:` / `Annotations:` block of crictl's verbose views: one `\tkey -> value` line
/// per entry, sorted; nothing for an empty map.
pub(crate) fn map_block(title: &str, m: &crate::cri::StringMap) -> String {
    if m.is_empty() {
        return String::new();
    }
    let mut s = format!("{title}:\n");
    for (k, v) in m {
        s.push_str(&format!("\t{k} -> {v}\n"));
    }
    s
}

/// Now, in nanoseconds since the epoch.
pub(crate) fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_blocks_are_sorted_and_absent_when_empty() {
        let mut m = crate::cri::StringMap::new();
        assert_eq!(map_block("Labels", &m), "");
        m.insert("b".into(), "2".into());
        m.insert("a".into(), "1".into());
        assert_eq!(map_block("Labels", &m), "Labels:\n\ta -> 1\n\tb -> 2\n");
    }

    #[test]
    fn the_help_links_kruised_explain() {
        let help = command().render_help().to_string();
        assert!(help.contains("kruised explain"), "{help}");
    }

    #[test]
    fn go_numbers_reformat_through_float64() {
        let v = go_numbers(Json::Arr(vec![
            Json::Num("22704".into()),
            Json::Num("1e21".into()),
        ]));
        assert_eq!(
            v,
            Json::Arr(vec![Json::Num("22704".into()), Json::Num("1e+21".into())])
        );
    }
}
