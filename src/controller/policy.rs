//! Applying the egress NetworkPolicies the operator keeps (a sandbox's own, a template's),
//! shared by the sandbox and pool controllers; their builders are in [`super::pod`].

use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams};

use super::context::{Error, FIELD_MANAGER};
use super::pod::SPEC_HASH;

/// Applies `desired` as policy `name` (or deletes it when `None`), comparing with `current` by
/// the hash of what was asked for: the API server drops empty lists (`egress: []`), so the
/// stored spec never equals the desired one field by field.
pub async fn apply(
    api: &Api<NetworkPolicy>,
    name: &str,
    desired: Option<NetworkPolicy>,
    current: Option<&NetworkPolicy>,
) -> Result<(), Error> {
    match (desired, current) {
        (Some(d), Some(np))
            if np.annotations().get(SPEC_HASH) == d.annotations().get(SPEC_HASH) =>
        {
            Ok(())
        }
        (Some(d), _) => {
            api.patch(
                name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&d),
            )
            .await?;
            Ok(())
        }
        (None, Some(_)) => match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
            Err(e) => Err(e.into()),
        },
        (None, None) => Ok(()),
    }
}

/// Policy `name` of namespace `ns` as the operator's watch cache has it (the API server's
/// when no cache runs).
pub async fn current(
    ctx: &super::context::Context,
    api: &Api<NetworkPolicy>,
    ns: &str,
    name: &str,
) -> Result<Option<NetworkPolicy>, Error> {
    match ctx.cache.as_ref() {
        Some(cache) => Ok(super::cache::get(&cache.policies, "NetworkPolicies", ns, name).await?),
        None => Ok(api.get_opt(name).await?),
    }
}
