//! Who is calling: bearer tokens (the admin token, client JWTs) checked once per request by
//! [`authenticate`], which leaves a [`Caller`] in the request's extensions for the handlers.
//! What a caller may then read and write is decided by the rules (`crate::rules`).
//! The model is in `docs/security.md`.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, DecodingKeyKind, Validation};
use parking_lot::Mutex;
use serde_json::{Map, Value as Json};

use crate::api::ApiError;
use crate::core::Core;

impl Core {
    /// The token checker (for the binary: the admin-token notice, metrics).
    pub fn tokens(&self) -> &Authenticator {
        &self.shared.auth
    }
}

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

/// How tokens are checked (`--admin-token`, `--jwt-*`) and how many streams one client
/// subject may hold (`--max-connections-per-subject`). Its `Debug` hides the secrets.
#[derive(Clone)]
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
    /// Open WebSockets and SSE streams one client `sub` may hold
    /// (`--max-connections-per-subject`); the admin token is not limited.
    pub max_connections_per_subject: usize,
}

impl std::fmt::Debug for AuthConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hidden = |set: bool| if set { Some("<hidden>") } else { None };
        f.debug_struct("AuthConfig")
            .field("admin_token", &hidden(self.admin_token.is_some()))
            .field("jwt_secret", &hidden(self.jwt_secret.is_some()))
            .field(
                "jwt_public_key_pem",
                &self.jwt_public_key_pem.as_ref().map(|pem| pem.len()),
            )
            .field("jwt_audience", &self.jwt_audience)
            .field("jwt_issuer", &self.jwt_issuer)
            .field(
                "max_connections_per_subject",
                &self.max_connections_per_subject,
            )
            .finish()
    }
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            admin_token: None,
            jwt_secret: None,
            jwt_public_key_pem: None,
            jwt_audience: None,
            jwt_issuer: None,
            max_connections_per_subject: 64,
        }
    }
}

/// The `reason`s of a 401, in the order `/metrics` lists them.
pub const FAILURE_REASONS: [&str; 9] = [
    "missing",
    "malformed",
    "wrong_algorithm",
    "bad_signature",
    "expired",
    "wrong_audience",
    "wrong_issuer",
    "missing_claim",
    "no_client_tokens",
];

/// The per-caller limits of docs/security.md, listed in `/metrics` even before a refusal.
const LIMIT_FLAGS: [&str; 8] = [
    "--max-connections-per-subject",
    "--live-subscriptions-per-connection",
    "--ws-inflight-requests",
    "--max-body-bytes",
    "--max-ops",
    "--max-append-records",
    "--function-time-ms",
    "--function-memory-bytes",
];

/// The counted limit flag a `limit` error's message names, if any.
pub(crate) fn limit_flag(message: &str) -> Option<&'static str> {
    LIMIT_FLAGS.iter().copied().find(|f| message.contains(f))
}

/// Left on a response by a `limit` error, for the middleware to count.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LimitRefusal(pub &'static str);

/// Counters for `/metrics`.
struct AuthStats {
    /// 401s by reason, indexed as [`FAILURE_REASONS`].
    failures: [AtomicU64; FAILURE_REASONS.len()],
    /// 403s.
    forbidden: AtomicU64,
    /// Limit refusals by flag.
    limits: Mutex<BTreeMap<&'static str, u64>>,
}

/// Open client streams per subject.
#[derive(Default)]
struct Connections {
    per_subject: Mutex<HashMap<String, usize>>,
    /// All client streams open (`sluice_client_connections`).
    open: AtomicU64,
}

/// One client stream counted against its subject's limit; dropping it frees the slot.
/// The admin's guard counts nothing.
#[must_use = "the connection is counted only while the guard lives"]
pub struct ConnectionGuard {
    slot: Option<(Arc<Connections>, String)>,
}

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        if let Some((connections, sub)) = self.slot.take() {
            let mut per_subject = connections.per_subject.lock();
            if let Some(n) = per_subject.get_mut(&sub) {
                *n -= 1;
                if *n == 0 {
                    per_subject.remove(&sub);
                }
            }
            drop(per_subject);
            connections.open.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl std::fmt::Debug for ConnectionGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.slot {
            Some((_, sub)) => write!(f, "ConnectionGuard({sub:?})"),
            None => f.write_str("ConnectionGuard(admin)"),
        }
    }
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

/// A client-token configuration that cannot be used (an unreadable key, an empty secret).
#[derive(Debug, thiserror::Error)]
pub enum JwtConfigError {
    #[error("--jwt-secret is empty")]
    EmptySecret,
    #[error("give either --jwt-secret or --jwt-public-key, not both")]
    SecretAndKey,
    #[error("--jwt-public-key: the file holds a private key; give the public key (`openssl pkey -in key.pem -pubout`)")]
    PrivateKey,
    #[error("--jwt-public-key: an EC key must be on P-256 (ES256); this one is not")]
    EcCurve,
    #[error("--jwt-public-key: not a PEM public key of RSA, EC P-256 or Ed25519 ({0})")]
    Unreadable(String),
}

/// Verifies client JWTs with the one key the server has.
struct JwtVerifier {
    /// The name of the only algorithm accepted (the key's) as in a JWT header (`HS256`, `RS256`, `ES256`, `EdDSA`).
    alg_name: &'static str,
    /// The flag the key came from, for messages.
    flag: &'static str,
    key: DecodingKey,
    validation: Validation,
}

/// Clock skew allowed on `exp` and `nbf`, in seconds.
pub const LEEWAY_SECS: u64 = 5;

impl JwtVerifier {
    fn new(config: &AuthConfig) -> Result<Option<JwtVerifier>, JwtConfigError> {
        let (alg, alg_name, flag, key) = match (&config.jwt_secret, &config.jwt_public_key_pem) {
            (None, None) => return Ok(None),
            (Some(_), Some(_)) => return Err(JwtConfigError::SecretAndKey),
            (Some(secret), None) => {
                if secret.is_empty() {
                    return Err(JwtConfigError::EmptySecret);
                }
                (
                    Algorithm::HS256,
                    "HS256",
                    "--jwt-secret",
                    DecodingKey::from_secret(secret.as_bytes()),
                )
            }
            (None, Some(pem)) => {
                let (alg, name, key) = public_key(pem)?;
                (alg, name, "--jwt-public-key", key)
            }
        };
        let mut validation = Validation::new(alg);
        validation.leeway = LEEWAY_SECS;
        validation.validate_exp = true;
        validation.validate_nbf = true;
        let mut required = vec!["exp", "sub"];
        match &config.jwt_audience {
            Some(aud) => {
                validation.set_audience(&[aud]);
                required.push("aud");
            }
            None => validation.validate_aud = false,
        }
        if let Some(iss) = &config.jwt_issuer {
            validation.set_issuer(&[iss]);
            required.push("iss");
        }
        validation.set_required_spec_claims(&required);
        Ok(Some(JwtVerifier {
            alg_name,
            flag,
            key,
            validation,
        }))
    }

    /// Verifies a token whose header and claims parsed as JSON objects.
    fn verify(
        &self,
        token: &str,
        header: &Map<String, Json>,
        claims: &Map<String, Json>,
    ) -> Result<Caller, AuthError> {
        let alg = match header.get("alg") {
            Some(Json::String(alg)) => alg.as_str(),
            _ => {
                return Err(AuthError::new(
                    "malformed",
                    "the JWT header has no `alg` string",
                ))
            }
        };
        if alg != self.alg_name {
            let what = if alg.eq_ignore_ascii_case("none") {
                "an unsigned token (`alg: none`), which is never accepted".to_string()
            } else {
                format!("a token signed with {alg}")
            };
            return Err(AuthError::new(
                "wrong_algorithm",
                format!(
                    "{what}; this server accepts only {} tokens ({})",
                    self.alg_name, self.flag
                ),
            ));
        }
        let data = jsonwebtoken::decode::<Map<String, Json>>(token, &self.key, &self.validation)
            .map_err(|e| self.explain(e.into_kind(), claims))?;
        let all = data.claims;
        let sub = match all.get("sub") {
            Some(Json::String(sub)) => sub.clone(),
            _ => {
                return Err(AuthError::new(
                    "missing_claim",
                    "the token has no `sub` string",
                ))
            }
        };
        Ok(Caller::Client(Arc::new(Claims { sub, all })))
    }

    /// The 401 for a failed verification.
    fn explain(&self, kind: ErrorKind, claims: &Map<String, Json>) -> AuthError {
        let now = unix_now();
        let number = |name: &str| claims.get(name).map(|v| v.to_string()).unwrap_or_default();
        match kind {
            ErrorKind::InvalidSignature | ErrorKind::Base64(_) => AuthError::new(
                "bad_signature",
                format!(
                    "the token's signature does not verify with the server's key ({})",
                    self.flag
                ),
            ),
            ErrorKind::InvalidAlgorithm => AuthError::new(
                "wrong_algorithm",
                format!(
                    "this server accepts only {} tokens ({})",
                    self.alg_name, self.flag
                ),
            ),
            ErrorKind::ExpiredSignature => AuthError::new(
                "expired",
                format!("the token expired at {} (now {now})", number("exp")),
            ),
            ErrorKind::ImmatureSignature => AuthError::new(
                "expired",
                format!(
                    "the token is not valid before {} (now {now})",
                    number("nbf")
                ),
            ),
            ErrorKind::MissingRequiredClaim(c) if c == "aud" => self.wrong_audience(),
            ErrorKind::InvalidAudience => self.wrong_audience(),
            ErrorKind::MissingRequiredClaim(c) if c == "iss" => self.wrong_issuer(),
            ErrorKind::InvalidIssuer => self.wrong_issuer(),
            ErrorKind::MissingRequiredClaim(c) => AuthError::new(
                "missing_claim",
                format!("the token has no `{c}` claim{}", claim_kind(&c)),
            ),
            ErrorKind::InvalidClaimFormat(c) if c == "exp" => AuthError::new(
                "missing_claim",
                "the token's `exp` is not a number (seconds since the epoch)",
            ),
            other => AuthError::new("malformed", format!("the JWT does not decode: {other:?}")),
        }
    }

    fn wrong_audience(&self) -> AuthError {
        let want = self
            .validation
            .aud
            .iter()
            .flatten()
            .next()
            .cloned()
            .unwrap_or_default();
        AuthError::new(
            "wrong_audience",
            format!("the token's `aud` is not {want:?} (--jwt-audience)"),
        )
    }

    fn wrong_issuer(&self) -> AuthError {
        let want = self
            .validation
            .iss
            .iter()
            .flatten()
            .next()
            .cloned()
            .unwrap_or_default();
        AuthError::new(
            "wrong_issuer",
            format!("the token's `iss` is not {want:?} (--jwt-issuer)"),
        )
    }
}

fn claim_kind(claim: &str) -> &'static str {
    match claim {
        "sub" => " (a string)",
        "exp" => " (a number: seconds since the epoch)",
        _ => "",
    }
}

/// The key of `--jwt-public-key` and the algorithm it is for.
fn public_key(pem: &[u8]) -> Result<(Algorithm, &'static str, DecodingKey), JwtConfigError> {
    let text = String::from_utf8_lossy(pem);
    if text.contains("PRIVATE KEY-----") {
        return Err(JwtConfigError::PrivateKey);
    }
    if let Ok(key) = DecodingKey::from_rsa_pem(pem) {
        return Ok((Algorithm::RS256, "RS256", key));
    }
    if let Ok(key) = DecodingKey::from_ec_pem(pem) {
        // A P-256 point: 65 bytes uncompressed, 33 compressed.
        let p256 = matches!(key.kind(), DecodingKeyKind::SecretOrDer(point) if point.len() == 65 || point.len() == 33);
        if !p256 {
            return Err(JwtConfigError::EcCurve);
        }
        return Ok((Algorithm::ES256, "ES256", key));
    }
    match DecodingKey::from_ed_pem(pem) {
        Ok(key) => Ok((Algorithm::EdDSA, "EdDSA", key)),
        Err(e) => Err(JwtConfigError::Unreadable(format!("{:?}", e.kind()))),
    }
}

/// Checks the client-token part of a configuration (the key parses, the secret is not
/// empty) so that `sluice serve` can refuse to start naming the flag.
pub fn check_jwt_config(config: &AuthConfig) -> Result<(), JwtConfigError> {
    JwtVerifier::new(config).map(|_| ())
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The header and claims of a token shaped as a JWT (three base64url parts, the first two
/// JSON objects); `None` otherwise.
fn jwt_parts(token: &str) -> Option<(Map<String, Json>, Map<String, Json>)> {
    let mut parts = token.split('.');
    let (header, claims, _sig) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let object = |part: &str| -> Option<Map<String, Json>> {
        let bytes = B64.decode(part.trim_end_matches('=')).ok()?;
        match serde_json::from_slice(&bytes).ok()? {
            Json::Object(map) => Some(map),
            _ => None,
        }
    };
    Some((object(header)?, object(claims)?))
}

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// An HS256 token for `sub` valid for `ttl`, carrying `claims` too (`sub` and `exp` are
/// set here; `iat` too unless given). For `sluice token`, tests and benchmarks.
pub fn mint_hs256(secret: &str, sub: &str, claims: &Map<String, Json>, ttl: Duration) -> String {
    let now = unix_now();
    let mut all = claims.clone();
    all.insert("sub".into(), Json::from(sub));
    all.insert("exp".into(), Json::from(now.saturating_add(ttl.as_secs())));
    all.entry("iat").or_insert_with(|| Json::from(now));
    encode_hs256(secret, &all)
}

/// An HS256 token with exactly these claims (tests build tokens that lack `sub` or `exp`).
pub fn encode_hs256(secret: &str, claims: &Map<String, Json>) -> String {
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(Algorithm::HS256),
        claims,
        &jsonwebtoken::EncodingKey::from_secret(secret.as_bytes()),
    )
    .expect("HMAC signing cannot fail")
}

/// Checks tokens; built once at startup.
pub struct Authenticator {
    admin_token: String,
    admin_source: AdminTokenSource,
    max_connections_per_subject: usize,
    connections: Arc<Connections>,
    stats: AuthStats,
    jwt: Option<JwtVerifier>,
}

/// Where the generated admin token is kept, inside the data directory.
pub const ADMIN_TOKEN_FILE: &str = "admin-token";

impl Authenticator {
    /// From the configuration; reads or generates `<data_dir>/admin-token` when no admin
    /// token is configured.
    pub fn new(config: &AuthConfig, data_dir: &Path) -> std::io::Result<Authenticator> {
        let jwt = JwtVerifier::new(config)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?;
        let (admin_token, admin_source) = match &config.admin_token {
            Some(t) => (t.clone(), AdminTokenSource::Configured),
            None => stored_admin_token(data_dir)?,
        };
        if admin_token.is_empty() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "the admin token is empty (--admin-token / SLUICE_ADMIN_TOKEN)",
            ));
        }
        let stats = AuthStats {
            failures: Default::default(),
            forbidden: AtomicU64::new(0),
            limits: Mutex::new(LIMIT_FLAGS.iter().map(|&f| (f, 0)).collect()),
        };
        Ok(Authenticator {
            admin_token,
            admin_source,
            jwt,
            max_connections_per_subject: config.max_connections_per_subject,
            connections: Arc::default(),
            stats,
        })
    }

    /// Counts one open stream (WebSocket or SSE) of `caller` against
    /// `--max-connections-per-subject`; the admin is not limited. Hold the guard as long as
    /// the stream is open. Past the limit: 429 `limit` naming the flag.
    pub fn connect(&self, caller: &Caller) -> Result<ConnectionGuard, ApiError> {
        let Caller::Client(claims) = caller else {
            return Ok(ConnectionGuard { slot: None });
        };
        let max = self.max_connections_per_subject;
        {
            let mut per_subject = self.connections.per_subject.lock();
            let n = per_subject.entry(claims.sub.clone()).or_insert(0);
            if *n < max {
                *n += 1;
                self.connections.open.fetch_add(1, Ordering::Relaxed);
                return Ok(ConnectionGuard {
                    slot: Some((self.connections.clone(), claims.sub.clone())),
                });
            }
            if *n == 0 {
                per_subject.remove(&claims.sub);
            }
        }
        self.note_limit("--max-connections-per-subject");
        Err(ApiError::new(
            axum::http::StatusCode::TOO_MANY_REQUESTS,
            "limit",
            format!(
                "subject {:?} already has {max} open streams (WebSockets and SSE); the limit is --max-connections-per-subject {max}",
                claims.sub
            ),
        )
        .with("limit", "--max-connections-per-subject"))
    }

    /// Counts a 401 by reason (`sluice_auth_failures_total{reason}`).
    fn note_failure(&self, reason: &str) {
        if let Some(i) = FAILURE_REASONS.iter().position(|r| *r == reason) {
            self.stats.failures[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts a 403 `forbidden` (`sluice_forbidden_total`). HTTP 403 answers are counted by
    /// the middleware; call this for refusals it does not see (inside a WebSocket).
    pub fn note_forbidden(&self) {
        self.stats.forbidden.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a refusal by the limit named by `flag` (`--max-ops`, …):
    /// `sluice_limit_refusals_total{limit="max-ops"}`.
    pub fn note_limit(&self, flag: &'static str) {
        *self.stats.limits.lock().entry(flag).or_insert(0) += 1;
    }

    /// Client streams open now, all subjects.
    pub fn client_connections(&self) -> u64 {
        self.connections.open.load(Ordering::Relaxed)
    }

    /// Appends the auth series to a `/metrics` answer.
    pub(crate) fn render_metrics(&self, out: &mut String) {
        use std::fmt::Write;
        let name = "sluice_auth_failures_total";
        let _ = writeln!(
            out,
            "# HELP {name} Requests refused with 401 unauthorized, by reason.\n# TYPE {name} counter"
        );
        for (reason, n) in FAILURE_REASONS.iter().zip(&self.stats.failures) {
            let _ = writeln!(
                out,
                "{name}{{reason=\"{reason}\"}} {}",
                n.load(Ordering::Relaxed)
            );
        }
        let name = "sluice_forbidden_total";
        let _ = writeln!(
            out,
            "# HELP {name} Requests refused with 403 forbidden (rules, admin-only endpoints).\n# TYPE {name} counter\n{name} {}",
            self.stats.forbidden.load(Ordering::Relaxed)
        );
        let name = "sluice_limit_refusals_total";
        let _ = writeln!(
            out,
            "# HELP {name} Requests refused by a per-caller limit, by the limit's flag.\n# TYPE {name} counter"
        );
        for (flag, n) in self.stats.limits.lock().iter() {
            let _ = writeln!(
                out,
                "{name}{{limit=\"{}\"}} {n}",
                flag.trim_start_matches('-')
            );
        }
        let name = "sluice_client_connections";
        let _ = writeln!(
            out,
            "# HELP {name} WebSockets and SSE streams open with client tokens.\n# TYPE {name} gauge\n{name} {}",
            self.client_connections()
        );
    }

    /// Where the admin token came from.
    pub fn admin_token_source(&self) -> &AdminTokenSource {
        &self.admin_source
    }

    /// What to log at startup, once the server listens on `base_url` (`http://host:port`):
    /// a generated token is shown once in a ready-to-paste `curl` line; a stored one is
    /// referred to by its file; a configured one is not mentioned (`None`).
    pub fn admin_token_notice(&self, base_url: &str) -> Option<String> {
        match &self.admin_source {
            AdminTokenSource::Configured => None,
            AdminTokenSource::Generated(path) => Some(format!(
                "admin token generated and stored in {} (mode 0600):\n  curl -H \"Authorization: Bearer {}\" {base_url}/v1/tables",
                path.display(),
                self.admin_token
            )),
            AdminTokenSource::Stored(path) => Some(format!(
                "admin token in {p}; use it as:\n  curl -H \"Authorization: Bearer $(cat {p})\" {base_url}/v1/tables",
                p = path.display()
            )),
        }
    }

    /// The caller a bearer token names.
    pub fn verify(&self, token: &str) -> Result<Caller, AuthError> {
        if constant_time_eq(token.as_bytes(), self.admin_token.as_bytes()) {
            return Ok(Caller::Admin);
        }
        let Some((header, claims)) = jwt_parts(token) else {
            return Err(AuthError::new(
                "malformed",
                "the token is neither the admin token nor a JWT (three base64url parts, a JSON header and JSON claims)",
            ));
        };
        match &self.jwt {
            Some(jwt) => jwt.verify(token, &header, &claims),
            None => Err(AuthError::new(
                "no_client_tokens",
                "this server verifies no client tokens (start it with --jwt-secret or --jwt-public-key)",
            )),
        }
    }
}

/// Where the admin token came from; [`Authenticator::admin_token_notice`] tells the
/// operator how to use it once the listen address is known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AdminTokenSource {
    /// `--admin-token` / `SLUICE_ADMIN_TOKEN`.
    Configured,
    /// Read from this file, written by an earlier start.
    Stored(PathBuf),
    /// Generated by this start and written to this file (mode 0600).
    Generated(PathBuf),
}

/// Reads `<data_dir>/admin-token`, or generates it (32 random bytes, hex) with mode 0600.
fn stored_admin_token(data_dir: &Path) -> std::io::Result<(String, AdminTokenSource)> {
    use std::io::{Read, Write};
    use std::os::unix::fs::OpenOptionsExt;
    let path = data_dir.join(ADMIN_TOKEN_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let token = text.trim().to_string();
            if token.is_empty() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "the file is empty (delete it to generate a new admin token)",
                ));
            }
            return Ok((token, AdminTokenSource::Stored(path)));
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
    // A leftover temp file may have other permissions; `mode` applies only on creation.
    match std::fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    file.write_all(token.as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&tmp, &path)?;
    std::fs::File::open(data_dir)?.sync_all()?;
    Ok((token, AdminTokenSource::Generated(path)))
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
        // The scheme is case-insensitive (RFC 9110 §11.1).
        let token = match text.split_once(' ') {
            Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") => token.trim(),
            _ => {
                return Err(AuthError::new(
                    "malformed",
                    "the Authorization header must be `Bearer <token>`",
                ))
            }
        };
        return Ok(token.to_string());
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

/// Middleware: every request but `GET /health` and the static files
/// ([`is_public`](crate::static_files::is_public): the console, `--public DIR`) must carry a
/// valid token; the [`Caller`] is left in the request's extensions.
pub(crate) async fn authenticate(
    State(core): State<Arc<Core>>,
    mut req: Request,
    next: Next,
) -> Response {
    if req.uri().path() == "/health"
        || crate::static_files::is_public(&core, req.method(), req.uri().path())
    {
        return next.run(req).await;
    }
    let auth = core.authenticator();
    match bearer(&req).and_then(|t| auth.verify(&t)) {
        Ok(caller) => {
            req.extensions_mut().insert(caller);
            let response = next.run(req).await;
            if response.status() == axum::http::StatusCode::FORBIDDEN {
                auth.note_forbidden();
            }
            if let Some(LimitRefusal(flag)) = response.extensions().get::<LimitRefusal>() {
                auth.note_limit(flag);
            }
            response
        }
        Err(e) => {
            auth.note_failure(e.reason);
            ApiError::from(e).into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const SECRET: &str = "test-secret-of-some-length";
    const ADMIN: &str = "sluice_admin_test";

    // Generated with openssl for these tests only.
    const RSA_PRIVATE: &str = "-----BEGIN PRIVATE KEY-----\nMIIEvgIBADANBgkqhkiG9w0BAQEFAASCBKgwggSkAgEAAoIBAQC+0iNffHG0GgFP\nA0xb5gplfCl5xAXBnIC2i+V+mJVUTEd+oKMQr7pia4FyU4j9NduSNIEwvP3wrpOS\neNOabpANtsIriJ4SExiZfBIhgF0FVIp6u7r5RbRpxOYHjQCmOW8uz98ljo1z4IvX\npW1d25sohAXDfB5pEZBNj/j17F5CBsJT0zyilAB/UlH2VbY+b5alV1FHEVbEFvex\nhet+V7eo521ltWotx8ic2AQ2evnqppCdWn6bo2M6gAE0Oz6Qe84JyGwrJr22FI+y\nVEzp8C6AZwRRmq4prBPmcMPlodZTwj7it3/5WFV6AnNBz6qIcTr6hH6ujOvAxjJK\nJKE8U9+BAgMBAAECggEAAeRP9PelIfG7Dxc7h9K3SivJtnsWyoVcclLfPtrQ6jHK\naKs7iqQPXz/tG97PpiEFUQUDveG1y8/TRzm68VZEx9oGwUs8s/WsAgOMo3fkFDQz\nHkXjs+p4wC6zUCJZ/gvmOgrWDceEyAATKttpQuu1NVjfvMErhQOnUFmL0JZcFd/6\nYuA46cd2mKXc5m1hx5VDga6z33qs00oIgGNvSc0gYiNAUK9mlBOdXZNdY07IPeVi\npt9HstXPkHGfm1QJyvq/Ijip3kHhh0Imj/LymZnYhCP88fZkYfEU+wSx6pVzf6uV\n4bbyVpj7QFmfzAA2X4ndDCb/zKyrr0ACnrkUAEMyQQKBgQDtkpNISmRcxlRTAPGC\n44dHsuw7MwriZRjEOAS2G0BKIBpTqk19wyD3VaUiQgU//aS8ZI/tJVAc6V62sJ4J\nRcqeHQ9Ikcb9cnQqpKqqrN1CTe9zUBwrtgwEtj44TqkMxlZ0CiV+PjQr2wBlgWjy\n3CdL+ZqMajXKV8KnKYlbsBKkMQKBgQDNnzmJX59J2OwM1MaFH5f+/JRvJggbieVc\n+UiZqj3eT4UdsnS5G3sCDw/UyVk9jJ/m1dOA96a+SZH0WJx4j1Sm030eHUPck7wL\nk54wQW3j1H83MaBB5sj3m34evI1j86FbB4YRRsk1aK90Cw9l6wnGz0BypEphkIiq\n2c5N+62sUQKBgQDoTFR7cVJlbQBzEQ8WHwjeUNOwpx5TdOsconHo5wib8nwLpxCS\nkkQf1LzdnJSpl4iHNgWNqtiFDKQyGszM4FNY+61AFlru5AU21UCUFudat/4VURXa\nn+1shg6c3D1sYluSp4E1yfkVkNT4a+uE3UQHhA9ckVX7foi1D2ZiIu53YQKBgQDB\nXSDAXNnwmjuw/U8K1WEceu4jcAJj01OMESkCyKORsfoeqTk28e7FSuC6W/a9+MZO\nT3qsZze47nqA6+uJPFCA6ZVZgm/UuGE4CcPS4VSz0ZsojlSEZMFMiD8cLHhSLEPq\n1LJxAL4qqZ2FZPlAAL2a5j9XD8Sa505+TIDDuQ/jYQKBgHwlL1KBRmWSBRcU+jYe\nSd1CJCVa8uE8SEI7nD/Hx6xsFqiphBlQ/JXXpai3biwQ6LDq5VzBAEb2mgTUk4+e\n6lKiFBbk1xR093qWWDAz3BUlc6VIdh3xG3aX1TI1Hh5LvqabKvhfFPPpF16qEPKt\nXUgOg+8kaLSxOPuDTeUt7ZTr\n-----END PRIVATE KEY-----";
    const RSA_PUBLIC: &str = "-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEAvtIjX3xxtBoBTwNMW+YK\nZXwpecQFwZyAtovlfpiVVExHfqCjEK+6YmuBclOI/TXbkjSBMLz98K6TknjTmm6Q\nDbbCK4ieEhMYmXwSIYBdBVSKeru6+UW0acTmB40ApjlvLs/fJY6Nc+CL16VtXdub\nKIQFw3weaRGQTY/49exeQgbCU9M8opQAf1JR9lW2Pm+WpVdRRxFWxBb3sYXrfle3\nqOdtZbVqLcfInNgENnr56qaQnVp+m6NjOoABNDs+kHvOCchsKya9thSPslRM6fAu\ngGcEUZquKawT5nDD5aHWU8I+4rd/+VhVegJzQc+qiHE6+oR+rozrwMYySiShPFPf\ngQIDAQAB\n-----END PUBLIC KEY-----";
    const EC_PRIVATE: &str = "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgtFT6A74UcUg8pBEc\n1Nq97GRWSeEOtZVV+FUm8D3DOkOhRANCAATOl61WzdDKzm+Z3vFNCqoA4xCDKqIE\nGHaKsZ+zqIL4INbMzIA/fSprvllG8h4+/hk2n/S6q4I0vp4H3tz/nxGM\n-----END PRIVATE KEY-----";
    const EC_PUBLIC: &str = "-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEzpetVs3Qys5vmd7xTQqqAOMQgyqi\nBBh2irGfs6iC+CDWzMyAP30qa75ZRvIePv4ZNp/0uquCNL6eB97c/58RjA==\n-----END PUBLIC KEY-----";
    const ED_PRIVATE: &str = "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIOEwRNKyyD2xoiY/fFtioCVjuZopXhI74Y3KJZukyWVz\n-----END PRIVATE KEY-----";
    const ED_PUBLIC: &str = "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEAJDtWZwICCpHfk9qMUSkvugnI/H1fJzXUTr+LJkGHgr8=\n-----END PUBLIC KEY-----";

    fn config() -> AuthConfig {
        AuthConfig {
            admin_token: Some(ADMIN.into()),
            jwt_secret: Some(SECRET.into()),
            ..AuthConfig::default()
        }
    }

    fn auth(config: &AuthConfig) -> Authenticator {
        // The admin token is configured, so the data directory is never touched.
        Authenticator::new(config, Path::new("/nonexistent")).expect("a valid configuration")
    }

    fn obj(value: Json) -> Map<String, Json> {
        match value {
            Json::Object(map) => map,
            other => panic!("not an object: {other}"),
        }
    }

    fn now() -> i64 {
        unix_now() as i64
    }

    /// A token with this header and these claims, signed with `key` for `alg`.
    fn sign(alg: Algorithm, key: &jsonwebtoken::EncodingKey, claims: Json) -> String {
        jsonwebtoken::encode(&jsonwebtoken::Header::new(alg), &claims, key).unwrap()
    }

    fn hs(claims: Json) -> String {
        encode_hs256(SECRET, &obj(claims))
    }

    fn reason(auth: &Authenticator, token: &str) -> &'static str {
        match auth.verify(token) {
            Ok(caller) => panic!("{token} was accepted as {caller:?}"),
            Err(e) => {
                assert!(!e.message.is_empty());
                e.reason
            }
        }
    }

    fn client(auth: &Authenticator, token: &str) -> Arc<Claims> {
        match auth.verify(token) {
            Ok(Caller::Client(claims)) => claims,
            other => panic!("{token}: {other:?}"),
        }
    }

    fn b64(value: &Json) -> String {
        B64.encode(value.to_string())
    }

    #[test]
    fn the_admin_token_is_the_admin() {
        assert!(auth(&config()).verify(ADMIN).unwrap().is_admin());
    }

    #[test]
    fn the_configuration_does_not_print_its_secrets() {
        let text = format!("{:?}", config());
        assert!(!text.contains(ADMIN) && !text.contains(SECRET), "{text}");
        assert!(text.contains("<hidden>"), "{text}");
    }

    #[test]
    fn a_valid_hs256_token_carries_every_claim() {
        let a = auth(&config());
        let token = mint_hs256(
            SECRET,
            "alice",
            &obj(json!({"team": 7, "role": "editor", "orgId": "x", "tags": [1, 2]})),
            Duration::from_secs(3600),
        );
        let claims = client(&a, &token);
        assert_eq!(claims.sub, "alice");
        assert_eq!(claims.all["sub"], json!("alice"));
        assert_eq!(claims.all["team"], json!(7));
        assert_eq!(claims.all["role"], json!("editor"));
        assert_eq!(claims.all["orgId"], json!("x"));
        assert_eq!(claims.all["tags"], json!([1, 2]));
        assert!(claims.all["exp"].as_u64().unwrap() >= unix_now() + 3590);
    }

    #[test]
    fn neither_admin_nor_jwt_is_malformed() {
        let a = auth(&config());
        assert_eq!(reason(&a, "hello"), "malformed");
        assert_eq!(reason(&a, ""), "malformed");
        assert_eq!(reason(&a, "a.b.c"), "malformed");
        assert_eq!(reason(&a, "a.b.c.d"), "malformed");
        let good = hs(json!({"sub": "a", "exp": now() + 60}));
        let parts: Vec<&str> = good.split('.').collect();
        // A header that is not JSON, claims that are not an object.
        assert_eq!(
            reason(
                &a,
                &format!("{}.{}.{}", B64.encode("{not json"), parts[1], parts[2])
            ),
            "malformed"
        );
        assert_eq!(
            reason(
                &a,
                &format!("{}.{}.{}", parts[0], b64(&json!([1])), parts[2])
            ),
            "malformed"
        );
        // A header without alg.
        assert_eq!(
            reason(
                &a,
                &format!("{}.{}.{}", b64(&json!({"typ": "JWT"})), parts[1], parts[2])
            ),
            "malformed"
        );
    }

    #[test]
    fn a_jwt_without_client_keys_is_no_client_tokens() {
        let a = auth(&AuthConfig {
            admin_token: Some(ADMIN.into()),
            ..AuthConfig::default()
        });
        let token = hs(json!({"sub": "a", "exp": now() + 60}));
        assert_eq!(reason(&a, &token), "no_client_tokens");
        assert_eq!(reason(&a, "x"), "malformed");
    }

    #[test]
    fn alg_none_is_wrong_algorithm() {
        let a = auth(&config());
        let claims = json!({"sub": "alice", "exp": now() + 600});
        for alg in ["none", "None", "NONE"] {
            let token = format!(
                "{}.{}.",
                b64(&json!({"alg": alg, "typ": "JWT"})),
                b64(&claims)
            );
            assert_eq!(reason(&a, &token), "wrong_algorithm", "{alg}");
            // With a signature part copied from a real token, too.
            let real = hs(claims.clone());
            let sig = real.rsplit('.').next().unwrap();
            let token = format!("{}.{}.{sig}", b64(&json!({"alg": alg})), b64(&claims));
            assert_eq!(reason(&a, &token), "wrong_algorithm", "{alg}");
        }
    }

    #[test]
    fn another_algorithm_than_the_keys_is_wrong_algorithm() {
        let claims = json!({"sub": "alice", "exp": now() + 600});
        // HS256 server: an RS256 token, an HS512 token.
        let a = auth(&config());
        let rsa = jsonwebtoken::EncodingKey::from_rsa_pem(RSA_PRIVATE.as_bytes()).unwrap();
        assert_eq!(
            reason(&a, &sign(Algorithm::RS256, &rsa, claims.clone())),
            "wrong_algorithm"
        );
        let hs512 = jsonwebtoken::EncodingKey::from_secret(SECRET.as_bytes());
        assert_eq!(
            reason(&a, &sign(Algorithm::HS512, &hs512, claims.clone())),
            "wrong_algorithm"
        );
        // RS256 server: an HS256 token signed with the public key as the secret (the
        // classic key-confusion forgery).
        let a = auth(&AuthConfig {
            admin_token: Some(ADMIN.into()),
            jwt_public_key_pem: Some(RSA_PUBLIC.as_bytes().to_vec()),
            ..AuthConfig::default()
        });
        let confused = jsonwebtoken::EncodingKey::from_secret(RSA_PUBLIC.as_bytes());
        assert_eq!(
            reason(&a, &sign(Algorithm::HS256, &confused, claims.clone())),
            "wrong_algorithm"
        );
        assert_eq!(
            client(&a, &sign(Algorithm::RS256, &rsa, claims)).sub,
            "alice"
        );
    }

    #[test]
    fn a_forged_signature_is_bad_signature() {
        let a = auth(&config());
        let claims = json!({"sub": "alice", "exp": now() + 600});
        let other = encode_hs256("another-secret", &obj(claims.clone()));
        assert_eq!(reason(&a, &other), "bad_signature");
        // Claims changed after signing.
        let good = hs(claims);
        let parts: Vec<&str> = good.split('.').collect();
        let tampered = format!(
            "{}.{}.{}",
            parts[0],
            b64(&json!({"sub": "admin", "exp": now() + 600})),
            parts[2]
        );
        assert_eq!(reason(&a, &tampered), "bad_signature");
        // A signature that is not base64url, or empty.
        assert_eq!(
            reason(&a, &format!("{}.{}.!!!", parts[0], parts[1])),
            "bad_signature"
        );
        assert_eq!(
            reason(&a, &format!("{}.{}.", parts[0], parts[1])),
            "bad_signature"
        );
    }

    #[test]
    fn expiry_and_not_before_allow_five_seconds_of_skew() {
        let a = auth(&config());
        let expired = hs(json!({"sub": "a", "exp": now() - 60}));
        let e = a.verify(&expired).unwrap_err();
        assert_eq!(e.reason, "expired");
        assert!(e.message.contains("expired at"), "{}", e.message);
        assert_eq!(
            client(&a, &hs(json!({"sub": "a", "exp": now() - 2}))).sub,
            "a"
        );
        let early = hs(json!({"sub": "a", "exp": now() + 600, "nbf": now() + 60}));
        let e = a.verify(&early).unwrap_err();
        assert_eq!(e.reason, "expired");
        assert!(e.message.contains("not valid before"), "{}", e.message);
        assert_eq!(
            client(
                &a,
                &hs(json!({"sub": "a", "exp": now() + 600, "nbf": now() + 2}))
            )
            .sub,
            "a"
        );
    }

    #[test]
    fn sub_and_exp_are_required() {
        let a = auth(&config());
        assert_eq!(reason(&a, &hs(json!({"exp": now() + 60}))), "missing_claim");
        assert_eq!(
            reason(&a, &hs(json!({"sub": 7, "exp": now() + 60}))),
            "missing_claim"
        );
        assert_eq!(reason(&a, &hs(json!({"sub": "a"}))), "missing_claim");
        assert_eq!(
            reason(&a, &hs(json!({"sub": "a", "exp": "tomorrow"}))),
            "missing_claim"
        );
    }

    #[test]
    fn audience_and_issuer_are_checked_when_configured() {
        let a = auth(&AuthConfig {
            jwt_audience: Some("app".into()),
            jwt_issuer: Some("https://issuer".into()),
            ..config()
        });
        let exp = now() + 600;
        let ok = json!({"sub": "a", "exp": exp, "aud": "app", "iss": "https://issuer"});
        assert_eq!(client(&a, &hs(ok)).sub, "a");
        let listed =
            json!({"sub": "a", "exp": exp, "aud": ["other", "app"], "iss": "https://issuer"});
        assert_eq!(client(&a, &hs(listed)).sub, "a");
        let e = a
            .verify(&hs(
                json!({"sub": "a", "exp": exp, "aud": "other", "iss": "https://issuer"}),
            ))
            .unwrap_err();
        assert_eq!(e.reason, "wrong_audience");
        assert!(e.message.contains("--jwt-audience"), "{}", e.message);
        assert_eq!(
            reason(
                &a,
                &hs(json!({"sub": "a", "exp": exp, "iss": "https://issuer"}))
            ),
            "wrong_audience"
        );
        let e = a
            .verify(&hs(
                json!({"sub": "a", "exp": exp, "aud": "app", "iss": "evil"}),
            ))
            .unwrap_err();
        assert_eq!(e.reason, "wrong_issuer");
        assert!(e.message.contains("--jwt-issuer"), "{}", e.message);
        assert_eq!(
            reason(&a, &hs(json!({"sub": "a", "exp": exp, "aud": "app"}))),
            "wrong_issuer"
        );
        // Without --jwt-audience / --jwt-issuer any aud and iss pass.
        let a = auth(&config());
        assert_eq!(
            client(
                &a,
                &hs(json!({"sub": "a", "exp": exp, "aud": "x", "iss": "y"}))
            )
            .sub,
            "a"
        );
    }

    #[test]
    fn public_keys_choose_the_algorithm() {
        let claims = json!({"sub": "bob", "exp": now() + 600});
        let cases = [
            (
                RSA_PUBLIC,
                Algorithm::RS256,
                jsonwebtoken::EncodingKey::from_rsa_pem(RSA_PRIVATE.as_bytes()).unwrap(),
            ),
            (
                EC_PUBLIC,
                Algorithm::ES256,
                jsonwebtoken::EncodingKey::from_ec_pem(EC_PRIVATE.as_bytes()).unwrap(),
            ),
            (
                ED_PUBLIC,
                Algorithm::EdDSA,
                jsonwebtoken::EncodingKey::from_ed_pem(ED_PRIVATE.as_bytes()).unwrap(),
            ),
        ];
        for (public, alg, private) in &cases {
            let a = auth(&AuthConfig {
                admin_token: Some(ADMIN.into()),
                jwt_public_key_pem: Some(public.as_bytes().to_vec()),
                ..AuthConfig::default()
            });
            assert_eq!(
                client(&a, &sign(*alg, private, claims.clone())).sub,
                "bob",
                "{alg:?}"
            );
            // Every other key's token is refused.
            for (_, other_alg, other_private) in &cases {
                if other_alg != alg {
                    assert_eq!(
                        reason(&a, &sign(*other_alg, other_private, claims.clone())),
                        "wrong_algorithm"
                    );
                }
            }
            assert_eq!(reason(&a, &hs(claims.clone())), "wrong_algorithm");
        }
        // Same algorithm, another key: bad_signature.
        let a = auth(&AuthConfig {
            admin_token: Some(ADMIN.into()),
            jwt_public_key_pem: Some(ED_PUBLIC.as_bytes().to_vec()),
            ..AuthConfig::default()
        });
        let forged = {
            let token = sign(Algorithm::EdDSA, &cases[2].2, claims.clone());
            let (message, sig) = token.rsplit_once('.').unwrap();
            let mut bytes = B64.decode(sig).unwrap();
            bytes[0] ^= 1;
            format!("{message}.{}", B64.encode(bytes))
        };
        assert_eq!(reason(&a, &forged), "bad_signature");
    }

    #[test]
    fn unusable_client_key_configurations_are_refused() {
        let with = |secret: Option<&str>, pem: Option<&str>| {
            check_jwt_config(&AuthConfig {
                jwt_secret: secret.map(String::from),
                jwt_public_key_pem: pem.map(|p| p.as_bytes().to_vec()),
                ..AuthConfig::default()
            })
        };
        assert!(with(None, None).is_ok());
        assert!(matches!(
            with(Some(""), None),
            Err(JwtConfigError::EmptySecret)
        ));
        assert!(matches!(
            with(Some("s"), Some(RSA_PUBLIC)),
            Err(JwtConfigError::SecretAndKey)
        ));
        assert!(matches!(
            with(None, Some(RSA_PRIVATE)),
            Err(JwtConfigError::PrivateKey)
        ));
        assert!(matches!(
            with(None, Some("not a key")),
            Err(JwtConfigError::Unreadable(_))
        ));
        for e in [with(Some(""), None), with(None, Some("x"))] {
            let text = e.unwrap_err().to_string();
            assert!(text.contains("--jwt-"), "{text}");
        }
    }
}

#[cfg(test)]
mod admin_token_tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_generated_admin_token_is_stored_0600_and_reused() {
        let dir = std::env::temp_dir().join(format!("sluice-auth-admin-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let first = Authenticator::new(&AuthConfig::default(), &dir).unwrap();
        let path = dir.join(ADMIN_TOKEN_FILE);
        assert_eq!(
            first.admin_token_source(),
            &AdminTokenSource::Generated(path.clone())
        );
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let token = std::fs::read_to_string(&path).unwrap();
        assert!(
            token.starts_with("sluice_admin_") && token.len() == 13 + 64,
            "{token}"
        );
        let notice = first.admin_token_notice("http://127.0.0.1:9999").unwrap();
        assert!(
            notice.contains(&token) && notice.contains("http://127.0.0.1:9999/v1/tables"),
            "{notice}"
        );
        assert!(first.verify(&token).unwrap().is_admin());

        let second = Authenticator::new(&AuthConfig::default(), &dir).unwrap();
        assert_eq!(
            second.admin_token_source(),
            &AdminTokenSource::Stored(path.clone())
        );
        assert!(second.verify(&token).unwrap().is_admin());
        let notice = second.admin_token_notice("https://[::1]:1").unwrap();
        assert!(
            !notice.contains(&token) && notice.contains("$(cat "),
            "{notice}"
        );

        // A configured token wins and the file is not mentioned.
        let configured = Authenticator::new(
            &AuthConfig {
                admin_token: Some("mine".into()),
                ..AuthConfig::default()
            },
            &dir,
        )
        .unwrap();
        assert!(configured.admin_token_notice("http://x").is_none());
        assert!(configured.verify("mine").unwrap().is_admin());
        assert_eq!(configured.verify(&token).unwrap_err().reason, "malformed");

        // An empty stored file is refused rather than accepting an empty token.
        std::fs::write(&path, "\n").unwrap();
        assert!(Authenticator::new(&AuthConfig::default(), &dir).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[cfg(test)]
mod limit_tests {
    use super::*;
    use serde_json::json;

    fn client(sub: &str) -> Caller {
        let mut all = Map::new();
        all.insert("sub".into(), json!(sub));
        Caller::Client(Arc::new(Claims {
            sub: sub.into(),
            all,
        }))
    }

    fn metrics(auth: &Authenticator) -> String {
        let mut out = String::new();
        auth.render_metrics(&mut out);
        out
    }

    #[test]
    fn each_subject_gets_its_own_connection_limit_and_the_admin_none() {
        let auth = Authenticator::new(
            &AuthConfig {
                admin_token: Some("admin".into()),
                max_connections_per_subject: 2,
                ..AuthConfig::default()
            },
            Path::new("/nonexistent"),
        )
        .unwrap();
        let alice = client("alice");
        let a1 = auth.connect(&alice).unwrap();
        let a2 = auth.connect(&alice).unwrap();
        let e = auth.connect(&alice).unwrap_err();
        assert_eq!(e.status, axum::http::StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(e.code, "limit");
        assert!(
            e.message.contains("--max-connections-per-subject 2"),
            "{}",
            e.message
        );
        // Another subject is not affected; the admin is never limited nor counted.
        let b1 = auth.connect(&client("bob")).unwrap();
        let admins: Vec<_> = (0..10)
            .map(|_| auth.connect(&Caller::Admin).unwrap())
            .collect();
        assert_eq!(auth.client_connections(), 3);
        let text = metrics(&auth);
        assert!(text.contains("sluice_client_connections 3"), "{text}");
        assert!(
            text.contains("sluice_limit_refusals_total{limit=\"max-connections-per-subject\"} 1"),
            "{text}"
        );
        // Closing one frees one slot.
        drop(a1);
        let a3 = auth.connect(&alice).unwrap();
        assert!(auth.connect(&alice).is_err());
        drop((a2, a3, b1, admins));
        assert_eq!(auth.client_connections(), 0);
        assert!(auth.connections.per_subject.lock().is_empty());
        assert!(metrics(&auth)
            .contains("sluice_limit_refusals_total{limit=\"max-connections-per-subject\"} 2"));
    }

    #[test]
    fn failures_forbidden_and_limits_are_counted() {
        let auth = Authenticator::new(
            &AuthConfig {
                admin_token: Some("admin".into()),
                ..AuthConfig::default()
            },
            Path::new("/nonexistent"),
        )
        .unwrap();
        let text = metrics(&auth);
        for reason in FAILURE_REASONS {
            assert!(
                text.contains(&format!(
                    "sluice_auth_failures_total{{reason=\"{reason}\"}} 0"
                )),
                "{text}"
            );
        }
        auth.note_failure("expired");
        auth.note_failure("expired");
        auth.note_forbidden();
        auth.note_limit("--max-ops");
        auth.note_limit("--some-new-flag");
        let text = metrics(&auth);
        assert!(
            text.contains("sluice_auth_failures_total{reason=\"expired\"} 2"),
            "{text}"
        );
        assert!(text.contains("sluice_forbidden_total 1"), "{text}");
        assert!(
            text.contains("sluice_limit_refusals_total{limit=\"max-ops\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("sluice_limit_refusals_total{limit=\"some-new-flag\"} 1"),
            "{text}"
        );
        assert!(text.contains("sluice_client_connections 0"), "{text}");
    }
}
