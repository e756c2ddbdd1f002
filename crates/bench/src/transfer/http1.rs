//! A lean keep-alive HTTP/1.1 client for the request/response targets: one connection, one
//! request at a time, the request written from a reused buffer and the response head parsed
//! in place (`httparse`), its body read by `Content-Length`.
//!
//! Why not `reqwest`: on this 2-core machine the bench client shares the CPUs with the server
//! it measures, and `reqwest` (connection pool, header maps, body streams, a timer per
//! request) cost about 20 µs of CPU per `POST /v1/call/transfer` — as much as the server's own
//! network threads — which slowed every request/response target by taking their CPU. A real
//! client runs elsewhere; this one does the same HTTP exchange with a fraction of the CPU, for
//! every target alike (Sluice and the RPC servers in front of PostgreSQL and SQLite).
//!
//! Only what those servers send is read: a response with `Content-Length` (a chunked or
//! unframed response is an error, never guessed at). A response with `Connection: close`
//! makes the next request open a new connection.

use std::time::Duration;

use anyhow::{bail, Context};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Response heads hold at most this many header lines.
const HEADERS_MAX: usize = 32;
/// A response (head and body) larger than this is refused as an error.
const RESPONSE_BYTES_MAX: usize = 16 << 20;

/// One keep-alive connection to `http://host/path`.
pub struct Http1 {
    stream: Option<TcpStream>,
    host: String,
    path: String,
    authorization: String,
    timeout: Duration,
    request: Vec<u8>,
    /// Bytes read from the connection; the response being read starts at 0.
    read: Vec<u8>,
    /// The response returned last ends here (dropped before the next one is read).
    consumed: usize,
}

impl Http1 {
    /// Connects to `url` (`http://HOST:PORT/PATH`); every request carries
    /// `Authorization: <authorization>` and must complete within `timeout`.
    pub async fn connect(
        url: &str,
        authorization: &str,
        timeout: Duration,
    ) -> anyhow::Result<Self> {
        let Some(rest) = url.strip_prefix("http://") else {
            bail!("{url}: only http:// URLs are supported");
        };
        let (host, path) = match rest.find('/') {
            Some(at) => (&rest[..at], &rest[at..]),
            None => (rest, "/"),
        };
        let mut client = Http1 {
            stream: None,
            host: host.to_string(),
            path: path.to_string(),
            authorization: authorization.to_string(),
            timeout,
            request: Vec::with_capacity(512),
            read: Vec::with_capacity(4096),
            consumed: 0,
        };
        client.reconnect().await?;
        Ok(client)
    }

    async fn reconnect(&mut self) -> anyhow::Result<()> {
        let stream = TcpStream::connect(&self.host)
            .await
            .with_context(|| format!("connect to {}", self.host))?;
        stream.set_nodelay(true)?;
        self.stream = Some(stream);
        self.read.clear();
        self.consumed = 0;
        Ok(())
    }

    /// `POST`s `body` as `application/json`; the status and the response body.
    pub async fn post_json(&mut self, body: &[u8]) -> anyhow::Result<(u16, &[u8])> {
        let timeout = self.timeout;
        match tokio::time::timeout(timeout, self.exchange(body)).await {
            Ok(Ok((status, start, end))) => Ok((status, &self.read[start..end])),
            Ok(Err(e)) => {
                self.stream = None;
                Err(e)
            }
            Err(_) => {
                self.stream = None;
                bail!("no response within {timeout:?}")
            }
        }
    }

    /// Sends one request and reads its response: the status and where its body lies in
    /// `self.read`.
    async fn exchange(&mut self, body: &[u8]) -> anyhow::Result<(u16, usize, usize)> {
        if self.stream.is_none() {
            self.reconnect().await?;
        }
        // What the previous response left (nothing, from these servers) starts the next.
        self.read.drain(..self.consumed);
        self.consumed = 0;
        self.request.clear();
        {
            use std::io::Write;
            write!(
                self.request,
                "POST {} HTTP/1.1\r\nhost: {}\r\nauthorization: {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                self.path,
                self.host,
                self.authorization,
                body.len()
            )?;
        }
        self.request.extend_from_slice(body);
        let stream = self.stream.as_mut().expect("connected above");
        stream.write_all(&self.request).await?;

        // The head.
        let (status, head_len, body_len, close) = loop {
            if let Some(head) = parse_head(&self.read)? {
                break head;
            }
            read_more(stream, &mut self.read).await?;
        };
        let end = head_len
            .checked_add(body_len)
            .filter(|&end| end <= RESPONSE_BYTES_MAX)
            .with_context(|| format!("a response over {RESPONSE_BYTES_MAX} bytes"))?;
        while self.read.len() < end {
            read_more(stream, &mut self.read).await?;
        }
        self.consumed = end;
        if close {
            self.stream = None;
        }
        Ok((status, head_len, end))
    }
}

/// Reads what the connection has into `buf`; an error at end of stream.
async fn read_more(stream: &mut TcpStream, buf: &mut Vec<u8>) -> anyhow::Result<()> {
    if buf.len() >= RESPONSE_BYTES_MAX {
        bail!("a response head over {RESPONSE_BYTES_MAX} bytes");
    }
    buf.reserve(4096);
    if stream.read_buf(buf).await? == 0 {
        bail!("the server closed the connection before its response was complete");
    }
    Ok(())
}

/// The response head at the start of `buf` if it is complete: its status, its length, the
/// body's length (`Content-Length`) and whether the server closes the connection after it.
fn parse_head(buf: &[u8]) -> anyhow::Result<Option<(u16, usize, usize, bool)>> {
    let mut headers = [httparse::EMPTY_HEADER; HEADERS_MAX];
    let mut response = httparse::Response::new(&mut headers);
    let head_len = match response.parse(buf).context("a malformed response head")? {
        httparse::Status::Partial => return Ok(None),
        httparse::Status::Complete(n) => n,
    };
    let status = response.code.context("a response without a status")?;
    let mut body_len = None;
    let mut close = response.version == Some(0);
    for h in response.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            let text = std::str::from_utf8(h.value).context("a non-ASCII Content-Length")?;
            body_len = Some(
                text.trim()
                    .parse::<usize>()
                    .with_context(|| format!("Content-Length {text:?}"))?,
            );
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            bail!("a response with Transfer-Encoding (only Content-Length is read)");
        } else if h.name.eq_ignore_ascii_case("connection") {
            close = h.value.eq_ignore_ascii_case(b"close");
        }
    }
    // 1xx, 204 and 304 have no body.
    let body_len = match (status, body_len) {
        (100..=199 | 204 | 304, _) => 0,
        (_, Some(n)) => n,
        (_, None) => bail!("a {status} response without Content-Length"),
    };
    Ok(Some((status, head_len, body_len, close)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_are_read_only_when_complete_and_framed() {
        let ok = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nContent-Length: 24\r\n\r\n{\"seq\":1,\"result\":null}";
        let head = parse_head(ok).unwrap().unwrap();
        assert_eq!((head.0, head.2, head.3), (200, 24, false));
        assert_eq!(&ok[head.1..head.1 + 3], b"{\"s");
        // Any prefix of the head is partial.
        let head_len = head.1;
        for cut in 0..head_len {
            assert!(parse_head(&ok[..cut]).unwrap().is_none(), "cut at {cut}");
        }
        let closing =
            b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 2\r\n\r\n{}";
        assert!(
            parse_head(closing).unwrap().unwrap().3,
            "connection: close is read"
        );
        let chunked = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n";
        assert!(parse_head(chunked).is_err());
        let unframed = b"HTTP/1.1 200 OK\r\n\r\n";
        assert!(parse_head(unframed).is_err());
        let garbage = b"HTTP/1.1 2x0 OK\r\n\r\n";
        assert!(parse_head(garbage).is_err());
    }

    #[tokio::test]
    async fn posts_over_one_connection_and_reconnects_after_close() {
        use tokio::net::TcpListener;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        // A server that answers two requests on its first connection (the second with
        // `connection: close`, its body in two writes) and one on the next.
        let server = tokio::spawn(async move {
            let mut accepted = 0;
            let mut seen = Vec::new();
            for replies in [2, 1] {
                let (mut s, _) = listener.accept().await.unwrap();
                accepted += 1;
                for r in 0..replies {
                    let mut buf = Vec::new();
                    // Head, then the body by its content-length.
                    loop {
                        let mut chunk = [0u8; 1024];
                        let n = s.read(&mut chunk).await.unwrap();
                        assert!(n > 0);
                        buf.extend_from_slice(&chunk[..n]);
                        let text = String::from_utf8_lossy(&buf).to_string();
                        if let Some(at) = text.find("\r\n\r\n") {
                            let len: usize = text
                                .lines()
                                .find_map(|l| l.strip_prefix("content-length: "))
                                .unwrap()
                                .parse()
                                .unwrap();
                            if buf.len() >= at + 4 + len {
                                seen.push(text[at + 4..at + 4 + len].to_string());
                                assert!(text.contains("authorization: Bearer t\r\n"));
                                assert!(text.starts_with("POST /v1/call/x HTTP/1.1\r\n"));
                                break;
                            }
                        }
                    }
                    let last = replies == 2 && r == 1;
                    let head = format!(
                        "HTTP/1.1 200 OK\r\n{}content-length: 5\r\n\r\n",
                        if last { "connection: close\r\n" } else { "" }
                    );
                    s.write_all(head.as_bytes()).await.unwrap();
                    s.write_all(b"he").await.unwrap();
                    s.flush().await.unwrap();
                    s.write_all(b"llo").await.unwrap();
                }
            }
            (accepted, seen)
        });
        let url = format!("http://{addr}/v1/call/x");
        let mut c = Http1::connect(&url, "Bearer t", Duration::from_secs(10))
            .await
            .unwrap();
        for body in ["a", "bb", "ccc"] {
            let (status, got) = c.post_json(body.as_bytes()).await.unwrap();
            assert_eq!((status, got), (200, &b"hello"[..]));
        }
        let (accepted, seen) = server.await.unwrap();
        assert_eq!(accepted, 2);
        assert_eq!(seen, ["a", "bb", "ccc"]);
    }
}
