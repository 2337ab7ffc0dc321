//! The test tree's own rules, as `layers.rs` holds the product's: the kubelet and the waits
//! have one home each, in `tests/support`, so what is learned on the real kubelet (its status,
//! its timing, a restart's order) is taught once, and every wait has one deadline and one way
//! of saying what it saw last.
//!
//! - Outside `tests/support` (and the API-server double, which stores what it is given), no test
//!   or bench writes a pod's `containerStatuses`: the kubelet's status writer
//!   (`tests/support/kubelet`) does.
//! - Outside `tests/support`, no test or bench defines a `wait_…` function: the waiting room
//!   (`tests/support/wait.rs`) has them.
//! - The map at the head of `tests/support/lib.rs` names every module of the crate.

use std::path::{Path, PathBuf};

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            // a build's output, never a source
            if p.file_name().is_some_and(|n| n != "target") {
                files(&p, out);
            }
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The test and bench sources outside the homes of the doubles (`tests/support`,
/// `tests/apiserver`), as (path relative to the repository, text).
fn test_sources() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = Vec::new();
    files(&root.join("tests"), &mut found);
    files(&root.join("benches"), &mut found);
    let mut out: Vec<(String, String)> = found
        .into_iter()
        .filter_map(|p| {
            let rel = p.strip_prefix(root).ok()?.display().to_string();
            let home = rel.starts_with("tests/support/") || rel.starts_with("tests/apiserver/");
            (!home).then(|| (rel, std::fs::read_to_string(&p).unwrap_or_default()))
        })
        .collect();
    out.sort();
    out
}

/// The lines of `text` that write a pod's `containerStatuses`: a JSON literal with the quoted key
/// and a colon, an assignment through the key in an index chain (`...[key][0]["ready"] = x`), or
/// a mutable borrow of what the key indexes (`[key].as_array_mut()`).
fn status_writes(text: &str) -> Vec<usize> {
    const KEY: &str = "\"containerStatuses\"";
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let mut rest = line;
        while let Some(at) = rest.find(KEY) {
            let after = rest[at + KEY.len()..].trim_start();
            let literal = after.starts_with(':') && !after.starts_with("::");
            let indexed = rest[..at].trim_end().ends_with('[') && {
                // the rest of the indexing chain, then what is done with it
                let tail = after.trim_start_matches(|c: char| c != '=' && c != '.' && c != ';');
                (tail.starts_with('=') && !tail.starts_with("=="))
                    || tail.starts_with(".as_array_mut")
                    || tail.starts_with(".as_object_mut")
            };
            if literal || indexed {
                out.push(n + 1);
                break;
            }
            rest = &rest[at + KEY.len()..];
        }
    }
    out
}

/// The lines of `text` that define a function whose name starts with `wait_`.
fn lines_defining_waits(text: &str) -> Vec<usize> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| {
            let l = l.trim_start();
            let l = l.strip_prefix("pub ").unwrap_or(l);
            let l = l.strip_prefix("async ").unwrap_or(l);
            // spelled in two, so this file is no offender of its own
            l.starts_with(concat!("fn ", "wait_"))
        })
        .map(|(n, _)| n + 1)
        .collect()
}

#[test]
fn no_test_outside_the_support_crate_writes_a_pods_container_statuses() {
    let offenders: Vec<String> = test_sources()
        .iter()
        .flat_map(|(rel, text)| {
            status_writes(text)
                .into_iter()
                .map(move |n| format!("{rel}:{n}"))
        })
        .collect();
    assert!(
        offenders.is_empty(),
        "a pod's containerStatuses is the kubelet's to write (tests/support/kubelet): {offenders:#?}"
    );
}

#[test]
fn no_test_outside_the_support_crate_defines_its_own_wait_helper() {
    let offenders: Vec<String> = test_sources()
        .iter()
        .flat_map(|(rel, text)| {
            lines_defining_waits(text)
                .into_iter()
                .map(move |n| format!("{rel}:{n}"))
        })
        .collect();
    assert!(
        offenders.is_empty(),
        "waits live in tests/support/wait.rs, each with its deadline and what it saw last: \
         {offenders:#?}"
    );
}

#[test]
fn the_map_at_the_head_of_the_support_crate_names_each_of_its_modules() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support");
    let lib = std::fs::read_to_string(dir.join("lib.rs")).expect("tests/support/lib.rs");
    let map: String = lib
        .lines()
        .take_while(|l| l.starts_with("//!"))
        .collect::<Vec<_>>()
        .join("\n");
    let modules: Vec<&str> = lib
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pub mod "))
        .filter_map(|l| l.strip_suffix(';'))
        .collect();
    assert!(!modules.is_empty(), "no `pub mod` in tests/support/lib.rs");
    let missing: Vec<&&str> = modules
        .iter()
        .filter(|m| !map.contains(&format!("[`{m}`]")))
        .collect();
    assert!(
        missing.is_empty(),
        "the map at the head of tests/support/lib.rs does not name {missing:?} (as [`name`])"
    );
    // and every module file is declared (the map follows the tree, not a list of its own)
    let mut on_disk = Vec::new();
    for e in std::fs::read_dir(&dir).expect("tests/support").flatten() {
        let p = e.path();
        let name = p
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default()
            .to_string();
        let module = (p.is_dir() && p.join("mod.rs").exists())
            || (p.extension().is_some_and(|x| x == "rs") && name != "lib");
        if module {
            on_disk.push(name);
        }
    }
    let undeclared: Vec<&String> = on_disk
        .iter()
        .filter(|m| !modules.contains(&m.as_str()))
        .collect();
    assert!(
        undeclared.is_empty(),
        "files of tests/support that lib.rs does not declare: {undeclared:?}"
    );
}

#[test]
fn the_status_check_sees_a_json_literal_an_assignment_and_a_mutable_borrow() {
    // the key spelled out at run time, so this file is no offender of its own
    let text = r#"
        let a = json!({KEY: [{"name": "app"}]});
        p["status"][KEY][0]["ready"] = json!(true);
        p["status"][KEY] = json!([]);
        let l = p["status"][KEY].as_array_mut().unwrap();
        let read = &p["status"][KEY][0]["restartCount"];
        assert!(p["status"][KEY][0]["ready"] == json!(true));
        // the kubelet writes KEY
    "#
    .replace("KEY", concat!("\"container", "Statuses\""));
    assert_eq!(status_writes(&text), vec![2, 3, 4, 5]);
}

#[test]
fn the_wait_check_sees_free_functions_and_methods_whatever_their_visibility() {
    let text = "async FN_meta() {}\n    pub async FN_for(&self) {}\nfn waiting() {}\n\
                let wait_x = 1;\n    FN_unit() {}\n"
        .replace("FN_", concat!("fn ", "wait_"));
    assert_eq!(lines_defining_waits(&text), vec![1, 2, 5]);
}
