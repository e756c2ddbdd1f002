//! The little of RESP (the Redis protocol) the bench speaks: commands out, replies in.
//!
//! Hand-written on purpose: the fan-out suite holds 10 000 subscriber connections on two
//! cores, so each reads raw bytes and parses only what it needs, exactly as the Sluice
//! watchers do; a full client library would cost the peer more than the server side pays.

use anyhow::Context;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A reply: simple strings and errors as `Simple`/`Error`, bulk strings as bytes.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Value>>),
}

impl Value {
    pub fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            Value::Bulk(Some(b)) => Some(b),
            Value::Simple(s) => Some(s.as_bytes()),
            _ => None,
        }
    }
    pub fn items(&self) -> &[Value] {
        match self {
            Value::Array(Some(v)) => v,
            _ => &[],
        }
    }
}

/// Appends `args` as one RESP command (an array of bulk strings) to `out`.
pub fn encode(out: &mut Vec<u8>, args: &[&[u8]]) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

/// Parses one complete value at the start of `buf`: `Some((value, bytes used))`, `None`
/// when more bytes are needed. Malformed input is an error.
pub fn parse(buf: &[u8]) -> anyhow::Result<Option<(Value, usize)>> {
    let Some(end) = buf.windows(2).position(|w| w == b"\r\n") else {
        return Ok(None);
    };
    anyhow::ensure!(end >= 1, "RESP: empty line");
    let line = std::str::from_utf8(&buf[1..end]).context("RESP: a header is not UTF-8")?;
    let after = end + 2;
    let int = || {
        line.parse::<i64>()
            .with_context(|| format!("RESP: bad length {line:?}"))
    };
    Ok(match buf[0] {
        b'+' => Some((Value::Simple(line.to_string()), after)),
        b'-' => Some((Value::Error(line.to_string()), after)),
        b':' => Some((Value::Int(int()?), after)),
        b'$' => {
            let n = int()?;
            if n < 0 {
                return Ok(Some((Value::Bulk(None), after)));
            }
            let n = n as usize;
            if buf.len() < after + n + 2 {
                return Ok(None);
            }
            Some((
                Value::Bulk(Some(buf[after..after + n].to_vec())),
                after + n + 2,
            ))
        }
        b'*' | b'>' => {
            let n = int()?;
            if n < 0 {
                return Ok(Some((Value::Array(None), after)));
            }
            let mut items = Vec::with_capacity(n as usize);
            let mut at = after;
            for _ in 0..n {
                match parse(&buf[at..])? {
                    Some((v, used)) => {
                        items.push(v);
                        at += used;
                    }
                    None => return Ok(None),
                }
            }
            Some((Value::Array(Some(items)), at))
        }
        other => anyhow::bail!("RESP: unexpected type byte {:?}", other as char),
    })
}

/// One connection: buffered replies, commands written whole.
#[derive(Debug)]
pub struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
    start: usize,
}

impl Conn {
    pub async fn connect(port: u16) -> anyhow::Result<Conn> {
        let stream = TcpStream::connect(("127.0.0.1", port))
            .await
            .with_context(|| format!("cannot connect to redis on 127.0.0.1:{port}"))?;
        stream.set_nodelay(true)?;
        Ok(Conn {
            stream,
            buf: Vec::with_capacity(16 << 10),
            start: 0,
        })
    }

    /// Writes raw, already encoded commands (a pipeline).
    pub async fn send(&mut self, bytes: &[u8]) -> anyhow::Result<()> {
        self.stream.write_all(bytes).await?;
        Ok(())
    }

    /// Reads the next complete reply (or push message).
    pub async fn read(&mut self) -> anyhow::Result<Value> {
        loop {
            if let Some((v, used)) = parse(&self.buf[self.start..])? {
                self.start += used;
                if self.start == self.buf.len() {
                    self.buf.clear();
                    self.start = 0;
                }
                return Ok(v);
            }
            if self.start > 0 {
                self.buf.drain(..self.start);
                self.start = 0;
            }
            let mut chunk = [0u8; 16 << 10];
            let n = self.stream.read(&mut chunk).await?;
            anyhow::ensure!(n > 0, "redis closed the connection");
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// Sends one command and returns its reply; a Redis error reply is an error.
    pub async fn call(&mut self, args: &[&[u8]]) -> anyhow::Result<Value> {
        let mut out = Vec::new();
        encode(&mut out, args);
        self.send(&out).await?;
        match self.read().await? {
            Value::Error(e) => anyhow::bail!(
                "redis {}: {e}",
                String::from_utf8_lossy(args.first().copied().unwrap_or_default())
            ),
            v => Ok(v),
        }
    }

    /// The socket itself, for readers that parse the stream on their own.
    pub fn into_parts(self) -> (TcpStream, Vec<u8>) {
        (self.stream, self.buf[self.start..].to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_encode_and_replies_parse() {
        let mut out = Vec::new();
        encode(&mut out, &[b"SET", b"k", b"v"]);
        assert_eq!(out, b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n");
        let reply = b"*3\r\n$7\r\nmessage\r\n$1\r\nc\r\n$2\r\nhi\r\n+OK\r\n";
        let (v, used) = parse(reply).unwrap().unwrap();
        assert_eq!(
            v,
            Value::Array(Some(vec![
                Value::Bulk(Some(b"message".to_vec())),
                Value::Bulk(Some(b"c".to_vec())),
                Value::Bulk(Some(b"hi".to_vec())),
            ]))
        );
        assert_eq!(
            parse(&reply[used..]).unwrap().unwrap().0,
            Value::Simple("OK".into())
        );
        assert_eq!(parse(&reply[..used - 1]).unwrap(), None);
        assert_eq!(parse(b":-3\r\n").unwrap().unwrap().0, Value::Int(-3));
        assert_eq!(parse(b"$-1\r\n").unwrap().unwrap().0, Value::Bulk(None));
        assert!(parse(b"?x\r\n").is_err());
    }
}
