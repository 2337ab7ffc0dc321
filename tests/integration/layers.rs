//! The module layering of `src/`: modules import only downward
//! (`main` -> `lib` -> commands -> controllers -> `k8s` / `cri` / `hash`), so there is no import
//! circle and a lower module never depends on a higher one. Each top-level module, and each
//! command under `cmd/`, lists what it may use; a new edge must be added here on purpose.
//!
//! Inside a folder, two rules more (read from the source's paths: `crate::…`, `super::…`,
//! `self::…`, brace groups expanded; comments and the tests at a file's end left out):
//!
//! - **no arrow upward** in `controller/`, `cri/`, `cmd/` and each folder in them ([`FACES`]):
//!   a file in such a folder (or below it) names of the folder's `mod.rs` only modules, never
//!   an item defined or re-exported there. `mod.rs` is the folder's face to the rest of the crate; what its
//!   files share lives in a file of its own, which they name
//!   (`super::controller::ContainerMeta`, not `super::ContainerMeta`).
//! - **no circle** between the files of one folder, anywhere in `src/`: the files (and
//!   subfolders) of a folder name each other along a graph without a cycle. A name reached
//!   through a re-export of `mod.rs` is not followed (the rule above covers it where it holds).
//!
//! The test machinery inside `src/` (`cri/fake`, [`TEST_MACHINERY`]) is held to the layering
//! and the circles, not to the faces.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// What each top-level module of the library may import (`crate::<module>`).
const ALLOWED: &[(&str, &[&str])] = &[
    // leaves
    ("addr", &[]),
    ("backoff", &[]),
    ("build_info", &[]),
    ("sync", &[]),
    ("cri", &["sync"]),
    ("gojson", &[]),
    ("hash", &["gojson"]),
    ("health", &["sync"]),
    ("sdnotify", &[]),
    ("telemetry", &[]),
    ("yaml", &[]),
    // shared services
    ("metrics", &["build_info"]),
    (
        "k8s",
        &["backoff", "gojson", "hash", "health", "sync", "yaml"],
    ),
    ("config", &["cri", "yaml"]),
    ("admin", &["health", "metrics"]),
    // capabilities
    (
        "controller",
        &[
            "backoff", "config", "cri", "hash", "health", "k8s", "sync", "yaml",
        ],
    ),
    // the daemon
    (
        "daemon",
        &[
            "admin",
            "backoff",
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
            "cmd::output",
            "cmd::run",
            "cmd::version",
            "config",
            "k8s",
            "telemetry",
        ],
    ),
    ("cmd::output", &[]),
    ("cmd::run", &["addr", "config", "daemon"]),
    // which runtime is the kubelet's: its Node says (k8s::node, through k8s::client)
    ("cmd::version", &["build_info", "config", "cri", "k8s"]),
    (
        "cmd::explain",
        &["cmd::output", "config", "controller", "cri", "hash", "k8s"],
    ),
    ("cmd::hash", &["cmd::output", "hash", "yaml"]),
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

/// The folders below which every folder's `mod.rs` (or `<folder>.rs`) is a face only: no file
/// inside names an item of it. `controller/`, `cri/`, `cmd/` and each folder in them.
const FACES: &[&str] = &["controller", "cri", "cmd"];

/// The test machinery compiled into `src/` (feature `test-util`, never shipped): not held to
/// the faces.
const TEST_MACHINERY: &[&str] = &["cri/fake"];

/// [`FACES`] and every folder below them, as paths under `src/`.
fn faces(src: &Path) -> Vec<String> {
    fn below(dir: &Path, rel: &str, out: &mut Vec<String>) {
        if TEST_MACHINERY.contains(&rel) {
            return;
        }
        out.push(rel.to_string());
        let mut subs: Vec<_> = std::fs::read_dir(dir)
            .expect("read a folder")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_dir())
            .collect();
        subs.sort();
        for sub in subs {
            let name = sub.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            below(&sub, &format!("{rel}/{name}"), out);
        }
    }
    let mut out = Vec::new();
    for face in FACES {
        below(&src.join(face), face, &mut out);
    }
    out
}

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

/// The unit a resolved path (from [`resolved`]) names, as [`crate_refs`] reads it.
fn unit_of_path(path: &[String]) -> Option<String> {
    match path {
        [top, command, ..]
            if top == "cmd" && command.starts_with(|c: char| c.is_ascii_lowercase()) =>
        {
            Some(format!("cmd::{command}"))
        }
        [top, ..] => Some(top.clone()),
        [] => None,
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
    // a path through `super` names the unit it reaches
    let explain = module_of(Path::new("cmd/explain.rs"));
    let named: Vec<Option<String>> =
        resolved("use super::output::OutputFormat; super::Cli", &explain)
            .iter()
            .map(|p| unit_of_path(p))
            .collect();
    assert_eq!(named, [Some("cmd::output".into()), Some("cmd".into())]);
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
        let module = module_of(rel);
        let named: Vec<String> = resolved(&product_code(&text), &module)
            .iter()
            .filter_map(|p| unit_of_path(p))
            .collect();
        for dep in crate_refs(&text).into_iter().chain(named) {
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
    let service = std::fs::read_to_string(src.join("cri/service.rs")).expect("read cri/service.rs");
    assert!(
        service.contains("#[cfg(feature = \"test-util\")]\npub trait KubeletService")
            && cri.contains("#[cfg(feature = \"test-util\")]\npub use service::KubeletService;"),
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

/// The module path of a file of `src/` (`controller/containermeta/pods.rs`:
/// `controller::containermeta::pods`; a `mod.rs` is its folder's module).
fn module_of(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .components()
        .filter_map(|c| c.as_os_str().to_str())
        .map(|s| s.trim_end_matches(".rs").to_string())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

/// The code of a file as the folder rules read it: without comments, and without the tests at
/// its end (inside them `super` is the file itself).
fn product_code(text: &str) -> String {
    let product = text.split("#[cfg(test)]").next().unwrap_or_default();
    product
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The paths that begin at `crate`, `super` or `self` in `code`, brace groups expanded
/// (`use super::{a, b::{C, D}}`: `super::a`, `super::b::C`, `super::b::D`), each as its
/// segments, with the inline modules (`mod parse { … }`) it stands in, outermost first.
fn paths(code: &str) -> Vec<(Vec<String>, Vec<String>)> {
    let bytes = code.as_bytes();
    let is_ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut out = Vec::new();
    // the inline modules open here, each with the brace depth inside it
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < code.len() {
        let rest = &code[i..];
        let boundary = i == 0 || !is_ident(bytes[i - 1]);
        let starts = ["crate::", "super::", "self::"]
            .iter()
            .any(|p| rest.starts_with(p));
        if starts && boundary {
            let (found, used) = parse_path(rest);
            let within: Vec<String> = inline.iter().map(|(m, _)| m.clone()).collect();
            out.extend(found.into_iter().map(|p| (p, within.clone())));
            i += used.max(1);
            continue;
        }
        if boundary && rest.starts_with("mod ") {
            let name: String = rest[4..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            let after = rest[4 + name.len()..].trim_start();
            if !name.is_empty() && after.starts_with('{') {
                inline.push((name, depth + 1));
            }
        }
        match bytes[i] {
            b'{' => depth += 1,
            b'}' => {
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
            }
            _ => {}
        }
        i += rest.chars().next().map_or(1, char::len_utf8);
    }
    out
}

/// One path at the start of `text`: the paths it stands for, and the bytes it took.
fn parse_path(text: &str) -> (Vec<Vec<String>>, usize) {
    let mut segments = Vec::new();
    let mut at = 0;
    loop {
        let rest = &text[at..];
        let trimmed = rest.trim_start();
        at += rest.len() - trimmed.len();
        if trimmed.starts_with('{') {
            // a group: each member a path of its own below the prefix
            let mut depth = 0;
            let mut end = 0;
            for (k, c) in trimmed.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            end = k;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            let inner = &trimmed[1..end];
            let mut out = Vec::new();
            for member in split_top_level(inner) {
                let member = member.trim();
                if member.is_empty() {
                    continue;
                }
                if member == "self" {
                    out.push(segments.clone());
                    continue;
                }
                let (found, _) = parse_path(member);
                for f in found {
                    let mut p = segments.clone();
                    p.extend(f);
                    out.push(p);
                }
            }
            return (out, at + end + 1);
        }
        let name: String = trimmed
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '*')
            .collect();
        if name.is_empty() {
            return (vec![segments], at);
        }
        at += name.len();
        segments.push(name);
        if text[at..].starts_with("::") {
            at += 2;
        } else {
            return (vec![segments], at);
        }
    }
}

/// `text` split at the commas outside braces.
fn split_top_level(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut from) = (0, 0);
    for (k, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&text[from..k]);
                from = k + 1;
            }
            _ => {}
        }
    }
    out.push(&text[from..]);
    out
}

/// `path` (from [`paths`]) as an absolute module path, seen from the module `from`.
fn resolve(path: &[String], from: &[String]) -> Vec<String> {
    let mut base: Vec<String> = from.to_vec();
    let mut rest = path;
    match rest.first().map(String::as_str) {
        Some("crate") => {
            base.clear();
            rest = &rest[1..];
        }
        Some("self") => rest = &rest[1..],
        _ => {
            while rest.first().is_some_and(|s| s == "super") {
                base.pop();
                rest = &rest[1..];
            }
        }
    }
    base.extend(rest.iter().cloned());
    base
}

/// Whether `name` is a module of the folder `dir` (a file or a folder of its own).
fn is_module_of(dir: &Path, name: &str) -> bool {
    dir.join(format!("{name}.rs")).is_file() || dir.join(name).is_dir()
}

/// The paths of `code`, a file of module `module`, resolved (each seen from the inline module
/// it stands in).
fn resolved(code: &str, module: &[String]) -> Vec<Vec<String>> {
    paths(code)
        .into_iter()
        .map(|(p, within)| {
            let mut from = module.to_vec();
            from.extend(within);
            resolve(&p, &from)
        })
        .collect()
}

/// A file of `src/` as the folder rules read it.
struct Source {
    /// Its path under `src/`.
    name: String,
    /// Its module path.
    module: Vec<String>,
    /// The paths it names, resolved.
    paths: Vec<Vec<String>>,
}

impl Source {
    /// `code` as the file `name` of `src/`.
    fn read(name: &str, code: &str) -> Source {
        let module = module_of(Path::new(name));
        let paths = resolved(code, &module);
        Source {
            name: name.to_string(),
            module,
            paths,
        }
    }
}

/// Every file of `src/` with its module path and its resolved paths. Files that hold only
/// tests (`tests.rs`, `*_tests.rs`, included with `#[path]` under `#[cfg(test)]`) are left
/// out, as the tests at a file's end are.
fn sources() -> (std::path::PathBuf, Vec<Source>) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut out = Vec::new();
    for file in files {
        let rel = file.strip_prefix(&src).expect("under src");
        let stem = rel.file_stem().and_then(|s| s.to_str()).unwrap_or_default();
        if rel.starts_with("cri/generated") || stem == "tests" || stem.ends_with("_tests") {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("read");
        out.push(Source::read(
            &rel.display().to_string(),
            &product_code(&text),
        ));
    }
    (src, out)
}

/// The arrows upward in `files` (module path, resolved paths): a file inside a face that names
/// an item of the face's `mod.rs`. `is_module(face, name)` says what the face's modules are.
fn arrows_upward(
    faces: &[&str],
    files: &[Source],
    is_module: impl Fn(&[String], &str) -> bool,
) -> Vec<String> {
    let mut out = BTreeSet::new();
    for face in faces {
        let face: Vec<String> = face.split('/').map(str::to_string).collect();
        for Source {
            name,
            module,
            paths,
        } in files
        {
            if !module.starts_with(&face) || *module == face {
                continue;
            }
            for p in paths {
                if p.len() > face.len() && p.starts_with(&face) {
                    let item = &p[face.len()];
                    if !is_module(&face, item) {
                        out.insert(format!(
                            "{name} names `{item}` of {}/mod.rs: define it in a file of its own \
                             and name that",
                            face.join("/")
                        ));
                    }
                }
            }
        }
    }
    out.into_iter().collect()
}

/// The circles among the files of each folder: for each folder (module path), its members
/// (files and subfolders) and which name which.
fn circles(files: &[Source]) -> Vec<String> {
    // folder -> member -> members it names
    let mut graph: BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for Source { module, paths, .. } in files {
        // every folder above the file, with the member of it the file belongs to (a folder's
        // `mod.rs` is no member of it: it belongs to the folder, a member of the one above)
        for level in 1..module.len() {
            let folder = module[..level].to_vec();
            let member = module[level].clone();
            let edges = graph.entry(folder.clone()).or_default();
            let named = edges.entry(member.clone()).or_default();
            for p in paths {
                if p.len() > level && p.starts_with(&folder) && p[level] != member {
                    named.insert(p[level].clone());
                }
            }
        }
    }
    let mut out = Vec::new();
    for (folder, edges) in &graph {
        // only members are nodes: a name that is an item of the folder's mod.rs is not
        let nodes: BTreeSet<&String> = edges.keys().collect();
        fn visit<'a>(
            n: &'a String,
            edges: &'a BTreeMap<String, BTreeSet<String>>,
            nodes: &BTreeSet<&'a String>,
            path: &mut Vec<&'a String>,
            done: &mut BTreeSet<&'a String>,
            found: &mut Vec<String>,
        ) {
            if let Some(i) = path.iter().position(|p| *p == n) {
                let cycle: Vec<&str> = path[i..].iter().map(|s| s.as_str()).collect();
                found.push(format!("{} -> {n}", cycle.join(" -> ")));
                return;
            }
            if !done.insert(n) {
                return;
            }
            path.push(n);
            for next in edges.get(n).into_iter().flatten() {
                if nodes.contains(next) {
                    visit(next, edges, nodes, path, done, found);
                }
            }
            path.pop();
        }
        let mut done = BTreeSet::new();
        let mut found = Vec::new();
        for n in &nodes {
            visit(n, edges, &nodes, &mut Vec::new(), &mut done, &mut found);
        }
        for f in found {
            out.push(format!("in {}/: {f}", folder.join("/")));
        }
    }
    out
}

#[test]
fn paths_are_read_with_their_groups_and_resolved_from_the_file() {
    let found: Vec<Vec<String>> =
        paths("use super::{Shared, decide::{self, Step}, lock};\nlet x = crate::a::b(1);")
            .into_iter()
            .map(|(p, _)| p)
            .collect();
    let text: Vec<String> = found.iter().map(|p| p.join("::")).collect();
    assert_eq!(
        text,
        [
            "super::Shared",
            "super::decide",
            "super::decide::Step",
            "super::lock",
            "crate::a::b"
        ]
    );
    let from = module_of(Path::new("controller/containermeta/pods.rs"));
    assert_eq!(
        resolve(&found[0], &from).join("::"),
        "controller::containermeta::Shared"
    );
    let face = module_of(Path::new("controller/containermeta/mod.rs"));
    assert_eq!(
        resolve(&["super".into(), "context".into()], &face).join("::"),
        "controller::context"
    );
    // in an inline module, `super` is the file
    let inline = resolved(
        "pub mod parse {\n    use super::parse_config;\n}\nuse super::Settings;",
        &module_of(Path::new("controller/imagepull/credprovider.rs")),
    );
    let text: Vec<String> = inline.iter().map(|p| p.join("::")).collect();
    assert_eq!(
        text,
        [
            "controller::imagepull::credprovider::parse_config",
            "controller::imagepull::Settings"
        ]
    );
}

#[test]
fn a_file_that_names_an_item_of_its_folders_mod_rs_is_an_arrow_upward() {
    let file = Source::read;
    let modules = ["pods", "memory", "controller"];
    let is_module = |_: &[String], n: &str| modules.contains(&n);
    let files = [
        file("f/pods.rs", "use super::{memory::Memory, controller::C};"),
        file("f/memory.rs", "use super::{Shared, lock};"),
        file("f/sub/deep.rs", "fn f() { crate::f::Context::new() }"),
        file("f/mod.rs", "use self::memory::Memory; use super::Other;"),
    ];
    assert_eq!(
        arrows_upward(&["f"], &files, is_module),
        [
            "f/memory.rs names `Shared` of f/mod.rs: define it in a file of its own and name that",
            "f/memory.rs names `lock` of f/mod.rs: define it in a file of its own and name that",
            "f/sub/deep.rs names `Context` of f/mod.rs: define it in a file of its own and name \
             that",
        ]
    );
}

#[test]
fn two_files_of_a_folder_that_name_each_other_are_a_circle() {
    let file = Source::read;
    let files = [
        file("p/grpc.rs", "use super::prober::Outcome;"),
        file("p/prober.rs", "fn f() { super::grpc::check() }"),
        file("p/state.rs", "use super::prober::Outcome;"),
        file("p/mod.rs", "use self::state::X; use self::grpc::Y;"),
    ];
    assert_eq!(circles(&files), ["in p/: grpc -> prober -> grpc"]);
    assert!(circles(&files[1..]).is_empty());
}

#[test]
fn no_file_names_an_item_of_a_faces_mod_rs() {
    let (src, mut files) = sources();
    files.retain(|f| {
        !TEST_MACHINERY
            .iter()
            .any(|m| f.name.starts_with(&format!("{m}/")))
    });
    let faces = faces(&src);
    assert!(
        ["controller/containermeta", "cri", "cmd", "cmd/crictl"]
            .iter()
            .all(|f| faces.contains(&f.to_string()))
            && !faces.contains(&"cri/fake".to_string()),
        "{faces:?}"
    );
    let faces: Vec<&str> = faces.iter().map(String::as_str).collect();
    let violations = arrows_upward(&faces, &files, |face, name| {
        is_module_of(&src.join(face.join("/")), name)
    });
    assert!(
        violations.is_empty(),
        "arrows upward:\n{}",
        violations.join("\n")
    );
}

#[test]
fn the_files_of_a_folder_name_each_other_without_a_circle() {
    let (_, files) = sources();
    let found = circles(&files);
    assert!(found.is_empty(), "circles:\n{}", found.join("\n"));
}

/// `cmd/crictl/mod.rs` is a face as the controllers' are: module declarations, re-exports and
/// the entry point (`run`), its code in files of its own.
#[test]
fn crictls_mod_rs_holds_only_its_modules_re_exports_and_entry_point() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let text = std::fs::read_to_string(src.join("cmd/crictl/mod.rs")).expect("read");
    let code = product_code(&text);
    let mut others = Vec::new();
    let mut depth = 0usize;
    for line in code.lines() {
        let item = line.trim_start();
        if depth == 0 && !item.is_empty() && !item.starts_with('}') && !item.starts_with("#[") {
            let allowed = ["mod ", "pub mod ", "use ", "pub use ", "pub async fn run("]
                .iter()
                .any(|p| item.starts_with(p));
            if !allowed {
                others.push(item.to_string());
            }
        }
        depth += line.matches('{').count();
        depth = depth.saturating_sub(line.matches('}').count());
    }
    assert!(
        others.is_empty(),
        "cmd/crictl/mod.rs holds more than its face: {others:?}"
    );
}

/// `kruised explain` shows the daemon's own observation and plan (containermeta's observe
/// step and plan), and rebuilds neither: it builds no annotation, reads no env and plans no
/// restart of its own.
#[test]
fn explain_takes_the_daemons_observe_step_and_plan_and_rebuilds_neither() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let text = std::fs::read_to_string(src.join("cmd/explain.rs")).expect("read");
    let code = product_code(&text);
    for own in [
        "build_meta(",
        "read_env(",
        "plan_restarts(",
        "current_env_hash(",
    ] {
        assert!(!code.contains(own), "cmd/explain.rs calls {own} itself");
    }
    for daemons in ["containermeta::observe_as_started", "containermeta::plan"] {
        assert!(
            code.contains(daemons),
            "cmd/explain.rs does not call {daemons}"
        );
    }
}
