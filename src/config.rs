//! Operator configuration: flags with environment fallbacks, validated once at start-up.

use std::net::SocketAddr;
use std::path::{Component, Path};

use clap::Parser;

/// Where each sandbox's workspace lives on its node, by default.
pub const DEFAULT_NODE_ROOT: &str = "/var/lib/agentbox/workspaces";

/// Where the kubelet keeps the pods' pids cgroups (cgroup v1, cgroupfs driver), by default.
pub const DEFAULT_PIDS_CGROUP_ROOT: &str = "/sys/fs/cgroup/pids/kubepods";

/// The Helm value behind each flag (by its environment variable), for docs/operations.md's
/// flag table (`cargo run --bin opsdoc`); a test checks that every flag has one.
pub const HELM_VALUES: &[(&str, &str)] = &[
    ("AGENTBOX_NODE_ROOT", "`nodeRoot`"),
    ("AGENTBOX_ALLOWED_HOST_PREFIXES", "`allowedHostPrefixes`"),
    ("AGENTBOX_NAMESPACE", "`watchNamespace`"),
    (
        "AGENTBOX_HELPER_IMAGE",
        "`helperImage` (default: the operator image)",
    ),
    (
        "AGENTBOX_HELPER_IMAGE_PULL_POLICY",
        "`helperImagePullPolicy` (default: `image.pullPolicy`)",
    ),
    ("AGENTBOX_HELPER_NAMESPACE", "the release namespace"),
    ("AGENTBOX_RUN_AS_NON_ROOT", "`sandboxDefaults.runAsNonRoot`"),
    (
        "AGENTBOX_DEFAULT_RUN_AS_USER",
        "`sandboxDefaults.runAsUser`",
    ),
    ("AGENTBOX_DEFAULT_RUNTIME_CLASS", "`defaultRuntimeClass`"),
    ("AGENTBOX_PROCESS_LIMIT", "`processLimit`"),
    ("AGENTBOX_PIDS_CGROUP_ROOT", "`pidsCgroupRoot`"),
    ("AGENTBOX_DEFAULT_EGRESS", "`network.defaultEgress`"),
    ("AGENTBOX_NETWORK_ENFORCEMENT", "`network.enforcement`"),
    ("AGENTBOX_NETWORK_CHECK_NAMESPACE", "the release namespace"),
    ("AGENTBOX_NETWORK_CHECK_IMAGE", "`network.checkImage`"),
    (
        "AGENTBOX_NETWORK_CHECK_INTERVAL_SECONDS",
        "`network.checkIntervalSeconds`",
    ),
    (
        "AGENTBOX_ALLOWED_CAPABILITIES",
        "`sandboxDefaults.allowedCapabilities`",
    ),
    ("AGENTBOX_NODE_LOSS_GRACE_SECONDS", "`nodeLossGraceSeconds`"),
    ("AGENTBOX_STALL_GRACE_SECONDS", "`stallGraceSeconds`"),
    ("AGENTBOX_SWEEP_INTERVAL_SECONDS", "`sweepIntervalSeconds`"),
    (
        "AGENTBOX_PERMANENT_RETRY_SECONDS",
        "`permanentRetrySeconds`",
    ),
    ("AGENTBOX_STREAM_STALL_SECONDS", "`streamStallSeconds`"),
    ("AGENTBOX_RECONCILE_CONCURRENCY", "`reconcileConcurrency`"),
    (
        "AGENTBOX_METRICS_ADDR",
        "`metrics.bindAddress`, `metrics.port`",
    ),
    ("AGENTBOX_LOG_JSON", "`logging.json`"),
    ("AGENTBOX_LEADER_ELECTION", "`leaderElection.enabled`"),
    (
        "AGENTBOX_LEADER_ELECTION_NAMESPACE",
        "`leaderElection.namespace` (default: the release namespace)",
    ),
    (
        "AGENTBOX_LEADER_ELECTION_NAME",
        "`leaderElection.leaseName`",
    ),
    ("AGENTBOX_LEASE_SECONDS", "`leaderElection.leaseSeconds`"),
    ("AGENTBOX_IDENTITY", "the pod name"),
    ("AGENTBOX_STORE_URL", "`store.url` (default empty)"),
    ("AGENTBOX_STORE_PREFIX", "`store.prefix`"),
    ("AGENTBOX_S3_ENDPOINT", "`store.s3.endpoint`"),
    ("AGENTBOX_S3_REGION", "`store.s3.region`"),
    ("AGENTBOX_S3_PATH_STYLE", "`store.s3.pathStyle`"),
    ("AGENTBOX_S3_ALLOW_HTTP", "`store.s3.allowHttp`"),
    ("AGENTBOX_S3_SIGN_PAYLOAD", "`store.s3.signPayload`"),
    (
        "AGENTBOX_RESTORE_MAX_INPUT_BYTES",
        "`restoreLimits.maxInputBytes`",
    ),
    (
        "AGENTBOX_RESTORE_MAX_EXTRACTED_BYTES",
        "`restoreLimits.maxExtractedBytes`",
    ),
    ("AGENTBOX_RESTORE_MAX_MEMBERS", "`restoreLimits.maxMembers`"),
    (
        "AGENTBOX_RESTORE_MAX_EXPANSION_RATIO",
        "`restoreLimits.maxExpansionRatio`",
    ),
    ("AGENTBOX_WORKSPACE_SIZE_LIMIT", "`workspace.sizeLimit`"),
    (
        "AGENTBOX_WORKSPACE_QUOTA_FALLBACK",
        "`workspace.quotaFallback`",
    ),
    (
        "AGENTBOX_WORKSPACE_USAGE_INTERVAL_SECONDS",
        "`workspace.usageIntervalSeconds`",
    ),
    (
        "AGENTBOX_EGRESS_PROXY_URL",
        "`egressProxy.url` (default: the chart's proxy Service, by `egressProxy.service.clusterIP` when set; unset with `egressProxy.enabled` off)",
    ),
    (
        "AGENTBOX_EGRESS_PROXY_NAMESPACE",
        "the release namespace (with `egressProxy.enabled`)",
    ),
    (
        "AGENTBOX_EGRESS_PROXY_SELECTOR",
        "the chart's proxy pods (with `egressProxy.enabled`)",
    ),
    ("AGENTBOX_EGRESS_PROXY_PORT", "`egressProxy.port`"),
];

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

    /// Trusted image with `/usr/local/bin/agentbox-helper` (the operator's own image carries
    /// it) for the short-lived pods that do the operator's work on nodes: removing a deleted
    /// sandbox's workspace, closing and checking a namespace's workspace directory, handing a
    /// workspace to a non-root sandbox. Never a sandbox's image. Empty: none, and the operator
    /// says so (conditions and Events) instead of doing that work.
    #[arg(long, env = "AGENTBOX_HELPER_IMAGE", default_value = "")]
    pub helper_image: String,

    /// Pull policy of the helper image (Always, IfNotPresent, Never).
    #[arg(long, env = "AGENTBOX_HELPER_IMAGE_PULL_POLICY", default_value = "IfNotPresent", value_parser = ["Always", "IfNotPresent", "Never"])]
    pub helper_image_pull_policy: String,

    /// Namespace for the workspace sweep's helper pods when a workspace's own namespace takes no
    /// new pods (it is being deleted, or gone): the operator's own namespace, where no harness
    /// may exec. Without it, the directories of a deleted namespace's sandboxes stay on their
    /// nodes (the sweep says so in a Warning Event and its log) until removed by hand.
    #[arg(long, env = "AGENTBOX_HELPER_NAMESPACE", default_value = "")]
    pub helper_namespace: String,

    /// Run sandboxes that do not set `securityContext.runAsNonRoot` as non-root.
    #[arg(long, env = "AGENTBOX_RUN_AS_NON_ROOT", default_value_t = false, action = clap::ArgAction::Set)]
    pub run_as_non_root: bool,

    /// The uid (and gid) of a non-root sandbox that sets no `runAsUser`.
    #[arg(long, env = "AGENTBOX_DEFAULT_RUN_AS_USER", default_value_t = 65532, value_parser = clap::value_parser!(i64).range(1..=2147483647))]
    pub default_run_as_user: i64,

    /// RuntimeClass of the pods of sandboxes (cold, from a template, and a pool's warm pods)
    /// whose spec names none, for example `gvisor`. Empty: those pods name none and run under
    /// the node's default runtime. A namespace can require one runtime class with the
    /// annotation `agentbox.dev/required-runtime-class`.
    #[arg(long, env = "AGENTBOX_DEFAULT_RUNTIME_CLASS", default_value = "")]
    pub default_runtime_class: String,

    /// The process limit of sandboxes whose spec (or template) sets no `processLimit`: the most
    /// processes and threads a sandbox's pod may have at once. 0: none (the kubelet's
    /// `podPidsLimit` alone, if the node has one). Set by the trusted helper (`--helper-image`)
    /// as each sandbox pod's first init container; without a helper image no limit is set and
    /// the sandbox's `ProcessLimited` condition says so.
    #[arg(long, env = "AGENTBOX_PROCESS_LIMIT", default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=4194304))]
    pub process_limit: u32,

    /// The host directory holding the pods' pids cgroups: `<this>/burstable/pod<uid>` is a
    /// sandbox pod's (its init containers make every sandbox pod Burstable). The kubelet's
    /// layout with the cgroupfs driver under its `cgroupRoot` (`/` by default); cgroup v2:
    /// `/sys/fs/cgroup/kubepods`. The systemd cgroup driver names pods' cgroups otherwise and
    /// is not supported: the pod does not start and its sandbox says why.
    #[arg(long, env = "AGENTBOX_PIDS_CGROUP_ROOT", default_value = DEFAULT_PIDS_CGROUP_ROOT)]
    pub pids_cgroup_root: String,

    /// The workspace size limit of sandboxes whose spec (or template) sets no
    /// `workspace.sizeLimit`, a quantity such as `10Gi`. Empty: none. Enforced by the trusted
    /// helper (`--helper-image`): a btrfs quota group where the node's workspace root is btrfs
    /// with quotas enabled, else as `--workspace-quota-fallback` says.
    #[arg(long, env = "AGENTBOX_WORKSPACE_SIZE_LIMIT", default_value = "", value_parser = parse_size_limit)]
    pub workspace_size_limit: String,

    /// What a sandbox with a workspace size limit gets on a node whose workspace root has no
    /// quotas: `measure` (its workspace is measured every `--workspace-usage-interval-seconds`
    /// and the sandbox suspended once it holds more) or `refuse` (its pod does not start).
    #[arg(long, env = "AGENTBOX_WORKSPACE_QUOTA_FALLBACK", default_value = "measure", value_parser = ["measure", "refuse"])]
    pub workspace_quota_fallback: String,

    /// Seconds between two measurements of a limited workspace (the sidecar
    /// `workspace-usage`).
    #[arg(long, env = "AGENTBOX_WORKSPACE_USAGE_INTERVAL_SECONDS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=86400))]
    pub workspace_usage_interval_seconds: u64,
    /// Egress of sandboxes and templates whose spec sets no `network.egress`: `None` (nothing
    /// reachable, the default) or `All`.
    #[arg(long, env = "AGENTBOX_DEFAULT_EGRESS", default_value = "None", value_parser = ["None", "All"])]
    pub default_egress: String,

    /// How the operator knows that NetworkPolicy is enforced on a node before it calls a
    /// sandbox that relies on it (egress `None` or `Allowlist`) Ready: `Probe` (the default)
    /// proves it per node and runtime class with a canary pod under a deny-all egress policy
    /// that must fail to reach a listener pod it can otherwise reach, when the node is first
    /// used and again every `--network-check-interval-seconds`; `Attested`: the administrator
    /// states that the cluster's network plugin enforces NetworkPolicy on every node, and no
    /// canary runs.
    #[arg(long, env = "AGENTBOX_NETWORK_ENFORCEMENT", default_value = "Probe", value_parser = ["Probe", "Attested"])]
    pub network_enforcement: String,

    /// Namespace of the enforcement check's pods and policy: the operator's own, where no
    /// tenant may create pods, exec or make policies (a tenant who can could sway the check).
    /// Empty: the namespace of the leader-election Lease (`--leader-election-namespace`, else
    /// `--namespace`, else `default`).
    #[arg(long, env = "AGENTBOX_NETWORK_CHECK_NAMESPACE", default_value = "")]
    pub network_check_namespace: String,

    /// Image of the enforcement check's pods: it needs `sh`, `mkdir`, `httpd` and `nc`
    /// (busybox has them).
    #[arg(
        long,
        env = "AGENTBOX_NETWORK_CHECK_IMAGE",
        default_value = "docker.io/library/busybox:1.37"
    )]
    pub network_check_image: String,

    /// The egress proxy's URL as sandboxes reach it, for example
    /// `http://agentbox-proxy.agentbox-system.svc:3128` (the chart's proxy Service; a Service's
    /// DNS name is replaced by its ClusterIP, read at start, as allowlisted sandboxes have no
    /// DNS). Set, a
    /// sandbox whose egress is not `All` gets `HTTP_PROXY`, `HTTPS_PROXY` (and lower-case)
    /// pointing here and `NO_PROXY=localhost,127.0.0.1,::1`, and the `domain` entries of an
    /// allowlist admit the proxy's pods in the sandbox's NetworkPolicy. Empty (the default):
    /// no proxy, and `domain` entries reach nothing.
    #[arg(long, env = "AGENTBOX_EGRESS_PROXY_URL", default_value = "")]
    pub egress_proxy_url: String,

    /// Namespace of the egress proxy's pods (the operator's own in the chart).
    #[arg(long, env = "AGENTBOX_EGRESS_PROXY_NAMESPACE", default_value = "")]
    pub egress_proxy_namespace: String,

    /// Labels selecting the egress proxy's pods in its namespace (`key=value`, comma
    /// separated): the sandboxes' NetworkPolicy admits them, and the operator writes the
    /// proxy's table (which pod IP is which sandbox, and its allowlist) into each of them.
    #[arg(
        long,
        env = "AGENTBOX_EGRESS_PROXY_SELECTOR",
        default_value = "app.kubernetes.io/name=agentbox-proxy"
    )]
    pub egress_proxy_selector: String,

    /// The TCP port of the egress proxy's pods (the container port, which a NetworkPolicy
    /// names: a Service in front may map another).
    #[arg(long, env = "AGENTBOX_EGRESS_PROXY_PORT", default_value_t = 3128, value_parser = clap::value_parser!(u16).range(1..))]
    pub egress_proxy_port: u16,

    /// `--egress-proxy-selector` parsed (by [`Config::validated`]).
    #[arg(skip)]
    pub egress_proxy_labels: std::collections::BTreeMap<String, String>,

    /// Seconds between two enforcement checks of a node in use (the first runs when a node is
    /// first used).
    #[arg(long, env = "AGENTBOX_NETWORK_CHECK_INTERVAL_SECONDS", default_value_t = 300, value_parser = clap::value_parser!(u64).range(10..=86400))]
    pub network_check_interval_seconds: u64,

    /// Capabilities a Sandbox may add to the default set (`securityContext.capabilities.add`),
    /// comma separated, without `CAP_`. Empty: none.
    #[arg(long, env = "AGENTBOX_ALLOWED_CAPABILITIES", value_delimiter = ',')]
    pub allowed_capabilities: Vec<String>,

    /// Node-loss grace in seconds: how long the node holding a sandbox's workspace may stay
    /// not ready (its Ready condition not True, or the node.kubernetes.io/unreachable or
    /// not-ready taint on it, measured from their own timestamps) before the operator gives the
    /// workspace up, force-deletes the pod and starts the sandbox on another node from its
    /// newest snapshot. Short enough to recover soon, long enough that a kubelet restart or a
    /// network blip does not cost the work done since the last snapshot.
    #[arg(long, env = "AGENTBOX_NODE_LOSS_GRACE_SECONDS", default_value_t = 300)]
    pub node_loss_grace_seconds: u64,

    /// Stall grace in seconds: how long a sandbox's pod may wait with an image that cannot be
    /// pulled (`ErrImagePull`, `ImagePullBackOff`, `InvalidImageName`, `ErrImageNeverPull`), a
    /// container configuration that names something missing (`CreateContainerConfigError`) or
    /// no node to take it (`Unschedulable`) before the sandbox says `Stalled` with that reason
    /// and every client's wait for Ready ends with it. The pod stays and keeps trying: the
    /// condition clears if it starts after all.
    #[arg(long, env = "AGENTBOX_STALL_GRACE_SECONDS", default_value_t = 20)]
    pub stall_grace_seconds: u64,

    /// Seconds between passes of the workspace sweep, which removes workspace directories
    /// whose Sandbox is gone (a deletion leaves its directory to the sweep and the sweep removes
    /// it at once; a pass, also at the leader's start, catches what an operator that stopped
    /// in between left). Each pass runs one short helper pod per serving node and namespace.
    #[arg(long, env = "AGENTBOX_SWEEP_INTERVAL_SECONDS", default_value_t = 600)]
    pub sweep_interval_seconds: u64,

    /// Seconds between retries of a sandbox or snapshot whose failure only a change can fix (a
    /// refused spec or restore, a missing node root): it is reconciled again at once when it or
    /// what it names changes, and otherwise polled this often (with up to 50% jitter).
    #[arg(long, env = "AGENTBOX_PERMANENT_RETRY_SECONDS", default_value_t = 300)]
    pub permanent_retry_seconds: u64,

    /// Progress deadline in seconds on every stream between the operator and a sandbox (the
    /// snapshot's `tar -c`, the restore's `tar -x`): when no byte moves for this long the
    /// stream fails (reason `StreamStalled`), whatever its overall timeout, and the scope's
    /// guard is released. Code in a sandbox can stop its own `tar`; this bounds how long it
    /// can keep the scope's guard that way.
    #[arg(long, env = "AGENTBOX_STREAM_STALL_SECONDS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub stream_stall_seconds: u64,

    /// How many Sandboxes are reconciled at once by the sandbox controller's queue (a new
    /// Sandbox's first start from its watch event has a bound of its own, 16). A leader that
    /// starts with thousands of Sandboxes reconciles them this many at a time instead of all at
    /// once, which bounds its memory at start-up; a reconcile that waits (a snapshot before a
    /// suspension, a restore) holds one of them while it does.
    #[arg(long, env = "AGENTBOX_RECONCILE_CONCURRENCY", default_value_t = 32, value_parser = clap::value_parser!(u16).range(1..))]
    pub reconcile_concurrency: u16,

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

    /// Object store for snapshots: `file:///dir`, `s3://bucket`, `gs://bucket` or
    /// `az://container`. Empty: no snapshots (nothing is taken or restored). Credentials come
    /// from the operator's environment (for S3 `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`).
    #[arg(long, env = "AGENTBOX_STORE_URL", default_value = crate::snapshot::store::DEFAULT_STORE_URL)]
    pub store_url: String,

    /// Key prefix under which snapshots are stored: `<prefix>/<namespace>/<scope-key>/<uid>.tar`.
    #[arg(long, env = "AGENTBOX_STORE_PREFIX", default_value = "agentbox")]
    pub store_prefix: String,

    /// S3 endpoint, for S3-compatible servers (empty: AWS).
    #[arg(long, env = "AGENTBOX_S3_ENDPOINT", default_value = "")]
    pub s3_endpoint: String,

    /// S3 region.
    #[arg(long, env = "AGENTBOX_S3_REGION", default_value = "us-east-1")]
    pub s3_region: String,

    /// Path-style S3 requests (`endpoint/bucket/key`, most S3-compatible servers) instead of
    /// virtual-hosted ones (`bucket.endpoint/key`).
    #[arg(long, env = "AGENTBOX_S3_PATH_STYLE", default_value_t = false, action = clap::ArgAction::Set)]
    pub s3_path_style: bool,

    /// Allow plain HTTP to the S3 endpoint.
    #[arg(long, env = "AGENTBOX_S3_ALLOW_HTTP", default_value_t = false, action = clap::ArgAction::Set)]
    pub s3_allow_http: bool,

    /// Sign each S3 request's body (SigV4 signed payload). Off by default: the archive's
    /// SHA-256 is recorded in the snapshot's status and checked on every restore, so signing
    /// adds a second hash pass over every byte, on both ends, for no integrity the restore does
    /// not already check. Turn it on for a server that refuses `UNSIGNED-PAYLOAD`.
    #[arg(long, env = "AGENTBOX_S3_SIGN_PAYLOAD", default_value_t = false, action = clap::ArgAction::Set)]
    pub s3_sign_payload: bool,

    /// Restore: largest snapshot archive in bytes (0: no limit). The restore limits also
    /// bound snapshots: one that could not be restored fails instead of becoming Ready.
    #[arg(long, env = "AGENTBOX_RESTORE_MAX_INPUT_BYTES", default_value_t = 1u64 << 30)]
    pub restore_max_input_bytes: u64,

    /// Restore: largest total size of the files in an archive (0: no limit).
    #[arg(long, env = "AGENTBOX_RESTORE_MAX_EXTRACTED_BYTES", default_value_t = 4u64 << 30)]
    pub restore_max_extracted_bytes: u64,

    /// Restore: most members in an archive (0: no limit).
    #[arg(long, env = "AGENTBOX_RESTORE_MAX_MEMBERS", default_value_t = 100_000)]
    pub restore_max_members: u64,

    /// Restore: largest ratio of extracted bytes to archive bytes (0: no limit).
    #[arg(
        long,
        env = "AGENTBOX_RESTORE_MAX_EXPANSION_RATIO",
        default_value_t = 100
    )]
    pub restore_max_expansion_ratio: u64,
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
    /// An allowed capability is not a capability name.
    #[error("allowed capability {0:?} is not a capability name (like NET_RAW, without CAP_)")]
    NotACapability(String),
    /// The default runtime class is not a Kubernetes object name.
    #[error(
        "default runtime class {0:?} is not a RuntimeClass name (lowercase letters, digits, '-' and '.')"
    )]
    NotARuntimeClass(String),
    /// The egress proxy settings cannot work.
    #[error("egress proxy: {0}")]
    EgressProxy(String),
}

/// Parses `--workspace-size-limit`: empty, or a quantity of at least 1Mi.
fn parse_size_limit(s: &str) -> Result<String, String> {
    if s.is_empty() {
        return Ok(String::new());
    }
    let bytes = agentbox_api::crd::size_limit_bytes(s)?;
    if bytes < agentbox_api::crd::MIN_SIZE_LIMIT {
        return Err(format!("{s:?} is less than 1Mi"));
    }
    Ok(s.to_string())
}

impl Config {
    /// The egress proxy, when one is configured (`--egress-proxy-url`).
    pub fn egress_proxy(&self) -> Option<crate::controller::proxy::EgressProxy<'_>> {
        let url = self.egress_proxy_url.trim();
        if url.is_empty() {
            return None;
        }
        Some(crate::controller::proxy::EgressProxy {
            url,
            namespace: self.egress_proxy_namespace.trim(),
            selector: &self.egress_proxy_labels,
            port: self.egress_proxy_port,
        })
    }

    /// The workspace size limits (`--workspace-size-limit`, `--workspace-quota-fallback`,
    /// `--workspace-usage-interval-seconds`).
    pub fn size_limits(&self) -> crate::controller::sizelimit::SizeLimits {
        use agentbox_helper::quota::Fallback;
        crate::controller::sizelimit::SizeLimits {
            default: agentbox_api::crd::size_limit_bytes(&self.workspace_size_limit).ok(),
            fallback: Fallback::parse(&self.workspace_quota_fallback).unwrap_or(Fallback::Measure),
            interval_secs: self.workspace_usage_interval_seconds,
        }
    }

    /// The egress of sandboxes and templates that set none (`--default-egress`).
    pub fn default_egress(&self) -> agentbox_api::crd::Egress {
        match self.default_egress.as_str() {
            "All" => agentbox_api::crd::Egress::All,
            _ => agentbox_api::crd::Egress::Denied,
        }
    }

    /// Checks paths and normalises prefixes (trailing slashes removed).
    pub fn validated(mut self) -> Result<Self, ConfigError> {
        self.node_root = clean_absolute("node root", &self.node_root)?;
        self.pids_cgroup_root = clean_absolute("pids cgroup root", &self.pids_cgroup_root)?;
        self.allowed_host_prefixes = self
            .allowed_host_prefixes
            .iter()
            .filter(|p| !p.trim().is_empty())
            .map(|p| clean_absolute("allowed host prefix", p.trim()))
            .collect::<Result<_, _>>()?;
        self.allowed_capabilities = self
            .allowed_capabilities
            .iter()
            .map(|c| c.trim())
            .filter(|c| !c.is_empty())
            .map(|c| {
                let name = c.strip_prefix("CAP_").unwrap_or(c).to_ascii_uppercase();
                agentbox_api::names::is_capability_name(&name)
                    .then_some(name)
                    .ok_or_else(|| ConfigError::NotACapability(c.to_string()))
            })
            .collect::<Result<_, _>>()?;
        self.default_runtime_class = self.default_runtime_class.trim().to_string();
        if !self.default_runtime_class.is_empty()
            && !agentbox_api::names::is_object_name(&self.default_runtime_class)
        {
            return Err(ConfigError::NotARuntimeClass(
                self.default_runtime_class.clone(),
            ));
        }
        if !self.egress_proxy_url.trim().is_empty() {
            let url = self.egress_proxy_url.trim();
            if !url.starts_with("http://") || url.contains(char::is_whitespace) || url.contains(',')
            {
                return Err(ConfigError::EgressProxy(format!(
                    "--egress-proxy-url {url:?} must be an http:// URL (the proxy speaks plain HTTP to sandboxes)"
                )));
            }
            if self.egress_proxy_namespace.trim().is_empty() {
                return Err(ConfigError::EgressProxy(
                    "--egress-proxy-namespace is needed with --egress-proxy-url".into(),
                ));
            }
            self.egress_proxy_labels =
                crate::controller::proxy::parse_selector(&self.egress_proxy_selector)
                    .map_err(ConfigError::EgressProxy)?;
        }
        if self.identity.is_empty() {
            let host = std::env::var("HOSTNAME")
                .or_else(|_| std::fs::read_to_string("/etc/hostname").map(|s| s.trim().to_string()))
                .unwrap_or_else(|_| "agentbox".to_string());
            self.identity = format!("{host}-{}", std::process::id());
        }
        Ok(self)
    }

    /// The snapshot store settings; `None` when snapshots are off (empty URL).
    pub fn store(&self) -> Option<crate::snapshot::store::StoreConfig> {
        (!self.store_url.trim().is_empty()).then(|| crate::snapshot::store::StoreConfig {
            url: self.store_url.trim().to_string(),
            prefix: self.store_prefix.clone(),
            s3_endpoint: self.s3_endpoint.clone(),
            s3_region: self.s3_region.clone(),
            s3_path_style: self.s3_path_style,
            s3_allow_http: self.s3_allow_http,
            s3_sign_payload: self.s3_sign_payload,
        })
    }

    /// The progress deadline of streams between the operator and a sandbox.
    pub fn stream_stall(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.stream_stall_seconds)
    }

    /// The limits every restored archive, and every archive taken, is checked against.
    pub fn restore_limits(&self) -> crate::snapshot::archive::Limits {
        crate::snapshot::archive::Limits {
            max_input_bytes: self.restore_max_input_bytes,
            max_extracted_bytes: self.restore_max_extracted_bytes,
            max_members: self.restore_max_members,
            max_expansion_ratio: self.restore_max_expansion_ratio,
        }
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
    fn the_default_runtime_class_is_a_runtime_class_name_or_none() {
        let parse = |v: &str| {
            let flag = format!("--default-runtime-class={v}");
            Config::parse_from(["agentbox-operator", flag.as_str()]).validated()
        };
        assert_eq!(parse(" gvisor ").unwrap().default_runtime_class, "gvisor");
        assert_eq!(parse("").unwrap().default_runtime_class, "");
        let none = Config::parse_from(["agentbox-operator"])
            .validated()
            .unwrap();
        assert_eq!(none.default_runtime_class, "");
        for bad in ["Gvisor", "a/b", "-x", "runsc_ptrace"] {
            assert!(
                matches!(parse(bad), Err(ConfigError::NotARuntimeClass(_))),
                "{bad:?}"
            );
        }
    }

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
        // A start that cannot go on is told within the 30 s a harness may wait for it.
        assert_eq!(c.stall_grace_seconds, 20);
        let short = Config::parse_from(["agentbox-operator", "--stall-grace-seconds", "5"]);
        assert_eq!(short.stall_grace_seconds, 5);
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
        assert!(c.helper_image.is_empty() && !c.run_as_non_root);
        assert_eq!(c.default_run_as_user, 65532);
        assert_eq!(c.lease_namespace(), "team-a");
        assert_eq!(
            c.store().map(|s| s.url),
            Some(crate::snapshot::store::DEFAULT_STORE_URL.to_string())
        );
        assert_eq!(
            c.restore_limits(),
            crate::snapshot::archive::Limits::default()
        );
        let c = Config::parse_from([
            "agentbox-operator",
            "--store-url",
            "s3://snaps",
            "--s3-endpoint",
            "http://127.0.0.1:9000",
            "--s3-path-style",
            "true",
            "--restore-max-members",
            "10",
        ])
        .validated()
        .unwrap();
        let s = c.store().unwrap();
        assert!(s.s3_path_style && !s.s3_allow_http);
        assert!(!s.s3_sign_payload, "payloads are unsigned unless asked");
        let signed = Config::parse_from(["agentbox-operator", "--s3-sign-payload", "true"]);
        assert!(signed.store().unwrap().s3_sign_payload);
        assert_eq!(s.s3_endpoint, "http://127.0.0.1:9000");
        assert_eq!(c.restore_limits().max_members, 10);
        let off = Config::parse_from(["agentbox-operator", "--store-url", ""]);
        assert!(off.store().is_none());
        let caps = Config::parse_from([
            "agentbox-operator",
            "--allowed-capabilities",
            "net_raw, CAP_SYS_PTRACE,",
        ])
        .validated()
        .unwrap();
        assert_eq!(caps.allowed_capabilities, vec!["NET_RAW", "SYS_PTRACE"]);
        let bad = Config::parse_from(["agentbox-operator", "--allowed-capabilities", "NET RAW"]);
        assert!(bad.validated().is_err());
        assert!(
            Config::try_parse_from(["agentbox-operator", "--default-run-as-user", "0"]).is_err()
        );
    }
}
