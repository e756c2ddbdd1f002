use std::fmt;
use std::str::FromStr;

/// When a commit is acknowledged, and therefore what it survives.
///
/// Ordered from weakest to strongest: `Memory < Disk < Fsync < Replicated`. `Replicated`
/// is stronger than `Fsync` against losing a machine (a quorum of JetStream nodes holds
/// the commit), not against losing power everywhere at once (see ARCHITECTURE.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Durability {
    /// Acknowledged once applied in memory; logged asynchronously. May lose the last few
    /// milliseconds on a crash.
    Memory,
    /// Acknowledged once written to the log file (OS page cache). Survives a process crash.
    Disk,
    /// Acknowledged once `fdatasync` returned. Survives power loss.
    Fsync,
    /// Acknowledged once a quorum of the cluster's replicated log (`sluice-cluster`)
    /// acknowledged it *and* the leader's own log wrote it (`disk`). Survives losing the
    /// leader's machine. Only a cluster leader takes it; the log itself treats it as `disk`.
    Replicated,
}

impl Durability {
    pub const fn as_str(self) -> &'static str {
        match self {
            Durability::Memory => "memory",
            Durability::Disk => "disk",
            Durability::Fsync => "fsync",
            Durability::Replicated => "replicated",
        }
    }
}

impl fmt::Display for Durability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Durability {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "memory" => Ok(Durability::Memory),
            "disk" => Ok(Durability::Disk),
            "fsync" => Ok(Durability::Fsync),
            "replicated" => Ok(Durability::Replicated),
            other => Err(format!(
                "unknown durability class {other:?}: expected memory, disk, fsync or replicated"
            )),
        }
    }
}
