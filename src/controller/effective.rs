//! A Sandbox as the controllers work on it: with `spec.templateRef`, its spec resolved against
//! the SandboxTemplate as it is now ([`agentbox_api::template::resolve`]); which template version a
//! pod was made from is recorded in `status.template` by the sandbox controller.

use kube::api::Api;
use kube::{Client, ResourceExt};

use crate::controller::context::{Context, Error};
use agentbox_api::crd::{Sandbox, SandboxTemplate, TemplateUse};

/// The reason a Sandbox waits for its template.
pub const NOT_FOUND: &str = "TemplateNotFound";

/// What a Sandbox's spec resolves to.
#[derive(Clone, Debug)]
pub enum Effective {
    /// No `templateRef`: the Sandbox's own spec.
    Own,
    /// The Sandbox with its spec resolved, and the template version used.
    Templated(Box<Sandbox>, TemplateUse),
    /// The template it names does not exist (its name).
    Missing(String),
}

/// Resolves `sbx` against the template it names, read from the API server.
pub async fn effective(client: &Client, sbx: &Sandbox) -> Result<Effective, Error> {
    let Some(r) = sbx.spec.template_ref.as_ref() else {
        return Ok(Effective::Own);
    };
    let ns = sbx.namespace().ok_or(Error::NotNamespaced)?;
    let api: Api<SandboxTemplate> = Api::namespaced(client.clone(), &ns);
    Ok(match api.get_opt(&r.name).await? {
        None => Effective::Missing(r.name.clone()),
        Some(t) => resolve(sbx, &r.name, &t),
    })
}

/// Resolves `sbx` against the template it names, read from the operator's template cache
/// ([`super::cache`]) when it has one; a template the cache does not hold is read from the API
/// server before the sandbox is told it is missing (created a moment ago, the watch may not
/// have brought it yet).
pub async fn effective_cached(ctx: &Context, sbx: &Sandbox) -> Result<Effective, Error> {
    let (Some(cache), Some(r)) = (ctx.cache.as_ref(), sbx.spec.template_ref.as_ref()) else {
        return effective(&ctx.client, sbx).await;
    };
    let ns = sbx.namespace().ok_or(Error::NotNamespaced)?;
    match super::cache::get(&cache.templates, "SandboxTemplates", &ns, &r.name).await? {
        Some(t) => Ok(resolve(sbx, &r.name, &t)),
        None => effective(&ctx.client, sbx).await,
    }
}

/// `sbx` resolved against template `t` (named `name`).
fn resolve(sbx: &Sandbox, name: &str, t: &SandboxTemplate) -> Effective {
    let used = TemplateUse {
        name: name.to_string(),
        uid: t.uid().unwrap_or_default(),
        generation: t.metadata.generation.unwrap_or_default(),
    };
    let mut resolved = sbx.clone();
    resolved.spec = agentbox_api::template::resolve(&t.spec, &sbx.spec);
    Effective::Templated(Box::new(resolved), used)
}

/// `sbx` resolved when its template exists, else as it is (what the deleting and snapshot
/// paths use: a template deleted meanwhile must not block them).
pub async fn resolved_or_own(client: &Client, sbx: &Sandbox) -> Result<Sandbox, Error> {
    Ok(match effective(client, sbx).await? {
        Effective::Templated(s, _) => *s,
        Effective::Own | Effective::Missing(_) => sbx.clone(),
    })
}

/// The message of a Sandbox waiting for template `name`.
pub fn missing_message(name: &str) -> String {
    format!(
        "SandboxTemplate {name} not found in the sandbox's namespace; the sandbox starts when it is created"
    )
}
