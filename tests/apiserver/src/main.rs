//! `apiserver-double`: run the in-memory API server standalone.
//!
//! `apiserver-double --listen 127.0.0.1:0 --kubeconfig PATH [--ready-file PATH]`
//! binds, writes the kubeconfig, prints the URL on stdout, writes the URL to
//! the ready file (after the kubeconfig exists), and serves until SIGTERM or
//! Ctrl-C. Test control endpoints live under `/_double/`.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use apiserver_double::{ApiServer, Config};
use clap::Parser;

/// In-memory Kubernetes API server double.
#[derive(Debug, Parser)]
#[command(name = "apiserver-double", version)]
struct Args {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Where to write a kubeconfig pointing at this server.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// File written with the URL once the server is ready.
    #[arg(long)]
    ready_file: Option<PathBuf>,
    /// Interval between watch BOOKMARK events, in milliseconds.
    #[arg(long, default_value_t = 60_000)]
    bookmark_interval_ms: u64,
    /// A watch ends after its `timeoutSeconds` times this (below 1, a short run stands for a
    /// long one).
    #[arg(long, default_value_t = 1.0)]
    watch_timeout_scale: f64,
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let args = Args::parse();
    let config = Config {
        addr: args.listen,
        bookmark_interval: Duration::from_millis(args.bookmark_interval_ms),
        watch_timeout_scale: args.watch_timeout_scale,
        ..Config::default()
    };
    let handle = ApiServer::start_with(config).await?;
    if let Some(path) = &args.kubeconfig {
        handle.write_kubeconfig(path)?;
    }
    let url = handle.url();
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{url}")?;
        out.flush()?;
    }
    if let Some(path) = &args.ready_file {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, format!("{url}\n"))?;
        std::fs::rename(&tmp, path)?;
    }
    // SIGTERM or Ctrl-C (the double runs where kruised does: on Linux)
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => {}
        r = tokio::signal::ctrl_c() => r?,
    }
    handle.shutdown().await;
    Ok(())
}
