//! The accept loop: the router on hyper's HTTP/1.1 connections, with graceful shutdown and
//! the time limits `axum::serve` leaves out.
//!
//! *Why not `axum::serve`.* It builds each connection with hyper-util's protocol-sniffing
//! builder and no timer, so hyper's request-head timeout never runs: a client that connects
//! and sends nothing, or trickles a request head a byte at a time (slowloris), or keeps an
//! idle keep-alive connection forever, holds a connection task and a file descriptor for
//! good, and anyone who can reach the port can pile them up without a token. Here each
//! connection is hyper's own HTTP/1.1 connection (the only protocol the server speaks) with
//! a Tokio timer and `--http-idle-timeout-ms` as its head-read timeout: a connection must
//! deliver a whole request head within it — after connecting, and after each response (the
//! keep-alive wait). A response in progress (an SSE stream, a long download) and an upgraded
//! WebSocket are not idle: the timeout only runs while hyper waits for a request head.
//! The same limit holds while a handler waits for the request's body ([`IdleBody`]): a body
//! that sends no byte for it fails the request with 408 (a client that trickles a body
//! would otherwise hold its connection and up to `--max-body-bytes` of buffer). Writes that
//! stall are [`crate::stall`]'s concern, beneath this.
//!
//! Graceful shutdown as `axum::serve` does it: when `signal` resolves, the listener is
//! dropped (the port closes), every connection finishes the request it is serving and
//! closes, and the returned future resolves once all have.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::serve::Listener;
use axum::Router;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::sync::watch;
use tower::ServiceExt;

/// Default `--http-idle-timeout-ms` (nginx waits 60 s for a request head, 75 s between
/// keep-alive requests).
pub const HTTP_IDLE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(60);
/// The range `--http-idle-timeout-ms` accepts.
pub const HTTP_IDLE_TIMEOUT_MIN: Duration = Duration::from_millis(100);
pub const HTTP_IDLE_TIMEOUT_MAX: Duration = Duration::from_secs(3600);

/// Serves `router` on every connection `listener` accepts until `signal` resolves, then
/// shuts down gracefully (see the module docs).
pub async fn serve<L>(
    mut listener: L,
    router: Router,
    idle_timeout: Duration,
    signal: impl Future<Output = ()> + Send,
) where
    L: Listener,
{
    assert!(idle_timeout > Duration::ZERO, "an idle timeout is positive");
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(idle_timeout);
    // Told to every connection when the shutdown begins.
    let (signal_tx, signal_rx) = watch::channel(());
    // Every connection task holds a receiver: the sender sees them all gone at the end.
    let (close_tx, close_rx) = watch::channel(());
    let mut signal = std::pin::pin!(signal);
    loop {
        let (io, _peer) = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut signal => break,
        };
        // The router boxes whatever body it is given (`axum::body::Body::new`): wrapping
        // hyper's first costs no allocation of its own.
        let service = TowerToHyperService::new(router.clone().map_request(
            move |request: hyper::Request<Incoming>| {
                request.map(|body| IdleBody::new(body, idle_timeout))
            },
        ));
        let connection = http
            .serve_connection(TokioIo::new(io), service)
            .with_upgrades();
        let mut signal_rx = signal_rx.clone();
        let close_rx = close_rx.clone();
        tokio::spawn(async move {
            let mut connection = std::pin::pin!(connection);
            tokio::select! {
                // Errors are the client's (a reset, a malformed head, a timeout): hyper has
                // answered what it could; nothing for the server to do.
                _ = connection.as_mut() => {}
                _ = signal_rx.changed() => {
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.await;
                }
            }
            drop(close_rx);
        });
    }
    drop(listener);
    let _ = signal_tx.send(());
    drop(close_rx);
    close_tx.closed().await;
}

/// A request body that fails once it has delivered no byte for the limit
/// (`--http-idle-timeout-ms`); the handler reading it answers 408 (`api::read_body`).
pub struct IdleBody<B> {
    body: B,
    clock: crate::stall::Stall,
}

impl<B> IdleBody<B> {
    pub fn new(body: B, limit: Duration) -> IdleBody<B> {
        IdleBody {
            body,
            clock: crate::stall::Stall::new(limit),
        }
    }
}

/// The error of an [`IdleBody`] that ran out of time.
#[derive(Debug, thiserror::Error)]
#[error("the request body sent no byte for {} ms (--http-idle-timeout-ms)", .0.as_millis())]
pub struct BodyIdle(pub Duration);

impl<B> Body for IdleBody<B>
where
    B: Body + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = B::Data;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.body).poll_frame(cx) {
            Poll::Ready(frame) => {
                this.clock.progressed();
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending if this.clock.expired(cx) => {
                Poll::Ready(Some(Err(Box::new(BodyIdle(this.clock.limit())))))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
