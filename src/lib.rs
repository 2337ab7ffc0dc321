//! kruised: the node side of OpenKruise in-place updates and image pre-pulling.
//!
//! `main.rs` parses the command line and starts telemetry; everything else starts here.

pub mod addr;
pub mod admin;
pub mod build_info;
pub mod cli;
pub mod config;
pub mod controller;
pub mod cri;
pub mod crictl;
pub mod daemon;
pub mod explain;
pub mod gojson;
pub mod hash;
pub mod hashcmd;
pub mod health;
pub mod k8s;
pub mod metrics;
pub mod sdnotify;
pub mod sync;
pub mod telemetry;
mod version;

use std::process::ExitCode;

pub use cli::{Cli, Command};

/// Runs the command the user asked for. Errors are returned for `main` to print; nothing in the
/// library exits the process.
pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Version(args) => version::run(args).await,
        Command::Run(args) => daemon::run(args.resolve()?).await,
        Command::Hash(args) => hashcmd::run(args),
        Command::Explain(args) => explain::run(args).await,
        Command::Crictl(args) => crictl::run(args).await,
        Command::Completion(args) => {
            print!("{}", cli::completion(args.shell));
            Ok(ExitCode::SUCCESS)
        }
        Command::Crds => {
            print!("{}", k8s::crd::crds_yaml()?);
            Ok(ExitCode::SUCCESS)
        }
    }
}
