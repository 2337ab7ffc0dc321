//! What the size and memory reports read (issue 44): `scripts/size-report.sh`'s tables from
//! `nm`'s symbol lines (the script's build takes minutes and is not run here; `--parse` is the
//! same code the script runs on a real binary), and the benchmarks' resident memory by kind from
//! `/proc/<pid>/status`.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use kruised_test_support::daemon::{ByMapping, Resident};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// `nm -S --size-sort -C` lines as a dist build gives them, a few of each kind.
const SYMBOLS: &str = "\
0000000000401000 0000000000000400 T <k8s_openapi::api::core::v1::Pod as serde::de::Deserialize>::deserialize
0000000000402000 0000000000000200 t core::ptr::drop_in_place<k8s_openapi::api::core::v1::PodSpec>
0000000000402000 0000000000000200 t an_alias_at_the_same_address
0000000000403000 0000000000000100 T memcpy
0000000000404000 0000000000000080 r anon.3f2a.0.llvm.11
0000000000405000 0000000000090000 b a_large_bss_buffer
0000000000406000 0000000000000050 t kruised::main::h0123456789abcdef
0000000000407000 0000000000000030 t alloc::raw_vec::finish_grow
0000000000408000 0000000000000020 d <&mut serde_json::de::Deserializer<R> as serde::de::Deserializer>::deserialize_str
";

/// The script's tables for `input`, the `top` largest of each.
fn tables(input: &str, top: usize) -> String {
    let mut child = Command::new("bash")
        .arg(Path::new(ROOT).join("scripts/size-report.sh"))
        .args(["--parse", &top.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run scripts/size-report.sh");
    child
        .stdin
        .take()
        .expect("its stdin")
        .write_all(input.as_bytes())
        .expect("write the symbols");
    let out = child.wait_with_output().expect("its output");
    assert!(
        out.status.success(),
        "scripts/size-report.sh --parse: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}

/// The crate table's row for `krate`, split into its figures.
fn crate_row(tables: &str, krate: &str) -> Vec<String> {
    let row = tables
        .lines()
        .take_while(|l| !l.starts_with("## The"))
        .find(|l| l.ends_with(&format!("  {krate}")))
        .unwrap_or_else(|| panic!("no row for {krate} in:\n{tables}"));
    row.split_whitespace().map(str::to_string).collect()
}

#[test]
fn the_size_report_gives_std_generic_code_to_the_crate_of_its_type() {
    let out = tables(SYMBOLS, 10);
    // the Pod's deserialiser and drop glue for PodSpec (a std function named after its type)
    assert_eq!(
        crate_row(&out, "k8s_openapi"),
        ["1,536", "73.8", "1,536", "0", "512", "1,024", "k8s_openapi"],
        "{out}"
    );
    // std's own code stays std's; a symbol's hash is not part of its name
    assert_eq!(crate_row(&out, "alloc")[0], "48", "{out}");
    assert!(out.contains("kruised::main\n"), "{out}");
    // and kruised's own by module
    assert!(
        out.contains("## kruised's own, by module (10 largest)\n\n      bytes  module\n         80  kruised::main\n"),
        "{out}"
    );
    assert_eq!(
        crate_row(&out, "serde_json")[3],
        "32",
        "data, not code: {out}"
    );
    assert_eq!(crate_row(&out, "[unnamed constants]")[0], "128", "{out}");
    assert!(
        out.contains("  [no Rust path: libc, asm]"),
        "memcpy has no crate: {out}"
    );
}

#[test]
fn the_size_report_counts_an_alias_once_and_bss_not_at_all() {
    let out = tables(SYMBOLS, 10);
    // 0x400 + 0x200 + 0x100 + 0x80 + 0x50 + 0x30 + 0x20: the bss and the alias left out
    assert!(
        out.starts_with("## By crate (10 largest; 2,080 bytes in symbols"),
        "{out}"
    );
    assert!(!out.contains("an_alias_at_the_same_address"), "{out}");
    assert!(!out.contains("a_large_bss_buffer"), "{out}");
}

#[test]
fn the_size_report_lists_the_largest_functions_first_and_only_n_of_them() {
    let out = tables(SYMBOLS, 2);
    let functions: Vec<&str> = out
        .lines()
        .skip_while(|l| !l.starts_with("## The 2 largest functions"))
        .filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()))
        .collect();
    assert_eq!(functions.len(), 2, "{out}");
    assert!(
        functions[0].contains("<k8s_openapi::api::core::v1::Pod as serde::de::Deserialize>"),
        "{out}"
    );
    assert!(functions[1].contains("drop_in_place<k8s_openapi"), "{out}");
    assert!(out.contains("(4 more crates)"), "{out}");
}

#[test]
fn the_size_report_refuses_a_stripped_binary_with_a_message() {
    // what nm prints for a stripped binary: no symbol at all
    let out = Command::new("bash")
        .arg(Path::new(ROOT).join("scripts/size-report.sh"))
        .arg("--parse")
        .stdin(Stdio::null())
        .output()
        .expect("run scripts/size-report.sh");
    assert!(!out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no sized symbols"), "{err}");
}

#[test]
fn resident_memory_is_read_by_kind_from_proc_status() {
    let status = "Name:\tkruised\nVmHWM:\t   17000 kB\nVmRSS:\t   16800 kB\n\
                  RssAnon:\t    4608 kB\nRssFile:\t   12192 kB\nRssShmem:\t       0 kB\n";
    let r = Resident::parse(status).expect("the three fields");
    assert_eq!(
        r,
        Resident {
            total: 16800 * 1024,
            anon: 4608 * 1024,
            file: 12192 * 1024
        }
    );
    assert_eq!(r.to_string(), "16.4 MiB (anon 4.5, file 11.9)");
    // a kernel without the split (before 4.5) gives nothing rather than a wrong figure
    assert_eq!(Resident::parse("VmRSS:\t 100 kB\n"), None);
}

#[test]
fn resident_memory_is_read_by_mapping_from_proc_smaps() {
    let smaps = "\
5555-5556 r--p 00000000 fe:00 10 /usr/bin/kruised
Size:               3000 kB
Rss:                 896 kB
5556-5557 r-xp 002f1000 fe:00 10 /usr/bin/kruised
Rss:                8128 kB
5557-5558 r--p 00b25000 fe:00 10 /usr/bin/kruised
Rss:                 400 kB
5558-5559 rw-p 00b88000 fe:00 10 /usr/bin/kruised
Rss:                  32 kB
5559-555a rw-p 00000000 00:00 0                          [heap]
Rss:                4368 kB
7ffd-7ffe rw-p 00000000 00:00 0                          [stack]
Rss:                 240 kB
7f51-7f52 rw-p 00000000 00:00 0 
Rss:                 120 kB
VmFlags: rd wr mr mw me ac sd
";
    let by = ByMapping::parse(smaps);
    let kib = 1024;
    assert_eq!(
        by,
        ByMapping {
            code: 8128 * kib,
            read_only: 1296 * kib,
            data: 32 * kib,
            heap: 4368 * kib,
            other: 360 * kib,
        }
    );
    assert_eq!(
        by.to_string(),
        "code 7.9, read-only 1.3, data 0.0, heap 4.3, stacks and other anon 0.4 MiB"
    );
}

#[test]
fn resident_memory_of_this_process_adds_up() {
    let r = Resident::of(std::process::id()).expect("this process's status");
    assert!(r.anon > 0 && r.file > 0, "{r:?}");
    assert!(r.anon + r.file <= r.total, "VmRSS holds both: {r:?}");
}
