//! TLS (`wss://`) with rustls and its `ring` provider, from PEM files.
//!
//! The provider is given to each configuration explicitly rather than installed as the
//! process default, so rustls never has to look for one (it panics when none is
//! installed) and an embedding program keeps its own choice.
//!
//! TLS gives privacy and protects every message against a man in the middle; the
//! cluster-secret handshake still runs inside it. TLS is mutual: a dialed peer's
//! certificate is checked against the configured CA file (a cluster CA, or a shared
//! self-signed certificate) and the host of the URL dialed, and the node presents its own
//! certificate as a client certificate. A listener asks every connection for one and checks
//! it against the same CA; the TLS layer lets a connection without one through so that the
//! connection code can decide by what it is (a peer never; a client on loopback only).
//! Once the handshake says which node a peer claims to be, its certificate must carry the
//! DNS name `node-<id>` (`names_node`), so a member cannot speak as another node.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio_rustls::rustls::client::verify_server_name;
use tokio_rustls::rustls::crypto::{ring, CryptoProvider};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio_rustls::rustls::server::{ParsedCertificate, WebPkiClientVerifier};
use tokio_rustls::rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// Where this node's certificate, its key, and the certificates it trusts live (PEM files).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsConfig {
    /// This node's certificate chain, leaf first.
    pub cert_pem: PathBuf,
    /// This node's private key (PKCS#8, PKCS#1 or SEC1).
    pub key_pem: PathBuf,
    /// The certificates that sign peers' certificates (or the peers' own self-signed ones).
    pub ca_pem: PathBuf,
}

impl TlsConfig {
    /// Reads the files and checks they make a TLS server and client, as starting a node
    /// would, without starting anything.
    ///
    /// # Errors
    /// A one-line reason naming the file when one cannot be read or used.
    pub fn check(&self) -> Result<(), String> {
        Tls::load(self).map(drop)
    }

    /// An acceptor for another listener of the same node (the agent's HTTP API): this
    /// node's certificate, and a client certificate asked for and checked against the CA
    /// when one is sent (a connection without one is the application's to judge).
    ///
    /// # Errors
    /// As [`TlsConfig::check`].
    pub fn acceptor(&self) -> Result<TlsAcceptor, String> {
        Tls::load(self).map(|t| t.acceptor)
    }
}

/// The acceptor and connector built from a [`TlsConfig`].
#[derive(Clone)]
pub(super) struct Tls {
    acceptor: TlsAcceptor,
    connector: TlsConnector,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Tls(..)")
    }
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("cannot read certificates from {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("no certificate in {}", path.display()));
    }
    Ok(certs)
}

impl Tls {
    /// Reads the files and builds the server and client configurations.
    ///
    /// # Errors
    /// A one-line reason naming the file when one cannot be read or used.
    pub(super) fn load(cfg: &TlsConfig) -> Result<Self, String> {
        let provider: Arc<CryptoProvider> = Arc::new(ring::default_provider());
        let chain = read_certs(&cfg.cert_pem)?;
        let key = PrivateKeyDer::from_pem_file(&cfg.key_pem)
            .map_err(|e| format!("cannot read a private key from {}: {e}", cfg.key_pem.display()))?;
        let mut roots = RootCertStore::empty();
        for cert in read_certs(&cfg.ca_pem)? {
            roots
                .add(cert)
                .map_err(|e| format!("cannot trust a certificate of {}: {e}", cfg.ca_pem.display()))?;
        }
        let roots = Arc::new(roots);
        // Asked for and checked when sent; a connection without one is sorted out later.
        let verifier = WebPkiClientVerifier::builder_with_provider(Arc::clone(&roots), Arc::clone(&provider))
            .allow_unauthenticated()
            .build()
            .map_err(|e| {
                format!(
                    "cannot check client certificates against {}: {e}",
                    cfg.ca_pem.display()
                )
            })?;
        let server = ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(|e| format!("the certificate and key do not make a TLS server: {e}"))?;
        let client = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .map_err(|e| format!("the certificate and key do not make a TLS client: {e}"))?;
        Ok(Self {
            acceptor: TlsAcceptor::from(Arc::new(server)),
            connector: TlsConnector::from(Arc::new(client)),
        })
    }

    /// Wraps accepted connections.
    pub(super) fn acceptor(&self) -> TlsAcceptor {
        self.acceptor.clone()
    }

    /// Wraps dialed connections.
    pub(super) fn connector(&self) -> TlsConnector {
        self.connector.clone()
    }
}

/// The leaf of the certificates a connection's other side showed.
pub(super) fn leaf(certs: Option<&[CertificateDer<'static>]>) -> super::conn::PeerCert {
    match certs.and_then(<[_]>::first) {
        Some(cert) => super::conn::PeerCert::Shown(cert.clone()),
        None => super::conn::PeerCert::Missing,
    }
}

/// Whether `cert` carries the DNS name `node-<id>`: the rule that binds a node id to a
/// certificate (see docs/design.md). `cert` was verified against the CA already.
pub(super) fn names_node(cert: &CertificateDer<'_>, id: &str) -> bool {
    let Ok(parsed) = ParsedCertificate::try_from(cert) else {
        return false;
    };
    let Ok(name) = ServerName::try_from(format!("node-{id}")) else {
        return false;
    };
    verify_server_name(&parsed, &name).is_ok()
}

/// The name a dialed peer's certificate must carry: the URL's host (a DNS name or an IP).
pub(super) fn server_name(host: &str) -> Result<ServerName<'static>, String> {
    ServerName::try_from(host.to_string())
        .map_err(|e| format!("cannot check a certificate for {host:?}: {e}"))
}

/// TLS for a client of a node's client protocol (the `roster` CLI): the CA that signs the
/// node's certificate and, when the node asks for one (clients not on loopback), the
/// client's own certificate and key.
#[derive(Clone)]
pub struct ClientTls {
    connector: TlsConnector,
}

impl fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClientTls(..)")
    }
}

impl ClientTls {
    /// Reads the CA file and, with `identity`, the client's certificate chain and key.
    ///
    /// # Errors
    /// A one-line reason naming the file when one cannot be read or used.
    pub fn load(ca_pem: &Path, identity: Option<(&Path, &Path)>) -> Result<Self, String> {
        let provider: Arc<CryptoProvider> = Arc::new(ring::default_provider());
        let mut roots = RootCertStore::empty();
        for cert in read_certs(ca_pem)? {
            roots
                .add(cert)
                .map_err(|e| format!("cannot trust a certificate of {}: {e}", ca_pem.display()))?;
        }
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?
            .with_root_certificates(roots);
        let config = match identity {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => {
                let chain = read_certs(cert)?;
                let key = PrivateKeyDer::from_pem_file(key)
                    .map_err(|e| format!("cannot read a private key from {}: {e}", key.display()))?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| format!("the certificate and key do not make a TLS client: {e}"))?
            }
        };
        Ok(Self {
            connector: TlsConnector::from(Arc::new(config)),
        })
    }

    /// Runs TLS over `tcp`, checking that the node's certificate names `host`.
    ///
    /// # Errors
    /// The TLS handshake failed, or `host` cannot be checked against a certificate.
    pub async fn connect(
        &self,
        tcp: tokio::net::TcpStream,
        host: &str,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
        let name = server_name(host).map_err(std::io::Error::other)?;
        self.connector.connect(name, tcp).await
    }
}
