//! Authentication to the API server, from the kubeconfig's user as client-go reads it, in the
//! same order kube does: an `auth-provider` (`oidc`'s `id-token`, `gcp`), `username` and
//! `password`, `token`, `tokenFile` (read again once a minute, the last good token kept if the
//! file goes), an `exec` plugin (run again a minute before its token expires; a plugin that
//! answers with a client certificate and key authenticates the TLS connection instead).
//!
//! kruised's own, not kube's `ConfigExt::auth_layer`: kube reads a plugin's answer with a
//! second YAML parser and a `gcp` provider's keys with a JSONPath engine, together 0.4 MB of the
//! shipped binary that only this needs (issue 44). Here the answer is read by [`crate::yaml`]
//! (JSON is YAML), and a `token-key` or `expiry-key` is a dotted path (`{.credential.token}`),
//! the form gcloud's configurations use. Fixed on the way, as client-go does: a token read
//! from a file or printed by a command has its surrounding whitespace cut; a plugin that
//! answers with neither a token nor a certificate is an error, not an anonymous client; a
//! plugin that needs a terminal (`interactiveMode: Always`) where kruised has none is refused
//! with that reason instead of waiting on it.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use base64::Engine;
use futures::future::BoxFuture;
use http::header::AUTHORIZATION;
use http::{HeaderValue, Request};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::config::{AuthInfo, AuthProviderConfig, ExecConfig, ExecInteractiveMode};
use secrecy::ExposeSecret;
use serde::Deserialize;
use tower::{BoxError, Layer, Service};

/// How long a token read from a file is used before the file is read again (client-go and kube:
/// a minute).
pub const TOKEN_FILE_REREAD: Duration = Duration::from_secs(60);
/// How long before its expiry a plugin's token is replaced by a fresh one.
pub const REFRESH_BEFORE_EXPIRY: SignedDuration = SignedDuration::from_secs(60);

/// The kubeconfig's user cannot be used to authenticate.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// The token file cannot be read.
    #[error("token file {path}: {source}")]
    TokenFile {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A token, user name or password is empty or makes no valid header.
    #[error("the {what} cannot be sent in a header (empty, or a control character in it)")]
    Header {
        /// Which credential.
        what: &'static str,
    },
    /// The exec plugin names no command.
    #[error("the exec plugin names no command")]
    NoCommand,
    /// `provideClusterInfo` is set but the cluster is not known.
    #[error(
        "the exec plugin asks for the cluster's details (provideClusterInfo), and there are none"
    )]
    NoClusterInfo,
    /// The plugin needs a terminal and kruised has none.
    #[error(
        "the exec plugin {command} needs a terminal (interactiveMode: Always), and kruised's \
         standard input is not one: give the daemon a plugin that runs unattended"
    )]
    NeedsTerminal {
        /// The command.
        command: String,
    },
    /// The command could not be started.
    #[error("the credential command {command} cannot be started: {source}")]
    Start {
        /// The command.
        command: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The command failed.
    #[error(
        "the credential command {command} failed ({status}); its standard error is in the log before this"
    )]
    Failed {
        /// The command.
        command: String,
        /// Its exit status.
        status: std::process::ExitStatus,
    },
    /// The command's answer cannot be used.
    #[error("the credential command {command} answered with nothing kruised can use: {reason}")]
    Answer {
        /// The command.
        command: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The auth-provider is not one kruised knows, or lacks what it needs.
    #[error("auth-provider {name}: {reason}")]
    Provider {
        /// The provider's name.
        name: String,
        /// What is missing or unsupported.
        reason: String,
    },
}

/// What the kubeconfig's user authenticates with.
pub struct Resolved {
    /// The layer that adds `Authorization` to every request, if the user has a credential
    /// that goes in a header.
    pub layer: Option<AuthLayer>,
    /// A client key and certificate (PEM) that an exec plugin answered with, for the TLS
    /// connection.
    pub identity: Option<Vec<u8>>,
}

/// Reads the user's credentials, running its exec plugin or credential command once.
pub async fn resolve(user: &AuthInfo) -> Result<Resolved, AuthError> {
    let header = |source| {
        Ok(Resolved {
            layer: Some(AuthLayer(Arc::new(source))),
            identity: None,
        })
    };
    if let Some(provider) = &user.auth_provider {
        return header(from_provider(provider).await?);
    }
    if let (Some(name), Some(password)) = (&user.username, &user.password) {
        let value = basic(name, password.expose_secret()).map_err(|_| AuthError::Header {
            what: "user name and password",
        })?;
        return header(Source::Fixed(value));
    }
    if let Some(token) = &user.token {
        return header(Source::Fixed(bearer(token.expose_secret(), "token")?));
    }
    if let Some(path) = &user.token_file {
        let path = PathBuf::from(path);
        let value = read_token_file(&path)?;
        return header(Source::File {
            path,
            cached: Mutex::new((value, Instant::now())),
        });
    }
    let Some(exec) = &user.exec else {
        return Ok(Resolved {
            layer: None,
            identity: None,
        });
    };
    match run_plugin(exec).await? {
        Answer::Identity(pem) => Ok(Resolved {
            layer: None,
            identity: Some(pem),
        }),
        Answer::Token(value, None) => header(Source::Fixed(value)),
        Answer::Token(value, Some(expiry)) => header(Source::Expiring {
            refresh: Refresh::Plugin(Box::new(exec.clone())),
            cached: tokio::sync::Mutex::new((value, expiry)),
        }),
    }
}

/// Adds the user's `Authorization` header to each request, refreshing it where it expires.
#[derive(Clone)]
pub struct AuthLayer(Arc<Source>);

impl<S> Layer<S> for AuthLayer {
    type Service = Authorized<S>;

    fn layer(&self, inner: S) -> Authorized<S> {
        Authorized {
            source: self.0.clone(),
            inner,
        }
    }
}

/// The service of [`AuthLayer`].
#[derive(Clone)]
pub struct Authorized<S> {
    source: Arc<Source>,
    inner: S,
}

impl<S, B> Service<Request<B>> for Authorized<S>
where
    S: Service<Request<B>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<S::Response, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let source = self.source.clone();
        // the ready service goes with the request; a clone waits for the next poll_ready
        let fresh = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, fresh);
        Box::pin(async move {
            let value = source.header().await?;
            req.headers_mut().insert(AUTHORIZATION, value);
            inner.call(req).await.map_err(Into::into)
        })
    }
}

/// Where the header comes from.
enum Source {
    /// The same header on every request.
    Fixed(HeaderValue),
    /// A token file, and the header read from it with when.
    File {
        path: PathBuf,
        cached: Mutex<(HeaderValue, Instant)>,
    },
    /// A token that expires, and how to get the next.
    Expiring {
        refresh: Refresh,
        cached: tokio::sync::Mutex<(HeaderValue, Timestamp)>,
    },
}

/// How an expiring token is replaced.
enum Refresh {
    Plugin(Box<ExecConfig>),
    Gcp(Box<AuthProviderConfig>),
}

impl Source {
    async fn header(&self) -> Result<HeaderValue, AuthError> {
        match self {
            Source::Fixed(value) => Ok(value.clone()),
            Source::File { path, cached } => {
                let mut cached = crate::sync::lock(cached);
                if cached.1.elapsed() >= TOKEN_FILE_REREAD {
                    // a file that went keeps the last token (kubernetes #68164)
                    match read_token_file(path) {
                        Ok(value) => cached.0 = value,
                        Err(e) => tracing::warn!(
                            error = %e,
                            "the token file cannot be read again; the token read before is kept"
                        ),
                    }
                    cached.1 = Instant::now();
                }
                Ok(cached.0.clone())
            }
            Source::Expiring { refresh, cached } => {
                let mut cached = cached.lock().await;
                if Timestamp::now() + REFRESH_BEFORE_EXPIRY >= cached.1 {
                    let (value, expiry) = match refresh {
                        Refresh::Plugin(exec) => match run_plugin(exec).await? {
                            Answer::Token(value, expiry) => (value, expiry),
                            Answer::Identity(_) => {
                                return Err(AuthError::Answer {
                                    command: command_of(exec),
                                    reason: "a client certificate where a token was before".into(),
                                });
                            }
                        },
                        Refresh::Gcp(provider) => run_gcp_command(provider).await?,
                    };
                    // a token that no longer expires is used until kruised restarts
                    *cached = (value, expiry.unwrap_or(Timestamp::MAX));
                }
                Ok(cached.0.clone())
            }
        }
    }
}

/// `Basic` credentials of `user` and `password` (RFC 7617), marked sensitive: the API
/// server's, and a proxy's (`connect`).
pub fn basic(user: &str, password: &str) -> Result<HeaderValue, http::header::InvalidHeaderValue> {
    let pair = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    let mut value = HeaderValue::from_str(&format!("Basic {pair}"))?;
    value.set_sensitive(true);
    Ok(value)
}

fn sensitive(value: &str, what: &'static str) -> Result<HeaderValue, AuthError> {
    let mut value = HeaderValue::from_str(value).map_err(|_| AuthError::Header { what })?;
    value.set_sensitive(true);
    Ok(value)
}

fn bearer(token: &str, what: &'static str) -> Result<HeaderValue, AuthError> {
    let token = token.trim();
    if token.is_empty() {
        return Err(AuthError::Header { what });
    }
    sensitive(&format!("Bearer {token}"), what)
}

fn read_token_file(path: &PathBuf) -> Result<HeaderValue, AuthError> {
    let token = std::fs::read_to_string(path).map_err(|source| AuthError::TokenFile {
        path: path.clone(),
        source,
    })?;
    bearer(&token, "token file's token")
}

/// What a credential command answered.
enum Answer {
    Token(HeaderValue, Option<Timestamp>),
    Identity(Vec<u8>),
}

/// The part of an `ExecCredential` kruised reads.
#[derive(Deserialize)]
struct Credential {
    status: Option<CredentialStatus>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CredentialStatus {
    token: Option<String>,
    client_certificate_data: Option<String>,
    client_key_data: Option<String>,
    expiration_timestamp: Option<String>,
}

fn command_of(exec: &ExecConfig) -> String {
    exec.command.clone().unwrap_or_default()
}

/// Runs the exec plugin as client-go does: its `args` and `env`, `drop-env` removed, the
/// request in `KUBERNETES_EXEC_INFO`, standard error to kruised's, standard input only where it
/// is a terminal and the plugin may use it.
async fn run_plugin(exec: &ExecConfig) -> Result<Answer, AuthError> {
    let command = exec.command.clone().ok_or(AuthError::NoCommand)?;
    let terminal = std::io::stdin().is_terminal();
    let interactive = match exec.interactive_mode {
        Some(ExecInteractiveMode::Never) => false,
        Some(ExecInteractiveMode::Always) if !terminal => {
            return Err(AuthError::NeedsTerminal { command });
        }
        _ => terminal,
    };
    let mut spec = serde_json::Map::new();
    spec.insert("interactive".into(), interactive.into());
    if exec.provide_cluster_info {
        let cluster = exec.cluster.as_ref().ok_or(AuthError::NoClusterInfo)?;
        spec.insert(
            "cluster".into(),
            serde_json::to_value(cluster).map_err(|e| AuthError::Answer {
                command: command.clone(),
                reason: format!("the cluster's details cannot be written: {e}"),
            })?,
        );
    }
    let mut request = serde_json::Map::new();
    if let Some(version) = &exec.api_version {
        request.insert("apiVersion".into(), version.clone().into());
    }
    request.insert("kind".into(), "ExecCredential".into());
    request.insert("spec".into(), spec.into());

    let mut cmd = tokio::process::Command::new(&command);
    cmd.args(exec.args.iter().flatten());
    for env in exec.env.iter().flatten() {
        if let (Some(name), Some(value)) = (env.get("name"), env.get("value")) {
            cmd.env(name, value);
        }
    }
    cmd.env(
        "KUBERNETES_EXEC_INFO",
        serde_json::Value::Object(request).to_string(),
    );
    for name in exec.drop_env.iter().flatten() {
        cmd.env_remove(name);
    }
    cmd.stdin(if interactive {
        Stdio::inherit()
    } else {
        Stdio::null()
    });
    let stdout = output(cmd, &command).await?;
    read_answer(&command, &stdout)
}

/// What `cmd` (`command`) prints on standard output, its standard error going to kruised's;
/// an error if it cannot start or does not exit 0. Killed if the request waiting on it goes.
async fn output(mut cmd: tokio::process::Command, command: &str) -> Result<Vec<u8>, AuthError> {
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    let out = cmd.output().await.map_err(|source| AuthError::Start {
        command: command.to_string(),
        source,
    })?;
    if !out.status.success() {
        return Err(AuthError::Failed {
            command: command.to_string(),
            status: out.status,
        });
    }
    Ok(out.stdout)
}

/// An exec plugin's answer: an `ExecCredential` in JSON (or YAML, which client-go's reader also
/// takes).
fn read_answer(command: &str, stdout: &[u8]) -> Result<Answer, AuthError> {
    let bad = |reason: String| AuthError::Answer {
        command: command.to_string(),
        reason,
    };
    let text = std::str::from_utf8(stdout).map_err(|e| bad(format!("not UTF-8: {e}")))?;
    let credential: Credential = crate::yaml::from_str(text)
        .map_err(|e| bad(e.to_string()))?
        .ok_or_else(|| bad("no output".into()))?;
    let status = credential
        .status
        .ok_or_else(|| bad("an ExecCredential without status".into()))?;
    let expiry = status
        .expiration_timestamp
        .as_deref()
        .map(|t| {
            t.parse::<Timestamp>()
                .map_err(|e| bad(format!("expirationTimestamp {t:?}: {e}")))
        })
        .transpose()?;
    match (
        status.client_certificate_data,
        status.client_key_data,
        status.token,
    ) {
        (Some(cert), Some(key), _) => {
            let mut pem = key.into_bytes();
            pem.push(b'\n');
            pem.extend_from_slice(cert.as_bytes());
            pem.push(b'\n');
            Ok(Answer::Identity(pem))
        }
        (_, _, Some(token)) => Ok(Answer::Token(
            bearer(&token, "exec plugin's token")?,
            expiry,
        )),
        _ => Err(bad(
            "neither a token nor a client certificate and key in its status".into(),
        )),
    }
}

/// The token of an `auth-provider`: `oidc`'s `id-token` (kube without its `oidc` feature does
/// the same: no refresh), `gcp`'s `id-token`, its `access-token` until its `expiry`, or its
/// `cmd-path` command.
async fn from_provider(provider: &AuthProviderConfig) -> Result<Source, AuthError> {
    let refused = |reason: &str| AuthError::Provider {
        name: provider.name.clone(),
        reason: reason.to_string(),
    };
    let config = &provider.config;
    match provider.name.as_str() {
        "oidc" => {
            let token = config
                .get("id-token")
                .ok_or_else(|| refused("no id-token"))?;
            Ok(Source::Fixed(bearer(token, "oidc id-token")?))
        }
        "gcp" => {
            if let Some(token) = config.get("id-token") {
                return Ok(Source::Fixed(bearer(token, "gcp id-token")?));
            }
            if let (Some(token), Some(expiry)) = (config.get("access-token"), config.get("expiry"))
            {
                let expiry = expiry
                    .parse::<Timestamp>()
                    .map_err(|e| refused(&format!("expiry {expiry:?}: {e}")))?;
                if Timestamp::now() + REFRESH_BEFORE_EXPIRY < expiry {
                    return Ok(Source::Expiring {
                        refresh: Refresh::Gcp(Box::new(provider.clone())),
                        cached: tokio::sync::Mutex::new((
                            bearer(token, "gcp access-token")?,
                            expiry,
                        )),
                    });
                }
            }
            if !config.contains_key("cmd-path") {
                return Err(refused(
                    "no id-token, no unexpired access-token and no cmd-path; Google's \
                     application credentials are not read: use gke-gcloud-auth-plugin as an \
                     exec plugin",
                ));
            }
            match run_gcp_command(provider).await? {
                (value, None) => Ok(Source::Fixed(value)),
                (value, Some(expiry)) => Ok(Source::Expiring {
                    refresh: Refresh::Gcp(Box::new(provider.clone())),
                    cached: tokio::sync::Mutex::new((value, expiry)),
                }),
            }
        }
        "azure" => Err(refused(
            "not supported; use https://github.com/Azure/kubelogin as an exec plugin",
        )),
        _ => Err(refused("not supported; use an exec plugin")),
    }
}

/// Runs a `gcp` provider's `cmd-path` with its `cmd-args` (split at spaces, as kube and
/// client-go did), without the variables in `cmd-drop-env`, and reads its token (and expiry)
/// from the JSON it prints at `token-key` (and `expiry-key`), or takes all it prints.
async fn run_gcp_command(
    provider: &AuthProviderConfig,
) -> Result<(HeaderValue, Option<Timestamp>), AuthError> {
    let config = &provider.config;
    let command = config.get("cmd-path").cloned().unwrap_or_default();
    let mut cmd = tokio::process::Command::new(&command);
    if let Some(args) = config.get("cmd-args") {
        cmd.args(args.split_whitespace());
    }
    if let Some(names) = config.get("cmd-drop-env") {
        for name in names.split_whitespace() {
            cmd.env_remove(name);
        }
    }
    cmd.stdin(Stdio::null());
    let stdout = output(cmd, &command).await?;
    let bad = |reason: String| AuthError::Answer {
        command: command.clone(),
        reason,
    };
    let Some(token_key) = config.get("token-key") else {
        let token = std::str::from_utf8(&stdout).map_err(|e| bad(e.to_string()))?;
        return Ok((bearer(token, "gcp command's token")?, None));
    };
    let json: serde_json::Value =
        serde_json::from_slice(&stdout).map_err(|e| bad(format!("not JSON: {e}")))?;
    let token = string_at(&json, token_key).map_err(|e| bad(format!("token-key: {e}")))?;
    let expiry = match config.get("expiry-key") {
        None => None,
        Some(key) => {
            let at = string_at(&json, key).map_err(|e| bad(format!("expiry-key: {e}")))?;
            Some(
                at.parse::<Timestamp>()
                    .map_err(|e| bad(format!("expiry {at:?}: {e}")))?,
            )
        }
    };
    Ok((bearer(token, "gcp command's token")?, expiry))
}

/// The string at a dotted path of `json`: `{.credential.access_token}`, `$.a.b`, `a.b[0].c`.
/// Other JSONPath (filters, wildcards, recursion) is refused by name.
fn string_at<'a>(json: &'a serde_json::Value, path: &str) -> Result<&'a str, String> {
    let trimmed = path.trim_matches(|c| c == '"' || c == '{' || c == '}');
    let trimmed = trimmed.strip_prefix('$').unwrap_or(trimmed);
    let trimmed = trimmed.strip_prefix('.').unwrap_or(trimmed);
    let unsupported = || {
        format!("{path:?}: kruised reads dotted paths with indexes ({{.a.b[0].c}}), not this form")
    };
    let mut at = json;
    for segment in trimmed.split('.') {
        let (name, mut indexes) = match segment.find('[') {
            Some(i) => (&segment[..i], &segment[i..]),
            None => (segment, ""),
        };
        if name.is_empty() && indexes.is_empty() {
            return Err(unsupported());
        }
        if !name.is_empty() {
            if name.contains(['*', '?', '@', '(', ')', ' ']) {
                return Err(unsupported());
            }
            at = at
                .get(name)
                .ok_or_else(|| format!("{path:?}: no {name:?}"))?;
        }
        while !indexes.is_empty() {
            let close = indexes.find(']').ok_or_else(unsupported)?;
            let index: usize = indexes[1..close].parse().map_err(|_| unsupported())?;
            at = at
                .get(index)
                .ok_or_else(|| format!("{path:?}: no element {index}"))?;
            indexes = &indexes[close + 1..];
            if !indexes.is_empty() && !indexes.starts_with('[') {
                return Err(unsupported());
            }
        }
    }
    at.as_str()
        .ok_or_else(|| format!("{path:?} is not a string"))
}

#[cfg(test)]
mod tests;
