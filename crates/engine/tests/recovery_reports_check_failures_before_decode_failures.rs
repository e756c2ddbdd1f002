//! Recovery reads and checks each segment on a reader thread one segment ahead of decoding
//! and applying; the error it reports must stay the one a check-everything-first pass
//! would: the first failed check (checksum, length, seq chain) in any segment, and only if
//! every segment passes its checks, the first frame that does not decode or apply. And a
//! healthy log of many segments recovers every row. The newest segment may end in zeros
//! (the unwritten end of a prepared segment): cut, unless something follows them.

use std::path::Path;

use serde_json::{json, Map, Value as Json};
use sluice_engine::codec::{encode_commit, RECORD_ROWS};
use sluice_engine::recovery::{recover, RecoveryError, RecoveryOptions};
use sluice_engine::{
    Changelog, ColumnDef, ColumnType, Commit, Db, Limits, Retention, SchemaChange, TableSchema,
};
use sluice_log::frame::{encode_into, FRAME_HEADER_BYTES};
use sluice_log::segment::segment_path;
use sluice_log::LogError;

const SEGMENTS: u64 = 4;
const COMMITS_PER_SEGMENT: u64 = 25;

fn options() -> RecoveryOptions {
    RecoveryOptions {
        limits: Limits::default(),
        retention: Retention::default(),
        repair: false,
        keep_zero_tail: false,
    }
}

/// The payloads of one DDL and `SEGMENTS * COMMITS_PER_SEGMENT - 1` commits of 3 rows.
fn payloads() -> Vec<Vec<u8>> {
    let mut db = Db::new(Limits::default(), Changelog::new(Retention::default()));
    let mut out = Vec::new();
    let push = |out: &mut Vec<Vec<u8>>, commit: &Commit| {
        let mut payload = Vec::new();
        encode_commit(commit, &mut payload);
        out.push(payload);
    };
    let schema = TableSchema {
        name: "t".into(),
        columns: vec![
            ColumnDef {
                name: "id".into(),
                ty: ColumnType::Integer,
                not_null: false,
                default: None,
            },
            ColumnDef {
                name: "v".into(),
                ty: ColumnType::Text,
                not_null: false,
                default: None,
            },
        ],
        pk: 0,
        indexes: Vec::new(),
    };
    let ddl = db
        .apply_schema(
            vec![SchemaChange::CreateTable {
                schema,
                if_not_exists: false,
            }],
            "CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)".into(),
        )
        .unwrap()
        .unwrap();
    push(&mut out, &ddl);
    for c in 1..SEGMENTS * COMMITS_PER_SEGMENT {
        let mut tx = db.transaction();
        for r in 0..3 {
            let row: Map<String, Json> = match json!({"id": c * 3 + r, "v": format!("row {c}.{r}")})
            {
                Json::Object(m) => m,
                _ => unreachable!(),
            };
            tx.insert("t", &row, None).unwrap();
        }
        push(&mut out, &tx.commit().unwrap());
    }
    out
}

/// Writes the payloads as frames into `SEGMENTS` segment files; `damage` may change a
/// segment's bytes (its index, its bytes, the offset of each frame in it).
fn write_log(dir: &Path, payloads: &[Vec<u8>], damage: impl Fn(u64, &mut Vec<u8>, &[usize])) {
    for s in 0..SEGMENTS {
        let first = s * COMMITS_PER_SEGMENT;
        let mut bytes = Vec::new();
        let mut offsets = Vec::new();
        for p in &payloads[first as usize..(first + COMMITS_PER_SEGMENT) as usize] {
            offsets.push(bytes.len());
            encode_into(&mut bytes, p).unwrap();
        }
        damage(s, &mut bytes, &offsets);
        std::fs::write(segment_path(dir, first + 1), &bytes).unwrap();
    }
}

/// A frame whose checksum holds but whose commit does not decode: its record kind and seq
/// are read (they pass the checks), the row count after them is not a varint.
fn undecodable(seq: u64) -> Vec<u8> {
    let mut p = vec![RECORD_ROWS];
    p.extend_from_slice(&seq.to_le_bytes());
    p.extend_from_slice(&[0xff; 12]);
    p
}

/// (file name, byte offset, reason) of a damaged frame: a failed check (`Log(Corrupt)`)
/// or a commit that does not decode, apply or follow the seq chain (`Corrupt`).
fn corrupt_at(e: RecoveryError) -> (String, u64, String) {
    match e {
        RecoveryError::Corrupt {
            path,
            offset,
            reason,
        }
        | RecoveryError::Log(LogError::Corrupt {
            path,
            offset,
            reason,
        }) => (
            path.file_name().unwrap().to_string_lossy().into_owned(),
            offset,
            reason,
        ),
        other => panic!("expected a Corrupt error, got {other}"),
    }
}

fn name(segment: u64) -> String {
    segment_path(Path::new(""), segment * COMMITS_PER_SEGMENT + 1)
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

#[test]
fn a_healthy_log_of_many_segments_recovers_every_row() {
    let dir = tempdir("healthy");
    write_log(&dir, &payloads(), |_, _, _| {});
    let r = recover(&dir, &options()).unwrap();
    assert_eq!(r.db.seq, SEGMENTS * COMMITS_PER_SEGMENT);
    assert_eq!(r.segments, SEGMENTS as usize);
    assert_eq!(
        r.db.tables["t"].rows.len() as u64,
        (SEGMENTS * COMMITS_PER_SEGMENT - 1) * 3
    );
    assert!(r.torn_tail.is_none());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_frame_that_does_not_decode_is_reported_with_its_segment_and_offset() {
    let dir = tempdir("decode");
    let mut payloads = payloads();
    // Segment 1, its 5th frame.
    let at = (COMMITS_PER_SEGMENT + 4) as usize;
    payloads[at] = undecodable(at as u64 + 1);
    write_log(&dir, &payloads, |_, _, _| {});
    let offset: usize = payloads[COMMITS_PER_SEGMENT as usize..at]
        .iter()
        .map(|p| p.len() + FRAME_HEADER_BYTES)
        .sum();
    let (file, off, _) = corrupt_at(recover(&dir, &options()).err().unwrap());
    assert_eq!((file, off), (name(1), offset as u64));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_failed_check_in_a_later_segment_is_reported_before_an_earlier_decode_failure() {
    let dir = tempdir("order");
    let mut payloads = payloads();
    let at = 7usize; // segment 0
    payloads[at] = undecodable(at as u64 + 1);
    // Segment 2 (not the newest): a flipped payload byte in its 3rd frame.
    write_log(&dir, &payloads, |s, bytes, offsets| {
        if s == 2 {
            bytes[offsets[2] + FRAME_HEADER_BYTES + 1] ^= 0x40;
        }
    });
    let (file, off, reason) = corrupt_at(recover(&dir, &options()).err().unwrap());
    assert_eq!(
        (file.as_str(), reason.as_str()),
        (name(2).as_str(), "frame checksum mismatch")
    );
    let offset: usize = payloads[2 * COMMITS_PER_SEGMENT as usize..][..2]
        .iter()
        .map(|p| p.len() + FRAME_HEADER_BYTES)
        .sum();
    assert_eq!(off, offset as u64);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_first_of_two_failed_checks_is_reported() {
    let dir = tempdir("two-checks");
    let payloads = payloads();
    write_log(&dir, &payloads, |s, bytes, offsets| {
        if s == 1 || s == 2 {
            bytes[offsets[3] + FRAME_HEADER_BYTES] ^= 1;
        }
    });
    let (file, _, reason) = corrupt_at(recover(&dir, &options()).err().unwrap());
    assert_eq!(
        (file, reason.as_str()),
        (name(1), "frame checksum mismatch")
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_seq_gap_between_segments_is_reported_after_an_earlier_decode_failure() {
    let dir = tempdir("gap");
    let mut payloads = payloads();
    payloads[3] = undecodable(4);
    write_log(&dir, &payloads, |_, _, _| {});
    // Segment 2 goes missing: segment 3 starts after a gap.
    std::fs::remove_file(segment_path(&dir, 2 * COMMITS_PER_SEGMENT + 1)).unwrap();
    let (file, off, reason) = corrupt_at(recover(&dir, &options()).err().unwrap());
    assert_eq!((file, off), (name(3), 0));
    assert!(reason.contains("follows seq"), "{reason}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Zeros after the newest segment's frames, more than one read piece of them (16 MiB).
const ZERO_TAIL_BYTES: usize = 20 << 20;

/// The bytes of the newest segment's frames.
fn newest_frames_len(payloads: &[Vec<u8>]) -> u64 {
    payloads[((SEGMENTS - 1) * COMMITS_PER_SEGMENT) as usize..]
        .iter()
        .map(|p| (p.len() + FRAME_HEADER_BYTES) as u64)
        .sum()
}

/// A log whose newest segment has `ZERO_TAIL_BYTES` zeros after its frames, then `after`.
fn log_with_zero_tail(what: &str, payloads: &[Vec<u8>], after: &[u8]) -> std::path::PathBuf {
    let dir = tempdir(what);
    write_log(&dir, payloads, |s, bytes, _| {
        if s == SEGMENTS - 1 {
            bytes.resize(bytes.len() + ZERO_TAIL_BYTES, 0);
            bytes.extend_from_slice(after);
        }
    });
    dir
}

/// Options that repair, keeping a zero tail or not.
fn repairing(keep_zero_tail: bool) -> RecoveryOptions {
    RecoveryOptions {
        repair: true,
        keep_zero_tail,
        ..options()
    }
}

/// The newest segment's file length.
fn newest_len(dir: &Path) -> u64 {
    let newest = segment_path(dir, (SEGMENTS - 1) * COMMITS_PER_SEGMENT + 1);
    std::fs::metadata(&newest).unwrap().len()
}

#[test]
fn the_zeros_after_the_newest_segments_frames_are_cut_and_every_row_recovers() {
    let payloads = payloads();
    let dir = log_with_zero_tail("zero-tail", &payloads, &[]);
    let r = recover(&dir, &repairing(false)).unwrap();
    assert_eq!(r.db.seq, SEGMENTS * COMMITS_PER_SEGMENT);
    assert_eq!(
        r.db.tables["t"].rows.len() as u64,
        (SEGMENTS * COMMITS_PER_SEGMENT - 1) * 3
    );
    let torn = r.torn_tail.expect("a zero tail is reported");
    assert!(
        torn.contains("zero bytes") && torn.contains(&format!("; {ZERO_TAIL_BYTES} bytes after")),
        "{torn}"
    );
    assert_eq!(
        newest_len(&dir),
        newest_frames_len(&payloads),
        "cut after the last frame"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn kept_zeros_after_the_newest_segments_frames_are_reported_where_they_start_and_left_alone() {
    let payloads = payloads();
    let dir = log_with_zero_tail("zero-tail-kept", &payloads, &[]);
    let r = recover(&dir, &repairing(true)).unwrap();
    assert_eq!(r.db.seq, SEGMENTS * COMMITS_PER_SEGMENT);
    assert_eq!(r.torn_tail, None);
    assert_eq!(r.newest_zero_tail_at, Some(newest_frames_len(&payloads)));
    assert_eq!(
        newest_len(&dir),
        newest_frames_len(&payloads) + ZERO_TAIL_BYTES as u64
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn zeros_with_anything_behind_them_in_the_newest_segment_are_damage_and_nothing_is_cut() {
    let payloads = payloads();
    let dir = log_with_zero_tail("zero-then-byte", &payloads, &[1]);
    let (file, off, reason) = corrupt_at(recover(&dir, &repairing(false)).err().unwrap());
    assert_eq!(
        (file, off, reason.as_str()),
        (
            name(SEGMENTS - 1),
            newest_frames_len(&payloads),
            "frame length does not match its check"
        )
    );
    assert_eq!(
        newest_len(&dir),
        newest_frames_len(&payloads) + ZERO_TAIL_BYTES as u64 + 1
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

fn tempdir(what: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "sluice-recovery-order-{what}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
