//! The rustls settings for the API server and an https proxy, as client-go builds them from the
//! kubeconfig: the cluster's CA (or the system's CA certificates where it names none), the
//! client certificate and key, `insecure-skip-tls-verify`. In a pod, the service account's CA
//! file is read again once a minute, so a rotated CA is trusted without a restart (client-go
//! and kube do the same).
//!
//! kruised's own, not kube's `ConfigExt::rustls_client_config`: kube's also runs the exec
//! plugin, whose reader brings a second YAML parser and a JSONPath engine into the binary
//! (issue 44); the exec plugin is [`super::auth`]'s.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

/// How often the in-cluster CA file is read again.
pub const CA_RELOAD_INTERVAL: Duration = Duration::from_secs(60);

/// The TLS settings cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The client certificate and key are not PEM.
    #[error("the client certificate and key are not PEM: {0}")]
    IdentityPem(#[source] rustls::pki_types::pem::Error),
    /// The client certificate and key hold no private key.
    #[error("the client key holds no private key (PKCS#8, PKCS#1 or SEC1 PEM)")]
    MissingPrivateKey,
    /// The client certificate and key hold no certificate.
    #[error("the client certificate holds no certificate")]
    MissingCertificate,
    /// rustls refuses the client key.
    #[error("the client key cannot be used: {0}")]
    InvalidPrivateKey(#[source] rustls::Error),
    /// A CA certificate cannot be used.
    #[error("a certificate-authority certificate cannot be used: {0}")]
    RootCertificate(String),
    /// No CA certificate of the system could be loaded.
    #[error("{0}")]
    NoSystemRoots(String),
    /// `tls-server-name` is not a DNS name or an IP address.
    #[error("tls-server-name: {0}")]
    ServerName(String),
    /// The client certificate or key cannot be read.
    #[error("the {what} cannot be read: {reason}")]
    ReadIdentity {
        /// `client-certificate` or `client-key`, with `-data` for inline data.
        what: &'static str,
        /// Why.
        reason: String,
    },
    /// Only one of the client certificate and key is given.
    #[error("the user has a client {given} but no client {missing}")]
    HalfIdentity {
        /// The one given.
        given: &'static str,
        /// The one missing.
        missing: &'static str,
    },
}

/// The user's client key and certificate as one PEM (`client-key-data` or `client-key`, then
/// `client-certificate-data` or `client-certificate`), or `None` without either. Inline data
/// wins over a file, as in kube and client-go.
pub fn identity_of(user: &kube::config::AuthInfo) -> Result<Option<Vec<u8>>, TlsError> {
    use secrecy::ExposeSecret;
    let key = load(
        user.client_key_data.as_ref().map(|k| k.expose_secret()),
        user.client_key.as_deref(),
        ("client-key-data", "client-key"),
    )?;
    let cert = load(
        user.client_certificate_data.as_deref(),
        user.client_certificate.as_deref(),
        ("client-certificate-data", "client-certificate"),
    )?;
    match (key, cert) {
        (None, None) => Ok(None),
        (Some(_), None) => Err(TlsError::HalfIdentity {
            given: "key",
            missing: "certificate",
        }),
        (None, Some(_)) => Err(TlsError::HalfIdentity {
            given: "certificate",
            missing: "key",
        }),
        (Some(mut pem), Some(cert)) => {
            pem.extend_from_slice(&cert);
            Ok(Some(pem))
        }
    }
}

/// Base64 `data`, else the file at `path`, with a newline at its end.
fn load(
    data: Option<&str>,
    path: Option<&str>,
    (data_name, file_name): (&'static str, &'static str),
) -> Result<Option<Vec<u8>>, TlsError> {
    use base64::Engine;
    let mut bytes = match (data, path) {
        (Some(data), _) => base64::engine::general_purpose::STANDARD
            .decode(data.trim())
            .map_err(|e| TlsError::ReadIdentity {
                what: data_name,
                reason: format!("not base64: {e}"),
            })?,
        (None, Some(path)) => std::fs::read(path).map_err(|e| TlsError::ReadIdentity {
            what: file_name,
            reason: format!("{path}: {e}"),
        })?,
        (None, None) => return Ok(None),
    };
    if bytes.last().is_some_and(|b| *b != b'\n') {
        bytes.push(b'\n');
    }
    Ok(Some(bytes))
}

/// The CA certificates to check the server's certificate against.
#[derive(Clone, Debug)]
pub enum Roots<'a> {
    /// The kubeconfig's (DER), and the file they came from if it is to be read again.
    Given(&'a [Vec<u8>], Option<&'a Path>),
    /// The system's (`SSL_CERT_FILE`, `SSL_CERT_DIR` or the distribution's bundle).
    System,
    /// None: `insecure-skip-tls-verify`, nothing is checked.
    Insecure,
}

/// The rustls client settings: `roots`, and `identity` (the client key and certificate, PEM) if
/// given. No ALPN: the caller sets what it offers.
pub fn client_config(identity: Option<&[u8]>, roots: Roots<'_>) -> Result<ClientConfig, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::RootCertificate(e.to_string()))?;
    let verifier: Arc<dyn ServerCertVerifier> = match roots {
        Roots::Given(ders, None) => webpki_verifier(store(ders.iter().cloned())?, &provider)?,
        Roots::Given(ders, Some(file)) => Arc::new(ReloadingVerifier {
            path: file.to_path_buf(),
            provider: provider.clone(),
            current: RwLock::new((
                webpki_verifier(store(ders.iter().cloned())?, &provider)?,
                Instant::now(),
            )),
        }),
        Roots::System => {
            let found = rustls_native_certs::load_native_certs();
            let mut roots = RootCertStore::empty();
            let (added, _) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                let reason = match found.errors.first() {
                    Some(e) => format!("No CA certificates were loaded from the system: {e}"),
                    None => "No CA certificates were loaded from the system".to_string(),
                };
                return Err(TlsError::NoSystemRoots(reason));
            }
            webpki_verifier(roots, &provider)?
        }
        Roots::Insecure => Arc::new(Unverified(provider.signature_verification_algorithms)),
    };
    let builder = builder
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    match identity {
        None => Ok(builder.with_no_client_auth()),
        Some(pem) => {
            let chain = CertificateDer::pem_slice_iter(pem)
                .collect::<Result<Vec<_>, _>>()
                .map_err(TlsError::IdentityPem)?;
            if chain.is_empty() {
                return Err(TlsError::MissingCertificate);
            }
            let key = PrivateKeyDer::from_pem_slice(pem).map_err(|e| match e {
                rustls::pki_types::pem::Error::NoItemsFound => TlsError::MissingPrivateKey,
                e => TlsError::IdentityPem(e),
            })?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(TlsError::InvalidPrivateKey)
        }
    }
}

/// The DER certificates of a PEM bundle (a kubeconfig's `certificate-authority`).
pub fn pem_certificates(pem: &[u8]) -> Result<Vec<Vec<u8>>, TlsError> {
    CertificateDer::pem_slice_iter(pem)
        .map(|c| c.map(|c| c.to_vec()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::RootCertificate(e.to_string()))
}

fn store(ders: impl Iterator<Item = Vec<u8>>) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for der in ders {
        roots
            .add(CertificateDer::from(der))
            .map_err(|e| TlsError::RootCertificate(e.to_string()))?;
    }
    Ok(roots)
}

fn webpki_verifier(
    roots: RootCertStore,
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<dyn ServerCertVerifier>, TlsError> {
    let verifier = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| TlsError::RootCertificate(e.to_string()))?;
    Ok(verifier)
}

/// Checks against the CA file's certificates, reading the file again once
/// [`CA_RELOAD_INTERVAL`] passed since the last read. A file that cannot be read or holds no
/// usable certificate keeps the last good ones (client-go's rule for its token file,
/// kubernetes #68164), with a warning.
#[derive(Debug)]
struct ReloadingVerifier {
    path: PathBuf,
    provider: Arc<CryptoProvider>,
    current: RwLock<(Arc<dyn ServerCertVerifier>, Instant)>,
}

impl ReloadingVerifier {
    fn load(&self) -> Result<Arc<dyn ServerCertVerifier>, TlsError> {
        let pem =
            std::fs::read(&self.path).map_err(|e| TlsError::RootCertificate(e.to_string()))?;
        let ders = pem_certificates(&pem)?;
        if ders.is_empty() {
            return Err(TlsError::RootCertificate(
                "no certificate in the file".into(),
            ));
        }
        webpki_verifier(store(ders.into_iter())?, &self.provider)
    }

    fn current(&self) -> Arc<dyn ServerCertVerifier> {
        {
            let now = self.current.read().unwrap_or_else(|e| e.into_inner());
            if now.1.elapsed() < CA_RELOAD_INTERVAL {
                return now.0.clone();
            }
        }
        let mut now = self.current.write().unwrap_or_else(|e| e.into_inner());
        if now.1.elapsed() >= CA_RELOAD_INTERVAL {
            match self.load() {
                Ok(fresh) => now.0 = fresh,
                Err(e) => tracing::warn!(
                    path = %self.path.display(),
                    error = %e,
                    "the CA file cannot be read again; the CA certificates read before are kept"
                ),
            }
            now.1 = Instant::now();
        }
        now.0.clone()
    }
}

impl ServerCertVerifier for ReloadingVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.current()
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.current().verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.current().verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// `insecure-skip-tls-verify`: any certificate is accepted; the handshake's signatures are
/// still checked, so the session is at least with the holder of the certificate's key.
#[derive(Debug)]
struct Unverified(WebPkiSupportedAlgorithms);

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_identity_without_a_certificate_is_refused_by_what_it_lacks() {
        let err = client_config(Some(b"not pem at all\n"), Roots::Insecure).unwrap_err();
        assert!(matches!(err, TlsError::MissingCertificate), "{err:?}");
    }

    #[test]
    fn a_user_with_only_half_an_identity_or_bad_base64_is_refused_by_name() {
        let key_only = kube::config::AuthInfo {
            client_key_data: Some("a2V5".to_string().into()),
            ..Default::default()
        };
        let err = identity_of(&key_only).unwrap_err().to_string();
        assert_eq!(err, "the user has a client key but no client certificate");
        let bad = kube::config::AuthInfo {
            client_certificate_data: Some("not base64!".into()),
            client_key: Some("/nonexistent/key".into()),
            ..Default::default()
        };
        let err = identity_of(&bad).unwrap_err().to_string();
        assert!(
            err.starts_with("the client-key cannot be read: /nonexistent/key"),
            "{err}"
        );
        let both = kube::config::AuthInfo {
            client_certificate_data: Some("Y2VydA==".into()),
            client_key_data: Some("a2V5".to_string().into()),
            ..Default::default()
        };
        assert_eq!(
            identity_of(&both).unwrap().as_deref(),
            Some(&b"key\ncert\n"[..]),
            "the key, then the certificate, each ending in a newline"
        );
        assert!(identity_of(&Default::default()).unwrap().is_none());
    }

    #[test]
    fn a_ca_bundle_of_garbage_is_refused_with_its_reason() {
        let err = client_config(None, Roots::Given(&[b"garbage".to_vec()], None)).unwrap_err();
        assert!(
            matches!(err, TlsError::RootCertificate(_)),
            "garbage as a CA: {err:?}"
        );
    }

    #[test]
    fn insecure_settings_build_without_any_ca() {
        client_config(None, Roots::Insecure).expect("insecure-skip-tls-verify needs no CA");
    }
}
