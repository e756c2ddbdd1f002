//! [`QueryError`]: why a query was refused or failed.

/// Why a query was refused or failed. Every variant's message names what was wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum QueryError {
    /// The text does not parse.
    #[error("SQL syntax error: {0}")]
    Syntax(String),
    /// It parses, but uses a construct the planner does not support; the message names it.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// Unknown or ambiguous column, wrong shape (e.g. a subquery with two columns).
    #[error("{0}")]
    Schema(String),
    /// A table the query names does not exist.
    #[error("{0}")]
    NotFound(String),
    /// Bad or missing parameters.
    #[error("{0}")]
    BadRequest(String),
    /// A named limit was exceeded.
    #[error("{0}")]
    Limit(String),
    /// The row policies a live view was planned under changed in a way it cannot follow
    /// (it reads other claims now): resubscribe.
    #[error("{0}")]
    RulesChanged(String),
}

impl QueryError {
    pub fn unsupported(what: impl Into<String>) -> Self {
        QueryError::Unsupported(what.into())
    }
}
