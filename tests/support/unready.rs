//! The unready-window benchmark's parts that both of its modes share (issue 41): the cases,
//! the report with the goals, the relay's registry host for containerd, and what the
//! cluster mode needs before it runs. `benches/unready.rs` runs the cases on a lab's runtime
//! with the doubles; `benches/unready_cluster.rs` runs them on the real cluster of the test
//! layer, with kruised and then with kruise-daemon as the node daemon.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::Lab;
use super::daemon::Daemon;
use super::restarts::percentile;

/// One case: the grace period, the preStop hook, the image on the node before the update,
/// kruised's in-place pull on.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub name: &'static str,
    pub grace: u32,
    pub pre_stop: bool,
    pub present: bool,
    pub feature: bool,
}

const fn case(
    name: &'static str,
    grace: u32,
    pre_stop: bool,
    present: bool,
    feature: bool,
) -> Case {
    Case {
        name,
        grace,
        pre_stop,
        present,
        feature,
    }
}

/// The image already on the node (the baseline, without and with a 15 s grace period), then
/// each of no grace period, `gracePeriodSeconds: 15`, and no grace with a 5 s preStop hook,
/// without the in-place pull and with it.
pub const CASES: [Case; 8] = [
    case("present", 0, false, true, true),
    case("present-grace15", 15, false, true, true),
    case("nograce-off", 0, false, false, false),
    case("nograce-on", 0, false, false, true),
    case("grace15-off", 15, false, false, false),
    case("grace15-on", 15, false, false, true),
    case("prestop5-off", 0, true, false, false),
    case("prestop5-on", 0, true, false, true),
];

/// The cases named in `only` (comma-separated), or every case.
pub fn cases(only: Option<&str>) -> Vec<Case> {
    CASES
        .into_iter()
        .filter(|c| only.is_none_or(|o| o.split(',').any(|n| n.trim() == c.name)))
        .collect()
}

/// One run's figures: the unready window, and the bytes the registry sent meanwhile.
pub struct Run {
    pub window: Duration,
    pub bytes: u64,
}

/// A mode of the benchmark: how it starts the node daemon, for the cases without and with the
/// in-place pull, and how it makes one run of a case.
#[allow(
    async_fn_in_trait,
    reason = "the benchmarks await it on their own runtime, never spawn it"
)]
pub trait Mode {
    async fn daemon(&mut self, feature: bool) -> Daemon;
    async fn one(&mut self, c: &Case, round: usize) -> Run;
}

/// Runs the cases `rounds` times, one run of each a round, the rounds one after the other;
/// in each round the daemon starts for the cases without the in-place pull, then again for
/// those with it. Says each run's figures on stderr as it ends; returns the runs of each case,
/// in the order of `cases`.
pub async fn rounds(mode: &mut impl Mode, cases: &[Case], rounds: usize) -> Vec<Vec<Run>> {
    let mut results: Vec<Vec<Run>> = cases.iter().map(|_| Vec::new()).collect();
    for round in 0..rounds {
        for feature in [false, true] {
            if !cases.iter().any(|c| c.feature == feature) {
                continue;
            }
            let mut d = mode.daemon(feature).await;
            for (i, c) in cases
                .iter()
                .enumerate()
                .filter(|(_, c)| c.feature == feature)
            {
                let r = mode.one(c, round).await;
                eprintln!(
                    "round {round} {:>16}: {:6.2} s, {:5.1} MiB",
                    c.name,
                    r.window.as_secs_f64(),
                    r.bytes as f64 / 1048576.0
                );
                results[i].push(r);
            }
            d.terminate();
            d.wait_exit(Duration::from_secs(30)).await;
        }
    }
    results
}

/// The load average (1, 5, 15 minutes), for a report.
pub fn loadavg() -> String {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    text.split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The table of the runs of each case (p50, p99, MiB through the relay), then the goals of
/// issue 41 where both cases of a goal ran. `pull` heads the column of the in-place pull:
/// `None` for kruised's own (`on`, `off` as the case says), or the name of what pulls early
/// instead (kruise-manager's pre-download, for kruise-daemon).
pub fn report(cases: &[Case], results: &[Vec<Run>], pull: Option<&str>) {
    println!(
        "| case | grace | preStop | image | in-place pull | p50 (s) | p99 (s) | MiB pulled (mean) | runs |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let mut p = BTreeMap::new();
    for (c, runs) in cases.iter().zip(results) {
        let mut w: Vec<Duration> = runs.iter().map(|r| r.window).collect();
        let (p50, p99) = (percentile(&mut w, 0.5), percentile(&mut w, 0.99));
        let mib = runs.iter().map(|r| r.bytes).sum::<u64>() as f64 / runs.len().max(1) as f64;
        let on = if c.feature { "on" } else { "off" };
        println!(
            "| {} | {} s | {} | {} | {} | {:.2} | {:.2} | {:.1} | {} |",
            c.name,
            c.grace,
            if c.pre_stop { "5 s" } else { "none" },
            if c.present { "present" } else { "pulled" },
            pull.unwrap_or(on),
            p50.as_secs_f64(),
            p99.as_secs_f64(),
            mib / 1048576.0,
            runs.len()
        );
        p.insert(c.name, (p50.as_secs_f64(), p99.as_secs_f64()));
    }
    let goal = |a: &str, b: &str, f: &dyn Fn(f64, f64) -> bool, what: &str| {
        if let (Some(x), Some(y)) = (p.get(a), p.get(b)) {
            let ok = |(x, y)| if f(x, y) { "met" } else { "MISSED" };
            println!(
                "goal {what}: p50 {:.2} vs {:.2} {}; p99 {:.2} vs {:.2} {}",
                x.0,
                y.0,
                ok((x.0, y.0)),
                x.1,
                y.1,
                ok((x.1, y.1))
            );
        }
    };
    goal(
        "grace15-on",
        "present-grace15",
        &|x, y| x <= y * 1.10,
        "grace 15 s with the pull <= present (same grace) + 10 %",
    );
    goal(
        "prestop5-on",
        "prestop5-off",
        &|x, y| y - x >= 4.5,
        "preStop 5 s with the pull >= 4.5 s shorter than without",
    );
}

/// The relay's address as containerd's registry host: a `hosts.toml` under the lab's
/// `certs.d` (containerd's `config_path`), plain HTTP; removed when dropped.
pub struct HostsToml(PathBuf);

impl HostsToml {
    pub fn write(lab: &Lab, addr: SocketAddr) -> HostsToml {
        let dir = lab.dir.join("certs.d").join(addr.to_string());
        std::fs::create_dir_all(&dir).expect("create the relay's certs.d directory");
        let text = format!(
            "server = \"http://{addr}\"\n\n[host.\"http://{addr}\"]\n  capabilities = [\"pull\", \"resolve\"]\n  skip_verify = true\n"
        );
        std::fs::write(dir.join("hosts.toml"), text).expect("write the relay's hosts.toml");
        HostsToml(dir)
    }
}

impl Drop for HostsToml {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// kruise-manager's feature gate that pre-downloads a CloneSet's new images before its in-place
/// update (an ImagePullJob, pulled through the nodes' NodeImages).
pub const PRE_DOWNLOAD_GATE: &str = "PreDownloadImageForInPlaceUpdate=true";

/// What the cluster mode runs against, as `tests/run.sh` names it: the running cluster
/// (`KRUISED_KUBE_LAB`, its cluster layer's), kruise-manager beside it
/// (`KRUISED_KRUISE_MANAGER`) with [`PRE_DOWNLOAD_GATE`] among its gates
/// (`KRUISED_KRUISE_MANAGER_GATES`), and the kruise-daemon binary (`KRUISED_KRUISE_DAEMON`).
/// Returns kruise-daemon's path, or why the mode cannot run: the first of them missing, with
/// where it comes from. `env` reads a variable (empty counts as unset).
pub fn cluster_provided(env: impl Fn(&str) -> Option<String>) -> Result<PathBuf, String> {
    let env = |name: &str| env(name).filter(|v| !v.is_empty());
    if env("KRUISED_KUBE_LAB").is_none() {
        return Err(
            "no running cluster (KRUISED_KUBE_LAB unset: tests/run.sh starts one \
                    where KRUISED_KUBE_ASSETS names the Kubernetes binaries, and exports it to \
                    its cluster layer)"
                .into(),
        );
    }
    if env("KRUISED_KRUISE_MANAGER").is_none() {
        return Err(
            "no kruise-manager beside the cluster (KRUISED_KRUISE_MANAGER unset: \
                    kruise-manager in KRUISED_KRUISE_ASSETS)"
                .into(),
        );
    }
    let gates = env("KRUISED_KRUISE_MANAGER_GATES").unwrap_or_default();
    if !gates.split(',').any(|g| g.trim() == PRE_DOWNLOAD_GATE) {
        return Err(format!(
            "kruise-manager runs without {PRE_DOWNLOAD_GATE} \
             (KRUISED_KRUISE_MANAGER_GATES={gates:?}: tests/run.sh turns it on)"
        ));
    }
    env("KRUISED_KRUISE_DAEMON")
        .map(PathBuf::from)
        .ok_or_else(|| {
            "no kruise-daemon (KRUISED_KRUISE_DAEMON unset: kruise-daemon in KRUISED_KRUISE_ASSETS)"
                .into()
        })
}
