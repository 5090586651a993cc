//! agentbox: a Kubernetes operator that gives AI-agent harnesses isolated, recoverable sandboxes.
//!
//! The library holds everything; the binaries in `src/bin` are thin wrappers.
#![forbid(unsafe_code)]

pub mod cli;
pub mod client;
pub mod config;
pub mod controller;
pub mod crd;
pub mod exec;
pub mod guard;
pub mod kubeclient;
pub mod labels;
pub mod metrics;
pub mod names;
pub mod operator;
pub mod paths;
pub mod progress;
pub mod remote;
pub mod server;
pub mod snapshot;
pub mod template;
pub mod vectors;

pub use kubeclient::kube_client;
