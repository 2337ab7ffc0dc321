//! What the benchmarks that need binaries no registry ships decide where those are missing (CI
//! included): `benches/unready_cluster.rs` runs on the real cluster with kruise-manager's
//! pre-download and kruise-daemon, and otherwise says in one line why not (`tests/run.sh` runs
//! that line with the unit tests).

use std::collections::HashMap;

use super::support::unready::{PRE_DOWNLOAD_GATE, cluster_provided};

/// The kruise-manager gates `tests/run.sh` starts the cluster layer's manager with.
fn run_sh_gates() -> String {
    let run = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/run.sh"))
        .expect("tests/run.sh");
    let line = run
        .lines()
        .find_map(|l| l.trim().strip_prefix("local gates="))
        .expect("tests/run.sh's kruise-manager gates (`local gates=...`)");
    line.to_string()
}

type Vars = Vec<(&'static str, String)>;

fn provided(vars: &Vars) -> Result<std::path::PathBuf, String> {
    let env: HashMap<&str, &String> = vars.iter().map(|(k, v)| (*k, v)).collect();
    cluster_provided(|name| env.get(name).map(|v| v.to_string()))
}

/// Everything the cluster mode needs, as `tests/run.sh` exports it to its cluster layer.
fn everything(gates: &str) -> Vars {
    vec![
        ("KRUISED_KUBE_LAB", "/tmp/kube".into()),
        ("KRUISED_KRUISE_MANAGER", "127.0.0.1:19001".into()),
        ("KRUISED_KRUISE_MANAGER_GATES", gates.into()),
        ("KRUISED_KRUISE_DAEMON", "/opt/kruise/kruise-daemon".into()),
    ]
}

fn without(vars: &Vars, name: &str) -> Result<std::path::PathBuf, String> {
    let kept: Vars = vars.iter().filter(|(k, _)| *k != name).cloned().collect();
    provided(&kept)
}

#[test]
fn the_cluster_unready_bench_runs_with_kruise_daemon_where_run_sh_provides_everything() {
    let gates = run_sh_gates();
    assert!(
        gates.split(',').any(|g| g == PRE_DOWNLOAD_GATE),
        "tests/run.sh starts kruise-manager without {PRE_DOWNLOAD_GATE}: {gates}"
    );
    let vars = everything(&gates);
    assert_eq!(
        provided(&vars),
        Ok("/opt/kruise/kruise-daemon".into()),
        "with {vars:?}"
    );
}

#[test]
fn the_cluster_unready_bench_skips_naming_what_is_missing_and_where_it_comes_from() {
    let vars = everything(&run_sh_gates());
    for (name, source) in [
        ("KRUISED_KUBE_LAB", "KRUISED_KUBE_ASSETS"),
        ("KRUISED_KRUISE_MANAGER", "KRUISED_KRUISE_ASSETS"),
        ("KRUISED_KRUISE_MANAGER_GATES", PRE_DOWNLOAD_GATE),
        ("KRUISED_KRUISE_DAEMON", "KRUISED_KRUISE_ASSETS"),
    ] {
        let why = without(&vars, name).expect_err(name);
        assert!(
            why.contains(name) && why.contains(source) && !why.contains('\n'),
            "without {name}: {why}"
        );
    }
    // CI: nothing at all; an empty variable is no variable
    let why = provided(&vec![("KRUISED_KUBE_LAB", String::new())]).expect_err("nothing provided");
    assert!(why.contains("no running cluster"), "{why}");
}

#[test]
fn the_cluster_unready_bench_skips_where_the_manager_runs_with_the_pre_download_gate_off() {
    let gates = run_sh_gates().replace(PRE_DOWNLOAD_GATE, "PreDownloadImageForInPlaceUpdate=false");
    let why = provided(&everything(&gates)).expect_err("the gate off");
    assert!(
        why.contains("runs without PreDownloadImageForInPlaceUpdate=true"),
        "{why}"
    );
}
