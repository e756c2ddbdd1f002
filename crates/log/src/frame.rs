//! The frame: the unit of integrity on disk, in segments and snapshots alike.
//!
//! ```text
//! offset  size  field
//! 0       4     len        payload length in bytes, u32 little-endian
//! 4       4     len_inv    !len (bitwise not), u32 little-endian — guards the length itself
//! 8       8     checksum   XXH3-64 of the payload, u64 little-endian
//! 16      len   payload
//! ```
//!
//! A flipped bit in `len` is caught by `len_inv` before the length is trusted, so a damaged
//! length can never make the reader skip over good frames as if they were a torn tail.

use xxhash_rust::xxh3::xxh3_64;

use crate::LogError;

pub const FRAME_HEADER_BYTES: usize = 16;
/// Largest payload a frame may carry (64 MiB); larger commits are refused before logging.
pub const FRAME_PAYLOAD_BYTES_MAX: usize = 64 << 20;

const _: () = assert!(FRAME_PAYLOAD_BYTES_MAX < u32::MAX as usize);

/// Appends one frame holding `payload` to `out`.
pub fn encode_into(out: &mut Vec<u8>, payload: &[u8]) -> Result<(), LogError> {
    if payload.len() > FRAME_PAYLOAD_BYTES_MAX {
        return Err(LogError::FrameTooLarge {
            len: payload.len(),
            max: FRAME_PAYLOAD_BYTES_MAX,
        });
    }
    let len = payload.len() as u32;
    out.reserve(FRAME_HEADER_BYTES + payload.len());
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&(!len).to_le_bytes());
    out.extend_from_slice(&xxh3_64(payload).to_le_bytes());
    out.extend_from_slice(payload);
    Ok(())
}

/// Appends one frame whose payload `write` appends to `out` in place — the bytes
/// [`encode_into`] appends for that payload, without first building the payload in a
/// buffer of its own and copying it (the writer encodes each commit straight into the
/// round's frame buffer). A payload over [`FRAME_PAYLOAD_BYTES_MAX`] is refused and `out`
/// is left as it was.
pub fn encode_with(out: &mut Vec<u8>, write: impl FnOnce(&mut Vec<u8>)) -> Result<(), LogError> {
    let start = out.len();
    out.extend_from_slice(&[0; FRAME_HEADER_BYTES]);
    write(out);
    let payload_start = start + FRAME_HEADER_BYTES;
    let len = out.len() - payload_start;
    if len > FRAME_PAYLOAD_BYTES_MAX {
        out.truncate(start);
        return Err(LogError::FrameTooLarge {
            len,
            max: FRAME_PAYLOAD_BYTES_MAX,
        });
    }
    let checksum = xxh3_64(&out[payload_start..]);
    let len = len as u32;
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    out[start + 4..start + 8].copy_from_slice(&(!len).to_le_bytes());
    out[start + 8..payload_start].copy_from_slice(&checksum.to_le_bytes());
    Ok(())
}

/// What [`decode`] found at an offset.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded<'a> {
    /// A whole, checksummed frame; `next` is the offset just after it.
    Frame { payload: &'a [u8], next: usize },
    /// The buffer ends exactly here.
    End,
    /// Fewer bytes remain than the frame needs: the tail was cut short.
    Truncated,
    /// The header's length and inverted length disagree.
    BadLength,
    /// The frame is whole but its checksum does not match; `end` is where it would end.
    BadChecksum { end: usize },
}

/// Decodes the frame starting at `offset` in `buf`.
pub fn decode(buf: &[u8], offset: usize) -> Decoded<'_> {
    let rest = &buf[offset..];
    if rest.is_empty() {
        return Decoded::End;
    }
    if rest.len() < FRAME_HEADER_BYTES {
        return Decoded::Truncated;
    }
    let len = u32::from_le_bytes(rest[0..4].try_into().expect("4 bytes"));
    let len_inv = u32::from_le_bytes(rest[4..8].try_into().expect("4 bytes"));
    if len != !len_inv || len as usize > FRAME_PAYLOAD_BYTES_MAX {
        return Decoded::BadLength;
    }
    let checksum = u64::from_le_bytes(rest[8..16].try_into().expect("8 bytes"));
    let end = FRAME_HEADER_BYTES + len as usize;
    if rest.len() < end {
        return Decoded::Truncated;
    }
    let payload = &rest[FRAME_HEADER_BYTES..end];
    if xxh3_64(payload) != checksum {
        return Decoded::BadChecksum { end: offset + end };
    }
    Decoded::Frame {
        payload,
        next: offset + end,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip() {
        let mut buf = Vec::new();
        encode_into(&mut buf, b"hello").unwrap();
        encode_into(&mut buf, b"").unwrap();
        let Decoded::Frame { payload, next } = decode(&buf, 0) else {
            panic!("expected a frame")
        };
        assert_eq!(payload, b"hello");
        let Decoded::Frame { payload, next } = decode(&buf, next) else {
            panic!("expected a frame")
        };
        assert_eq!(payload, b"");
        assert_eq!(decode(&buf, next), Decoded::End);
    }

    #[test]
    fn encode_with_appends_the_bytes_encode_into_does() {
        let mut lens: Vec<usize> = (0..300).collect();
        lens.extend([4095, 4096, 65_537]);
        for (i, len) in lens.into_iter().enumerate() {
            let payload: Vec<u8> = (0..len).map(|b| (b * 31 + i) as u8).collect();
            // After some earlier frames, as in the writer's round buffer.
            let mut before = Vec::new();
            encode_into(&mut before, b"earlier").unwrap();
            let (mut copied, mut in_place) = (before.clone(), before.clone());
            encode_into(&mut copied, &payload).unwrap();
            encode_with(&mut in_place, |out| out.extend_from_slice(&payload)).unwrap();
            assert!(copied == in_place, "payload of {len} bytes");
        }
    }

    #[test]
    fn encode_with_refuses_a_payload_over_the_limit_and_leaves_the_buffer() {
        let mut out = Vec::new();
        encode_into(&mut out, b"kept").unwrap();
        let kept = out.clone();
        let err = encode_with(&mut out, |o| {
            o.resize(o.len() + FRAME_PAYLOAD_BYTES_MAX + 1, 7)
        });
        assert!(matches!(
            err,
            Err(LogError::FrameTooLarge { len, max })
                if len == FRAME_PAYLOAD_BYTES_MAX + 1 && max == FRAME_PAYLOAD_BYTES_MAX
        ));
        assert_eq!(out, kept);
    }

    #[test]
    fn every_single_bit_flip_is_detected() {
        let mut buf = Vec::new();
        encode_into(&mut buf, b"some payload bytes").unwrap();
        for bit in 0..buf.len() * 8 {
            let mut damaged = buf.clone();
            damaged[bit / 8] ^= 1 << (bit % 8);
            assert!(
                !matches!(decode(&damaged, 0), Decoded::Frame { .. }),
                "flip of bit {bit} went unnoticed"
            );
        }
    }

    #[test]
    fn every_truncation_is_reported_as_truncated() {
        let mut buf = Vec::new();
        encode_into(&mut buf, b"0123456789").unwrap();
        for cut in 1..buf.len() {
            assert_eq!(decode(&buf[..cut], 0), Decoded::Truncated, "cut at {cut}");
        }
    }
}
