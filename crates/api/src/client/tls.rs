//! The client side of `https://` addresses: rustls with the ring provider, trusting either one
//! private CA file or the system's roots.

use std::{fmt, io, path::Path, sync::Arc};

use rustls::{
    RootCertStore,
    pki_types::{CertificateDer, ServerName, pem::PemObject as _},
};
use tokio::net::TcpStream;

/// Largest CA file read, in bytes.
const MAX_CA_BYTES: u64 = 1 << 20;

/// Why a CA file or the system's roots cannot be used; the text names the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TrustError(String);

/// A TLS connector; cheap to clone.
#[derive(Clone)]
pub(super) struct ClientTls(tokio_rustls::TlsConnector);

impl fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientTls").finish_non_exhaustive()
    }
}

impl ClientTls {
    /// Trusts the certificates of the PEM file `ca_file`, and nothing else.
    pub(super) fn with_ca_file(ca_file: &Path) -> Result<Self, TrustError> {
        use std::io::Read as _;
        let shown = ca_file.display();
        let mut pem = Vec::new();
        std::fs::File::open(ca_file)
            .and_then(|f| f.take(MAX_CA_BYTES + 1).read_to_end(&mut pem))
            .map_err(|e| TrustError(format!("CA certificate file {shown}: {e}")))?;
        if pem.len() as u64 > MAX_CA_BYTES {
            return Err(TrustError(format!(
                "CA certificate file {shown}: larger than {MAX_CA_BYTES} bytes"
            )));
        }
        let certs = CertificateDer::pem_slice_iter(&pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| TrustError(format!("CA certificate file {shown}: not valid PEM")))?;
        if certs.is_empty() {
            return Err(TrustError(format!(
                "CA certificate file {shown}: holds no CERTIFICATE block"
            )));
        }
        let mut roots = RootCertStore::empty();
        for cert in certs {
            roots
                .add(cert)
                .map_err(|e| TrustError(format!("CA certificate file {shown}: {e}")))?;
        }
        Self::with_roots(roots)
    }

    /// Trusts the system's roots.
    pub(super) fn system() -> Result<Self, TrustError> {
        let found = rustls_native_certs::load_native_certs();
        let mut roots = RootCertStore::empty();
        let (added, _) = roots.add_parsable_certificates(found.certs);
        if added == 0 {
            return Err(TrustError(
                "no trusted root certificate found on this system; give the agent's CA with \
                 --ca-cert (or BERTH_CACERT)"
                    .into(),
            ));
        }
        Self::with_roots(roots)
    }

    fn with_roots(roots: RootCertStore) -> Result<Self, TrustError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| TrustError(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self(tokio_rustls::TlsConnector::from(Arc::new(config))))
    }

    /// The TLS handshake over `stream`, checking the agent's certificate against `host`.
    pub(super) async fn connect(
        &self,
        host: &str,
        stream: TcpStream,
    ) -> io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let name = ServerName::try_from(host.to_string())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        self.0.connect(name, stream).await
    }
}
