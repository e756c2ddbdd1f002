//! Who is calling: bearer tokens (the admin token, client JWTs) checked once per request by
//! [`authenticate`], which leaves a [`Caller`] in the request's extensions for the handlers.
//! What a caller may then read and write is decided by the rules (`crate::rules`).
//! The model is in `docs/security.md`.

use std::path::Path;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value as Json};

use crate::api::ApiError;
use crate::core::Core;

/// The caller of a request, as its token proved.
#[derive(Clone, Debug)]
pub enum Caller {
    /// The admin token: every rule is bypassed.
    Admin,
    /// A verified client token.
    Client(Arc<Claims>),
}

/// A client token's claims.
#[derive(Debug, PartialEq)]
pub struct Claims {
    /// `sub`, required.
    pub sub: String,
    /// Every top-level claim of the token (`sub` and `exp` included).
    pub all: Map<String, Json>,
}

impl Caller {
    pub fn is_admin(&self) -> bool {
        matches!(self, Caller::Admin)
    }

    /// The client's claims; `None` for the admin.
    pub fn claims(&self) -> Option<&Arc<Claims>> {
        match self {
            Caller::Admin => None,
            Caller::Client(c) => Some(c),
        }
    }

    /// Refuses a client on an admin-only endpoint (403 `forbidden` naming it).
    pub fn require_admin(&self, what: &str) -> Result<(), ApiError> {
        match self {
            Caller::Admin => Ok(()),
            Caller::Client(_) => Err(ApiError::forbidden(format!(
                "{what} needs the admin token; a client token may not use it"
            ))),
        }
    }
}

/// How tokens are checked (`--admin-token`, `--jwt-*`).
#[derive(Clone, Debug, Default)]
pub struct AuthConfig {
    /// The admin token; `None`: read `<data-dir>/admin-token`, generating it on first start.
    pub admin_token: Option<String>,
    /// HS256 secret for client tokens (`--jwt-secret`).
    pub jwt_secret: Option<String>,
    /// PEM public key for client tokens (`--jwt-public-key`): RS256, ES256 or EdDSA.
    pub jwt_public_key_pem: Option<Vec<u8>>,
    /// Required `aud`, when set (`--jwt-audience`).
    pub jwt_audience: Option<String>,
    /// Required `iss`, when set (`--jwt-issuer`).
    pub jwt_issuer: Option<String>,
}

/// Why a request is not authenticated: the `reason` of a 401.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuthError {
    /// `missing`, `malformed`, `wrong_algorithm`, `bad_signature`, `expired`,
    /// `wrong_audience`, `wrong_issuer`, `missing_claim`, `no_client_tokens`.
    pub reason: &'static str,
    pub message: String,
}

impl AuthError {
    fn new(reason: &'static str, message: impl Into<String>) -> AuthError {
        AuthError {
            reason,
            message: message.into(),
        }
    }
}

impl From<AuthError> for ApiError {
    fn from(e: AuthError) -> ApiError {
        ApiError::new(
            axum::http::StatusCode::UNAUTHORIZED,
            "unauthorized",
            e.message,
        )
        .with("reason", e.reason)
    }
}

/// Checks tokens; built once at startup.
pub struct Authenticator {
    admin_token: String,
}

/// Where the generated admin token is kept, inside the data directory.
pub const ADMIN_TOKEN_FILE: &str = "admin-token";

impl Authenticator {
    /// From the configuration; reads or generates `<data_dir>/admin-token` when no admin
    /// token is configured.
    pub fn new(config: &AuthConfig, data_dir: &Path) -> std::io::Result<Authenticator> {
        let admin_token = match &config.admin_token {
            Some(t) => t.clone(),
            None => stored_admin_token(data_dir)?,
        };
        if admin_token.is_empty() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "the admin token is empty (--admin-token / SLUICE_ADMIN_TOKEN)",
            ));
        }
        Ok(Authenticator { admin_token })
    }

    /// The caller a bearer token names.
    pub fn verify(&self, token: &str) -> Result<Caller, AuthError> {
        if constant_time_eq(token.as_bytes(), self.admin_token.as_bytes()) {
            return Ok(Caller::Admin);
        }
        if token.split('.').count() == 3 {
            return Err(AuthError::new(
                "no_client_tokens",
                "this server verifies no client tokens (start it with --jwt-secret or --jwt-public-key)",
            ));
        }
        Err(AuthError::new(
            "malformed",
            "the token is neither the admin token nor a JWT",
        ))
    }
}

/// Reads `<data_dir>/admin-token`, or generates it (32 random bytes, hex) with mode 0600
/// and logs it once with a ready-to-paste `curl` line.
fn stored_admin_token(data_dir: &Path) -> std::io::Result<String> {
    use std::io::{Read, Write};
    use std::os::unix::fs::OpenOptionsExt;
    let path = data_dir.join(ADMIN_TOKEN_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            tracing::info!(
                "admin token in {p}; use it as: curl -H \"Authorization: Bearer $(cat {p})\" …",
                p = path.display()
            );
            return Ok(text.trim().to_string());
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let mut random = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut random)?;
    let token: String = std::iter::once("sluice_admin_".to_string())
        .chain(random.iter().map(|b| format!("{b:02x}")))
        .collect();
    let tmp = data_dir.join(format!("{ADMIN_TOKEN_FILE}.tmp"));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    file.write_all(token.as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&tmp, &path)?;
    std::fs::File::open(data_dir)?.sync_all()?;
    tracing::info!(
        "admin token generated and stored in {} (mode 0600); try:\n  curl -H \"Authorization: Bearer {token}\" http://127.0.0.1:7070/v1/tables",
        path.display()
    );
    Ok(token)
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Paths that also take `?access_token=` (browsers cannot set headers on `EventSource` or a
/// WebSocket upgrade).
fn takes_query_token(path: &str) -> bool {
    path == "/v1/live"
        || path == "/v1/ws"
        || (path.starts_with("/v1/topics/") && path.ends_with("/watch"))
}

/// The bearer token of a request: the `Authorization` header, or on streaming paths
/// `?access_token=`.
fn bearer(req: &Request) -> Result<String, AuthError> {
    if let Some(value) = req.headers().get(axum::http::header::AUTHORIZATION) {
        let text = value
            .to_str()
            .map_err(|_| AuthError::new("malformed", "the Authorization header is not text"))?;
        let token = text.strip_prefix("Bearer ").ok_or_else(|| {
            AuthError::new(
                "malformed",
                "the Authorization header must be `Bearer <token>`",
            )
        })?;
        return Ok(token.trim().to_string());
    }
    if takes_query_token(req.uri().path()) {
        let query = axum::extract::Query::<std::collections::HashMap<String, String>>::try_from_uri(
            req.uri(),
        );
        if let Some(token) = query.ok().and_then(|q| q.0.get("access_token").cloned()) {
            return Ok(token);
        }
    }
    Err(AuthError::new(
        "missing",
        "no token: send `Authorization: Bearer <token>` (see docs/security.md)",
    ))
}

/// Middleware: every request but `GET /health` must carry a valid token; the [`Caller`] is
/// left in the request's extensions.
pub(crate) async fn authenticate(
    State(core): State<Arc<Core>>,
    mut req: Request,
    next: Next,
) -> Response {
    if req.uri().path() == "/health" {
        return next.run(req).await;
    }
    match bearer(&req).and_then(|t| core.authenticator().verify(&t)) {
        Ok(caller) => {
            req.extensions_mut().insert(caller);
            next.run(req).await
        }
        Err(e) => ApiError::from(e).into_response(),
    }
}
