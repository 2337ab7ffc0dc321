//! What this build is: its version, for `kruised version`, the metrics and the User-Agent, and
//! the commit it was built from (`build.rs`: `unknown` outside a git checkout).

/// kruised's version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The commit this binary was built from: 40 hex digits (with `-dirty` when built by
/// `scripts/build-image.sh` from a tree with uncommitted changes), or `unknown`.
pub const COMMIT: &str = env!("KRUISED_COMMIT");
