//! The shipped build's linker (`scripts/lib/link-ordered.sh`, issue 44): which functions it asks
//! LLD to place first, from the list `scripts/hot-functions.sh` writes, and that every other link
//! passes through as rustc made it. A C object whose functions carry Rust's mangled names stands
//! in for the crate's object; a stand-in for `cc` records what it was given.

use std::path::{Path, PathBuf};
use std::process::Command;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Functions named as rustc names them (`17h` + hash + `E`), and one C function.
const OBJECT_SOURCE: &str = "
void _ZN3app3hot17h1111111111111111E(void) {}
void _ZN3app3hot17h2222222222222222E(void) {}
void _ZN3app5stale17h3333333333333333E(void) {}
void _ZN3app5stale17h6666666666666666E(void) {}
void _ZN3app4cold17h5555555555555555E(void) {}
void c_hot(void) {}
";

/// A list as `scripts/hot-functions.sh` writes it: `stale`'s hash is none of the object's.
const LIST: &str = "\
# a comment
1111111111111111 _ZN3app3hotE
4444444444444444 _ZN3app5staleE
- c_hot
- memcpy
";

struct Link {
    dir: tempfile::TempDir,
}

impl Link {
    /// The object (compiled by the machine's `cc`), the list and a `cc` that records its
    /// arguments and the ordering file it is handed.
    fn new() -> Link {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let source = dir.path().join("app.c");
        std::fs::write(&source, OBJECT_SOURCE).expect("write the C source");
        let status = Command::new("cc")
            .args(["-c", "-ffunction-sections", "-o"])
            .arg(dir.path().join("kruised-0.app.0-cgu.0.rcgu.o"))
            .arg(&source)
            .status()
            .expect("run cc");
        assert!(status.success(), "cc -c failed");
        std::fs::write(dir.path().join("hot-functions.txt"), LIST).expect("write the list");
        let fake = dir.path().join("fake-cc");
        std::fs::write(
            &fake,
            format!(
                "#!/bin/sh\nprintf '%s\\n' \"$@\" > {dir}/args\n\
                 for a in \"$@\"; do case \"$a\" in -Wl,--symbol-ordering-file=*) \
                 cp \"${{a#-Wl,--symbol-ordering-file=}}\" {dir}/order ;; esac; done\n",
                dir = dir.path().display()
            ),
        )
        .expect("write the stand-in cc");
        Command::new("chmod")
            .arg("+x")
            .arg(&fake)
            .status()
            .expect("chmod");
        Link { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Runs the wrapper as rustc would run its linker, with `args` and the object; returns the
    /// arguments the stand-in `cc` got.
    fn run(&self, args: &[&str]) -> Vec<String> {
        let status = Command::new(Path::new(ROOT).join("scripts/lib/link-ordered.sh"))
            .args(args)
            .arg(self.path("kruised-0.app.0-cgu.0.rcgu.o"))
            .env("KRUISED_HOT_FUNCTIONS", self.path("hot-functions.txt"))
            .env("KRUISED_LINK_CC", self.path("fake-cc"))
            .status()
            .expect("run scripts/lib/link-ordered.sh");
        assert!(status.success(), "the wrapper failed");
        std::fs::read_to_string(self.path("args"))
            .expect("the stand-in cc ran")
            .lines()
            .map(str::to_string)
            .collect()
    }

    fn order(&self) -> Vec<String> {
        std::fs::read_to_string(self.path("order"))
            .expect("an ordering file was handed to cc")
            .lines()
            .map(str::to_string)
            .collect()
    }
}

#[test]
fn the_daemons_link_places_a_listed_function_by_its_name_and_hash_and_no_namesake() {
    let link = Link::new();
    let out = link.path("kruised-0123");
    let args = link.run(&["-fuse-ld=lld", "-o", out.to_str().expect("UTF-8")]);
    assert!(
        args.iter().any(|a| a == "-Wl,--no-warn-symbol-ordering"),
        "{args:?}"
    );
    let order = link.order();
    assert_eq!(order[0], "_ZN3app3hot17h1111111111111111E", "{order:?}");
    assert!(
        !order.contains(&"_ZN3app3hot17h2222222222222222E".to_string()),
        "a namesake with another hash is not the function that ran: {order:?}"
    );
    assert!(
        !order.iter().any(|f| f.contains("4cold")),
        "an unlisted function stays where it was: {order:?}"
    );
    let report = std::fs::read_to_string(link.path("kruised-0123.hot-functions"))
        .expect("the wrapper's report");
    assert_eq!(
        report.trim(),
        "ordered by the list of 4 functions: 2 by name and hash, 1 more names without their hash"
    );
}

#[test]
fn a_listed_name_whose_hash_is_gone_orders_every_function_of_that_name_after_the_exact_ones() {
    let link = Link::new();
    let out = link.path("kruised-0123");
    link.run(&["-fuse-ld=lld", "-o", out.to_str().expect("UTF-8")]);
    assert_eq!(
        link.order(),
        [
            "_ZN3app3hot17h1111111111111111E",
            "c_hot",
            "_ZN3app5stale17h3333333333333333E",
            "_ZN3app5stale17h6666666666666666E",
            "memcpy",
        ]
    );
}

#[test]
fn other_links_and_links_without_lld_pass_through_unchanged() {
    let link = Link::new();
    let object = link.path("kruised-0.app.0-cgu.0.rcgu.o");
    let object = object.to_str().expect("UTF-8");
    for args in [
        vec!["-fuse-ld=lld", "-o", "/x/build_script_build-0123"],
        vec!["-o", "/x/kruised-0123"],
    ] {
        let given = link.run(&args);
        let mut expected: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        expected.push(object.to_string());
        assert_eq!(given, expected, "{args:?}");
    }
    assert!(
        !link.path("order").exists(),
        "no ordering file for a link the list is not for"
    );
}
