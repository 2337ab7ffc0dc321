//! kruised: the node side of OpenKruise in-place updates and image pre-pulling.
//!
//! `main.rs` parses the command line and starts telemetry; everything else starts here.

pub mod addr;
pub mod admin;
pub mod backoff;
pub mod build_info;
pub mod cmd;
pub mod config;
pub mod controller;
pub mod cri;
pub mod daemon;
pub mod gojson;
pub mod hash;
pub mod health;
pub mod k8s;
pub mod metrics;
pub mod sdnotify;
pub mod sync;
pub mod telemetry;
pub mod yaml;

pub use cmd::{Cli, Command, run};
