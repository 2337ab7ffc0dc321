//! The `kruised` binary: parse the command line, start telemetry, run.

use std::process::ExitCode;

/// Worker threads unless `TOKIO_WORKER_THREADS` says otherwise. The daemon waits on the network
/// almost all the time: two threads keep a busy node's work flowing, where one per core (tokio's
/// default) would cost a stack and a malloc arena per core on a 100-core node.
const WORKER_THREADS: usize = 2;
/// Threads for blocking work (file reads, name resolution); tokio's default is 512.
const MAX_BLOCKING_THREADS: usize = 16;

/// glibc malloc arenas unless `MALLOC_ARENA_MAX` says otherwise. glibc gives each thread that
/// allocates an arena of its own (up to 8 per core), each with its own free lists and
/// fragmentation; this daemon allocates little and rarely at once: one arena keeps 1.2 MiB less
/// resident on a 110-pod node with no change in reaction time (`benches/reaction.rs`).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn limit_malloc_arenas() {
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: mallopt only sets a glibc malloc parameter; it is called before any other
        // thread exists, and an unknown or refused value only makes it return 0.
        #[allow(unsafe_code)]
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 1);
        }
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn limit_malloc_arenas() {}

fn main() -> ExitCode {
    limit_malloc_arenas();
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
        if let Err(e) = kruised::telemetry::init(cli.log_format, cli.default_log_level()) {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
        match kruised::run(cli).await {
            Ok(code) => code,
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::FAILURE
            }
        }
    })
}
