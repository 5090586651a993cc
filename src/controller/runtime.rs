//! The runtime class a sandbox's pod runs under, and a namespace's requirement of one (pure).
//!
//! A sandbox pod runs under its spec's `runtimeClassName` (its own or its template's), else
//! under the operator's `--default-runtime-class`, else under the node's default runtime (no
//! `runtimeClassName` on the pod). A namespace annotated [`REQUIRED_RUNTIME_CLASS`] takes only
//! sandboxes and pools whose pods would run under exactly that class: anything else is
//! refused before a pod exists (reason [`REFUSED`]), so code never runs in that namespace
//! under a weaker kernel boundary than the platform team asked for.

use k8s_openapi::api::core::v1::Namespace;
use kube::ResourceExt;

use agentbox_api::crd::SandboxSpec;

/// Namespace annotation: the one runtime class every sandbox pod of the namespace must run
/// under (for example `gvisor`).
pub const REQUIRED_RUNTIME_CLASS: &str = "agentbox.dev/required-runtime-class";

/// Condition and Event reason: the namespace requires another runtime class.
pub const REFUSED: &str = "RuntimeClassRequired";

/// Condition and Event reason: the runtime class the pod would name does not exist.
pub const NOT_FOUND: &str = "RuntimeClassNotFound";

/// The runtime class `spec`'s pod runs under: its own, else the operator's `default`; `None`
/// is the node's default runtime.
pub fn effective<'a>(spec: &'a SandboxSpec, default: Option<&'a str>) -> Option<&'a str> {
    spec.pod.runtime_class_name.as_deref().or(default)
}

/// The runtime class namespace `ns` requires (its [`REQUIRED_RUNTIME_CLASS`] annotation, when
/// set and not blank). A namespace that could not be read requires nothing here: the API
/// server's admission policy (when installed) is the other check.
pub fn required(ns: Option<&Namespace>) -> Option<String> {
    ns?.annotations()
        .get(REQUIRED_RUNTIME_CLASS)
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

/// Why a pod that would run under `effective` may not run in namespace `ns`, which requires
/// `required`; `None` when it may. `what` names the object refused ("this sandbox", "the
/// pool's template").
pub fn refusal(
    effective: Option<&str>,
    required: Option<&str>,
    ns: &str,
    what: &str,
) -> Option<String> {
    let required = required?;
    if effective == Some(required) {
        return None;
    }
    let runs = match effective {
        Some(rc) => format!("runtime class {rc:?}"),
        None => "the node's default runtime (no runtimeClassName, and the operator sets no \
                 --default-runtime-class)"
            .to_string(),
    };
    Some(format!(
        "namespace {ns} requires runtime class {required:?} (annotation \
         {REQUIRED_RUNTIME_CLASS}); {what} would run under {runs}: set runtimeClassName \
         {required:?}"
    ))
}

/// The message of a pod whose runtime class `name` does not exist in the cluster.
pub fn not_found_message(name: &str) -> String {
    format!(
        "RuntimeClass {name:?} does not exist in the cluster: no pod is made until it does \
         (kubectl get runtimeclass lists those there are)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(rc: Option<&str>) -> SandboxSpec {
        let mut v = serde_json::json!({"image": "i", "scope": {"kind": "Global"}});
        if let Some(rc) = rc {
            v["runtimeClassName"] = rc.into();
        }
        serde_json::from_value(v).unwrap()
    }

    fn ns(annotations: serde_json::Value) -> Namespace {
        serde_json::from_value(
            serde_json::json!({"metadata": {"name": "team-a", "annotations": annotations}}),
        )
        .unwrap()
    }

    #[test]
    fn the_spec_wins_over_the_operator_default_and_none_is_the_nodes_runtime() {
        assert_eq!(effective(&spec(Some("kata")), Some("gvisor")), Some("kata"));
        assert_eq!(effective(&spec(None), Some("gvisor")), Some("gvisor"));
        assert_eq!(effective(&spec(Some("kata")), None), Some("kata"));
        assert_eq!(effective(&spec(None), None), None);
    }

    #[test]
    fn a_namespace_requires_what_its_annotation_names() {
        let key = REQUIRED_RUNTIME_CLASS;
        assert_eq!(
            required(Some(&ns(serde_json::json!({key: "gvisor"})))),
            Some("gvisor".into())
        );
        assert_eq!(
            required(Some(&ns(serde_json::json!({key: " gvisor\n"})))),
            Some("gvisor".into())
        );
        assert_eq!(required(Some(&ns(serde_json::json!({key: "  "})))), None);
        assert_eq!(required(Some(&ns(serde_json::json!({"other": "x"})))), None);
        assert_eq!(required(None), None);
    }

    #[test]
    fn only_exactly_the_required_class_passes_and_the_refusal_names_the_annotation() {
        assert_eq!(refusal(Some("gvisor"), Some("gvisor"), "n", "it"), None);
        assert_eq!(refusal(Some("kata"), None, "n", "it"), None);
        assert_eq!(refusal(None, None, "n", "it"), None);
        let other = refusal(Some("kata"), Some("gvisor"), "team-a", "this sandbox").unwrap();
        assert!(other.contains(REQUIRED_RUNTIME_CLASS), "{other}");
        assert!(other.contains("namespace team-a requires runtime class \"gvisor\""));
        assert!(other.contains("this sandbox would run under runtime class \"kata\""));
        let none = refusal(None, Some("gvisor"), "team-a", "this sandbox").unwrap();
        assert!(none.contains("the node's default runtime"), "{none}");
        assert!(none.contains(REQUIRED_RUNTIME_CLASS));
    }
}
