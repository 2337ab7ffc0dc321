//! What this build is: its version, for `kruised version`, the metrics and the User-Agent.

/// kruised's version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
