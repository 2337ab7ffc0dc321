//! kruised under RBAC: telling a refused request from kruised's log ([`is_refusal`],
//! [`assert_never_forbidden`]), and giving it a ServiceAccount identity bound to the RBAC of
//! `deploy/` or of kruise's Helm chart on the API-server double with authentication and RBAC
//! on ([`identity_on_double`], [`assert_nothing_refused`]), as the cluster layer does on a real
//! kube-apiserver ([`super::cluster::identity`]).

use std::path::{Path, PathBuf};

use apiserver_double::{Control, UserInfo};

use super::cluster::Rbac;
use super::daemon::Daemon;

/// Whether a log line tells of a request the API server refused (403): the reason's word, or
/// the status code as kube-rs and the API server write it. A bare `403` also begins container
/// IDs (a CI run failed on `"id":"4038dcbd…"`).
pub fn is_refusal(line: &str) -> bool {
    let l = line.to_ascii_lowercase();
    l.contains("forbidden") || l.contains("code: 403") || l.contains("\"code\":403")
}

/// Fails the test if the daemon was refused anything (403): its identity must have exactly
/// the rights it uses.
pub fn assert_never_forbidden(daemon: &Daemon) {
    let refused: Vec<String> = daemon
        .log()
        .iter()
        .map(|v| v.to_string())
        .filter(|l| is_refusal(l))
        .collect();
    assert!(
        refused.is_empty(),
        "the daemon was refused by RBAC:\n{}",
        refused.join("\n")
    );
}

/// `deploy/namespace.yaml`: the ServiceAccounts' namespace.
pub const NAMESPACE_YAML: &str = include_str!("../../deploy/namespace.yaml");
/// `deploy/rbac.yaml`: ServiceAccount `kruise-system/kruised`.
pub const DEPLOY_RBAC_YAML: &str = include_str!("../../deploy/rbac.yaml");
/// kruise's Helm chart 1.9 RBAC, rendered: ServiceAccount `kruise-system/kruise-daemon`.
pub const CHART_RBAC_YAML: &str = include_str!("../fixtures/kruise-chart/rbac.yaml");

/// The ServiceAccount of `rbac` (in `kruise-system`) and its manifests.
pub fn manifests(rbac: Rbac) -> (&'static str, &'static str) {
    match rbac {
        Rbac::Deploy => ("kruised", DEPLOY_RBAC_YAML),
        Rbac::KruiseChart => ("kruise-daemon", CHART_RBAC_YAML),
    }
}

/// kruised's identity on the double: a ServiceAccount token and a kubeconfig sending it.
pub struct DoubleIdentity {
    /// The user the double authenticates it as: `system:serviceaccount:kruise-system:<sa>`.
    pub user: String,
    /// The kubeconfig file.
    pub kubeconfig: PathBuf,
}

/// Turns authentication and RBAC on in the double (the test keeps the control API, which
/// needs neither), applies `deploy/namespace.yaml` and `rbac_yaml`, and issues a token for the
/// ServiceAccount `kruise-system/<service_account>`; its kubeconfig is written into `dir`.
pub fn identity_with(
    api: &Control,
    service_account: &str,
    rbac_yaml: &str,
    dir: &Path,
) -> DoubleIdentity {
    api.apply_manifests(NAMESPACE_YAML)
        .expect("apply deploy/namespace.yaml");
    api.apply_manifests(rbac_yaml)
        .expect("apply the RBAC manifests");
    let token = format!("token-of-{service_account}");
    let user = UserInfo::service_account("kruise-system", service_account);
    let name = user.name.clone();
    api.add_token(&token, user);
    api.set_rbac(true).expect("RBAC on");
    let kubeconfig = dir.join(format!("kubeconfig-{service_account}"));
    std::fs::write(&kubeconfig, api.kubeconfig_with_token(&token)).expect("write the kubeconfig");
    DoubleIdentity {
        user: name,
        kubeconfig,
    }
}

/// [`identity_with`] the RBAC of `rbac` as shipped.
pub fn identity_on_double(api: &Control, rbac: Rbac, dir: &Path) -> DoubleIdentity {
    let (sa, yaml) = manifests(rbac);
    identity_with(api, sa, yaml, dir)
}

/// Fails the test if the double refused any request (401 or 403), listing each.
pub fn assert_nothing_refused(api: &Control) {
    let refused: Vec<String> = api
        .refusals()
        .iter()
        .map(|r| {
            format!(
                "{} {} {}?{} as {:?}: {:?}",
                r.refused.unwrap_or(0),
                r.method,
                r.path,
                r.query,
                r.user,
                r.verb
            )
        })
        .collect();
    assert!(
        refused.is_empty(),
        "the API server refused requests:\n{}",
        refused.join("\n")
    );
}
