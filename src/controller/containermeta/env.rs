//! Reading a running container's environment: from the runtime's verbose container status
//! (containerd and CRI-O include the OCI spec's `process.env`), and only when that is absent
//! with `exec env`, so images without an `env` binary work (kruise-daemon always execs).

use std::collections::BTreeMap;
use std::time::Duration;

use crate::cri::{CriError, RuntimeService};
use crate::hash::env::{parse_env_list, parse_env_text};

/// Limit of the `env` exec fallback (kruise-daemon's).
pub const EXEC_ENV_TIMEOUT: Duration = Duration::from_secs(3);

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
