//! The kubeconfig, read as kube's `Kubeconfig::read_from` and `Kubeconfig::read` read it, but
//! through kruised's YAML reader ([`crate::yaml`]): kube's reads every kubeconfig type with a
//! serde_saphyr deserialiser of its own, 0.6 MB of the shipped binary (issue 44).
//!
//! The same rules: a file may hold several documents, merged (kube's `Kubeconfig::merge`: the
//! first to set a value wins); `KUBECONFIG` lists files, merged in order, empty names skipped;
//! without it, `~/.kube/config`. Relative paths in a file (certificate authority, client
//! certificate and key, token file, an exec command with a `/`) are made absolute against the
//! file's directory. A file may be UTF-8, with or without its byte-order mark, or UTF-16 with one.
//! Where the two differ, kruised reads a scalar by the type of its field, as client-go does: a
//! context named `1.10` is the text `1.10`.

use std::path::{Path, PathBuf};

use kube::config::{Kubeconfig, KubeconfigError};

use crate::yaml::{self, YamlError};

/// The largest kubeconfig read: far past any with its certificates inline.
pub const MAX_KUBECONFIG_BYTES: u64 = 16 << 20;

/// A kubeconfig that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum KubeconfigReadError {
    /// The file cannot be read (or is not text).
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a kubeconfig.
    #[error("{path} is not a kubeconfig: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Where and why.
        #[source]
        source: YamlError,
    },
    /// Two documents or files disagree (their `kind` or `apiVersion`).
    #[error(transparent)]
    Merge(KubeconfigError),
    /// The kubeconfig was read but cannot be used (no current context, a bad server URL or
    /// certificate).
    #[error(transparent)]
    Use(KubeconfigError),
    /// No `KUBECONFIG`, and no home directory for `~/.kube/config`.
    #[error("no KUBECONFIG and no home directory")]
    NoPath,
}

/// The kubeconfig of `KUBECONFIG` (its files merged), else of `~/.kube/config`.
pub fn read_default() -> Result<Kubeconfig, KubeconfigReadError> {
    read_default_of(std::env::var_os("KUBECONFIG"), std::env::home_dir())
}

/// [`read_default`] for the value of `KUBECONFIG` and the home directory given.
fn read_default_of(
    list: Option<std::ffi::OsString>,
    home: Option<PathBuf>,
) -> Result<Kubeconfig, KubeconfigReadError> {
    if let Some(list) = list {
        let paths: Vec<PathBuf> = std::env::split_paths(&list)
            .filter(|p| !p.as_os_str().is_empty())
            .collect();
        if !paths.is_empty() {
            return paths
                .iter()
                .try_fold(Kubeconfig::default(), |merged, path| {
                    merged
                        .merge(read_from(path)?)
                        .map_err(KubeconfigReadError::Merge)
                });
        }
    }
    let home = home.ok_or(KubeconfigReadError::NoPath)?;
    read_from(&home.join(".kube").join("config"))
}

/// The kubeconfig in `path`, its documents merged and its relative paths made absolute.
pub fn read_from(path: &Path) -> Result<Kubeconfig, KubeconfigReadError> {
    let read = |source| KubeconfigReadError::Read {
        path: path.to_path_buf(),
        source,
    };
    let parse = |source| KubeconfigReadError::Parse {
        path: path.to_path_buf(),
        source,
    };
    let text = decode(read_bounded(path).map_err(read)?).map_err(read)?;
    let dir = path.parent();
    let mut merged: Option<Kubeconfig> = None;
    for doc in yaml::documents(&text).map_err(parse)? {
        let mut config: Kubeconfig = yaml::from_node(doc).map_err(parse)?;
        if let Some(dir) = dir {
            make_absolute(&mut config, dir);
        }
        merged = Some(match merged {
            Some(m) => m.merge(config).map_err(KubeconfigReadError::Merge)?,
            None => config,
        });
    }
    Ok(merged.unwrap_or_default())
}

fn read_bounded(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(MAX_KUBECONFIG_BYTES + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_KUBECONFIG_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than {} MiB", MAX_KUBECONFIG_BYTES >> 20),
        ));
    }
    Ok(bytes)
}

/// The file's text: UTF-16 after its byte-order mark, else UTF-8 (its mark dropped).
fn decode(bytes: Vec<u8>) -> std::io::Result<String> {
    let invalid = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what);
    let utf16 = |rest: &[u8], unit: fn([u8; 2]) -> u16| {
        let units: Vec<u16> = rest
            .chunks(2)
            .map(|c| unit([c[0], *c.get(1).unwrap_or(&0)]))
            .collect();
        String::from_utf16(&units)
    };
    match bytes.as_slice() {
        [0xFF, 0xFE, rest @ ..] => {
            utf16(rest, u16::from_le_bytes).map_err(|_| invalid("invalid UTF-16 LE"))
        }
        [0xFE, 0xFF, rest @ ..] => {
            utf16(rest, u16::from_be_bytes).map_err(|_| invalid("invalid UTF-16 BE"))
        }
        [0xEF, 0xBB, 0xBF, rest @ ..] => {
            String::from_utf8(rest.to_vec()).map_err(|_| invalid("invalid UTF-8"))
        }
        _ => String::from_utf8(bytes).map_err(|_| invalid("invalid UTF-8")),
    }
}

/// The file references of `config` made absolute against `dir`, as kube's `read_from` does
/// (client-go's `ResolvePaths`): an exec command only when it names a path (has a `/`), so a
/// bare `aws` is still looked up in `PATH`.
fn make_absolute(config: &mut Kubeconfig, dir: &Path) {
    let absolute = |file: &mut Option<String>| {
        if let Some(f) = file.as_mut()
            && Path::new(f.as_str()).is_relative()
            && let Some(joined) = dir.join(f.as_str()).to_str()
        {
            *f = joined.to_owned();
        }
    };
    for cluster in config
        .clusters
        .iter_mut()
        .filter_map(|c| c.cluster.as_mut())
    {
        absolute(&mut cluster.certificate_authority);
    }
    for user in config
        .auth_infos
        .iter_mut()
        .filter_map(|a| a.auth_info.as_mut())
    {
        absolute(&mut user.client_certificate);
        absolute(&mut user.client_key);
        absolute(&mut user.token_file);
        if let Some(exec) = user.exec.as_mut()
            && exec.command.as_deref().is_some_and(|c| c.contains('/'))
        {
            absolute(&mut exec.command);
        }
    }
}

#[cfg(test)]
mod tests;
