//! The `kruised` binary: parse the command line, start telemetry, run.

use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = kruised::Cli::parse_env();
    kruised::telemetry::init(cli.log_format);
    match kruised::run(cli).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
