//! Helper pods the operator runs one job in by `exec` (a snapshot's archive pod, a restore's
//! extract pod): made (a leftover of an earlier attempt replaced, since its process may have
//! been mid-job), waited for until it runs, and deleted when the job ends, however it ends.
//! Their specs are [`super::helper_pod`]'s.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PostParams};
use tracing::warn;

/// Makes `pod` (replacing a leftover of the same name once) and waits, up to `within` each,
/// for the leftover to go and for the pod to run. The error says what failed, in words.
pub async fn start(pods: &Api<Pod>, pod: &Pod, within: Duration) -> Result<(), String> {
    let name = pod.name_any();
    let mut replaced = false;
    loop {
        match pods.create(&PostParams::default(), pod).await {
            Ok(_) => break,
            Err(kube::Error::Api(s)) if s.code == 409 && !replaced => {
                // An earlier attempt's, left by an operator that stopped: its process may be
                // mid-job. Removed, then made again.
                let _ = pods.delete(&name, &now()).await;
                let deleted =
                    kube::runtime::wait::await_condition(pods.clone(), &name, |p: Option<&Pod>| {
                        p.is_none()
                    });
                let _ = tokio::time::timeout(within, deleted).await;
                replaced = true;
            }
            Err(e) => return Err(format!("creating the helper pod {name}: {e}")),
        }
    }
    let started = |p: Option<&Pod>| {
        let phase = p.and_then(|p| p.status.as_ref()?.phase.as_deref());
        matches!(phase, Some("Running" | "Succeeded" | "Failed"))
    };
    let waited = tokio::time::timeout(
        within,
        kube::runtime::wait::await_condition(pods.clone(), &name, started),
    )
    .await;
    let pod = match waited {
        Err(_) => {
            return Err(format!(
                "the helper pod {name} did not start within {}s",
                within.as_secs()
            ));
        }
        Ok(Err(e)) => return Err(format!("watching {name}: {e}")),
        Ok(Ok(p)) => p,
    };
    let phase = pod
        .as_ref()
        .and_then(|p| p.status.as_ref()?.phase.clone())
        .unwrap_or_default();
    if phase != "Running" {
        return Err(format!(
            "the helper pod {name} ended before it was used ({phase})"
        ));
    }
    Ok(())
}

/// Deletes the helper pod `name` at once (its job is over or abandoned); a failure is logged:
/// the pod's own hold ends it anyway, and its owner's deletion takes it.
pub async fn delete(pods: &Api<Pod>, name: &str) {
    match pods.delete(name, &now()).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => warn!(pod = %name, "deleting the helper pod: {e}"),
    }
}

fn now() -> DeleteParams {
    DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    }
}
