//! What the inspection commands (`explain`, `hash`) share: their output format.

/// Output format of the inspection commands.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    /// A table.
    #[default]
    Table,
    /// JSON.
    Json,
}
