//! Operator configuration: flags with environment fallbacks, validated once at start-up.

use std::net::SocketAddr;
use std::path::{Component, Path};

use clap::Parser;

/// Where each sandbox's workspace lives on its node, by default.
pub const DEFAULT_NODE_ROOT: &str = "/var/lib/agentbox/workspaces";

/// Configuration of the agentbox operator.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "agentbox-operator",
    version,
    about = "Kubernetes operator for agent sandboxes"
)]
pub struct Config {
    /// Host directory under which workspaces are created: `<nodeRoot>/<namespace>/<sandbox-uid>`.
    #[arg(long, env = "AGENTBOX_NODE_ROOT", default_value = DEFAULT_NODE_ROOT)]
    pub node_root: String,

    /// Host path prefixes that sandboxes may bind-mount (comma separated). Empty: no host mounts.
    #[arg(long, env = "AGENTBOX_ALLOWED_HOST_PREFIXES", value_delimiter = ',')]
    pub allowed_host_prefixes: Vec<String>,

    /// Namespace to watch. Empty: all namespaces.
    #[arg(long, env = "AGENTBOX_NAMESPACE", default_value = "")]
    pub namespace: String,

    /// Image for the short-lived pod that removes a deleted sandbox's workspace from its node.
    /// Empty: the sandbox's own image, which is already on that node.
    #[arg(long, env = "AGENTBOX_HELPER_IMAGE", default_value = "")]
    pub helper_image: String,

    /// Address of the metrics and health endpoints.
    #[arg(long, env = "AGENTBOX_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    pub metrics_addr: SocketAddr,

    /// Log as JSON lines instead of text.
    #[arg(long, env = "AGENTBOX_LOG_JSON", default_value_t = false)]
    pub log_json: bool,

    /// Take part in leader election; only the leader reconciles.
    #[arg(long, env = "AGENTBOX_LEADER_ELECTION", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_election: bool,

    /// Namespace of the leader-election Lease. Default: the watched namespace, else `default`.
    #[arg(long, env = "AGENTBOX_LEADER_ELECTION_NAMESPACE", default_value = "")]
    pub leader_election_namespace: String,

    /// Name of the leader-election Lease.
    #[arg(
        long,
        env = "AGENTBOX_LEADER_ELECTION_NAME",
        default_value = "agentbox-operator-leader"
    )]
    pub leader_election_name: String,

    /// Leader lease duration in seconds; a new leader takes over this long after the old one
    /// stops renewing.
    #[arg(long, env = "AGENTBOX_LEASE_SECONDS", default_value_t = 15)]
    pub lease_seconds: u32,

    /// Identity in leader election and Events. Default: hostname and process id.
    #[arg(long, env = "AGENTBOX_IDENTITY", default_value = "")]
    pub identity: String,
}

/// A configuration value that cannot work.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The node root or a host prefix is not a clean absolute path.
    #[error("{what} must be a clean absolute path (no '.', '..' or empty segments), got {value:?}")]
    NotCleanAbsolute {
        /// Which setting.
        what: &'static str,
        /// The rejected value.
        value: String,
    },
}

impl Config {
    /// Checks paths and normalises prefixes (trailing slashes removed).
    pub fn validated(mut self) -> Result<Self, ConfigError> {
        self.node_root = clean_absolute("node root", &self.node_root)?;
        self.allowed_host_prefixes = self
            .allowed_host_prefixes
            .iter()
            .filter(|p| !p.trim().is_empty())
            .map(|p| clean_absolute("allowed host prefix", p.trim()))
            .collect::<Result<_, _>>()?;
        if self.identity.is_empty() {
            let host = std::env::var("HOSTNAME")
                .or_else(|_| std::fs::read_to_string("/etc/hostname").map(|s| s.trim().to_string()))
                .unwrap_or_else(|_| "agentbox".to_string());
            self.identity = format!("{host}-{}", std::process::id());
        }
        Ok(self)
    }

    /// Namespace of the leader-election Lease.
    pub fn lease_namespace(&self) -> &str {
        match (
            self.leader_election_namespace.as_str(),
            self.namespace.as_str(),
        ) {
            ("", "") => "default",
            ("", ns) => ns,
            (ns, _) => ns,
        }
    }
}

/// `value` with trailing slashes removed, if it is absolute and has no `.`/`..`/empty segments.
pub fn clean_absolute(what: &'static str, value: &str) -> Result<String, ConfigError> {
    let trimmed = value.trim_end_matches('/');
    let err = || ConfigError::NotCleanAbsolute {
        what,
        value: value.to_string(),
    };
    if !trimmed.starts_with('/') || trimmed.contains("//") {
        return Err(err());
    }
    let clean = Path::new(trimmed)
        .components()
        .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
        && !trimmed.split('/').skip(1).any(|s| s == "." || s == "..");
    if clean {
        Ok(trimmed.to_string())
    } else {
        Err(err())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_absolute_paths() {
        assert_eq!(clean_absolute("x", "/srv/data/").unwrap(), "/srv/data");
        assert_eq!(clean_absolute("x", "/srv").unwrap(), "/srv");
        for bad in ["srv", "/srv/../etc", "/srv/./x", "/srv//x", "", "/"] {
            assert!(clean_absolute("x", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn defaults_parse_and_validate() {
        let c = Config::parse_from(["agentbox-operator"])
            .validated()
            .unwrap();
        assert_eq!(c.node_root, DEFAULT_NODE_ROOT);
        assert!(c.allowed_host_prefixes.is_empty());
        assert!(c.leader_election);
        assert_eq!(c.lease_namespace(), "default");
        assert!(!c.identity.is_empty());
        let c = Config::parse_from([
            "agentbox-operator",
            "--allowed-host-prefixes",
            "/srv/shared/,/data",
            "--namespace",
            "team-a",
        ])
        .validated()
        .unwrap();
        assert_eq!(c.allowed_host_prefixes, vec!["/srv/shared", "/data"]);
        assert_eq!(c.lease_namespace(), "team-a");
    }
}
