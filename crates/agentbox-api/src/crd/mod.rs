//! Custom resources of the `agentbox.dev/v1alpha1` API group.
//!
//! Every field carries a doc comment: schemars turns them into the OpenAPI descriptions that
//! `kubectl explain` shows. CEL rules (`x_kube(validation = ...)`) make the API server refuse
//! bad specs at admission, so most mistakes never reach the controller.

mod pool;
#[cfg(feature = "generators")]
pub mod reference;
mod sandbox;
mod snapshot;
mod template;

pub use pool::*;
pub use sandbox::*;
pub use snapshot::*;
pub use template::*;

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// The API group of every agentbox resource.
pub const GROUP: &str = "agentbox.dev";
/// The served and stored version.
pub const VERSION: &str = "v1alpha1";

/// Admission rule for a list whose entries are keyed by the field `key` (a path or a name):
/// every key appears once, and the message names the first duplicate, e.g. `file paths must be
/// unique: README.md appears more than once`. `what` names the keys in that message.
///
/// CEL rather than `x-kubernetes-list-type: map`: with a list-map the API server names the
/// duplicate as a Go map (`Duplicate value: {"path":"README.md"}`) and server-side apply fails
/// before validation with `failed to create typed patch object … duplicate entries for key`;
/// the rule gives every client (create, update, client- and server-side apply) this one message
/// and leaves the lists atomic for apply. `exists_one` keeps the message expression within the
/// API server's cost limit (a `filter` inside a `filter` is refused).
pub fn unique_by(key: &str, what: &str) -> kube::core::Rule {
    kube::core::Rule::new(format!(
        "self.all(x, self.exists_one(y, y.{key} == x.{key}))"
    ))
    .message(kube::core::Message::Expression(format!(
        "'{what} must be unique: ' + self.map(x, x.{key}).filter(k, !self.exists_one(y, y.{key} == k))[0] + ' appears more than once'"
    )))
}

/// Admission rule on a field that must be an object name (a reference to another object).
pub fn object_name() -> kube::core::Rule {
    kube::core::Rule::new(crate::names::OBJECT_NAME_RULE).message(crate::names::OBJECT_NAME_MESSAGE)
}

/// Admission rule on a Sandbox spec: the field at `path` (dotted, relative to the spec) is
/// pod-shaping, so a Sandbox that names a template must leave it to the template.
pub fn fixed_by_template(path: &str) -> kube::core::Rule {
    // Each parent is tested too: `has(a.b)` on an absent `a` is an evaluation error.
    let mut tests = Vec::new();
    let mut prefix = String::from("self");
    for part in path.split('.') {
        prefix = format!("{prefix}.{part}");
        tests.push(format!("!has({prefix})"));
    }
    kube::core::Rule::new(format!("!has(self.templateRef) || {}", tests.join(" || "))).message(
        kube::core::Message::Message(format!(
            "{path} comes from the template: a Sandbox with templateRef cannot set it"
        )),
    )
}

/// A hold of a scope's execution guard that a harness hands to the operator: the holder
/// identity and fencing token of the scope's Lease while the harness holds it. Work the operator
/// does under a hand-off (a snapshot, a suspension) runs only while the Lease is still held by
/// this holder with this token, and without the operator acquiring the Lease itself, so nothing
/// else can work in the scope between the harness's last command and that work.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct GuardHold {
    /// The Lease's `holderIdentity` while the harness holds the guard.
    #[schemars(length(min = 1, max = 1024))]
    pub holder: String,
    /// The Lease's `leaseTransitions` (the fencing token) of that hold.
    #[schemars(range(min = 0))]
    pub token: i64,
}

/// All CRDs this operator serves, in the order `crdgen` writes them.
pub fn all()
-> Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>
{
    use kube::CustomResourceExt;
    vec![
        Sandbox::crd(),
        SandboxSnapshot::crd(),
        SandboxTemplate::crd(),
        SandboxPool::crd(),
    ]
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
    use super::StartBranch;
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

    /// The OpenAPI schema of a CRD's version, as the API server validates objects with it.
    fn schema(crd: CustomResourceDefinition) -> serde_json::Value {
        serde_json::to_value(
            crd.spec.versions[0]
                .schema
                .as_ref()
                .and_then(|s| s.open_api_v3_schema.as_ref())
                .unwrap(),
        )
        .unwrap()
    }

    /// A Sandbox object with a Global scope and the spec fields in `extra`.
    fn with(extra: serde_json::Value) -> serde_json::Value {
        let mut spec = serde_json::json!({"image": "i", "scope": {"kind": "Global"}});
        for (k, val) in extra.as_object().unwrap() {
            spec[k] = val.clone();
        }
        serde_json::json!({"apiVersion": "agentbox.dev/v1alpha1", "kind": "Sandbox",
               "metadata": {"name": "s"}, "spec": spec})
    }

    #[test]
    fn an_allowlist_is_checked_at_admission_with_messages_that_say_what_is_wrong() {
        use kube::CustomResourceExt;
        use serde_json::json;
        let schema = schema(crate::crd::Sandbox::crd());
        let v = kube::core::cel::Validator::new();
        let ok = with(json!({"network": {"egress": "Allowlist",
            "allow": [{"cidr": "10.0.0.0/8", "ports": [{"port": 443}, {"port": 80, "endPort": 90}]}]}}));
        let r = v.validate(&schema, &ok, None);
        assert!(r.is_ok(), "{r:?}");
        let domains = with(json!({"network": {"egress": "Allowlist",
            "allow": [{"domain": "pypi.org", "ports": [{"port": 443}]}, {"domain": "*.github.com"},
                      {"domain": "files.pythonhosted.org", "ports": [{"port": 80, "protocol": "TCP"}]}]}}));
        let r = v.validate(&schema, &domains, None);
        assert!(r.is_ok(), "{r:?}");
        for (network, message) in [
            (
                json!({"egress": "Allowlist"}),
                "egress: Allowlist needs at least one network.allow entry",
            ),
            (
                json!({"egress": "None", "allow": [{"cidr": "10.0.0.0/8"}]}),
                "network.allow applies only with egress: Allowlist",
            ),
            (
                json!({"allow": [{"cidr": "10.0.0.0/8"}]}),
                "network.allow applies only with egress: Allowlist",
            ),
            (
                json!({"egress": "Allowlist", "allow": [{"ports": [{"port": 1}]}]}),
                "a network.allow entry needs cidr",
            ),
            (
                json!({"egress": "Allowlist", "allow": [{"cidr": "10.0.0.0/8", "domain": "a.example"}]}),
                "either cidr or domain, not both",
            ),
            (
                json!({"egress": "Allowlist", "allow": [{"domain": "localhost"}]}),
                "domain must be a lower-case DNS name",
            ),
            (
                json!({"egress": "Allowlist", "allow": [{"domain": "PyPI.org"}]}),
                "domain must be a lower-case DNS name",
            ),
            (
                json!({"egress": "Allowlist", "allow": [{"domain": "10.0.0.1"}]}),
                "addresses go in cidr",
            ),
            (
                json!({"egress": "Allowlist", "allow": [{"domain": "a.*.example"}]}),
                "domain must be a lower-case DNS name",
            ),
            (
                json!({"egress": "Allowlist", "allow": [{"domain": "*"}]}),
                "domain must be a lower-case DNS name",
            ),
            (
                json!({"egress": "Allowlist", "allow": [{"domain": "a.example", "ports": [{"port": 53, "protocol": "UDP"}]}]}),
                "the ports of a domain entry are TCP",
            ),
            (
                json!({"egress": "Allowlist", "allow": [{"cidr": "10.0.0.0/8", "ports": [{"port": 90, "endPort": 80}]}]}),
                "endPort must not be below port",
            ),
        ] {
            let err = format!(
                "{:?}",
                v.validate(&schema, &with(json!({ "network": network })), None)
                    .unwrap_err()
            );
            assert!(err.contains(message), "{message}: {err}");
        }
    }

    #[test]
    fn start_branches_are_named_in_code_and_written_as_the_status_letters() {
        for (letter, branch) in [
            ("A", StartBranch::Reattached),
            ("B", StartBranch::Recovered),
            ("C", StartBranch::Restored),
            ("D", StartBranch::Fresh),
        ] {
            assert_eq!(
                serde_json::to_value(branch).unwrap(),
                serde_json::json!(letter)
            );
            let read: StartBranch = serde_json::from_value(serde_json::json!(letter)).unwrap();
            assert_eq!(read, branch, "{letter}");
        }
    }

    #[test]
    fn committed_crds_match_the_types() {
        let committed = include_str!("../../../../crds/agentbox.yaml");
        let generated = super::render_yaml().expect("render CRDs");
        assert!(
            committed == generated,
            "crds/agentbox.yaml is stale: run `cargo run --bin crdgen > crds/agentbox.yaml`"
        );
    }

    /// What kubectl shows of every kind: a description of what it is, the `agentbox` category,
    /// and the Ready condition's reason (and, with `-o wide`, message) as columns.
    #[test]
    fn every_kind_describes_itself_and_shows_its_ready_condition() {
        // A template has no state of its own: nothing to wait for, no conditions.
        for crd in super::all()
            .into_iter()
            .filter(|c| c.spec.names.kind != "SandboxTemplate")
        {
            let kind = &crd.spec.names.kind;
            let v = &crd.spec.versions[0];
            let description = v
                .schema
                .as_ref()
                .and_then(|s| s.open_api_v3_schema.as_ref())
                .and_then(|s| s.description.clone())
                .unwrap_or_default();
            assert!(
                description.starts_with(&format!("A {kind} is ")),
                "{kind}: {description}"
            );
            assert!(
                description.contains("kubectl wait --for=condition=Ready"),
                "{kind}"
            );
            assert_eq!(
                crd.spec.names.categories,
                Some(vec!["agentbox".to_string()]),
                "{kind}"
            );
            let columns = v.additional_printer_columns.clone().unwrap_or_default();
            for (name, field, priority) in
                [("Reason", "reason", None), ("Message", "message", Some(1))]
            {
                let c = columns
                    .iter()
                    .find(|c| c.name == name)
                    .unwrap_or_else(|| panic!("{kind}: no {name} column"));
                assert_eq!(
                    c.json_path,
                    format!(".status.conditions[?(@.type==\"Ready\")].{field}"),
                    "{kind}"
                );
                assert_eq!(c.priority, priority, "{kind} {name}");
            }
        }
    }

    /// Every reference to another object is refused at admission unless it is an object name
    /// (the CRD's own CEL rules, evaluated as the API server would).
    #[test]
    fn references_are_names_at_admission() {
        use kube::CustomResourceExt;
        use serde_json::json;
        let v = kube::core::cel::Validator::new();
        let sbx = schema(crate::crd::Sandbox::crd());
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

    /// Every keyed list of a Sandbox spec refuses a duplicate key, naming it, as the API server
    /// evaluates the CRD's own rules (a schema taken from the generated CRD, so a list that
    /// lost its rule fails here).
    #[test]
    fn duplicate_keys_are_refused_naming_the_duplicate() {
        use kube::CustomResourceExt;
        use serde_json::json;
        let schema = schema(crate::crd::Sandbox::crd());
        let v = kube::core::cel::Validator::new();
        let ws = |list: &str, items: serde_json::Value| with(json!({"workspace": {list: items}}));
        let file = |p: &str| json!({"path": p, "content": "x"});
        let proj = |p: &str| json!({"configMap": "c", "path": p});
        let mount = |p: &str| json!({"path": p, "hostPath": "/srv/x"});
        let env = |n: &str| json!({"name": n, "value": "1"});
        for (obj, dup, message) in [
            (
                ws(
                    "files",
                    json!([file("a"), file("README.md"), file("README.md")]),
                ),
                ws("files", json!([file("a"), file("README.md")])),
                "file paths must be unique: README.md appears more than once",
            ),
            (
                ws("projections", json!([proj("skills"), proj("skills")])),
                ws("projections", json!([proj("skills"), proj("tools")])),
                "projection paths must be unique: skills appears more than once",
            ),
            (
                ws(
                    "mounts",
                    json!([mount("data"), mount("cache"), mount("data")]),
                ),
                ws("mounts", json!([mount("data"), mount("cache")])),
                "mount paths must be unique: data appears more than once",
            ),
            (
                with(json!({"env": [env("A"), env("B"), env("B")]})),
                with(json!({"env": [env("A"), env("B")]})),
                "env names must be unique: B appears more than once",
            ),
        ] {
            let err = format!("{:?}", v.validate(&schema, &obj, None).unwrap_err());
            assert!(err.contains(message), "{message}: {err}");
            assert!(
                v.validate(&schema, &dup, None).is_ok(),
                "{:?}",
                v.validate(&schema, &dup, None)
            );
        }
    }

    /// `lifecycle.idleTimeout` takes a Go duration of at least 10s, and says which rule a bad
    /// value breaks (the CRD's own rules, evaluated as the API server would).
    #[test]
    fn idle_timeouts_are_durations_of_at_least_ten_seconds() {
        use kube::CustomResourceExt;
        use serde_json::json;
        let schema = schema(crate::crd::Sandbox::crd());
        let v = kube::core::cel::Validator::new();
        let idle = |d: &str| with(json!({"lifecycle": {"idleTimeout": d}}));
        for ok in ["10s", "90s", "15m", "1h30m", "1.5h", "10000ms"] {
            let r = v.validate(&schema, &idle(ok), None);
            assert!(r.is_ok(), "{ok}: {r:?}");
        }
        for (bad, message) in [
            ("5s", "idleTimeout must be at least 10s"),
            ("9999ms", "idleTimeout must be at least 10s"),
            ("0s", "idleTimeout must be at least 10s"),
            ("60", "idleTimeout must be a duration such as 90s"),
            ("1 minute", "idleTimeout must be a duration such as 90s"),
            ("-1m", "idleTimeout must be a duration such as 90s"),
        ] {
            let err = format!("{:?}", v.validate(&schema, &idle(bad), None).unwrap_err());
            assert!(err.contains(message), "{bad}: {err}");
            if message.contains("duration such as") {
                assert!(!err.contains("at least 10s"), "{bad}: one message: {err}");
            }
        }
        let parsed: crate::crd::Lifecycle =
            serde_json::from_value(json!({"idleTimeout": "1h30m"})).unwrap();
        assert_eq!(
            parsed.idle_timeout.map(std::time::Duration::from),
            Some(std::time::Duration::from_secs(5400))
        );
    }

    /// A Sandbox with `templateRef` (and a User scope) and the spec fields in `extra`.
    fn templated(extra: serde_json::Value) -> serde_json::Value {
        let mut obj = with(serde_json::json!({}));
        let spec = obj["spec"].as_object_mut().unwrap();
        spec.remove("image");
        spec.insert("templateRef".into(), serde_json::json!({"name": "agent"}));
        for (k, val) in extra.as_object().unwrap() {
            spec.insert(k.clone(), val.clone());
        }
        obj
    }

    /// A Sandbox names a template or an image, and with a template it leaves every
    /// pod-shaping field to it, each refusal naming the field (the CRD's own rules).
    #[test]
    fn templated_sandboxes_refuse_pod_shaping_fields_naming_them() {
        use kube::CustomResourceExt;
        use serde_json::json;
        let schema = schema(crate::crd::Sandbox::crd());
        let v = kube::core::cel::Validator::new();
        let ok = templated(json!({
            "env": [{"name": "TASK", "value": "x"}],
            "workspace": {"root": "/home/agent", "files": [{"path": "task.md", "content": "t"}]},
            "snapshot": {"restore": "None"},
            "lifecycle": {"mode": "Suspended", "idleTimeout": "5m"},
            "network": {"egress": "All"},
        }));
        let r = v.validate(&schema, &ok, None);
        assert!(r.is_ok(), "{r:?}");
        for (field, value) in [
            ("image", json!("busybox")),
            ("imagePullPolicy", json!("Never")),
            ("command", json!(["sh"])),
            ("args", json!(["-c", "true"])),
            ("resources", json!({"limits": {"cpu": "1"}})),
            ("runtimeClassName", json!("gvisor")),
            ("nodeSelector", json!({"disk": "ssd"})),
            ("tolerations", json!([{"key": "k", "operator": "Exists"}])),
            ("securityContext", json!({"runAsUser": 1000})),
            ("ports", json!([{"name": "http", "port": 80}])),
        ] {
            let err = format!(
                "{:?}",
                v.validate(&schema, &templated(json!({ field: value })), None)
                    .unwrap_err()
            );
            assert!(
                err.contains(&format!(
                    "{field} comes from the template: a Sandbox with templateRef cannot set it"
                )),
                "{field}: {err}"
            );
        }
        let proj =
            templated(json!({"workspace": {"projections": [{"configMap": "c", "path": "p"}]}}));
        let err = format!("{:?}", v.validate(&schema, &proj, None).unwrap_err());
        assert!(
            err.contains("workspace.projections comes from the template"),
            "{err}"
        );
        for network in [
            json!({"egress": "None"}),
            json!({"egress": "Allowlist", "allow": [{"cidr": "10.0.0.0/8"}]}),
        ] {
            let net = templated(json!({ "network": network }));
            let err = format!("{:?}", v.validate(&schema, &net, None).unwrap_err());
            assert!(err.contains("network comes from the template"), "{err}");
        }
        let mut bare = with(json!({}));
        bare["spec"].as_object_mut().unwrap().remove("image");
        let err = format!("{:?}", v.validate(&schema, &bare, None).unwrap_err());
        assert!(
            err.contains("image is required unless templateRef names a SandboxTemplate"),
            "{err}"
        );
        let bad_ref = templated(json!({"templateRef": {"name": "../x"}}));
        assert!(v.validate(&schema, &bad_ref, None).is_err());
    }

    /// `templateRef` can be neither changed nor added nor removed (transition rules, evaluated
    /// against the old object as the API server does on update).
    #[test]
    fn template_refs_are_immutable() {
        use kube::CustomResourceExt;
        use serde_json::json;
        let schema = schema(crate::crd::Sandbox::crd());
        let v = kube::core::cel::Validator::new();
        let old = templated(json!({}));
        let same = templated(json!({"env": [{"name": "A", "value": "1"}]}));
        assert!(v.validate(&schema, &same, Some(&old)).is_ok());
        let other = templated(json!({"templateRef": {"name": "other"}}));
        let err = format!("{:?}", v.validate(&schema, &other, Some(&old)).unwrap_err());
        assert!(err.contains("templateRef is immutable"), "{err}");
        let plain = with(json!({}));
        let err = format!("{:?}", v.validate(&schema, &plain, Some(&old)).unwrap_err());
        assert!(
            err.contains("templateRef cannot be added or removed"),
            "{err}"
        );
    }

    /// A template is refused for what a Sandbox would be refused for: the Sandbox's own rules
    /// on the same fields.
    #[test]
    fn templates_get_the_sandboxes_admission_rules() {
        use kube::CustomResourceExt;
        use serde_json::json;
        let schema = schema(crate::crd::SandboxTemplate::crd());
        let v = kube::core::cel::Validator::new();
        let tpl = |spec: serde_json::Value| {
            json!({"apiVersion": "agentbox.dev/v1alpha1", "kind": "SandboxTemplate",
                   "metadata": {"name": "t"}, "spec": spec})
        };
        let ok = tpl(
            json!({"image": "busybox", "env": [{"name": "A", "value": "1"}],
            "workspace": {"files": [{"path": "a", "content": "x"}]},
            "lifecycle": {"idleTimeout": "15m"}}),
        );
        assert!(
            v.validate(&schema, &ok, None).is_ok(),
            "{:?}",
            v.validate(&schema, &ok, None)
        );
        let env = |n: &str| json!({"name": n, "value": "1"});
        for (spec, message) in [
            (
                json!({"image": "i", "env": [env("A"), env("A")]}),
                "env names must be unique: A appears more than once",
            ),
            (
                json!({"image": "i", "workspace": {"files": [{"path": "/etc/x", "content": "x"}]}}),
                "file paths are relative to the workspace root",
            ),
            (
                json!({"image": "i", "workspace": {"files": [{"path": "f", "content": "x"}, {"path": "f", "content": "y"}]}}),
                "file paths must be unique: f appears more than once",
            ),
            (
                json!({"image": "i", "lifecycle": {"idleTimeout": "5s"}}),
                "idleTimeout must be at least 10s",
            ),
            (
                json!({"image": "i", "runtimeClassName": "Bad/Name"}),
                "must be a Kubernetes object name",
            ),
            (
                json!({"image": "i", "ports": [{"name": "a", "port": 80}, {"name": "b", "port": 80}]}),
                "port numbers must be unique per protocol",
            ),
            (
                json!({"image": "i", "securityContext": {"runAsNonRoot": true, "runAsUser": 0}}),
                "runAsNonRoot cannot be combined with runAsUser 0",
            ),
            (
                json!({"image": "i", "snapshot": {"restore": "Named"}}),
                "snapshot.name is required when snapshot.restore is Named",
            ),
            (
                json!({"command": ["sh"]}),
                "a SandboxTemplate needs an image",
            ),
        ] {
            let err = format!(
                "{:?}",
                v.validate(&schema, &tpl(spec.clone()), None).unwrap_err()
            );
            assert!(err.contains(message), "{spec}: {err}");
        }
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
        #[x_kube(validation = crate::crd::unique_by("name", "port names"), validation = crate::crd::unique_port_numbers())]
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

    #[test]
    fn size_limits_are_quantities_of_whole_bytes_and_come_from_a_template() {
        use super::size_limit_bytes;
        assert_eq!(size_limit_bytes("64Mi"), Ok(64 << 20));
        assert_eq!(size_limit_bytes("1Gi"), Ok(1 << 30));
        assert_eq!(size_limit_bytes("500M"), Ok(500_000_000));
        assert_eq!(size_limit_bytes("4096"), Ok(4096));
        for bad in ["1.5Gi", "1e9", "64MB", "Mi", "", "99999999999Pi"] {
            assert!(size_limit_bytes(bad).is_err(), "{bad}");
        }
        // The CRD's pattern admits exactly what the parser reads.
        use kube::CustomResourceExt;
        let schema = schema(crate::crd::Sandbox::crd());
        let field =
            &schema["properties"]["spec"]["properties"]["workspace"]["properties"]["sizeLimit"];
        assert_eq!(
            field["pattern"],
            "^[1-9][0-9]{0,17}(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$"
        );
        let v = kube::core::cel::Validator::new();
        let templated = serde_json::json!({"apiVersion": "agentbox.dev/v1alpha1", "kind": "Sandbox",
            "metadata": {"name": "s"}, "spec": {"templateRef": {"name": "t"},
            "scope": {"kind": "Global"}, "workspace": {"sizeLimit": "64Mi"}}});
        let e = format!("{:?}", v.validate(&schema, &templated, None));
        assert!(
            e.contains("workspace.sizeLimit comes from the template"),
            "{e}"
        );
        assert!(
            v.validate(
                &schema,
                &with(serde_json::json!({"workspace": {"sizeLimit": "64Mi"}})),
                None
            )
            .is_ok()
        );
    }
}
