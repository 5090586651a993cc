//! The `SandboxTemplate` resource: the pod-shaping part of a Sandbox, fixed once by a platform
//! team and named by Sandboxes with `spec.templateRef`. Its fields are the Sandbox's own types
//! with the Sandbox's own admission rules; how a Sandbox and its template combine is
//! [`crate::template::resolve`].

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{EnvVar, ResourceRequirements, Toleration};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::{
    ImagePullPolicy, Network, Projection, SandboxPort, SandboxSecurityContext, SnapshotPolicy,
    WorkspaceFile,
};

/// Desired state of a SandboxTemplate.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "agentbox.dev",
    version = "v1alpha1",
    kind = "SandboxTemplate",
    namespaced,
    shortname = "sbxtpl",
    category = "agentbox",
    doc = "A SandboxTemplate is the pod-shaping part of a Sandbox (image, command, env, resources, runtime class, scheduling, security, network, ports, default workspace files and projections, snapshot policy, idle timeout) that a platform team fixes once. A Sandbox names it with `spec.templateRef` and adds its scope, files and env (see `kubectl explain sandbox.spec.templateRef`). The template is read when a sandbox's pod is made: editing it does not replace running pods. It has no state of its own (no status, nothing to `kubectl wait --for=condition=Ready` on).",
    printcolumn = r#"{"name":"Image","type":"string","jsonPath":".spec.image"}"#,
    printcolumn = r#"{"name":"Egress","type":"string","jsonPath":".spec.network.egress"}"#,
    printcolumn = r#"{"name":"Idle-Timeout","type":"string","jsonPath":".spec.lifecycle.idleTimeout"}"#,
    printcolumn = r#"{"name":"Runtime","type":"string","priority":1,"jsonPath":".spec.runtimeClassName"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct SandboxTemplateSpec {
    /// Container image of the template's sandboxes (as a Sandbox's `image`).
    #[schemars(length(min = 1, max = 512))]
    pub image: String,

    /// Image pull policy (as a Sandbox's `imagePullPolicy`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<ImagePullPolicy>,

    /// Entrypoint (as a Sandbox's `command`; default: a keep-alive loop).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub command: Option<Vec<String>>,

    /// Arguments to the entrypoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub args: Option<Vec<String>>,

    /// Environment variables (as a Sandbox's `env`). A Sandbox's own `env` is appended; a
    /// variable it names the same replaces the template's. Names are unique.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256), transform = super::sandbox::bound_env_names)]
    #[x_kube(validation = crate::crd::unique_by("name", "env names"))]
    pub env: Vec<EnvVar>,

    /// CPU and memory requests and limits of the sandbox container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,

    /// RuntimeClass of the sandbox pods (as a Sandbox's `runtimeClassName`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = crate::crd::object_name())]
    pub runtime_class_name: Option<String>,

    /// Node labels the sandbox pods must match when first scheduled.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,

    /// Tolerations of the sandbox pods.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub tolerations: Vec<Toleration>,

    /// Security settings (as a Sandbox's `securityContext`, checked against the same operator
    /// allowlist).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_context: Option<SandboxSecurityContext>,

    /// Network policy of the sandbox pods (as a Sandbox's `network`).
    #[serde(default)]
    pub network: Network,

    /// Ports to expose (as a Sandbox's `ports`). Names are unique, and so are port numbers per
    /// protocol.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    #[x_kube(validation = crate::crd::unique_by("name", "port names"), validation = super::unique_port_numbers())]
    pub ports: Vec<SandboxPort>,

    /// Default workspace content of the template's sandboxes.
    #[serde(default)]
    pub workspace: TemplateWorkspace,

    /// Snapshot policy of the template's sandboxes (as a Sandbox's `snapshot`). A Sandbox
    /// whose own policy is not the default replaces it whole.
    #[serde(default)]
    pub snapshot: SnapshotPolicy,

    /// Lifecycle defaults of the template's sandboxes.
    #[serde(default)]
    pub lifecycle: TemplateLifecycle,
}

/// Default workspace content of a template's sandboxes.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TemplateWorkspace {
    /// Files written into every sandbox's workspace (as a Sandbox's `workspace.files`). A
    /// Sandbox's own files are added; a file of the same path replaces the template's. Paths
    /// are unique.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    #[x_kube(validation = crate::crd::unique_by("path", "file paths"))]
    pub files: Vec<WorkspaceFile>,

    /// ConfigMaps projected into every sandbox's workspace (as a Sandbox's
    /// `workspace.projections`). Paths are unique.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    #[x_kube(validation = crate::crd::unique_by("path", "projection paths"))]
    pub projections: Vec<Projection>,
}

/// Lifecycle defaults of a template's sandboxes.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TemplateLifecycle {
    /// Idle timeout of the template's sandboxes (as a Sandbox's `lifecycle.idleTimeout`); a
    /// Sandbox's own replaces it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = super::sandbox::idle_timeout_format(), validation = super::sandbox::idle_timeout_minimum())]
    pub idle_timeout: Option<kube::core::Duration>,
}
