//! What the spec exposes, made so before every step but a refusal and a shutdown: the egress
//! policy over the sandbox's pod and the Service of `spec.ports` (where each port is reached
//! is in the planned status).

use kube::ResourceExt;
use tracing::debug;

use super::observe::World;
use super::service;
use super::tools::Tools;
use crate::controller::context::Error;
use crate::controller::{pod, policy};
use agentbox_api::crd::Sandbox;
use agentbox_api::labels;

/// Makes the egress policy and the Service what the spec asks for.
pub(super) async fn expose(h: &Tools<'_>, sbx: &Sandbox, world: &World) -> Result<(), Error> {
    ensure_network_policy(h, sbx, world).await?;
    if service::ensure(&h.apis.services, sbx, &world.old).await? > 0 {
        debug!(sandbox = %sbx.name_any(), "applied the Service of spec.ports");
    }
    Ok(())
}

/// Makes the egress policy over the sandbox's pod what its (resolved) spec asks for: its own
/// policy, or for a templated sandbox its template's (shared by the template's pods, so a
/// claim of a warm pod finds it in place); removed for egress `All`. Writes nothing when it
/// is already as wanted, so an edit of `network` applies on the next reconcile, without a
/// restart.
async fn ensure_network_policy(h: &Tools<'_>, sbx: &Sandbox, world: &World) -> Result<(), Error> {
    let default = h.podcfg.default_egress;
    let proxy = h.podcfg.proxy.as_ref();
    let (name, desired) = match (sbx.spec.template_ref.as_ref(), world.template.as_ref()) {
        (Some(t), Some(used)) => (
            labels::template_policy_name(&t.name),
            pod::build_template_policy(used, sbx.namespace(), &sbx.spec, default, proxy),
        ),
        _ => (
            labels::network_policy_name(&sbx.name_any()),
            pod::build_egress_policy(sbx, default, proxy),
        ),
    };
    policy::apply(&h.apis.policies, &name, desired, world.policy.as_ref()).await
}
