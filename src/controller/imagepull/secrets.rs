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
//! - For a pod's next batch ([`Credentials::resolve_for_namespace`]) a secret is used only when
//!   kruise-manager copied it from the pod's own namespace: its [`SOURCE_KEY`] annotation reads
//!   `<that namespace>/<name>` ([`lends_to`]). A secret without the annotation (copied by hand)
//!   or from another namespace is never lent to a pod; see docs/security.md, "The next-batch
//!   pre-pull".

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

/// The annotation kruise-manager puts on its copy of an ImagePullJob's pull secret in the
/// config namespace: `<namespace>/<name>` of the secret it copied (kruise's ImagePullJob
/// controller, `SourceSecretKeyAnno`; `SecretAnnotationSourceSecretKey` in later versions).
// a key like the others in k8s/keys.rs; kept here while it has no other reader
pub const SOURCE_KEY: &str = "imagepulljobs.kruise.io/source-key";
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
    /// One per secret (or credential provider) that could not be used, for the tag's message.
    pub problems: Vec<Problem>,
}

impl Resolved {
    /// The problems as the tag's status says them: every one, `; ` between.
    pub fn problems_text(&self) -> String {
        problems_text(self.problems.iter())
    }
}

/// `problems`' texts, `; ` between.
pub fn problems_text<'a>(problems: impl IntoIterator<Item = &'a Problem>) -> String {
    problems
        .into_iter()
        .map(|p| p.text.as_str())
        .collect::<Vec<_>>()
        .join("; ")
}

/// A pull secret or credential provider that could not be used, and whose business that is.
/// A NodeImage tag's owners are ImagePullJobs of any namespace sharing one pull, and the image's
/// `pullSecrets` are every job's: each owner's event names only its own secrets' problems and
/// the node's ([`Problem::concerns`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// What went wrong (never a credential).
    pub text: String,
    /// Whose it is.
    pub whose: Whose,
}

/// Whose business a [`Problem`] is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Whose {
    /// The node's: a credential provider plugin failed (said without its words).
    Node,
    /// A namespace's: a secret kruise-manager copied from it (its [`SOURCE_KEY`]), or one the
    /// NodeImage names in it (managers before kruise 1.5).
    Namespace(String),
    /// Nobody's known: a secret missing, unreadable, or made by hand in the config namespace;
    /// told on the NodeImage (the cluster's) only.
    Unknown,
}

impl Problem {
    /// Whether an owner of the tag in `namespace` is told of it: the node's problems and those
    /// of the secrets of `namespace`; another tenant's secret, its name and what is wrong with
    /// it, are that tenant's.
    pub fn concerns(&self, namespace: &str) -> bool {
        match &self.whose {
            Whose::Node => true,
            Whose::Namespace(ns) => ns == namespace,
            Whose::Unknown => false,
        }
    }
}

impl From<String> for Problem {
    /// A problem of nobody's known.
    fn from(text: String) -> Problem {
        Problem {
            text,
            whose: Whose::Unknown,
        }
    }
}

impl From<&str> for Problem {
    /// A problem of nobody's known.
    fn from(text: &str) -> Problem {
        Problem::from(text.to_string())
    }
}

/// The namespace a [`SOURCE_KEY`] (`<namespace>/<name>`) names, if it names one.
fn source_namespace(source: Option<&str>) -> Option<&str> {
    source
        .and_then(|s| s.split_once('/'))
        .filter(|(ns, name)| !ns.is_empty() && !name.is_empty())
        .map(|(ns, _)| ns)
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
            let resolved = self.resolve(refs).await;
            with_plugins(self.plugins(), resolved, image).await
        }
    }

    /// The credentials of those of `refs` that kruise-manager copied from `namespace` (see
    /// [`lends_to`]); the others are left out without a word in [`Resolved::problems`], since
    /// they are none of that namespace's business.
    ///
    /// The default lends nothing: a source that cannot tell where a secret came from must not
    /// lend it to a pod.
    fn resolve_from(
        &self,
        refs: &[ReferenceObject],
        namespace: &str,
    ) -> impl Future<Output = Resolved> + Send {
        let _ = (refs, namespace);
        std::future::ready(Resolved::default())
    }

    /// The credentials for pulling `image` for a pod of `namespace` (its next in-place batch):
    /// those of `refs` copied from `namespace`, else the credential provider plugins', which the
    /// kubelet would use for any pod of the node.
    fn resolve_for_namespace(
        &self,
        refs: &[ReferenceObject],
        image: &str,
        namespace: &str,
    ) -> impl Future<Output = Resolved> + Send {
        async move {
            let resolved = self.resolve_from(refs, namespace).await;
            with_plugins(self.plugins(), resolved, image).await
        }
    }
}

/// `resolved` with the plugins' credentials for `image` added when none of its own applies
/// (kruise's order: pull secrets first, plugins when no secret had a credential).
async fn with_plugins(plugins: Option<&Plugins>, mut resolved: Resolved, image: &str) -> Resolved {
    if resolved.keyring.lookup(image).is_empty()
        && let Some(plugins) = plugins
    {
        let (keyring, problems) = plugins.lookup(image).await;
        resolved.keyring.extend(keyring);
        resolved
            .problems
            .extend(problems.into_iter().map(|text| Problem {
                text,
                whose: Whose::Node,
            }));
    }
    resolved
}

/// Whether a pull secret whose [`SOURCE_KEY`] annotation is `source` may be used for a pod of
/// `namespace`: only a copy kruise-manager made of a secret of that same namespace. `None` (a
/// secret made by hand in the config namespace) lends to no pod.
pub fn lends_to(source: Option<&str>, namespace: &str) -> bool {
    source_namespace(source) == Some(namespace)
}

/// The credentials of those of `secrets` (each with its [`SOURCE_KEY`] and keyring, in
/// `pullSecrets` order) that [`lends_to`] `namespace`.
pub fn lent<'a>(
    secrets: impl IntoIterator<Item = (Option<&'a str>, &'a Keyring)>,
    namespace: &str,
) -> Keyring {
    let mut keyring = Keyring::default();
    for (source, k) in secrets {
        if lends_to(source, namespace) {
            keyring.extend(k.clone());
        }
    }
    keyring
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
    /// Its [`SOURCE_KEY`] annotation.
    source: Option<String>,
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
                let source = secret
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(SOURCE_KEY))
                    .cloned();
                (
                    Entry {
                        read_at: Instant::now(),
                        keyring,
                        source,
                        problem,
                    },
                    true,
                )
            }
            Ok(None) => (
                Entry {
                    read_at: Instant::now(),
                    keyring: Keyring::default(),
                    source: None,
                    problem: Some(format!("{what} not found")),
                },
                false,
            ),
            Err(e) => (
                Entry {
                    read_at: Instant::now(),
                    keyring: Keyring::default(),
                    source: None,
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
            // whose: where kruise-manager copied it from, else the namespace the reference
            // names when that is not the config namespace (a manager before kruise 1.5)
            let whose = source_namespace(entry.source.as_deref())
                .or(Some(r.namespace.as_str()).filter(|ns| !ns.is_empty() && *ns != self.namespace))
                .map_or(Whose::Unknown, |ns| Whose::Namespace(ns.to_string()));
            out.problems
                .extend(entry.problem.map(|text| Problem { text, whose }));
        }
        out
    }

    async fn resolve_from(&self, refs: &[ReferenceObject], namespace: &str) -> Resolved {
        let mut entries = Vec::new();
        for r in refs.iter().filter(|r| !r.name.is_empty()) {
            let entry = self.get(&r.name).await;
            if !lends_to(entry.source.as_deref(), namespace) {
                tracing::debug!(
                    secret = %r.name,
                    source = entry.source.as_deref().unwrap_or("none"),
                    %namespace,
                    "pull secret not copied from the pod's namespace; not used for its next batch"
                );
            }
            entries.push(entry);
        }
        let keyring = lent(
            entries.iter().map(|e| (e.source.as_deref(), &e.keyring)),
            namespace,
        );
        // problems of secrets that are not lent are another namespace's business
        let problems = entries
            .iter()
            .filter(|e| lends_to(e.source.as_deref(), namespace))
            .filter_map(|e| e.problem.clone())
            .map(|text| Problem {
                text,
                whose: Whose::Namespace(namespace.to_string()),
            })
            .collect();
        Resolved { keyring, problems }
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

    /// A copy kruise-manager made: `imagepulljobs.kruise.io/source-key: <ns>/<name>` (kruise
    /// 07169cf, as its double tests/support/manager/imagepull.rs writes it and
    /// tests/integration/manager.rs asserts), or a secret made by hand (`None`).
    fn copy_from(source: Option<&str>, user: &str) -> (Option<String>, Keyring) {
        let (k, p) = keyring_of(&secret(
            ".dockerconfigjson",
            &format!(r#"{{"auths": {{"r.io": {{"username": "{user}", "password": "pw"}}}}}}"#),
        ));
        assert_eq!(p, None);
        (source.map(str::to_string), k)
    }

    #[test]
    fn another_tenants_secret_is_not_borrowed_for_a_pods_next_batch() {
        let secrets = [
            copy_from(Some("tenant-b/regcred"), "b"),
            copy_from(None, "by-hand"),
            copy_from(Some("tenant-a/regcred"), "a"),
            copy_from(Some("tenant-a"), "no-name"),
            copy_from(Some("/regcred"), "no-namespace"),
        ];
        let users = |namespace: &str| -> Vec<String> {
            lent(secrets.iter().map(|(s, k)| (s.as_deref(), k)), namespace)
                .lookup("r.io/app")
                .into_iter()
                .map(|c| c.username)
                .collect()
        };
        assert_eq!(users("tenant-a"), ["a"]);
        assert_eq!(users("tenant-b"), ["b"]);
        assert!(users("tenant-c").is_empty());
        assert!(users("").is_empty(), "an empty namespace matches nothing");
    }

    /// Credentials that hold a login for every secret but cannot say where one came from.
    struct Unscoped;

    impl Credentials for Unscoped {
        async fn resolve(&self, _refs: &[ReferenceObject]) -> Resolved {
            Resolved {
                keyring: copy_from(None, "anyone").1,
                problems: vec![],
            }
        }
        fn invalidate(&self, _refs: &[ReferenceObject]) {}
    }

    #[tokio::test]
    async fn a_source_that_cannot_tell_where_secrets_come_from_lends_none_to_a_pod() {
        let refs = [ReferenceObject {
            name: "regcred".into(),
            ..Default::default()
        }];
        assert!(
            !Unscoped
                .resolve_for(&refs, "r.io/app")
                .await
                .keyring
                .is_empty()
        );
        let r = Unscoped
            .resolve_for_namespace(&refs, "r.io/app", "tenant-a")
            .await;
        assert!(r.keyring.is_empty() && r.problems.is_empty());
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
