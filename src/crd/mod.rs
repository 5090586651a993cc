//! Custom resources of the `agentbox.dev/v1alpha1` API group.
//!
//! Every field carries a doc comment: schemars turns them into the OpenAPI descriptions that
//! `kubectl explain` shows. CEL rules (`x_kube(validation = ...)`) make the API server refuse
//! bad specs at admission, so most mistakes never reach the controller.

mod sandbox;
mod snapshot;

pub use sandbox::*;
pub use snapshot::*;

/// The API group of every agentbox resource.
pub const GROUP: &str = "agentbox.dev";
/// The served and stored version.
pub const VERSION: &str = "v1alpha1";

/// All CRDs this operator serves, in the order `crdgen` writes them.
pub fn all()
-> Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>
{
    use kube::CustomResourceExt;
    vec![Sandbox::crd(), SandboxSnapshot::crd()]
}

/// Renders every CRD as one multi-document YAML stream (what `crdgen` prints and `crds/` holds).
pub fn render_yaml() -> Result<String, serde_yaml::Error> {
    let mut out = String::new();
    for crd in all() {
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(&crd)?);
    }
    Ok(out)
}
