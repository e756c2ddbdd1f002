use std::path::PathBuf;

/// Errors of the log and snapshot files.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LogError {
    #[error("i/o error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A frame before the tail failed its checks: the file is damaged. Never skipped.
    #[error("corrupt frame in {path} at byte offset {offset}: {reason}")]
    Corrupt {
        path: PathBuf,
        offset: u64,
        reason: String,
    },
    /// An earlier write or sync failed; nothing can be promised any more until restart.
    #[error(
        "the log is poisoned after a failed write or sync ({0}); writes are refused until restart"
    )]
    Poisoned(String),
    #[error("frame payload of {len} bytes exceeds frame_payload_bytes_max ({max})")]
    FrameTooLarge { len: usize, max: usize },
    #[error("the log is shut down")]
    Closed,
}

impl LogError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        LogError::Io {
            path: path.into(),
            source,
        }
    }
}
