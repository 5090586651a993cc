//! agentbox's egress proxy: sandboxes whose allowlist names domains reach them through it.
//! See docs/security.md for what it trusts and what it refuses.
#![forbid(unsafe_code)]

pub mod credential;
pub mod metrics;
pub mod rules;
pub mod server;
pub mod table;
