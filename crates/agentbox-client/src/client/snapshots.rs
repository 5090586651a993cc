//! Snapshots from the harness side: take one of a sandbox and wait for it, and create a new
//! sandbox restored from a named snapshot.

use std::time::Duration;

use kube::api::{Api, ObjectMeta, PostParams};

use super::{ClientError, SandboxHandle, Sandboxes};
use agentbox_api::crd::{
    DeletionPolicy, GuardHold, RestorePolicy, Sandbox, SandboxRef, SandboxSnapshot,
    SandboxSnapshotSpec, SandboxSpec, SnapshotPhase,
};
use agentbox_api::guard::Guard;
use agentbox_api::labels;

fn phase(s: &SandboxSnapshot) -> Option<SnapshotPhase> {
    s.status.as_ref().and_then(|st| st.phase)
}

impl SandboxHandle {
    /// Asks the operator for a snapshot of this sandbox's workspace: a new SandboxSnapshot
    /// named `name`, or `<sandbox>-<random>` when `None`. Returns it as created (Pending); see
    /// [`Sandboxes::wait_snapshot`].
    pub async fn snapshot(
        &self,
        name: Option<&str>,
        deletion_policy: DeletionPolicy,
    ) -> Result<SandboxSnapshot, ClientError> {
        self.create_snapshot(name, deletion_policy, None).await
    }

    /// As [`snapshot`](Self::snapshot), taken under `guard`, the scope's guard the caller
    /// holds and keeps until the snapshot is Ready or Failed: the operator checks that hold
    /// instead of taking the guard, so nothing works in the scope between the caller's last
    /// command and the snapshot (it fails with the reason `GuardNotHeld` when the hold is gone
    /// before it starts).
    pub async fn snapshot_under(
        &self,
        name: Option<&str>,
        deletion_policy: DeletionPolicy,
        guard: &Guard,
    ) -> Result<SandboxSnapshot, ClientError> {
        let hold = self.hold_of(guard)?;
        self.create_snapshot(name, deletion_policy, Some(hold))
            .await
    }

    async fn create_snapshot(
        &self,
        name: Option<&str>,
        deletion_policy: DeletionPolicy,
        guard: Option<GuardHold>,
    ) -> Result<SandboxSnapshot, ClientError> {
        let snaps: Api<SandboxSnapshot> = Api::namespaced(self.client.clone(), &self.namespace);
        let mut meta = ObjectMeta {
            labels: Some(labels::scope_labels(&self.sandbox.spec.scope)),
            ..Default::default()
        };
        match name {
            Some(n) => meta.name = Some(n.to_string()),
            None => meta.generate_name = Some(format!("{}-", self.name)),
        }
        let obj = SandboxSnapshot {
            metadata: meta,
            spec: SandboxSnapshotSpec {
                sandbox_ref: SandboxRef {
                    name: self.name.clone(),
                },
                deletion_policy,
                guard,
            },
            status: None,
        };
        Ok(snaps.create(&PostParams::default(), &obj).await?)
    }
}

impl Sandboxes {
    /// Gets a SandboxSnapshot by name.
    pub async fn get_snapshot(&self, name: &str) -> Result<SandboxSnapshot, ClientError> {
        let snaps: Api<SandboxSnapshot> = Api::namespaced(self.client.clone(), &self.namespace);
        snaps.get_opt(name).await?.ok_or_else(|| {
            ClientError::NotFound(format!("sandboxsnapshot {}/{name}", self.namespace))
        })
    }

    /// Waits (with a watch) until the snapshot is Ready; fails at once with its condition's
    /// reason when it fails.
    pub async fn wait_snapshot(
        &self,
        name: &str,
        timeout: Duration,
    ) -> Result<SandboxSnapshot, ClientError> {
        let snaps: Api<SandboxSnapshot> = Api::namespaced(self.client.clone(), &self.namespace);
        let done = |s: Option<&SandboxSnapshot>| {
            s.is_none_or(|s| matches!(phase(s), Some(SnapshotPhase::Ready | SnapshotPhase::Failed)))
        };
        let snap =
            match tokio::time::timeout(timeout, super::watch::until(snaps.clone(), name, done))
                .await
            {
                Ok(Ok(Some(s))) => s,
                Ok(Ok(None)) => {
                    return Err(ClientError::NotFound(format!("sandboxsnapshot {name}")));
                }
                Ok(Err(e)) => return Err(ClientError::Protocol(format!("watching {name}: {e}"))),
                Err(_) => {
                    let last = snaps.get_opt(name).await.ok().flatten();
                    let phase = last
                        .as_ref()
                        .and_then(phase)
                        .map(|p| format!("{p:?}"))
                        .unwrap_or_else(|| "Pending".into());
                    let conds = last
                        .as_ref()
                        .and_then(|s| s.status.as_ref())
                        .map_or(&[][..], |s| &s.conditions[..]);
                    return Err(ClientError::not_ready(name, timeout, phase, conds));
                }
            };
        if phase(&snap) == Some(SnapshotPhase::Ready) {
            return Ok(snap);
        }
        Err(ClientError::failed(
            name,
            snap.status.as_ref().map_or(&[][..], |s| &s.conditions),
        ))
    }

    /// Creates Sandbox `name` from `spec`, its workspace restored from the Ready snapshot
    /// `snapshot` (`snapshot.restore: Named`). The name is the spec's scope's deterministic
    /// name when `None`. Fails with the API's 409 if the name is taken.
    pub async fn create_restored(
        &self,
        name: Option<&str>,
        mut spec: SandboxSpec,
        snapshot: &str,
    ) -> Result<SandboxHandle, ClientError> {
        let snap = self.get_snapshot(snapshot).await?;
        if phase(&snap) != Some(SnapshotPhase::Ready) {
            let conds = snap.status.as_ref().map_or(&[][..], |s| &s.conditions[..]);
            let phase = phase(&snap)
                .map(|p| format!("{p:?}"))
                .unwrap_or_else(|| "Pending".into());
            return Err(ClientError::not_ready(
                snapshot,
                Duration::ZERO,
                phase,
                conds,
            ));
        }
        spec.snapshot.restore = RestorePolicy::Named;
        spec.snapshot.name = Some(snapshot.to_string());
        let scope = spec.scope.clone();
        let name = name
            .map(str::to_string)
            .unwrap_or_else(|| labels::sandbox_name_for_scope(&scope));
        let obj = Sandbox {
            metadata: ObjectMeta {
                name: Some(name),
                labels: Some(labels::scope_labels(&scope)),
                annotations: Some(labels::scope_annotations(&scope)).filter(|a| !a.is_empty()),
                ..Default::default()
            },
            spec,
            status: None,
        };
        let created = self.api.create(&PostParams::default(), &obj).await?;
        Ok(self.handle(created))
    }
}
