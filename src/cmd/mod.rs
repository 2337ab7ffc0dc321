//! The commands (`run`, `version`, `hash`, `explain`, `crictl`), each in its own file with its
//! arguments beside it, and the command line that picks one. The same binary runs as
//! `kruised <command>`, as `kruise-daemon` (kruise's Helm chart runs `/kruise-daemon` with
//! kruise-daemon's flags: that is `kruised run`), and as `crictl` (`kruised crictl`).

pub mod crictl;
pub mod explain;
pub mod hash;
pub mod run;
pub mod version;

use std::ffi::OsString;
use std::path::Path;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

use self::explain::ExplainArgs;
use self::hash::HashArgs;
use self::run::RunArgs;
use self::version::VersionArgs;
use crate::telemetry::LogFormat;

/// kruised: the node side of OpenKruise in-place updates and image pre-pulling.
#[derive(Debug, Parser)]
#[command(name = "kruised", version, about, propagate_version = true)]
pub struct Cli {
    /// Log format.
    #[arg(
        long,
        global = true,
        value_enum,
        default_value_t,
        env = "KRUISED_LOG_FORMAT"
    )]
    pub log_format: LogFormat,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
#[allow(clippy::large_enum_variant, reason = "parsed once at start")]
pub enum Command {
    /// Run the node daemon.
    Run(RunArgs),
    /// Print kruised's version and the container runtime's.
    Version(VersionArgs),
    /// Print, per container of a Pod (YAML or JSON, file or stdin), the kubelet's container hash
    /// in both formulas and kruise's expected env-from-metadata hash.
    Hash(HashArgs),
    /// Show, per container of a pod on this node, what the daemon sees and decides.
    Explain(ExplainArgs),
    /// Print the CustomResourceDefinitions of the apps.kruise.io resources kruised uses (for
    /// clusters without OpenKruise's own CRDs).
    Crds,
    /// crictl-compatible debugging of the node's container runtime (also run as `crictl`).
    Crictl(self::crictl::CrictlArgs),
    /// Print shell completion code for kruised.
    Completion(CompletionArgs),
}

/// Runs the command the user asked for. Errors are returned for `main` to print; nothing in the
/// library exits the process.
pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Version(args) => version::run(args).await,
        Command::Run(args) => run::run(args).await,
        Command::Hash(args) => hash::run(args),
        Command::Explain(args) => explain::run(args).await,
        Command::Crictl(args) => crictl::run(args).await,
        Command::Completion(args) => {
            print!("{}", completion(args.shell));
            Ok(ExitCode::SUCCESS)
        }
        Command::Crds => {
            print!("{}", crate::k8s::crd::crds_yaml()?);
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Output format of the inspection commands.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    /// A table.
    #[default]
    Table,
    /// JSON.
    Json,
}

/// Arguments of `kruised completion`.
#[derive(Debug, clap::Args)]
pub struct CompletionArgs {
    /// The shell.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// The completion script of `kruised` for `shell`.
pub fn completion(shell: clap_complete::Shell) -> String {
    let mut buf = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "kruised", &mut buf);
    String::from_utf8_lossy(&buf).into_owned()
}

/// The subcommand a binary name stands for: `kruise-daemon` runs the daemon, `crictl` the
/// crictl-compatible commands.
fn implied_command(argv0: &OsString) -> Option<&'static str> {
    let name = Path::new(argv0).file_name()?.to_str()?;
    match name {
        "kruise-daemon" => Some("run"),
        "crictl" => Some("crictl"),
        _ => None,
    }
}

/// `args` with the subcommand the binary's name implies inserted after the name.
pub fn expand_multicall(args: Vec<OsString>) -> Vec<OsString> {
    let Some(argv0) = args.first() else {
        return args;
    };
    match implied_command(argv0) {
        Some(sub) => {
            let mut out = Vec::with_capacity(args.len() + 1);
            out.push(argv0.clone());
            out.push(sub.into());
            out.extend(args.into_iter().skip(1));
            out
        }
        None => args,
    }
}

impl Cli {
    /// Parses the process's arguments, honouring the binary's other names.
    pub fn parse_env() -> Self {
        Cli::parse_from(expand_multicall(std::env::args_os().collect()))
    }

    /// Parses the process's arguments; on a usage error or a help request prints it and
    /// returns the exit status: 0 for help and version, 1 for errors under `crictl` (crictl's
    /// status), 2 for other errors (clap's).
    pub fn parse_or_exit_code() -> Result<Self, ExitCode> {
        Self::parse_args_or_exit_code(std::env::args_os().collect())
    }

    fn parse_args_or_exit_code(args: Vec<OsString>) -> Result<Self, ExitCode> {
        let report = |e: clap::Error, crictl: bool| {
            let _ = e.print();
            if !e.use_stderr() {
                ExitCode::SUCCESS
            } else if crictl {
                ExitCode::FAILURE
            } else {
                ExitCode::from(2)
            }
        };
        if args.first().and_then(implied_command) == Some("crictl") {
            // parsed as `crictl` itself, so usage and help speak of `crictl ps`, not of
            // `crictl crictl ps`
            let matches = self::crictl::command()
                .try_get_matches_from(args)
                .map_err(|e| report(e, true))?;
            let args =
                <self::crictl::CrictlArgs as clap::FromArgMatches>::from_arg_matches(&matches)
                    .map_err(|e| report(e, true))?;
            return Ok(Cli {
                log_format: LogFormat::default(),
                command: Command::Crictl(args),
            });
        }
        let args = expand_multicall(args);
        let crictl = args.get(1).is_some_and(|a| a == "crictl");
        Cli::try_parse_from(args).map_err(|e| report(e, crictl))
    }

    /// The log level `main` starts with when `RUST_LOG` does not say: crictl's commands log
    /// only errors (their output is the point), or everything with `-D`.
    pub fn default_log_level(&self) -> &'static str {
        match &self.command {
            Command::Crictl(args) if self::crictl::debug_requested(args) => "warn,kruised=debug",
            Command::Crictl(_) => "error",
            _ => "info",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{DEFAULT_BURST, DEFAULT_QPS, RuntimeArgs};
    use std::time::Duration;

    #[test]
    fn run_requires_a_node_name() {
        let cli = Cli::try_parse_from(["kruised", "run", "--node-name", ""]).unwrap();
        let Command::Run(r) = cli.command else {
            panic!("not run")
        };
        let err = r.resolve().unwrap_err().to_string();
        assert!(err.contains("NODE_NAME"), "{err}");
    }

    #[test]
    fn run_accepts_kruise_daemon_chart_arguments() {
        let cli = Cli::try_parse_from([
            "kruised",
            "run",
            "--node-name",
            "n1",
            "--logtostderr=true",
            "--v=4",
            "--addr=:10221",
            "--feature-gates=PodProbeMarkerGate=true",
            "--socket-file=containerd.sock",
            "--enable-pprof=true",
            "--pprof-addr=localhost:10222",
            "--max-workers-for-pull-image=2",
            "--config",
            "/nonexistent/crictl.yaml",
        ])
        .unwrap();
        let Command::Run(r) = cli.command else {
            panic!("not run")
        };
        // an explicit missing crictl config is refused; without it the rest is valid
        assert!(r.resolve().is_err());
        let r = RunArgs {
            runtime: RuntimeArgs {
                crictl_config: None,
                ..r.runtime.clone()
            },
            ..r
        };
        let c = r.resolve().unwrap();
        assert_eq!(c.addr, "0.0.0.0:10221".parse().unwrap());
        assert_eq!(c.max_pull_workers, Some(2));
        assert_eq!((c.qps, c.burst), (DEFAULT_QPS, DEFAULT_BURST));
    }

    #[test]
    fn cli_parses_version_with_runtime_flags() {
        let cli = Cli::try_parse_from([
            "kruised",
            "--log-format",
            "json",
            "version",
            "--runtime-endpoint",
            "unix:///run/x.sock",
            "--timeout",
            "1s",
        ])
        .unwrap();
        assert_eq!(cli.log_format, LogFormat::Json);
        let Command::Version(v) = cli.command else {
            panic!("not version")
        };
        assert_eq!(
            v.runtime.runtime_endpoint.as_deref(),
            Some("unix:///run/x.sock")
        );
        assert_eq!(v.runtime.timeout, Some(Duration::from_secs(1)));
    }

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    fn run(args: &[&str]) -> Result<RunArgs, clap::Error> {
        let mut argv = vec!["kruise-daemon"];
        argv.extend_from_slice(args);
        let cli = Cli::try_parse_from(expand_multicall(os(&argv)))?;
        match cli.command {
            Command::Run(r) => Ok(r),
            other => panic!("not run: {other:?}"),
        }
    }

    #[test]
    fn kruises_chart_arguments_start_the_daemon_and_the_meaningless_ones_are_named() {
        let r = run(&[
            "--logtostderr=true",
            "--v=4",
            "--addr=:10221",
            "--feature-gates=ImagePullJobGate=true,ForceDeleteTimeoutExpectationGate=true",
            "--socket-file=",
            "--enable-pprof=true",
            "--pprof-addr=localhost:10222",
            "--plugin-config-file=/credential-provider-config/CredentialProviderPlugin.yaml",
            "--plugin-bin-dir=/credential-provider-plugin",
        ])
        .unwrap();
        assert_eq!(r.runtime.socket_file.as_deref(), Some(""));
        assert_eq!(
            r.plugin_bin_dir,
            std::path::PathBuf::from("/credential-provider-plugin")
        );
        assert_eq!(
            r.compat.given(),
            ["--enable-pprof", "--pprof-addr", "--v", "--logtostderr"]
        );
    }

    #[test]
    fn every_klog_and_kruise_daemon_flag_is_accepted_with_pflags_syntax() {
        let r = run(&[
            "-v=5",
            "--log_dir=/tmp",
            "--log_file",
            "/tmp/x",
            "--log_file_max_size=10",
            "--alsologtostderr",
            "--add_dir_header=false",
            "--skip_headers=1",
            "--one_output",
            "--skip_log_headers=T",
            "--stderrthreshold=INFO",
            "--vmodule=a=2",
            "--log_backtrace_at=x.go:1",
            "--cloneset-scaling-exclude-preparing-delete",
            "--disable-no-deepcopy=true",
            "--sidecarset-workers=3",
            "--statefulset-workers",
            "3",
            "--protection-log-path=/log",
            "--expectation-timeout=5m",
            "--rate-limiter-base-delay=5ms",
            "--rate-limiter-max-delay=1000s",
            "--rate-limiter-qps=10",
            "--rate-limiter-bucket-size=100",
            "--rest-config-qps=5",
            "--rest-config-burst=10",
            "--max-workers-for-pull-image=0",
            "--kubeconfig=/k",
        ])
        .unwrap();
        assert_eq!(r.compat.given().len(), 22);
        assert_eq!(r.compat.v, Some(5));
        for short in [["-v", "4"], ["-v4", ""]] {
            let args: Vec<&str> = short.iter().copied().filter(|a| !a.is_empty()).collect();
            assert_eq!(run(&args).unwrap().compat.v, Some(4), "{short:?}");
        }
    }

    #[test]
    fn a_boolean_never_takes_the_next_argument_as_in_go() {
        // pflag: `--enable-pprof false` sets true and leaves `false` as an argument, which
        // kruise-daemon ignores
        let r = run(&["--enable-pprof", "false"]).unwrap();
        assert_eq!(r.compat.enable_pprof, Some(true));
        assert_eq!(r.compat.positional, ["false"]);
        assert!(run(&["--enable-pprof=maybe"]).is_err());
        assert!(
            run(&["--no-such-flag"]).is_err(),
            "unknown flags are still refused"
        );
    }

    #[test]
    fn crictl_global_flags_come_before_the_command_and_ps_keeps_its_own_r() {
        let cli = Cli::try_parse_from([
            "kruised",
            "crictl",
            "-r",
            "unix:///run/x.sock",
            "-t",
            "3s",
            "-D",
            "ps",
            "-a",
            "-r",
            "--label",
            "a=b",
            "--label",
            "c=d",
            "-o",
            "json",
        ])
        .unwrap();
        let Command::Crictl(c) = cli.command else {
            panic!("not crictl")
        };
        assert_eq!(
            c.global.runtime.runtime_endpoint.as_deref(),
            Some("unix:///run/x.sock")
        );
        assert_eq!(c.global.runtime.timeout, Some(Duration::from_secs(3)));
        assert!(c.global.debug);
        let Some(self::crictl::args::CrictlCommand::Ps(ps)) = c.command else {
            panic!("not ps")
        };
        assert!(ps.filter.all && ps.resolve_image_path);
        assert_eq!(ps.filter.label, vec!["a=b", "c=d"]);
        assert_eq!(ps.output, self::crictl::args::ListOutput::Json);
    }

    #[test]
    fn crictl_exec_takes_the_command_with_its_own_flags() {
        let cli = Cli::try_parse_from([
            "kruised",
            "crictl",
            "exec",
            "-s",
            "--timeout",
            "5",
            "abc",
            "sh",
            "-c",
            "exit 3",
        ])
        .unwrap();
        let Command::Crictl(c) = cli.command else {
            panic!("not crictl")
        };
        let Some(self::crictl::args::CrictlCommand::Exec(e)) = c.command else {
            panic!("not exec")
        };
        assert!(e.sync);
        assert_eq!(e.timeout, 5);
        assert_eq!(e.container, "abc");
        assert_eq!(e.command, vec!["sh", "-c", "exit 3"]);
    }

    #[test]
    fn the_binary_named_crictl_parses_crictls_command_line() {
        let cli =
            Cli::parse_args_or_exit_code(os(&["/usr/local/bin/crictl", "-t", "1s", "pods", "-q"]))
                .unwrap();
        let Command::Crictl(c) = cli.command else {
            panic!("not crictl")
        };
        assert_eq!(c.global.runtime.timeout, Some(Duration::from_secs(1)));
        assert!(matches!(
            c.command,
            Some(self::crictl::args::CrictlCommand::Pods(ref p)) if p.quiet
        ));
        assert_eq!(
            Cli::parse_args_or_exit_code(os(&["crictl", "ps", "--bogus"])).unwrap_err(),
            ExitCode::FAILURE
        );
        assert_eq!(
            Cli::parse_args_or_exit_code(os(&["kruised", "crictl", "ps", "--bogus"])).unwrap_err(),
            ExitCode::FAILURE
        );
        assert_eq!(
            Cli::parse_args_or_exit_code(os(&["kruised", "bogus"])).unwrap_err(),
            ExitCode::from(2)
        );
    }

    #[test]
    fn completions_cover_the_crictl_commands() {
        let bash = completion(clap_complete::Shell::Bash);
        assert!(
            bash.contains("crictl") && bash.contains("inspectp"),
            "{bash}"
        );
        assert!(!completion(clap_complete::Shell::Fish).is_empty());
        assert!(!completion(clap_complete::Shell::Zsh).is_empty());
    }

    #[test]
    fn the_binary_named_kruise_daemon_runs_the_daemon() {
        assert_eq!(
            expand_multicall(os(&["/kruise-daemon", "--addr=:10221"])),
            os(&["/kruise-daemon", "run", "--addr=:10221"])
        );
        assert_eq!(
            expand_multicall(os(&["/usr/bin/crictl", "ps", "-a"])),
            os(&["/usr/bin/crictl", "crictl", "ps", "-a"])
        );
        assert_eq!(
            expand_multicall(os(&["kruised", "version"])),
            os(&["kruised", "version"])
        );
    }
}
