//! Connections whose client stopped reading are closed (`--write-timeout-ms`).
//!
//! A client that keeps its TCP connection open but no longer reads it (a frozen tab, a
//! phone gone to the background, a bug) fills its receive window and then the server's send
//! buffer, and every write the server then makes to it waits forever: an HTTP response or an
//! SSE stream holds its connection task, a WebSocket its two tasks, and all of them their
//! slot under `--max-connections-per-subject`. Live subscriptions and topic watches are cut
//! off from their routes when their queues fill (`--live-queue-events`,
//! `--watch-queue-records`), so the server's memory stays bounded, but the connection stays.
//!
//! [`WriteDeadline`] wraps every accepted connection (plain TCP or TLS) beneath HTTP, so one
//! rule covers requests, SSE and upgraded WebSockets alike: a write (or flush, or shutdown)
//! that takes **no byte for the whole limit** fails with `TimedOut`. hyper then drops the
//! connection; a WebSocket's sender ends on the error, and its reader, parked on a read, is
//! woken and handed the same error, so both halves let go of the socket. A client that reads
//! slowly but reads is never cut: any write that completes — even a partial one — restarts
//! the clock. The same rule as NATS's `write_deadline` (10 s there too).
//!
//! Cost on the hot path: one branch per write that completes; the timer is armed only when a
//! write would block, and its allocation is made once per connection, the first time.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use axum::serve::Listener;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// Default `--write-timeout-ms`.
pub const WRITE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);
/// The range `--write-timeout-ms` accepts: long enough for any network that moves at all,
/// short enough that a stuck client lets go of its resources within the hour.
pub const WRITE_TIMEOUT_MIN: Duration = Duration::from_millis(100);
pub const WRITE_TIMEOUT_MAX: Duration = Duration::from_secs(3600);

/// A listener whose connections are [`WriteDeadline`]s.
pub struct StallGuard<L> {
    inner: L,
    limit: Duration,
    /// Connections closed for a stalled write (`sluice_stalled_connections_total`).
    closed: Arc<AtomicU64>,
}

impl<L> StallGuard<L> {
    pub fn new(inner: L, limit: Duration, closed: Arc<AtomicU64>) -> StallGuard<L> {
        assert!(limit > Duration::ZERO, "a write timeout is positive");
        StallGuard {
            inner,
            limit,
            closed,
        }
    }
}

impl<L: Listener> Listener for StallGuard<L> {
    type Io = WriteDeadline<L::Io>;
    type Addr = L::Addr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let (io, addr) = self.inner.accept().await;
        (
            WriteDeadline::new(io, self.limit, self.closed.clone()),
            addr,
        )
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

/// A connection whose writes fail once one of them has taken no byte for `limit` (see the
/// module docs). After that every read and write fails too.
pub struct WriteDeadline<IO> {
    io: IO,
    /// Runs while a write is blocked.
    clock: Stall,
    /// The limit passed: the connection is being closed.
    tripped: bool,
    /// The task parked on a read, woken when the connection trips (a WebSocket's reader
    /// waits for a message while its sender is the one stuck).
    reader: Option<Waker>,
    closed: Arc<AtomicU64>,
}

impl<IO> WriteDeadline<IO> {
    pub fn new(io: IO, limit: Duration, closed: Arc<AtomicU64>) -> WriteDeadline<IO> {
        WriteDeadline {
            io,
            clock: Stall::new(limit),
            tripped: false,
            reader: None,
            closed,
        }
    }

    fn stalled(&self) -> io::Error {
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "the client took no byte for {} ms (--write-timeout-ms): connection closed",
                self.clock.limit().as_millis()
            ),
        )
    }

    /// Runs one write-side poll (`write`, `flush`, `shutdown`) of the connection: fails at
    /// once if it tripped; passes on what completes; for one that would block, arms the
    /// timer (if it is not already running for this stall) and trips when it has run out.
    fn write_side<T>(
        &mut self,
        cx: &mut Context<'_>,
        poll: impl FnOnce(Pin<&mut IO>, &mut Context<'_>) -> Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>>
    where
        IO: Unpin,
    {
        if self.tripped {
            return Poll::Ready(Err(self.stalled()));
        }
        if let Poll::Ready(r) = poll(Pin::new(&mut self.io), cx) {
            self.clock.progressed();
            return Poll::Ready(r);
        }
        if !self.clock.expired(cx) {
            return Poll::Pending;
        }
        self.tripped = true;
        self.closed.fetch_add(1, Ordering::Relaxed);
        if let Some(reader) = self.reader.take() {
            reader.wake();
        }
        Poll::Ready(Err(self.stalled()))
    }
}

/// The clock of a wait that must make progress within a limit: stopped by progress,
/// started by the first poll that finds none. Its timer is made the first time it is
/// needed and re-armed for each later wait, so a wait that never blocks costs a branch.
pub(crate) struct Stall {
    limit: Duration,
    timer: Option<Pin<Box<Sleep>>>,
    /// A wait is on and `timer` runs for it.
    armed: bool,
}

impl Stall {
    pub(crate) fn new(limit: Duration) -> Stall {
        Stall {
            limit,
            timer: None,
            armed: false,
        }
    }

    /// How long a wait may go without progress.
    pub(crate) fn limit(&self) -> Duration {
        self.limit
    }

    /// Progress: the clock stops.
    #[inline]
    pub(crate) fn progressed(&mut self) {
        self.armed = false;
    }

    /// No progress this poll: starts the clock if it is stopped, and says whether the limit
    /// has passed since it started (else `cx` is woken when it does).
    pub(crate) fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        if !self.armed {
            let deadline = Instant::now() + self.limit;
            match &mut self.timer {
                Some(timer) => timer.as_mut().reset(deadline),
                None => self.timer = Some(Box::pin(tokio::time::sleep_until(deadline))),
            }
            self.armed = true;
        }
        let timer = self.timer.as_mut().expect("an armed clock has a timer");
        timer.as_mut().poll(cx).is_ready()
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for WriteDeadline<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.tripped {
            return Poll::Ready(Err(this.stalled()));
        }
        let outcome = Pin::new(&mut this.io).poll_read(cx, buf);
        if outcome.is_pending()
            && !this
                .reader
                .as_ref()
                .is_some_and(|w| w.will_wake(cx.waker()))
        {
            this.reader = Some(cx.waker().clone());
        }
        outcome
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for WriteDeadline<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut()
            .write_side(cx, |io, cx| io.poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.get_mut()
            .write_side(cx, |io, cx| io.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().write_side(cx, |io, cx| io.poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.tripped {
            // Nothing more can be sent: the connection only has to be dropped.
            return Poll::Ready(Ok(()));
        }
        this.write_side(cx, |io, cx| io.poll_shutdown(cx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Far above any limit used here: a test that hangs fails instead.
    const BOUND: Duration = Duration::from_secs(20);

    #[tokio::test]
    async fn a_write_the_client_never_takes_fails_after_the_limit_and_is_counted() {
        let (server, _client) = tokio::io::duplex(1024);
        let closed = Arc::new(AtomicU64::new(0));
        let limit = Duration::from_millis(150);
        let mut io = WriteDeadline::new(server, limit, closed.clone());
        let started = std::time::Instant::now();
        let outcome = tokio::time::timeout(BOUND, io.write_all(&[7u8; 64 << 10]))
            .await
            .expect("the write ends by itself");
        let e = outcome.expect_err("nobody reads: the write must fail");
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(e.to_string().contains("--write-timeout-ms"), "{e}");
        assert!(started.elapsed() >= limit, "not before the limit");
        assert_eq!(closed.load(Ordering::Relaxed), 1);
        // Tripped for good: later writes and reads fail at once, and are not counted again.
        assert!(io.write_all(b"x").await.is_err());
        let mut buf = [0u8; 8];
        assert!(io.read(&mut buf).await.is_err());
        assert_eq!(closed.load(Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn a_client_that_reads_slowly_is_never_cut() {
        let (server, mut client) = tokio::io::duplex(1024);
        let closed = Arc::new(AtomicU64::new(0));
        // Each 1 KiB is taken within a few ms; the stall limit is far above that, the
        // transfer as a whole (256 reads) far above it too only if the clock ran per write.
        let limit = Duration::from_millis(500);
        let mut io = WriteDeadline::new(server, limit, closed.clone());
        let total = 256 << 10;
        let reader = tokio::spawn(async move {
            let mut got = 0;
            let mut buf = vec![0u8; 1024];
            while got < total {
                tokio::time::sleep(Duration::from_millis(2)).await;
                let n = client.read(&mut buf).await.expect("reads");
                assert!(n > 0, "the writer ended early");
                got += n;
            }
            got
        });
        tokio::time::timeout(BOUND, io.write_all(&vec![1u8; total]))
            .await
            .expect("the write ends by itself")
            .expect("a client that reads is not cut");
        assert_eq!(reader.await.expect("reader"), total);
        assert_eq!(closed.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn a_stall_wakes_the_task_parked_on_a_read() {
        // As a WebSocket does: one task waits for the client's next message while another is
        // stuck writing to it. The trip must end both.
        let (server, _client) = tokio::io::duplex(1024);
        let closed = Arc::new(AtomicU64::new(0));
        let io = WriteDeadline::new(server, Duration::from_millis(100), closed.clone());
        let (mut read_half, mut write_half) = tokio::io::split(io);
        let reader = tokio::spawn(async move {
            let mut buf = [0u8; 16];
            read_half.read(&mut buf).await
        });
        let written = tokio::time::timeout(BOUND, write_half.write_all(&[0u8; 64 << 10]))
            .await
            .expect("the write ends by itself");
        assert!(written.is_err());
        let read = tokio::time::timeout(BOUND, reader)
            .await
            .expect("the parked read is woken")
            .expect("reader task");
        assert_eq!(
            read.expect_err("the read fails once tripped").kind(),
            io::ErrorKind::TimedOut
        );
        assert_eq!(closed.load(Ordering::Relaxed), 1);
    }
}
