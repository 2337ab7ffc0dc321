//! Reading a running container's environment: from the runtime's verbose container status
//! (containerd and CRI-O include the OCI spec's `process.env`), and only when that is absent
//! with `exec env`, so images without an `env` binary work (kruise-daemon always execs).
//!
//! A pass reads few envs, a few at once, within a budget ([`read_envs`]): an `exec env` that
//! hangs (a runtime without the env in its status, a container whose `env` never exits) costs
//! at most its own timeout, and a pod of many such containers costs one pass at most
//! [`ENV_READ_BUDGET`], far below the stuck-pass check (`controller::context::STUCK_PASS`)
//! that fails `/healthz`. Before, one pass read every container's env one after the other:
//! 60 containers whose exec hung took 300 s, `/healthz` failed, and kruised was restarted in a
//! loop.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt as _;
use tokio::time::Instant;

use crate::cri::{CriError, RuntimeService};
use crate::hash::env::{parse_env_list, parse_env_text};

/// Limit of the `env` exec fallback (kruise-daemon's).
pub const EXEC_ENV_TIMEOUT: Duration = Duration::from_secs(3);

/// The most containers whose env one pass over a pod reads; the others are read by the pod's
/// next pass (queued again at once when every read of this one went through).
pub const ENV_READS_PER_PASS: usize = 8;

/// How many env reads of one pass run at once.
pub const ENV_READS_AT_ONCE: usize = 4;

/// The most the env reads of one pass take together: a read not done by then is given up
/// (an error: the pod's pass is retried with the queue's backoff). Two rounds of
/// [`ENV_READS_AT_ONCE`] hanging execs ([`EXEC_ENV_TIMEOUT`] and the CRI client's slack, 5 s
/// each) fit; a thirtieth of the 300 s stuck-pass check.
pub const ENV_READ_BUDGET: Duration = Duration::from_secs(10);

/// Where the environment was read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EnvSource {
    /// The OCI spec in the verbose container status.
    RuntimeSpec,
    /// `exec env` in the container.
    Exec,
}

/// Why the environment could not be read.
#[derive(Debug, thiserror::Error)]
pub enum EnvError {
    /// The runtime call failed.
    #[error(transparent)]
    Cri(#[from] CriError),
    /// `env` ran but failed (e.g. missing from the image and no OCI spec to fall back on).
    #[error("exec env exited with {code}: {stderr}")]
    Exec {
        /// Exit code.
        code: i32,
        /// Its standard error.
        stderr: String,
    },
    /// The pass's reads took their whole budget before this one was done.
    #[error("not read within the pass's {}s budget for env reads", .0.as_secs())]
    OutOfTime(Duration),
}

/// A container's env read, and where it came from, or why it could not be read.
pub type EnvRead = Result<(BTreeMap<String, String>, EnvSource), EnvError>;

/// What one pass read of the envs it was asked for.
#[derive(Debug, Default)]
pub struct EnvReads {
    /// Per container read or tried: its name, and its env and where it came from, or why not.
    pub done: Vec<(String, EnvRead)>,
    /// Containers left for the pod's next pass (past [`ENV_READS_PER_PASS`]), not tried.
    pub deferred: usize,
}

/// Reads the env of the containers `wanted` (name, container ID), in that order: the first
/// [`ENV_READS_PER_PASS`], [`ENV_READS_AT_ONCE`] at a time, within [`ENV_READ_BUDGET`]; a
/// read still under way at the end of the budget is called off and fails as
/// [`EnvError::OutOfTime`], and the containers past the first are left for the next pass.
pub async fn read_envs<R: RuntimeService>(runtime: &R, wanted: &[(String, String)]) -> EnvReads {
    let now = &wanted[..wanted.len().min(ENV_READS_PER_PASS)];
    let deadline = Instant::now() + ENV_READ_BUDGET;
    // owned IDs: a closure over borrowed items is not `Send` for every lifetime, as a spawned
    // worker's future must be
    let ids: Vec<(usize, String)> = now.iter().map(|(_, id)| id.clone()).enumerate().collect();
    let mut reads = futures::stream::iter(ids)
        .map(|(i, id)| read_one(runtime, i, id))
        .buffer_unordered(ENV_READS_AT_ONCE);
    let mut results: Vec<Option<EnvRead>> = now.iter().map(|_| None).collect();
    while let Ok(Some((i, result))) = tokio::time::timeout_at(deadline, reads.next()).await {
        if let Some(slot) = results.get_mut(i) {
            *slot = Some(result);
        }
    }
    // the reads still under way end here
    drop(reads);
    EnvReads {
        done: now
            .iter()
            .zip(results)
            .map(|((name, _), r)| {
                let r = r.unwrap_or(Err(EnvError::OutOfTime(ENV_READ_BUDGET)));
                (name.clone(), r)
            })
            .collect(),
        deferred: wanted.len() - now.len(),
    }
}

/// The environment of the OCI spec in a verbose status `info`: `info["info"]` is JSON with
/// `runtimeSpec.process.env` on containerd and CRI-O.
pub fn env_from_info(info: &BTreeMap<String, String>) -> Option<BTreeMap<String, String>> {
    let raw = info.get("info")?;
    let v: serde_json::Value = serde_json::from_str(raw).ok()?;
    let env = v.pointer("/runtimeSpec/process/env")?.as_array()?;
    let entries: Vec<String> = env
        .iter()
        .filter_map(|e| e.as_str().map(str::to_string))
        .collect();
    Some(parse_env_list(&entries))
}

/// The `i`th read of [`read_envs`]: container `id`'s env.
async fn read_one<R: RuntimeService>(
    runtime: &R,
    i: usize,
    id: String,
) -> (
    usize,
    Result<(BTreeMap<String, String>, EnvSource), EnvError>,
) {
    (i, read_env(runtime, &id).await)
}

/// Reads the environment of container `id`.
pub async fn read_env<R: RuntimeService>(
    runtime: &R,
    id: &str,
) -> Result<(BTreeMap<String, String>, EnvSource), EnvError> {
    let status = runtime.container_status(id, true).await?;
    if let Some(env) = env_from_info(&status.info) {
        return Ok((env, EnvSource::RuntimeSpec));
    }
    let out = runtime
        .exec_sync(id, vec!["env".to_string()], EXEC_ENV_TIMEOUT)
        .await?;
    if out.exit_code != 0 {
        return Err(EnvError::Exec {
            code: out.exit_code,
            // the container's own words: kept short and without control characters
            stderr: crate::controller::text::bounded_text(
                &out.stderr,
                crate::controller::kill::STDERR_LIMIT,
            ),
        });
    }
    Ok((parse_env_text(&out.stdout), EnvSource::Exec))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_is_read_from_the_oci_spec_in_verbose_info() {
        let mut info = BTreeMap::new();
        info.insert(
            "info".to_string(),
            r#"{"pid":1,"runtimeSpec":{"process":{"env":["A=1","B=x=y","C=line1\nline2"]}}}"#
                .to_string(),
        );
        let env = env_from_info(&info).unwrap();
        assert_eq!(env["A"], "1");
        assert_eq!(env["B"], "x=y", "values keep their '=' (kruise #1108)");
        assert_eq!(env["C"], "line1\nline2", "values keep their newlines");
    }

    #[test]
    fn info_without_a_runtime_spec_gives_nothing() {
        let mut info = BTreeMap::new();
        assert!(env_from_info(&info).is_none());
        info.insert("info".to_string(), r#"{"pid":1}"#.to_string());
        assert!(env_from_info(&info).is_none());
        info.insert("info".to_string(), "not json".to_string());
        assert!(env_from_info(&info).is_none());
    }
}
