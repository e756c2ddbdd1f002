//! A call's arguments kept as the MessagePack bytes they arrived in, checked, so that the
//! writer builds the JavaScript value straight from them.
//!
//! *Why.* Over the WebSocket, a call's `args` used to become a `serde_json::Value` on the
//! connection's task (an `IndexMap` hashed with SipHash and a `String` per key), which the
//! writer then walked to build the JS object and freed. [`Msgpack::read`] instead checks the
//! bytes without building anything and copies them out of the frame (one allocation); the
//! writer reads them once, into JS ([`crate::raw`]). A copy, not a slice of the frame: a
//! WebSocket frame's bytes share the connection's read buffer, which a slice kept until the
//! writer gets to it would pin, so that every read had to allocate a new one.
//!
//! *Same answer.* [`Msgpack::read`] takes only values that `rmp_serde` decodes into a
//! `serde_json::Value` one way, and [`Msgpack::to_json`] is that value: nil, booleans,
//! integers, finite floats, UTF-8 strings, arrays, and maps whose keys are distinct UTF-8
//! strings, nested at most [`DEPTH_MAX`] deep. Anything else — `bin`, `ext`, a NaN, a
//! non-string or repeated key, text that is not UTF-8, a key `serde_json` treats specially,
//! a truncated value — is `None`, and the caller decodes the frame the general way, which
//! decides it (and any refusal) as before. A differential test holds the two to the same
//! JavaScript value.

/// Nesting [`Msgpack::read`] takes (the frame's own map is one more level); deeper values
/// are left to the general decoder, whose limit is higher.
pub const DEPTH_MAX: usize = 64;

/// Map keys up to which [`Reader::check`] finds a repeated key by comparing them all.
const FEW_KEYS: usize = 16;

/// Keys `serde_json` reads as markers rather than as names (with its `raw_value` or
/// `arbitrary_precision` features).
const SERDE_JSON_PRIVATE: &str = "$serde_json::private::";

/// One MessagePack value that [`Msgpack::read`] checked (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Msgpack(Box<[u8]>);

/// One token of a MessagePack value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Token<'a> {
    Nil,
    Bool(bool),
    Int(i64),
    /// Above `i64::MAX`.
    Uint(u64),
    Float(f64),
    /// Text's bytes: [`Msgpack::read`] checks that they are UTF-8, the token does not (the
    /// writer builds JS from checked bytes and need not check them again).
    Str(&'a [u8]),
    Array(u32),
    Map(u32),
}

/// Reads tokens off the front of a byte slice; `None` for anything [`Token`] does not
/// cover or that runs past the end.
#[derive(Clone)]
pub struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8]) -> Reader<'a> {
        Reader { bytes, at: 0 }
    }

    /// Bytes read so far.
    pub fn position(&self) -> usize {
        self.at
    }

    /// Goes on reading at `at` (e.g. where [`Msgpack::read`] said a value ends).
    pub fn seek(&mut self, at: usize) {
        self.at = at;
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.at.checked_add(n)?;
        let taken = self.bytes.get(self.at..end)?;
        self.at = end;
        Some(taken)
    }

    fn be<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }

    fn text(&mut self, len: usize) -> Option<Token<'a>> {
        self.take(len).map(Token::Str)
    }

    /// The next token; `None` for `bin`, `ext`, or the end.
    pub fn token(&mut self) -> Option<Token<'a>> {
        let marker = *self.take(1)?.first()?;
        Some(match marker {
            0x00..=0x7f => Token::Int(marker as i64),
            0x80..=0x8f => Token::Map((marker & 0x0f) as u32),
            0x90..=0x9f => Token::Array((marker & 0x0f) as u32),
            0xa0..=0xbf => return self.text((marker & 0x1f) as usize),
            0xc0 => Token::Nil,
            0xc2 => Token::Bool(false),
            0xc3 => Token::Bool(true),
            0xca => Token::Float(f32::from_be_bytes(self.be()?) as f64),
            0xcb => Token::Float(f64::from_be_bytes(self.be()?)),
            0xcc => Token::Int(u8::from_be_bytes(self.be()?) as i64),
            0xcd => Token::Int(u16::from_be_bytes(self.be()?) as i64),
            0xce => Token::Int(u32::from_be_bytes(self.be()?) as i64),
            0xcf => {
                let u = u64::from_be_bytes(self.be()?);
                match i64::try_from(u) {
                    Ok(i) => Token::Int(i),
                    Err(_) => Token::Uint(u),
                }
            }
            0xd0 => Token::Int(i8::from_be_bytes(self.be()?) as i64),
            0xd1 => Token::Int(i16::from_be_bytes(self.be()?) as i64),
            0xd2 => Token::Int(i32::from_be_bytes(self.be()?) as i64),
            0xd3 => Token::Int(i64::from_be_bytes(self.be()?)),
            0xd9 => {
                let len = u8::from_be_bytes(self.be()?) as usize;
                return self.text(len);
            }
            0xda => {
                let len = u16::from_be_bytes(self.be()?) as usize;
                return self.text(len);
            }
            0xdb => {
                let len = u32::from_be_bytes(self.be()?) as usize;
                return self.text(len);
            }
            0xdc => Token::Array(u16::from_be_bytes(self.be()?) as u32),
            0xdd => Token::Array(u32::from_be_bytes(self.be()?)),
            0xde => Token::Map(u16::from_be_bytes(self.be()?) as u32),
            0xdf => Token::Map(u32::from_be_bytes(self.be()?)),
            0xe0..=0xff => Token::Int(marker as i8 as i64),
            // 0xc1 (never used), bin, ext and fixext.
            _ => return None,
        })
    }

    /// Reads past one value if [`Msgpack::read`] would take it (nothing is copied).
    pub fn check_value(&mut self) -> Option<()> {
        self.check(0)
    }

    /// The next value as `rmp_serde` decodes it into JSON: for a value [`Reader::check_value`]
    /// took (else `None` or a partial answer).
    pub fn json_value(&mut self) -> Option<serde_json::Value> {
        self.json()
    }

    /// Checks one whole value (see the module docs); `depth` is its nesting so far.
    fn check(&mut self, depth: usize) -> Option<()> {
        match self.token()? {
            Token::Float(f) if !f.is_finite() => None,
            Token::Str(text) => std::str::from_utf8(text).ok().map(|_| ()),
            Token::Array(n) => {
                if depth >= DEPTH_MAX {
                    return None;
                }
                (0..n).try_for_each(|_| self.check(depth + 1))
            }
            Token::Map(n) => {
                if depth >= DEPTH_MAX {
                    return None;
                }
                // Few keys (an argument object) are compared directly, without allocating;
                // many, through a set.
                let mut few: [&[u8]; FEW_KEYS] = [&[]; FEW_KEYS];
                let mut many = std::collections::HashSet::new();
                for i in 0..n as usize {
                    let Token::Str(key) = self.token()? else {
                        return None;
                    };
                    if key.starts_with(SERDE_JSON_PRIVATE.as_bytes())
                        || std::str::from_utf8(key).is_err()
                    {
                        return None;
                    }
                    let repeated = if n as usize <= FEW_KEYS {
                        let seen = few[..i].contains(&key);
                        few[i] = key;
                        seen
                    } else {
                        !many.insert(key)
                    };
                    if repeated {
                        return None;
                    }
                    self.check(depth + 1)?;
                }
                Some(())
            }
            _ => Some(()),
        }
    }

    /// One value as `serde_json` reads it from MessagePack (the value was checked).
    fn json(&mut self) -> Option<serde_json::Value> {
        use serde_json::Value as Json;
        Some(match self.token()? {
            Token::Nil => Json::Null,
            Token::Bool(b) => Json::Bool(b),
            Token::Int(i) => Json::from(i),
            Token::Uint(u) => Json::from(u),
            Token::Float(f) => serde_json::Number::from_f64(f).map_or(Json::Null, Json::Number),
            Token::Str(s) => Json::String(std::str::from_utf8(s).ok()?.to_owned()),
            Token::Array(n) => Json::Array((0..n).map(|_| self.json()).collect::<Option<_>>()?),
            Token::Map(n) => {
                let mut map = serde_json::Map::new();
                for _ in 0..n {
                    let Token::Str(key) = self.token()? else {
                        return None;
                    };
                    let value = self.json()?;
                    map.insert(std::str::from_utf8(key).ok()?.to_owned(), value);
                }
                Json::Object(map)
            }
        })
    }
}

impl Msgpack {
    /// The value that starts at `at` in `frame`, if [`Msgpack`] takes it (a copy of its
    /// bytes), and where it ends.
    pub fn read(frame: &[u8], at: usize) -> Option<(Msgpack, usize)> {
        let mut reader = Reader::new(frame.get(at..)?);
        reader.check(0)?;
        let end = at + reader.at;
        Some((Msgpack(frame[at..end].into()), end))
    }

    /// `bytes`, if they are one value [`Msgpack`] takes and nothing after it (kept, not
    /// copied).
    pub fn checked(bytes: Vec<u8>) -> Option<Msgpack> {
        let mut reader = Reader::new(&bytes);
        reader.check(0)?;
        (reader.at == bytes.len()).then(|| Msgpack(bytes.into_boxed_slice()))
    }

    /// The checked bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.0
    }

    /// The value as `rmp_serde` decodes these bytes into a `serde_json::Value`.
    pub fn to_json(&self) -> serde_json::Value {
        Reader::new(&self.0)
            .json()
            .expect("a Msgpack holds one checked value")
    }
}

/// A call's arguments: JSON as decoded, or MessagePack bytes checked by [`Msgpack::read`].
#[derive(Clone, Debug, PartialEq)]
pub enum Args {
    Json(serde_json::Value),
    Msgpack(Msgpack),
}

impl From<serde_json::Value> for Args {
    fn from(json: serde_json::Value) -> Args {
        Args::Json(json)
    }
}

/// Arguments borrowed from an [`Args`] or a plain JSON value.
#[derive(Clone, Copy)]
pub(crate) enum ArgsRef<'a> {
    Json(&'a serde_json::Value),
    Msgpack(&'a Msgpack),
}

impl<'a> From<&'a Args> for ArgsRef<'a> {
    fn from(args: &'a Args) -> ArgsRef<'a> {
        match args {
            Args::Json(json) => ArgsRef::Json(json),
            Args::Msgpack(m) => ArgsRef::Msgpack(m),
        }
    }
}

impl Args {
    /// The arguments as a JSON value (the MessagePack ones decoded as `rmp_serde` would).
    pub fn to_json(&self) -> serde_json::Value {
        match self {
            Args::Json(json) => json.clone(),
            Args::Msgpack(m) => m.to_json(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(frame: Vec<u8>) -> Option<serde_json::Value> {
        let (m, end) = Msgpack::read(&frame, 0)?;
        assert_eq!(end, frame.len());
        Some(m.to_json())
    }

    #[test]
    fn every_marker_reads_as_rmp_serde_reads_it() {
        let cases: Vec<serde_json::Value> = vec![
            serde_json::json!(null),
            serde_json::json!(true),
            serde_json::json!([
                0,
                127,
                128,
                255,
                256,
                65535,
                65536,
                4294967295u64,
                4294967296u64
            ]),
            serde_json::json!([
                u64::MAX,
                i64::MAX,
                i64::MIN,
                -1,
                -32,
                -33,
                -128,
                -129,
                -32768
            ]),
            serde_json::json!([-32769, -2147483648i64, -2147483649i64, 1.5, -0.0, 1e300]),
            serde_json::json!({"": "", "a": "x".repeat(31), "b": "y".repeat(32)}),
            serde_json::json!({"c": "z".repeat(256), "d": "w".repeat(65536), "ü": "ß"}),
            serde_json::json!((0..20).collect::<Vec<_>>()),
            serde_json::json!((0..70_000).collect::<Vec<_>>()),
            serde_json::Value::Object(
                (0..20)
                    .map(|i| (format!("k{i}"), serde_json::json!(i)))
                    .collect(),
            ),
        ];
        for value in cases {
            let bytes = rmp_serde::to_vec(&value).unwrap();
            let theirs: serde_json::Value = rmp_serde::from_slice(&bytes).unwrap();
            assert_eq!(read(bytes), Some(theirs), "{value}");
        }
        // A float32 (rmp_serde writes f64 for a JSON number).
        let mut f32_bytes = vec![0xca];
        f32_bytes.extend_from_slice(&0.25f32.to_be_bytes());
        assert_eq!(read(f32_bytes), Some(serde_json::json!(0.25)));
    }

    #[test]
    fn what_only_the_general_decoder_may_decide_is_not_taken() {
        let nan = [vec![0xcb], f64::NAN.to_be_bytes().to_vec()].concat();
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("bin", vec![0xc4, 1, 0]),
            ("ext", vec![0xd4, 1, 0]),
            ("never used", vec![0xc1]),
            ("NaN", nan),
            ("integer key", vec![0x81, 0x01, 0x02]),
            ("repeated key", vec![0x82, 0xa1, b'a', 1, 0xa1, b'a', 2]),
            ("not UTF-8", vec![0xa2, 0xff, 0xfe]),
            ("a key not UTF-8", vec![0x81, 0xa1, 0xff, 0x01]),
            ("not UTF-8 in an array", vec![0x91, 0xa1, 0xc0]),
            ("truncated string", vec![0xa5, b'a']),
            ("truncated array", vec![0x92, 1]),
            ("empty", vec![]),
            (
                "array32 claiming more than there is",
                vec![0xdd, 0xff, 0xff, 0xff, 0xff],
            ),
        ];
        for (why, bytes) in cases {
            assert_eq!(read(bytes), None, "{why}");
        }
        let private =
            rmp_serde::to_vec(&serde_json::json!({"$serde_json::private::RawValue": 1})).unwrap();
        assert_eq!(read(private), None);
        // Nesting: DEPTH_MAX arrays deep is taken, one more is not.
        let nested = |levels: usize| [vec![0x91; levels], vec![0xc0]].concat();
        assert!(read(nested(DEPTH_MAX)).is_some());
        assert_eq!(read(nested(DEPTH_MAX + 1)), None);
    }

    #[test]
    fn a_value_inside_a_frame_is_sliced_where_it_ends() {
        let frame = [0x93, 0x01, 0x92, 0xa1, b'x', 0xc3, 0x05];
        let (m, end) = Msgpack::read(&frame, 2).unwrap();
        assert_eq!(end, 6);
        assert_eq!(m.bytes(), &[0x92, 0xa1, b'x', 0xc3]);
        assert_eq!(m.to_json(), serde_json::json!(["x", true]));
    }
}
