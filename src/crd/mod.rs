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

#[cfg(test)]
mod tests {
    #[test]
    fn committed_crds_match_the_types() {
        let committed = include_str!("../../crds/agentbox.yaml");
        let generated = super::render_yaml().expect("render CRDs");
        assert!(
            committed == generated,
            "crds/agentbox.yaml is stale: run `cargo run --bin crdgen > crds/agentbox.yaml`"
        );
    }

    #[test]
    fn scope_rules_evaluate_as_intended() {
        use crate::crd::Scope;
        use serde_json::json;
        let ok = |v: serde_json::Value| Scope::validate_cel(&v, None);
        assert!(ok(json!({"kind": "User", "agent": "a", "user": "u"})).is_ok());
        assert!(ok(json!({"kind": "Global"})).is_ok());
        assert!(ok(json!({"kind": "Session", "agent": "a"})).is_err());
        assert!(ok(json!({"kind": "User", "agent": "a", "user": "u", "session": "s"})).is_err());
        assert!(ok(json!({"kind": "Global", "agent": "a"})).is_err());
        assert!(ok(json!({"kind": "Agent"})).is_err());
    }
}
