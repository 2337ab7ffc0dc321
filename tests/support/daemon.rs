//! The `kruised` binary as its own process: started with JSON logs on a pipe, so tests wait on
//! what it says (a log line) instead of sleeping, and stopped with a real SIGTERM.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::watch;

use crate::wait;

/// A running `kruised run`. Its log is drained by a task as it comes (a full pipe would block
/// the daemon), and kept for the test to read and wait on.
pub struct Daemon {
    child: Child,
    /// Its log lines so far (the sender gone once the process's log ended).
    log: watch::Receiver<Vec<serde_json::Value>>,
    /// The admin server's address.
    pub admin: SocketAddr,
}

/// A free loopback port (bound, then released for the daemon to take).
pub fn free_addr() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    l.local_addr().expect("local addr")
}

fn parse_line(line: &str) -> serde_json::Value {
    serde_json::from_str(line).unwrap_or_else(|_| serde_json::json!({ "message": line }))
}

fn message_has(v: &serde_json::Value, needle: &str) -> bool {
    v["message"].as_str().is_some_and(|m| m.contains(needle))
}

/// The `kruised` binary the tests run: `KRUISED_TEST_BIN` when set (the benchmarks measure the
/// shipped build with it: `KRUISED_TEST_BIN=target/dist/kruised`), else the one cargo built beside
/// the running test binary (cargo builds a package's binaries for its tests and benchmarks, into
/// the directory above the tests' own `deps/`).
pub fn kruised_bin() -> PathBuf {
    if let Some(exe) = std::env::var_os("KRUISED_TEST_BIN") {
        return exe.into();
    }
    kruised_test_build()
}

/// The `kruised` cargo built for the tests, beside the running test binary, whatever
/// `KRUISED_TEST_BIN` says: a test build, with the crate's `test-util` feature, so with its
/// failpoints (`kruised::controller::failpoint`), which the shipped binary does not have.
pub fn kruised_test_build() -> PathBuf {
    let test_exe = std::env::current_exe().expect("the test binary's own path");
    let profile_dir = test_exe
        .parent()
        .and_then(Path::parent)
        .expect("the test binary is in target/<profile>/deps");
    let exe = profile_dir.join("kruised");
    assert!(
        exe.is_file(),
        "no kruised binary at {} (cargo builds it for the tests; or set KRUISED_TEST_BIN)",
        exe.display()
    );
    exe
}

impl Daemon {
    /// Starts `kruised run` for node `node` with extra `args`, from [`kruised_bin`].
    pub fn start(node: &str, args: &[&str]) -> Daemon {
        Self::start_with_env(node, args, &[])
    }

    /// [`Daemon::start`] with `envs` set too (a test build's failpoints:
    /// `kruised::controller::failpoint`).
    pub fn start_with_env(node: &str, args: &[&str], envs: &[(&str, &str)]) -> Daemon {
        let admin = free_addr();
        let mut cmd = Command::new(kruised_bin());
        cmd.args(["--log-format", "json", "run", "--node-name", node, "--addr"])
            .arg(admin.to_string())
            .args(args);
        Self::spawn(cmd, envs, admin)
    }

    /// Starts `exe` (the binary under another name) with exactly `args` and `envs`; its admin
    /// server is expected on kruise's default port.
    pub fn start_exe(exe: &std::path::Path, args: &[&str], envs: &[(&str, &str)]) -> Daemon {
        let mut cmd = Command::new(exe);
        cmd.args(args);
        Self::spawn(cmd, envs, "127.0.0.1:10221".parse().expect("addr"))
    }

    /// Starts `cmd` with kruised's debug log, neither a runtime nor a kubeconfig from the
    /// test's environment, and `envs`.
    fn spawn(mut cmd: Command, envs: &[(&str, &str)], admin: SocketAddr) -> Daemon {
        cmd.env("RUST_LOG", "info,kruised=debug")
            .env_remove("CONTAINER_RUNTIME_ENDPOINT")
            .env_remove("KUBECONFIG")
            .envs(envs.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().expect("start kruised");
        let stderr = child.stderr.take().expect("stderr is piped");
        let (tx, log) = watch::channel(Vec::new());
        tokio::spawn(async move {
            let mut reader = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                tx.send_modify(|log| log.push(parse_line(&line)));
            }
            // closing the channel tells waiters the process ended
        });
        Daemon { child, log, admin }
    }

    /// Every log line so far.
    pub fn log(&self) -> Vec<serde_json::Value> {
        self.log.borrow().clone()
    }

    /// The log so far as the daemon wrote it, a JSON line each: for a failing test's message.
    pub fn log_text(&self) -> String {
        self.log().iter().map(|v| format!("{v}\n")).collect()
    }

    /// Waits for a line whose message contains `needle` (or returns one already logged), at
    /// most `limit`. Panics with the log if it does not come.
    pub async fn wait_for_log(&mut self, needle: &str, limit: Duration) -> serde_json::Value {
        let what = format!("{needle:?}");
        self.wait_for_line(&what, limit, |v| message_has(v, needle))
            .await
    }

    /// Waits until `times` lines whose message contains `needle` have been logged, at most
    /// `limit`. Panics with the log if they do not come.
    pub async fn wait_for_logged_times(&mut self, needle: &str, times: usize, limit: Duration) {
        let what = format!("kruised to log {needle:?} {times} times");
        let n = |v: &[serde_json::Value]| v.iter().filter(|v| message_has(v, needle)).count();
        self.wait_log(&what, limit, n, |n| *n >= times).await;
    }

    /// Waits for a line for which `pred` holds (or returns one already logged), at most
    /// `limit`. Panics with the log if none comes.
    pub async fn wait_for_line(
        &mut self,
        what: &str,
        limit: Duration,
        pred: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let find = |v: &[serde_json::Value]| v.iter().find(|v| pred(v)).cloned();
        let what = format!("kruised to log {what}");
        let line = self.wait_log(&what, limit, find, Option::is_some).await;
        line.expect("seen when done")
    }

    /// Waits until `done` holds of what `look` sees in the log, re-checked on every line and
    /// given up when the process's log ends; panics with the log otherwise.
    async fn wait_log<S: std::fmt::Debug>(
        &mut self,
        what: &str,
        limit: Duration,
        look: impl Fn(&[serde_json::Value]) -> S,
        done: impl FnMut(&S) -> bool,
    ) -> S {
        let look = |log: &Vec<serde_json::Value>| look(log);
        let found = wait::try_watch(&mut self.log, limit, what, look, done).await;
        found.unwrap_or_else(|m| m.fail_with(format_args!("log:\n{}", self.log_text())))
    }

    /// The process ID.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Resident memory of the process now, in bytes (from /proc).
    pub fn rss_bytes(&self) -> Option<u64> {
        status_bytes(self.pid()?, "VmRSS:")
    }

    /// The most resident memory the process has had so far (its high-water mark), in bytes.
    pub fn rss_peak_bytes(&self) -> Option<u64> {
        status_bytes(self.pid()?, "VmHWM:")
    }

    /// Resident memory now, all of it and by kind: what the benchmarks print.
    pub fn resident(&self) -> Option<Resident> {
        Resident::of(self.pid()?)
    }

    /// Resident memory now, by mapping ([`ByMapping`]).
    pub fn resident_by_mapping(&self) -> Option<ByMapping> {
        ByMapping::of(self.pid()?)
    }

    /// CPU time the process has used so far, user plus system ([`cpu_time`]).
    pub fn cpu_time(&self) -> Option<Duration> {
        cpu_time(self.pid()?)
    }

    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Sends SIGKILL: no drain, nothing written on the way out.
    pub fn kill(&mut self) {
        let _ = self.child.start_kill();
    }

    /// Sends SIGTERM.
    pub fn terminate(&self) {
        let pid = self.child.id().expect("kruised is running");
        let ok = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .expect("run kill")
            .success();
        assert!(ok, "kill -TERM {pid}");
    }

    /// Waits for the process to exit and its log to be read to the end, at most `limit`.
    pub async fn wait_exit(&mut self, limit: Duration) -> ExitStatus {
        let status = tokio::time::timeout(limit, self.child.wait())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "kruised did not exit within {limit:?}; log:\n{}",
                    self.log_text()
                )
            })
            .expect("wait for kruised");
        let mut lines = self.log.clone();
        // the reader ends at EOF, which follows the exit
        let _ = tokio::time::timeout(limit, async { while lines.changed().await.is_ok() {} }).await;
        status
    }

    /// Whether any log line's message contains `needle`.
    pub fn logged(&self, needle: &str) -> bool {
        self.log().iter().any(|v| message_has(v, needle))
    }
}

/// A `kB` figure of /proc/<pid>/status (`field` with its colon: `VmHWM:`), in bytes.
pub fn status_bytes(pid: u32, field: &str) -> Option<u64> {
    kb_field(
        &std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?,
        field,
    )
}

/// The `kB` figure of the line of a `/proc/<pid>/status` text that starts with `field` (its
/// colon included), in bytes.
fn kb_field(status: &str, field: &str) -> Option<u64> {
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// A process's resident memory, all of it and by kind, from one read of `/proc/<pid>/status`:
/// the one way the benchmarks measure memory. Displayed as `16.4 MiB (anon 4.5, file 11.9)`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Resident {
    /// `VmRSS`, bytes: all of it (anon + file + shared memory).
    pub total: u64,
    /// `RssAnon`, bytes: heap, stacks, relocated data: what the process itself costs.
    pub anon: u64,
    /// `RssFile`, bytes: pages of the binary (and of any library) mapped from the page cache:
    /// clean, shared with every process mapping the file, given back first under pressure.
    pub file: u64,
}

impl Resident {
    /// Process `pid`'s, now; `None` once it has exited.
    pub fn of(pid: u32) -> Option<Resident> {
        Resident::parse(&std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?)
    }

    /// From the text of a `/proc/<pid>/status`; `None` where a field is missing (a kernel
    /// before 4.5 has no `RssAnon`).
    pub fn parse(status: &str) -> Option<Resident> {
        Some(Resident {
            total: kb_field(status, "VmRSS:")?,
            anon: kb_field(status, "RssAnon:")?,
            file: kb_field(status, "RssFile:")?,
        })
    }

    /// In MiB.
    pub fn mib(bytes: u64) -> f64 {
        bytes as f64 / 1_048_576.0
    }
}

impl std::fmt::Display for Resident {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:.1} MiB (anon {:.1}, file {:.1})",
            Resident::mib(self.total),
            Resident::mib(self.anon),
            Resident::mib(self.file)
        )
    }
}

/// Where a process's resident memory lies, by mapping, from one read of `/proc/<pid>/smaps`
/// (issue 44: the file part is the binary's code, nearly all of it resident, so a smaller
/// resident set needs less code). Displayed as `code 7.9, read-only 0.9, data 0.4, heap 4.3,
/// stacks and other anon 0.5 MiB`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ByMapping {
    /// Executable mappings of files (the binary's `.text`), bytes.
    pub code: u64,
    /// Read-only mappings of files (`.rodata`, unwind tables, relocated `.data.rel.ro`).
    pub read_only: u64,
    /// Writable mappings of files (`.data`, `.bss`'s start).
    pub data: u64,
    /// `[heap]`: the main malloc arena.
    pub heap: u64,
    /// Everything else: `[stack]`, threads' stacks, mmapped allocations, the vDSO.
    pub other: u64,
}

impl ByMapping {
    /// Process `pid`'s, now; `None` once it has exited.
    pub fn of(pid: u32) -> Option<ByMapping> {
        Some(ByMapping::parse(
            &std::fs::read_to_string(format!("/proc/{pid}/smaps")).ok()?,
        ))
    }

    /// From the text of a `/proc/<pid>/smaps`: each mapping's `Rss:` to its kind, by the
    /// mapping's permissions and whether it maps a file.
    pub fn parse(smaps: &str) -> ByMapping {
        let mut by = ByMapping::default();
        let mut kind: Option<fn(&mut ByMapping) -> &mut u64> = None;
        for line in smaps.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let is_header = fields.first().is_some_and(|f| {
                f.contains('-') && f.split('-').all(|h| u64::from_str_radix(h, 16).is_ok())
            });
            if is_header {
                let perms = fields.get(1).copied().unwrap_or("");
                let path = fields.get(5).copied().unwrap_or("");
                kind = Some(if path == "[heap]" {
                    |b| &mut b.heap
                } else if !path.starts_with('/') {
                    |b| &mut b.other
                } else if perms.contains('x') {
                    |b| &mut b.code
                } else if perms.contains('w') {
                    |b| &mut b.data
                } else {
                    |b| &mut b.read_only
                });
            } else if let (Some(k), Some(kb)) = (kind, kb_field(line, "Rss:")) {
                *k(&mut by) += kb;
            }
        }
        by
    }
}

impl std::fmt::Display for ByMapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mib = Resident::mib;
        write!(
            f,
            "code {:.1}, read-only {:.1}, data {:.1}, heap {:.1}, stacks and other anon {:.1} MiB",
            mib(self.code),
            mib(self.read_only),
            mib(self.data),
            mib(self.heap),
            mib(self.other)
        )
    }
}

/// CPU time process `pid` has used so far, user plus system (from /proc; the kernel reports it
/// in USER_HZ ticks, 100 per second on Linux whatever the kernel's own tick rate).
pub fn cpu_time(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // the command name may hold spaces and parentheses: fields start after the last ')'
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_millis(ticks * 10))
}

/// A plain HTTP/1.1 GET on loopback: status code and body.
pub async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let got = try_http_get(addr, path).await;
    got.unwrap_or_else(|e| panic!("GET {path} from {addr}: {e}"))
}

/// [`http_get`], `Err` when the server cannot be reached or does not answer HTTP.
pub async fn try_http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    s.write_all(request.as_bytes()).await?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code = head.split_whitespace().nth(1).and_then(|c| c.parse().ok());
    let code = code.ok_or_else(|| std::io::Error::other(format!("no status line: {head:?}")))?;
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    Ok((code, body))
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}
