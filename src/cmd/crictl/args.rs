//! The command line of `kruised crictl` (and of the binary run as `crictl`): crictl's global
//! flags, environment and subcommands, with crictl's names and short options.

use std::time::Duration;

use clap::{Args, Subcommand, ValueEnum};

use crate::build_info::VERSION;

use crate::config::{RuntimeArgs, parse_duration};

/// crictl-compatible debugging of the node's container runtime.
#[derive(Debug, Args)]
#[command(
    disable_version_flag = true,
    after_help = "Beyond crictl: `ps --kruise` adds the kubelet hash and whether kruised \
                  considers each container current, and `kruised explain NAMESPACE/POD` shows \
                  what the daemon sees and decides for a pod's containers."
)]
pub struct CrictlArgs {
    /// How to reach the runtime, and crictl's other global flags.
    #[command(flatten)]
    pub global: GlobalArgs,
    /// What to do; none prints this help.
    #[command(subcommand)]
    pub command: Option<CrictlCommand>,
}

/// crictl's global flags (`-r`, `-i`, `-t`, `-c`, `-D`).
#[derive(Clone, Debug, Args)]
pub struct GlobalArgs {
    /// How to reach the runtime.
    #[command(flatten)]
    pub runtime: RuntimeArgs,
    /// Enable debug mode: log each CRI call.
    #[arg(short = 'D', long)]
    pub debug: bool,
    /// Accepted for crictl compatibility: kruised does not retry, it fails within the timeout.
    #[arg(long, hide = true, allow_negative_numbers = true)]
    pub max_retries: Option<i64>,
    /// Print the version.
    #[arg(short = 'v', long = "version")]
    pub version: bool,
}

/// The crictl commands kruised implements.
#[derive(Debug, Subcommand)]
pub enum CrictlCommand {
    /// List containers
    Ps(PsArgs),
    /// List pods
    Pods(PodsArgs),
    /// List images
    #[command(visible_aliases = ["image", "img"])]
    Images(ImagesArgs),
    /// Display the status of one or more containers
    Inspect(InspectArgs),
    /// Display the status of one or more pods
    Inspectp(InspectpArgs),
    /// Return the status of one or more images
    Inspecti(InspectiArgs),
    /// Display information of the container runtime
    Info(InfoArgs),
    /// Display runtime version information
    Version,
    /// Return image filesystem info
    Imagefsinfo(ImagefsinfoArgs),
    /// Pull an image from a registry
    Pull(PullArgs),
    /// Remove one or more images
    Rmi(RmiArgs),
    /// Stop one or more running containers
    Stop(StopArgs),
    /// Run a command in a running container (synchronously, through ExecSync)
    Exec(ExecArgs),
    /// Fetch the logs of a container
    Logs(LogsArgs),
    /// List container(s) resource usage statistics
    Stats(StatsArgs),
    /// Stream the events of containers
    #[command(visible_alias = "event")]
    Events(EventsArgs),
    /// Output shell completion code for `crictl`
    Completion(CompletionArgs),
}

/// Output of the list commands.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum ListOutput {
    /// crictl's table.
    #[default]
    Table,
    /// proto3 JSON.
    Json,
    /// YAML.
    Yaml,
}

/// Output of the status commands.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum StatusOutput {
    /// JSON.
    #[default]
    Json,
    /// YAML.
    Yaml,
    /// A text view.
    Table,
}

/// Output of `info` and `events`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum DataOutput {
    /// JSON.
    #[default]
    Json,
    /// YAML.
    Yaml,
}

/// The container filters shared by `ps` and `inspect`.
#[derive(Clone, Debug, Default, Args)]
pub struct ContainerFilterArgs {
    /// Show all containers (default: running only)
    #[arg(short = 'a', long)]
    pub all: bool,
    /// Filter by container id (a prefix)
    #[arg(long)]
    pub id: Option<String>,
    /// Filter by container name regular expression pattern
    #[arg(long)]
    pub name: Option<String>,
    /// Filter by pod id (a prefix)
    #[arg(short = 'p', long)]
    pub pod: Option<String>,
    /// Filter by container image
    #[arg(long)]
    pub image: Option<String>,
    /// Filter by container state: created, running, exited or unknown
    #[arg(short = 's', long)]
    pub state: Option<String>,
    /// Filter by key=value label
    #[arg(long)]
    pub label: Vec<String>,
    /// Show the most recently created container (includes all states)
    #[arg(short = 'l', long)]
    pub latest: bool,
    /// Show last n recently created containers (includes all states); 0 for unlimited
    #[arg(short = 'n', long, default_value_t = 0)]
    pub last: usize,
    /// Filter by pod namespace regular expression pattern
    #[arg(long)]
    pub namespace: Option<String>,
}

/// `ps`.
#[derive(Clone, Debug, Args)]
pub struct PsArgs {
    /// Filters.
    #[command(flatten)]
    pub filter: ContainerFilterArgs,
    /// Only display container IDs
    #[arg(short = 'q', long)]
    pub quiet: bool,
    /// Output format
    #[arg(short = 'o', long, value_enum, default_value_t)]
    pub output: ListOutput,
    /// Show output without truncating the ID
    #[arg(long)]
    pub no_trunc: bool,
    /// Show image path instead of image id
    #[arg(short = 'r', long)]
    pub resolve_image_path: bool,
    /// Show verbose information for containers
    #[arg(short = 'v', long)]
    pub verbose: bool,
    /// Add kruised's columns: the kubelet hash recorded on the container, and whether kruised
    /// considers it the current container of its pod
    #[arg(long)]
    pub kruise: bool,
}

/// The pod filters shared by `pods` and `inspectp`.
#[derive(Clone, Debug, Default, Args)]
pub struct PodFilterArgs {
    /// Filter by pod id (a prefix)
    #[arg(long)]
    pub id: Option<String>,
    /// Filter by pod name regular expression pattern
    #[arg(long)]
    pub name: Option<String>,
    /// Filter by pod namespace regular expression pattern
    #[arg(long)]
    pub namespace: Option<String>,
    /// Filter by pod state: ready or notready
    #[arg(short = 's', long)]
    pub state: Option<String>,
    /// Filter by key=value label
    #[arg(long)]
    pub label: Vec<String>,
    /// Show the most recently created pod
    #[arg(short = 'l', long)]
    pub latest: bool,
    /// Show last n recently created pods; 0 for unlimited
    #[arg(short = 'n', long, default_value_t = 0)]
    pub last: usize,
}

/// `pods`.
#[derive(Clone, Debug, Args)]
pub struct PodsArgs {
    /// Filters.
    #[command(flatten)]
    pub filter: PodFilterArgs,
    /// Show verbose info for pods
    #[arg(short = 'v', long)]
    pub verbose: bool,
    /// List only pod IDs
    #[arg(short = 'q', long)]
    pub quiet: bool,
    /// Output format
    #[arg(short = 'o', long, value_enum, default_value_t)]
    pub output: ListOutput,
    /// Show output without truncating the ID
    #[arg(long)]
    pub no_trunc: bool,
}

/// `images`.
#[derive(Clone, Debug, Args)]
pub struct ImagesArgs {
    /// Only images matching REPOSITORY[:TAG], as the runtime filters them
    pub image: Option<String>,
    /// Show verbose info for images
    #[arg(short = 'v', long)]
    pub verbose: bool,
    /// Only show image IDs
    #[arg(short = 'q', long)]
    pub quiet: bool,
    /// Filter: dangling=true|false, reference=REGEX, before=IMAGE, since=IMAGE
    #[arg(short = 'f', long)]
    pub filter: Vec<String>,
    /// Output format: json, yaml or table (anything else prints the table, as in crictl)
    #[arg(short = 'o', long, default_value = "table")]
    pub output: String,
    /// Show digests
    #[arg(long)]
    pub digests: bool,
    /// Show output without truncating the ID
    #[arg(long)]
    pub no_trunc: bool,
    /// Show whether the image is pinned or not
    #[arg(long)]
    pub pinned: bool,
}

/// `inspect`.
#[derive(Clone, Debug, Args)]
pub struct InspectArgs {
    /// Container IDs (prefixes work); none selects by the filters
    pub ids: Vec<String>,
    /// Output format
    #[arg(short = 'o', long, value_enum, default_value_t)]
    pub output: StatusOutput,
    /// Do not show verbose information (the runtime's info)
    #[arg(short = 'q', long)]
    pub quiet: bool,
    /// Filters, when no ID is given.
    #[command(flatten)]
    pub filter: ContainerFilterArgs,
}

/// `inspectp`.
#[derive(Clone, Debug, Args)]
pub struct InspectpArgs {
    /// Pod IDs (prefixes work); none selects by the filters
    pub ids: Vec<String>,
    /// Output format
    #[arg(short = 'o', long, value_enum, default_value_t)]
    pub output: StatusOutput,
    /// Do not show verbose information (the runtime's info)
    #[arg(short = 'q', long)]
    pub quiet: bool,
    /// Filters, when no ID is given.
    #[command(flatten)]
    pub filter: PodFilterArgs,
}

/// `inspecti`.
#[derive(Clone, Debug, Args)]
pub struct InspectiArgs {
    /// Image references or IDs; none inspects every image
    pub ids: Vec<String>,
    /// Output format
    #[arg(short = 'o', long, value_enum, default_value_t)]
    pub output: StatusOutput,
    /// Do not show verbose information (the runtime's info)
    #[arg(short = 'q', long)]
    pub quiet: bool,
    /// Filter: dangling=true|false, reference=REGEX, before=IMAGE, since=IMAGE (no IDs given)
    #[arg(short = 'f', long)]
    pub filter: Vec<String>,
}

/// `info`.
#[derive(Clone, Debug, Args)]
pub struct InfoArgs {
    /// Output format
    #[arg(short = 'o', long, value_enum, default_value_t)]
    pub output: DataOutput,
    /// Do not show verbose information (the runtime's info)
    #[arg(short = 'q', long)]
    pub quiet: bool,
}

/// `imagefsinfo`.
#[derive(Clone, Debug, Args)]
pub struct ImagefsinfoArgs {
    /// Output format
    #[arg(short = 'o', long, value_enum, default_value_t)]
    pub output: StatusOutput,
}

/// `pull`.
#[derive(Clone, Debug, Args)]
pub struct PullArgs {
    /// NAME[:TAG|@DIGEST]
    pub image: String,
    /// Use USERNAME[:PASSWORD] for accessing the registry
    #[arg(long, env = "CRICTL_CREDS", value_name = "USERNAME[:PASSWORD]")]
    pub creds: Option<String>,
    /// Use AUTH_STRING (base64 of USERNAME[:PASSWORD]) for accessing the registry
    #[arg(long, env = "CRICTL_AUTH", value_name = "AUTH_STRING")]
    pub auth: Option<String>,
    /// Maximum time to be used for pulling the image; 0s for no limit
    #[arg(long, visible_alias = "pt", env = "CRICTL_PULL_TIMEOUT", value_parser = parse_duration, default_value = "0s")]
    pub pull_timeout: Duration,
}

/// `rmi`.
#[derive(Clone, Debug, Args)]
pub struct RmiArgs {
    /// Image IDs or references
    pub ids: Vec<String>,
    /// Remove all images
    #[arg(short = 'a', long)]
    pub all: bool,
    /// Remove all unused images
    #[arg(short = 'q', long)]
    pub prune: bool,
}

/// `stop`.
#[derive(Clone, Debug, Args)]
pub struct StopArgs {
    /// Container IDs
    pub ids: Vec<String>,
    /// Stop all running containers
    #[arg(short = 'a', long)]
    pub all: bool,
    /// Seconds to wait to kill the container after a graceful stop is requested
    #[arg(short = 't', long, default_value_t = 0)]
    pub timeout: u64,
}

/// `exec`.
#[derive(Clone, Debug, Args)]
pub struct ExecArgs {
    /// Run the command synchronously (ExecSync); the only mode kruised offers
    #[arg(short = 's', long)]
    pub sync: bool,
    /// Timeout in seconds (0: none)
    #[arg(long, default_value_t = 0)]
    pub timeout: u64,
    /// Keep STDIN open (needs a streaming exec, which kruised does not offer)
    #[arg(short = 'i', long)]
    pub interactive: bool,
    /// Allocate a pseudo-TTY (needs a streaming exec, which kruised does not offer)
    #[arg(short = 't', long)]
    pub tty: bool,
    /// The container (an ID or a prefix)
    pub container: String,
    /// The command and its arguments
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
    pub command: Vec<String>,
}

/// `logs`.
#[derive(Clone, Debug, Args)]
pub struct LogsArgs {
    /// The container (an ID or a prefix)
    pub id: Option<String>,
    /// Follow log output
    #[arg(short = 'f', long)]
    pub follow: bool,
    /// Print the logs of the previous instance of the container in its pod
    #[arg(short = 'p', long)]
    pub previous: bool,
    /// Number of lines to show from the end of the logs (-1: all)
    #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
    pub tail: i64,
    /// Maximum bytes of logs to return (-1: no limit)
    #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
    pub limit_bytes: i64,
    /// Show logs since a timestamp (RFC 3339) or a relative time (e.g. 42m)
    #[arg(long)]
    pub since: Option<String>,
    /// Show timestamps
    #[arg(short = 't', long)]
    pub timestamps: bool,
    /// Show only this stream: stdout or stderr
    #[arg(short = 's', long)]
    pub stream: Option<String>,
}

/// `stats`.
#[derive(Clone, Debug, Args)]
pub struct StatsArgs {
    /// A container ID (as --id)
    pub container: Option<String>,
    /// Show all containers (default shows just running)
    #[arg(short = 'a', long)]
    pub all: bool,
    /// Filter by container id
    #[arg(long)]
    pub id: Option<String>,
    /// Filter by pod id
    #[arg(short = 'p', long)]
    pub pod: Option<String>,
    /// Filter by key=value label
    #[arg(long)]
    pub label: Vec<String>,
    /// Output format
    #[arg(short = 'o', long, value_enum, default_value_t)]
    pub output: ListOutput,
    /// Sample duration for CPU usage in seconds
    #[arg(short = 's', long, default_value_t = 1)]
    pub seconds: u64,
    /// Watch resources until interrupted
    #[arg(short = 'w', long)]
    pub watch: bool,
}

/// `events`.
#[derive(Clone, Debug, Args)]
pub struct EventsArgs {
    /// Output format
    #[arg(short = 'o', long, value_enum, default_value_t)]
    pub output: DataOutput,
}

/// `completion`.
#[derive(Clone, Debug, Args)]
pub struct CompletionArgs {
    /// The shell
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// Whether the command line or crictl.yaml asks for debug mode (read before logging starts;
/// errors in the file are reported later, by the command).
pub fn debug_requested(args: &CrictlArgs) -> bool {
    args.global.debug
        || args
            .global
            .runtime
            .crictl_file()
            .ok()
            .and_then(|f| f.debug)
            .unwrap_or(false)
}

/// The clap command of `crictl` on its own (for its help and completions).
pub fn command() -> clap::Command {
    CrictlArgs::augment_args(clap::Command::new("crictl"))
        .about("crictl-compatible debugging of the node's container runtime (kruised)")
        .version(VERSION)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_help_links_kruised_explain() {
        let help = command().render_help().to_string();
        assert!(help.contains("kruised explain"), "{help}");
    }
}
