//! `kruised version`: our version, then the runtime's in crictl's format, and which runtime is
//! the primary one, and why (the kubelet's, as its Node reports it, where several answer); for
//! each runtime whether pulls through it show their progress (`PullProgress`); and whether it
//! keeps the images kruised pre-pulls pinned until their first use.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use crate::config::RuntimeArgs;
use crate::cri::NodeRuntime;
use crate::k8s::client::{self, ClientSettings, ServedVersions};

/// How long `kruised version` waits for its Node's answer.
const NODE_TIMEOUT: Duration = Duration::from_secs(10);

/// Arguments of `kruised version`.
#[derive(Debug, Args)]
pub struct VersionArgs {
    /// How to reach the runtime.
    #[command(flatten)]
    pub runtime: RuntimeArgs,
    /// Print only kruised's own version; do not contact the runtime.
    #[arg(long)]
    pub client_only: bool,
    /// The node whose Node says which runtime the kubelet uses, where several answer (in the
    /// DaemonSet's pod: the NODE_NAME env).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,
    /// kubeconfig file to read that Node with; default: KUBECONFIG, then in-cluster, then
    /// ~/.kube/config.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
}

/// kruised's own version.
pub use crate::build_info::VERSION;

pub(crate) async fn run(args: VersionArgs) -> anyhow::Result<ExitCode> {
    println!("Version:  {VERSION}");
    println!("Commit:  {}", crate::build_info::COMMIT);
    if args.client_only {
        return Ok(ExitCode::SUCCESS);
    }
    let rt = args.runtime.resolve()?;
    match rt.discover().await {
        Ok(mut runtimes) => {
            if runtimes.several() {
                runtimes.choose_primary(node_runtime(&args).await);
            }
            for (v, remote) in runtimes.all() {
                println!("RuntimeEndpoint:  {}", remote.endpoint());
                println!("RuntimeName:  {}", v.runtime_name);
                println!("RuntimeVersion:  {}", v.runtime_version);
                println!("RuntimeApiVersion:  {}", v.runtime_api_version);
                println!("PullProgress:  {}", pull_progress(remote).await);
            }
            println!(
                "PrimaryRuntime:  {}",
                runtimes.primary_version().runtime_name
            );
            // two runtimes of one name (k3s's containerd beside the host's) differ here only
            println!("PrimaryEndpoint:  {}", runtimes.primary().endpoint());
            println!("PrimaryBecause:  {}", runtimes.primary_reason());
            // what the kubelet's image GC leaves alone: never claimed where it does not hold
            println!(
                "ImagePinning:  {}",
                crate::cri::containerd::pinning(runtimes.primary_version())
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("error: {e}");
            Ok(ExitCode::FAILURE)
        }
    }
}

/// Whether pulls through `remote` show their progress: NodeImage `progress` and the stall
/// timeout need containerd's content service on the runtime's image socket.
async fn pull_progress(remote: &crate::cri::RemoteRuntime) -> String {
    let content = crate::cri::containerd::content::Content::new(
        remote.image_endpoint().clone(),
        remote.timeouts(),
    );
    match content.ingests().await {
        Ok(_) => "yes (containerd's content service: NodeImage progress follows the bytes \
                   landed; --image-pull-stall-timeout applies)"
            .into(),
        Err(crate::cri::CriError::Unsupported { .. }) => {
            "no (no containerd content service: NodeImage progress is 0 until a pull ends; no \
             stall timeout, timeoutSeconds is a wall clock)"
                .into()
        }
        Err(e) => format!("unknown: {e}"),
    }
}

/// The kubelet's runtime as the Node reports it, asked once (the daemon's question), or why
/// there is no answer.
async fn node_runtime(args: &VersionArgs) -> NodeRuntime {
    let Some(node) = args.node_name.as_deref().filter(|n| !n.is_empty()) else {
        return NodeRuntime::Unknown("no --node-name (NODE_NAME) to ask its Node with".into());
    };
    let settings = ClientSettings {
        kubeconfig: args.kubeconfig.clone(),
        qps: 5.0,
        burst: 10,
        versions: ServedVersions::new(),
    };
    let client = match client::build(&settings).await {
        Ok(c) => c,
        Err(e) => return NodeRuntime::Unknown(format!("cannot ask Node {node}: {e}")),
    };
    match tokio::time::timeout(
        NODE_TIMEOUT,
        crate::k8s::node::kubelets_runtime(&client, node),
    )
    .await
    {
        Ok(Ok(answer)) => answer.into(),
        Ok(Err(e)) => NodeRuntime::Unknown(format!("asking Node {node}: {e}")),
        Err(_) => NodeRuntime::Unknown(format!(
            "Node {node} not read within {NODE_TIMEOUT:?} (the API server does not answer)"
        )),
    }
}
