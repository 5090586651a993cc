//! agentbox: a Kubernetes operator that gives AI-agent harnesses isolated, recoverable sandboxes.
//!
//! The library holds everything; the binaries in `src/bin` are thin wrappers.
#![forbid(unsafe_code)]

pub mod crd;
pub mod labels;
