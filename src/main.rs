//! The `kruised` binary: parse the command line, start telemetry, run.

use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = match kruised::Cli::parse_or_exit_code() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    kruised::telemetry::init(cli.log_format, cli.default_log_level());
    match kruised::run(cli).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
