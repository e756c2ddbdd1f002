use std::fmt;

/// The machine-readable class of a refused transaction; clients switch on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorCode {
    /// `if_version` did not match.
    Conflict,
    NotFound,
    AlreadyExists,
    /// Unknown column, wrong type, missing required value (an unknown table is `NotFound`).
    Schema,
    BadRequest,
    /// A named limit was exceeded.
    Limit,
}

impl ErrorCode {
    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorCode::Conflict => "conflict",
            ErrorCode::NotFound => "not_found",
            ErrorCode::AlreadyExists => "already_exists",
            ErrorCode::Schema => "schema",
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::Limit => "limit",
        }
    }
}

/// A transaction (or one of its ops) was refused. Nothing it did is kept.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct TxError {
    pub code: ErrorCode,
    pub message: String,
    /// Index of the op that failed, for multi-op transactions.
    pub op: Option<usize>,
}

impl TxError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        TxError {
            code,
            message: message.into(),
            op: None,
        }
    }
    pub fn schema(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Schema, message)
    }
    pub fn at_op(mut self, op: usize) -> Self {
        self.op = Some(op);
        self
    }
}

impl fmt::Display for TxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.op {
            Some(op) => write!(f, "{} (op {op}): {}", self.code.as_str(), self.message),
            None => write!(f, "{}: {}", self.code.as_str(), self.message),
        }
    }
}
