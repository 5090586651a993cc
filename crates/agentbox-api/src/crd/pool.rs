//! The `SandboxPool` resource: a number of warm pods of a SandboxTemplate, kept Running with an
//! empty workspace directory each, for Sandboxes of that template to adopt. The pods and what
//! marks them are the operator's pool controller's (`agentbox-operator`).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::TemplateRef;

/// Most warm pods one pool may keep.
pub const MAX_POOL_REPLICAS: i32 = 100;

/// Desired state of a SandboxPool.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "agentbox.dev",
    version = "v1alpha1",
    kind = "SandboxPool",
    namespaced,
    shortname = "sbxpool",
    category = "agentbox",
    doc = "A SandboxPool is a number of warm pods of a SandboxTemplate: each Running, made exactly as a Sandbox of that template without overrides would make its pod, with an empty workspace directory of its own on its node and no scope data of any kind. A Sandbox of the template adopts a ready warm pod instead of starting one, and the pool makes another. `kubectl scale sandboxpool/<name> --replicas=N` (or an HPA) sets its size; `kubectl wait --for=condition=Ready sandboxpool/<name>` waits until every warm pod is ready to be claimed.",
    status = "SandboxPoolStatus",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn = r#"{"name":"Template","type":"string","jsonPath":".spec.templateRef.name"}"#,
    printcolumn = r#"{"name":"Desired","type":"integer","jsonPath":".spec.replicas"}"#,
    printcolumn = r#"{"name":"Current","type":"integer","jsonPath":".status.replicas"}"#,
    printcolumn = r#"{"name":"Ready","type":"integer","jsonPath":".status.readyReplicas"}"#,
    printcolumn = r#"{"name":"Strategy","type":"string","priority":1,"jsonPath":".spec.updateStrategy"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","description":"Reason of the Ready condition","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name":"Message","type":"string","priority":1,"description":"Message of the Ready condition","jsonPath":".status.conditions[?(@.type==\"Ready\")].message"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct SandboxPoolSpec {
    /// The SandboxTemplate (same namespace) whose pods the pool keeps warm. Sandboxes naming
    /// this template (with no env additions, host mounts or workspace root of their own: those
    /// shape the pod) adopt the pool's pods. A missing template makes no pods and sets the
    /// `TemplateNotFound` condition until it is created.
    pub template_ref: TemplateRef,

    /// How many warm pods to keep (0 to 100). Claimed pods leave the pool, which then makes
    /// new ones. The `/scale` subresource sets it (`kubectl scale`, an HPA).
    #[schemars(range(min = 0, max = 100))]
    pub replicas: i32,

    /// What happens to warm pods when the template changes the pods it makes (its image,
    /// command, env, resources, security settings...: a pod made now would differ; an edit of
    /// only the template's files, snapshot policy or idle timeout changes no pod). `Recreate`
    /// (the default): warm pods of the old shape are deleted and replaced at once, so Sandboxes
    /// adopt only pods of the current template. `OnDelete`: they are kept until deleted (by
    /// hand, or by scaling down, which removes them first); new pods have the current shape.
    /// Pods already claimed by a Sandbox belong to it and are never touched.
    #[serde(default)]
    pub update_strategy: PoolUpdateStrategy,
}

/// What happens to a pool's warm pods when its template changes.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema,
)]
pub enum PoolUpdateStrategy {
    /// Warm pods of an older template version are deleted and made again.
    #[default]
    Recreate,
    /// Warm pods of an older template version stay until deleted.
    OnDelete,
}

/// Observed state of a SandboxPool.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxPoolStatus {
    /// Warm pods that exist (unclaimed, not being deleted), ready or not.
    #[serde(default)]
    pub replicas: i32,
    /// Warm pods ready to be claimed: Running, their container ready, their workspace
    /// directory initialised and empty.
    #[serde(default)]
    pub ready_replicas: i32,
    /// Label selector of the pool's warm pods, for the `/scale` subresource (an HPA reads it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// `metadata.generation` of the template the pool's new pods are made from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_generation: Option<i64>,
    /// The pool's `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready` (every desired warm pod is ready; reason `Ready`, `Scaling`, `Updating`,
    /// `TemplateNotFound` or `Invalid`), `TemplateNotFound` (True while the template is
    /// missing).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}
