//! The `SandboxSnapshot` resource: one immutable workspace tarball in object storage.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// Desired state of a SandboxSnapshot. Immutable once created.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[kube(
    group = "agentbox.dev",
    version = "v1alpha1",
    kind = "SandboxSnapshot",
    namespaced,
    shortname = "sbxsnap",
    category = "agentbox",
    doc = "A SandboxSnapshot is one immutable tarball of a Sandbox's workspace in the operator's object store, taken under the scope's guard and verified before it becomes Ready. It carries its sandbox's scope labels, so a scope's snapshots are a label query; a Sandbox restores from the newest Ready one of its scope, or from one it names. `kubectl wait --for=condition=Ready sandboxsnapshot/<name>` waits until it is committed.",
    status = "SandboxSnapshotStatus",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Sandbox","type":"string","jsonPath":".spec.sandboxRef.name"}"#,
    printcolumn = r#"{"name":"Size","type":"integer","jsonPath":".status.sizeBytes"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","description":"Reason of the Ready condition","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name":"Message","type":"string","priority":1,"description":"Message of the Ready condition","jsonPath":".status.conditions[?(@.type==\"Ready\")].message"}"#,
    printcolumn = r#"{"name":"Members","type":"integer","priority":1,"jsonPath":".status.members"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    selectable = ".status.scopeKey"
)]
#[x_kube(validation = kube::core::Rule::new("self == oldSelf").message("a SandboxSnapshot's spec is immutable"))]
#[serde(rename_all = "camelCase")]
pub struct SandboxSnapshotSpec {
    /// The Sandbox (same namespace) whose workspace is captured.
    pub sandbox_ref: SandboxRef,
    /// What happens to the stored tarball when this object is deleted.
    #[serde(default)]
    pub deletion_policy: DeletionPolicy,
    /// Take the snapshot under this hold of the scope's guard instead of acquiring the guard.
    /// A harness that holds the guard sets it (its holder identity and fencing token) and keeps
    /// the guard until the snapshot is Ready or Failed, so nothing works in the scope between its
    /// last command and the snapshot. The operator takes the snapshot only while the scope's
    /// Lease is held by this holder with this token; when it is not, the snapshot fails with the
    /// reason `GuardNotHeld`. Unset: the operator acquires the guard itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guard: Option<super::GuardHold>,
}

/// Reference to a Sandbox in the same namespace.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SandboxRef {
    /// Name of the Sandbox (a Kubernetes object name).
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = kube::core::Rule::new(crate::names::OBJECT_NAME_RULE).message(crate::names::OBJECT_NAME_MESSAGE))]
    pub name: String,
}

/// What happens to a snapshot's stored object when the resource is deleted.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema,
)]
pub enum DeletionPolicy {
    /// Delete the object with the resource.
    #[default]
    Delete,
    /// Keep the object in the store.
    Retain,
}

/// Observed state of a SandboxSnapshot.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxSnapshotStatus {
    /// Pending, Running, Ready or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<SnapshotPhase>,
    /// Key of the tarball in the object store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object_key: Option<String>,
    /// Hex SHA-256 of the tarball.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// Size of the tarball in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<i64>,
    /// Number of archive members.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub members: Option<i64>,
    /// Fencing token (lease transitions) of the guard the snapshot was taken under.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fencing_token: Option<i64>,
    /// Scope key of the sandbox the snapshot was taken from: the operator's own record of the
    /// snapshot's scope (labels can be edited by anyone who may patch the object; status only
    /// by the operator). Restores and retention go by it. A field selector:
    /// `kubectl get sbxsnap --field-selector status.scopeKey=<key>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope_key: Option<String>,
    /// How many times taking the snapshot was started (an interrupted attempt, for example by
    /// an operator restart, is retried from scratch a few times).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<i32>,
    /// Id of the multipart upload of the attempt in progress (S3, GCS, Azure stores). Recorded
    /// so that an attempt cut short (an operator killed mid-upload) is aborted by this id when
    /// the snapshot is retaken, failed or deleted, and its uploaded parts do not stay in the
    /// bucket. Cleared when the attempt ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upload_id: Option<String>,
    /// When taking the snapshot started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    /// When the snapshot became Ready or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<Time>,
    /// Conditions with reasons: `Ready` (the snapshot is committed and can be restored; what
    /// `kubectl wait --for=condition=Ready` waits for) and `Committed` (the same, kept for
    /// clients that read it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// Phase of a snapshot.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
pub enum SnapshotPhase {
    /// Waiting to start.
    Pending,
    /// Archive being streamed to the store.
    Running,
    /// Object committed and verified.
    Ready,
    /// Failed; see the conditions.
    Failed,
}
