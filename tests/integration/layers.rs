//! The module layering of `src/`: modules import only downward
//! (`main` -> `lib` -> commands -> controllers -> `k8s` / `cri` / `hash`), so there is no import
//! circle and a lower module never depends on a higher one. Each top-level module, and each
//! command under `cmd/`, lists what it may use; a new edge must be added here on purpose.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// What each top-level module of the library may import (`crate::<module>`).
const ALLOWED: &[(&str, &[&str])] = &[
    // leaves
    ("addr", &[]),
    ("build_info", &[]),
    ("sync", &[]),
    ("cri", &["sync"]),
    ("gojson", &[]),
    ("hash", &["gojson"]),
    ("health", &["sync"]),
    ("sdnotify", &[]),
    ("telemetry", &[]),
    // shared services
    ("metrics", &["build_info"]),
    ("k8s", &["gojson", "hash", "health", "sync"]),
    ("config", &["cri"]),
    ("admin", &["health", "metrics"]),
    // capabilities
    (
        "controller",
        &["config", "cri", "hash", "health", "k8s", "sync"],
    ),
    // the daemon
    (
        "daemon",
        &[
            "admin",
            "build_info",
            "config",
            "controller",
            "cri",
            "health",
            "k8s",
            "metrics",
            "sdnotify",
        ],
    ),
    // the commands: `cmd` picks one; each under `cmd/` is a unit of its own
    (
        "cmd",
        &[
            "cmd::crictl",
            "cmd::explain",
            "cmd::hash",
            "cmd::run",
            "cmd::version",
            "config",
            "k8s",
            "telemetry",
        ],
    ),
    ("cmd::run", &["addr", "config", "daemon"]),
    // which runtime is the kubelet's: its Node says (k8s::node, through k8s::client)
    ("cmd::version", &["build_info", "config", "cri", "k8s"]),
    (
        "cmd::explain",
        &["config", "controller", "cri", "hash", "k8s"],
    ),
    ("cmd::hash", &["hash"]),
    (
        "cmd::crictl",
        &[
            "build_info",
            "config",
            "controller",
            "cri",
            "gojson",
            "hash",
            "k8s",
        ],
    ),
];

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The leading identifier of `text`.
fn ident(text: &str) -> String {
    text.chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect()
}

/// The units `text` names as `crate::<name>`, or `crate::cmd::<command>` for a command.
fn crate_refs(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("crate::") {
        let tail = &rest[i + "crate::".len()..];
        let name = ident(tail);
        let command = tail
            .strip_prefix("cmd::")
            .map(ident)
            .filter(|c| c.starts_with(|c: char| c.is_ascii_lowercase()));
        match command {
            Some(c) => out.insert(format!("cmd::{c}")),
            None if !name.is_empty() => out.insert(name),
            None => false,
        };
        rest = tail;
    }
    out
}

/// The unit a file of `src/` belongs to: its top-level module, or `cmd::<command>` under
/// `cmd/`.
fn unit_of(rel: &Path) -> String {
    let mut parts = rel
        .components()
        .filter_map(|c| c.as_os_str().to_str())
        .map(|s| s.trim_end_matches(".rs"));
    let top = parts.next().expect("module name").to_string();
    match parts.next() {
        Some(command) if top == "cmd" && command != "mod" => format!("cmd::{command}"),
        _ => top,
    }
}

#[test]
fn a_command_is_its_own_unit_and_other_paths_name_their_top_module() {
    let refs = crate_refs(
        "use crate::cmd::crictl::args; crate::cmd::OutputFormat; use crate::config::{A, B};",
    );
    assert_eq!(
        refs.into_iter().collect::<Vec<_>>(),
        ["cmd", "cmd::crictl", "config"]
    );
    assert_eq!(unit_of(Path::new("cmd/crictl/args.rs")), "cmd::crictl");
    assert_eq!(unit_of(Path::new("cmd/explain.rs")), "cmd::explain");
    assert_eq!(unit_of(Path::new("cmd/mod.rs")), "cmd");
    assert_eq!(
        unit_of(Path::new("controller/recreate/mod.rs")),
        "controller"
    );
}

#[test]
fn modules_import_only_downward() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let allowed: BTreeMap<&str, BTreeSet<&str>> = ALLOWED
        .iter()
        .map(|(m, deps)| (*m, deps.iter().copied().collect()))
        .collect();
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut violations = Vec::new();
    for file in files {
        let rel = file.strip_prefix(&src).expect("under src");
        let top = unit_of(rel);
        if top == "lib" || top == "main" {
            continue;
        }
        let Some(may) = allowed.get(top.as_str()) else {
            violations.push(format!(
                "{}: module {top} is not in the layer table",
                rel.display()
            ));
            continue;
        };
        let text = std::fs::read_to_string(&file).expect("read");
        for dep in crate_refs(&text) {
            if dep != top && !may.contains(dep.as_str()) && allowed.contains_key(dep.as_str()) {
                violations.push(format!("{}: {top} imports {dep}", rel.display()));
            }
        }
    }
    assert!(
        violations.is_empty(),
        "imports against the layering:\n{}",
        violations.join("\n")
    );
}

#[test]
fn the_layer_table_has_no_circle() {
    let graph: BTreeMap<&str, &[&str]> = ALLOWED.iter().copied().collect();
    fn visit<'a>(n: &'a str, graph: &BTreeMap<&'a str, &'a [&'a str]>, path: &mut Vec<&'a str>) {
        assert!(!path.contains(&n), "import circle: {path:?} -> {n}");
        path.push(n);
        for d in graph.get(n).copied().unwrap_or_default() {
            visit(d, graph, path);
        }
        path.pop();
    }
    for n in graph.keys() {
        visit(n, &graph, &mut Vec::new());
    }
}

/// The fake runtime and the kubelet's calls (`KubeletService`: sandboxes and containers made
/// and removed) are test machinery: compiled only with the `test-util` feature, which the
/// shipped build does not have, and product code uses them nowhere (tests inside `src/` may:
/// they follow the file's `#[cfg(test)]`; `cri/` implements them).
#[test]
fn product_code_never_uses_the_fake_runtime_or_the_kubelets_calls_and_the_shipped_build_has_neither()
 {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let cri = std::fs::read_to_string(src.join("cri/mod.rs")).expect("read cri/mod.rs");
    assert!(
        cri.contains("#[cfg(feature = \"test-util\")]\npub mod fake;"),
        "cri::fake is compiled only with the test-util feature"
    );
    assert!(
        cri.contains("#[cfg(feature = \"test-util\")]\npub trait KubeletService"),
        "cri::KubeletService is compiled only with the test-util feature"
    );
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut users = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("read");
        let product = text.split("#[cfg(test)]").next().unwrap_or_default();
        let uses_fake = product.contains("fake::") && !file.ends_with("cri/fake.rs");
        let uses_kubelet_calls =
            product.contains("KubeletService") && !file.starts_with(src.join("cri"));
        if uses_fake || uses_kubelet_calls {
            users.push(
                file.strip_prefix(&src)
                    .expect("under src")
                    .display()
                    .to_string(),
            );
        }
    }
    assert!(
        users.is_empty(),
        "product code uses cri::fake or cri::KubeletService: {users:?}"
    );
}
