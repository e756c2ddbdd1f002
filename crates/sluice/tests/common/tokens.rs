//! Helpers for the token tests (crates/sluice/tests/tokens_*.rs): hand-made JWTs, and an
//! HTTPS / `wss://` client that trusts exactly the server's self-signed certificate.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::rustls;
use tokio_rustls::rustls::client::danger::{
    HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier,
};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use tokio_rustls::rustls::{DigitallySignedStruct, SignatureScheme};

/// The HS256 secret the token tests start servers with (`--jwt-secret`).
pub const SECRET: &str = "tokens-test-secret-0123456789";

/// An RSA public key (generated for these tests; its private key is not kept): a server
/// started with it as `--jwt-public-key` accepts RS256 only.
pub const RSA_PUBLIC_PEM: &str = "-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEAvtIjX3xxtBoBTwNMW+YK\nZXwpecQFwZyAtovlfpiVVExHfqCjEK+6YmuBclOI/TXbkjSBMLz98K6TknjTmm6Q\nDbbCK4ieEhMYmXwSIYBdBVSKeru6+UW0acTmB40ApjlvLs/fJY6Nc+CL16VtXdub\nKIQFw3weaRGQTY/49exeQgbCU9M8opQAf1JR9lW2Pm+WpVdRRxFWxBb3sYXrfle3\nqOdtZbVqLcfInNgENnr56qaQnVp+m6NjOoABNDs+kHvOCchsKya9thSPslRM6fAu\ngGcEUZquKawT5nDD5aHWU8I+4rd/+VhVegJzQc+qiHE6+oR+rozrwMYySiShPFPf\ngQIDAQAB\n-----END PUBLIC KEY-----";

/// Seconds since the epoch.
pub fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// Unpadded base64url, as in a JWT.
pub fn b64url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..=chunk.len() {
            out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}

/// A JWT with this header and these claims and a made-up signature (for refusals decided
/// before the signature is checked: `alg: none`, another algorithm).
pub fn unsigned(header: &Value, claims: &Value, signature: &str) -> String {
    format!(
        "{}.{}.{signature}",
        b64url(header.to_string().as_bytes()),
        b64url(claims.to_string().as_bytes())
    )
}

/// An HS256 token with exactly these claims, signed with `secret`.
pub fn hs256(secret: &str, claims: Value) -> String {
    match claims {
        Value::Object(map) => sluice_server::auth::encode_hs256(secret, &map),
        other => panic!("claims must be an object: {other}"),
    }
}

/// A valid client token of [`SECRET`] for `sub`, good for an hour.
pub fn client_token(sub: &str) -> String {
    sluice_server::auth::mint_hs256(SECRET, sub, &Map::new(), Duration::from_secs(3600))
}

/// Makes a self-signed certificate for `localhost` / 127.0.0.1 with `openssl req -x509`
/// into `dir` (`cert.pem`, `key.pem`); `None` when `openssl` is not installed.
pub fn self_signed_cert(dir: &Path) -> Option<(std::path::PathBuf, std::path::PathBuf)> {
    let cert = dir.join("cert.pem");
    let key = dir.join("key.pem");
    let out = std::process::Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ])
        .args(["-subj", "/CN=localhost"])
        .args(["-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output();
    match out {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => panic!("run openssl: {e}"),
        Ok(out) => {
            assert!(
                out.status.success(),
                "openssl req failed: {}",
                crate::common::describe(&out)
            );
            Some((cert, key))
        }
    }
}

/// Trusts exactly one certificate (the test's self-signed one); signatures are still
/// checked.
#[derive(Debug)]
struct Pinned {
    cert: CertificateDer<'static>,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if end_entity.as_ref() == self.cert.as_ref() {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::General("not the pinned certificate".into()))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// Opens a TLS connection to `addr` trusting only the certificate in `cert_pem`.
pub async fn tls_connect(
    addr: SocketAddr,
    cert_pem: &Path,
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let cert = CertificateDer::from_pem_file(cert_pem).expect("read the test certificate");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(Pinned { cert, provider }))
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let name = ServerName::try_from("localhost").unwrap();
    tokio::time::timeout(Duration::from_secs(30), connector.connect(name, tcp))
        .await
        .expect("a TLS handshake within 30 s")
        .expect("a TLS handshake")
}

/// `GET path` over HTTPS with `Connection: close`; the status and the body.
pub async fn https_get(
    addr: SocketAddr,
    cert_pem: &Path,
    path: &str,
    token: &str,
) -> (u16, String) {
    let mut tls = tls_connect(addr, cert_pem).await;
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    );
    tls.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(30), tls.read_to_end(&mut response))
        .await
        .expect("a response within 30 s");
    // A peer that closes without close_notify ends the read with UnexpectedEof; what came
    // before is the whole response.
    if let Err(e) = read {
        assert!(
            e.kind() == std::io::ErrorKind::UnexpectedEof && !response.is_empty(),
            "read the response: {e}"
        );
    }
    let text = String::from_utf8_lossy(&response).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {text:?}"));
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}
