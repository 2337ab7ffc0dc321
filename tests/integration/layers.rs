//! The module layering of `src/`: modules import only downward
//! (`main` -> `lib` -> commands -> controllers -> `k8s` / `cri` / `hash`), so there is no import
//! circle and a lower module never depends on a higher one. Each top-level module lists what it
//! may use; a new edge must be added here on purpose.

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
    ("config", &["addr", "cri", "telemetry"]),
    ("admin", &["health", "metrics"]),
    // capabilities
    ("controller", &["config", "cri", "hash", "k8s", "sync"]),
    // commands
    ("cli", &["config", "crictl", "telemetry"]),
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
    ("version", &["build_info", "config", "cri"]),
    ("explain", &["config", "controller", "cri", "hash", "k8s"]),
    ("hashcmd", &["config", "hash"]),
    (
        "crictl",
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

/// `crate::<name>` occurrences in `text`.
fn crate_refs(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("crate::") {
        let tail = &rest[i + "crate::".len()..];
        let name: String = tail
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() {
            out.insert(name);
        }
        rest = tail;
    }
    out
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
        let top = rel
            .components()
            .next()
            .and_then(|c| c.as_os_str().to_str())
            .map(|s| s.trim_end_matches(".rs").to_string())
            .expect("module name");
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
