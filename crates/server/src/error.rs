//! [`CoreError`]: why the core refused or could not finish a request.
//!
//! The core (recovery, the writer, confirmations, snapshots) speaks only this type; each
//! transport maps it to its wire form — HTTP status and JSON body in `api`, an `error`
//! message in the WebSocket protocol, a final event on a live stream. Transports depend on
//! the core, never the reverse.

use sluice_engine::TxError;
use sluice_functions::FunctionError;
use sluice_log::LogError;
use sluice_query::QueryError;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CoreError {
    /// A transaction was refused by the engine (conflict, not found, schema, limit, …).
    #[error(transparent)]
    Tx(#[from] TxError),
    /// A function failed to compile, threw, or hit its time or memory limit.
    #[error(transparent)]
    Function(#[from] FunctionError),
    /// A query or live subscription was refused.
    #[error(transparent)]
    Query(#[from] QueryError),
    /// A request crossed a limit of the core; the message names the flag.
    #[error("{0}")]
    Limit(String),
    /// The core stopped taking requests (graceful shutdown, or the writer is gone).
    #[error("the server is shutting down")]
    ShuttingDown,
    /// A log write or sync failed; nothing more can be promised until a restart.
    #[error(
        "the log is poisoned after a failed write or sync ({0}); writes are refused until restart"
    )]
    Poisoned(String),
    /// The core cannot take this request now; try again.
    #[error("{0}")]
    Busy(String),
    /// A topic read or watch asked for records older than the oldest kept.
    #[error("offset {from} is older than the oldest record kept; read again from offset {first}")]
    Horizon { from: u64, first: u64 },
    /// A watcher fell too far behind and was cut off; it may resume from `next`.
    #[error("this watcher fell {queue_max} records behind (watch_queue_records, --watch-queue-records) and was cut off; resume from offset {next}")]
    Lagging { next: u64, queue_max: usize },
    /// A rule refused the caller (`docs/security.md`): nothing changed.
    #[error("{message}")]
    Forbidden {
        message: String,
        /// The failing op of a mutate.
        op: Option<usize>,
        /// `select`, `insert`, `update`, `delete`, or what else was refused (`call`, `append`, …).
        command: &'static str,
        /// The table (or topic, function) it was about.
        target: String,
        /// The policies tried.
        policies: Vec<String>,
    },
    /// One statement of a `POST /v1/sql` script failed (nothing of the script is kept).
    #[error("statement {statement}: {error}")]
    Statement {
        statement: usize,
        error: Box<CoreError>,
    },
    /// An I/O failure that is not a poisoning (e.g. writing a snapshot file).
    #[error("{0}")]
    Internal(String),
    /// This node is a cluster follower (or a deposed leader): writes go to the leader.
    #[error("this node is not the cluster's leader; send writes to {}", leader.as_deref().unwrap_or("the leader (not known yet: retry)"))]
    NotLeader {
        /// The leader's client address, when known.
        leader: Option<String>,
    },
    /// The cluster's replicated log did not take a commit (unreachable, or this node was
    /// fenced by a newer leader); the commit's outcome is not known to this node.
    #[error("replication failed: {0}")]
    Replication(String),
}

impl From<LogError> for CoreError {
    fn from(e: LogError) -> Self {
        CoreError::from_log(&e)
    }
}

impl CoreError {
    pub fn from_log(e: &LogError) -> Self {
        match e {
            LogError::Poisoned(reason) => CoreError::Poisoned(reason.clone()),
            LogError::Closed => CoreError::ShuttingDown,
            other => CoreError::Internal(other.to_string()),
        }
    }

    /// A refusal decided on the state of the database (as opposed to the server's own
    /// condition): it must wait for that state to be confirmed before the client sees it.
    pub(crate) fn read_state(&self) -> bool {
        if let CoreError::Statement { error, .. } = self {
            return error.read_state();
        }
        matches!(
            self,
            CoreError::Tx(_)
                | CoreError::Forbidden { .. }
                | CoreError::Function(_)
                | CoreError::Limit(_)
                | CoreError::Horizon { .. }
        )
    }
}

/// A reply from the writer: the result, and for a refusal the seq of the state it was
/// decided on (see `Core::settle`).
pub(crate) type WriterResult<T> = Result<T, Refusal>;

/// A request the writer refused, with the seq of the applied state it read.
#[derive(Debug)]
pub(crate) struct Refusal {
    pub error: CoreError,
    /// The applied seq when the refusal was decided; 0 when it read no state.
    pub read_seq: u64,
}

impl Refusal {
    /// A refusal that does not depend on the database's state (shutdown, poisoning).
    pub fn now(error: CoreError) -> Self {
        Refusal { error, read_seq: 0 }
    }
}
