//! Fuzz targets for the bytes this crate reads back from disk: frames, segment scans and
//! snapshot files. Each must answer with a result — never panic, never trust a length it
//! has not checked. `SLUICE_FUZZ_EXECS` / `SLUICE_FUZZ_SEED` run a long mode (see
//! `sluice-fuzzkit`); `--nocapture` shows the executions and panics of each target.

use std::path::Path;

use sluice_fuzzkit::{Fuzzer, Kind};
use sluice_log::frame::{self, Decoded, FRAME_HEADER_BYTES, FRAME_PAYLOAD_BYTES_MAX};
use sluice_log::segment::scan;
use sluice_log::snapshot::{SnapshotFile, SNAPSHOT_FORMAT_VERSION, SNAPSHOT_MAGIC};
use sluice_log::LogError;

const EXECS: u64 = 50_000;

fn framed(payloads: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for p in payloads {
        frame::encode_into(&mut out, p).unwrap();
    }
    out
}

fn segment_seeds() -> Vec<Vec<u8>> {
    let mut with_zero_tail = framed(&[b"one", b"two"]);
    with_zero_tail.extend_from_slice(&[0; 40]);
    let mut torn = framed(&[b"whole", b"cut short here"]);
    torn.truncate(torn.len() - 5);
    vec![
        Vec::new(),
        framed(&[b"a"]),
        framed(&[b"", b"payload", &[0xff; 100]]),
        framed(&[&[1, 0, 0, 0, 0, 0, 0, 0, 7], &[2; 33], &[3; 200]]),
        with_zero_tail,
        torn,
    ]
}

fn snapshot_bytes(seq: u64, body: &[&[u8]]) -> Vec<u8> {
    let mut header = SNAPSHOT_FORMAT_VERSION.to_le_bytes().to_vec();
    header.extend_from_slice(&seq.to_le_bytes());
    let mut out = SNAPSHOT_MAGIC.to_vec();
    frame::encode_into(&mut out, &header).unwrap();
    out.extend(framed(body));
    out
}

/// A frame claiming a 4 GiB payload (length and inverted length agree) is refused from
/// its header alone: nothing is read or allocated past the 16 header bytes.
#[test]
fn a_frame_claiming_four_gib_is_refused_from_its_header() {
    let len = u32::MAX;
    let mut buf = Vec::new();
    buf.extend_from_slice(&len.to_le_bytes());
    buf.extend_from_slice(&(!len).to_le_bytes());
    buf.extend_from_slice(&[0; 8]);
    assert_eq!(frame::decode(&buf, 0), Decoded::BadLength);
    let just_over = (FRAME_PAYLOAD_BYTES_MAX + 1) as u32;
    buf[0..4].copy_from_slice(&just_over.to_le_bytes());
    buf[4..8].copy_from_slice(&(!just_over).to_le_bytes());
    assert_eq!(frame::decode(&buf, 0), Decoded::BadLength);
    let err = SnapshotFile::from_bytes(Path::new("x.snap"), [&SNAPSHOT_MAGIC[..], &buf].concat());
    assert!(matches!(err, Err(LogError::Corrupt { .. })));
}

#[test]
fn fuzz_frame_decode() {
    Fuzzer::new("log_frame", EXECS, Kind::Bytes)
        .seeds(segment_seeds())
        .run(|input| {
            // Walk the buffer as the segment scan does; every whole frame must round-trip.
            let mut offset = 0;
            let mut frames = 0;
            loop {
                match frame::decode(input, offset) {
                    Decoded::Frame { payload, next } => {
                        assert_eq!(next, offset + FRAME_HEADER_BYTES + payload.len());
                        assert!(next <= input.len());
                        let mut again = Vec::new();
                        frame::encode_into(&mut again, payload).unwrap();
                        assert_eq!(&input[offset..next], &again[..], "a frame re-encodes");
                        offset = next;
                        frames += 1;
                    }
                    Decoded::BadChecksum { end } => {
                        assert!(end <= input.len());
                        return format!("checksum after {}", frames.min(3));
                    }
                    other => return format!("{other:?} after {}", frames.min(3)),
                }
            }
        });
}

#[test]
fn fuzz_segment_scan() {
    Fuzzer::new("log_segment_scan", EXECS, Kind::Bytes)
        .seeds(segment_seeds())
        .run(|input| {
            let mut outcome = String::new();
            for is_newest in [true, false] {
                let mut seen = Vec::new();
                let end = scan(Path::new("x.log"), input, is_newest, |offset, payload| {
                    seen.push((offset, payload.to_vec()));
                    Ok::<(), LogError>(())
                });
                match end {
                    Ok(end) => {
                        assert!(end.valid_len as usize <= input.len());
                        assert_eq!(end.torn.is_some(), end.valid_len as usize != input.len());
                        assert!(
                            is_newest || end.torn.is_none(),
                            "only the newest may be torn"
                        );
                        // What recovery keeps (the prefix) scans clean to the same frames.
                        let mut again = Vec::new();
                        let prefix = &input[..end.valid_len as usize];
                        let clean = scan(Path::new("x.log"), prefix, false, |o, p| {
                            again.push((o, p.to_vec()));
                            Ok::<(), LogError>(())
                        })
                        .expect("the kept prefix scans clean");
                        assert!(clean.torn.is_none());
                        assert_eq!(again, seen);
                        match &end.torn {
                            // The reason, without the path and the offsets around it.
                            Some(t) => {
                                outcome.push_str(t.split(['(', ')']).nth(1).unwrap_or("torn"))
                            }
                            None => outcome.push_str(&format!("ok {} ", seen.len().min(3))),
                        }
                    }
                    Err(LogError::Corrupt { offset, reason, .. }) => {
                        assert!(offset as usize <= input.len());
                        outcome.push_str(&reason);
                    }
                    Err(other) => panic!("scan over bytes answered {other}"),
                }
            }
            outcome
        });
}

#[test]
fn fuzz_snapshot_file() {
    let seeds = vec![
        snapshot_bytes(0, &[]),
        snapshot_bytes(42, &[b"schema", b"rows", b"end"]),
        snapshot_bytes(u64::MAX, &[&[1, 2, 3], &[0; 64]]),
    ];
    Fuzzer::new("log_snapshot_file", EXECS, Kind::Bytes)
        .seeds(seeds)
        .dictionary(&["SLUICESN"])
        .run(
            |input| match SnapshotFile::from_bytes(Path::new("x.snap"), input.to_vec()) {
                Ok(snap) => {
                    let mut bytes = 0;
                    for (offset, payload) in snap.frames() {
                        assert!(
                            offset as usize + FRAME_HEADER_BYTES + payload.len() <= input.len()
                        );
                        bytes += payload.len();
                    }
                    assert!(bytes <= input.len());
                    format!("ok {}", snap.frames().count().min(4))
                }
                Err(LogError::Corrupt { reason, .. }) => reason,
                Err(other) => panic!("reading snapshot bytes answered {other}"),
            },
        );
}

/// The streaming reader recovery loads snapshots with gives the verdict of
/// `SnapshotFile::from_bytes` on every input: the same frames (offsets and payloads) up to
/// the same error (reason and offset).
#[test]
fn fuzz_snapshot_reader_agrees_with_from_bytes() {
    use sluice_log::snapshot::SnapshotReader;
    let mut long = vec![0u8; 70_000];
    long.iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
    let seeds = vec![
        snapshot_bytes(0, &[]),
        snapshot_bytes(42, &[b"schema", b"rows", b"end"]),
        snapshot_bytes(7, &[&long, b"", &long[..300]]),
        SNAPSHOT_MAGIC.to_vec(),
        Vec::new(),
    ];
    Fuzzer::new("log_snapshot_reader", EXECS, Kind::Bytes)
        .seeds(seeds)
        .dictionary(&["SLUICESN"])
        .run(|input| {
            let path = Path::new("x.snap");
            let whole = SnapshotFile::from_bytes(path, input.to_vec());
            let mut streamed: Vec<(u64, Vec<u8>)> = Vec::new();
            let outcome = SnapshotReader::new(path, input).and_then(|mut r| {
                let seq = r.seq;
                let mut buf = Vec::new();
                while let Some(offset) = r.next_frame(&mut buf)? {
                    streamed.push((offset, buf.clone()));
                }
                Ok(seq)
            });
            match (whole, outcome) {
                (Ok(snap), Ok(seq)) => {
                    assert_eq!(snap.seq, seq);
                    let frames: Vec<(u64, Vec<u8>)> =
                        snap.frames().map(|(o, p)| (o, p.to_vec())).collect();
                    assert!(frames == streamed, "the same frames");
                    format!("ok {}", frames.len().min(4))
                }
                (
                    Err(LogError::Corrupt { offset, reason, .. }),
                    Err(LogError::Corrupt {
                        offset: o,
                        reason: r,
                        ..
                    }),
                ) => {
                    assert_eq!((offset, &reason), (o, &r), "the same verdict");
                    // Frames before the damage were handed out, each checked.
                    assert!(streamed.iter().all(|(at, _)| *at < offset));
                    reason
                }
                (a, b) => panic!(
                    "from_bytes answered {:?}, the reader {:?}",
                    a.map(|s| s.seq),
                    b
                ),
            }
        });
}
