//! Pull secrets: the Secrets a NodeImage's `pullSecrets` name, read from the daemon's config
//! namespace (`kruise-daemon-config` by default: since kruise 1.5 the daemon may read secrets
//! only there, and the manager copies ImagePullJob secrets into it), turned into a [`Keyring`].
//!
//! - Secrets are read by name from the config namespace, whatever namespace the reference
//!   names (kruise-daemon has no access elsewhere either).
//! - A secret read is cached for [`SECRET_TTL`]; a missing secret is not cached, so one the
//!   manager creates later is found on the next attempt. [`SecretStore::invalidate`] drops
//!   entries after a failed pull, so a corrected secret is read again before the retry.
//! - `.dockerconfigjson` and `.dockercfg` are both read, whatever the Secret's `type` says
//!   (the kubelet insists on the type; a secret copied by hand often has `Opaque`).
//! - Problems (missing secret, unreadable data, API errors) do not stop the pull: they are
//!   returned as text for the tag's message, and the pull goes on with the credentials found.
//!   kruise-daemon skips a missing secret silently.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use tokio::time::Instant;

use super::credprovider::Plugins;
use super::keyring::Keyring;
use crate::k8s::crd::ReferenceObject;

/// How long a secret read is trusted.
pub const SECRET_TTL: Duration = Duration::from_secs(300);
/// The data key of a `kubernetes.io/dockerconfigjson` secret.
const DOCKER_CONFIG_JSON_KEY: &str = ".dockerconfigjson";
/// The data key of a legacy `kubernetes.io/dockercfg` secret.
const DOCKER_CFG_KEY: &str = ".dockercfg";

/// Credentials found for a set of pull secrets, and what went wrong finding them.
#[derive(Clone, Debug, Default)]
pub struct Resolved {
    /// Every credential of every secret, in `pullSecrets` order.
    pub keyring: Keyring,
    /// One line per secret that could not be used, for the tag's message.
    pub problems: Vec<String>,
}

/// Where a pull task gets its credentials; the real one is [`SecretStore`].
pub trait Credentials: Send + Sync + 'static {
    /// The credentials of `refs`.
    fn resolve(&self, refs: &[ReferenceObject]) -> impl Future<Output = Resolved> + Send;
    /// Forgets cached reads of `refs` (after a failed pull with them).
    fn invalidate(&self, refs: &[ReferenceObject]);
    /// The credential provider plugins, if configured.
    fn plugins(&self) -> Option<&Plugins> {
        None
    }

    /// The credentials for pulling `image` (a repository name): those of `refs` that apply to
    /// it, else those of the credential provider plugins that match it (kruise's order: pull
    /// secrets first, plugins when no secret had a credential).
    fn resolve_for(
        &self,
        refs: &[ReferenceObject],
        image: &str,
    ) -> impl Future<Output = Resolved> + Send {
        async move {
            let mut resolved = self.resolve(refs).await;
            if resolved.keyring.lookup(image).is_empty()
                && let Some(plugins) = self.plugins()
            {
                let (keyring, problems) = plugins.lookup(image).await;
                resolved.keyring.extend(keyring);
                resolved.problems.extend(problems);
            }
            resolved
        }
    }
}

/// No secrets at all (tests, and pulls without `pullSecrets`).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoCredentials;

impl Credentials for NoCredentials {
    async fn resolve(&self, _refs: &[ReferenceObject]) -> Resolved {
        Resolved::default()
    }
    fn invalidate(&self, _refs: &[ReferenceObject]) {}
}

/// One secret as read.
#[derive(Clone, Debug)]
struct Entry {
    read_at: Instant,
    keyring: Keyring,
    problem: Option<String>,
}

/// Reads pull secrets from the config namespace, with a short cache; with the credential
/// provider plugins, if any.
pub struct SecretStore {
    api: Api<Secret>,
    namespace: String,
    ttl: Duration,
    cache: Mutex<HashMap<String, Entry>>,
    plugins: Option<Plugins>,
}

impl SecretStore {
    /// A store reading secrets in `namespace`.
    pub fn new(client: kube::Client, namespace: &str) -> Self {
        SecretStore {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
            ttl: SECRET_TTL,
            cache: Mutex::new(HashMap::new()),
            plugins: None,
        }
    }

    /// The same store, falling back to `plugins`.
    pub fn with_plugins(mut self, plugins: Option<Plugins>) -> Self {
        self.plugins = plugins;
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        crate::sync::lock(&self.cache)
    }

    /// One secret: from the cache if fresh, else from the API.
    async fn get(&self, name: &str) -> Entry {
        if let Some(e) = self.lock().get(name)
            && e.read_at.elapsed() < self.ttl
        {
            return e.clone();
        }
        let what = format!("pull secret {}/{name}", self.namespace);
        let (entry, cache) = match self.api.get_opt(name).await {
            Ok(Some(secret)) => {
                let (keyring, problem) = keyring_of(&secret);
                let problem = problem.map(|p| format!("{what}: {p}"));
                (
                    Entry {
                        read_at: Instant::now(),
                        keyring,
                        problem,
                    },
                    true,
                )
            }
            Ok(None) => (
                Entry {
                    read_at: Instant::now(),
                    keyring: Keyring::default(),
                    problem: Some(format!("{what} not found")),
                },
                false,
            ),
            Err(e) => (
                Entry {
                    read_at: Instant::now(),
                    keyring: Keyring::default(),
                    problem: Some(format!("{what} cannot be read: {}", api_message(&e))),
                },
                false,
            ),
        };
        if cache {
            self.lock().insert(name.to_string(), entry.clone());
        }
        entry
    }
}

impl Credentials for SecretStore {
    async fn resolve(&self, refs: &[ReferenceObject]) -> Resolved {
        let mut out = Resolved::default();
        for r in refs {
            if r.name.is_empty() {
                continue;
            }
            if !r.namespace.is_empty() && r.namespace != self.namespace {
                tracing::debug!(
                    secret = %r.name,
                    named_namespace = %r.namespace,
                    namespace = %self.namespace,
                    "pull secret names another namespace; reading it from the config namespace"
                );
            }
            let entry = self.get(&r.name).await;
            out.keyring.extend(entry.keyring);
            out.problems.extend(entry.problem);
        }
        out
    }

    fn plugins(&self) -> Option<&Plugins> {
        self.plugins.as_ref()
    }

    fn invalidate(&self, refs: &[ReferenceObject]) {
        let mut cache = self.lock();
        for r in refs {
            cache.remove(&r.name);
        }
    }
}

/// The short reason of an API error (never the request body).
fn api_message(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("{} {}", s.code, s.message),
        other => other.to_string(),
    }
}

/// The keyring of one secret and, if part of it is unusable, why.
pub fn keyring_of(secret: &Secret) -> (Keyring, Option<String>) {
    let mut keyring = Keyring::default();
    let data = secret.data.as_ref();
    let json = data.and_then(|d| d.get(DOCKER_CONFIG_JSON_KEY));
    let cfg = data.and_then(|d| d.get(DOCKER_CFG_KEY));
    let result = match (json, cfg) {
        (Some(j), _) if !j.0.is_empty() => keyring
            .add_config_json(&j.0)
            .map_err(|e| format!("invalid {DOCKER_CONFIG_JSON_KEY}: {e}")),
        (_, Some(c)) if !c.0.is_empty() => keyring
            .add_dockercfg(&c.0)
            .map_err(|e| format!("invalid {DOCKER_CFG_KEY}: {e}")),
        _ => Err(format!(
            "has neither {DOCKER_CONFIG_JSON_KEY} nor {DOCKER_CFG_KEY}"
        )),
    };
    (keyring, result.err())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    fn secret(key: &str, value: &str) -> Secret {
        Secret {
            data: Some([(key.to_string(), ByteString(value.as_bytes().to_vec()))].into()),
            ..Default::default()
        }
    }

    #[test]
    fn both_docker_config_formats_are_read() {
        let (k, p) = keyring_of(&secret(
            ".dockerconfigjson",
            r#"{"auths": {"r.io": {"username": "u", "password": "p"}}}"#,
        ));
        assert_eq!((k.lookup("r.io/a").len(), p), (1, None));
        let (k, p) = keyring_of(&secret(
            ".dockercfg",
            r#"{"r.io": {"username": "u", "password": "p"}}"#,
        ));
        assert_eq!((k.lookup("r.io/a").len(), p), (1, None));
    }

    #[test]
    fn an_unusable_secret_says_why_without_its_content() {
        let (k, p) = keyring_of(&secret(".dockerconfigjson", "{not json hunter2"));
        assert!(k.is_empty());
        let p = p.unwrap();
        assert!(p.contains("invalid .dockerconfigjson"), "{p}");
        assert!(!p.contains("hunter2"), "{p}");
        let (_, p) = keyring_of(&secret("token", "x"));
        assert!(p.unwrap().contains("neither"));
    }
}
