//! Logging: `tracing` to stderr, as text or JSON, filtered by `RUST_LOG` (default `info`).
//!
//! `RUST_LOG` is a level (`info`), target prefixes with levels (`kruised=debug,kube=warn`), or
//! both (`warn,kruised::controller=debug`). tracing-subscriber's `EnvFilter` syntax beyond that
//! (span and field filters, regular expressions) is not accepted: a filter this parser cannot read
//! stops the command with a message naming it, rather than being ignored.

use std::io::IsTerminal;

use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// What `RUST_LOG` accepts, for messages and help.
pub const LOG_FILTER_SYNTAX: &str = "a level (error, warn, info, debug, trace, off), or comma-separated target=level \
     directives with an optional default level, e.g. `info,kruised=debug,kube=warn`";

/// Output format of the log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

/// `RUST_LOG` could not be read as a log filter.
#[derive(Debug, thiserror::Error)]
#[error(
    "RUST_LOG={filter:?} is not a log filter kruised reads ({reason}); use {LOG_FILTER_SYNTAX}"
)]
pub struct LogFilterError {
    filter: String,
    reason: String,
}

/// Parses a log filter: directives separated by commas, blanks around them and empty ones
/// ignored. An empty filter is `None` (use the default).
pub fn parse_filter(filter: &str) -> Result<Option<Targets>, LogFilterError> {
    let directives: Vec<&str> = filter
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .collect();
    if directives.is_empty() {
        return Ok(None);
    }
    let err = |reason: String| LogFilterError {
        filter: filter.to_owned(),
        reason,
    };
    // span and field filters parse, but `Targets` would then match only spans with those
    // fields: refused, so that a filter never silently means less than it says
    if let Some(d) = directives.iter().find(|d| d.contains('[')) {
        return Err(err(format!(
            "span and field filters such as {d:?} are not supported"
        )));
    }
    directives
        .join(",")
        .parse::<Targets>()
        .map(Some)
        .map_err(|e| err(e.to_string()))
}

/// Installs the global subscriber. Call once, from `main`. `default_level` applies when
/// `RUST_LOG` is not set (or empty); a `RUST_LOG` that does not parse is an error.
pub fn init(format: LogFormat, default_level: &str) -> Result<(), LogFilterError> {
    let from_env = match std::env::var("RUST_LOG") {
        Ok(v) => parse_filter(&v)?,
        Err(_) => None,
    };
    let filter = match from_env {
        Some(f) => f,
        None => parse_filter(default_level)?.unwrap_or_default(),
    };
    // colours only on a terminal: `kubectl logs` and journald show the escape codes verbatim
    let builder = tracing_subscriber::fmt()
        .with_max_level(tracing::level_filters::LevelFilter::TRACE)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    // a second init (tests) is harmless: the first subscriber stays
    let _ = match format {
        LogFormat::Text => builder.finish().with(filter).try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .finish()
            .with(filter)
            .try_init(),
    };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing::Level;

    fn enabled(filter: &Targets, target: &str, level: Level) -> bool {
        filter.would_enable(target, &level)
    }

    #[test]
    fn a_bare_level_applies_to_every_target() {
        let f = parse_filter("info").expect("parses").expect("a filter");
        assert!(enabled(&f, "kruised::daemon", Level::INFO));
        assert!(enabled(&f, "kube_runtime", Level::WARN));
        assert!(!enabled(&f, "kruised::daemon", Level::DEBUG));
    }

    #[test]
    fn target_directives_override_the_default_level_by_prefix() {
        let f = parse_filter("info, kruised=debug,kube=warn,")
            .expect("parses")
            .expect("a filter");
        assert!(enabled(&f, "kruised::controller::recreate", Level::DEBUG));
        assert!(!enabled(&f, "kruised::controller::recreate", Level::TRACE));
        // a prefix of the target, as in EnvFilter: `kube` covers kube_client and kube_runtime
        assert!(!enabled(&f, "kube_client", Level::INFO));
        assert!(enabled(&f, "kube_runtime", Level::WARN));
        assert!(enabled(&f, "hyper", Level::INFO));
        assert!(!enabled(&f, "hyper", Level::DEBUG));
    }

    #[test]
    fn the_default_levels_main_starts_with_all_parse() {
        for level in ["info", "error", "warn,kruised=debug"] {
            assert!(
                parse_filter(level).expect(level).is_some(),
                "{level} is a filter"
            );
        }
    }

    #[test]
    fn an_empty_filter_means_the_default() {
        assert!(parse_filter("").expect("parses").is_none());
        assert!(parse_filter(" , ").expect("parses").is_none());
    }

    #[test]
    fn a_filter_that_does_not_parse_is_an_error_naming_it_and_the_syntax() {
        for bad in [
            "kruised=loud",
            "a=b=c",
            "kruised[{pod}]=debug",
            "kruised[reconcile]=debug",
        ] {
            let msg = parse_filter(bad).expect_err(bad).to_string();
            assert!(msg.contains(&format!("{bad:?}")), "{msg}");
            assert!(msg.contains("kruised=debug"), "{msg}");
        }
    }
}
