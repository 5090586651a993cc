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

    /// Every reference to another object is refused at admission unless it is an object name
    /// (the CRD's own CEL rules, evaluated as the API server would).
    #[test]
    fn references_are_names_at_admission() {
        use kube::CustomResourceExt;
        use serde_json::json;
        let schema = |crd: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition| {
            serde_json::to_value(
                crd.spec.versions[0]
                    .schema
                    .as_ref()
                    .and_then(|s| s.open_api_v3_schema.as_ref())
                    .unwrap(),
            )
            .unwrap()
        };
        let v = kube::core::cel::Validator::new();
        let sbx = schema(crate::crd::Sandbox::crd());
        let with = |extra: serde_json::Value| {
            let mut spec = json!({"image": "i", "scope": {"kind": "Global"}});
            for (k, val) in extra.as_object().unwrap() {
                spec[k] = val.clone();
            }
            json!({"apiVersion": "agentbox.dev/v1alpha1", "kind": "Sandbox",
                   "metadata": {"name": "s"}, "spec": spec})
        };
        let ok = with(json!({
            "runtimeClassName": "gvisor",
            "snapshot": {"restore": "Named", "name": "snap-1"},
            "workspace": {
                "files": [{"path": "f", "contentFrom": {"secretKeyRef": {"name": "tok", "key": "v.json"}}}],
                "projections": [{"configMap": "tools", "path": "t"}]}
        }));
        assert!(
            v.validate(&sbx, &ok, None).is_ok(),
            "{:?}",
            v.validate(&sbx, &ok, None)
        );
        for bad in [
            json!({"runtimeClassName": "../x"}),
            json!({"snapshot": {"restore": "Named", "name": "../../secrets/x"}}),
            json!({"workspace": {"files": [{"path": "f", "contentFrom": {"configMapKeyRef": {"name": "a/b", "key": "k"}}}]}}),
            json!({"workspace": {"files": [{"path": "f", "contentFrom": {"secretKeyRef": {"name": "a", "key": "../k"}}}]}}),
            json!({"workspace": {"projections": [{"configMap": "Tools?x=1", "path": "t"}]}}),
            json!({"securityContext": {"runAsNonRoot": true, "runAsUser": 0}}),
        ] {
            let obj = with(bad.clone());
            assert!(v.validate(&sbx, &obj, None).is_err(), "accepted: {bad}");
        }
        let snap = schema(crate::crd::SandboxSnapshot::crd());
        let s = |name: &str| {
            json!({"apiVersion": "agentbox.dev/v1alpha1", "kind": "SandboxSnapshot",
                   "metadata": {"name": "x"}, "spec": {"sandboxRef": {"name": name}}})
        };
        assert!(v.validate(&snap, &s("demo"), None).is_ok());
        let err = v.validate(&snap, &s("../demo"), None).unwrap_err();
        assert!(
            format!("{err:?}").contains("must be a Kubernetes object name"),
            "{err:?}"
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

    /// `spec.ports` carries the rules on the list itself; a holder type with the same rules
    /// lets them be evaluated here as the API server will.
    #[derive(kube::KubeSchema, serde::Serialize, serde::Deserialize)]
    #[x_kube(cel)]
    struct PortsHolder {
        #[x_kube(validation = crate::crd::unique_port_names(), validation = crate::crd::unique_port_numbers())]
        ports: Vec<crate::crd::SandboxPort>,
    }

    #[test]
    fn duplicate_ports_are_refused_with_a_message_naming_the_duplicate() {
        use serde_json::json;
        let check = |ports: serde_json::Value| {
            PortsHolder::validate_cel(&json!({ "ports": ports }), None).map_err(|e| e.to_string())
        };
        assert!(
            check(json!([
                {"name": "http", "port": 80, "protocol": "TCP"},
                {"name": "dns", "port": 53, "protocol": "UDP"},
                {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
            ]))
            .is_ok()
        );
        let err = check(json!([
            {"name": "web", "port": 80, "protocol": "TCP"},
            {"name": "web", "port": 81, "protocol": "TCP"},
        ]))
        .expect_err("duplicate name");
        assert!(
            err.contains("port names must be unique: web appears more than once"),
            "{err}"
        );
        let err = check(json!([
            {"name": "a", "port": 8080, "protocol": "TCP"},
            {"name": "b", "port": 8080, "protocol": "TCP"},
        ]))
        .expect_err("duplicate number");
        assert!(
            err.contains("port numbers must be unique per protocol"),
            "{err}"
        );
    }
}
