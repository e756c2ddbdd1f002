//! A torn tail of the newest log segment is cut back to its whole frames; damage anywhere
//! else (a flipped byte in an older segment, before the tail of the newest one, or in a
//! snapshot) is reported with the file and byte offset and never silently skipped.
//!
//! Each test writes commits through the real binary with tiny segments, kills it with
//! `SIGKILL`, then damages copies of the data directory. What "whole frames" means is
//! computed independently with `sluice_log::segment::scan` and
//! `sluice_engine::codec::decode_commit`.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use common::{
    check, copy_dir, describe, file_name, flip_byte, seed, truncate_file, Rng, Server, TempDir,
};
use serde_json::json;
use sluice_engine::codec::decode_commit;
use sluice_engine::db::ReplayBody;
use sluice_engine::{ChangeOp, Key};
use sluice_log::frame::{self, Decoded};
use sluice_log::segment::{list_segments, scan};
use sluice_log::snapshot::{list_snapshots, SNAPSHOT_MAGIC};
use sluice_log::LogError;

/// Plain (growing) segments: the cuts below model a write torn at any byte of a file that
/// ends at its last frame. The zeros a prepared segment ends in after a crash are covered by
/// `recovery_reports_check_failures_before_decode_failures` and the kill -9 test.
const SEGMENT_ARGS: [&str; 5] = [
    "--durability",
    "disk",
    "--segment-bytes",
    "4096",
    "--log-unprepared-segments",
];
/// The base directory has at least this many segments…
const SEGMENTS_MIN: usize = 4;
/// …and its newest segment at least this many bytes (several frames).
const NEWEST_SEGMENT_BYTES_MIN: u64 = 800;
const INSERTS_MAX: i64 = 2000;
/// Random cut points of the newest segment, on top of the chosen ones.
const RANDOM_CUTS: usize = 24;

/// One whole frame of a segment as decoded by the test.
#[derive(Debug)]
struct FrameInfo {
    offset: u64,
    end: u64,
    seq: u64,
    /// Keys the commit inserted.
    inserted: Vec<i64>,
}

fn frames_of(path: &Path, is_newest: bool) -> Vec<FrameInfo> {
    let bytes = std::fs::read(path).unwrap();
    let mut found = Vec::new();
    let end = scan(path, &bytes, is_newest, |offset, payload| {
        let (seq, body) = decode_commit(payload)
            .unwrap_or_else(|e| panic!("{}: frame at {offset}: {e}", path.display()));
        let inserted = match body {
            ReplayBody::Rows(rows) | ReplayBody::Tx { rows, .. } => rows
                .iter()
                .filter(|r| r.op == ChangeOp::Insert)
                .map(|r| match r.key {
                    Key::Int(i) => i,
                    ref other => panic!("unexpected key {other:?}"),
                })
                .collect(),
            ReplayBody::Schema { .. } | ReplayBody::Topic(_) => Vec::new(),
        };
        found.push((offset, seq, inserted));
        Ok::<(), LogError>(())
    })
    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(
        end.torn.is_none(),
        "the base directory has a torn tail: {:?}",
        end.torn
    );
    let ends: Vec<u64> = found
        .iter()
        .skip(1)
        .map(|f| f.0)
        .chain([end.valid_len])
        .collect();
    found
        .into_iter()
        .zip(ends)
        .map(|((offset, seq, inserted), end)| FrameInfo {
            offset,
            end,
            seq,
            inserted,
        })
        .collect()
}

/// Start offset of the frame holding byte `pos`.
fn frame_start(frames: &[FrameInfo], pos: u64) -> u64 {
    frames
        .iter()
        .find(|f| f.offset <= pos && pos < f.end)
        .unwrap_or_else(|| panic!("no frame holds byte {pos}"))
        .offset
}

/// A data directory written by the real binary and then `kill -9`ed: one table `t`, one
/// insert per commit, several small segments, no snapshot.
struct Base {
    root: TempDir,
    dir: PathBuf,
    ids: Vec<i64>,
    seq: u64,
}

async fn build_base(name: &str) -> Base {
    let root = TempDir::new(name);
    let dir = root.join("base");
    let server = Server::start(&dir, root.path(), &SEGMENT_ARGS);
    let api = server.api();
    api.sql("CREATE TABLE t (id INTEGER PRIMARY KEY, body TEXT NOT NULL)")
        .await;
    let mut ids = Vec::new();
    for id in 1..=INSERTS_MAX {
        let body = format!("row {id} {}", "x".repeat(60));
        api.mutate(json!([{"op": "insert", "table": "t", "row": {"id": id, "body": body}}]))
            .await;
        ids.push(id);
        let segments = list_segments(&dir).unwrap();
        let newest_len = std::fs::metadata(&segments.last().unwrap().path)
            .unwrap()
            .len();
        if segments.len() >= SEGMENTS_MIN && newest_len >= NEWEST_SEGMENT_BYTES_MIN {
            break;
        }
    }
    let seq = api.health_seq().await;
    server.kill9();
    assert!(list_segments(&dir).unwrap().len() >= SEGMENTS_MIN);
    assert!(list_snapshots(&dir).unwrap().is_empty());
    Base {
        root,
        dir,
        ids,
        seq,
    }
}

async fn ids_of(api: &common::Api) -> Vec<i64> {
    api.scan_all("t", 1000)
        .await
        .iter()
        .map(|r| r["row"]["id"].as_i64().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_newest_segment_keeps_exactly_its_whole_frames() {
    let seed = seed("torn tail");
    let mut rng = Rng::new(seed);
    let base = build_base("torn").await;
    let segments = list_segments(&base.dir).unwrap();
    let (older, newest) = segments.split_at(segments.len() - 1);
    let newest = &newest[0];
    let older_frames: Vec<FrameInfo> = older
        .iter()
        .flat_map(|s| frames_of(&s.path, false))
        .collect();
    let newest_frames = frames_of(&newest.path, true);
    let newest_len = std::fs::metadata(&newest.path).unwrap().len();
    assert_eq!(older_frames.last().unwrap().seq + 1, newest.first_seq);
    assert_eq!(newest_frames.last().unwrap().seq, base.seq);
    assert!(newest_frames.len() >= 3, "{newest_frames:?}");

    let mut cuts = BTreeSet::from([0, 1, newest_len - 1, newest_len]);
    let first = &newest_frames[0];
    let mid = &newest_frames[newest_frames.len() / 2];
    cuts.extend([first.end - 1, first.end, first.end + 1]);
    // Inside the header, exactly after the header, inside the payload.
    cuts.extend([mid.offset + 5, mid.offset + 16, mid.offset + 20]);
    for _ in 0..RANDOM_CUTS {
        cuts.insert(rng.below(newest_len + 1));
    }

    for cut in cuts {
        let context = format!("seed {seed}: newest segment cut at byte {cut} of {newest_len}");
        let whole: Vec<&FrameInfo> = newest_frames.iter().filter(|f| f.end <= cut).collect();
        let expected_seq = whole.last().map_or(newest.first_seq - 1, |f| f.seq);
        let expected_len = whole.last().map_or(0, |f| f.end);
        let mut expected_ids: Vec<i64> = older_frames
            .iter()
            .chain(whole.iter().copied())
            .flat_map(|f| f.inserted.iter().copied())
            .collect();
        expected_ids.sort_unstable();

        eprintln!(
            "{context}: expect seq {expected_seq}, {} rows, {expected_len} bytes",
            expected_ids.len()
        );
        let copy = base.root.join(&format!("cut-{cut}"));
        copy_dir(&base.dir, &copy);
        let newest_copy = copy.join(file_name(&newest.path));
        truncate_file(&newest_copy, cut);

        // Offline, a torn tail is reported but is no damage, and nothing is changed.
        let out = check(&copy);
        assert!(out.status.success(), "{context}: {}", describe(&out));
        let torn_noted = String::from_utf8_lossy(&out.stdout).contains("torn tail");
        assert_eq!(
            torn_noted,
            cut != expected_len,
            "{context}: {}",
            describe(&out)
        );
        assert_eq!(
            std::fs::metadata(&newest_copy).unwrap().len(),
            cut,
            "{context}: check wrote"
        );

        let server = Server::start(&copy, base.root.path(), &SEGMENT_ARGS);
        let api = server.api();
        assert_eq!(api.health_seq().await, expected_seq, "{context}");
        assert_eq!(ids_of(&api).await, expected_ids, "{context}");
        assert_eq!(
            std::fs::metadata(&newest_copy).unwrap().len(),
            expected_len,
            "{context}: the torn bytes were not cut off"
        );
        // New commits continue the repaired log, and the result verifies offline.
        let resp = api
            .mutate(json!([{"op": "insert", "table": "t", "row": {"id": -1, "body": "after"}}]))
            .await;
        assert_eq!(resp["seq"], expected_seq + 1, "{context}");
        server.kill9();
        let out = check(&copy);
        assert!(out.status.success(), "{context}: {}", describe(&out));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains(&format!("state at seq {}", expected_seq + 1)),
            "{context}: {}",
            describe(&out)
        );
        std::fs::remove_dir_all(&copy).unwrap();
    }
}

/// `serve` refuses to start and `check` exits 2, both naming `file` and `offset`.
fn assert_refused(copy: &Path, logs: &Path, file: &str, offset: u64, context: &str) {
    let wanted = format!("byte offset {offset}");
    let out = check(copy);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{context}: check: {}",
        describe(&out)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(file) && stderr.contains(&wanted),
        "{context}: check must name {file} and {wanted}: {}",
        describe(&out)
    );
    let (status, stderr) = Server::start_expecting_failure(copy, logs, &SEGMENT_ARGS);
    assert!(!status.success(), "{context}: serve exited with {status}");
    assert!(
        stderr.contains(file) && stderr.contains(&wanted),
        "{context}: serve must name {file} and {wanted}:\n{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_byte_in_a_segment_is_refused_with_file_and_offset() {
    let base = build_base("segflip").await;
    let segments = list_segments(&base.dir).unwrap();

    // The middle of an older segment (neither the first nor the newest).
    let older = &segments[1];
    let frames = frames_of(&older.path, false);
    let len = std::fs::metadata(&older.path).unwrap().len();
    let pos = len / 2;
    let copy = base.root.join("older");
    copy_dir(&base.dir, &copy);
    flip_byte(&copy.join(file_name(&older.path)), pos);
    assert_refused(
        &copy,
        base.root.path(),
        &file_name(&older.path),
        frame_start(&frames, pos),
        &format!(
            "byte {pos} of older segment {} flipped",
            older.path.display()
        ),
    );

    // The first frame of the newest segment: damage before the tail is not a torn tail.
    let newest = segments.last().unwrap();
    let frames = frames_of(&newest.path, true);
    assert!(frames.len() >= 2);
    for pos in [frames[0].offset + 2, frames[0].offset + 20] {
        let copy = base.root.join(&format!("newest-{pos}"));
        copy_dir(&base.dir, &copy);
        flip_byte(&copy.join(file_name(&newest.path)), pos);
        assert_refused(
            &copy,
            base.root.path(),
            &file_name(&newest.path),
            frames[0].offset,
            &format!("byte {pos} of the newest segment's first frame flipped"),
        );
    }
}

/// A copy of a base directory with snapshots, the newest of them damaged.
struct DamagedSnapshot {
    copy: PathBuf,
    /// File name of the damaged snapshot.
    name: String,
    /// Offset of the frame holding the flipped byte.
    offset: u64,
    /// Seqs of the snapshots taken, oldest first.
    seqs: Vec<u64>,
    /// Every id in the table.
    ids: Vec<i64>,
}

/// On a copy of `base` started with `extra` args, takes `count` snapshots through the API
/// (with a few commits between them), kills the server, and flips the byte in the middle of
/// the newest snapshot.
async fn damaged_snapshot(
    base: &Base,
    name: &str,
    count: usize,
    extra: &[&str],
) -> DamagedSnapshot {
    let copy = base.root.join(name);
    copy_dir(&base.dir, &copy);
    let args: Vec<&str> = SEGMENT_ARGS
        .iter()
        .copied()
        .chain(extra.iter().copied())
        .collect();
    let server = Server::start(&copy, base.root.path(), &args);
    let api = server.api();
    let mut ids = base.ids.clone();
    let mut seqs = Vec::new();
    for i in 0..count {
        if i > 0 {
            for _ in 0..3 {
                let id = 1_000_000 + ids.len() as i64;
                api.mutate(
                    json!([{"op": "insert", "table": "t", "row": {"id": id, "body": "more"}}]),
                )
                .await;
                ids.push(id);
            }
        }
        let (status, body) = api.post("/v1/admin/snapshot", &json!({})).await;
        assert_eq!(status, 200, "{body}");
        let seq = body["seq"].as_u64().unwrap();
        assert_eq!(seq, api.health_seq().await);
        seqs.push(seq);
    }
    server.kill9();

    let snapshots = list_snapshots(&copy).unwrap();
    assert_eq!(
        snapshots.iter().map(|s| s.0).collect::<Vec<_>>(),
        seqs,
        "{snapshots:?}"
    );
    let path = &snapshots.last().unwrap().1;
    let bytes = std::fs::read(path).unwrap();
    let pos = bytes.len() / 2;
    let mut offset = SNAPSHOT_MAGIC.len();
    let frame_offset = loop {
        match frame::decode(&bytes, offset) {
            Decoded::Frame { next, .. } if next > pos => break offset as u64,
            Decoded::Frame { next, .. } => offset = next,
            other => panic!("snapshot {} does not decode: {other:?}", path.display()),
        }
    };
    flip_byte(path, pos as u64);
    DamagedSnapshot {
        copy,
        name: file_name(path),
        offset: frame_offset,
        seqs,
        ids,
    }
}

/// `check` fails naming the damaged snapshot; `serve` passes over it — loudly — to the
/// older snapshot or the whole log, and loses nothing.
async fn falls_back(base: &Base, snapshots: usize) {
    let d = damaged_snapshot(base, &format!("fallback-{snapshots}"), snapshots, &[]).await;
    let context = format!(
        "{} damaged at the frame at byte offset {}",
        d.name, d.offset
    );

    let out = check(&d.copy);
    assert_eq!(out.status.code(), Some(2), "{context}: {}", describe(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&d.name) && stderr.contains(&format!("byte offset {}", d.offset)),
        "{context}: {}",
        describe(&out)
    );

    let server = Server::start(&d.copy, base.root.path(), &SEGMENT_ARGS);
    let api = server.api();
    let newest = *d.seqs.last().unwrap();
    let fallback = if snapshots > 1 {
        d.seqs[snapshots - 2]
    } else {
        0
    };
    assert_eq!(api.health_seq().await, newest, "{context}");
    assert_eq!(ids_of(&api).await, d.ids, "{context}");
    // A log that still starts at seq 1 and fits the changelog window is replayed whole in
    // place of the newest snapshot, which is checked after ready and, damaged, moved aside;
    // otherwise recovery starts from the older snapshot (or from nothing).
    let replayed = api.metric("sluice_recovery_replayed").await;
    let aside = d.copy.join(format!("{}.damaged", d.name));
    if aside.exists() {
        assert_eq!(
            replayed, newest as f64,
            "{context}: the whole log was replayed"
        );
    } else {
        assert_eq!(
            replayed,
            (newest - fallback) as f64,
            "{context}: recovery should start from seq {fallback}"
        );
    }
    assert!(
        server.stderr().contains(&d.name),
        "{context}: serve must say it passed over {}:\n{}",
        d.name,
        server.stderr()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_snapshot_fails_check_and_serve_falls_back_without_loss() {
    let base = build_base("snapflip").await;
    falls_back(&base, 1).await;
    falls_back(&base, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_snapshot_without_the_log_behind_it_is_refused() {
    let base = build_base("snapnolog").await;
    // With a tiny changelog window the snapshot retires the segments it covers.
    let d = damaged_snapshot(&base, "nolog", 1, &["--retain-commits", "10"]).await;
    let first = list_segments(&d.copy).unwrap()[0].first_seq;
    assert!(first > 1, "the snapshot retired no segment");
    assert_refused(
        &d.copy,
        base.root.path(),
        &d.name,
        d.offset,
        &format!("{} damaged, log starts at seq {first}", d.name),
    );
}
