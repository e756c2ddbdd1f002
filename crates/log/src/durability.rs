use std::fmt;
use std::str::FromStr;

/// When a commit is acknowledged, and therefore what it survives.
///
/// Ordered from weakest to strongest: `Memory < Disk < Fsync`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Durability {
    /// Acknowledged once applied in memory; logged asynchronously. May lose the last few
    /// milliseconds on a crash.
    Memory,
    /// Acknowledged once written to the log file (OS page cache). Survives a process crash.
    Disk,
    /// Acknowledged once `fdatasync` returned. Survives power loss.
    Fsync,
}

impl Durability {
    pub const fn as_str(self) -> &'static str {
        match self {
            Durability::Memory => "memory",
            Durability::Disk => "disk",
            Durability::Fsync => "fsync",
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
            other => Err(format!(
                "unknown durability class {other:?}: expected memory, disk or fsync"
            )),
        }
    }
}
