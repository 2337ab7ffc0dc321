//! kubelet credential provider plugins, as kruise-daemon runs them (`--plugin-config-file`,
//! `--plugin-bin-dir`): for an image that one of a provider's `matchImages` matches, and for
//! which no pull secret had a credential, the provider's executable is run with the kubelet's
//! exec protocol and its answer is cached.
//!
//! - The config is the kubelet's `CredentialProviderConfig` (`kubelet.config.k8s.io/v1`, also
//!   `v1beta1`/`v1alpha1`), YAML or JSON; unknown fields are ignored, as the kubelet's decoder
//!   does. A missing file means no plugins; a broken one is a clear error and the daemon goes
//!   on without plugins.
//! - The plugin gets a `CredentialProviderRequest` (`{"image": "<repository>"}`) on stdin and
//!   answers a `CredentialProviderResponse` on stdout; its `env` and `args` come from the
//!   config, it is killed after [`PLUGIN_TIMEOUT`].
//! - Answers are cached by `cacheKeyType` (`Image`, `Registry`, `Global`) for `cacheDuration`
//!   (else the provider's `defaultCacheDuration`; zero: not cached).
//! - Credentials never reach a log line or an error message.
//! - What went wrong with a plugin (its exit status, at most [`STDERR_KEPT`] bytes of its stderr
//!   with control characters removed, a bad answer) goes to the daemon's log only. Statuses and
//!   events, which the tag's owners in every namespace read, say only
//!   "the credential provider <name> failed; see kruised's log on node <node>": a plugin's stderr
//!   can hold anything (tokens, internal hosts, terminal escapes).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Mutex;
use std::time::Duration;

use serde::Deserialize;
use tokio::io::AsyncWriteExt;
use tokio::time::Instant;

use super::keyring::{Keyring, urls_match};
use crate::controller::text::one_line;

/// How long a plugin may take (the kubelet's exec timeout).
pub const PLUGIN_TIMEOUT: Duration = Duration::from_secs(60);
/// How many bytes of a failed plugin's stderr are kept for the log; the rest is read and
/// dropped (so the plugin never blocks on a full pipe).
pub const STDERR_KEPT: usize = 256;
/// The longest answer read from a plugin's stdout (the kubelet reads it whole; answers are a
/// few hundred bytes).
const STDOUT_MAX: usize = 1 << 20;
/// The longest description of a plugin's failure in the log.
const DETAIL_MAX: usize = 512;
/// The config's API group.
const CONFIG_GROUP: &str = "kubelet.config.k8s.io";
/// The plugin protocol's API group.
const PROTOCOL_GROUP: &str = "credentialprovider.kubelet.k8s.io";
/// Protocol versions the kubelet speaks.
const PROTOCOL_VERSIONS: [&str; 3] = ["v1", "v1beta1", "v1alpha1"];

/// Why the plugins cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// The plugin directory does not exist.
    #[error("plugin binary directory {0} does not exist")]
    NoBinDir(PathBuf),
    /// The config file cannot be read.
    #[error("cannot read the credential provider config {path}: {error}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// The config file is not a valid `CredentialProviderConfig`.
    #[error("invalid credential provider config {path}: {error}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        error: PluginConfigError,
    },
}

/// What is wrong with a `CredentialProviderConfig`, as the kubelet's checks say it.
#[derive(Debug, thiserror::Error)]
pub enum PluginConfigError {
    /// Neither YAML nor JSON of the config's shape.
    #[error("{0}")]
    Decode(crate::yaml::YamlError),
    /// An empty file (or comments only).
    #[error("no document")]
    Empty,
    /// Another kind or group.
    #[error("want kind CredentialProviderConfig of {CONFIG_GROUP}, got {kind:?} {api_version:?}")]
    Kind {
        /// The kind it gives.
        kind: String,
        /// The `apiVersion` it gives.
        api_version: String,
    },
    /// No provider.
    #[error("at least 1 item in plugins is required")]
    NoProviders,
    /// A name that cannot name an executable in the plugin directory.
    #[error("invalid provider name {0:?}")]
    InvalidName(String),
    /// Two providers of one name.
    #[error("duplicate provider name {0:?}")]
    DuplicateName(String),
    /// A protocol version the kubelet does not speak.
    #[error(
        "provider {name}: apiVersion {api_version:?} is not one of {PROTOCOL_GROUP}/{}",
        PROTOCOL_VERSIONS.join(", ")
    )]
    ApiVersion {
        /// The provider.
        name: String,
        /// Its `apiVersion`.
        api_version: String,
    },
    /// No `matchImages`.
    #[error("provider {0}: matchImages is required")]
    NoMatchImages(String),
    /// No `defaultCacheDuration`.
    #[error("provider {0}: defaultCacheDuration is required")]
    NoDefaultCacheDuration(String),
    /// A `defaultCacheDuration` that is no duration.
    #[error("provider {name}: defaultCacheDuration: {error}")]
    DefaultCacheDuration {
        /// The provider.
        name: String,
        /// Why.
        error: DurationError,
    },
    /// The provider's executable is missing from the plugin directory.
    #[error("plugin binary executable {} does not exist", .0.display())]
    NoExecutable(PathBuf),
}

/// Why a text is no Go duration.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// Not a number and a unit, repeated.
    #[error("invalid duration {0:?}")]
    Invalid(String),
    /// A number without its unit.
    #[error("invalid duration {0:?}: missing unit")]
    MissingUnit(String),
    /// A unit Go does not know.
    #[error("invalid duration {text:?}: unknown unit {unit:?}")]
    UnknownUnit {
        /// The text.
        text: String,
        /// The unit.
        unit: String,
    },
    /// More than a duration holds.
    #[error("invalid duration {text:?}: {reason}")]
    OutOfRange {
        /// The text.
        text: String,
        /// Why.
        reason: std::time::TryFromFloatSecsError,
    },
}

/// Why a plugin's answer cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ResponseError {
    /// Not the JSON of a `CredentialProviderResponse`.
    #[error("cannot decode the plugin's answer on stdout: {0}")]
    Decode(serde_json::Error),
    /// Another protocol version than the configured one.
    #[error("the plugin answered apiVersion {got:?}, not the configured {want:?}")]
    ApiVersion {
        /// What it answered.
        got: String,
        /// What the config says.
        want: String,
    },
    /// Another kind.
    #[error("the plugin answered kind {0:?}, not CredentialProviderResponse")]
    Kind(String),
    /// A cache key type the kubelet does not know.
    #[error("the plugin answered cacheKeyType {0:?}; want Image, Registry or Global")]
    CacheKeyType(String),
    /// A `cacheDuration` that is no duration.
    #[error("cacheDuration: {0}")]
    CacheDuration(DurationError),
}

/// Why running a plugin gave no credentials: for the daemon's log only (never a status or an
/// event, see the module).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The executable could not be started.
    #[error("cannot run {}: {error}", .executable.display())]
    Spawn {
        /// The executable.
        executable: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// No answer within [`PLUGIN_TIMEOUT`].
    #[error("no answer within {PLUGIN_TIMEOUT:?}; killed")]
    TimedOut,
    /// Waiting for the plugin failed.
    #[error("running the plugin: {0}")]
    Wait(std::io::Error),
    /// It exited with an error: its status and the start of its stderr, cleaned.
    #[error("the plugin exited with {status}: {stderr}{}", if *.cut { " [...]" } else { "" })]
    Exited {
        /// Its exit status.
        status: std::process::ExitStatus,
        /// The start of its stderr, on one line.
        stderr: String,
        /// Whether stderr went on past what was kept.
        cut: bool,
    },
    /// Its stdout could not be read.
    #[error("reading the plugin's answer: {0}")]
    Read(std::io::Error),
    /// Its answer is longer than any answer is.
    #[error("the plugin's answer is longer than {STDOUT_MAX} bytes")]
    TooLong,
    /// Its answer cannot be used.
    #[error(transparent)]
    Response(#[from] ResponseError),
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ConfigFile {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    providers: Vec<ProviderSpec>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ProviderSpec {
    #[serde(default)]
    name: String,
    #[serde(default)]
    match_images: Vec<String>,
    #[serde(default)]
    default_cache_duration: Option<String>,
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: Vec<EnvVar>,
}

#[derive(Clone, Debug, Deserialize)]
struct EnvVar {
    #[serde(default)]
    name: String,
    #[serde(default)]
    value: String,
}

/// A plugin's answer; no `Debug`: it holds passwords.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Response {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    cache_key_type: String,
    #[serde(default)]
    cache_duration: Option<String>,
    #[serde(default)]
    auth: BTreeMap<String, AuthEntry>,
}

#[derive(Clone, Deserialize)]
struct AuthEntry {
    #[serde(default)]
    username: String,
    #[serde(default)]
    password: String,
}

/// What a plugin answered, kept until it expires.
#[derive(Clone)]
struct Cached {
    expires: Instant,
    auth: BTreeMap<String, AuthEntry>,
}

/// One provider: its config and its cache.
struct Provider {
    spec: ProviderSpec,
    executable: PathBuf,
    default_cache: Duration,
    cache: Mutex<HashMap<String, Cached>>,
}

/// The configured plugins.
pub struct Plugins {
    providers: Vec<Provider>,
    /// The node, named in the message of a failure.
    node: String,
}

impl std::fmt::Debug for Plugins {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.providers.iter().map(|p| &p.spec.name))
            .finish()
    }
}

/// Go's `time.ParseDuration` for the forms configs use: `12h`, `6h0m0s`, `1m30s`, `500ms`, `0`.
pub fn parse_go_duration(s: &str) -> Result<Duration, DurationError> {
    let s = s.trim();
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    let mut rest = s;
    let mut total = 0f64;
    if rest.is_empty() {
        return Err(DurationError::Invalid(s.to_string()));
    }
    while !rest.is_empty() {
        let n = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| DurationError::MissingUnit(s.to_string()))?;
        let (num, tail) = rest.split_at(n);
        let value: f64 = num
            .parse()
            .map_err(|_| DurationError::Invalid(s.to_string()))?;
        let u = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, next) = tail.split_at(u);
        let scale = match unit {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => {
                return Err(DurationError::UnknownUnit {
                    text: s.to_string(),
                    unit: unit.to_string(),
                });
            }
        };
        total += value * scale;
        rest = next;
    }
    Duration::try_from_secs_f64(total).map_err(|reason| DurationError::OutOfRange {
        text: s.to_string(),
        reason,
    })
}

/// Parses and checks a `CredentialProviderConfig` (YAML or JSON) as the kubelet does, all but
/// the executables: each provider with its `defaultCacheDuration`, in file order, or what is
/// wrong.
fn parse_config(text: &str) -> Result<Vec<(ProviderSpec, Duration)>, PluginConfigError> {
    let file: ConfigFile = crate::yaml::from_str(text)
        .map_err(PluginConfigError::Decode)?
        .ok_or(PluginConfigError::Empty)?;
    let (group, _) = file.api_version.split_once('/').unwrap_or(("", ""));
    if file.kind != "CredentialProviderConfig" || group != CONFIG_GROUP {
        return Err(PluginConfigError::Kind {
            kind: file.kind,
            api_version: file.api_version,
        });
    }
    if file.providers.is_empty() {
        return Err(PluginConfigError::NoProviders);
    }
    let mut providers: Vec<(ProviderSpec, Duration)> = Vec::new();
    for spec in file.providers {
        let name = &spec.name;
        if name.is_empty() || name.contains(['/', ' ']) || name == "." || name == ".." {
            return Err(PluginConfigError::InvalidName(name.clone()));
        }
        if providers.iter().any(|(p, _)| &p.name == name) {
            return Err(PluginConfigError::DuplicateName(name.clone()));
        }
        let version_ok = spec
            .api_version
            .split_once('/')
            .is_some_and(|(g, v)| g == PROTOCOL_GROUP && PROTOCOL_VERSIONS.contains(&v));
        if !version_ok {
            return Err(PluginConfigError::ApiVersion {
                name: name.clone(),
                api_version: spec.api_version.clone(),
            });
        }
        if spec.match_images.is_empty() {
            return Err(PluginConfigError::NoMatchImages(name.clone()));
        }
        let default_cache = match spec.default_cache_duration.as_deref() {
            Some(d) => {
                parse_go_duration(d).map_err(|error| PluginConfigError::DefaultCacheDuration {
                    name: name.clone(),
                    error,
                })?
            }
            None => return Err(PluginConfigError::NoDefaultCacheDuration(name.clone())),
        };
        providers.push((spec, default_cache));
    }
    Ok(providers)
}

/// Decodes a plugin's answer on stdout and checks that it is the `CredentialProviderResponse`
/// of `api_version`. The error never holds a credential.
fn parse_response(stdout: &[u8], api_version: &str) -> Result<Response, ResponseError> {
    let response: Response = serde_json::from_slice(stdout).map_err(ResponseError::Decode)?;
    if response.api_version != api_version {
        return Err(ResponseError::ApiVersion {
            got: response.api_version,
            want: api_version.to_string(),
        });
    }
    if response.kind != "CredentialProviderResponse" {
        return Err(ResponseError::Kind(response.kind));
    }
    Ok(response)
}

/// The pure parsers of this module, for the fuzz targets and property tests: the providers'
/// names and cache durations of a config, and the registry locations (with the cache key type
/// and duration) of a plugin's answer.
pub mod parse {
    use std::time::Duration;

    use super::{DurationError, PluginConfigError, ResponseError};

    /// [`super::Plugins::load`]'s checks of a config's text, without the executables.
    pub fn config(text: &str) -> Result<Vec<(String, Duration)>, PluginConfigError> {
        Ok(super::parse_config(text)?
            .into_iter()
            .map(|(spec, d)| (spec.name, d))
            .collect())
    }

    /// What the daemon reads from a plugin's answer, credentials left out.
    #[derive(Debug)]
    pub struct Answer {
        /// `Image`, `Registry` or `Global` (anything else is refused when the answer is used).
        pub cache_key_type: String,
        /// The answer's `cacheDuration`, parsed, when it gives one.
        pub cache_duration: Option<Result<Duration, DurationError>>,
        /// The registry locations it holds credentials for.
        pub locations: Vec<String>,
    }

    /// A plugin's answer as the daemon reads it.
    pub fn response(stdout: &[u8], api_version: &str) -> Result<Answer, ResponseError> {
        let r = super::parse_response(stdout, api_version)?;
        Ok(Answer {
            cache_duration: r.cache_duration.as_deref().map(super::parse_go_duration),
            cache_key_type: r.cache_key_type,
            locations: r.auth.into_keys().collect(),
        })
    }
}

fn invalid(path: &Path, error: PluginConfigError) -> PluginError {
    PluginError::Invalid {
        path: path.to_path_buf(),
        error,
    }
}

impl Plugins {
    /// Reads `config` and checks every provider's executable in `bin_dir`, as the kubelet's
    /// `RegisterCredentialProviderPlugins`. `Ok(None)`: no config file, no plugins.
    pub fn load(config: &Path, bin_dir: &Path) -> Result<Option<Plugins>, PluginError> {
        let text = match std::fs::read_to_string(config) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(error) => {
                return Err(PluginError::Read {
                    path: config.to_path_buf(),
                    error,
                });
            }
        };
        if !bin_dir.is_dir() {
            return Err(PluginError::NoBinDir(bin_dir.to_path_buf()));
        }
        let specs = parse_config(&text).map_err(|error| invalid(config, error))?;
        let mut providers: Vec<Provider> = Vec::new();
        for (spec, default_cache) in specs {
            let name = &spec.name;
            let executable = bin_dir.join(name);
            if !is_executable(&executable) {
                return Err(invalid(config, PluginConfigError::NoExecutable(executable)));
            }
            providers.push(Provider {
                spec,
                executable,
                default_cache,
                cache: Mutex::new(HashMap::new()),
            });
        }
        providers.sort_by(|a, b| a.spec.name.cmp(&b.spec.name));
        Ok(Some(Plugins {
            providers,
            node: String::new(),
        }))
    }

    /// The same plugins on `node`, whose name the message of a failure gives.
    pub fn on_node(mut self, node: &str) -> Self {
        self.node = node.to_string();
        self
    }

    /// The provider names, for the log.
    pub fn names(&self) -> Vec<&str> {
        self.providers
            .iter()
            .map(|p| p.spec.name.as_str())
            .collect()
    }

    /// The credentials the matching providers give for `image` (a repository without tag),
    /// as a keyring, and one line per provider that failed: only [`Plugins::failure_message`],
    /// what went wrong is logged.
    pub async fn lookup(&self, image: &str) -> (Keyring, Vec<String>) {
        let mut keyring = Keyring::default();
        let mut problems = Vec::new();
        for p in &self.providers {
            if !p.spec.match_images.iter().any(|m| urls_match(m, image)) {
                continue;
            }
            match p.credentials(image).await {
                Ok(auth) => {
                    for (location, a) in auth {
                        keyring.add(&location, &a.username, &a.password);
                    }
                }
                Err(e) => {
                    let detail = one_line(&e.to_string(), DETAIL_MAX);
                    tracing::warn!(provider = %p.spec.name, %image, error = %detail, "credential provider plugin failed");
                    problems.push(self.failure_message(&p.spec.name));
                }
            }
        }
        (keyring, problems)
    }
}

impl Plugins {
    /// What statuses and events say of a failed provider: its name and where to look, nothing
    /// the plugin wrote.
    pub fn failure_message(&self, provider: &str) -> String {
        if self.node.is_empty() {
            format!("the credential provider {provider} failed; see kruised's log")
        } else {
            format!(
                "the credential provider {provider} failed; see kruised's log on node {}",
                self.node
            )
        }
    }
}

/// Reads `from` to its end, keeping the first `max` bytes; whether more came.
async fn read_bounded(
    from: Option<impl tokio::io::AsyncRead + Unpin>,
    max: usize,
) -> std::io::Result<(Vec<u8>, bool)> {
    use tokio::io::AsyncReadExt;
    let Some(mut from) = from else {
        return Ok((Vec::new(), false));
    };
    let mut kept = Vec::new();
    let mut more = false;
    let mut buf = [0u8; 4096];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            return Ok((kept, more));
        }
        let room = max.saturating_sub(kept.len());
        kept.extend_from_slice(&buf[..n.min(room)]);
        more |= n > room;
    }
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The registry part of an image (`host[:port]`), the `Registry` cache key.
fn registry_of(image: &str) -> &str {
    image.split('/').next().unwrap_or(image)
}

const GLOBAL_KEY: &str = "global";

impl Provider {
    fn cached(&self, image: &str) -> Option<BTreeMap<String, AuthEntry>> {
        let mut cache = crate::sync::lock(&self.cache);
        let now = Instant::now();
        cache.retain(|_, c| c.expires > now);
        [image, registry_of(image), GLOBAL_KEY]
            .iter()
            .find_map(|k| cache.get(*k).map(|c| c.auth.clone()))
    }

    async fn credentials(&self, image: &str) -> Result<BTreeMap<String, AuthEntry>, RunError> {
        if let Some(auth) = self.cached(image) {
            return Ok(auth);
        }
        let response = self.exec(image).await?;
        let key = match response.cache_key_type.as_str() {
            "Image" => image,
            "Registry" => registry_of(image),
            "Global" => GLOBAL_KEY,
            other => return Err(ResponseError::CacheKeyType(other.to_string()).into()),
        };
        let ttl = match response.cache_duration.as_deref() {
            Some(d) => parse_go_duration(d).map_err(ResponseError::CacheDuration)?,
            None => self.default_cache,
        };
        if !ttl.is_zero() {
            crate::sync::lock(&self.cache).insert(
                key.to_string(),
                Cached {
                    expires: crate::k8s::time::later(Instant::now(), ttl),
                    auth: response.auth.clone(),
                },
            );
        }
        Ok(response.auth)
    }

    async fn exec(&self, image: &str) -> Result<Response, RunError> {
        let request = serde_json::json!({
            "kind": "CredentialProviderRequest",
            "apiVersion": self.spec.api_version,
            "image": image,
        });
        let mut cmd = tokio::process::Command::new(&self.executable);
        cmd.args(&self.spec.args)
            .envs(self.spec.env.iter().map(|e| (&e.name, &e.value)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().map_err(|error| RunError::Spawn {
            executable: self.executable.clone(),
            error,
        })?;
        if let Some(mut stdin) = child.stdin.take() {
            let body = format!("{request}\n");
            // a plugin that does not read its input is its own business
            let _ = stdin.write_all(body.as_bytes()).await;
        }
        let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
        let run = async {
            tokio::join!(
                read_bounded(stdout, STDOUT_MAX),
                read_bounded(stderr, STDERR_KEPT),
                child.wait()
            )
        };
        // on the timeout the child is dropped, and killed (`kill_on_drop`)
        let (stdout, stderr, status) = tokio::time::timeout(PLUGIN_TIMEOUT, run)
            .await
            .map_err(|_| RunError::TimedOut)?;
        let status = status.map_err(RunError::Wait)?;
        if !status.success() {
            let (stderr, cut) = stderr.unwrap_or_default();
            return Err(RunError::Exited {
                status,
                stderr: one_line(&String::from_utf8_lossy(&stderr), STDERR_KEPT),
                cut,
            });
        }
        let (stdout, more) = stdout.map_err(RunError::Read)?;
        if more {
            return Err(RunError::TooLong);
        }
        Ok(parse_response(&stdout, &self.spec.api_version)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_parse() {
        assert_eq!(
            parse_go_duration("12h").unwrap(),
            Duration::from_secs(43_200)
        );
        assert_eq!(
            parse_go_duration("6h0m0s").unwrap(),
            Duration::from_secs(21_600)
        );
        assert_eq!(parse_go_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(
            parse_go_duration("500ms").unwrap(),
            Duration::from_millis(500)
        );
        assert_eq!(parse_go_duration("0").unwrap(), Duration::ZERO);
        for bad in ["", "12", "1x", "h"] {
            assert!(parse_go_duration(bad).is_err(), "{bad:?}");
        }
    }

    fn write(dir: &Path, name: &str, text: &str, mode: u32) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    const CONFIG: &str = "apiVersion: kubelet.config.k8s.io/v1
kind: CredentialProviderConfig
providers:
  - name: lab-login
    matchImages: [\"127.0.0.1:5001\", \"*.example.com\"]
    defaultCacheDuration: 10m
    apiVersion: credentialprovider.kubelet.k8s.io/v1
    args: [get-credentials]
    env: [{name: PLUGIN_USER, value: lab}]
    tokenAttributes: {serviceAccountTokenAudience: ignored}
";

    #[test]
    fn a_missing_config_means_no_plugins_and_a_broken_one_says_why() {
        let dir = tempfile::tempdir().unwrap();
        assert!(
            Plugins::load(&dir.path().join("none.yaml"), dir.path())
                .unwrap()
                .is_none()
        );
        let cfg = write(dir.path(), "c.yaml", "kind: Nope\n", 0o644);
        let err = Plugins::load(&cfg, dir.path()).unwrap_err().to_string();
        assert!(err.contains("CredentialProviderConfig"), "{err}");
        let cfg = write(dir.path(), "c.yaml", CONFIG, 0o644);
        let err = Plugins::load(&cfg, dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("lab-login") && err.contains("does not exist"),
            "{err}"
        );
        let err = Plugins::load(&cfg, &dir.path().join("bin"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("directory"), "{err}");
    }

    #[tokio::test]
    async fn a_plugin_answer_is_used_for_matching_images_and_cached_by_registry() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("calls");
        // the plugin records its request, args and env, then answers for the registry
        let script = format!(
            "#!/bin/sh\ncat >> {log}\necho \" $1 $PLUGIN_USER\" >> {log}\n\
             echo '{{\"kind\":\"CredentialProviderResponse\",\"apiVersion\":\"credentialprovider.kubelet.k8s.io/v1\",\
             \"cacheKeyType\":\"Registry\",\"auth\":{{\"127.0.0.1:5001\":{{\"username\":\"u\",\"password\":\"p4ss\"}}}}}}'\n",
            log = log.display()
        );
        write(dir.path(), "lab-login", &script, 0o755);
        let cfg = write(dir.path(), "c.yaml", CONFIG, 0o644);
        let plugins = Plugins::load(&cfg, dir.path()).unwrap().unwrap();
        assert_eq!(plugins.names(), ["lab-login"]);

        let (keyring, problems) = plugins.lookup("127.0.0.1:5001/secure/busybox").await;
        assert!(problems.is_empty(), "{problems:?}");
        let creds = keyring.lookup("127.0.0.1:5001/secure/busybox");
        assert_eq!(creds.len(), 1);
        assert_eq!(
            (creds[0].username.as_str(), creds[0].password.as_str()),
            ("u", "p4ss")
        );
        // cached by registry: another repository there runs no plugin
        plugins.lookup("127.0.0.1:5001/other").await;
        let calls = std::fs::read_to_string(&log).unwrap();
        assert_eq!(
            calls.matches("CredentialProviderRequest").count(),
            1,
            "{calls}"
        );
        assert!(
            calls.contains("\"image\":\"127.0.0.1:5001/secure/busybox\""),
            "{calls}"
        );
        assert!(
            calls.contains(" get-credentials lab"),
            "args and env: {calls}"
        );
        // an image no matchImages matches runs nothing
        let (keyring, _) = plugins.lookup("docker.io/library/nginx").await;
        assert!(keyring.is_empty());
    }

    #[tokio::test]
    async fn a_wrong_answer_is_logged_without_credentials_and_reported_generically() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "lab-login",
            "#!/bin/sh\necho '{\"kind\":\"CredentialProviderResponse\",\"apiVersion\":\"credentialprovider.kubelet.k8s.io/v1beta1\",\"cacheKeyType\":\"Image\",\"auth\":{\"x\":{\"username\":\"u\",\"password\":\"SECRET\"}}}'\n",
            0o755,
        );
        let cfg = write(dir.path(), "c.yaml", CONFIG, 0o644);
        let plugins = Plugins::load(&cfg, dir.path()).unwrap().unwrap();
        let ((keyring, problems), log) =
            logged(plugins.lookup("127.0.0.1:5001/secure/busybox")).await;
        assert!(keyring.is_empty());
        assert_eq!(
            problems,
            ["the credential provider lab-login failed; see kruised's log"],
            "no node name given: the message still says where to look"
        );
        assert!(log.contains("apiVersion"), "the log says why: {log}");
        assert!(!log.contains("SECRET"), "{log}");
    }

    /// Log lines written while `f` runs on this thread.
    async fn logged<T>(f: impl std::future::Future<Output = T>) -> (T, String) {
        #[derive(Clone, Default)]
        struct Buf(std::sync::Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Buf {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buf = Buf::default();
        let writer = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        let guard = tracing::subscriber::set_default(subscriber);
        let out = f.await;
        drop(guard);
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        (out, text)
    }

    #[tokio::test]
    async fn a_failed_plugins_stderr_reaches_the_log_bounded_and_cleaned_and_no_status_or_event() {
        // a plugin that prints a token, a terminal escape and a flood on stderr, then fails
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "lab-login",
            "#!/bin/sh\nprintf 'boom token=tk-123\\033[31m\\nsecond line\\n' >&2\n\
             head -c 200000 /dev/zero | tr '\\0' x >&2\nexit 3\n",
            0o755,
        );
        let cfg = write(dir.path(), "c.yaml", CONFIG, 0o644);
        let plugins = Plugins::load(&cfg, dir.path())
            .unwrap()
            .unwrap()
            .on_node("node-1");
        let ((keyring, problems), log) = logged(plugins.lookup("a.example.com/app")).await;
        assert!(keyring.is_empty());
        // what statuses and events get (task.rs puts problems in the tag's message and events)
        assert_eq!(
            problems,
            ["the credential provider lab-login failed; see kruised's log on node node-1"]
        );
        // what the log gets: the exit status and the start of stderr, one line, bounded
        let line = log
            .lines()
            .find(|l| l.contains("credential provider plugin failed"))
            .unwrap_or_else(|| panic!("no log line: {log}"));
        assert!(line.contains("exit status: 3"), "{line}");
        assert!(line.contains("boom token=tk-123"), "{line}");
        assert!(line.contains("second line"), "newlines are removed: {line}");
        assert!(!line.contains('\u{1b}'), "escapes are removed: {line:?}");
        assert!(line.contains("[...]"), "{line}");
        let xs = line.matches('x').count();
        assert!(
            (100..STDERR_KEPT).contains(&xs),
            "{xs} bytes of the flood kept: {line}"
        );
    }
}
