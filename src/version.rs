//! `kruised version`: our version, then the runtime's in crictl's format.

use std::process::ExitCode;

use crate::config::VersionArgs;
use crate::cri::Runtimes;

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
