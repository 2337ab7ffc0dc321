//! The `kruised` binary: parse the command line, start telemetry, run.

use std::process::ExitCode;

/// Worker threads unless `TOKIO_WORKER_THREADS` says otherwise. The daemon waits on the network
/// almost all the time: two threads keep a busy node's work flowing, where one per core (tokio's
/// default) would cost a stack and a malloc arena per core on a 100-core node.
const WORKER_THREADS: usize = 2;
/// Threads for blocking work (file reads, name resolution); tokio's default is 512.
const MAX_BLOCKING_THREADS: usize = 16;

fn main() -> ExitCode {
    let cli = match kruised::Cli::parse_or_exit_code() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if std::env::var_os("TOKIO_WORKER_THREADS").is_none() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        builder.worker_threads(cores.min(WORKER_THREADS));
    }
    let runtime = match builder
        .max_blocking_threads(MAX_BLOCKING_THREADS)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        kruised::telemetry::init(cli.log_format, cli.default_log_level());
        match kruised::run(cli).await {
            Ok(code) => code,
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::FAILURE
            }
        }
    })
}
