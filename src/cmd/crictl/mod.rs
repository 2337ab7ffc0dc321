//! `kruised crictl`: crictl-compatible debugging of the node's container runtime, with crictl's
//! global flags, environment and config file, commands, table layouts and JSON/YAML shapes
//! (issue 12). The same binary runs as `crictl` when invoked under that name.
//!
//! - [`args`]: the command line, and its clap command ([`command`]);
//! - [`format`], [`table`], [`json`], [`yaml`], [`wire`]: crictl's output formats, as pure
//!   functions;
//! - [`filter`]: labels, states, regular expressions, orderings;
//! - `connect`: reaching the runtime within `--timeout`; `output`: writing to stdout and
//!   stderr, the documents and the verbose views' blocks;
//! - one file per command group: [`containers`], [`pods`], [`images`], [`runtime`], [`logs`],
//!   [`stats`].
//!
//! Where crictl does something unhelpful, kruised follows the issue instead (README,
//! "Differences from crictl"): `exec -s` exits with the command's status, and a runtime that
//! does not answer fails within `--timeout` instead of being retried.

pub mod args;
mod connect;
mod containers;
pub mod filter;
pub mod format;
mod images;
pub mod json;
mod logs;
mod output;
mod pods;
mod runtime;
mod stats;
pub mod table;
pub mod wire;
pub mod yaml;

use std::process::ExitCode;

use args::CrictlCommand;
pub use args::{CrictlArgs, command, debug_requested};
pub use connect::DEFAULT_TIMEOUT;
use connect::connect;
use output::out;

use crate::build_info::VERSION;

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
