//! The commands (`run`, `version`, `hash`, `explain`, `crictl`), each in its own file with its
//! arguments beside it, and the command line that picks one. The same binary runs as
//! `kruised <command>`, as `kruise-daemon` (kruise's Helm chart runs `/kruise-daemon` with
//! kruise-daemon's flags: that is `kruised run`), and as `crictl` (`kruised crictl`).
//!
//! Under the name `kruise-daemon`, and only there, a `--flag` kruised does not know is taken out
//! of the command line and named in a warning instead of refused ([`take_unknown_flags`]):
//! kruise's chart gains daemon flags over time, and a chart newer than kruised must not
//! crash-loop the node agent. `kruised run` refuses them, so an operator's typo fails at once.

pub mod crictl;
pub mod explain;
pub mod hash;
pub mod output;
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
    /// Log format. The level is `RUST_LOG`: a level (`info`), or comma-separated target=level
    /// directives (`info,kruised=debug,kube=warn`).
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
            print!("{}", crate::k8s::crd::CRDS_YAML);
            Ok(ExitCode::SUCCESS)
        }
    }
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

/// The long flags `kruised run` knows (its own, kruise-daemon's, the global ones, `--help`), each
/// with whether it takes its value from the next argument when written without `=`.
fn run_long_flags() -> std::collections::BTreeMap<String, bool> {
    let mut cli = Cli::command();
    cli.build();
    let run = cli
        .find_subcommand("run")
        .expect("the command line has a run subcommand");
    cli.get_arguments()
        .chain(run.get_arguments())
        .flat_map(|a| {
            let takes_next = a.get_action().takes_values() && !a.is_require_equals_set();
            a.get_long_and_visible_aliases()
                .into_iter()
                .flatten()
                .chain(a.get_aliases().into_iter().flatten())
                .map(move |l| (l.to_string(), takes_next))
        })
        .collect()
}

/// Whether `name` is spelled like a flag (pflag's names: letters, digits, `-`, `_`, `.`), so
/// that garbage such as `---x` or `--=1` is still refused by the parser.
fn is_flag_name(name: &str) -> bool {
    name.chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// The arguments of a binary named `kruise-daemon` without the long flags `kruised run` does not
/// know, and those flags' names (`--name`, each once, in order; never their values, which are
/// not kruised's to log). A flag is unknown in the forms `--name=value`, `--name value` (the
/// next argument is its value unless it starts with `-`) and `--name`. Everything after `--`,
/// single-dash arguments and badly spelled names are left for the parser to judge.
pub fn take_unknown_flags(args: Vec<OsString>) -> (Vec<OsString>, Vec<String>) {
    let known = run_long_flags();
    let mut kept = Vec::with_capacity(args.len());
    let mut unknown: Vec<String> = Vec::new();
    let mut rest = args.into_iter();
    kept.extend(rest.next());
    let mut rest = rest.peekable();
    while let Some(arg) = rest.next() {
        if arg == "--" {
            kept.push(arg);
            kept.extend(rest);
            break;
        }
        let Some(body) = arg.to_str().and_then(|a| a.strip_prefix("--")) else {
            kept.push(arg);
            continue;
        };
        let (name, inline_value) = match body.split_once('=') {
            Some((name, _)) => (name, true),
            None => (body, false),
        };
        match known.get(name) {
            Some(&takes_next) => {
                let value = (takes_next && !inline_value).then(|| rest.next()).flatten();
                kept.push(arg);
                kept.extend(value);
            }
            None if is_flag_name(name) => {
                let flag = format!("--{name}");
                if !unknown.contains(&flag) {
                    unknown.push(flag);
                }
                let next_is_value = rest
                    .peek()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| !n.starts_with('-'));
                if !inline_value && next_is_value {
                    rest.next();
                }
            }
            None => kept.push(arg),
        }
    }
    (kept, unknown)
}

/// `args` ready for the parser: under the name `kruise-daemon` without the flags kruised does
/// not know ([`take_unknown_flags`], returned beside), and with the subcommand the binary's name
/// implies ([`expand_multicall`]).
fn prepare(args: Vec<OsString>) -> (Vec<OsString>, Vec<String>) {
    let (args, unknown) = if args.first().and_then(implied_command) == Some("run") {
        take_unknown_flags(args)
    } else {
        (args, Vec::new())
    };
    (expand_multicall(args), unknown)
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
    /// Parses the process's arguments, honouring the binary's other names; exits on a usage
    /// error as clap does.
    pub fn parse_env() -> Self {
        let (args, unknown) = prepare(std::env::args_os().collect());
        Cli::parse_from(args).with_unknown_flags(unknown)
    }

    /// Hands the flags taken out under the name `kruise-daemon` to `run`, which reports them.
    fn with_unknown_flags(mut self, unknown: Vec<String>) -> Self {
        if let Command::Run(run) = &mut self.command {
            run.unknown_flags = unknown;
        }
        self
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
        let (args, unknown) = prepare(args);
        let crictl = args.get(1).is_some_and(|a| a == "crictl");
        Cli::try_parse_from(args)
            .map(|cli| cli.with_unknown_flags(unknown))
            .map_err(|e| report(e, crictl))
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
            Cli::try_parse_from(["kruised", "run", "--no-such-flag"]).is_err(),
            "kruised run refuses unknown flags (kruise-daemon's name takes them out first)"
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

    // === flags unknown to kruised (field report: kruise's chart gains daemon flags over time,
    // open PR #2423 adds `--containermeta-workers` and `--containermeta-restart-workers`, and a
    // kruised that refuses unknown flags crash-loops under the next chart that passes one) ===

    /// The flags a binary named `kruise-daemon` takes out as unknown.
    fn unknown_of(args: &[&str]) -> Vec<String> {
        let mut argv = vec!["/kruise-daemon"];
        argv.extend_from_slice(args);
        take_unknown_flags(os(&argv)).1
    }

    #[test]
    fn a_newer_charts_unknown_flags_start_kruise_daemon_and_are_named_without_their_values() {
        let cli = Cli::parse_args_or_exit_code(os(&[
            "/kruise-daemon",
            "--addr=:10221",
            "--a-future-flag=secret",
            "--another-future-flag",
            "value",
            "--a-future-switch",
            "--v=4",
            "--a-future-flag=again",
        ]))
        .expect("kruise-daemon starts with flags it does not know");
        let Command::Run(r) = cli.command else {
            panic!("not run")
        };
        assert_eq!(
            r.unknown_flags,
            [
                "--a-future-flag",
                "--another-future-flag",
                "--a-future-switch"
            ],
            "each named once, in order"
        );
        assert!(r.compat.positional.is_empty(), "`value` went with its flag");
        assert_eq!(r.compat.given(), ["--v"], "known flags still parsed");
        let r = RunArgs {
            node_name: Some("n1".into()),
            runtime: RuntimeArgs {
                crictl_config: None,
                ..r.runtime.clone()
            },
            ..r
        };
        let c = r.resolve().unwrap();
        assert_eq!(c.unknown_flags.len(), 3);
        assert!(
            !format!("{:?}", c.unknown_flags).contains("secret"),
            "values are not kruised's to log"
        );
    }

    #[test]
    fn kruised_run_refuses_the_same_unknown_flag_so_an_operators_typo_fails_at_once() {
        assert_eq!(
            Cli::parse_args_or_exit_code(os(&["kruised", "run", "--a-future-flag=1"])).unwrap_err(),
            ExitCode::from(2)
        );
        let err = Cli::try_parse_from(["kruised", "run", "--adr=:10221"]).unwrap_err();
        assert_eq!(err.kind(), clap::error::ErrorKind::UnknownArgument);
        assert!(err.to_string().contains("--adr"), "{err}");
        // and every other command still refuses, whatever the binary's name
        assert!(Cli::try_parse_from(["kruised", "version", "--a-future-flag"]).is_err());
        assert!(unknown_of(&[]).is_empty());
    }

    #[test]
    fn every_kruise_daemon_flag_of_the_spec_and_of_pr_2423_is_known_and_none_is_called_unknown() {
        // spec section 6.1: kruise-daemon's flags at kruise 07169cf (main, its imports' init
        // flags, controller-runtime's --kubeconfig, klog v2.130.1) and PR #2423's two
        let spec = [
            "--addr=:10221",
            "--pprof-addr=:10222",
            "--enable-pprof=true",
            "--plugin-config-file=/kruise/CredentialProviderPlugin.yaml",
            "--plugin-bin-dir=/kruise/plugins",
            "--max-workers-for-pull-image=-1",
            "--rest-config-qps=0",
            "--rest-config-burst=0",
            "--feature-gates=PodProbeMarkerGate=true",
            "--socket-file=",
            "--expectation-timeout=5m",
            "--disable-no-deepcopy=false",
            "--protection-log-path=/log",
            "--rate-limiter-base-delay=5ms",
            "--rate-limiter-max-delay=1000s",
            "--rate-limiter-qps=10",
            "--rate-limiter-bucket-size=100",
            "--sidecarset-workers=3",
            "--statefulset-workers=3",
            "--cloneset-scaling-exclude-preparing-delete=false",
            "--kubeconfig=/k",
            "--log_dir=/tmp",
            "--log_file=/tmp/x",
            "--log_file_max_size=1800",
            "--logtostderr=true",
            "--alsologtostderr=false",
            "--v=4",
            "--add_dir_header=false",
            "--skip_headers=false",
            "--one_output=false",
            "--skip_log_headers=false",
            "--stderrthreshold=2",
            "--vmodule=a=2",
            "--log_backtrace_at=x.go:1",
            "--containermeta-workers=5",
            "--containermeta-restart-workers=10",
            "--help",
            "--version",
        ];
        assert_eq!(unknown_of(&spec), Vec::<String>::new());
    }

    #[test]
    fn pr_2423s_workers_flag_sets_container_metas_workers_and_its_restart_workers_have_no_effect() {
        let resolve = |args: &[&str]| {
            let mut r = run(args).unwrap();
            r.node_name = Some("n1".into());
            r.runtime.crictl_config = None;
            r.resolve()
        };
        let c = resolve(&[
            "--containermeta-workers=10",
            "--containermeta-restart-workers",
            "20",
        ])
        .unwrap();
        assert_eq!(c.containermeta_workers, 10);
        assert!(
            c.ignored
                .iter()
                .any(|f| f == "--containermeta-restart-workers"),
            "named in the no-effect line: {:?}",
            c.ignored
        );
        assert!(c.unknown_flags.is_empty());
        assert_eq!(
            resolve(&[]).unwrap().containermeta_workers,
            crate::config::DEFAULT_CONTAINERMETA_WORKERS
        );
        for bad in ["0", "-1", "100000"] {
            let err = resolve(&[&format!("--containermeta-workers={bad}")])
                .unwrap_err()
                .to_string();
            assert!(err.contains("--containermeta-workers"), "{bad}: {err}");
        }
        // kruised run knows it too: it is kruised's flag, not a compatibility one
        assert!(Cli::try_parse_from(["kruised", "run", "--containermeta-workers", "2"]).is_ok());
    }

    #[test]
    fn under_kruise_daemon_only_double_dash_flags_with_flag_names_are_taken_out() {
        // pflag's single dash is a shorthand: `-x` stays an error, as a garbled name does
        assert!(run(&["-x"]).is_err());
        for garbled in ["---x", "--=1", "--a b"] {
            assert!(unknown_of(&[garbled]).is_empty(), "{garbled}");
        }
        // after `--` everything is an argument (pflag's rule), collected and ignored
        let (args, unknown) = take_unknown_flags(os(&["kruise-daemon", "--", "--future"]));
        assert!(unknown.is_empty());
        assert_eq!(args, os(&["kruise-daemon", "--", "--future"]));
        // a known flag's separate value is never read as a flag of its own
        assert_eq!(
            unknown_of(&["--kubeconfig", "/k", "--future", "--v", "4"]),
            ["--future"]
        );
        // an unknown flag takes the next argument as its value only if it is no flag
        let (args, _) = take_unknown_flags(os(&["kruise-daemon", "--future", "--v=4"]));
        assert_eq!(args, os(&["kruise-daemon", "--v=4"]));
        // the name `kruised` takes nothing out
        let (args, unknown) = prepare(os(&["kruised", "run", "--future"]));
        assert!(unknown.is_empty());
        assert_eq!(args, os(&["kruised", "run", "--future"]));
    }
}
