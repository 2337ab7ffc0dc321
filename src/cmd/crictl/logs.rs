//! `logs`: reads the CRI log file the runtime names in the container's status, as the kubelet
//! and crictl do (cri-client `logs.go`): records `<RFC 3339 time> <stdout|stderr> <P|F> <text>`
//! (or Docker's JSON lines), stdout records to stdout and stderr records to stderr, partial
//! (`P`) records joined with the next, `--tail`, `--since`, `--timestamps`, `--limit-bytes`,
//! `--stream`, and `-f` until the container stops.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};

use crate::config::parse_duration;
use crate::cri::clock::now_ns;
use crate::cri::{ContainerState, RemoteRuntime, RuntimeService};

use super::args::LogsArgs;
use super::format::{parse_rfc3339, rfc3339_nano_fixed};

/// How often `-f` looks for new data and whether the container still runs.
const FOLLOW_POLL: Duration = Duration::from_millis(200);

/// Which output a record belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    /// The container's stdout.
    Stdout,
    /// The container's stderr.
    Stderr,
}

/// One record of a log file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// When it was written (ns since the epoch).
    pub time_ns: i64,
    /// The zone offset the time was written in (seconds east of UTC).
    pub offset_secs: i32,
    /// Its stream.
    pub stream: Stream,
    /// The text: a full line ends with `\n`; a partial one does not.
    pub text: Vec<u8>,
}

/// Parses a line of the CRI format (`time stream tag content`), with its `\n` if it has one.
pub fn parse_cri(line: &[u8]) -> Option<Record> {
    let mut parts = line.splitn(4, |b| *b == b' ');
    let time = std::str::from_utf8(parts.next()?).ok()?;
    let (time_ns, offset_secs) = parse_rfc3339(time)?;
    let stream = match parts.next()? {
        b"stdout" => Stream::Stdout,
        b"stderr" => Stream::Stderr,
        _ => return None,
    };
    let tag = parts.next()?;
    let mut text = parts.next()?.to_vec();
    let partial = tag.split(|b| *b == b':').next() == Some(b"P");
    if partial && text.last() == Some(&b'\n') {
        text.pop();
    }
    Some(Record {
        time_ns,
        offset_secs,
        stream,
        text,
    })
}

/// Parses a line of Docker's JSON log format (`{"log":..,"stream":..,"time":..}`).
pub fn parse_docker_json(line: &[u8]) -> Option<Record> {
    #[derive(serde::Deserialize)]
    struct Line {
        log: String,
        stream: String,
        time: String,
    }
    let l: Line = serde_json::from_slice(line).ok()?;
    let (time_ns, offset_secs) = parse_rfc3339(&l.time)?;
    let stream = match l.stream.as_str() {
        "stdout" => Stream::Stdout,
        "stderr" => Stream::Stderr,
        _ => return None,
    };
    Some(Record {
        time_ns,
        offset_secs,
        stream,
        text: l.log.into_bytes(),
    })
}

/// The parser that reads the first line (CRI first, then Docker JSON).
fn parser_for(first: &[u8]) -> fn(&[u8]) -> Option<Record> {
    if parse_cri(first).is_some() || parse_docker_json(first).is_none() {
        parse_cri
    } else {
        parse_docker_json
    }
}

/// Where to start for `--tail n`: the byte offset of the n-th complete line from the end
/// (an unfinished last line does not count); `None` reads everything.
pub fn tail_start(data: &[u8], n: Option<usize>) -> usize {
    let Some(n) = n else {
        return 0;
    };
    let complete = data.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
    let mut starts: Vec<usize> = vec![0];
    starts.extend(
        data[..complete]
            .iter()
            .enumerate()
            .filter(|(_, b)| **b == b'\n')
            .map(|(i, _)| i + 1),
    );
    // `starts` holds the start of every complete line, and `complete` last
    let lines = starts.len() - 1;
    starts[lines.saturating_sub(n)]
}

/// Writes records the way cri-client's `logWriter` does.
pub struct LogWriter {
    timestamps: bool,
    stream: Option<Stream>,
    since_ns: Option<i64>,
    remain: Option<u64>,
    new_line: bool,
}

/// Whether writing may go on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    /// More may be written.
    Continue,
    /// `--limit-bytes` is used up.
    Limit,
}

impl LogWriter {
    /// A writer with the command's options.
    pub fn new(
        timestamps: bool,
        stream: Option<Stream>,
        since_ns: Option<i64>,
        limit: Option<u64>,
    ) -> Self {
        LogWriter {
            timestamps,
            stream,
            since_ns,
            remain: limit,
            new_line: true,
        }
    }

    /// Writes one record to `sink` (which gets the record's stream); `Limit` once
    /// `--limit-bytes` is used up.
    pub fn write(&mut self, r: &Record, sink: &mut impl FnMut(Stream, &[u8])) -> Flow {
        let starts_line = self.new_line;
        self.new_line = r.text.last() == Some(&b'\n');
        if self.since_ns.is_some_and(|s| r.time_ns < s) {
            return Flow::Continue;
        }
        let mut line = Vec::with_capacity(r.text.len() + 32);
        if self.timestamps && starts_line {
            line.extend_from_slice(rfc3339_nano_fixed(r.time_ns, r.offset_secs).as_bytes());
            line.push(b' ');
        }
        line.extend_from_slice(&r.text);
        if let Some(remain) = self.remain {
            line.truncate(usize::try_from(remain).unwrap_or(usize::MAX));
        }
        if self.stream.is_none_or(|s| s == r.stream) {
            sink(r.stream, &line);
        }
        if let Some(remain) = &mut self.remain {
            *remain -= line.len() as u64;
            if *remain == 0 {
                return Flow::Limit;
            }
        }
        Flow::Continue
    }
}

/// Splits `data` into lines, each with its `\n`; the last may lack it.
fn lines(data: &[u8]) -> impl Iterator<Item = &[u8]> {
    data.split_inclusive(|b| *b == b'\n')
}

/// The start of `--since`: a duration ago, or an RFC 3339 time (no zone: UTC).
fn parse_since(s: &str, now: i64) -> anyhow::Result<i64> {
    if let Ok(d) = parse_duration(s) {
        return Ok(now - i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
    }
    parse_rfc3339(s)
        .or_else(|| parse_rfc3339(&format!("{s}Z")))
        .map(|(ns, _)| ns)
        .ok_or_else(|| anyhow!("--since {s:?}: neither a duration (42m) nor a time (RFC 3339)"))
}

/// The log file of the previous attempt: `<dir>/<attempt-1>.log`.
fn previous_path(path: &Path, attempt: u32) -> PathBuf {
    let ext = path
        .extension()
        .map(|e| format!(".{}", e.to_string_lossy()))
        .unwrap_or_default();
    path.with_file_name(format!("{}{ext}", attempt.saturating_sub(1)))
}

fn sink() -> impl FnMut(Stream, &[u8]) {
    |s, bytes| {
        let _ = match s {
            Stream::Stdout => std::io::stdout().lock().write_all(bytes),
            Stream::Stderr => std::io::stderr().lock().write_all(bytes),
        };
    }
}

/// `logs`.
pub(super) async fn logs(rt: &RemoteRuntime, a: LogsArgs) -> anyhow::Result<ExitCode> {
    let id =
        a.id.clone()
            .filter(|i| !i.is_empty())
            .ok_or_else(|| anyhow!("ID cannot be empty"))?;
    let stream = match a.stream.as_deref() {
        None => None,
        Some("stdout") => Some(Stream::Stdout),
        Some("stderr") => Some(Stream::Stderr),
        Some(s) => bail!("invalid stream {s:?}, must be \"stdout\" or \"stderr\""),
    };
    if stream.is_some() && a.tail >= 0 {
        bail!("--tail and --stream are mutually exclusive");
    }
    let since = a
        .since
        .as_deref()
        .map(|s| parse_since(s, now_ns()))
        .transpose()?;
    let status = rt
        .container_status(&id, false)
        .await
        .with_context(|| format!("get the status of container {id:?}"))?;
    if status.log_path.is_empty() {
        bail!("the container has not set log path");
    }
    let mut path = PathBuf::from(&status.log_path);
    if a.previous {
        if status.metadata.attempt == 0 {
            bail!(
                "previous terminated container {} not found",
                status.metadata.name
            );
        }
        path = previous_path(&path, status.metadata.attempt);
    }
    let data = tokio::fs::read(&path)
        .await
        .with_context(|| format!("read log file {}", path.display()))?;
    let tail = usize::try_from(a.tail).ok();
    let limit = u64::try_from(a.limit_bytes).ok();
    let mut writer = LogWriter::new(a.timestamps, stream, since, limit);
    let mut out = sink();
    let start = tail_start(&data, tail);
    let mut budget = if a.follow { None } else { tail };
    let parse = parser_for(lines(&data[start..]).next().unwrap_or_default());
    let follow = a.follow && status.state == ContainerState::Running;
    let mut offset = start;
    for line in lines(&data[start..]) {
        if budget == Some(0) {
            return Ok(ExitCode::SUCCESS);
        }
        if follow && !line.ends_with(b"\n") {
            // unfinished: read it again when it is complete
            break;
        }
        offset += line.len();
        let Some(r) = parse(line) else {
            tracing::debug!(line = %String::from_utf8_lossy(line), "skipping a malformed log line");
            continue;
        };
        if writer.write(&r, &mut out) == Flow::Limit {
            return Ok(ExitCode::SUCCESS);
        }
        budget = budget.map(|b| b - 1);
    }
    if follow {
        follow_file(rt, &id, &path, offset, parse, &mut writer, &mut out).await?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `-f`: writes what is appended to the file until the container stops (then the rest).
async fn follow_file(
    rt: &RemoteRuntime,
    id: &str,
    path: &Path,
    mut offset: usize,
    parse: fn(&[u8]) -> Option<Record>,
    writer: &mut LogWriter,
    out: &mut impl FnMut(Stream, &[u8]),
) -> anyhow::Result<()> {
    let mut ticker = tokio::time::interval(FOLLOW_POLL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let running = rt
            .container_status(id, false)
            .await
            .map(|s| s.state == ContainerState::Running)
            .unwrap_or(false);
        let data = match tokio::fs::read(path).await {
            Ok(d) => d,
            // rotated away: the runtime writes a new file under the same name
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && running => continue,
            Err(e) => return Err(e).with_context(|| format!("read log file {}", path.display())),
        };
        if data.len() < offset {
            // rotated or truncated: start over in the new file
            offset = 0;
        }
        for line in lines(&data[offset..]) {
            if running && !line.ends_with(b"\n") {
                break;
            }
            offset += line.len();
            if let Some(r) = parse(line)
                && writer.write(&r, out) == Flow::Limit
            {
                return Ok(());
            }
        }
        if !running {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CRI log file containerd 1.6 wrote: stderr first, a partial last line.
    const RAW: &str = include_str!("../../../tests/fixtures/cri-log-logger.log");

    fn render(data: &[u8], tail: Option<usize>, w: &mut LogWriter) -> (String, String) {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let mut budget = tail;
        for line in lines(&data[tail_start(data, tail)..]) {
            if budget == Some(0) {
                break;
            }
            let r = parse_cri(line).unwrap();
            let flow = w.write(&r, &mut |s, b: &[u8]| match s {
                Stream::Stdout => out.extend_from_slice(b),
                Stream::Stderr => err.extend_from_slice(b),
            });
            budget = budget.map(|b| b - 1);
            if flow == Flow::Limit {
                break;
            }
        }
        (
            String::from_utf8(out).unwrap(),
            String::from_utf8(err).unwrap(),
        )
    }

    #[test]
    fn records_go_to_their_stream_and_partial_lines_join_the_next() {
        let mut w = LogWriter::new(false, None, None, None);
        let (out, err) = render(RAW.as_bytes(), None, &mut w);
        assert_eq!(
            out,
            "hello\nline 1\nline 2\nline 3\nline 4\nline 5\nno-newline"
        );
        assert_eq!(err, "to-stderr\n");
    }

    #[test]
    fn tail_counts_lines_of_both_streams() {
        let mut w = LogWriter::new(false, None, None, None);
        assert_eq!(
            render(RAW.as_bytes(), Some(2), &mut w).0,
            "line 5\nno-newline"
        );
        let mut w = LogWriter::new(false, None, None, None);
        assert_eq!(
            render(RAW.as_bytes(), Some(0), &mut w),
            (String::new(), String::new())
        );
    }

    #[test]
    fn timestamps_keep_nine_digits_and_prefix_only_new_lines() {
        let mut w = LogWriter::new(true, None, None, None);
        let (out, err) = render(RAW.as_bytes(), Some(3), &mut w);
        assert_eq!(
            out,
            "2026-11-30T17:11:52.358451487Z line 4\n2026-11-30T17:11:52.358453010Z line 5\n\
             2026-11-30T17:11:56.554897699Z no-newline"
        );
        assert_eq!(err, "");
        let raw = "2026-11-30T17:11:52.1Z stdout P a\n2026-11-30T17:11:52.2Z stdout F b\n";
        let mut w = LogWriter::new(true, None, None, None);
        assert_eq!(
            render(raw.as_bytes(), None, &mut w).0,
            "2026-11-30T17:11:52.100000000Z ab\n"
        );
    }

    #[test]
    fn limit_bytes_and_stream_and_since_filter_the_output() {
        let mut w = LogWriter::new(false, None, None, Some(10));
        assert_eq!(
            render(RAW.as_bytes(), None, &mut w),
            (String::new(), "to-stderr\n".into())
        );
        let mut w = LogWriter::new(false, Some(Stream::Stderr), None, None);
        assert_eq!(render(RAW.as_bytes(), None, &mut w).0, "");
        let since = parse_rfc3339("2026-11-30T17:11:56Z").unwrap().0;
        let mut w = LogWriter::new(false, None, Some(since), None);
        assert_eq!(render(RAW.as_bytes(), None, &mut w).0, "no-newline");
    }

    #[test]
    fn docker_json_lines_parse_too() {
        let line = br#"{"log":"hi\n","stream":"stderr","time":"2026-11-30T17:11:52.1Z"}"#;
        let r = parse_docker_json(line).unwrap();
        assert_eq!(
            (r.stream, r.text.as_slice()),
            (Stream::Stderr, &b"hi\n"[..])
        );
        assert_eq!(parser_for(line)(line), Some(r));
        let first = lines(RAW.as_bytes()).next().unwrap();
        assert_eq!(parser_for(first)(first), parse_cri(first));
        assert!(parse_cri(first).is_some());
    }

    #[test]
    fn the_previous_attempt_is_the_file_numbered_one_less() {
        assert_eq!(
            previous_path(Path::new("/var/log/pods/x/logger/2.log"), 2),
            PathBuf::from("/var/log/pods/x/logger/1.log")
        );
    }

    #[test]
    fn since_takes_durations_and_times() {
        assert_eq!(parse_since("1s", 5_000_000_000).unwrap(), 4_000_000_000);
        assert_eq!(
            parse_since("2026-11-30T17:11:56", 0).unwrap(),
            parse_rfc3339("2026-11-30T17:11:56Z").unwrap().0
        );
        assert!(parse_since("yesterday", 0).is_err());
    }
}
