//! What `kruised crictl`'s output is compared with: the real crictl run at the same moment, where
//! one is provided (`KRUISED_CRICTL`, or the lab's `bin/crictl`), else what crictl printed for
//! the same scenario on the same runtime, recorded in `tests/fixtures/crictl/<runtime>/`.
//!
//! A recording is canonical: what differs between two runs (container and pod IDs, which
//! become the scenario's symbols; image digests; registry addresses; the lab's directory; the
//! run's label; times, nanosecond stamps, pids; the runtime's version) is replaced by a
//! placeholder, in the recording and in kruised's output alike, so the two compare as text.
//! `tests/fixtures/crictl/README.md` says where each recording comes from and how to make it
//! again: `KRUISED_CRICTL_RECORD=1` with a real crictl writes crictl's own output;
//! `KRUISED_CRICTL_RECORD=kruised` writes kruised's, for a runtime and commit where the live
//! comparison proved the two equal.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Output;

use regex_lite::Regex;

use crate::support::Lab;

/// One command's result as compared: its exit code, its stdout and (where compared) its
/// stderr, each already normalised and canonical.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    /// The exit code.
    pub code: Option<i32>,
    /// stdout.
    pub stdout: String,
    /// stderr, where the comparison includes it.
    pub stderr: Option<String>,
}

/// How a recording is made in this run (`KRUISED_CRICTL_RECORD`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Record {
    /// Recordings are read, never written.
    No,
    /// `1`: the live crictl's output is written (it needs one).
    Crictl,
    /// `kruised`: kruised's own output is written (only where it was proven equal to crictl's).
    Kruised,
}

/// What one test compares kruised crictl with.
pub enum Reference {
    /// The real crictl, at this path.
    Live(PathBuf, Recording),
    /// crictl's output recorded for this runtime.
    Recorded(Recording),
    /// Neither is there for this runtime: only kruised's own checks run.
    Nothing,
}

/// One test's recording: `tests/fixtures/crictl/<runtime>/<test>.txt`, its sections by key.
pub struct Recording {
    path: PathBuf,
    sections: BTreeMap<String, Seen>,
    /// The order keys were written in this run (recording mode).
    order: Vec<String>,
    record: Record,
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/crictl")
}

impl Reference {
    /// The reference of test `test` on the lab's runtime: the real crictl if one is provided,
    /// else the recording if there is one. `Nothing` (with a message) otherwise, except where
    /// recording was asked for and is impossible, which fails.
    pub fn get(lab: &Lab, test: &str) -> Reference {
        let record = match std::env::var("KRUISED_CRICTL_RECORD").as_deref() {
            Ok("1") => Record::Crictl,
            Ok("kruised") => Record::Kruised,
            _ => Record::No,
        };
        let path = fixtures()
            .join(lab.runtime.lab_name())
            .join(format!("{test}.txt"));
        let recording = Recording::load(path, record);
        let live = std::env::var_os("KRUISED_CRICTL")
            .map(PathBuf::from)
            .or_else(|| Some(lab.dir.join("bin/crictl")))
            .filter(|p| p.exists());
        match live {
            Some(crictl) => Reference::Live(crictl, recording),
            None => {
                assert!(
                    record != Record::Crictl,
                    "KRUISED_CRICTL_RECORD=1 records the real crictl's output: set KRUISED_CRICTL"
                );
                if recording.sections.is_empty() && record == Record::No {
                    eprintln!(
                        "SKIPPED the comparison with crictl: no real crictl (KRUISED_CRICTL) and \
                         no recording of it at {}; kruised's own checks still run",
                        recording.path.display()
                    );
                    return Reference::Nothing;
                }
                Reference::Recorded(recording)
            }
        }
    }

    /// The real crictl, when it is provided.
    pub fn live(&self) -> Option<&Path> {
        match self {
            Reference::Live(p, _) => Some(p),
            _ => None,
        }
    }

    /// What crictl gave for `key` (canonical arguments): `live` runs it now (its output made
    /// comparable by `prep`), else the recording's; `None` with nothing to compare with. In
    /// recording mode `ours` (kruised's, prepared) or crictl's is written under `key`.
    pub async fn expected<F>(
        &mut self,
        key: &str,
        ours: &Seen,
        live: impl FnOnce(PathBuf) -> F,
        prep: impl Fn(&Output) -> Seen,
    ) -> Option<Seen>
    where
        F: std::future::Future<Output = Output>,
    {
        match self {
            Reference::Nothing => None,
            Reference::Live(crictl, recording) => {
                let theirs = prep(&live(crictl.clone()).await);
                if recording.record == Record::Crictl {
                    recording.put(key, theirs.clone());
                }
                Some(theirs)
            }
            Reference::Recorded(recording) => {
                if recording.record == Record::Kruised {
                    recording.put(key, ours.clone());
                }
                let found = recording.sections.get(key).cloned();
                assert!(
                    found.is_some(),
                    "{} has no recording of `crictl {key}`: record it again \
                     (tests/fixtures/crictl/README.md)",
                    recording.path.display()
                );
                found
            }
        }
    }

    /// Writes the recording, in recording mode.
    pub fn finish(self) {
        if let Reference::Live(_, r) | Reference::Recorded(r) = self {
            r.save();
        }
    }
}

// === impl Recording ===

impl Recording {
    /// Sections start with `==== crictl ARGS`, then `exit N`, then `---- stdout` and its lines,
    /// and optionally `---- stderr` and its lines.
    fn load(path: PathBuf, record: Record) -> Recording {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let mut sections = BTreeMap::new();
        let mut key: Option<String> = None;
        let mut cur = Seen {
            code: None,
            stdout: String::new(),
            stderr: None,
        };
        let mut into_stderr = false;
        let mut push = |key: &mut Option<String>, cur: &mut Seen| {
            if let Some(k) = key.take() {
                sections.insert(k, std::mem::replace(cur, Seen::empty()));
            }
        };
        for line in text.split_inclusive('\n') {
            if let Some(k) = line.strip_prefix("==== crictl ") {
                push(&mut key, &mut cur);
                key = Some(k.trim_end_matches('\n').to_string());
                into_stderr = false;
            } else if let Some(code) = line.strip_prefix("exit ").filter(|_| cur.is_blank()) {
                cur.code = code.trim().parse().ok();
            } else if line == "---- stdout\n" {
                into_stderr = false;
            } else if line == "---- stderr\n" {
                into_stderr = true;
                cur.stderr = Some(String::new());
            } else if into_stderr {
                cur.stderr.get_or_insert_with(String::new).push_str(line);
            } else if key.is_some() {
                cur.stdout.push_str(line);
            }
        }
        push(&mut key, &mut cur);
        Recording {
            path,
            sections,
            order: Vec::new(),
            record,
        }
    }

    fn put(&mut self, key: &str, seen: Seen) {
        self.order.retain(|k| k != key);
        self.order.push(key.to_string());
        self.sections.insert(key.to_string(), seen);
    }

    fn save(self) {
        if self.record == Record::No || self.order.is_empty() {
            return;
        }
        let mut text = String::new();
        for key in &self.order {
            let seen = &self.sections[key];
            text.push_str(&format!("==== crictl {key}\n"));
            match seen.code {
                Some(c) => text.push_str(&format!("exit {c}\n")),
                None => text.push_str("exit signal\n"),
            }
            text.push_str("---- stdout\n");
            text.push_str(&seen.stdout);
            if !seen.stdout.is_empty() && !seen.stdout.ends_with('\n') {
                text.push('\n');
            }
            if let Some(e) = &seen.stderr {
                text.push_str("---- stderr\n");
                text.push_str(e);
                if !e.is_empty() && !e.ends_with('\n') {
                    text.push('\n');
                }
            }
        }
        std::fs::create_dir_all(self.path.parent().expect("a parent")).expect("mkdir");
        std::fs::write(&self.path, text).expect("write the recording");
        eprintln!("recorded {}", self.path.display());
    }
}

impl Seen {
    fn empty() -> Seen {
        Seen {
            code: None,
            stdout: String::new(),
            stderr: None,
        }
    }

    fn is_blank(&self) -> bool {
        self.code.is_none() && self.stdout.is_empty() && self.stderr.is_none()
    }

    /// A recording stores whole lines: text without a final newline gets one (both sides).
    pub fn lines(code: Option<i32>, stdout: String, stderr: Option<String>) -> Seen {
        let close = |mut s: String| {
            if !s.is_empty() && !s.ends_with('\n') {
                s.push('\n');
            }
            s
        };
        Seen {
            code,
            stdout: close(stdout),
            stderr: stderr.map(close),
        }
    }
}

/// Makes a scenario's output canonical: its own values become placeholders.
pub struct Canon {
    /// Literal replacements, longest first.
    literal: Vec<(String, String)>,
    patterns: Vec<(Regex, &'static str)>,
}

impl Canon {
    /// The scenario's values: its IDs by symbol (full and crictl's 13 characters), the lab's
    /// registries, directory and runtime version, the run's label value.
    pub fn new(lab: &Lab, ids: &[(String, String)], run: &str, runtime_version: &str) -> Canon {
        let mut literal: Vec<(String, String)> = Vec::new();
        for (sym, id) in ids {
            literal.push((id.clone(), format!("<{sym}>")));
            literal.push((id[..13].to_string(), format!("<{sym}:13>")));
        }
        literal.push((lab.auth_registry.clone(), "<AUTH_REGISTRY>".into()));
        literal.push((lab.registry.clone(), "<REGISTRY>".into()));
        literal.push((lab.dir.display().to_string(), "<LAB>".into()));
        literal.push((run.to_string(), "<RUN>".into()));
        literal.push((runtime_version.to_string(), "<RUNTIME_VERSION>".into()));
        literal.retain(|(from, _)| !from.is_empty());
        literal.sort_by_key(|(from, _)| std::cmp::Reverse(from.len()));
        let re = |p: &str| Regex::new(p).expect("a pattern");
        let patterns = vec![
            // RFC 3339 (JSON, YAML, log timestamps) and Go's time.Time.String()
            (
                re(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(\.\d+)?( ?(Z|[+-]\d\d:?\d\d)( [A-Z]+)?)?"),
                "<TIME>",
            ),
            // nanoseconds since the epoch, as proto3 JSON's int64 strings or plain numbers
            (re(r"\b1[0-9]{18}\b"), "<NANOS>"),
            (re(r#"("pid"|\bpid): \d+"#), "$1: <PID>"),
            (re(r"/proc/\d+/"), "/proc/<PID>/"),
            // image IDs and digests (the lab builds them from Debian's busybox-static)
            (re(r"\b[0-9a-f]{64}\b"), "<DIGEST>"),
            (re(r"\b[0-9a-f]{13}\b"), "<DIGEST:13>"),
        ];
        Canon { literal, patterns }
    }

    /// `text` with the scenario's values as placeholders.
    pub fn apply(&self, text: &str) -> String {
        let mut t = text.to_string();
        for (from, to) in &self.literal {
            t = t.replace(from.as_str(), to);
        }
        for (re, to) in &self.patterns {
            t = re.replace_all(&t, *to).into_owned();
        }
        t
    }
}
