//! The serving certificate, read from files (as cert-manager mounts them) and reloaded when
//! they change. Every TLS handshake stats the two files (two `stat` calls, no reads) and
//! reloads only when their modification time, size or inode changed; a broken new pair is
//! logged and the previous certificate keeps serving.

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::error::Error;

/// What identifies one version of a file without reading it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    modified: Option<SystemTime>,
    len: u64,
    inode: u64,
}

fn stamp(path: &Path) -> Option<Stamp> {
    let meta = std::fs::metadata(path).ok()?;
    Some(Stamp {
        modified: meta.modified().ok(),
        len: meta.len(),
        inode: meta.ino(),
    })
}

struct Loaded {
    stamps: (Option<Stamp>, Option<Stamp>),
    key: Arc<CertifiedKey>,
}

/// A certificate resolver that follows the certificate and key files.
pub struct ReloadingCertificate {
    cert_file: PathBuf,
    key_file: PathBuf,
    provider: Arc<CryptoProvider>,
    state: Mutex<Loaded>,
}

impl std::fmt::Debug for ReloadingCertificate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReloadingCertificate")
            .field("cert_file", &self.cert_file)
            .field("key_file", &self.key_file)
            .finish()
    }
}

impl ReloadingCertificate {
    /// Loads the pair once; fails when it cannot (the server must not start without one).
    pub fn load(
        cert_file: &Path,
        key_file: &Path,
        provider: Arc<CryptoProvider>,
    ) -> Result<Self, Error> {
        let stamps = (stamp(cert_file), stamp(key_file));
        let key = load_pair(cert_file, key_file, &provider)?;
        Ok(ReloadingCertificate {
            cert_file: cert_file.to_owned(),
            key_file: key_file.to_owned(),
            provider,
            state: Mutex::new(Loaded {
                stamps,
                key: Arc::new(key),
            }),
        })
    }

    /// The pair to serve now, reloaded first if the files changed.
    pub fn current(&self) -> Option<Arc<CertifiedKey>> {
        let mut state = self.state.lock().ok()?;
        let stamps = (stamp(&self.cert_file), stamp(&self.key_file));
        if stamps != state.stamps {
            // Remember the stamps either way: a broken pair is reported once, not on
            // every handshake, and retried when the files change again.
            state.stamps = stamps;
            match load_pair(&self.cert_file, &self.key_file, &self.provider) {
                Ok(key) => {
                    tracing::info!(cert = %self.cert_file.display(), "reloaded the serving certificate");
                    state.key = Arc::new(key);
                }
                Err(error) => {
                    tracing::warn!(%error, "keeping the previous serving certificate");
                }
            }
        }
        Some(state.key.clone())
    }
}

impl ResolvesServerCert for ReloadingCertificate {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current()
    }
}

fn load_pair(
    cert_file: &Path,
    key_file: &Path,
    provider: &CryptoProvider,
) -> Result<CertifiedKey, Error> {
    let tls_error = |what: &'static str, path: &Path, message: String| Error::Tls {
        what,
        path: path.to_owned(),
        message,
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert_file)
        .map_err(|e| tls_error("certificate", cert_file, e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| tls_error("certificate", cert_file, e.to_string()))?;
    if certs.is_empty() {
        return Err(tls_error(
            "certificate",
            cert_file,
            "no CERTIFICATE block".into(),
        ));
    }
    let key = PrivateKeyDer::from_pem_file(key_file)
        .map_err(|e| tls_error("key", key_file, e.to_string()))?;
    CertifiedKey::from_der(certs, key, provider).map_err(|e| {
        tls_error(
            "key",
            key_file,
            format!("does not fit the certificate: {e}"),
        )
    })
}

/// The rustls server configuration: TLS 1.2 and 1.3 with the ring provider, HTTP/1.1,
/// the certificate from the reloading resolver.
pub fn server_config(
    resolver: Arc<ReloadingCertificate>,
    provider: Arc<CryptoProvider>,
) -> Result<rustls::ServerConfig, Error> {
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Tls {
            what: "certificate",
            path: resolver.cert_file.clone(),
            message: e.to_string(),
        })?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}
