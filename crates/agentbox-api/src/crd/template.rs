//! The `SandboxTemplate` resource: the pod-shaping part of a Sandbox, fixed once by a platform
//! team and named by Sandboxes with `spec.templateRef`. Its fields are the Sandbox's own types
//! with the Sandbox's own admission rules; how a Sandbox and its template combine is
//! [`crate::template::resolve`].

use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::{PodShape, Projection, SnapshotPolicy, WorkspaceFile};

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
#[x_kube(
    validation = kube::core::Rule::new("has(self.image)").message("a SandboxTemplate needs an image"),
)]
#[serde(rename_all = "camelCase")]
pub struct SandboxTemplateSpec {
    /// The pod-shaping fields, as in a Sandbox (the same fields with the same rules; `image`
    /// is required here).
    #[serde(flatten)]
    pub pod: PodShape,

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

    /// The most bytes each sandbox's workspace may hold (as a Sandbox's
    /// `workspace.sizeLimit`, which a Sandbox naming the template cannot set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 32),
        regex(pattern = r"^[1-9][0-9]{0,17}(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$")
    )]
    pub size_limit: Option<String>,
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
