//! containerd's own API, spoken beside CRI on the same socket, for what CRI does not offer:
//! [`content`], the ingests in flight (how far each blob of a pull has landed).
//!
//! Every call names the namespace of the CRI plugin's images ([`NAMESPACE`], in the
//! `containerd-namespace` gRPC header). A runtime that is not containerd (CRI-O) answers
//! `Unimplemented`: [`crate::cri::CriError::Unsupported`].

pub mod content;
pub(super) mod proto;
mod wire;

pub use wire::{NAMESPACE, NAMESPACE_HEADER};
