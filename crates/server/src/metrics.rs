//! `/metrics` in the Prometheus text exposition format.

use std::fmt::Write;
use std::sync::atomic::Ordering;

use sluice_log::writer::SYNC_LATENCY_BUCKETS;

use crate::core::Core;

/// Series the binary appends to every `/metrics` answer (its allocator's counters); set
/// once, before serving.
static HOOK: std::sync::OnceLock<fn(&mut String)> = std::sync::OnceLock::new();

/// Registers `render` to append its own series to `/metrics`. The first registration wins;
/// `false` if one was already there.
pub fn add_metrics_hook(render: fn(&mut String)) -> bool {
    HOOK.set(render).is_ok()
}

pub(crate) fn render(core: &Core) -> String {
    let c = core.counters();
    let log = core.log_stats();
    let mut out = String::with_capacity(4096);
    let mut counter = |name: &str, help: &str, value: u64| {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
        );
    };
    counter(
        "sluice_commits_total",
        "Transactions committed.",
        c.commits.load(Ordering::Relaxed),
    );
    counter(
        "sluice_stalled_connections_total",
        "Connections closed because the client took no byte of a write for --write-timeout-ms.",
        c.stalled_connections.load(Ordering::Relaxed),
    );
    counter(
        "sluice_rejected_total",
        "Transactions refused (nothing applied).",
        c.rejected.load(Ordering::Relaxed),
    );
    counter(
        "sluice_writer_batches_total",
        "Writer rounds (one lock, one log submit each).",
        c.writer_batches.load(Ordering::Relaxed),
    );
    let live = core.live().stats();
    counter(
        "sluice_live_commits_total",
        "Commits the live-query thread followed.",
        live.commits,
    );
    counter(
        "sluice_live_view_updates_total",
        "View updates (one per view a commit was routed to).",
        live.view_updates,
    );
    counter(
        "sluice_live_diffs_total",
        "Diff events produced (one per view per commit that changed it).",
        live.diffs,
    );
    counter(
        "sluice_live_resets_total",
        "Subscriber backlogs coalesced into a reset snapshot.",
        live.resets,
    );
    counter(
        "sluice_live_slow_closed_total",
        "Subscriptions closed for falling behind (slow_subscriber).",
        live.slow_closed,
    );
    counter(
        "sluice_live_refills_total",
        "Top-k views whose kept rows ran short of their window and were read again.",
        live.refills,
    );
    counter(
        "sluice_log_syncs_total",
        "fdatasync calls on the log.",
        log.syncs,
    );
    counter(
        "sluice_log_inline_syncs_total",
        "Log syncs the log thread ran itself because recent syncs were fast (--log-sync-inline-below-us); the rest were handed to sync threads.",
        log.inline_syncs,
    );
    counter(
        "sluice_log_writes_total",
        "write calls on the log.",
        log.writes,
    );
    counter(
        "sluice_log_bytes_total",
        "Bytes written to the log.",
        log.bytes_written,
    );
    counter(
        "sluice_log_frames_total",
        "Frames written to the log.",
        log.frames_written,
    );
    counter(
        "sluice_log_synced_commits_total",
        "fsync-class commits acknowledged by a sync.",
        log.synced_commits,
    );
    counter(
        "sluice_snapshots_total",
        "Snapshots written.",
        c.snapshots.load(Ordering::Relaxed),
    );
    counter(
        "sluice_snapshot_failures_total",
        "Snapshots that failed.",
        c.snapshot_failures.load(Ordering::Relaxed),
    );
    counter(
        "sluice_snapshots_damaged_total",
        "Snapshots that startup replayed the whole log in place of and then found damaged (moved aside to *.damaged).",
        core.shared.startup_check.damaged(),
    );
    counter(
        "sluice_segments_created_total",
        "Log segments started.",
        log.segments_created,
    );
    counter(
        "sluice_segments_prepared_total",
        "Of the log segments started, those written over a prepared (zero-filled, synced) file.",
        log.segments_prepared,
    );
    counter(
        "sluice_segments_retired_total",
        "Log segments deleted after a snapshot.",
        log.segments_retired,
    );
    let per_sync = if log.syncs == 0 {
        0.0
    } else {
        log.synced_commits as f64 / log.syncs as f64
    };
    let _ = writeln!(out, "# HELP sluice_commits_per_sync fsync-class commits per sync (group commit factor).\n# TYPE sluice_commits_per_sync gauge\nsluice_commits_per_sync {per_sync}");
    let _ = writeln!(out, "# HELP sluice_log_sync_recent_seconds Moving average of recent log sync latencies (below --log-sync-inline-below-us the log thread syncs itself).\n# TYPE sluice_log_sync_recent_seconds gauge\nsluice_log_sync_recent_seconds {}", log.sync_recent_us as f64 / 1e6);
    let _ = writeln!(out, "# HELP sluice_writer_nice Nice value the writer thread runs at (--writer-nice while it has a backlog, where the system allows it).\n# TYPE sluice_writer_nice gauge\nsluice_writer_nice {}", c.writer_nice.load(Ordering::Relaxed));
    let _ = writeln!(out, "# HELP sluice_writer_boosts_total Times the writer raised its priority to --writer-nice for a backlog.\n# TYPE sluice_writer_boosts_total counter\nsluice_writer_boosts_total {}", c.writer_boosts.load(Ordering::Relaxed));
    let _ = writeln!(out, "# HELP sluice_seq_confirmed Newest seq that reached its durability class.\n# TYPE sluice_seq_confirmed gauge\nsluice_seq_confirmed {}", core.confirmed_seq());
    let _ = writeln!(out, "# HELP sluice_live_views Live views held (subscribed or warm).\n# TYPE sluice_live_views gauge\nsluice_live_views {}", live.views);
    let _ = writeln!(out, "# HELP sluice_live_subscribers Live subscriptions open.\n# TYPE sluice_live_subscribers gauge\nsluice_live_subscribers {}", live.subscribers);
    let _ = writeln!(out, "# HELP sluice_log_poisoned 1 if the log refused writes after a failed sync.\n# TYPE sluice_log_poisoned gauge\nsluice_log_poisoned {}", core.poisoned().is_some() as u8);
    // Every bounded queue: its depth now, the most it held, its bound, and how often a
    // producer waited on it (back-pressure).
    let handoff = core.live().handoff();
    let ws_inflight = c.ws_inflight.load(Ordering::Relaxed);
    let config = core.config();
    let mut gauge = |name: &str, help: &str, value: u64| {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
        );
    };
    gauge(
        "sluice_snapshot_bytes",
        "Bytes of the newest snapshot (it paces the next: --snapshot-log-percent).",
        c.snapshot_bytes.load(Ordering::Relaxed),
    );
    gauge(
        "sluice_log_pending_bytes",
        "Log bytes submitted and not yet taken by the log thread.",
        log.pending_bytes,
    );
    gauge(
        "sluice_log_pending_bytes_peak",
        "Most log bytes pending at once since start.",
        log.pending_bytes_peak,
    );
    gauge(
        "sluice_log_pending_bytes_max",
        "Bound of the log's pending bytes (--log-pending-bytes).",
        log.pending_bytes_max,
    );
    gauge(
        "sluice_log_submit_waits",
        "Writer rounds that waited for the log to take pending bytes.",
        log.submit_waits,
    );
    gauge(
        "sluice_live_handoff_commits",
        "Commits handed to the live thread and not yet applied.",
        handoff.queued_commits as u64,
    );
    gauge(
        "sluice_live_handoff_commits_peak",
        "Most commits queued for the live thread at once since start.",
        handoff.queued_commits_peak as u64,
    );
    gauge(
        "sluice_live_handoff_commits_max",
        "Bound of the live hand-off (--live-handoff-commits).",
        config.live.handoff_commits_max as u64,
    );
    gauge(
        "sluice_live_handoff_waits",
        "Writer rounds that waited for the live thread.",
        handoff.waits,
    );
    gauge(
        "sluice_writer_queue_max",
        "Requests queued for the writer before callers wait.",
        config.writer_queue_max as u64,
    );
    gauge(
        "sluice_ws_connections",
        "WebSocket connections open.",
        c.ws_connections.load(Ordering::Relaxed),
    );
    gauge(
        "sluice_ws_inflight_requests",
        "WebSocket requests in flight (read, reply not yet written), all connections.",
        ws_inflight,
    );
    gauge(
        "sluice_ws_inflight_requests_max",
        "Bound of requests in flight per connection (--ws-inflight-requests).",
        config.ws_inflight_max as u64,
    );
    gauge(
        "sluice_ws_outbound_messages_max",
        "Bound of messages queued per connection (--ws-outbound-messages).",
        config.ws_outbound_max as u64,
    );
    let hub = &core.shared.hub.counters;
    let topics = core.db().topics.len() as u64;
    gauge("sluice_topics", "Topics in the database.", topics);
    gauge(
        "sluice_topic_records_routed_total",
        "Records the topics thread routed to watchers once confirmed (appended records).",
        hub.records_routed.load(Ordering::Relaxed),
    );
    gauge(
        "sluice_topic_deliveries_total",
        "Records queued for a watcher (one per record per watcher it reached).",
        hub.deliveries.load(Ordering::Relaxed),
    );
    gauge(
        "sluice_topic_watchers",
        "Topic watches open (SSE and WebSocket).",
        hub.watchers.load(Ordering::Relaxed),
    );
    gauge(
        "sluice_topic_watches_opened_total",
        "Topic watches opened since start.",
        hub.watches_opened.load(Ordering::Relaxed),
    );
    gauge(
        "sluice_topic_lagging_total",
        "Watchers cut off with `lagging` because their queue was full.",
        hub.lagging.load(Ordering::Relaxed),
    );
    gauge(
        "sluice_topic_watch_queue_records_max",
        "Bound of one watcher's queue (--watch-queue-records).",
        config.watch_queue_records as u64,
    );
    let r = core.recovery();
    // A snapshot the whole log stood in for and then failed its check (after ready) was no
    // base at all: the figures read as recovery from the log alone, as they would have had
    // it been checked first.
    let (replayed, whole_log) = if core.shared.startup_check.damaged() > 0 {
        (r.seq, false)
    } else {
        (r.replayed, r.whole_log)
    };
    let _ = writeln!(out, "# HELP sluice_recovery_seconds Time recovery took at startup.\n# TYPE sluice_recovery_seconds gauge\nsluice_recovery_seconds {}", r.duration.as_secs_f64());
    let _ = writeln!(out, "# HELP sluice_recovery_replayed Commits replayed from the log at startup.\n# TYPE sluice_recovery_replayed gauge\nsluice_recovery_replayed {}", replayed);
    let _ = writeln!(out, "# HELP sluice_recovery_whole_log 1 if startup replayed the whole log in place of the snapshot it covers (cheaper when the changelog window needs every commit anyway).\n# TYPE sluice_recovery_whole_log gauge\nsluice_recovery_whole_log {}", u8::from(whole_log));
    for (phase, help, d) in [
        ("snapshot", "loading the snapshot", r.phases.snapshot),
        (
            "read_check",
            "waiting for segments to be read and their frames checked (a reader thread runs one segment ahead)",
            r.phases.read_check,
        ),
        (
            "window",
            "rebuilding the changelog window from commits at or before the snapshot",
            r.phases.window,
        ),
        (
            "replay",
            "decoding and applying the commits after the snapshot",
            r.phases.replay,
        ),
        (
            "build",
            "building tables held back for a bulk build",
            r.phases.build,
        ),
    ] {
        let _ = writeln!(out, "# HELP sluice_recovery_{phase}_seconds Time recovery spent {help}.\n# TYPE sluice_recovery_{phase}_seconds gauge\nsluice_recovery_{phase}_seconds {}", d.as_secs_f64());
    }
    let name = "sluice_log_sync_seconds";
    let _ = writeln!(
        out,
        "# HELP {name} fdatasync latency.\n# TYPE {name} histogram"
    );
    let mut cumulative = 0;
    for (i, n) in log.sync_latency_us_buckets.iter().enumerate() {
        cumulative += n;
        if i + 1 == SYNC_LATENCY_BUCKETS {
            break;
        }
        let le = (1u64 << i) as f64 / 1e6;
        let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {cumulative}");
    }
    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", log.syncs);
    let _ = writeln!(out, "{name}_sum {}", log.sync_latency_us_sum as f64 / 1e6);
    let _ = writeln!(out, "{name}_count {}", log.syncs);
    for (h, name, help) in [
        (
            &c.mutate_latency,
            "sluice_mutate_seconds",
            "Mutates from queued for the writer to settled (the server's share of an ack).",
        ),
        (
            &c.writer_round_latency,
            "sluice_writer_round_seconds",
            "Writer rounds (lock, apply, unlock, hand frames to the log, memory replies).",
        ),
        (
            core.log_append_latency(),
            "sluice_log_append_seconds",
            "Writes to the active log segment (segment rolls included).",
        ),
        (
            core.log_round_latency(),
            "sluice_log_round_seconds",
            "Log thread rounds (take pending frames, write, sync if asked, complete waiters).",
        ),
    ] {
        h.render(&mut out, name, help);
    }
    core.authenticator().render_metrics(&mut out);
    if let Some(hook) = HOOK.get() {
        hook(&mut out);
    }
    out
}
