//! The `spec.snapshot.onStop` hook the sandbox controller calls before a sandbox's pod goes.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use tracing::{info, warn};

use crate::controller::context::{Context, Error};
use crate::controller::podstate;
use agentbox_api::crd::{
    DeletionPolicy, GuardHold, Sandbox, SandboxRef, SandboxSnapshot, SandboxSnapshotSpec,
    SnapshotPhase,
};
use agentbox_api::labels;

/// Label on snapshots taken by `spec.snapshot.onStop`.
pub const ON_STOP: &str = "agentbox.dev/on-stop";

/// Outcome of [`on_stop`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnStop {
    /// Nothing (more) to wait for: proceed with the suspend or delete.
    Proceed,
    /// A snapshot is being taken: look again shortly.
    Wait,
}

/// How long a stop waits for its snapshot before going ahead without it.
const ON_STOP_PATIENCE: Duration = Duration::from_secs(600);

/// The `spec.snapshot.onStop` hook, called before a sandbox's pod is deleted for a suspend or
/// a delete: creates (once per pod) a SandboxSnapshot of the running workspace and reports
/// whether to wait for it. A failed snapshot does not block the stop (a Warning Event says so).
/// With `hold` (a harness's hold of the scope's guard that still stands), the snapshot is taken
/// under that hold instead of the operator's own guard, which the harness keeps meanwhile.
pub async fn on_stop(
    ctx: &Context,
    sbx: &Sandbox,
    hold: Option<GuardHold>,
) -> Result<OnStop, Error> {
    if !sbx.spec.snapshot.on_stop || ctx.store.is_none() {
        return Ok(OnStop::Proceed);
    }
    let ns = sbx.namespace().ok_or(Error::NotNamespaced)?;
    let st = sbx.status.clone().unwrap_or_default();
    let Some(pod_name) = st.pod_name.clone() else {
        return Ok(OnStop::Proceed);
    };
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let Some(pod) = pods.get_opt(&pod_name).await? else {
        return Ok(OnStop::Proceed);
    };
    let pod_uid = pod.uid().unwrap_or_default();
    // The same test the snapshot controller applies (see `serves_workspace`).
    if !podstate::serves_workspace(&st, &pod) {
        return Ok(OnStop::Proceed);
    }
    let api: Api<SandboxSnapshot> = Api::namespaced(ctx.client.clone(), &ns);
    let short: String = pod_uid.chars().filter(|c| *c != '-').take(10).collect();
    let name = labels::bounded_name(&format!("{}-stop-{short}", sbx.name_any()), 253);
    let snap = match api.get_opt(&name).await? {
        Some(s) => s,
        None => {
            let mut l: BTreeMap<String, String> = labels::scope_labels(&sbx.spec.scope);
            l.insert(
                labels::SANDBOX.into(),
                labels::sandbox_label_value(&sbx.name_any()),
            );
            l.insert(ON_STOP.into(), "true".into());
            let mut obj = SandboxSnapshot::new(
                &name,
                SandboxSnapshotSpec {
                    sandbox_ref: SandboxRef {
                        name: sbx.name_any(),
                    },
                    deletion_policy: DeletionPolicy::default(),
                    guard: hold,
                },
            );
            obj.metadata.labels = Some(l);
            obj.metadata.annotations = Some(labels::scope_annotations(&sbx.spec.scope));
            match api.create(&PostParams::default(), &obj).await {
                Ok(s) => {
                    info!(sandbox = %sbx.name_any(), snapshot = %name, "onStop: taking a snapshot before stopping");
                    s
                }
                Err(kube::Error::Api(s)) if s.code == 409 => return Ok(OnStop::Wait),
                Err(e) => return Err(e.into()),
            }
        }
    };
    match snap.status.as_ref().and_then(|s| s.phase) {
        Some(SnapshotPhase::Ready) => Ok(OnStop::Proceed),
        Some(SnapshotPhase::Failed) => {
            warn!(sandbox = %sbx.name_any(), snapshot = %name, "onStop snapshot failed; stopping without it");
            Ok(OnStop::Proceed)
        }
        _ => {
            let age = snap
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| Timestamp::now().duration_since(t.0).unsigned_abs())
                .unwrap_or_default();
            if age > ON_STOP_PATIENCE {
                warn!(sandbox = %sbx.name_any(), snapshot = %name, "onStop snapshot not done in time; stopping without it");
                Ok(OnStop::Proceed)
            } else {
                Ok(OnStop::Wait)
            }
        }
    }
}
