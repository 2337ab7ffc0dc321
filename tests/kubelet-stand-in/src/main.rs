//! `kubelet-stand-in`: the kubelet's part of one node, for kruised's demo on a machine without
//! Kubernetes (`scripts/demo.sh --api double`): the API-server double plays the control plane,
//! a real containerd runs the containers, and this plays the kubelet between them, on each change
//! of the pods and every `--sync-period`, for the pods bound to `--node-name`. It is the tests'
//! one kubelet (`kruised_test_support::kubelet::run`, whose head says what it does; the fleet's
//! kubelets too); at SIGTERM or Ctrl-C it removes every pod it ran. Test infrastructure, never
//! shipped.
//!
//! Not a kubelet: no volumes, probes, resources, init containers, networking (pods share the
//! host's network namespace) or restart backoff.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use kruised::cri::{Endpoint, RemoteRuntime, RuntimeService, Timeouts};
use kruised_test_support::kubelet::Kubelet;
use kruised_test_support::kubelet::run::{NodeKubelet, NodeKubelets};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client};

/// The kubelet's part of one node, on a real CRI runtime, for the API-server double.
#[derive(Debug, Parser)]
#[command(name = "kubelet-stand-in", version)]
struct Args {
    /// Kubeconfig of the API server (the double writes one).
    #[arg(long)]
    kubeconfig: PathBuf,
    /// The node whose pods this runs.
    #[arg(long)]
    node_name: String,
    /// The CRI runtime, `unix:///path` or a path.
    #[arg(long)]
    runtime_endpoint: Endpoint,
    /// Root of the pods' log directories.
    #[arg(long)]
    log_dir: PathBuf,
    /// Cgroup parent of the sandboxes (`<this>/pod<uid>`), cgroupfs.
    #[arg(long, default_value = "/cri-lab")]
    cgroup_root: String,
    /// How often pods and containers are compared (the kubelet relists every second).
    #[arg(long, default_value = "500ms", value_parser = parse_millis)]
    sync_period: Duration,
}

fn parse_millis(s: &str) -> Result<Duration, String> {
    let ms = s.strip_suffix("ms").unwrap_or(s);
    ms.parse::<u64>()
        .map(Duration::from_millis)
        .map_err(|e| format!("{s}: {e} (milliseconds, e.g. 500ms)"))
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let kubeconfig = Kubeconfig::read_from(&args.kubeconfig)
        .with_context(|| format!("reading {}", args.kubeconfig.display()))?;
    let config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    let client = Client::try_from(config)?;
    let runtime = RemoteRuntime::new(args.runtime_endpoint.clone(), None, Timeouts::default());
    let version = runtime
        .version()
        .await
        .with_context(|| format!("the runtime at {}", args.runtime_endpoint))?;
    eprintln!(
        "kubelet-stand-in: node {}, runtime {} {} at {}",
        args.node_name, version.runtime_name, version.runtime_version, args.runtime_endpoint
    );
    let mut kubelet = Kubelet::new(runtime, &args.log_dir);
    kubelet.cgroup_root = args.cgroup_root.clone();
    let node = NodeKubelet::new(&args.node_name, kubelet, &version.runtime_name, true);
    let mut kubelets = NodeKubelets::new(Api::all(client), vec![node]);
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        () = kubelets.run(args.sync_period) => {}
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    for node in &mut kubelets.nodes {
        node.remove_all().await;
    }
    eprintln!("kubelet-stand-in: stopped; every pod it ran is removed");
    Ok(())
}
