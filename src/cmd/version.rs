//! `kruised version`: our version, then the runtime's in crictl's format.

use std::process::ExitCode;

use clap::Args;

use crate::config::RuntimeArgs;
use crate::cri::Runtimes;

/// Arguments of `kruised version`.
#[derive(Debug, Args)]
pub struct VersionArgs {
    /// How to reach the runtime.
    #[command(flatten)]
    pub runtime: RuntimeArgs,
    /// Print only kruised's own version; do not contact the runtime.
    #[arg(long)]
    pub client_only: bool,
}

/// kruised's own version.
pub use crate::build_info::VERSION;

pub(crate) async fn run(args: VersionArgs) -> anyhow::Result<ExitCode> {
    println!("Version:  {VERSION}");
    if args.client_only {
        return Ok(ExitCode::SUCCESS);
    }
    let rt = args.runtime.resolve()?;
    match Runtimes::discover(&rt.source, rt.image_endpoint.clone(), rt.timeouts).await {
        Ok(runtimes) => {
            for (v, remote) in runtimes.all() {
                println!("RuntimeEndpoint:  {}", remote.endpoint());
                println!("RuntimeName:  {}", v.runtime_name);
                println!("RuntimeVersion:  {}", v.runtime_version);
                println!("RuntimeApiVersion:  {}", v.runtime_api_version);
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("error: {e}");
            Ok(ExitCode::FAILURE)
        }
    }
}
