//! HTTPS and `wss://` on the listen address (`--tls-cert`, `--tls-key`): rustls with the
//! `ring` provider, behind axum's [`Listener`] so that graceful shutdown works as over
//! plain HTTP.
//!
//! Handshakes run in their own tasks (bounded by [`HANDSHAKE_TIMEOUT`]), so a client that
//! connects and never finishes its handshake holds up no one else.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::serve::Listener;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// How long a client may take to complete its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections whose handshake completed, waiting for the server to take them.
const READY_QUEUE: usize = 64;

/// The server's TLS configuration from a PEM certificate chain and a PEM private key;
/// every error names the flag and the file.
pub fn load(cert: &Path, key: &Path) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let cert_pem = std::fs::read(cert)
        .with_context(|| format!("cannot read the --tls-cert file {}", cert.display()))?;
    let chain = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| {
            anyhow::anyhow!(
                "--tls-cert {}: not a PEM certificate chain: {e}",
                cert.display()
            )
        })?;
    anyhow::ensure!(
        !chain.is_empty(),
        "--tls-cert {}: no certificate in the file (expected PEM `-----BEGIN CERTIFICATE-----`)",
        cert.display()
    );
    let key_pem = std::fs::read(key)
        .with_context(|| format!("cannot read the --tls-key file {}", key.display()))?;
    let private = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
        anyhow::anyhow!(
            "--tls-key {}: no PEM private key (PKCS#8, PKCS#1 or SEC1): {e}",
            key.display()
        )
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_no_client_auth()
        .with_single_cert(chain, private)
        .map_err(|e| {
            anyhow::anyhow!(
                "--tls-cert {} / --tls-key {}: {e}",
                cert.display(),
                key.display()
            )
        })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A listener handing axum connections whose TLS handshake completed.
pub struct TlsListener {
    addr: SocketAddr,
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
}

impl TlsListener {
    /// Accepts on `listener` in a task that ends when this listener is dropped (axum drops
    /// it when a graceful shutdown begins, which closes the port as over plain HTTP).
    pub fn spawn(
        listener: TcpListener,
        config: Arc<rustls::ServerConfig>,
        keepalive: Option<Duration>,
    ) -> std::io::Result<TlsListener> {
        let addr = listener.local_addr()?;
        let (tx, ready) = mpsc::channel(READY_QUEUE);
        let acceptor = TlsAcceptor::from(config);
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    accepted = listener.accept() => accepted,
                    () = tx.closed() => return,
                };
                let (tcp, peer) = match accepted {
                    Ok(pair) => pair,
                    Err(e) => {
                        if !is_connection_error(&e) {
                            // Out of file descriptors and the like: wait a little, as
                            // axum's own accept loop does.
                            tracing::error!("accept failed: {e}");
                            tokio::time::sleep(Duration::from_secs(1)).await;
                        }
                        continue;
                    }
                };
                crate::tune_client_socket(&tcp, keepalive);
                let acceptor = acceptor.clone();
                let tx = tx.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(stream)) => {
                            let _ = tx.send((stream, peer)).await;
                        }
                        Ok(Err(e)) => tracing::debug!(%peer, "TLS handshake failed: {e}"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(TlsListener { addr, ready })
    }
}

fn is_connection_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        ConnectionRefused | ConnectionAborted | ConnectionReset
    )
}

impl Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(connection) => connection,
            // The accept task ended (it does only once this listener is dropped).
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.addr)
    }
}
