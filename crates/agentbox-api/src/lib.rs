//! agentbox's API: what the operator and every client share. The resources (`crd`), the scope
//! labels and names that make one sandbox per scope, the exec transport and its framing, the
//! guard Lease, the remote scripts that run inside sandboxes, and the API client's connector.
//!
//! Light on purpose: a harness that depends on it (through `agentbox-client`) compiles no object
//! store, tar codec or HTTP server.
#![forbid(unsafe_code)]

pub mod crd;
pub mod exec;
pub mod files;
pub mod guard;
pub mod kinds;
pub mod kubeclient;
pub mod labels;
pub mod names;
pub mod oom;
pub mod paths;
pub mod remote;
pub mod template;
#[cfg(feature = "generators")]
pub mod vectors;

pub use kubeclient::kube_client;
