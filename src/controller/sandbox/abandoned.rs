//! Workspace directories left on lost nodes (`status.abandoned`): each is removed by a cleanup
//! helper pod bound to its node once that node is Ready again — never before, since a pod
//! bound to a node that is down does not run, and never served meanwhile, since the sandbox's
//! pod runs elsewhere. The record lives in the status, so the cleanup survives an operator
//! restart. The stale pod itself was force-deleted at the loss: a returning kubelet stops
//! its containers, as it does for every pod the API no longer has.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use tracing::info;

use super::{Apis, delete_if_present};
use crate::controller::context::{Context, Error, FIELD_MANAGER};
use crate::controller::helper_pod;
use crate::controller::nodeloss;
use crate::controller::placement;
use crate::controller::pod::PodConfig;
use agentbox_api::crd::{Sandbox, SandboxStatus};

/// How often to look at a lost node that has not come back.
const NODE_DOWN_RETRY: Duration = Duration::from_secs(15);
/// How often to look at a running cleanup pod (its completion does not wake the sandbox).
const CLEANUP_RETRY: Duration = Duration::from_secs(2);

/// Works on every entry of `st.abandoned`: removed from it when its directory is gone (or its
/// node is, or — while `deleting` — its node is still down: the deletion does not wait for a
/// node that may never return, and says so in a Warning Event). Returns when to look again
/// while entries remain.
pub async fn sweep(
    sbx: &Sandbox,
    ctx: &Context,
    apis: &Apis,
    st: &mut SandboxStatus,
    deleting: bool,
) -> Result<Option<Duration>, Error> {
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let mut again: Option<Duration> = None;
    let mut sooner = |d: Duration| again = Some(again.map_or(d, |a: Duration| a.min(d)));
    let mut kept = Vec::new();
    // `st.abandoned` is replaced only when every entry had its turn: an error leaves it whole.
    for entry in st.abandoned.clone() {
        let (node, dir) = (entry.node.as_str(), entry.directory.as_str());
        let warn = |msg: String| async move {
            crate::controller::context::publish(
                ctx,
                sbx,
                EventType::Warning,
                "AbandonedWorkspaceKept",
                "DeleteWorkspace",
                &msg,
            )
            .await;
        };
        let Some(n) = nodes.get_opt(node).await? else {
            warn(format!(
                "node {node} is gone; the workspace directory {dir} left there cannot be removed"
            ))
            .await;
            continue;
        };
        if !nodeloss::is_serving(&n) {
            if deleting {
                warn(format!(
                    "node {node} is still down; the workspace directory {dir} left there is not removed"
                ))
                .await;
            } else {
                sooner(NODE_DOWN_RETRY);
                kept.push(entry);
            }
            continue;
        }
        let name = helper_pod::abandoned_cleanup_pod_name(sbx, node);
        match remove_directory(sbx, ctx, apis, (node, dir), name).await? {
            Removal::Done => {
                info!(node, dir, "workspace directory left on a lost node removed");
                crate::controller::context::publish(
                    ctx,
                    sbx,
                    EventType::Normal,
                    "AbandonedWorkspaceRemoved",
                    "DeleteWorkspace",
                    &format!(
                        "node {node} is back; the workspace directory {dir} left there was removed"
                    ),
                )
                .await;
            }
            Removal::Pending => {
                sooner(CLEANUP_RETRY);
                kept.push(entry);
            }
            Removal::NotOurs => {
                warn(format!(
                    "the directory {dir} recorded on node {node} is not a workspace directory of this namespace; it is not removed"
                ))
                .await;
            }
            Removal::NoHelper => {
                warn(format!(
                    "the workspace directory {dir} left on node {node} cannot be removed: this operator has no helper image (--helper-image); remove it by hand"
                ))
                .await;
            }
        }
    }
    st.abandoned = kept;
    Ok(again)
}

/// How far the removal of a workspace directory from a node got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Removal {
    /// Removed; the cleanup pod is gone too.
    Done,
    /// The cleanup pod is on its way or running.
    Pending,
    /// This operator has no helper image to remove it with.
    NoHelper,
    /// The directory is not an entry of the namespace's workspace directory: not the
    /// operator's to remove.
    NotOurs,
}

/// Removes this sandbox's workspace directory on `node` with the cleanup pod `name` bound
/// there: started when absent, deleted once it has succeeded (Done), replaced when it failed
/// (the error says so, with a Warning Event).
async fn remove_directory(
    sbx: &Sandbox,
    ctx: &Context,
    apis: &Apis,
    (node, dir): (&str, &str),
    name: String,
) -> Result<Removal, Error> {
    let (ns, sandbox) = (sbx.namespace().unwrap_or_default(), sbx.name_any());
    let podcfg = PodConfig::from_config(&ctx.config);
    match apis.pods.get_opt(&name).await? {
        None => {
            // Only an entry of the namespace's directory is the operator's to remove.
            let Some(entry) = placement::dir_name(dir, podcfg.node_root, &ns) else {
                return Ok(Removal::NotOurs);
            };
            let Some(desired) =
                helper_pod::build_cleanup_pod(sbx, &podcfg, (node, entry), name.clone())
            else {
                return Ok(Removal::NoHelper);
            };
            apis.pods
                .patch(
                    &name,
                    &PatchParams::apply(FIELD_MANAGER).force(),
                    &Patch::Apply(&desired),
                )
                .await?;
            Ok(Removal::Pending)
        }
        Some(p) => match p.status.as_ref().and_then(|s| s.phase.as_deref()) {
            Some("Succeeded") => {
                delete_if_present(&apis.pods, &name).await?;
                info!(sandbox = %sandbox, namespace = %ns, node = %node, "workspace removed");
                Ok(Removal::Done)
            }
            Some("Failed") => {
                let msg = format!("removing the workspace on node {node} failed; retrying");
                crate::controller::context::publish(
                    ctx,
                    sbx,
                    EventType::Warning,
                    "WorkspaceCleanupFailed",
                    "DeleteWorkspace",
                    &msg,
                )
                .await;
                delete_if_present(&apis.pods, &name).await?;
                Err(Error::Cleanup(msg))
            }
            _ => Ok(Removal::Pending),
        },
    }
}
