//! TLS for the API's TCP listener: a certificate chain and its key, read from PEM files (rustls
//! with the ring provider; TLS 1.2 and 1.3, HTTP/1.1 by ALPN). The unix socket stays plain.

use std::{
    fmt, io,
    path::{Path, PathBuf},
    sync::Arc,
};

use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject as _};

/// Largest PEM file read, in bytes.
const MAX_PEM_BYTES: u64 = 1 << 20;

/// Why the TLS files cannot be used. Names the file and its field (`cert_file`, `key_file`);
/// never repeats the key.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file cannot be read.
    #[error("{field} {}: cannot read it: {source}", path.display())]
    Read {
        /// `cert_file` or `key_file`.
        field: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A file does not hold what it should.
    #[error("{field} {}: {reason}", path.display())]
    Invalid {
        /// `cert_file` or `key_file`.
        field: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

impl TlsError {
    /// The field at fault: `cert_file` or `key_file`.
    pub fn field(&self) -> &'static str {
        match self {
            Self::Read { field, .. } | Self::Invalid { field, .. } => field,
        }
    }
}

/// The TCP listener's TLS settings; cheap to clone.
#[derive(Clone)]
pub struct ServerTls {
    pub(super) acceptor: tokio_rustls::TlsAcceptor,
}

impl fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerTls").finish_non_exhaustive()
    }
}

impl ServerTls {
    /// Reads a PEM certificate chain (leaf first) and its PEM private key (PKCS#8, PKCS#1 or
    /// SEC1), and checks that the key is the certificate's.
    pub fn load(cert_file: &Path, key_file: &Path) -> Result<Self, TlsError> {
        let invalid = |field, path: &Path, reason: String| TlsError::Invalid {
            field,
            path: path.to_path_buf(),
            reason,
        };
        let cert_pem = read_pem("cert_file", cert_file)?;
        let certs = CertificateDer::pem_slice_iter(&cert_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| invalid("cert_file", cert_file, "is not valid PEM".into()))?;
        if certs.is_empty() {
            return Err(invalid(
                "cert_file",
                cert_file,
                "holds no CERTIFICATE block".into(),
            ));
        }
        let key_pem = read_pem("key_file", key_file)?;
        // The parser's error could quote the file: only its kind is told.
        let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|_| {
            invalid(
                "key_file",
                key_file,
                "holds no private key in PEM (PKCS#8, PKCS#1 or SEC1)".into(),
            )
        })?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| invalid("cert_file", cert_file, e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .map_err(|e| {
                invalid(
                    "key_file",
                    key_file,
                    format!("cannot be used with the certificate: {e}"),
                )
            })?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self {
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
        })
    }
}

/// A PEM file, at most [`MAX_PEM_BYTES`].
fn read_pem(field: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    use std::io::Read as _;
    let read_err = |source| TlsError::Read {
        field,
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read_err)?;
    let mut bytes = Vec::new();
    file.take(MAX_PEM_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(read_err)?;
    if bytes.len() as u64 > MAX_PEM_BYTES {
        return Err(TlsError::Invalid {
            field,
            path: path.to_path_buf(),
            reason: format!("is larger than {MAX_PEM_BYTES} bytes"),
        });
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".into()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let (c, k) = (
            dir.join(format!("{name}.crt")),
            dir.join(format!("{name}.key")),
        );
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        (c, k)
    }

    #[test]
    fn a_pair_loads_and_bad_files_name_their_field() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = pair(dir.path(), "a");
        let (_, other_key) = pair(dir.path(), "b");
        ServerTls::load(&cert, &key).expect("loads");

        let err = ServerTls::load(&dir.path().join("missing"), &key).unwrap_err();
        assert_eq!(err.field(), "cert_file", "{err}");
        // A key where the certificate should be, and the other way round.
        let err = ServerTls::load(&key, &key).unwrap_err();
        assert_eq!(err.field(), "cert_file", "{err}");
        assert!(err.to_string().contains("no CERTIFICATE"), "{err}");
        let err = ServerTls::load(&cert, &cert).unwrap_err();
        assert_eq!(err.field(), "key_file", "{err}");
        let key_text = std::fs::read_to_string(&other_key).unwrap();
        let err = ServerTls::load(&cert, &other_key).unwrap_err();
        assert_eq!(err.field(), "key_file", "{err}");
        let body: String = key_text.lines().nth(1).unwrap().chars().take(20).collect();
        assert!(!err.to_string().contains(&body), "{err}");
    }
}
