//! Builds the objects a Sandbox owns: its pod, its egress NetworkPolicy, and the short-lived
//! pod that removes its workspace from the node. Pure functions of the Sandbox and the config.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, Container, HostPathVolumeSource, NodeAffinity, NodeSelector, NodeSelectorRequirement,
    NodeSelectorTerm, Pod, PodSecurityContext, PodSpec, SeccompProfile, SecurityContext, Volume,
    VolumeMount,
};
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicySpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use kube::{Resource, ResourceExt};
use sha2::{Digest, Sha256};

use crate::crd::Sandbox;
use crate::labels;

/// The single container of a sandbox pod.
pub const CONTAINER: &str = "sandbox";
/// Annotation on owned objects: hash of the spec built from the sandbox spec. A different hash
/// means the sandbox spec changed in a way that needs a new object. Comparing hashes, not the
/// stored spec, is immune to the API server's defaulting and pruning.
pub const SPEC_HASH: &str = "agentbox.dev/pod-spec-hash";
/// The volume holding the workspace.
const WORKSPACE_VOLUME: &str = "workspace";
/// Default entrypoint: stay alive and exit promptly on TERM, since commands arrive by exec.
pub const KEEP_ALIVE: &str = "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done";

/// Host directory of a sandbox's workspace: `<nodeRoot>/<namespace>/<uid>`. Always operator
/// chosen; never derived from user input other than the namespace and the server-set uid.
pub fn workspace_host_path(node_root: &str, namespace: &str, uid: &str) -> String {
    format!("{node_root}/{namespace}/{uid}")
}

/// Labels of every object a sandbox owns.
pub fn owned_labels(sbx: &Sandbox) -> BTreeMap<String, String> {
    let mut l = labels::scope_labels(&sbx.spec.scope);
    l.insert(
        labels::SANDBOX.into(),
        labels::sandbox_label_value(&sbx.name_any()),
    );
    l
}

fn owner_ref(sbx: &Sandbox) -> Option<OwnerReference> {
    sbx.controller_owner_ref(&())
}

/// The sandbox pod. `pin_node` is the node that holds the workspace, once known: the pod must
/// land there again or the workspace is out of reach. The pin is left out of the spec hash so
/// that learning the node never counts as a spec change.
pub fn build_pod(sbx: &Sandbox, node_root: &str, pin_node: Option<&str>) -> Pod {
    let spec = &sbx.spec;
    let ns = sbx.namespace().unwrap_or_default();
    let uid = sbx.uid().unwrap_or_default();
    let root = spec.workspace.root.trim_end_matches('/').to_string();

    let mut volumes = vec![Volume {
        name: WORKSPACE_VOLUME.into(),
        host_path: Some(HostPathVolumeSource {
            path: workspace_host_path(node_root, &ns, &uid),
            type_: Some("DirectoryOrCreate".into()),
        }),
        ..Default::default()
    }];
    let mut mounts = vec![VolumeMount {
        name: WORKSPACE_VOLUME.into(),
        mount_path: root.clone(),
        ..Default::default()
    }];
    for (i, m) in spec.workspace.mounts.iter().enumerate() {
        let name = format!("host-{i}");
        volumes.push(Volume {
            name: name.clone(),
            host_path: Some(HostPathVolumeSource {
                path: m.host_path.clone(),
                type_: Some(m.type_.as_str().into()),
            }),
            ..Default::default()
        });
        mounts.push(VolumeMount {
            name,
            mount_path: format!(
                "{root}/{}",
                m.path.trim_start_matches("./").trim_end_matches('/')
            ),
            read_only: Some(m.read_only),
            ..Default::default()
        });
    }

    let sc = spec.security_context.clone().unwrap_or_default();
    let container = Container {
        name: CONTAINER.into(),
        image: Some(spec.image.clone()),
        image_pull_policy: spec.image_pull_policy.map(|p| p.as_str().to_string()),
        command: Some(
            spec.command
                .clone()
                .unwrap_or_else(|| vec!["sh".into(), "-c".into(), KEEP_ALIVE.into()]),
        ),
        args: spec.args.clone(),
        env: (!spec.env.is_empty()).then(|| spec.env.clone()),
        resources: spec.resources.clone(),
        working_dir: Some(root),
        volume_mounts: Some(mounts),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            privileged: Some(false),
            read_only_root_filesystem: sc.read_only_root_filesystem,
            ..Default::default()
        }),
        ..Default::default()
    };

    let mut pod_spec = PodSpec {
        containers: vec![container],
        volumes: Some(volumes),
        restart_policy: Some("Always".into()),
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        termination_grace_period_seconds: Some(10),
        runtime_class_name: spec.runtime_class_name.clone(),
        node_selector: (!spec.node_selector.is_empty()).then(|| spec.node_selector.clone()),
        tolerations: (!spec.tolerations.is_empty()).then(|| spec.tolerations.clone()),
        security_context: Some(PodSecurityContext {
            run_as_user: sc.run_as_user,
            run_as_group: sc.run_as_group,
            run_as_non_root: sc.run_as_non_root,
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let hash = json_hash(&pod_spec);
    if let Some(node) = pin_node {
        pod_spec.affinity = Some(pin_to_node(node));
    }

    let mut annotations = labels::scope_annotations(&spec.scope);
    annotations.insert(SPEC_HASH.into(), hash);
    Pod {
        metadata: ObjectMeta {
            name: Some(labels::pod_name(&sbx.name_any())),
            namespace: Some(ns),
            labels: Some(owned_labels(sbx)),
            annotations: Some(annotations),
            owner_references: owner_ref(sbx).map(|o| vec![o]),
            ..Default::default()
        },
        spec: Some(pod_spec),
        status: None,
    }
}

/// Hex SHA-256 of a pod spec's JSON form (field order is fixed by the struct, so it is stable).
fn json_hash(spec: &impl serde::Serialize) -> String {
    let json = serde_json::to_vec(spec).unwrap_or_default();
    hex::encode(&Sha256::digest(&json)[..12])
}

/// Required node affinity on the node's name (matchFields, like DaemonSets do), so the
/// scheduler still checks resources and taints but can only choose that node.
fn pin_to_node(node: &str) -> Affinity {
    Affinity {
        node_affinity: Some(NodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_fields: Some(vec![NodeSelectorRequirement {
                        key: "metadata.name".into(),
                        operator: "In".into(),
                        values: Some(vec![node.to_string()]),
                    }]),
                    ..Default::default()
                }],
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A NetworkPolicy selecting the sandbox pod with an Egress policy type and no egress rules:
/// all egress denied (enforced where the network plugin implements NetworkPolicy).
pub fn build_deny_egress(sbx: &Sandbox) -> NetworkPolicy {
    let name = sbx.name_any();
    let selector = BTreeMap::from([(
        labels::SANDBOX.to_string(),
        labels::sandbox_label_value(&name),
    )]);
    let spec = NetworkPolicySpec {
        pod_selector: Some(LabelSelector {
            match_labels: Some(selector),
            ..Default::default()
        }),
        policy_types: Some(vec!["Egress".into()]),
        egress: Some(vec![]),
        ingress: None,
    };
    let hash = json_hash(&spec);
    NetworkPolicy {
        metadata: ObjectMeta {
            name: Some(labels::network_policy_name(&name)),
            namespace: sbx.namespace(),
            labels: Some(owned_labels(sbx)),
            annotations: Some(BTreeMap::from([(SPEC_HASH.to_string(), hash)])),
            owner_references: owner_ref(sbx).map(|o| vec![o]),
            ..Default::default()
        },
        spec: Some(spec),
    }
}

/// Name of the pod that removes a sandbox's workspace directory from its node.
pub fn cleanup_pod_name(sbx: &Sandbox) -> String {
    // Named for this sandbox's uid, not its name: a leftover from an earlier sandbox of the
    // same name is never taken for this one's.
    format!("sbx-cleanup-{}", sbx.uid().unwrap_or_default())
}

/// A pod bound directly to `node` (no scheduling: it must run exactly there, even on a cordoned
/// node) that mounts the namespace's workspace directory and removes this sandbox's workspace.
/// It mounts the parent, not the workspace itself, so it can remove the directory entry too.
pub fn build_cleanup_pod(sbx: &Sandbox, node_root: &str, node: &str, image: &str) -> Pod {
    let ns = sbx.namespace().unwrap_or_default();
    let uid = sbx.uid().unwrap_or_default();
    let parent = format!("{node_root}/{ns}");
    Pod {
        metadata: ObjectMeta {
            name: Some(cleanup_pod_name(sbx)),
            namespace: Some(ns),
            labels: Some(owned_labels(sbx)),
            annotations: Some(labels::scope_annotations(&sbx.spec.scope)),
            // Not owned: a foreground deletion of the sandbox would have the garbage collector
            // remove it before it ran. The reconciler deletes it once it has succeeded.
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.to_string()),
            restart_policy: Some("Never".into()),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            termination_grace_period_seconds: Some(1),
            // Tolerate everything: the workspace must go even from a tainted node.
            tolerations: Some(vec![k8s_openapi::api::core::v1::Toleration {
                operator: Some("Exists".into()),
                ..Default::default()
            }]),
            containers: vec![Container {
                name: "cleanup".into(),
                image: Some(image.to_string()),
                image_pull_policy: Some("IfNotPresent".into()),
                command: Some(vec![
                    "rm".into(),
                    "-rf".into(),
                    "--".into(),
                    format!("/workspaces/{uid}"),
                ]),
                volume_mounts: Some(vec![VolumeMount {
                    name: "workspaces".into(),
                    mount_path: "/workspaces".into(),
                    ..Default::default()
                }]),
                security_context: Some(SecurityContext {
                    allow_privilege_escalation: Some(false),
                    run_as_user: Some(0),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            volumes: Some(vec![Volume {
                name: "workspaces".into(),
                host_path: Some(HostPathVolumeSource {
                    path: parent,
                    type_: Some("Directory".into()),
                }),
                ..Default::default()
            }]),
            security_context: Some(PodSecurityContext {
                seccomp_profile: Some(SeccompProfile {
                    type_: "RuntimeDefault".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sandbox(extra: serde_json::Value) -> Sandbox {
        let mut spec = serde_json::json!({
            "image": "agentbox/base:v1",
            "scope": {"kind": "User", "agent": "coder", "user": "alice@example.com"}
        });
        if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
            for (k, v) in e {
                s.insert(k.clone(), v.clone());
            }
        }
        let mut sbx = Sandbox::new("demo", serde_json::from_value(spec).unwrap());
        sbx.metadata.namespace = Some("team".into());
        sbx.metadata.uid = Some("1234-uid".into());
        sbx
    }

    #[test]
    fn pod_is_locked_down_owned_and_labelled() {
        let sbx = sandbox(serde_json::json!({"runtimeClassName": "gvisor"}));
        let pod = build_pod(&sbx, "/var/lib/agentbox/workspaces", None);
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.automount_service_account_token, Some(false));
        assert_eq!(spec.runtime_class_name.as_deref(), Some("gvisor"));
        let seccomp = spec
            .security_context
            .as_ref()
            .unwrap()
            .seccomp_profile
            .as_ref()
            .unwrap();
        assert_eq!(seccomp.type_, "RuntimeDefault");
        let c = &spec.containers[0];
        assert_eq!(c.name, CONTAINER);
        let csc = c.security_context.as_ref().unwrap();
        assert_eq!(csc.allow_privilege_escalation, Some(false));
        assert_eq!(csc.privileged, Some(false));
        let vol = spec.volumes.as_ref().unwrap()[0]
            .host_path
            .as_ref()
            .unwrap();
        assert_eq!(vol.path, "/var/lib/agentbox/workspaces/team/1234-uid");
        assert_eq!(vol.type_.as_deref(), Some("DirectoryOrCreate"));
        assert_eq!(
            c.volume_mounts.as_ref().unwrap()[0].mount_path,
            "/workspace"
        );
        assert_eq!(c.working_dir.as_deref(), Some("/workspace"));
        let labels = pod.metadata.labels.as_ref().unwrap();
        assert_eq!(labels.get(labels::SCOPE).map(String::as_str), Some("user"));
        assert_eq!(
            labels.get(labels::SANDBOX).map(String::as_str),
            Some("demo")
        );
        assert!(labels.contains_key(labels::SCOPE_KEY));
        let ann = pod.metadata.annotations.as_ref().unwrap();
        assert_eq!(
            ann.get(labels::USER_ID).map(String::as_str),
            Some("alice@example.com")
        );
        let owner = &pod.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(owner.kind, "Sandbox");
        assert_eq!(owner.controller, Some(true));
        assert_eq!(pod.metadata.name.as_deref(), Some("sbx-demo"));
    }

    #[test]
    fn pinning_does_not_change_the_spec_hash_but_spec_changes_do() {
        let sbx = sandbox(serde_json::json!({}));
        let free = build_pod(&sbx, "/w", None);
        let pinned = build_pod(&sbx, "/w", Some("node-a"));
        let hash = |p: &Pod| p.metadata.annotations.as_ref().unwrap()[SPEC_HASH].clone();
        assert_eq!(hash(&free), hash(&pinned));
        let terms = &pinned
            .spec
            .as_ref()
            .unwrap()
            .affinity
            .as_ref()
            .unwrap()
            .node_affinity
            .as_ref()
            .unwrap()
            .required_during_scheduling_ignored_during_execution
            .as_ref()
            .unwrap()
            .node_selector_terms;
        assert_eq!(
            terms[0].match_fields.as_ref().unwrap()[0].values,
            Some(vec!["node-a".to_string()])
        );
        let other = sandbox(serde_json::json!({"image": "agentbox/base:v2"}));
        assert_ne!(hash(&free), hash(&build_pod(&other, "/w", None)));
    }

    #[test]
    fn host_mounts_become_volumes_under_the_root() {
        let sbx = sandbox(
            serde_json::json!({"workspace": {"root": "/work/", "mounts": [
                {"path": "./data/", "hostPath": "/srv/shared/data", "readOnly": false}
            ]}}),
        );
        let pod = build_pod(&sbx, "/w", None);
        let spec = pod.spec.unwrap();
        let mounts = spec.containers[0].volume_mounts.clone().unwrap();
        assert_eq!(mounts[0].mount_path, "/work");
        assert_eq!(mounts[1].mount_path, "/work/data");
        assert_eq!(mounts[1].read_only, Some(false));
        let vols = spec.volumes.unwrap();
        assert_eq!(vols[1].host_path.as_ref().unwrap().path, "/srv/shared/data");
        assert_eq!(
            vols[1].host_path.as_ref().unwrap().type_.as_deref(),
            Some("Directory")
        );
    }

    #[test]
    fn deny_egress_policy_selects_the_sandbox() {
        let sbx = sandbox(serde_json::json!({"network": {"egress": "None"}}));
        let np = build_deny_egress(&sbx);
        let spec = np.spec.unwrap();
        assert_eq!(spec.policy_types, Some(vec!["Egress".to_string()]));
        assert_eq!(spec.egress, Some(vec![]));
        let sel = spec.pod_selector.unwrap().match_labels.unwrap();
        assert_eq!(sel.get(labels::SANDBOX).map(String::as_str), Some("demo"));
    }

    #[test]
    fn cleanup_pod_removes_only_this_workspace() {
        let sbx = sandbox(serde_json::json!({}));
        let pod = build_cleanup_pod(&sbx, "/w", "node-a", "agentbox/base:v1");
        let spec = pod.spec.unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("node-a"));
        assert_eq!(
            spec.volumes.unwrap()[0].host_path.as_ref().unwrap().path,
            "/w/team"
        );
        assert_eq!(
            spec.containers[0].command.as_ref().unwrap().last().unwrap(),
            "/workspaces/1234-uid"
        );
    }
}
