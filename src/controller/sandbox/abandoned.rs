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

use super::write::{Apis, delete_if_present};
use crate::controller::context::{Context, Error, FIELD_MANAGER};
use crate::controller::helper_pod;
use crate::controller::nodeloss;
use crate::controller::placement::{self, NodeDir};
use crate::controller::pod::PodConfig;
use agentbox_api::crd::{AbandonedWorkspace, Sandbox, SandboxStatus};

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
    let mut again: Option<Duration> = None;
    let mut kept = Vec::new();
    // `st.abandoned` is replaced only when every entry had its turn: an error leaves it whole.
    for entry in st.abandoned.clone() {
        if let Some(d) = sweep_one(sbx, ctx, apis, &entry, deleting).await? {
            again = Some(again.map_or(d, |a: Duration| a.min(d)));
            kept.push(entry);
        }
    }
    st.abandoned = kept;
    Ok(again)
}

/// Works on one entry of `status.abandoned` ([`sweep`]): when to look at it again if it stays.
async fn sweep_one(
    sbx: &Sandbox,
    ctx: &Context,
    apis: &Apis,
    entry: &AbandonedWorkspace,
    deleting: bool,
) -> Result<Option<Duration>, Error> {
    let (node, dir) = (entry.node.as_str(), entry.directory.as_str());
    let publish = |type_, reason: &'static str, msg: String| async move {
        crate::controller::context::publish(ctx, sbx, type_, reason, "DeleteWorkspace", &msg).await;
    };
    let warn = |msg: String| publish(EventType::Warning, "AbandonedWorkspaceKept", msg);
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let Some(n) = nodes.get_opt(node).await? else {
        warn(format!(
            "node {node} is gone; the workspace directory {dir} left there cannot be removed"
        ))
        .await;
        return Ok(None);
    };
    if !nodeloss::is_serving(&n) {
        if !deleting {
            return Ok(Some(NODE_DOWN_RETRY));
        }
        warn(format!(
            "node {node} is still down; the workspace directory {dir} left there is not removed"
        ))
        .await;
        return Ok(None);
    }
    let name = helper_pod::abandoned_cleanup_pod_name(sbx, node);
    match remove_directory(sbx, ctx, apis, NodeDir { node, dir }, name).await? {
        Removal::Done => {
            info!(node, dir, "workspace directory left on a lost node removed");
            let msg = format!(
                "node {node} is back; the workspace directory {dir} left there was removed"
            );
            publish(EventType::Normal, "AbandonedWorkspaceRemoved", msg).await;
        }
        Removal::Pending => return Ok(Some(CLEANUP_RETRY)),
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
    Ok(None)
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
    at: NodeDir<'_>,
    name: String,
) -> Result<Removal, Error> {
    let (node, dir) = (at.node, at.dir);
    let (ns, sandbox) = (sbx.namespace().unwrap_or_default(), sbx.name_any());
    let podcfg = PodConfig::from_config(&ctx.config);
    match apis.pods.get_opt(&name).await? {
        None => {
            // Only an entry of the namespace's directory is the operator's to remove.
            let Some(entry) = placement::dir_name(dir, podcfg.node_root, &ns) else {
                return Ok(Removal::NotOurs);
            };
            let Some(desired) = helper_pod::build_cleanup_pod(
                sbx,
                &podcfg,
                NodeDir { node, dir: entry },
                name.clone(),
            ) else {
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
