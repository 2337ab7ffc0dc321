//! Integration tests: the double driven over real HTTP with a plain hyper
//! client, one module per group of requirements.

mod admission;
mod common;
mod control;
mod crud;
mod patch;
mod rbac;
mod selectors;
mod serving;
mod status;
mod versions;
mod watch;
