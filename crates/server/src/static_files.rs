//! What the server sends that is not the API: the admin console embedded in the binary
//! (`/console/`), the files of `--public DIR`, and the compression of responses
//! (docs/api.md, "Console, static files and compression").
//!
//! - Console assets are `include_bytes!`'d; each one's `ETag` is a hash of its bytes,
//!   computed once on first use. A path under `/console/` with no extension that names no
//!   asset serves the console's `index.html` (client-side routes).
//! - `--public DIR`: a `GET`/`HEAD` outside the reserved prefixes ([`RESERVED`]) is a file
//!   under `DIR`. The path is percent-decoded and split into segments; `..`, a segment with
//!   a `/` or a NUL, or a file whose canonical path is outside `DIR`'s (a symlink out) is
//!   404. The `ETag` is the file's length and modification time (no read needed for a 304).
//! - Neither needs a token ([`is_public`], used by the auth middleware); whatever data the
//!   pages load through `/v1/` still does.
//! - Compression: [`compression`] (tower-http) compresses replies of at least
//!   [`COMPRESS_BYTES_MIN`] bytes. tower-http leaves `text/event-stream` alone because its
//!   encoders buffer, which would hold an event back until more output arrives; so
//!   [`compress_event_stream`] (called by the two SSE handlers) compresses SSE itself and flushes the encoder after every
//!   chunk the stream yields (one event, or one heartbeat comment), so each event can be
//!   decoded as soon as it arrives.

use std::path::{Component, Path, PathBuf};
use std::sync::LazyLock;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use std::sync::Arc;
use tower_http::compression::predicate::{NotForContentType, Predicate, SizeAbove};
use tower_http::compression::CompressionLayer;

use crate::api::ApiError;
use crate::core::Core;

/// Replies smaller than this are sent as they are: compressing them saves too little to pay
/// for the encoder.
pub const COMPRESS_BYTES_MIN: u16 = 1024;

/// Path prefixes that are never files of `--public DIR` (each also matches the bare path
/// without its trailing `/`).
pub const RESERVED: [&str; 4] = ["/v1/", "/console/", "/metrics/", "/health/"];

/// Size of the chunks a public file is streamed in.
const FILE_CHUNK_BYTES: usize = 64 * 1024;

// ---------------------------------------------------------------------------------------
// Which requests need no token.

/// Whether a request needs no token: `GET`/`HEAD` of `/`, the console, and with `--public`
/// every path outside [`RESERVED`]. Every `/v1/` path and `/metrics` still need one.
pub(crate) fn is_public(core: &Core, method: &Method, path: &str) -> bool {
    if method != Method::GET && method != Method::HEAD {
        return false;
    }
    if path == "/" || path == "/console" || path.starts_with("/console/") {
        return true;
    }
    core.config().public_dir.is_some() && !is_reserved(path)
}

fn is_reserved(path: &str) -> bool {
    RESERVED
        .iter()
        .any(|prefix| path.starts_with(prefix) || path == &prefix[..prefix.len() - 1])
}

// ---------------------------------------------------------------------------------------
// `--public DIR` at start.

/// Why `--public DIR` cannot be served; the server refuses to start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PublicDirError {
    #[error("--public {}: no such directory", .path.display())]
    Missing { path: PathBuf },
    #[error("--public {}: not a directory", .path.display())]
    NotADirectory { path: PathBuf },
    #[error("--public {}: cannot read the directory: {source}", .path.display())]
    Unreadable {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Checks that `path` is a readable directory and returns its canonical path (what every
/// served file must stay under).
pub fn check_public_dir(path: &Path) -> Result<PathBuf, PublicDirError> {
    let canonical = std::fs::canonicalize(path).map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound => PublicDirError::Missing { path: path.into() },
        _ => PublicDirError::Unreadable {
            path: path.into(),
            source,
        },
    })?;
    let meta = std::fs::metadata(&canonical).map_err(|source| PublicDirError::Unreadable {
        path: path.into(),
        source,
    })?;
    if !meta.is_dir() {
        return Err(PublicDirError::NotADirectory { path: path.into() });
    }
    std::fs::read_dir(&canonical).map_err(|source| PublicDirError::Unreadable {
        path: path.into(),
        source,
    })?;
    Ok(canonical)
}

// ---------------------------------------------------------------------------------------
// Handlers.

/// `GET /`: the console, or `DIR/index.html` with `--public`.
pub(crate) async fn root(State(core): State<Arc<Core>>, headers: HeaderMap) -> Response {
    match &core.config().public_dir {
        Some(dir) => serve_public(dir, "/", &headers).await,
        None => redirect("/console/"),
    }
}

/// `GET /console` → `/console/` (the page's relative asset paths need the slash).
pub(crate) async fn console_redirect() -> Response {
    redirect("/console/")
}

/// `GET /console/`.
pub(crate) async fn console_index(headers: HeaderMap) -> Response {
    console_asset_response("index.html", &headers)
}

/// `GET /console/<asset>`.
pub(crate) async fn console_asset(
    axum::extract::Path(path): axum::extract::Path<String>,
    headers: HeaderMap,
) -> Response {
    console_asset_response(&path, &headers)
}

/// Every path no route took: a file of `--public DIR` for a `GET`/`HEAD` outside
/// [`RESERVED`], else the API's JSON 404.
pub(crate) async fn fallback(
    State(core): State<Arc<Core>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    if let Some(dir) = &core.config().public_dir {
        if (method == Method::GET || method == Method::HEAD) && !is_reserved(uri.path()) {
            return serve_public(dir, uri.path(), &headers).await;
        }
    }
    crate::api::fallback(method, uri).await.into_response()
}

fn redirect(to: &'static str) -> Response {
    (StatusCode::FOUND, [(header::LOCATION, to)]).into_response()
}

// ---------------------------------------------------------------------------------------
// The embedded console.

struct Asset {
    name: &'static str,
    bytes: &'static [u8],
    etag: HeaderValue,
}

/// The console's files, as `crates/server/assets/console/` holds them at build time.
/// A new asset file needs a line here.
static CONSOLE: LazyLock<Vec<Asset>> = LazyLock::new(|| {
    macro_rules! asset {
        ($name:literal) => {
            (
                $name,
                &include_bytes!(concat!("../assets/console/", $name))[..],
            )
        };
    }
    let files: [(&'static str, &'static [u8]); 3] = [
        asset!("index.html"),
        asset!("console.js"),
        asset!("console.css"),
    ];
    files
        .into_iter()
        .map(|(name, bytes)| Asset {
            name,
            bytes,
            etag: HeaderValue::from_str(&format!("\"{:016x}\"", fnv1a(bytes)))
                .expect("hex is a valid header value"),
        })
        .collect()
});

/// FNV-1a, 64 bits: stable across builds, so an unchanged asset keeps its ETag.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn console_asset_response(path: &str, headers: &HeaderMap) -> Response {
    let found = CONSOLE.iter().find(|a| a.name == path).or_else(|| {
        // Client-side routes of the console (no extension) get its page.
        if has_extension(path) {
            None
        } else {
            CONSOLE.iter().find(|a| a.name == "index.html")
        }
    });
    let Some(asset) = found else {
        return ApiError::not_found(format!("no console asset /console/{path}")).into_response();
    };
    let mut response = if etag_matches(headers, &asset.etag) {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        let mut r = Body::from(asset.bytes).into_response();
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(content_type(asset.name)),
        );
        r
    };
    let h = response.headers_mut();
    h.insert(header::ETAG, asset.etag.clone());
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    response
}

// ---------------------------------------------------------------------------------------
// `--public DIR` files.

/// The segments of a request path under the public directory, or `None` when the path
/// could leave it (`..`), or cannot name a file (an encoded `/` or NUL, bad UTF-8).
fn relative_path(path: &str) -> Option<PathBuf> {
    let mut rel = PathBuf::new();
    for segment in path.split('/') {
        let segment = percent_encoding::percent_decode_str(segment)
            .decode_utf8()
            .ok()?;
        match segment.as_ref() {
            "" | "." => continue,
            ".." => return None,
            s if s.contains(['/', '\\', '\0']) => return None,
            s => rel.push(s),
        }
    }
    // One more guard: what was pushed must be plain names only (no root, no prefix).
    if rel.components().all(|c| matches!(c, Component::Normal(_))) {
        Some(rel)
    } else {
        None
    }
}

fn has_extension(path: &str) -> bool {
    let last = path.rsplit('/').next().unwrap_or("");
    last.rfind('.').is_some_and(|i| i > 0 && i + 1 < last.len())
}

/// A file found under the public directory.
struct Found {
    path: PathBuf,
    meta: std::fs::Metadata,
}

/// The canonical form of `candidate` if it is a file under `root` (after following every
/// symlink).
async fn file_under(root: &Path, candidate: &Path) -> Option<Found> {
    let path = tokio::fs::canonicalize(candidate).await.ok()?;
    if !path.starts_with(root) {
        return None;
    }
    let meta = tokio::fs::metadata(&path).await.ok()?;
    meta.is_file().then_some(Found { path, meta })
}

async fn serve_public(dir: &Path, path: &str, headers: &HeaderMap) -> Response {
    let not_found = || ApiError::not_found(format!("no file for {path}")).into_response();
    let Some(rel) = relative_path(path) else {
        return not_found();
    };
    // The directory given at start was canonical then; canonicalize again in case it is a
    // symlink that moved.
    let Ok(root) = tokio::fs::canonicalize(dir).await else {
        return not_found();
    };
    let candidate = root.join(&rel);
    let found = match tokio::fs::canonicalize(&candidate).await {
        Ok(real) if real.starts_with(&root) => match tokio::fs::metadata(&real).await {
            Ok(meta) if meta.is_dir() => {
                if !path.ends_with('/') {
                    // The page's relative links need the slash.
                    return match HeaderValue::from_str(&format!("{path}/")) {
                        Ok(to) => (StatusCode::FOUND, [(header::LOCATION, to)]).into_response(),
                        Err(_) => not_found(),
                    };
                }
                file_under(&root, &real.join("index.html")).await
            }
            Ok(meta) if meta.is_file() => Some(Found { path: real, meta }),
            _ => None,
        },
        // A symlink out of the directory.
        Ok(_) => None,
        // No such file: a path with no extension is a client-side route of a single-page
        // app, which its index.html handles.
        Err(_) if !has_extension(path) => file_under(&root, &root.join("index.html")).await,
        Err(_) => None,
    };
    let Some(found) = found else {
        return not_found();
    };
    file_response(found, headers).await
}

async fn file_response(found: Found, headers: &HeaderMap) -> Response {
    let len = found.meta.len();
    let modified_ns = found
        .meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    let etag = HeaderValue::from_str(&format!("\"{len:x}-{modified_ns:x}\""))
        .expect("hex is a valid header value");
    let name = found
        .path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("");
    let mut response = if etag_matches(headers, &etag) {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        let file = match tokio::fs::File::open(&found.path).await {
            Ok(file) => file,
            Err(e) => {
                tracing::warn!(path = %found.path.display(), "cannot open a public file: {e}");
                return ApiError::not_found("the file cannot be read").into_response();
            }
        };
        let stream = futures_util::stream::try_unfold(file, |mut file| async move {
            use tokio::io::AsyncReadExt;
            let mut buf = vec![0; FILE_CHUNK_BYTES];
            let n = file.read(&mut buf).await?;
            if n == 0 {
                return Ok::<_, std::io::Error>(None);
            }
            buf.truncate(n);
            Ok(Some((Bytes::from(buf), file)))
        });
        let mut r = Body::from_stream(stream).into_response();
        let h = r.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(content_type(name)),
        );
        h.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
        r
    };
    let h = response.headers_mut();
    h.insert(header::ETAG, etag);
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    response
}

/// `If-None-Match` names `etag` (or is `*`); weak comparison, as for a `GET`.
fn etag_matches(headers: &HeaderMap, etag: &HeaderValue) -> bool {
    let Ok(ours) = etag.to_str() else {
        return false;
    };
    headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim())
        .any(|t| t == "*" || t.strip_prefix("W/").unwrap_or(t) == ours)
}

/// `Content-Type` by file extension.
pub fn content_type(name: &str) -> &'static str {
    let ext = name
        .rsplit_once('.')
        .map(|(_, e)| e.to_ascii_lowercase())
        .unwrap_or_default();
    match ext.as_str() {
        "html" | "htm" => "text/html; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "json" | "map" => "application/json",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "ico" => "image/x-icon",
        "wasm" => "application/wasm",
        "txt" => "text/plain; charset=utf-8",
        "woff2" => "font/woff2",
        "woff" => "font/woff",
        _ => "application/octet-stream",
    }
}

// ---------------------------------------------------------------------------------------
// Compression.

/// The compression of every reply but event streams: zstd or gzip (zstd preferred at an
/// equal `q`), for replies of at least [`COMPRESS_BYTES_MIN`] bytes; images other than SVG
/// are already compressed. A WebSocket upgrade has an empty body and so is never touched.
pub fn compression() -> CompressionLayer<impl Predicate> {
    CompressionLayer::new().no_br().no_deflate().compress_when(
        SizeAbove::new(COMPRESS_BYTES_MIN)
            .and(NotForContentType::GRPC)
            .and(NotForContentType::IMAGES)
            .and(NotForContentType::SSE)
            .and(NotForContentType::const_new("font/woff2")),
    )
}

/// [`compression`] around `inner`, passed by for a request that accepts no coding the server
/// has ([`negotiate`] finds neither zstd nor gzip: no `Accept-Encoding`, `identity`, `br`).
///
/// *Why.* Such a request can only be answered as it is, yet the layer still costs it: the
/// response future and body wrapped, the predicate run, a `Vary` header added, the body boxed
/// a second time by the router (callgrind, `POST /v1/call/transfer` with `Accept-Encoding:
/// identity`: 71.2 K → 70.4 K instructions per request for the whole server). API clients
/// that do not ask for compression (curl without `--compressed`, Python's `http.client`,
/// many HTTP libraries by default, the bench's) go straight to the router; a request that
/// accepts zstd or gzip is negotiated by tower-http as before (which may still answer it as
/// it is: a small reply, a `q` that prefers identity).
pub fn compress_if_accepted<S>(inner: S) -> CompressIfAccepted<S, impl Predicate>
where
    S: tower::Service<axum::extract::Request, Response = Response> + Clone,
{
    CompressIfAccepted {
        coded: tower::Layer::layer(&compression(), inner),
    }
}

/// The service [`compress_if_accepted`] makes.
#[derive(Clone)]
pub struct CompressIfAccepted<S, P> {
    /// tower-http's compression around the inner service, which a request that accepts no
    /// coding reaches directly, through [`tower_http::compression::Compression::get_mut`].
    coded: tower_http::compression::Compression<S, P>,
}

/// The response of the compressed branch, its body boxed as the router's are.
type CodedResponse = Response<tower_http::compression::CompressionBody<Body>>;

impl<S, P> tower::Service<axum::extract::Request> for CompressIfAccepted<S, P>
where
    S: tower::Service<axum::extract::Request, Response = Response>,
    P: Predicate,
{
    type Response = Response;
    type Error = S::Error;
    type Future = futures_util::future::Either<
        S::Future,
        futures_util::future::MapOk<
            tower_http::compression::ResponseFuture<S::Future, P>,
            fn(CodedResponse) -> Response,
        >,
    >;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        // One inner service serves both branches, and this polls it.
        self.coded.poll_ready(cx)
    }

    fn call(&mut self, request: axum::extract::Request) -> Self::Future {
        use futures_util::TryFutureExt;
        if negotiate(request.headers()) != Coding::Identity {
            let boxed: fn(CodedResponse) -> Response = |r| r.map(Body::new);
            futures_util::future::Either::Right(self.coded.call(request).map_ok(boxed))
        } else {
            futures_util::future::Either::Left(self.coded.get_mut().call(request))
        }
    }
}

/// An encoding a client accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Coding {
    Identity,
    Gzip,
    Zstd,
}

/// The best coding `Accept-Encoding` allows: the highest `q`, zstd at a tie.
fn negotiate(headers: &HeaderMap) -> Coding {
    let mut best = (0u16, Coding::Identity);
    for value in headers.get_all(header::ACCEPT_ENCODING) {
        let Ok(value) = value.to_str() else { continue };
        for item in value.split(',') {
            let mut parts = item.split(';');
            let coding = match parts
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
                .as_str()
            {
                "zstd" => Coding::Zstd,
                "gzip" | "x-gzip" => Coding::Gzip,
                _ => continue,
            };
            let mut q = 1000u16;
            for param in parts {
                if let Some(v) = param.trim().strip_prefix("q=") {
                    q = v
                        .trim()
                        .parse::<f32>()
                        .map_or(0, |q| (q.clamp(0.0, 1.0) * 1000.0) as u16);
                }
            }
            if q > 0 && (q, coding) > best {
                best = (q, coding);
            }
        }
    }
    best.1
}

/// One encoder of an event stream: every chunk in, a flushed (decodable) chunk out.
enum StreamEncoder {
    Gzip(flate2::write::GzEncoder<Vec<u8>>),
    Zstd(zstd::stream::write::Encoder<'static, Vec<u8>>),
}

impl StreamEncoder {
    fn new(coding: Coding) -> std::io::Result<StreamEncoder> {
        Ok(match coding {
            Coding::Gzip => StreamEncoder::Gzip(flate2::write::GzEncoder::new(
                Vec::new(),
                flate2::Compression::default(),
            )),
            _ => StreamEncoder::Zstd(zstd::stream::write::Encoder::new(
                Vec::new(),
                zstd::DEFAULT_COMPRESSION_LEVEL,
            )?),
        })
    }

    /// Compresses `chunk` and flushes, so that a client can decode everything so far.
    fn push(&mut self, chunk: &[u8]) -> std::io::Result<Bytes> {
        use std::io::Write;
        match self {
            StreamEncoder::Gzip(e) => {
                e.write_all(chunk)?;
                e.flush()?;
                Ok(Bytes::from(std::mem::take(e.get_mut())))
            }
            StreamEncoder::Zstd(e) => {
                e.write_all(chunk)?;
                e.flush()?;
                Ok(Bytes::from(std::mem::take(e.get_mut())))
            }
        }
    }

    /// The end of the compressed stream (trailer, checksum).
    fn finish(self) -> std::io::Result<Bytes> {
        Ok(Bytes::from(match self {
            StreamEncoder::Gzip(e) => e.finish()?,
            StreamEncoder::Zstd(e) => e.finish()?,
        }))
    }
}

/// `response`, an event stream (`text/event-stream`), compressed when the request's
/// `request_headers` accept zstd or gzip, flushing after every chunk of the stream so that
/// no event waits in the encoder. The two handlers that make event streams call it: as a
/// middleware around every route it cost every other request ~3 K instructions
/// (callgrind, `POST /v1/call`) for a check that only these two can pass.
pub(crate) fn compress_event_stream(request_headers: &HeaderMap, response: Response) -> Response {
    let coding = negotiate(request_headers);
    if coding == Coding::Identity
        || response.headers().contains_key(header::CONTENT_ENCODING)
        || !response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"))
    {
        return response;
    }
    let encoder = match StreamEncoder::new(coding) {
        Ok(encoder) => encoder,
        Err(e) => {
            tracing::warn!("cannot start an event-stream encoder, sending it uncompressed: {e}");
            return response;
        }
    };
    let (mut parts, body) = response.into_parts();
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_ENCODING,
        HeaderValue::from_static(match coding {
            Coding::Gzip => "gzip",
            _ => "zstd",
        }),
    );
    parts
        .headers
        .append(header::VARY, HeaderValue::from_static("accept-encoding"));
    let chunks = body.into_data_stream();
    let stream = futures_util::stream::unfold(
        (chunks, Some(encoder)),
        |(mut chunks, encoder)| async move {
            let mut encoder = encoder?;
            loop {
                return match chunks.next().await {
                    Some(Ok(chunk)) => match encoder.push(&chunk) {
                        Ok(out) if out.is_empty() => continue,
                        Ok(out) => Some((Ok(out), (chunks, Some(encoder)))),
                        Err(e) => Some((Err(axum::Error::new(e)), (chunks, None))),
                    },
                    Some(Err(e)) => Some((Err(e), (chunks, None))),
                    None => Some((encoder.finish().map_err(axum::Error::new), (chunks, None))),
                };
            }
        },
    );
    Response::from_parts(parts, Body::from_stream(stream))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_that_could_leave_the_directory_are_refused() {
        assert_eq!(relative_path("/a/b.js"), Some(PathBuf::from("a/b.js")));
        assert_eq!(relative_path("/a//./b.js"), Some(PathBuf::from("a/b.js")));
        assert_eq!(relative_path("/a%20b.txt"), Some(PathBuf::from("a b.txt")));
        assert_eq!(relative_path("/"), Some(PathBuf::new()));
        for bad in [
            "/../etc/passwd",
            "/a/../../x",
            "/%2e%2e/x",
            "/a%2f..%2f..%2fx",
            "/a%5c..%5cx",
            "/a%00.js",
            "/%ff",
        ] {
            assert_eq!(relative_path(bad), None, "{bad}");
        }
    }

    #[test]
    fn extensions() {
        assert!(has_extension("/a/b.js"));
        assert!(!has_extension("/rooms/general"));
        assert!(!has_extension("/.well-known"));
        assert!(!has_extension("/a.b/c"));
    }

    #[test]
    fn accept_encoding_prefers_zstd_and_honours_q() {
        let h = |v: &str| {
            let mut m = HeaderMap::new();
            m.insert(header::ACCEPT_ENCODING, HeaderValue::from_str(v).unwrap());
            m
        };
        assert_eq!(negotiate(&HeaderMap::new()), Coding::Identity);
        assert_eq!(negotiate(&h("gzip, deflate, br, zstd")), Coding::Zstd);
        assert_eq!(negotiate(&h("gzip")), Coding::Gzip);
        assert_eq!(negotiate(&h("zstd;q=0.5, gzip")), Coding::Gzip);
        assert_eq!(negotiate(&h("zstd;q=0, gzip;q=0")), Coding::Identity);
        assert_eq!(negotiate(&h("br")), Coding::Identity);
    }

    #[test]
    fn reserved_prefixes() {
        for p in ["/v1", "/v1/sql", "/metrics", "/health", "/console/x"] {
            assert!(is_reserved(p), "{p}");
        }
        for p in ["/", "/v1x", "/index.html", "/rooms/1", "/metricsx"] {
            assert!(!is_reserved(p), "{p}");
        }
    }
}
