{{- /* Rules on namespaced resources: a ClusterRole when all namespaces are watched, else a
       Role in the watched namespace. Each rule says why the operator needs it. */}}
{{- define "agentbox.namespacedRules" }}
# Sandboxes: the primary resource; watched, finalizer added/removed by patch, deleted once spec.lifecycle.shutdownTime passes.
- apiGroups: ["agentbox.dev"]
  resources: ["sandboxes"]
  verbs: ["get", "list", "watch", "patch", "delete"]
# Sandbox status: phase, conditions and workspace state are server-side applied to the status subresource.
- apiGroups: ["agentbox.dev"]
  resources: ["sandboxes/status"]
  verbs: ["patch"]
# Sandbox finalizers: owned pods/NetworkPolicies/Services set blockOwnerDeletion, which OwnerReferencesPermissionEnforcement allows only with this.
- apiGroups: ["agentbox.dev"]
  resources: ["sandboxes/finalizers"]
  verbs: ["update"]
# SandboxTemplates: read-only; watched so that a template created or edited brings back the sandboxes naming it, read by name to resolve a sandbox's spec.
- apiGroups: ["agentbox.dev"]
  resources: ["sandboxtemplates"]
  verbs: ["get", "list", "watch"]
# SandboxPools: watched by the pool controller (it keeps each pool's warm pods); never written but for status.
- apiGroups: ["agentbox.dev"]
  resources: ["sandboxpools"]
  verbs: ["get", "list", "watch"]
# SandboxPool status: warm pod counts, selector (for /scale) and conditions are server-side applied to the status subresource.
- apiGroups: ["agentbox.dev"]
  resources: ["sandboxpools/status"]
  verbs: ["patch"]
# SandboxPool finalizers: warm pods set blockOwnerDeletion on their pool, which OwnerReferencesPermissionEnforcement allows only with this.
- apiGroups: ["agentbox.dev"]
  resources: ["sandboxpools/finalizers"]
  verbs: ["update"]
# SandboxSnapshots: watched by the snapshot controller, listed to pick a restore (Latest) and apply retention; created for onStop, labelled and finalized by patch, deleted by retention.
- apiGroups: ["agentbox.dev"]
  resources: ["sandboxsnapshots"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# SandboxSnapshot status: phase, object key, digest and size are written to the status subresource.
- apiGroups: ["agentbox.dev"]
  resources: ["sandboxsnapshots/status"]
  verbs: ["patch"]
# Pods: the sandbox pod, a pool's warm pods (created, marked ready by patch, deleted) and the node-bound helper pods (workspace removal, namespace directory preparation, the workspace sweep's listing and removal); watched, listed, created or server-side applied, deleted.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# pods/exec: workspace probe/init (also a warm pod's), snapshots and restores exec sh/tar in the sandbox container (a WebSocket GET, also authorized as create since 1.30).
- apiGroups: [""]
  resources: ["pods/exec"]
  verbs: ["get", "create"]
# pods/log: the last line of a limited workspace's workspace-usage sidecar (agentbox's helper), for status.workspace.usedBytes.
- apiGroups: [""]
  resources: ["pods/log"]
  verbs: ["get"]
# NetworkPolicies: the deny-all-egress policy of a sandbox with network.egress None; watched, server-side applied, deleted.
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Services: the Service of a sandbox with spec.ports, selecting only its pod; read by name, server-side applied, deleted when the ports go away (the Sandbox's owner reference removes it with the Sandbox).
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "create", "patch", "delete"]
# ConfigMaps: read by name (no list/watch) as sources of workspace files, projections and env values named in a Sandbox spec; used only when labelled agentbox.dev/sandbox-readable=true.
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get"]
# Secrets: read by name (no list/watch) as sources of workspace files and env values named in a Sandbox spec, used only when labelled agentbox.dev/sandbox-readable=true; and the credentials of network.allow domain entries (sent only by the egress proxy, only to the domains the Secret's annotation agentbox.dev/credential-domains lists).
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get"]
# Leases: per-scope guards; watched for the Guarded condition, taken (create/conditional update) around snapshots and restores, deleted with a scope's last sandbox.
- apiGroups: ["coordination.k8s.io"]
  resources: ["leases"]
  verbs: ["get", "list", "watch", "create", "update", "delete"]
# Namespaces: get only (in a Role: its own namespace only), read when a Sandbox names a snapshot of another scope, for the annotation agentbox.dev/allow-cross-scope-restore; and, watching every namespace, by the workspace sweep, to tell a deleted namespace's directory on a node from a live one's.
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["get"]
# Events: what the operator did and why, on each Sandbox (created, then patched when an event repeats as a series).
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end }}

{{- /* What a harness calls in its namespace, and no more: the Rust client (agentbox_client::client), the
       Python SDK and the CLI (tests/rbac.rs runs both SDKs with exactly these rules). Used by the
       harness Role (harness.namespaces) and by the `helm test` pod's Role. */}}
{{- define "agentbox.harnessRules" }}
# Sandboxes: create-or-get by scope (create, then get on a conflict), list by scope labels, wait for Ready (watch), suspend/resume (patch), delete and re-create for a restore.
- apiGroups: ["agentbox.dev"]
  resources: ["sandboxes"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# SandboxTemplates: read-only; list the namespace's templates (the CLI's `get templates`) and read the one a sandbox is created from.
- apiGroups: ["agentbox.dev"]
  resources: ["sandboxtemplates"]
  verbs: ["get", "list"]
# SandboxPools: read-only; list the namespace's pools (the CLI's `pools`, the SDKs' `pools()`).
- apiGroups: ["agentbox.dev"]
  resources: ["sandboxpools"]
  verbs: ["get", "list"]
# SandboxSnapshots: take one (create), wait until it is Ready (watch), list a scope's lineage, read one to restore from it.
- apiGroups: ["agentbox.dev"]
  resources: ["sandboxsnapshots"]
  verbs: ["get", "list", "watch", "create"]
# pods/exec: every command, file transfer and persistent shell runs over exec in the sandbox pod (a WebSocket GET: authorized as get, and since 1.30 also as create).
- apiGroups: [""]
  resources: ["pods/exec"]
  verbs: ["get", "create"]
# Leases: the scope's execution guard; acquire (create, or take over an expired one with a conditional update), queue for it, renew and release (update), and learn of a release by watching the one Lease (without watch, a waiter polls).
- apiGroups: ["coordination.k8s.io"]
  resources: ["leases"]
  verbs: ["get", "watch", "create", "update"]
{{- end }}
