//! TLS with rustls (the `ring` provider): kvgate's listeners, with the
//! certificate and key read from files and read again when they change, and
//! its connections to https:// engines and peers, which must chain to the
//! configured CA bundle. Weak configurations are refused with the reason: a
//! private key file others may read, or a certificate that does not match
//! its key.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio::sync::watch;

use crate::config::tls_config::TlsConfig;

/// ALPN of the HTTP/1.1 listeners and of the connections to engines and peers.
pub(crate) const ALPN_HTTP1: &[u8] = b"http/1.1";
/// ALPN of the endpoint picker's gRPC listener.
pub(crate) const ALPN_H2: &[u8] = b"h2";

pub(crate) fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Every certificate in the PEM file at `path` (at least one).
fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{}: not a PEM certificate file: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no certificate in it", path.display()));
    }
    Ok(certs)
}

/// A private key file may be read by its owner (and group), never by others.
fn check_key_file(path: &Path) -> Result<(), String> {
    let meta = std::fs::metadata(path)
        .map_err(|e| format!("{}: cannot read the key: {e}", path.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o004 != 0 {
            return Err(format!(
                "{}: the private key is readable by others (mode {mode:o}); refusing it: \
                 `chmod o-rwx` it (Kubernetes: defaultMode 0400 or 0440 on the Secret volume)",
                path.display()
            ));
        }
    }
    #[cfg(not(unix))]
    let _ = meta;
    Ok(())
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    check_key_file(path)?;
    PrivateKeyDer::from_pem_file(path).map_err(|e| {
        format!("{}: not a PEM private key (PKCS#8, PKCS#1 or SEC1): {e}", path.display())
    })
}

/// The certificate chain at `cert` with the key at `key`, checked to match.
pub(crate) fn load_identity(cert: &Path, key: &Path) -> Result<Arc<CertifiedKey>, String> {
    certified(read_certs(cert)?, read_key(key)?, cert, key)
}

/// `certs` with the key `der`, checked to match (`cert`, `key`: their files,
/// for the message).
fn certified(
    certs: Vec<CertificateDer<'static>>,
    der: PrivateKeyDer<'static>,
    cert: &Path,
    key: &Path,
) -> Result<Arc<CertifiedKey>, String> {
    let signing = provider()
        .key_provider
        .load_private_key(der)
        .map_err(|e| format!("{}: unusable private key: {e}", key.display()))?;
    let ck = CertifiedKey::new(certs, signing);
    ck.keys_match().map_err(|e| {
        format!("{} does not match the private key {}: {e}", cert.display(), key.display())
    })?;
    Ok(Arc::new(ck))
}

fn roots(path: &Path) -> Result<Arc<RootCertStore>, String> {
    let mut store = RootCertStore::empty();
    for c in read_certs(path)? {
        store
            .add(c)
            .map_err(|e| format!("{}: not a usable CA certificate: {e}", path.display()))?;
    }
    Ok(Arc::new(store))
}

/// The listeners' certificate: the pair loaded last, swapped in place when
/// the files change.
#[derive(Debug)]
struct ReloadingCert(ArcSwap<CertifiedKey>);

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.load_full())
    }
}

/// The listeners' TLS: one identity (reloaded on change) and, with
/// `tls.client_ca`, the client certificates the machine-facing listeners
/// (peer, endpoint picker) require.
#[derive(Debug)]
pub(crate) struct ServerTls {
    cert: PathBuf,
    key: PathBuf,
    current: Arc<ReloadingCert>,
    client_roots: Option<Arc<RootCertStore>>,
    reload: Duration,
}

impl ServerTls {
    /// The listeners' TLS for `c`, `None` when `tls.cert` is unset. Reads
    /// and checks the files now: a bad pair stops the start.
    pub(crate) fn load(c: &TlsConfig, reload: Duration) -> Result<Option<Arc<ServerTls>>, String> {
        let (Some(cert), Some(key)) = (&c.cert, &c.key) else { return Ok(None) };
        let identity = load_identity(cert, key)?;
        let client_roots = c.client_ca.as_deref().map(roots).transpose()?;
        Ok(Some(Arc::new(ServerTls {
            cert: cert.clone(),
            key: key.clone(),
            current: Arc::new(ReloadingCert(ArcSwap::new(identity))),
            client_roots,
            reload,
        })))
    }

    /// A listener's rustls configuration, offering `alpn`; `machines`: the
    /// listener's clients are machines (peers, the gateway), which must
    /// present a certificate when `tls.client_ca` is set. Client-facing
    /// listeners authenticate with keys, and the kubelet's probes present
    /// no certificate.
    pub(crate) fn config(&self, alpn: &[u8], machines: bool) -> Result<Arc<ServerConfig>, String> {
        let p = provider();
        let builder = ServerConfig::builder_with_provider(Arc::clone(&p))
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?;
        let builder = match self.client_roots.as_ref().filter(|_| machines) {
            Some(roots) => {
                let v = WebPkiClientVerifier::builder_with_provider(Arc::clone(roots), p)
                    .build()
                    .map_err(|e| format!("tls.client_ca: {e}"))?;
                builder.with_client_cert_verifier(v)
            }
            None => builder.with_no_client_auth(),
        };
        let mut config = builder.with_cert_resolver(Arc::clone(&self.current) as _);
        config.alpn_protocols = vec![alpn.to_vec()];
        Ok(Arc::new(config))
    }

    /// What the files are now, to notice a change (modification time and
    /// length of each; a Kubernetes Secret update swaps a symlink, which
    /// `metadata` follows).
    fn stamp(&self) -> [Option<(SystemTime, u64)>; 2] {
        let of =
            |p: &Path| std::fs::metadata(p).ok().and_then(|m| Some((m.modified().ok()?, m.len())));
        [of(&self.cert), of(&self.key)]
    }

    /// Reads the pair again when the files change, every `tls.reload_ms`,
    /// until `stop`. A pair that does not load is logged and the previous
    /// one kept.
    pub(crate) async fn watch(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        if self.reload.is_zero() {
            return;
        }
        let mut seen = self.stamp();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(self.reload) => {}
                _ = async { let _ = stop.wait_for(|v| *v).await; } => return,
            }
            let now = self.stamp();
            if now == seen {
                continue;
            }
            seen = now;
            match load_identity(&self.cert, &self.key) {
                Ok(identity) => {
                    self.current.0.store(identity);
                    tracing::info!(cert = %self.cert.display(), "TLS certificate reloaded");
                }
                Err(e) => {
                    tracing::error!(error = %e, "TLS certificate changed but does not load; keeping the previous one");
                }
            }
        }
    }
}

/// The rustls configuration for connections to https:// engines and peers:
/// `tls.ca` as the only trust anchors, `tls.client_cert` presented when
/// asked. `None` without `tls.ca` (then only http:// is allowed).
pub(crate) fn client_config(c: &TlsConfig) -> Result<Option<ClientConfig>, String> {
    let Some(ca) = &c.ca else { return Ok(None) };
    let identity = c.client_cert.as_deref().zip(c.client_key.as_deref());
    let mut config = client_config_with(ca, identity)?;
    config.alpn_protocols = vec![ALPN_HTTP1.to_vec()];
    Ok(Some(config))
}

/// A client configuration on kvgate's provider that trusts only the CA
/// bundle at `ca` and presents `identity` (certificate chain, key) when
/// asked: the HTTPS clients' and the NATS connection's.
pub(crate) fn client_config_with(
    ca: &Path,
    identity: Option<(&Path, &Path)>,
) -> Result<ClientConfig, String> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots(ca)?);
    Ok(match identity {
        Some((cert, key)) => {
            let (certs, der) = (read_certs(cert)?, read_key(key)?);
            // Checked as the server's pair is, for the same mistakes.
            certified(certs.clone(), der.clone_key(), cert, key)?;
            builder
                .with_client_auth_cert(certs, der)
                .map_err(|e| format!("{}: {e}", cert.display()))?
        }
        None => builder.with_no_client_auth(),
    })
}

#[cfg(test)]
mod tests;
