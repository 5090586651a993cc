//! Exposed ports: the Service a Sandbox owns when `spec.ports` names any, and the endpoints
//! recorded in its status.
//!
//! The builders are pure; [`ensure`] applies the Service only when it is missing or differs
//! from the spec, and removes it when the ports go away. A sandbox without ports (and without
//! endpoints in its status) costs no API call here at all.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use sha2::{Digest, Sha256};

use crate::controller::context::{Error, FIELD_MANAGER};
use crate::controller::pod::{SPEC_HASH, owned_labels};
use agentbox_api::crd::{PortEndpoint, Sandbox, SandboxStatus};
use agentbox_api::labels;

/// Longest Service name (a DNS-1035 label).
const MAX_SERVICE_NAME: usize = 63;

/// Name of a sandbox's Service: `sbx-<sandbox>`, like its pod, when that is a DNS-1035 label;
/// otherwise (dots, or too long) the name with dots turned into dashes, bounded, plus a hash of
/// the sandbox name, so distinct sandboxes never share a Service.
pub fn service_name(sandbox: &str) -> String {
    let plain = format!("sbx-{sandbox}");
    if plain.len() <= MAX_SERVICE_NAME && !plain.contains('.') {
        return plain;
    }
    let digest = hex::encode(Sha256::digest(sandbox.as_bytes()));
    let mut prefix: String = plain
        .replace('.', "-")
        .chars()
        .take(MAX_SERVICE_NAME - 17)
        .collect();
    while prefix.ends_with('-') {
        prefix.pop();
    }
    format!("{prefix}-{}", &digest[..16])
}

/// The Service of a sandbox with ports: ClusterIP, selecting the pod by its
/// `agentbox.dev/sandbox` label, listing exactly `spec.ports` (each to the same port number in
/// the pod), owned by the Sandbox (so it goes with it). `None` when the spec has no ports.
pub fn build_service(sbx: &Sandbox) -> Option<Service> {
    if sbx.spec.pod.ports.is_empty() {
        return None;
    }
    let name = sbx.name_any();
    let selector = BTreeMap::from([(
        labels::SANDBOX.to_string(),
        labels::sandbox_label_value(&name),
    )]);
    let ports = sbx
        .spec
        .pod
        .ports
        .iter()
        .map(|p| ServicePort {
            name: Some(p.name.clone()),
            port: p.port,
            target_port: Some(IntOrString::Int(p.port)),
            protocol: Some(p.protocol.as_str().into()),
            ..Default::default()
        })
        .collect();
    let spec = ServiceSpec {
        type_: Some("ClusterIP".into()),
        selector: Some(selector),
        ports: Some(ports),
        ..Default::default()
    };
    // Compared by hash: the API server fills in clusterIP, sessionAffinity and more, so the
    // stored spec never equals this one field by field.
    let hash = hex::encode(&Sha256::digest(serde_json::to_vec(&spec).unwrap_or_default())[..12]);
    Some(Service {
        metadata: ObjectMeta {
            name: Some(service_name(&name)),
            namespace: sbx.namespace(),
            labels: Some(owned_labels(sbx)),
            annotations: Some(BTreeMap::from([(SPEC_HASH.to_string(), hash)])),
            owner_references: sbx.controller_owner_ref(&()).map(|o| vec![o]),
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    })
}

/// The endpoints to record in status: one per port of the spec, with the Service's cluster DNS
/// name and, while the pod has an IP, that IP.
pub fn endpoints(sbx: &Sandbox, pod: Option<&Pod>) -> Vec<PortEndpoint> {
    let ns = sbx.namespace().unwrap_or_default();
    let host = format!("{}.{ns}.svc", service_name(&sbx.name_any()));
    let pod_ip = pod
        .and_then(|p| p.status.as_ref())
        .and_then(|s| s.pod_ip.clone())
        .filter(|ip| !ip.is_empty());
    sbx.spec
        .pod
        .ports
        .iter()
        .map(|p| PortEndpoint {
            name: p.name.clone(),
            port: p.port,
            protocol: p.protocol,
            host: host.clone(),
            pod_ip: pod_ip.clone(),
        })
        .collect()
}

/// What [`ensure`] must do, decided from the spec, the status last written and the Service
/// found (pure).
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Nothing to do and nothing to read: no ports, none recorded.
    Nothing,
    /// Read the Service, then apply or keep it.
    Check,
    /// No ports any more: delete the Service.
    Remove,
}

/// Decides what to do about the Service. A sandbox that never had ports is not even read: its
/// Service can only exist if ports were recorded in its status.
pub fn step(sbx: &Sandbox, old: &SandboxStatus) -> Step {
    match (sbx.spec.pod.ports.is_empty(), old.endpoints.is_empty()) {
        (true, true) => Step::Nothing,
        (true, false) => Step::Remove,
        (false, _) => Step::Check,
    }
}

/// Whether the Service found matches the desired one (by the hash of what was asked for).
pub fn up_to_date(current: Option<&Service>, desired: &Service) -> bool {
    current.is_some_and(|c| c.annotations().get(SPEC_HASH) == desired.annotations().get(SPEC_HASH))
}

/// Creates, updates or removes the sandbox's Service. Returns the number of writes it made
/// (0 when everything was in place).
pub async fn ensure(api: &Api<Service>, sbx: &Sandbox, old: &SandboxStatus) -> Result<u32, Error> {
    let name = service_name(&sbx.name_any());
    match step(sbx, old) {
        Step::Nothing => Ok(0),
        Step::Remove => match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => Ok(1),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(0),
            Err(e) => Err(e.into()),
        },
        Step::Check => {
            let Some(desired) = build_service(sbx) else {
                return Ok(0);
            };
            if up_to_date(api.get_opt(&name).await?.as_ref(), &desired) {
                return Ok(0);
            }
            api.patch(
                &name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&desired),
            )
            .await?;
            Ok(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodStatus;

    fn sandbox(ports: serde_json::Value) -> Sandbox {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "agentbox.dev/v1alpha1",
            "kind": "Sandbox",
            "metadata": {"name": "demo", "namespace": "team", "uid": "u-1"},
            "spec": {
                "image": "docker.io/library/busybox:1.37",
                "scope": {"kind": "Agent", "agent": "a"},
                "ports": ports,
            },
        }))
        .expect("sandbox")
    }

    fn pod_with_ip(ip: &str) -> Pod {
        Pod {
            status: Some(PodStatus {
                pod_ip: Some(ip.into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn the_service_selects_only_this_sandboxs_pod_and_exposes_exactly_the_named_ports() {
        let sbx = sandbox(serde_json::json!([
            {"name": "http", "port": 8080},
            {"name": "dns", "port": 53, "protocol": "UDP"},
        ]));
        let svc = build_service(&sbx).expect("a service");
        assert_eq!(svc.metadata.name.as_deref(), Some("sbx-demo"));
        let owner = &svc.metadata.owner_references.as_ref().expect("owner")[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("Sandbox", "u-1")
        );
        assert_eq!(owner.controller, Some(true));
        let spec = svc.spec.expect("spec");
        assert_eq!(
            spec.selector,
            Some(BTreeMap::from([(
                labels::SANDBOX.to_string(),
                "demo".to_string()
            )]))
        );
        assert_eq!(spec.type_.as_deref(), Some("ClusterIP"));
        let ports: Vec<_> = spec
            .ports
            .expect("ports")
            .into_iter()
            .map(|p| {
                (
                    p.name.unwrap_or_default(),
                    p.port,
                    p.target_port,
                    p.protocol,
                )
            })
            .collect();
        assert_eq!(
            ports,
            vec![
                (
                    "http".into(),
                    8080,
                    Some(IntOrString::Int(8080)),
                    Some("TCP".into())
                ),
                (
                    "dns".into(),
                    53,
                    Some(IntOrString::Int(53)),
                    Some("UDP".into())
                ),
            ]
        );
    }

    #[test]
    fn a_sandbox_without_ports_has_no_service_and_costs_no_call() {
        let sbx = sandbox(serde_json::json!([]));
        assert!(build_service(&sbx).is_none());
        assert!(endpoints(&sbx, None).is_empty());
        assert_eq!(step(&sbx, &SandboxStatus::default()), Step::Nothing);
    }

    #[test]
    fn ports_that_go_away_remove_the_service() {
        let with = sandbox(serde_json::json!([{"name": "http", "port": 80}]));
        let without = sandbox(serde_json::json!([]));
        let recorded = SandboxStatus {
            endpoints: endpoints(&with, None),
            ..Default::default()
        };
        assert_eq!(step(&without, &recorded), Step::Remove);
        assert_eq!(step(&with, &recorded), Step::Check);
        assert_eq!(step(&with, &SandboxStatus::default()), Step::Check);
    }

    #[test]
    fn a_changed_port_list_changes_the_hash() {
        let a = build_service(&sandbox(serde_json::json!([{"name": "http", "port": 80}])));
        let b = build_service(&sandbox(serde_json::json!([{"name": "http", "port": 81}])));
        let (a, b) = (a.expect("a"), b.expect("b"));
        assert!(up_to_date(Some(&a), &a));
        assert!(!up_to_date(Some(&a), &b));
        assert!(!up_to_date(None, &a));
    }

    #[test]
    fn endpoints_carry_the_service_dns_name_and_the_pod_ip_once_known() {
        let sbx = sandbox(serde_json::json!([{"name": "http", "port": 8080}]));
        let before = endpoints(&sbx, None);
        assert_eq!(before[0].host, "sbx-demo.team.svc");
        assert_eq!(before[0].pod_ip, None);
        let after = endpoints(&sbx, Some(&pod_with_ip("10.88.0.7")));
        assert_eq!(after[0].pod_ip.as_deref(), Some("10.88.0.7"));
        assert_eq!((after[0].name.as_str(), after[0].port), ("http", 8080));
        assert!(
            endpoints(&sbx, Some(&pod_with_ip("")))
                .iter()
                .all(|e| e.pod_ip.is_none())
        );
    }

    #[test]
    fn service_names_are_dns_labels_and_distinct() {
        assert_eq!(service_name("demo"), "sbx-demo");
        let dotted = service_name("a.b");
        let dashed = service_name("a-b");
        assert_ne!(dotted, dashed);
        assert!(!dotted.contains('.'));
        let long = service_name(&"x".repeat(200));
        assert!(long.len() <= MAX_SERVICE_NAME);
        assert_ne!(long, service_name(&"x".repeat(201)));
        for n in [dotted, long] {
            assert!(
                n.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            );
            assert!(!n.ends_with('-'));
        }
    }
}
