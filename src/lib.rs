//! agentbox-operator: the controllers that reconcile Sandboxes, SandboxSnapshots, templates and
//! pools, the snapshot store and archive, metrics and the HTTP server.
//!
//! The binaries in `src/bin` are thin wrappers. What the operator shares with clients lives in
//! `agentbox-api`.
#![forbid(unsafe_code)]

pub mod config;
pub mod controller;
pub mod headroom;
pub mod metrics;
pub mod operator;
pub mod progress;
pub mod server;
pub mod snapshot;
#[cfg(test)]
mod test_support;
