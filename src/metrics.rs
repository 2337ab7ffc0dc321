//! The metrics registry and the process metrics every scrape of `/metrics` carries.
//!
//! The daemon creates its root registry with [`new_registry`]: unprefixed, for the families whose
//! names are a standard of their own (client-go's `rest_client_*`, registered by
//! `k8s::client::RestClientMetrics::register`), with kruised's own metrics under its
//! sub-registry [`kruised`] (prefix `kruised`), from which the components get theirs. A
//! prometheus-client prefix applies to everything registered below it, so the split is at the
//! root. The process metrics use the Prometheus-standard unprefixed names
//! (`process_resident_memory_bytes`, …) that kruise-daemon's Go process collector exports, so
//! existing dashboards keep working; [`exposition`] adds them.

use std::fs;
use std::path::{Path, PathBuf};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, text};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::registry::Registry;

/// Prefix of every kruised metric except the standard `process_*` ones.
pub const PREFIX: &str = "kruised";

/// Clock ticks per second for `/proc/<pid>/stat` times. `USER_HZ` is part of the kernel ABI and is
/// 100 on every architecture we ship for; Go's procfs (which kruise-daemon uses) hardcodes it too.
const USER_HZ: f64 = 100.0;

/// Label set of `kruised_build_info`: one series per process, so bounded.
type BuildLabels = [(&'static str, &'static str); 2];

/// Creates the daemon's root registry: unprefixed, with `kruised_build_info` registered in its
/// [`kruised`] sub-registry. Register kruised's own metrics through [`kruised`], never on the
/// root itself: only families with names of a standard of their own belong there.
pub fn new_registry() -> Registry {
    let mut root = Registry::default();
    let build_info = Family::<BuildLabels, Gauge>::default();
    build_info
        .get_or_create(&[
            ("version", crate::build_info::VERSION),
            ("commit", crate::build_info::COMMIT),
        ])
        .set(1);
    kruised(&mut root).register(
        "build_info",
        "A metric with a constant '1' value labeled by the version and commit kruised was built from",
        build_info,
    );
    root
}

/// A sub-registry of `root` with prefix `kruised`, for kruised's own metrics (each call adds
/// one; they encode one after the other, so components may each take their own).
pub fn kruised(root: &mut Registry) -> &mut Registry {
    root.sub_registry_with_prefix(PREFIX)
}

/// Registers a [`ProcessCollector`] for this process on `registry`.
///
/// The metric names are taken relative to `registry`'s prefix. [`exposition`], which the admin
/// server serves, already calls this on an unprefixed registry of its own; call it only when you
/// build a different exposition, or the `process_*` series appear twice.
pub fn register_process_metrics(registry: &mut Registry) {
    registry.register_collector(Box::new(ProcessCollector::new()));
}

/// The `/metrics` body: `registry`, then this process's `process_*` metrics (unprefixed), then the
/// OpenMetrics `# EOF` marker.
pub fn exposition(registry: &Registry) -> Result<String, std::fmt::Error> {
    let mut out = String::new();
    text::encode_registry(&mut out, registry)?;
    let mut process = Registry::default();
    register_process_metrics(&mut process);
    text::encode_registry(&mut out, &process)?;
    text::encode_eof(&mut out)?;
    Ok(out)
}

// === impl ProcessCollector ===

/// Reads the process metrics from procfs on every scrape (Linux only; values that cannot be read are
/// left out rather than reported as zero).
///
/// | metric | type | source |
/// |---|---|---|
/// | `process_cpu_seconds_total` | counter | `stat` utime + stime |
/// | `process_open_fds` | gauge | entries of `fd/` |
/// | `process_max_fds` | gauge | `limits`, soft "Max open files" |
/// | `process_virtual_memory_bytes` | gauge | `stat` vsize |
/// | `process_resident_memory_bytes` | gauge | `status` VmRSS |
/// | `process_start_time_seconds` | gauge | `stat` starttime + `/proc/stat` btime |
/// | `process_threads` | gauge | `stat` num_threads |
#[derive(Debug, Clone)]
pub struct ProcessCollector {
    /// `/proc/self` (or a fixture directory in tests).
    proc_self: PathBuf,
    /// `/proc/stat`, for the boot time.
    proc_stat: PathBuf,
}

impl Default for ProcessCollector {
    fn default() -> Self {
        Self::new()
    }
}

impl ProcessCollector {
    /// A collector for the current process, reading `/proc`.
    pub fn new() -> Self {
        Self::with_proc_root("/proc")
    }

    /// A collector reading `<root>/self/…` and `<root>/stat`, so tests can use a fixture tree.
    pub fn with_proc_root(root: impl AsRef<Path>) -> Self {
        let root = root.as_ref();
        Self {
            proc_self: root.join("self"),
            proc_stat: root.join("stat"),
        }
    }

    /// Reads everything that is readable now.
    pub fn sample(&self) -> ProcessSample {
        let read = |path: PathBuf| fs::read_to_string(path).ok();
        let stat = read(self.proc_self.join("stat")).and_then(|s| parse_stat(&s));
        let boot_time = read(self.proc_stat.clone()).and_then(|s| parse_boot_time(&s));
        ProcessSample {
            cpu_seconds: stat.map(|s| s.utime.saturating_add(s.stime) as f64 / USER_HZ),
            open_fds: fs::read_dir(self.proc_self.join("fd"))
                .ok()
                .map(|dir| dir.count() as u64),
            max_fds: read(self.proc_self.join("limits")).and_then(|s| parse_max_open_files(&s)),
            virtual_memory_bytes: stat.map(|s| s.vsize),
            resident_memory_bytes: read(self.proc_self.join("status"))
                .and_then(|s| parse_status_kib(&s, "VmRSS:"))
                .map(|kib| kib.saturating_mul(1024)),
            start_time_seconds: stat
                .zip(boot_time)
                .map(|(s, boot)| boot as f64 + s.starttime as f64 / USER_HZ),
            threads: stat.map(|s| s.num_threads),
        }
    }
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = self.sample();
        if let Some(v) = s.cpu_seconds {
            encode(
                &mut encoder,
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds.",
                ConstCounter::new(v),
            )?;
        }
        // Counts and sizes are exported as integers (`process_threads 7`, not `7.0`).
        let int_gauges = [
            (
                "process_open_fds",
                "Number of open file descriptors.",
                s.open_fds,
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors.",
                s.max_fds,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes.",
                s.virtual_memory_bytes,
            ),
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                s.resident_memory_bytes,
            ),
            (
                "process_threads",
                "Number of OS threads in the process.",
                s.threads,
            ),
        ];
        for (name, help, value) in int_gauges {
            if let Some(v) = value.and_then(|v| i64::try_from(v).ok()) {
                encode(&mut encoder, name, help, ConstGauge::new(v))?;
            }
        }
        if let Some(v) = s.start_time_seconds {
            encode(
                &mut encoder,
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
                ConstGauge::new(v),
            )?;
        }
        Ok(())
    }
}

fn encode(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    metric: impl EncodeMetric,
) -> Result<(), std::fmt::Error> {
    let metric_encoder = encoder.encode_descriptor(name, help, None, metric.metric_type())?;
    metric.encode(metric_encoder)
}

/// One reading of the process metrics; `None` where procfs did not say.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ProcessSample {
    /// User plus system CPU time.
    pub cpu_seconds: Option<f64>,
    /// Open file descriptors.
    pub open_fds: Option<u64>,
    /// Soft limit on open file descriptors (`None` also when unlimited).
    pub max_fds: Option<u64>,
    /// Virtual memory size.
    pub virtual_memory_bytes: Option<u64>,
    /// Resident set size.
    pub resident_memory_bytes: Option<u64>,
    /// Process start, seconds since the Unix epoch.
    pub start_time_seconds: Option<f64>,
    /// OS threads.
    pub threads: Option<u64>,
}

/// The fields of `/proc/<pid>/stat` we export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stat {
    utime: u64,
    stime: u64,
    num_threads: u64,
    starttime: u64,
    vsize: u64,
}

/// Parses `/proc/<pid>/stat` (proc(5)). `comm` (field 2) is in parentheses and may itself contain
/// spaces and parentheses, so fields are counted from the last `)`.
fn parse_stat(s: &str) -> Option<Stat> {
    let (_, rest) = s.rsplit_once(')')?;
    // `rest` starts at field 3 (state); field n is at index n - 3.
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    Some(Stat {
        utime: field(14)?,
        stime: field(15)?,
        num_threads: field(20)?,
        starttime: field(22)?,
        vsize: field(23)?,
    })
}

/// Reads a `kB` line such as `VmRSS: 12345 kB` from `/proc/<pid>/status`.
fn parse_status_kib(s: &str, key: &str) -> Option<u64> {
    s.lines()
        .find_map(|line| line.strip_prefix(key))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Reads `btime` (boot time, seconds since the epoch) from `/proc/stat`.
fn parse_boot_time(s: &str) -> Option<u64> {
    s.lines()
        .find_map(|line| line.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()
}

/// Reads the soft limit of `Max open files` from `/proc/<pid>/limits`; `unlimited` gives `None`.
fn parse_max_open_files(s: &str) -> Option<u64> {
    s.lines()
        .find_map(|line| line.strip_prefix("Max open files"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    use prometheus_client::encoding::text::encode as encode_text;

    fn exposition(registry: &Registry) -> String {
        let mut out = String::new();
        encode_text(&mut out, registry).expect("encoding to a String cannot fail");
        out
    }

    /// The value of the unlabelled sample `name` in an exposition.
    fn sample_value(text: &str, name: &str) -> Option<f64> {
        text.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))?
            .parse()
            .ok()
    }

    const STAT: &str = "4242 (kruised (a) b) S 1 4242 4242 0 -1 4194560 2016 0 0 0 \
                        250 75 0 0 20 0 7 0 123400 26251264 3300 18446744073709551615 \
                        1 1 0 0 0 0 0 4096 1260 0 0 0 17 1 0 0 0 0 0\n";

    #[test]
    fn stat_fields_are_counted_from_the_last_parenthesis() {
        assert_eq!(
            parse_stat(STAT),
            Some(Stat {
                utime: 250,
                stime: 75,
                num_threads: 7,
                starttime: 123_400,
                vsize: 26_251_264,
            })
        );
    }

    #[test]
    fn truncated_stat_is_rejected_instead_of_misread() {
        assert_eq!(parse_stat("4242 (kruised) S 1 4242"), None);
        assert_eq!(parse_stat(""), None);
    }

    #[test]
    fn status_limits_and_boot_time_lines_are_found_by_key() {
        let status = "Name:\tkruised\nVmSize:\t  25636 kB\nVmRSS:\t    3300 kB\nThreads:\t7\n";
        assert_eq!(parse_status_kib(status, "VmRSS:"), Some(3300));
        assert_eq!(parse_status_kib(status, "VmSwap:"), None);

        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max open files            1048576              1048576              files     \n";
        assert_eq!(parse_max_open_files(limits), Some(1_048_576));
        let unlimited =
            "Max open files            unlimited            unlimited            files     \n";
        assert_eq!(parse_max_open_files(unlimited), None);

        assert_eq!(
            parse_boot_time("cpu  1 2 3\nbtime 1700000000\nprocesses 9\n"),
            Some(1_700_000_000)
        );
    }

    #[test]
    fn a_fixture_proc_tree_yields_every_process_metric() {
        let root = tempfile::tempdir().expect("tempdir");
        let me = root.path().join("self");
        fs::create_dir_all(me.join("fd")).expect("mkdir fd");
        for fd in ["0", "1", "2", "7"] {
            fs::write(me.join("fd").join(fd), "").expect("write fd");
        }
        fs::write(me.join("stat"), STAT).expect("write stat");
        fs::write(me.join("status"), "VmRSS:\t    3300 kB\n").expect("write status");
        fs::write(
            me.join("limits"),
            "Max open files            1024                 4096                 files\n",
        )
        .expect("write limits");
        fs::write(root.path().join("stat"), "btime 1700000000\n").expect("write /proc/stat");

        let sample = ProcessCollector::with_proc_root(root.path()).sample();
        assert_eq!(
            sample,
            ProcessSample {
                cpu_seconds: Some(3.25),
                open_fds: Some(4),
                max_fds: Some(1024),
                virtual_memory_bytes: Some(26_251_264),
                resident_memory_bytes: Some(3300 * 1024),
                start_time_seconds: Some(1_700_001_234.0),
                threads: Some(7),
            }
        );
    }

    #[test]
    fn a_missing_proc_tree_exports_nothing_and_does_not_fail() {
        let root = tempfile::tempdir().expect("tempdir");
        let collector = ProcessCollector::with_proc_root(root.path().join("absent"));
        assert_eq!(collector.sample(), ProcessSample::default());

        let mut registry = Registry::default();
        registry.register_collector(Box::new(collector));
        assert_eq!(exposition(&registry), "# EOF\n");
    }

    #[test]
    fn registry_exports_build_info_with_the_kruised_prefix() {
        let text = exposition(&new_registry());
        let expected = format!(
            "kruised_build_info{{version=\"{}\",commit=\"{}\"}} 1\n",
            crate::build_info::VERSION,
            crate::build_info::COMMIT
        );
        assert!(text.contains(&expected), "{text}");
        assert!(text.contains("# TYPE kruised_build_info gauge\n"), "{text}");
    }

    /// The root stays unprefixed for client-go's names while everything kruised registers
    /// through [`kruised`] keeps `kruised_`: a component's sub-registry as `controller::start`
    /// takes it (`containermeta`), and a client-go family on the root (the API client's own,
    /// `k8s::client::RestClientMetrics`, are checked on `/metrics` by the admin tests).
    #[test]
    fn the_root_is_unprefixed_and_kruised_metrics_keep_their_prefix() {
        let mut root = new_registry();
        let component = kruised(&mut root).sub_registry_with_prefix("containermeta");
        component.register("restarts", "Restarts", Gauge::<i64>::default());
        let requests = prometheus_client::metrics::counter::Counter::<u64>::default();
        root.register("rest_client_requests", "Requests", requests.clone());
        requests.inc();
        let text = exposition(&root);
        assert!(
            text.contains("\nkruised_containermeta_restarts 0\n"),
            "{text}"
        );
        assert!(text.contains("kruised_build_info{"), "{text}");
        assert!(text.contains("\nrest_client_requests_total 1\n"), "{text}");
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let name = line.split(['{', ' ']).next().unwrap_or_default();
            assert!(
                name.starts_with("kruised_") || name.starts_with("rest_client_"),
                "{name}: only kruised_* and client-go's rest_client_* are served"
            );
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn process_metrics_of_this_process_are_nonzero_and_unprefixed() {
        let mut registry = Registry::default();
        register_process_metrics(&mut registry);
        let text = exposition(&registry);

        for name in [
            "process_resident_memory_bytes",
            "process_virtual_memory_bytes",
            "process_open_fds",
            "process_max_fds",
            "process_start_time_seconds",
            "process_threads",
        ] {
            let value = sample_value(&text, name).unwrap_or_else(|| panic!("{name} in {text}"));
            assert!(value > 0.0, "{name} = {value}");
        }
        assert!(
            sample_value(&text, "process_cpu_seconds_total").is_some(),
            "{text}"
        );
        assert!(
            text.contains("# TYPE process_cpu_seconds counter\n"),
            "{text}"
        );
    }
}
