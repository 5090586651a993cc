//! The Rust client of agentbox and its command line.
//!
//! [`client`] is what a Rust harness uses: sandboxes per scope, exec, sessions, files, guards
//! and snapshots. [`cli`] is the `agentbox` command (also `kubectl agentbox`); the binaries in
//! `src/bin` are thin wrappers.
#![forbid(unsafe_code)]

pub mod cli;
pub mod client;

/// The API layer this client speaks, re-exported for harnesses that name its types.
pub use agentbox_api as api;
pub use agentbox_api::kube_client;
