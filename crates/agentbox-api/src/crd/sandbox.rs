//! The `Sandbox` resource: one isolated execution environment backed by one Pod.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{EnvVar, ResourceRequirements, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// Desired state of a Sandbox.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "agentbox.dev",
    version = "v1alpha1",
    kind = "Sandbox",
    namespaced,
    shortname = "sbx",
    category = "agentbox",
    doc = "A Sandbox is one isolated environment for an AI agent's commands: a pod running `spec.image`, whose workspace is a directory on its node that outlives the pod, initialised from `spec.workspace` and restored from snapshots. Harnesses run commands in it through pods/exec and serialise their work with a Lease per isolation scope (`spec.scope`). `kubectl wait --for=condition=Ready sandbox/<name>` waits until it accepts commands.",
    status = "SandboxStatus",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Scope","type":"string","jsonPath":".spec.scope.kind"}"#,
    printcolumn = r#"{"name":"Mode","type":"string","jsonPath":".spec.lifecycle.mode"}"#,
    printcolumn = r#"{"name":"Node","type":"string","jsonPath":".status.nodeName"}"#,
    printcolumn = r#"{"name":"Start","type":"string","description":"Start branch of the last workspace initialisation (A reattached, B recovered, C restored, D fresh)","jsonPath":".status.workspace.lastStartBranch"}"#,
    printcolumn = r#"{"name":"Snapshot","type":"date","description":"When the newest Ready snapshot of this sandbox was taken","jsonPath":".status.lastSnapshot.completedAt"}"#,
    printcolumn = r#"{"name":"Last-Snapshot","type":"string","priority":1,"description":"Name of the newest Ready snapshot of this sandbox","jsonPath":".status.lastSnapshot.name"}"#,
    printcolumn = r#"{"name":"Template","type":"string","priority":1,"description":"The SandboxTemplate the sandbox is made from","jsonPath":".spec.templateRef.name"}"#,
    printcolumn = r#"{"name":"Pod","type":"string","priority":1,"jsonPath":".status.podName"}"#,
    printcolumn = r#"{"name":"Used","type":"integer","format":"int64","priority":1,"description":"Bytes the workspace holds, as last measured (with workspace.sizeLimit)","jsonPath":".status.workspace.usedBytes"}"#,
    printcolumn = r#"{"name":"Limit","type":"string","priority":1,"description":"The workspace's size limit (workspace.sizeLimit)","jsonPath":".spec.workspace.sizeLimit"}"#,
    printcolumn = r#"{"name":"Runtime","type":"string","priority":1,"description":"RuntimeClass the sandbox's pod runs under (empty: the node's default runtime)","jsonPath":".status.runtimeClassName"}"#,
    printcolumn = r#"{"name":"Idle-Since","type":"date","priority":1,"description":"Since when the sandbox has been idle (Ready, its scope's guard free), with lifecycle.idleTimeout","jsonPath":".status.idleSince"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","description":"Reason of the Ready condition","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name":"Message","type":"string","priority":1,"description":"Message of the Ready condition","jsonPath":".status.conditions[?(@.type==\"Ready\")].message"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[x_kube(
    validation = kube::core::Rule::new("has(self.templateRef) || has(self.image)").message("image is required unless templateRef names a SandboxTemplate"),
    validation = crate::crd::fixed_by_template("image"),
    validation = crate::crd::fixed_by_template("imagePullPolicy"),
    validation = crate::crd::fixed_by_template("command"),
    validation = crate::crd::fixed_by_template("args"),
    validation = crate::crd::fixed_by_template("resources"),
    validation = crate::crd::fixed_by_template("processLimit"),
    validation = crate::crd::fixed_by_template("runtimeClassName"),
    validation = crate::crd::fixed_by_template("nodeSelector"),
    validation = crate::crd::fixed_by_template("tolerations"),
    validation = crate::crd::fixed_by_template("securityContext"),
    validation = crate::crd::fixed_by_template("ports"),
    validation = crate::crd::fixed_by_template("workspace.projections"),
    validation = crate::crd::fixed_by_template("workspace.sizeLimit"),
    validation = kube::core::Rule::new("!has(self.templateRef) || !has(self.network) || ((!has(self.network.egress) || self.network.egress == 'All') && (!has(self.network.allow) || size(self.network.allow) == 0))").message("network comes from the template: a Sandbox with templateRef cannot set it"),
    validation = kube::core::Rule::new("has(self.templateRef) == has(oldSelf.templateRef)").message("templateRef cannot be added or removed; create a new Sandbox"),
)]
#[serde(rename_all = "camelCase")]
pub struct SandboxSpec {
    /// The SandboxTemplate (same namespace) that supplies this sandbox's pod-shaping fields.
    /// With it, the Sandbox may set only: `scope`; `workspace.root`, `workspace.files`
    /// (added to the template's; a file of the same path replaces the template's) and
    /// `workspace.mounts`; `env` (appended to the template's; a variable of the same name
    /// replaces the template's); `snapshot` (a policy other than the default replaces the
    /// template's whole policy); `lifecycle` (`mode` and `shutdownTime` are the sandbox's
    /// own; `idleTimeout`, when set, replaces the template's). Setting `image`,
    /// `imagePullPolicy`, `command`, `args`, `resources`, `processLimit`, `runtimeClassName`, `nodeSelector`,
    /// `tolerations`, `securityContext`, `ports`, `network`, `workspace.projections` or
    /// `workspace.sizeLimit` is
    /// refused at admission (except `network.egress: All`, the old clients' default, which is
    /// accepted and has no effect: the template's egress applies). The template is read when the sandbox's pod is made, and
    /// `status.template` records which version was used: a later edit of the template does
    /// not replace a running pod; it applies from the sandbox's next start. A missing template
    /// keeps the sandbox Pending (reason `TemplateNotFound`) until it appears. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = kube::core::Rule::new("self == oldSelf").message("templateRef is immutable; create a new Sandbox for another template"))]
    pub template_ref: Option<TemplateRef>,

    /// The pod-shaping fields (image, command, env, resources, scheduling, security,
    /// network, ports), in the spec itself.
    #[serde(flatten)]
    pub pod: PodShape,

    /// Isolation scope of the sandbox. It decides the scope key that labels, guards and
    /// snapshot lineage hang off. Immutable.
    #[x_kube(validation = kube::core::Rule::new("self == oldSelf").message("scope is immutable; create a new Sandbox for another scope"))]
    pub scope: Scope,

    /// The workspace directory: where it is mounted and what is written into it.
    #[serde(default)]
    pub workspace: WorkspaceSpec,

    /// How the workspace is restored from and saved to snapshots.
    #[serde(default)]
    pub snapshot: SnapshotPolicy,

    /// Whether the sandbox runs, and when it ends.
    #[serde(default)]
    pub lifecycle: Lifecycle,
}

/// The pod-shaping part of a sandbox: what a Sandbox sets itself, or a SandboxTemplate sets for
/// the Sandboxes that name it (flattened into both specs).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PodShape {
    /// Container image the sandbox runs. It needs `sh`; `tar` and `sha256sum` are needed for
    /// snapshots and file transfer. Required in a SandboxTemplate, and in a Sandbox unless it
    /// names a template (`templateRef`), whose image it then runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub image: Option<String>,

    /// Image pull policy of the sandbox container (Always, IfNotPresent, Never). Defaults to
    /// the Kubernetes default for the image's tag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<ImagePullPolicy>,

    /// Entrypoint of the sandbox container. Defaults to a shell loop that keeps the container
    /// alive, since the harness drives the sandbox through exec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub command: Option<Vec<String>>,

    /// Arguments to the entrypoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub args: Option<Vec<String>>,

    /// Environment variables of the sandbox container. A value taken from a ConfigMap or
    /// Secret key (`valueFrom`) needs the label `agentbox.dev/sandbox-readable: "true"` on
    /// that object, as `workspace.files` sources do. Names are unique, of at most 256
    /// characters. A Sandbox that names a template may set env: it is appended to the
    /// template's, and a variable of the same name replaces the template's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256), transform = bound_env_names)]
    #[x_kube(validation = crate::crd::unique_by("name", "env names"))]
    pub env: Vec<EnvVar>,

    /// CPU and memory requests and limits of the sandbox container. A process limit is not
    /// one of them (Kubernetes has no `pids` container resource: `limits.pids` and
    /// `requests.pids` are refused here); set `processLimit`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(
        validation = kube::core::Rule::new("!has(self.limits) || !('pids' in self.limits)").message("resources.limits.pids is not a container resource: set processLimit (the most processes and threads the sandbox's pod may have at once)"),
        validation = kube::core::Rule::new("!has(self.requests) || !('pids' in self.requests)").message("resources.requests.pids is not a container resource: set processLimit (the most processes and threads the sandbox's pod may have at once)"),
    )]
    pub resources: Option<ResourceRequirements>,

    /// The most processes and threads the sandbox's pod may have at once (its pids cgroup's
    /// `pids.max`): a fork bomb in the sandbox stops there instead of exhausting its node's
    /// process ids. Unset: the operator's `--process-limit` (Helm `processLimit`, 1024 by
    /// default). Set by agentbox's trusted helper as the pod's first init container, before any
    /// of the sandbox's code runs, and never above the kubelet's `podPidsLimit` for the node;
    /// the condition `ProcessLimited` says what was set. Under gVisor the limit counts the
    /// runtime's own threads too. A pod whose limit cannot be set does not start (condition
    /// `ProcessLimited` False, reason `NotEnforced`, and a Warning Event).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 16, max = 4194304))]
    pub process_limit: Option<u32>,

    /// RuntimeClass of the sandbox pod, for stronger isolation (for example gVisor or Kata): a
    /// second kernel boundary between the sandbox's code and the node. Unset: the operator's
    /// `--default-runtime-class`, else the node's default runtime. Must name a RuntimeClass of
    /// the cluster: one that does not exist holds the sandbox Pending with Ready False and
    /// `Stalled`, reason RuntimeClassNotFound. In a namespace annotated
    /// `agentbox.dev/required-runtime-class`, any other class (or none) is refused: Failed,
    /// reason RuntimeClassRequired.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = crate::crd::object_name())]
    pub runtime_class_name: Option<String>,

    /// Node labels the sandbox pod must match when it is first scheduled. Once the workspace
    /// exists the pod stays pinned to that node.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,

    /// Tolerations of the sandbox pod.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub tolerations: Vec<Toleration>,

    /// The few security settings a sandbox may override. Privilege escalation and privileged
    /// mode are never allowed; capabilities beyond the default set only where the operator's
    /// allowlist has them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_context: Option<SandboxSecurityContext>,

    /// Network policy of the sandbox pod: what it may reach (`egress`), by default nothing.
    #[serde(default, skip_serializing_if = "Network::is_default")]
    pub network: Network,

    /// Ports of the sandbox to expose. With any, the operator keeps a Service that selects only
    /// this sandbox's pod and lists exactly these ports, and records in `status.endpoints`
    /// where each is reached; without, there is no Service. Names are unique, and so are
    /// port numbers per protocol.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    #[x_kube(validation = crate::crd::unique_by("name", "port names"), validation = unique_port_numbers())]
    pub ports: Vec<SandboxPort>,
}

/// A port of the sandbox, exposed through the sandbox's Service.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxPort {
    /// Name of the port: lower-case letters, digits and '-', starting with a letter, at most
    /// 15 characters. Unique within the sandbox.
    #[schemars(
        length(min = 1, max = 15),
        regex(pattern = r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub name: String,
    /// Port number a server listens on inside the sandbox; the Service exposes the same number.
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
    /// Transport protocol: TCP (default), UDP or SCTP.
    #[serde(default)]
    pub protocol: PortProtocol,
}

/// Transport protocol of an exposed port.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema,
)]
pub enum PortProtocol {
    /// TCP.
    #[default]
    #[serde(rename = "TCP")]
    Tcp,
    /// UDP.
    #[serde(rename = "UDP")]
    Udp,
    /// SCTP.
    #[serde(rename = "SCTP")]
    Sctp,
}

impl PortProtocol {
    /// The value Kubernetes expects in a Service port.
    pub fn as_str(self) -> &'static str {
        match self {
            PortProtocol::Tcp => "TCP",
            PortProtocol::Udp => "UDP",
            PortProtocol::Sctp => "SCTP",
        }
    }
}

/// Admission rule on `spec.ports`: one port number per protocol (a Service refuses two). The
/// message is fixed: a message expression printing the number costs more than the API server
/// allows.
pub fn unique_port_numbers() -> kube::core::Rule {
    kube::core::Rule::new(
        "self.all(p, self.exists_one(q, q.port == p.port && q.protocol == p.protocol))",
    )
    .message("port numbers must be unique per protocol: two ports use the same number and protocol")
}

/// Bounds the names in `spec.env` (Kubernetes' EnvVar schema has no maxLength) so that the API
/// server can bound the cost of the uniqueness rule on the list: without a bound it refuses the
/// CRD.
pub(crate) fn bound_env_names(schema: &mut schemars::Schema) {
    if let Some(name) = schema
        .get_mut("items")
        .and_then(|items| items.get_mut("properties"))
        .and_then(|props| props.get_mut("name"))
        .and_then(|name| name.as_object_mut())
    {
        name.insert("maxLength".into(), 256.into());
    }
}

/// Image pull policy.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
pub enum ImagePullPolicy {
    /// Always pull the image.
    Always,
    /// Pull only when the image is not on the node.
    IfNotPresent,
    /// Never pull; the image must be on the node.
    Never,
}

impl ImagePullPolicy {
    /// The value Kubernetes expects in a container spec.
    pub fn as_str(self) -> &'static str {
        match self {
            ImagePullPolicy::Always => "Always",
            ImagePullPolicy::IfNotPresent => "IfNotPresent",
            ImagePullPolicy::Never => "Never",
        }
    }
}

/// Security settings a sandbox may choose.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[x_kube(
    validation = kube::core::Rule::new("!(has(self.runAsNonRoot) && self.runAsNonRoot && has(self.runAsUser) && self.runAsUser == 0)").message("runAsNonRoot cannot be combined with runAsUser 0"),
)]
#[serde(rename_all = "camelCase")]
pub struct SandboxSecurityContext {
    /// UID the sandbox processes run as. A non-zero uid makes the sandbox non-root: the
    /// operator's helper hands the workspace directory to this uid before the sandbox starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 2147483647))]
    pub run_as_user: Option<i64>,
    /// GID the sandbox processes run as. Default for a non-root sandbox: its uid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 2147483647))]
    pub run_as_group: Option<i64>,
    /// Run as a non-root user. Default: the operator's setting (`--run-as-non-root`, Helm
    /// `sandboxDefaults.runAsNonRoot`). Without `runAsUser` the sandbox then runs as the
    /// operator's default uid (`--default-run-as-user`, 65532).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_as_non_root: Option<bool>,
    /// Mount the container's root filesystem read-only (the workspace stays writable).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only_root_filesystem: Option<bool>,
    /// Changes to the sandbox container's capabilities. The container drops every capability
    /// and gets back a short default set (CHOWN, DAC_OVERRIDE, FOWNER, KILL, NET_BIND_SERVICE,
    /// SETGID, SETUID); `drop` removes some of those, `add` adds others, each of which must be
    /// in the operator's allowlist (`--allowed-capabilities`, empty by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capabilities: Option<SandboxCapabilities>,
}

/// Capabilities to add to or drop from the sandbox container's default set.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxCapabilities {
    /// Capabilities to add (names as in Kubernetes, without `CAP_`, e.g. `NET_RAW`). Each must
    /// be in the operator's allowlist.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 16),
        inner(length(min = 1, max = 32), regex(pattern = r"^[A-Z][A-Z0-9_]*$"))
    )]
    pub add: Vec<String>,
    /// Capabilities of the default set to drop (`ALL` drops them all).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 16),
        inner(length(min = 1, max = 32), regex(pattern = r"^[A-Z][A-Z0-9_]*$"))
    )]
    pub drop: Vec<String>,
}

/// Kind of isolation scope.
#[derive(
    Serialize,
    Deserialize,
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    schemars::JsonSchema,
)]
pub enum ScopeKind {
    /// One agent session of one user: needs `agent` and `session`.
    Session,
    /// One user of one agent, across sessions: needs `agent` and `user`.
    User,
    /// One agent, shared by all its users: needs `agent`.
    Agent,
    /// One sandbox lineage for everything: takes no ids.
    Global,
}

impl ScopeKind {
    /// The lower-case form used in the `agentbox.dev/scope` label.
    pub fn label_value(self) -> &'static str {
        match self {
            ScopeKind::Session => "session",
            ScopeKind::User => "user",
            ScopeKind::Agent => "agent",
            ScopeKind::Global => "global",
        }
    }
}

/// The isolation scope: which ids identify the sandbox's lineage.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash)]
#[x_kube(
    cel,
    validation = kube::core::Rule::new("self.kind == 'Global' || has(self.agent)").message("scope.agent is required for Session, User and Agent scopes"),
    validation = kube::core::Rule::new("self.kind != 'Session' || has(self.session)").message("scope.session is required for a Session scope"),
    validation = kube::core::Rule::new("self.kind != 'User' || has(self.user)").message("scope.user is required for a User scope"),
    validation = kube::core::Rule::new("self.kind == 'Session' || !has(self.session)").message("scope.session is only allowed for a Session scope"),
    validation = kube::core::Rule::new("self.kind == 'User' || !has(self.user)").message("scope.user is only allowed for a User scope"),
    validation = kube::core::Rule::new("self.kind != 'Global' || !has(self.agent)").message("a Global scope takes no ids"),
)]
#[serde(rename_all = "camelCase")]
pub struct Scope {
    /// Session, User, Agent or Global.
    pub kind: ScopeKind,
    /// Agent id (any string up to 253 characters; need not be a valid label value).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub agent: Option<String>,
    /// User id, for a User scope.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub user: Option<String>,
    /// Session id, for a Session scope.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub session: Option<String>,
}

/// The workspace: a directory on the node, chosen by the operator, mounted at `root`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceSpec {
    /// Absolute path of the workspace inside the container. Commands run here.
    #[serde(default = "default_root")]
    #[schemars(length(min = 2, max = 512))]
    #[x_kube(
        validation = kube::core::Rule::new("self.startsWith('/')").message("workspace.root must be an absolute path"),
        validation = kube::core::Rule::new("!self.matches('(^|/)\\\\.\\\\.?(/|$)')").message("workspace.root must not contain '.' or '..' segments"),
    )]
    pub root: String,

    /// Files written into the workspace when it is initialised (all of them on a fresh
    /// workspace, only the ephemeral ones when an existing workspace is reused). Paths are
    /// unique.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    #[x_kube(validation = crate::crd::unique_by("path", "file paths"))]
    pub files: Vec<WorkspaceFile>,

    /// ConfigMaps projected into workspace directories. A projection is re-applied on a start
    /// only when the SHA-256 of its content changed. Paths are unique.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    #[x_kube(validation = crate::crd::unique_by("path", "projection paths"))]
    pub projections: Vec<Projection>,

    /// Host directories bind-mounted into the workspace. Only host paths under the prefixes the
    /// operator allows are accepted (none by default). Paths are unique.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    #[x_kube(validation = crate::crd::unique_by("path", "mount paths"))]
    pub mounts: Vec<HostMount>,

    /// The most bytes the workspace may hold (a quantity: `64Mi`, `10Gi`, `500M`; at least
    /// 1Mi). Unset: the operator's `--workspace-size-limit` (Helm `workspace.sizeLimit`; none
    /// by default). Where the node's workspace root is btrfs with quotas enabled, it is a hard
    /// limit: the workspace is a subvolume of its own with a quota group limit, and a write
    /// past it fails in the sandbox with `EDQUOT` ("Disk quota exceeded"); elsewhere the
    /// operator's `--workspace-quota-fallback` decides: `measure` (the default) measures the
    /// workspace periodically and suspends the sandbox once it holds more (Warning Event
    /// `WorkspaceOverLimit`), `refuse` keeps the pod from starting. The condition
    /// `WorkspaceLimited` says which a sandbox got (reason `Quota`, `Measured` or
    /// `NotEnforced`), `status.workspace.usedBytes` how much it holds. A restore whose
    /// snapshot holds more is refused whole. Comes from the template for a Sandbox with
    /// `templateRef`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 32),
        regex(pattern = r"^[1-9][0-9]{0,17}(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$")
    )]
    pub size_limit: Option<String>,
}

impl Default for WorkspaceSpec {
    fn default() -> Self {
        WorkspaceSpec {
            root: default_root(),
            files: Vec::new(),
            projections: Vec::new(),
            mounts: Vec::new(),
            size_limit: None,
        }
    }
}

/// Bytes of a workspace size limit (`workspace.sizeLimit`): a whole number with an optional
/// binary (`Ki`, `Mi`, `Gi`, `Ti`, `Pi`) or decimal (`k`, `M`, `G`, `T`, `P`) suffix, the
/// quantities the CRD's pattern admits. Anything else (a fraction, an exponent, an overflow)
/// is an error naming the value.
pub fn size_limit_bytes(q: &str) -> Result<u64, String> {
    let digits = q.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let suffix = &q[digits.len()..];
    let factor: u64 = match suffix {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        _ => {
            return Err(format!(
                "workspace.sizeLimit {q:?}: unknown suffix {suffix:?}"
            ));
        }
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("workspace.sizeLimit {q:?} is not a whole number of bytes with a suffix such as Mi or Gi"))?;
    n.checked_mul(factor)
        .ok_or_else(|| format!("workspace.sizeLimit {q:?} is too large"))
}

/// The smallest workspace size limit: 1 MiB.
pub const MIN_SIZE_LIMIT: u64 = 1 << 20;

fn default_root() -> String {
    "/workspace".to_string()
}

/// One file to write into the workspace.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(
    validation = kube::core::Rule::new("has(self.content) != has(self.contentFrom)").message("a file needs exactly one of content and contentFrom"),
)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceFile {
    /// Path relative to the workspace root.
    #[schemars(length(min = 1, max = 1024))]
    #[x_kube(
        validation = kube::core::Rule::new("!self.startsWith('/')").message("file paths are relative to the workspace root"),
        validation = kube::core::Rule::new("!self.matches('(^|/)\\\\.\\\\.(/|$)')").message("file paths must not contain '..'"),
        validation = kube::core::Rule::new("!self.matches('^(\\\\./)*\\\\.agentbox(/|$)')").message(".agentbox is reserved for the operator"),
    )]
    pub path: String,
    /// Inline UTF-8 content.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 262144))]
    pub content: Option<String>,
    /// Content taken from a ConfigMap or Secret key in the sandbox's namespace (the object must
    /// carry the label `agentbox.dev/sandbox-readable: "true"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_from: Option<FileSource>,
    /// Permission bits (decimal in JSON, e.g. 420 for 0644; YAML accepts 0644). Default 0644.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 511))]
    pub mode: Option<i32>,
    /// Re-write this file on every start, not only when the workspace is fresh.
    #[serde(default)]
    pub ephemeral: bool,
}

/// Where a file's content comes from.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[x_kube(
    validation = kube::core::Rule::new("has(self.configMapKeyRef) != has(self.secretKeyRef)").message("contentFrom needs exactly one of configMapKeyRef and secretKeyRef"),
)]
#[serde(rename_all = "camelCase")]
pub struct FileSource {
    /// A key of a ConfigMap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_key_ref: Option<KeyRef>,
    /// A key of a Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_key_ref: Option<KeyRef>,
}

/// A key of a ConfigMap or Secret in the sandbox's namespace. The operator reads the object
/// only when it carries the label `agentbox.dev/sandbox-readable: "true"`, which whoever may
/// edit it sets to let sandboxes read it (creating a Sandbox must not be a way to read
/// Secrets one may not read oneself).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct KeyRef {
    /// Name of the object (a Kubernetes object name).
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = kube::core::Rule::new(crate::names::OBJECT_NAME_RULE).message(crate::names::OBJECT_NAME_MESSAGE))]
    pub name: String,
    /// Key within the object's data.
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = kube::core::Rule::new(crate::names::DATA_KEY_RULE).message(crate::names::DATA_KEY_MESSAGE))]
    pub key: String,
}

/// A ConfigMap projected into a workspace directory: one file per key.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Projection {
    /// Name of the ConfigMap in the sandbox's namespace. It must carry the label
    /// `agentbox.dev/sandbox-readable: "true"`.
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = kube::core::Rule::new(crate::names::OBJECT_NAME_RULE).message(crate::names::OBJECT_NAME_MESSAGE))]
    pub config_map: String,
    /// Directory relative to the workspace root that receives the keys.
    #[schemars(length(min = 1, max = 1024))]
    #[x_kube(
        validation = kube::core::Rule::new("!self.startsWith('/')").message("projection paths are relative to the workspace root"),
        validation = kube::core::Rule::new("!self.matches('(^|/)\\\\.\\\\.(/|$)')").message("projection paths must not contain '..'"),
        validation = kube::core::Rule::new("!self.matches('^(\\\\./)*\\\\.agentbox(/|$)')").message(".agentbox is reserved for the operator"),
    )]
    pub path: String,
}

/// A host directory bind-mounted into the workspace.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HostMount {
    /// Mount point relative to the workspace root.
    #[schemars(length(min = 1, max = 1024))]
    #[x_kube(
        validation = kube::core::Rule::new("!self.startsWith('/')").message("mount paths are relative to the workspace root"),
        validation = kube::core::Rule::new("!self.matches('(^|/)\\\\.\\\\.(/|$)')").message("mount paths must not contain '..'"),
        validation = kube::core::Rule::new("!self.matches('^(\\\\./)*\\\\.agentbox(/|$)')").message(".agentbox is reserved for the operator"),
    )]
    pub path: String,
    /// Absolute host path; must lie under a prefix the operator allows.
    #[schemars(length(min = 2, max = 1024))]
    #[x_kube(
        validation = kube::core::Rule::new("self.startsWith('/')").message("hostPath must be absolute"),
        validation = kube::core::Rule::new("!self.matches('(^|/)\\\\.\\\\.?(/|$)')").message("hostPath must not contain '.' or '..' segments"),
    )]
    pub host_path: String,
    /// Mount read-only. Defaults to true.
    #[serde(default = "default_true")]
    pub read_only: bool,
    /// What must exist at the host path.
    #[serde(default, rename = "type")]
    pub type_: HostMountType,
}

fn default_true() -> bool {
    true
}

/// What must exist at a mount's host path.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema,
)]
pub enum HostMountType {
    /// An existing directory.
    #[default]
    Directory,
    /// A directory, created when missing.
    DirectoryOrCreate,
    /// An existing file.
    File,
}

impl HostMountType {
    /// The value of a hostPath volume's `type`.
    pub fn as_str(self) -> &'static str {
        match self {
            HostMountType::Directory => "Directory",
            HostMountType::DirectoryOrCreate => "DirectoryOrCreate",
            HostMountType::File => "File",
        }
    }
}

/// Snapshot behaviour of a sandbox.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[x_kube(
    validation = kube::core::Rule::new("self.restore != 'Named' || has(self.name)").message("snapshot.name is required when snapshot.restore is Named"),
    validation = kube::core::Rule::new("self.restore == 'Named' || !has(self.name)").message("snapshot.name is only used when snapshot.restore is Named"),
)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotPolicy {
    /// Which snapshot a fresh or lost workspace is restored from: `Latest` (the newest Ready
    /// snapshot the operator recorded for this scope), `None`, or `Named` (the SandboxSnapshot
    /// in `name`, which must have been taken from a sandbox of the same scope unless the
    /// namespace allows cross-scope restores).
    #[serde(default)]
    pub restore: RestorePolicy,
    /// SandboxSnapshot to restore when `restore` is `Named` (same namespace, same scope).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = kube::core::Rule::new(crate::names::OBJECT_NAME_RULE).message(crate::names::OBJECT_NAME_MESSAGE))]
    pub name: Option<String>,
    /// Take a snapshot before the sandbox is suspended or deleted.
    #[serde(default)]
    pub on_stop: bool,
    /// How many snapshots of this scope to keep.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<Retention>,
    /// What a start does when the workspace was lost (its node lost, its directory gone) and
    /// there is no snapshot to restore: `StartFresh` (the default: a fresh workspace from the
    /// spec, branch D, the loss stated in WorkspaceReady and an Event) or `Fail` (no start:
    /// WorkspaceReady and Ready False with reason `WorkspaceLost` until a snapshot exists or
    /// the policy changes).
    #[serde(default)]
    pub when_lost: WhenLost,
}

/// What a start does with a lost workspace and nothing to restore.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema,
)]
pub enum WhenLost {
    /// A fresh workspace from the spec (branch D), the loss reported.
    #[default]
    StartFresh,
    /// No start: the sandbox reports the loss and waits for a snapshot or a policy change.
    Fail,
}

/// Which snapshot to restore.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema,
)]
pub enum RestorePolicy {
    /// The newest Ready snapshot with this sandbox's scope key.
    #[default]
    Latest,
    /// Never restore.
    #[serde(rename = "None")]
    Never,
    /// The snapshot named in `snapshot.name`.
    Named,
}

/// Snapshot retention per scope key.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Retention {
    /// Keep the newest N Ready snapshots of the scope and delete older ones.
    #[schemars(range(min = 1, max = 1000))]
    pub keep_last: u32,
}

/// Lifecycle of a sandbox.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Lifecycle {
    /// Running keeps a pod; Suspended deletes the pod and keeps the workspace on its node.
    /// The operator sets Suspended itself when `idleTimeout` passes; set Running (the clients'
    /// `resume` and `get_or_create` do) to start the sandbox again.
    #[serde(default)]
    pub mode: LifecycleMode,
    /// When this time passes the operator deletes the Sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_time: Option<Time>,
    /// Suspend the sandbox after it has been idle this long: Ready, with its scope's execution
    /// guard (the Lease harnesses hold for the window of each call) free the whole time. The
    /// operator then takes the guard itself, sets `mode: Suspended` (taking the on-stop
    /// snapshot when `snapshot.onStop` asks) and records `status.idleSince` and the reason
    /// `IdleTimeout` on the Ready condition. A Go duration of at least 10s, such as `90s`,
    /// `15m` or `1h30m`. Unset: never suspended for idleness.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = idle_timeout_format(), validation = idle_timeout_minimum())]
    pub idle_timeout: Option<kube::core::Duration>,
    /// The hold of the scope's guard under which `mode` was last set. A harness that holds the
    /// guard and suspends its sandbox names its hold here (its holder identity and fencing
    /// token) and keeps the guard until the Sandbox is Suspended: the operator then stops the pod
    /// under that hold instead of waiting for the guard, and no other party can start work in
    /// the scope in between. Without it, or once the scope's Lease is no longer held by this
    /// holder with this token, the operator takes the guard itself before it stops the pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guard: Option<super::GuardHold>,
}

/// The shortest `lifecycle.idleTimeout` admitted: shorter than a harness's pause between two
/// calls, a sandbox would suspend under a working agent and restart on every call.
pub const MIN_IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// A Go duration as CEL's `duration()` and the operator parse it (escaped for a CEL string).
const IDLE_TIMEOUT_PATTERN: &str = "^([0-9]+(\\\\.[0-9]+)?(h|m|s|ms|us|ns))+$";

/// Admission rule on `lifecycle.idleTimeout`: a Go duration.
pub(crate) fn idle_timeout_format() -> kube::core::Rule {
    kube::core::Rule::new(format!("self.matches('{IDLE_TIMEOUT_PATTERN}')")).message(
        "idleTimeout must be a duration such as 90s, 15m or 1h30m (units: h, m, s, ms, us, ns)",
    )
}

/// Admission rule on `lifecycle.idleTimeout`: at least [`MIN_IDLE_TIMEOUT`]. A malformed value
/// gets only the format rule's message, not an evaluation error.
pub(crate) fn idle_timeout_minimum() -> kube::core::Rule {
    kube::core::Rule::new(format!(
        "!self.matches('{IDLE_TIMEOUT_PATTERN}') || duration(self) >= duration('10s')"
    ))
    .message("idleTimeout must be at least 10s")
}

/// Whether a sandbox has a pod.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema,
)]
pub enum LifecycleMode {
    /// The sandbox has a running pod.
    #[default]
    Running,
    /// No pod; the workspace stays on its node.
    Suspended,
}

/// Network settings.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = kube::core::Rule::new("!has(self.allow) || size(self.allow) == 0 || (has(self.egress) && self.egress == 'Allowlist')").message("network.allow applies only with egress: Allowlist"),
    validation = kube::core::Rule::new("!has(self.egress) || self.egress != 'Allowlist' || (has(self.allow) && size(self.allow) > 0)").message("egress: Allowlist needs at least one network.allow entry"),
)]
pub struct Network {
    /// What the sandbox may reach: `None` (nothing), `All` (anything its network routes to),
    /// or `Allowlist` (only the destinations of `allow`). Unset: the cluster's default, the
    /// operator's `--default-egress` (Helm `network.defaultEgress`), `None` unless the
    /// administrator changed it. `None` and `Allowlist` are NetworkPolicies: the sandbox is
    /// Ready only on a node where the operator has proven that NetworkPolicy is enforced (or
    /// the administrator attests it), see the `NetworkEnforced` condition. Editable while the
    /// sandbox runs: the new policy applies within seconds, without a restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<Egress>,

    /// With `egress: Allowlist`: the destinations the sandbox may reach (the union of all
    /// entries), each an address block (`cidr`, enforced by the NetworkPolicy) or a domain
    /// name (`domain`, reached only through agentbox's egress proxy, which the sandbox's
    /// policy then admits), with the ports on it. At most 64 entries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub allow: Vec<EgressAllow>,
}

/// Egress policy.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema,
)]
pub enum Egress {
    /// Egress allowed.
    All,
    /// No egress at all (the default).
    #[default]
    #[serde(rename = "None")]
    Denied,
    /// Only the destinations listed in `network.allow`.
    Allowlist,
}

impl Network {
    /// Whether nothing is set (the cluster's default applies).
    pub fn is_default(&self) -> bool {
        self == &Self::default()
    }

    /// The egress policy in force: the spec's, else `default` (the cluster's).
    pub fn egress_or(&self, default: Egress) -> Egress {
        self.egress.unwrap_or(default)
    }
}

/// One allowed destination of `network.allow`: an address block (`cidr`) or a domain name
/// (`domain`), exactly one of them.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = kube::core::Rule::new("has(self.cidr) || has(self.domain)").message("a network.allow entry needs cidr (an address block such as 10.0.0.0/8) or domain (a name such as pypi.org or *.github.com)"),
    validation = kube::core::Rule::new("!(has(self.cidr) && has(self.domain))").message("a network.allow entry has either cidr or domain, not both: write two entries"),
    validation = kube::core::Rule::new("!has(self.domain) || !has(self.ports) || self.ports.all(p, !has(p.protocol) || p.protocol == 'TCP')").message("the ports of a domain entry are TCP (the egress proxy carries HTTP and TLS over TCP only)"),
    validation = kube::core::Rule::new("!has(self.credential) || (has(self.domain) && !self.domain.startsWith('*.'))").message("a credential goes with an exact domain (such as api.example.com), not a cidr or a '*.' wildcard: a wildcard would send the key to every name below it"),
)]
pub struct EgressAllow {
    /// An IPv4 or IPv6 address block in CIDR notation, such as `10.20.0.0/16` or
    /// `192.0.2.7/32` (one address). Enforced by the sandbox's NetworkPolicy; through the
    /// egress proxy it also lets a domain entry's name resolve to an address in the block
    /// that the proxy would otherwise refuse (private, loopback, link-local, the cluster's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    #[x_kube(validation = kube::core::Rule::new("isCIDR(self)").message("cidr must be an address block in CIDR notation, such as 10.0.0.0/8 or 192.0.2.7/32"))]
    pub cidr: Option<String>,

    /// A DNS name the sandbox may reach through agentbox's egress proxy (HTTP and HTTPS):
    /// exact (`pypi.org`) or a wildcard (`*.github.com`: any name below `github.com`, not
    /// `github.com` itself). Lower case; the proxy matches the TLS server name (SNI) or the
    /// HTTP Host of each connection against it, requires the two to agree with the proxy
    /// request's target, resolves the name itself and refuses private, loopback, link-local
    /// (the cloud metadata address) and cluster addresses unless a `cidr` entry allows them.
    /// The sandbox's environment gets `HTTP_PROXY`/`HTTPS_PROXY` (and lower-case) pointing
    /// at the proxy; addresses are not reachable by domain entries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    #[x_kube(validation = kube::core::Rule::new("self.matches('^([*][.])?([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?[.])*[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$') && self.contains('.') && !self.matches('[.][0-9]+$')").message("domain must be a lower-case DNS name with at least one dot, optionally starting with '*.' (such as pypi.org or *.github.com); addresses go in cidr"))]
    pub domain: Option<String>,

    /// The ports allowed on that block or name; empty: every port. At most 32.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub ports: Vec<EgressPort>,

    /// A key of a Secret that the egress proxy adds as a header to every request to this
    /// (exact) domain, so the sandbox never holds it. The sandbox sends plain HTTP to the
    /// proxy (`http://api.example.com/...`, its environment already names the proxy); the
    /// proxy opens TLS to the server itself (port 443 for a request to port 80, else the
    /// request's port, which must be allowed by `ports`), verifies the server's certificate
    /// and sets the header, replacing any the sandbox sent. A CONNECT to this domain is
    /// refused (the proxy could not add the header inside the sandbox's own TLS). The Secret
    /// is in the Sandbox's namespace and must allow the domain in its annotation
    /// `agentbox.dev/credential-domains` (comma-separated exact names or `*.` wildcards, set
    /// by whoever owns the Secret); otherwise the Sandbox is refused (condition
    /// `CredentialRefused`). A running sandbox whose credential stops passing keeps its pod
    /// (the entry then allows nothing) and says it on condition `Credentials` (False, reason
    /// `CredentialRefused`). Such a Secret is never readable by sandboxes as a file or an
    /// environment value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<EgressCredential>,
}

/// A Secret key sent as a header by the egress proxy (see `credential`).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct EgressCredential {
    /// The Secret's name, in the Sandbox's namespace (a Kubernetes object name).
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = kube::core::Rule::new(crate::names::OBJECT_NAME_RULE).message(crate::names::OBJECT_NAME_MESSAGE))]
    pub secret_name: String,

    /// The key of the Secret whose value is the header's value (sent as it is, so include
    /// a scheme such as `Bearer ` if the server expects one).
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = kube::core::Rule::new(crate::names::DATA_KEY_RULE).message(crate::names::DATA_KEY_MESSAGE))]
    pub key: String,

    /// The header's name; default `Authorization`. An HTTP token (letters, digits and
    /// ``!#$%&'*+-.^_`|~``), not one the proxy owns (`Host`, `Connection`, `Content-Length`,
    /// `Transfer-Encoding`, `Proxy-*`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64))]
    #[x_kube(validation = kube::core::Rule::new("self.matches('^[-!#$%&\\'*+.^_`|~0-9a-zA-Z]+$') && !(self.lowerAscii() in ['host', 'connection', 'content-length', 'transfer-encoding', 'keep-alive', 'upgrade', 'te', 'trailer']) && !self.lowerAscii().startsWith('proxy-')").message("header must be an HTTP header name that is not Host, Connection, Content-Length, Transfer-Encoding, Keep-Alive, Upgrade, TE, Trailer or Proxy-*"))]
    pub header: Option<String>,
}

impl EgressCredential {
    /// The header's name in force.
    pub fn header_or_default(&self) -> &str {
        self.header.as_deref().unwrap_or("Authorization")
    }

    /// What the CRD's rules refuse in this credential on an entry of `domain` (`None`: a
    /// `cidr` entry), if anything (pure). Every client and framework backend checks the same
    /// before any request; the protocol vectors' `credentials` hold the cases. Whether the
    /// Secret allows the domain is the operator's to decide (it alone reads the Secret).
    pub fn fault(&self, domain: Option<&str>) -> Option<CredentialFault> {
        if domain.is_none_or(|d| d.starts_with("*.")) {
            return Some(CredentialFault::Domain);
        }
        if !crate::names::is_object_name(&self.secret_name) {
            return Some(CredentialFault::SecretName);
        }
        if !crate::names::is_data_key(&self.key) {
            return Some(CredentialFault::Key);
        }
        if self
            .header
            .as_deref()
            .is_some_and(|h| !is_credential_header(h))
        {
            return Some(CredentialFault::Header);
        }
        None
    }
}

/// What [`EgressCredential::fault`] finds wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CredentialFault {
    /// On a `cidr` entry or a `*.` wildcard (the key would go to every name below it).
    Domain,
    /// The Secret's name is no Kubernetes object name.
    SecretName,
    /// The key is no Secret data key.
    Key,
    /// The header is no HTTP token, or one the egress proxy owns.
    Header,
}

impl CredentialFault {
    /// Its name in the protocol vectors.
    pub fn as_str(self) -> &'static str {
        match self {
            CredentialFault::Domain => "domain",
            CredentialFault::SecretName => "secret_name",
            CredentialFault::Key => "key",
            CredentialFault::Header => "header",
        }
    }
}

/// The headers the egress proxy sets or strips itself, which a credential cannot name (nor any
/// `Proxy-*`); the CRD's CEL rule on `header` lists the same.
pub const PROXY_HEADERS: [&str; 8] = [
    "host",
    "connection",
    "content-length",
    "transfer-encoding",
    "keep-alive",
    "upgrade",
    "te",
    "trailer",
];

/// Whether `h` may be a credential's header: an HTTP token of 1 to 64 characters, not one of
/// [`PROXY_HEADERS`] and not `Proxy-*` (the CRD's rule on `header`).
pub fn is_credential_header(h: &str) -> bool {
    let lower = h.to_ascii_lowercase();
    !h.is_empty()
        && h.len() <= 64
        && h.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
        && !PROXY_HEADERS.contains(&lower.as_str())
        && !lower.starts_with("proxy-")
}

/// A port (or range) of an allowed destination.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = kube::core::Rule::new("!has(self.endPort) || self.endPort >= self.port").message("endPort must not be below port"),
)]
pub struct EgressPort {
    /// The port number (1-65535).
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,

    /// With it, the range `port`..`endPort` (inclusive, 1-65535).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub end_port: Option<i32>,

    /// `TCP` (the default), `UDP` or `SCTP`.
    #[serde(default)]
    pub protocol: PortProtocol,
}

/// Condition type on a Sandbox: its start cannot go on without a change (see
/// [`SandboxStatus::conditions`]; the `Ready` condition carries the same reason).
pub const STALLED: &str = "Stalled";

impl Sandbox {
    /// The `Stalled` condition when it is True for the current spec (pure): waiting for this
    /// sandbox to become Ready is pointless until something changes.
    pub fn stalled(&self) -> Option<&Condition> {
        let c = self
            .status
            .as_ref()?
            .conditions
            .iter()
            .find(|c| c.type_ == STALLED && c.status == "True")?;
        let current = match (c.observed_generation, self.metadata.generation) {
            (Some(observed), Some(generation)) => observed >= generation,
            _ => true,
        };
        current.then_some(c)
    }
}

/// Observed state of a Sandbox.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxStatus {
    /// Coarse state: Pending, Initializing, Ready, Suspended, Failed or Terminating.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<SandboxPhase>,
    /// Detailed conditions: PodReady, WorkspaceReady, Ready and others, each with a reason.
    /// `Stalled` True (its `observedGeneration` the current one) says the start cannot go on
    /// without a change, and the SDKs' waits raise at once: refused for a reason that waiting
    /// will not fix (a refused or missing snapshot, another scope's snapshot without the
    /// namespace's consent, a workspace command that fails; it stands until the spec, the
    /// snapshot or the namespace changes), or a pod that has not started for longer than the
    /// operator's stall grace because its image cannot be pulled, its container's
    /// configuration names something missing, or no node can take it (it clears if the pod
    /// starts after all).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The spec generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Name of the sandbox pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_name: Option<String>,
    /// Node that holds the workspace; the pod is pinned to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// RuntimeClass the sandbox's pod runs under, as the pod names it: the spec's, its
    /// template's, or the operator's `--default-runtime-class`. Absent: the node's default
    /// runtime (runc on most clusters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_class_name: Option<String>,
    /// Scope key: hex SHA-256 over the scope kind and ids (also the `agentbox.dev/scope-key` label).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope_key: Option<String>,
    /// Workspace state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<WorkspaceStatus>,
    /// SandboxSnapshot the workspace was last restored from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored_from: Option<String>,
    /// The last restore refused for a permanent reason (a refused archive, a digest or size
    /// mismatch, a missing object). It is not attempted again until the sandbox's spec, the
    /// snapshot or its stored object changes; cleared when a start succeeds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_refusal: Option<RestoreRefusal>,
    /// Newest SandboxSnapshot of this sandbox that became Ready. Written by the snapshot
    /// controller (field manager `agentbox-operator-snapshots`) when a snapshot commits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_snapshot: Option<LastSnapshot>,
    /// Who holds the scope's execution guard, as last seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guard: Option<GuardStatus>,
    /// With `spec.lifecycle.idleTimeout`: since when the sandbox has been idle (Ready, its
    /// scope's guard free). Cleared when the guard is taken or the sandbox stops being Ready;
    /// kept when the idle timeout suspends it, to say when it went idle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_since: Option<Time>,
    /// The guard Lease's `leaseTransitions` (its fencing token) when `idleSince` was set. Every
    /// take of the guard raises it, so a call the operator did not see between two looks still
    /// restarts the idle clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_guard_transitions: Option<i32>,
    /// With `spec.templateRef`: the version of the SandboxTemplate the sandbox's pod was made
    /// from. A template edited since does not replace that pod; its next start uses the
    /// template as it is then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<TemplateUse>,
    /// Where each port of `spec.ports` is reached.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub endpoints: Vec<PortEndpoint>,
    /// The last loss of the node that held the workspace: which node, since when it was not
    /// ready, when the operator gave it up, and what the recovery restores and loses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_loss: Option<NodeLoss>,
    /// Workspace directories left on lost nodes, removed by a helper pod once their node is
    /// Ready again (the entry goes then, or when the node object is gone). Never served: the
    /// sandbox's pod runs elsewhere.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub abandoned: Vec<AbandonedWorkspace>,
    /// The last time the sandbox's container was killed for memory, as the kubelet recorded it
    /// (its `OOMKilled` termination): every process in it ended, and the kubelet restarted it.
    /// An `OOMKilled` Warning Event goes out once per kill. A command the kernel killed alone
    /// (its container lived on) is reported to the client that ran it, not here.
    #[serde(
        default,
        rename = "lastOOMKill",
        skip_serializing_if = "Option::is_none"
    )]
    pub last_oom_kill: Option<OomKill>,
}

/// A kill of the sandbox's container for memory.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OomKill {
    /// When the container was killed (the termination's `finishedAt`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<Time>,
    /// The UID of the pod it ran in.
    pub pod_uid: String,
    /// The container's restart count as the kubelet reported it with the kill.
    pub restart_count: i32,
    /// The container's `limits.memory` then (absent: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<String>,
}

/// A node loss the sandbox recovered from (or is recovering from).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeLoss {
    /// The node that was lost.
    pub node: String,
    /// Since when the node was not ready (its Ready condition's transition or the
    /// unreachable/not-ready taint's `timeAdded`); absent when the Node object was gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_ready_since: Option<Time>,
    /// When the operator gave the node up (the node-loss grace had run out) and moved the
    /// sandbox off it.
    pub detected_at: Time,
    /// The snapshot the recovery restores: the one the restore policy points at (the scope's
    /// newest Ready snapshot by default). Absent: nothing to restore, the workspace starts
    /// fresh from the spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    /// When that snapshot completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_completed_at: Option<Time>,
    /// What was lost, in seconds: the work done between that snapshot's completion and the
    /// node's failure (measured to `notReadySince`, else `detectedAt`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost_seconds: Option<i64>,
}

/// A workspace directory left behind on a lost node.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AbandonedWorkspace {
    /// The node it is on.
    pub node: String,
    /// Its host path there (`<nodeRoot>/<namespace>/<sandbox-uid>`).
    pub directory: String,
    /// When it was abandoned.
    pub since: Time,
}

/// Where one exposed port of a sandbox is reached.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PortEndpoint {
    /// Name of the port in `spec.ports`.
    pub name: String,
    /// Port number (the same on the Service and in the pod).
    pub port: i32,
    /// TCP, UDP or SCTP.
    pub protocol: PortProtocol,
    /// Cluster DNS name of the sandbox's Service (`<service>.<namespace>.svc`): reaches the port
    /// from pods of the cluster, through cluster DNS and the Service proxy.
    pub host: String,
    /// IP of the sandbox's pod while it has one: reaches the port directly on the pod network,
    /// also on clusters without DNS or a Service proxy. Changes when the pod is replaced.
    #[serde(default, rename = "podIP", skip_serializing_if = "Option::is_none")]
    pub pod_ip: Option<String>,
}

/// The newest Ready snapshot of a sandbox.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LastSnapshot {
    /// Name of the SandboxSnapshot (same namespace).
    pub name: String,
    /// When it became Ready (its `status.completedAt`).
    pub completed_at: Time,
    /// Hex SHA-256 of its tarball.
    pub sha256: String,
    /// Size of its tarball in bytes.
    pub size_bytes: i64,
}

/// What a restore is judged against: while all of it is unchanged, a permanent refusal
/// stands.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RestoreBasis {
    /// Name of the SandboxSnapshot.
    pub snapshot: String,
    /// Its UID.
    pub snapshot_uid: String,
    /// Its resourceVersion when it was judged (any change to it allows another attempt).
    pub snapshot_resource_version: String,
    /// The Sandbox's `metadata.generation` (its spec) when it was judged.
    pub generation: i64,
    /// The stored object's version when it was judged: its ETag (or size and modification
    /// time), or `absent` when it was missing.
    pub object_version: String,
    /// The operator's restore limits when it was judged (refusals for a limit do not stand
    /// under other limits).
    pub limits: String,
}

/// A restore refused for a permanent reason, and what it was judged against.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RestoreRefusal {
    /// What it was judged against.
    #[serde(flatten)]
    pub basis: RestoreBasis,
    /// Why: the WorkspaceReady reason (`DigestMismatch`, `Hardlink`, `ObjectMissing`...).
    pub reason: String,
    /// What was refused.
    pub message: String,
    /// When it was refused.
    pub refused_at: Time,
}

/// Coarse phase of a sandbox.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
pub enum SandboxPhase {
    /// Waiting for a pod.
    Pending,
    /// Pod running; workspace being initialised.
    Initializing,
    /// Pod and workspace ready for commands.
    Ready,
    /// No pod by request; the workspace is kept.
    Suspended,
    /// Cannot proceed; see the conditions.
    Failed,
    /// Being deleted.
    Terminating,
}

impl SandboxPhase {
    /// Every phase (what a count by phase covers).
    pub const ALL: [SandboxPhase; 6] = [
        SandboxPhase::Pending,
        SandboxPhase::Initializing,
        SandboxPhase::Ready,
        SandboxPhase::Suspended,
        SandboxPhase::Failed,
        SandboxPhase::Terminating,
    ];

    /// The phase's name as written in status.
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxPhase::Pending => "Pending",
            SandboxPhase::Initializing => "Initializing",
            SandboxPhase::Ready => "Ready",
            SandboxPhase::Suspended => "Suspended",
            SandboxPhase::Failed => "Failed",
            SandboxPhase::Terminating => "Terminating",
        }
    }
}

/// The start branch taken when a workspace was initialised: `A` reattached (the workspace was
/// still there), `B` recovered (a lost workspace restored from a snapshot), `C` restored (a
/// fresh one restored from a snapshot), `D` fresh (initialised from the spec). The letters are
/// the status's words, kept so that CRDs of an earlier chart (Helm does not upgrade them) and
/// the operators that wrote them agree with this one.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
pub enum StartBranch {
    /// `A`: marker present: the workspace was reused; only ephemeral files were re-applied.
    #[serde(rename = "A")]
    Reattached,
    /// `B`: the workspace was ready before but is gone: restored from the latest snapshot.
    #[serde(rename = "B")]
    Recovered,
    /// `C`: fresh workspace restored from a snapshot, then all files written.
    #[serde(rename = "C")]
    Restored,
    /// `D`: fresh workspace, nothing to restore: all files written.
    #[serde(rename = "D")]
    Fresh,
}

impl StartBranch {
    /// Its letter, as the status says it.
    pub fn letter(self) -> &'static str {
        match self {
            StartBranch::Reattached => "A",
            StartBranch::Recovered => "B",
            StartBranch::Restored => "C",
            StartBranch::Fresh => "D",
        }
    }

    /// Its name in words (the metrics' `branch` label).
    pub fn label(self) -> &'static str {
        match self {
            StartBranch::Reattached => "reattached",
            StartBranch::Recovered => "recovered",
            StartBranch::Restored => "restored",
            StartBranch::Fresh => "fresh",
        }
    }
}

/// Workspace state.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceStatus {
    /// The workspace has been initialised at least once on its node.
    #[serde(default)]
    pub root_ready: bool,
    /// Branch taken by the last initialisation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_start_branch: Option<StartBranch>,
    /// SHA-256 over the projected ConfigMaps' content at the last initialisation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub projection_hash: Option<String>,
    /// UID of the pod the workspace was last initialised in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialized_pod_uid: Option<String>,
    /// The host directory on `status.nodeName` holding the workspace when it is not the
    /// derived `<nodeRoot>/<namespace>/<sandbox uid>`: the warm pod's own directory for a pod
    /// adopted from a pool. Set when such a pod is adopted; kept while the directory exists
    /// (also while Suspended); cleared when the directory is given up with a lost node. Absent:
    /// the workspace is `<nodeRoot>/<namespace>/<sandbox uid>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_dir: Option<String>,
    /// Bytes the workspace holds, as last measured by agentbox's helper beside the sandbox
    /// (only for a sandbox with `workspace.sizeLimit`; rounded to whole MiB between
    /// measurements, so a sandbox's status is not rewritten for every byte).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used_bytes: Option<u64>,
    /// The workspace's size limit in bytes, as its pod was made with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_bytes: Option<u64>,
}

/// Holder of the scope's execution guard.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GuardStatus {
    /// Identity of the holder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    /// When the holder acquired the guard.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Time>,
}

impl SandboxSpec {
    /// The spec of a Sandbox made from the SandboxTemplate `template` in `scope`, with nothing
    /// of its own yet: add env, files, a snapshot policy or a lifecycle as the template allows.
    pub fn from_template(template: impl Into<String>, scope: Scope) -> Self {
        SandboxSpec {
            template_ref: Some(TemplateRef {
                name: template.into(),
            }),
            ..Self::bare(scope)
        }
    }

    /// The spec of a Sandbox in `scope` running `image`, with everything else defaulted.
    pub fn from_image(image: impl Into<String>, scope: Scope) -> Self {
        SandboxSpec {
            pod: PodShape {
                image: Some(image.into()),
                ..PodShape::default()
            },
            ..Self::bare(scope)
        }
    }

    fn bare(scope: Scope) -> Self {
        SandboxSpec {
            template_ref: None,
            pod: PodShape::default(),
            scope,
            workspace: WorkspaceSpec::default(),
            snapshot: SnapshotPolicy::default(),
            lifecycle: Lifecycle::default(),
        }
    }
}

/// A reference to a SandboxTemplate in the sandbox's namespace.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct TemplateRef {
    /// Name of the SandboxTemplate.
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = crate::crd::object_name())]
    pub name: String,
}

/// Which version of a SandboxTemplate a sandbox's pod was made from.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TemplateUse {
    /// Name of the SandboxTemplate.
    pub name: String,
    /// Its UID (a template deleted and made again under the same name has another).
    pub uid: String,
    /// Its `metadata.generation` (its spec's version) when the pod was made.
    pub generation: i64,
}
