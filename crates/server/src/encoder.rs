//! Bulk encoding (a large snapshot's chunks) on threads of its own, off the runtime's
//! workers.
//!
//! *Why.* The runtime's workers are among the threads a write's acknowledgement waits on, so
//! they ask the scheduler for short slices (`sluice serve --ack-slice-us`), and a thread
//! that wakes with a short slice preempts one running a long slice. Encoding a 5 M-row
//! snapshot kept both workers busy for a second at a time: to the scheduler they were
//! CPU-bound threads with the same short slice as the writer, each preempted only at the
//! 4 ms tick, and `perf sched timehist` showed the writer thread runnable but waiting 3.9 ms
//! behind them while a writer's acknowledgement took 12 ms. Here the chunks are encoded by
//! [`Encoder`] threads that keep the kernel's default slice, at nice [`ENCODE_NICE`], so the
//! writer's threads preempt them when they wake; the workers only hand chunks on and write
//! sockets.
//!
//! One chunk is about a millisecond of CPU: the hand-off (a channel send and a oneshot
//! wake) is noise beside it. Encoding is pure (it reads a frozen version of the rows), so
//! running it on another thread changes no result and no order — each subscriber still
//! encodes its chunks one after another.

use std::sync::mpsc;
use std::sync::{Arc, Mutex};

type Job = Box<dyn FnOnce() + Send>;

/// Nice value of the encoder threads. Measured at 5 M rows, three transports per run
/// (`sluice bench bootstrap`): the slowest writer ack was 4.5–12.3 ms at nice 0, 3.5–8.1 ms
/// at nice 5 and 4.3–7.3 ms at nice 10, with the same snapshot rows/s (the client's
/// parsing, not the encoding, sets the pace on two shared cores).
const ENCODE_NICE: i32 = 5;

/// Threads that run encoding jobs in the order they were queued.
#[derive(Clone)]
pub(crate) struct Encoder {
    jobs: mpsc::Sender<Job>,
}

impl Encoder {
    /// Starts `threads` encoder threads (at least one). They end when every `Encoder`
    /// clone is dropped. Call it from a thread with the default scheduler slice: a thread
    /// inherits its creator's.
    pub(crate) fn start(threads: usize) -> std::io::Result<Encoder> {
        let (jobs, queue) = mpsc::channel::<Job>();
        let queue = Arc::new(Mutex::new(queue));
        for i in 0..threads.max(1) {
            let queue = queue.clone();
            std::thread::Builder::new()
                .name(format!("sluice-encode-{i}"))
                .spawn(move || {
                    // Best effort: a refusal only costs latency.
                    if let Err(e) = sluice_sched::set_nice(ENCODE_NICE) {
                        tracing::debug!(error = %e, "an encoder thread keeps its priority");
                    }
                    loop {
                        // The lock is held only to take one job, never while running it.
                        let job = match queue.lock() {
                            Ok(q) => q.recv(),
                            Err(_) => return,
                        };
                        let Ok(job) = job else { return };
                        job();
                    }
                })?;
        }
        Ok(Encoder { jobs })
    }

    /// Threads for a machine with `cores` CPUs: half of them, at least one (encoding must
    /// not take every core from the writer's threads and the other connections).
    pub(crate) fn threads_for(cores: usize) -> usize {
        (cores / 2).max(1)
    }

    /// Runs `f` on an encoder thread and returns its result. If no encoder thread is left
    /// it runs here instead; a panic in `f` is resumed in the caller.
    pub(crate) async fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move || {
            let _ = tx.send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)));
        });
        if let Err(mpsc::SendError(job)) = self.jobs.send(job) {
            job();
        }
        match rx.await {
            Ok(Ok(value)) => value,
            Ok(Err(panic)) => std::panic::resume_unwind(panic),
            Err(_) => panic!("an encoder thread ended with a job queued"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn jobs_run_on_encoder_threads_and_return_their_results() {
        let encoder = Encoder::start(2).unwrap();
        let here = std::thread::current().id();
        let mut handles = Vec::new();
        for i in 0..20u64 {
            let encoder = encoder.clone();
            handles.push(tokio::spawn(async move {
                encoder
                    .run(move || {
                        let name = std::thread::current().name().map(str::to_owned);
                        (i * i, std::thread::current().id(), name)
                    })
                    .await
            }));
        }
        for (i, h) in handles.into_iter().enumerate() {
            let (square, thread, name) = h.await.unwrap();
            assert_eq!(square, (i * i) as u64);
            assert_ne!(thread, here);
            assert!(name.unwrap().starts_with("sluice-encode-"));
        }
    }

    #[tokio::test]
    async fn a_panicking_job_panics_its_caller_and_the_encoder_goes_on() {
        let encoder = Encoder::start(1).unwrap();
        let e = encoder.clone();
        let failed = tokio::spawn(async move { e.run(|| -> u32 { panic!("boom") }).await }).await;
        assert!(failed.unwrap_err().is_panic());
        assert_eq!(encoder.run(|| 7).await, 7);
    }

    #[test]
    fn half_the_cores_encode_and_never_none() {
        assert_eq!(Encoder::threads_for(1), 1);
        assert_eq!(Encoder::threads_for(2), 1);
        assert_eq!(Encoder::threads_for(16), 8);
    }
}
