//! Workspace directories left on lost nodes (`status.abandoned`): each is removed by a cleanup
//! helper pod bound to its node once that node is Ready again — never before, since a pod
//! bound to a node that is down does not run, and never served meanwhile, since the sandbox's
//! pod runs elsewhere. The record lives in the status, so the cleanup survives an operator
//! restart. The stale pod itself was force-deleted at the loss: a returning kubelet stops
//! its containers, as it does for every pod the API no longer has.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::runtime::events::EventType;
use tracing::info;

use super::Apis;
use super::cleanup::{Removal, remove_directory};
use crate::controller::nodeloss;
use crate::controller::pod;
use crate::controller::{Context, Error};
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
            crate::controller::publish(
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
        let name = pod::abandoned_cleanup_pod_name(sbx, node);
        match remove_directory(sbx, ctx, apis, (node, dir), name).await? {
            Removal::Done => {
                info!(node, dir, "workspace directory left on a lost node removed");
                crate::controller::publish(
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
