//! Builds the objects a Sandbox owns: its pod, its egress NetworkPolicy, and the short-lived
//! helper pods that do the operator's work on its node (removing its workspace; preparing its
//! namespace's directory). Pure functions of the Sandbox and the config.
//!
//! Helper pods run the trusted helper image the operator is configured with (`agentbox-helper`,
//! see the `helper/` crate), never a sandbox's image, as root with only the capabilities their
//! job needs, and mount one directory: the namespace's workspace directory, the immediate
//! parent of the workspace they act on.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, Container, HostPathVolumeSource, NodeAffinity, NodeSelector,
    NodeSelectorRequirement, NodeSelectorTerm, Pod, PodSecurityContext, PodSpec,
    ResourceRequirements, SeccompProfile, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{Resource, ResourceExt};
use sha2::{Digest, Sha256};

use super::{pids, security, sizelimit};
use crate::config::Config;
use agentbox_api::crd::{Egress, Network, Sandbox, SandboxPool, SandboxSpec, TemplateUse};
use agentbox_api::labels;

/// The single container of a sandbox pod.
pub const CONTAINER: &str = "sandbox";
/// Annotation on owned objects: hash of the spec built from the sandbox spec. A different hash
/// means the sandbox spec changed in a way that needs a new object. Comparing hashes, not the
/// stored spec, is immune to the API server's defaulting and pruning.
pub const SPEC_HASH: &str = "agentbox.dev/pod-spec-hash";
/// The volume holding the workspace.
pub const WORKSPACE_VOLUME: &str = "workspace";
pub use agentbox_api::remote::KEEP_ALIVE;

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

/// The labels of a sandbox's pod: [`owned_labels`], and [`labels::TEMPLATE`] when it is made
/// from a template (its template's egress policy selects it).
pub fn pod_labels(sbx: &Sandbox) -> BTreeMap<String, String> {
    let mut l = owned_labels(sbx);
    if let Some(t) = sbx.spec.template_ref.as_ref() {
        l.insert(
            labels::TEMPLATE.into(),
            labels::template_label_value(&t.name),
        );
    }
    l
}

pub(super) fn owner_ref(sbx: &Sandbox) -> Option<OwnerReference> {
    sbx.controller_owner_ref(&())
}

/// The helper image, when the operator has one.
#[derive(Debug, Clone, Copy)]
pub struct HelperImage<'a> {
    /// Image reference.
    pub image: &'a str,
    /// Its pull policy.
    pub pull_policy: &'a str,
}

/// What the operator's configuration contributes to the pods it builds.
#[derive(Debug, Clone, Copy)]
pub struct PodConfig<'a> {
    /// Host directory of the workspaces.
    pub node_root: &'a str,
    /// The trusted helper image; `None` when not configured.
    pub helper: Option<HelperImage<'a>>,
    /// Defaults of the sandboxes' security settings.
    pub security: security::Defaults<'a>,
    /// The runtime class of sandbox pods whose spec names none (`--default-runtime-class`).
    pub default_runtime_class: Option<&'a str>,
    /// The sandboxes' process limits (`--process-limit`, `--pids-cgroup-root`).
    pub processes: pids::ProcessLimits<'a>,
    /// The workspaces' size limits (`--workspace-size-limit`, `--workspace-quota-fallback`,
    /// `--workspace-usage-interval-seconds`).
    pub sizes: sizelimit::SizeLimits,
    /// The egress of sandboxes whose spec sets none (`--default-egress`).
    pub default_egress: Egress,
    /// The image of the init container that holds a cold pod whose egress relies on
    /// enforcement until its own rules are in force ([`super::netcheck::wait_container`]):
    /// the network check's; `None` where enforcement is attested (no check, no beacon).
    pub network_wait: Option<&'a str>,
    /// The egress proxy (`--egress-proxy-url`); `None` without one.
    pub proxy: Option<super::proxy::EgressProxy<'a>>,
}

impl<'a> PodConfig<'a> {
    /// The pod settings of an operator configuration.
    pub fn from_config(c: &'a Config) -> Self {
        PodConfig {
            node_root: &c.node_root,
            helper: (!c.helper_image.trim().is_empty()).then(|| HelperImage {
                image: c.helper_image.trim(),
                pull_policy: &c.helper_image_pull_policy,
            }),
            security: security::Defaults {
                allowed_capabilities: &c.allowed_capabilities,
                run_as_non_root: c.run_as_non_root,
                default_run_as_user: c.default_run_as_user,
            },
            default_runtime_class: (!c.default_runtime_class.is_empty())
                .then_some(c.default_runtime_class.as_str()),
            processes: pids::ProcessLimits {
                default: (c.process_limit > 0).then_some(c.process_limit),
                cgroup_root: &c.pids_cgroup_root,
            },
            sizes: c.size_limits(),
            default_egress: c.default_egress(),
            network_wait: (c.network_enforcement != "Attested")
                .then_some(c.network_check_image.as_str()),
            proxy: c.egress_proxy(),
        }
    }
}

/// The sandbox pod. `pin_node` is the node that holds the workspace, once known: the pod must
/// land there again or the workspace is out of reach. The pin is left out of the spec hash so
/// that learning the node never counts as a spec change.
pub fn build_pod(sbx: &Sandbox, cfg: &PodConfig<'_>, pin_node: Option<&str>) -> Pod {
    let ns = sbx.namespace().unwrap_or_default();
    let dir = workspace_host_path(cfg.node_root, &ns, &sbx.uid().unwrap_or_default());
    build_pod_in(sbx, cfg, &dir, pin_node)
}

/// [`build_pod`] with the workspace in `host_dir`: the directory the sandbox's status records
/// (see [`super::placement`]), which is not the derived one for a sandbox that adopted a warm
/// pod. The directory is part of the spec hash, as it always was, so a pod is compared
/// against the directory it should mount.
pub fn build_pod_in(
    sbx: &Sandbox,
    cfg: &PodConfig<'_>,
    host_dir: &str,
    pin_node: Option<&str>,
) -> Pod {
    let ns = sbx.namespace().unwrap_or_default();
    let (mut pod_spec, hash) = build_pod_spec(&sbx.spec, cfg, host_dir, pin_node);
    // A cold pod whose egress relies on enforcement starts its own containers only once its
    // rules are in force (the wait is not in the spec hash, as no init container is). A warm
    // pod has been under its template's policy long before a claim.
    if let Some(image) = cfg.network_wait
        && sbx.spec.pod.network.egress_or(cfg.default_egress) != Egress::All
    {
        pod_spec
            .init_containers
            .get_or_insert_with(Vec::new)
            .push(super::netcheck::wait_container(image));
    }
    let mut annotations = labels::scope_annotations(&sbx.spec.scope);
    annotations.insert(SPEC_HASH.into(), hash);
    Pod {
        metadata: ObjectMeta {
            name: Some(labels::pod_name(&sbx.name_any())),
            namespace: Some(ns),
            labels: Some(pod_labels(sbx)),
            annotations: Some(annotations),
            owner_references: owner_ref(sbx).map(|o| vec![o]),
            ..Default::default()
        },
        spec: Some(pod_spec),
        status: None,
    }
}

/// The pod spec of a (resolved) sandbox spec whose workspace is the host directory `host_dir`,
/// and its spec hash ([`SPEC_HASH`]): the one builder of sandbox pods, cold ([`build_pod`]) and
/// warm ([`build_warm_pod`]), so a warm pod is exactly what a cold start of the same spec
/// would run.
///
/// The container drops every capability and gets back the effective set of
/// [`security::effective`]; a non-root sandbox gets an init container (the trusted helper)
/// that hands it the workspace directory first. That init container is left out of the spec
/// hash, as is the node pin: it follows from the uid, which the hash covers, and a new helper
/// image (an operator upgrade) must not restart every non-root sandbox.
///
/// A sandbox with a process limit ([`pids::effective`]) gets, when the operator has a helper
/// image, a first init container that sets it ([`pids::init_container`]). The limit is in the
/// hash (a pod of another limit is another pod, and a warm pod of another limit is not
/// adopted); its container, like the other, is not.
pub fn build_pod_spec(
    spec: &SandboxSpec,
    cfg: &PodConfig<'_>,
    host_dir: &str,
    pin_node: Option<&str>,
) -> (PodSpec, String) {
    let sec = security::effective(spec, cfg.security);
    let root = spec.workspace.root.trim_end_matches('/').to_string();

    let (volumes, mounts) = workspace_volumes(spec, host_dir, &root);
    let container = sandbox_container(spec, &sec, root, mounts);

    let mut pod_spec = PodSpec {
        containers: vec![container],
        volumes: Some(volumes),
        restart_policy: Some("Always".into()),
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        termination_grace_period_seconds: Some(10),
        // The operator's default applies at the one builder, so cold and warm pods of a spec
        // agree (a warm pod's shape hash covers it).
        runtime_class_name: super::runtime::effective(spec, cfg.default_runtime_class)
            .map(String::from),
        node_selector: (!spec.pod.node_selector.is_empty()).then(|| spec.pod.node_selector.clone()),
        tolerations: (!spec.pod.tolerations.is_empty()).then(|| spec.pod.tolerations.clone()),
        security_context: Some(PodSecurityContext {
            run_as_user: sec.run_as_user,
            run_as_group: sec.run_as_group,
            run_as_non_root: sec.run_as_non_root,
            seccomp_profile: Some(runtime_default()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let limit = pids::effective(spec, &cfg.processes);
    let size = sizelimit::effective(spec, &cfg.sizes);
    let hash = limited_hash(&pod_spec, limit, size);
    // The proxy's settings are left out of the hash, as the helper's init container is: an
    // operator given a proxy (or another URL) does not restart every sandbox.
    if let Some(proxy) = cfg.proxy.as_ref() {
        let extra =
            super::proxy::proxy_env(proxy, &spec.pod.network, cfg.default_egress, &spec.pod.env);
        if let Some(c) = pod_spec.containers.first_mut()
            && !extra.is_empty()
        {
            c.env.get_or_insert_with(Vec::new).extend(extra);
        }
    }
    if let Some(node) = pin_node {
        pod_spec.affinity = Some(pin_to_node(node));
    }
    let mut inits = Vec::new();
    if let (Some(n), Some(helper)) = (limit, cfg.helper.as_ref()) {
        inits.push(pids::init_container(n, helper));
        pod_spec
            .volumes
            .get_or_insert_with(Vec::new)
            .push(pids::volume(cfg.processes.cgroup_root));
    }
    // Before the workspace is handed to a non-root sandbox: the limit may replace its
    // (empty) directory with a subvolume.
    let sized = size.zip(cfg.helper.as_ref()).and_then(|(bytes, helper)| {
        sizelimit::containers(host_dir, WORKSPACE_VOLUME, bytes, &cfg.sizes, helper)
    });
    let mut sidecar = None;
    if let Some((init, watch, volume)) = sized {
        if let (Some(c), Some(bytes)) = (pod_spec.containers.first_mut(), size) {
            sizelimit::give_limit(c, bytes);
        }
        inits.push(init);
        sidecar = Some(watch);
        pod_spec.volumes.get_or_insert_with(Vec::new).push(volume);
    }
    inits.extend(own_container(&sec, cfg));
    // The sidecar after every plain init container: it starts once they are done.
    inits.extend(sidecar);
    pod_spec.init_containers = (!inits.is_empty()).then_some(inits);
    (pod_spec, hash)
}

/// The pod's shape hash, over its spec and its limits. Without limits the hash is the one
/// pods had before limits existed.
fn limited_hash(pod_spec: &PodSpec, limit: Option<u32>, size: Option<u64>) -> String {
    match (limit, size) {
        (None, None) => json_hash(pod_spec),
        (Some(n), None) => json_hash(&(pod_spec, n)),
        (n, Some(bytes)) => json_hash(&(pod_spec, n, bytes)),
    }
}

/// The init container that hands the workspace to a non-root sandbox's user, when it runs as
/// one and there is a helper image.
fn own_container(sec: &security::Effective, cfg: &PodConfig<'_>) -> Option<Container> {
    let ((uid, gid), helper) = sec.workspace_owner.zip(cfg.helper.as_ref())?;
    let job = agentbox_helper::Job::Own {
        dir: OWN_MOUNT.into(),
        uid,
        gid,
    };
    let mount = VolumeMount {
        name: WORKSPACE_VOLUME.into(),
        mount_path: OWN_MOUNT.into(),
        ..Default::default()
    };
    Some(helper_container(
        OWN_CONTAINER,
        helper,
        &job,
        OWN_CAPS,
        mount,
    ))
}

/// Stands for the workspace directory in [`shape_hash`]: every pod has its own.
const SHAPE_HOST_DIR: &str = "<workspace>";

/// The pod shape hash of a resolved sandbox spec: the spec hash of the pod [`build_pod_spec`]
/// makes for it with the workspace host directory (and, as in every spec hash, the node pin and
/// the init container) left out. Two specs hash equal exactly when their pods differ only in
/// the workspace directory, so a Sandbox may adopt a warm pod of equal hash
/// ([`labels::POD_SHAPE_HASH`]): one made from the pool's template without overrides hashes
/// equal; env additions, host mounts or another workspace root do not. Scope, files, snapshot
/// and lifecycle do not shape the pod and are not in it.
pub fn shape_hash(resolved: &SandboxSpec, cfg: &PodConfig<'_>) -> String {
    build_pod_spec(resolved, cfg, SHAPE_HOST_DIR, None).1
}

/// Host directory of a warm pod's workspace: `<nodeRoot>/<namespace>/warm-<suffix>`.
pub fn warm_host_path(node_root: &str, namespace: &str, suffix: &str) -> String {
    format!(
        "{}/{}",
        namespace_host_path(node_root, namespace),
        labels::warm_dir_name(suffix)
    )
}

/// A warm pod of `pool`: the pod of `resolved` (the pool's template resolved for a Sandbox
/// without overrides) with a workspace directory of its own, named and labelled for the pool
/// (name `<pool>-warm-<suffix>`, labels [`labels::MANAGED_BY`], [`labels::POOL`],
/// [`labels::WARM`]), owned by it as controller, and annotated with its directory
/// ([`labels::WORKSPACE_HOST_DIR`]), its shape hash ([`labels::POD_SHAPE_HASH`]), its spec
/// hash as [`build_pod`] computes it for that directory ([`SPEC_HASH`]) and the template's
/// generation ([`labels::TEMPLATE_GENERATION`]). It carries no scope label, annotation or data.
///
/// What a claim must still do with a warm pod (the pool does only the scope-free part of a
/// start, see [`crate::controller::pool::is_claimable`]): take it with a write conditioned on
/// its resourceVersion (the Sandbox as controller owner, the scope labels and annotations and
/// the sandbox label added, [`labels::WARM`] and [`labels::WARM_READY`] removed, [`labels::POOL`]
/// kept so the pool's watch sees the claim), then initialise the workspace as a cold start does
/// (probe, restore, files, and the marker with the Sandbox's UID, which a warm directory never
/// has).
pub fn build_warm_pod(
    pool: &SandboxPool,
    resolved: &SandboxSpec,
    cfg: &PodConfig<'_>,
    suffix: &str,
    template_generation: i64,
) -> Pod {
    let ns = pool.namespace().unwrap_or_default();
    let host_dir = warm_host_path(cfg.node_root, &ns, suffix);
    let (pod_spec, hash) = build_pod_spec(resolved, cfg, &host_dir, None);
    let labels = BTreeMap::from([
        (labels::MANAGED_BY.to_string(), labels::MANAGER.to_string()),
        (
            labels::POOL.to_string(),
            labels::pool_label_value(&pool.name_any()),
        ),
        (labels::WARM.to_string(), "true".to_string()),
    ]);
    let mut labels = labels;
    if let Some(t) = resolved.template_ref.as_ref() {
        labels.insert(
            labels::TEMPLATE.into(),
            labels::template_label_value(&t.name),
        );
    }
    let annotations = BTreeMap::from([
        (labels::WORKSPACE_HOST_DIR.to_string(), host_dir),
        (
            labels::POD_SHAPE_HASH.to_string(),
            shape_hash(resolved, cfg),
        ),
        (SPEC_HASH.to_string(), hash),
        (
            labels::TEMPLATE_GENERATION.to_string(),
            template_generation.to_string(),
        ),
    ]);
    Pod {
        metadata: ObjectMeta {
            name: Some(labels::warm_pod_name(&pool.name_any(), suffix)),
            namespace: Some(ns),
            labels: Some(labels),
            annotations: Some(annotations),
            // blockOwnerDeletion: a foreground deletion of the pool waits for its pods.
            owner_references: pool.controller_owner_ref(&()).map(|mut o| {
                o.block_owner_deletion = Some(true);
                vec![o]
            }),
            ..Default::default()
        },
        spec: Some(pod_spec),
        status: None,
    }
}

/// The workspace volume (a host directory of the operator's choosing) and the user's host
/// mounts, with their mounts in the sandbox container.
fn workspace_volumes(
    spec: &SandboxSpec,
    host_dir: &str,
    root: &str,
) -> (Vec<Volume>, Vec<VolumeMount>) {
    let mut volumes = vec![Volume {
        name: WORKSPACE_VOLUME.into(),
        host_path: Some(HostPathVolumeSource {
            path: host_dir.to_string(),
            type_: Some("DirectoryOrCreate".into()),
        }),
        ..Default::default()
    }];
    let mut mounts = vec![VolumeMount {
        name: WORKSPACE_VOLUME.into(),
        mount_path: root.to_string(),
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

    (volumes, mounts)
}

/// The sandbox's container: its image and command, the workspace as working directory, every
/// capability dropped but the effective ones, no privilege escalation.
fn sandbox_container(
    spec: &SandboxSpec,
    sec: &security::Effective,
    root: String,
    mounts: Vec<VolumeMount>,
) -> Container {
    let sc = spec.pod.security_context.clone().unwrap_or_default();
    Container {
        name: CONTAINER.into(),
        image: spec.pod.image.clone(),
        image_pull_policy: spec.pod.image_pull_policy.map(|p| p.as_str().to_string()),
        command: Some(
            spec.pod
                .command
                .clone()
                .unwrap_or_else(|| vec!["sh".into(), "-c".into(), KEEP_ALIVE.into()]),
        ),
        args: spec.pod.args.clone(),
        env: (!spec.pod.env.is_empty()).then(|| spec.pod.env.clone()),
        resources: spec.pod.resources.clone(),
        working_dir: Some(root),
        volume_mounts: Some(mounts),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            privileged: Some(false),
            read_only_root_filesystem: sc.read_only_root_filesystem,
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                add: (!sec.capabilities.is_empty()).then(|| sec.capabilities.clone()),
            }),
            ..Default::default()
        }),
        ..Default::default()
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

/// The egress rules of a sandbox's NetworkPolicy: `None` (nothing reachable) is no rule,
/// `Allowlist` a rule per `allow` address block (its block and ports) and, when it has
/// `domain` entries and the operator has a `proxy`, one rule admitting the proxy's pods on
/// their port (without a proxy, domain entries reach nothing); `All` no policy at all
/// (`None` returned). `default` is the cluster's egress for a spec that sets none.
pub fn egress_rules(
    network: &Network,
    default: Egress,
    proxy: Option<&super::proxy::EgressProxy<'_>>,
) -> Option<Vec<NetworkPolicyEgressRule>> {
    let via_proxy = network.allow.iter().any(|a| a.domain.is_some());
    match network.egress_or(default) {
        Egress::All => None,
        Egress::Denied => Some(vec![]),
        Egress::Allowlist => Some(
            proxy
                .filter(|_| via_proxy)
                .map(super::proxy::proxy_rule)
                .into_iter()
                .chain(network.allow.iter().filter_map(|a| {
                    let cidr = a.cidr.clone()?;
                    let ports = (!a.ports.is_empty()).then(|| {
                        a.ports
                            .iter()
                            .map(|p| NetworkPolicyPort {
                                port: Some(IntOrString::Int(p.port)),
                                end_port: p.end_port.filter(|e| *e > p.port),
                                protocol: Some(p.protocol.as_str().to_string()),
                            })
                            .collect()
                    });
                    Some(NetworkPolicyEgressRule {
                        to: Some(vec![NetworkPolicyPeer {
                            ip_block: Some(IPBlock { cidr, except: None }),
                            ..Default::default()
                        }]),
                        ports,
                    })
                }))
                .collect(),
        ),
    }
}

/// An Egress NetworkPolicy named `name` selecting the pods labelled `selector`, with `rules`.
fn egress_policy(
    name: String,
    namespace: Option<String>,
    selector: (String, String),
    rules: Vec<NetworkPolicyEgressRule>,
    labels: BTreeMap<String, String>,
    owner: Option<OwnerReference>,
) -> NetworkPolicy {
    let spec = NetworkPolicySpec {
        pod_selector: Some(LabelSelector {
            match_labels: Some(BTreeMap::from([selector])),
            ..Default::default()
        }),
        policy_types: Some(vec!["Egress".into()]),
        egress: Some(rules),
        ingress: None,
    };
    let hash = json_hash(&spec);
    NetworkPolicy {
        metadata: ObjectMeta {
            name: Some(name),
            namespace,
            labels: Some(labels),
            annotations: Some(BTreeMap::from([(SPEC_HASH.to_string(), hash)])),
            owner_references: owner.map(|o| vec![o]),
            ..Default::default()
        },
        spec: Some(spec),
    }
}

/// The egress NetworkPolicy of a sandbox without a template, selecting its pod (label
/// [`labels::SANDBOX`]); `None` when its egress is `All`.
pub fn build_egress_policy(
    sbx: &Sandbox,
    default: Egress,
    proxy: Option<&super::proxy::EgressProxy<'_>>,
) -> Option<NetworkPolicy> {
    let rules = egress_rules(&sbx.spec.pod.network, default, proxy)?;
    let name = sbx.name_any();
    Some(egress_policy(
        labels::network_policy_name(&name),
        sbx.namespace(),
        (
            labels::SANDBOX.to_string(),
            labels::sandbox_label_value(&name),
        ),
        rules,
        owned_labels(sbx),
        owner_ref(sbx),
    ))
}

/// The egress NetworkPolicy of a template's pods (label [`labels::TEMPLATE`]: its pool's warm
/// pods, claimed or not, and the pods of the sandboxes that name it), owned by the template:
/// a warm pod is under its template's policy before it is claimed, so a claim writes no
/// policy and waits for no rule. `resolved` is a spec resolved against the template; `None`
/// when its egress is `All`.
pub fn build_template_policy(
    template: &TemplateUse,
    namespace: Option<String>,
    resolved: &SandboxSpec,
    default: Egress,
    proxy: Option<&super::proxy::EgressProxy<'_>>,
) -> Option<NetworkPolicy> {
    let rules = egress_rules(&resolved.pod.network, default, proxy)?;
    let owner = OwnerReference {
        api_version: "agentbox.dev/v1alpha1".into(),
        kind: "SandboxTemplate".into(),
        name: template.name.clone(),
        uid: template.uid.clone(),
        controller: Some(true),
        block_owner_deletion: None,
    };
    Some(egress_policy(
        labels::template_policy_name(&template.name),
        namespace,
        (
            labels::TEMPLATE.to_string(),
            labels::template_label_value(&template.name),
        ),
        rules,
        BTreeMap::from([(labels::MANAGED_BY.to_string(), labels::MANAGER.to_string())]),
        (!template.uid.is_empty()).then_some(owner),
    ))
}

/// Where the workspace-owning init container mounts the workspace.
const OWN_MOUNT: &str = "/ws";
/// Name of the init container that hands a non-root sandbox its workspace.
pub const OWN_CONTAINER: &str = "own-workspace";

/// Capabilities of each helper job, all others dropped. Removing a tree whose directories
/// belong to another uid (a non-root sandbox's, or mode 000) needs `DAC_OVERRIDE`; unlinking
/// in a sticky directory of another uid needs `FOWNER`. Preparing a root-owned directory
/// needs none. Owning a workspace needs `CHOWN`, plus the two above to walk and chmod it.
pub(super) const REMOVE_CAPS: &[&str] = &["DAC_OVERRIDE", "FOWNER"];
pub(super) const PREPARE_CAPS: &[&str] = &[];
const OWN_CAPS: &[&str] = &["CHOWN", "DAC_OVERRIDE", "FOWNER"];

/// Host directory of a namespace's workspaces: the parent of each of its workspaces.
pub fn namespace_host_path(node_root: &str, namespace: &str) -> String {
    format!("{node_root}/{namespace}")
}

/// The container of a helper pod or init container: the trusted helper image running one job
/// as root with only `caps` (everything else dropped), a read-only root filesystem, no
/// privilege escalation and the runtime's default seccomp profile.
pub(super) fn helper_container(
    name: &str,
    helper: &HelperImage<'_>,
    job: &agentbox_helper::Job,
    caps: &[&str],
    mount: VolumeMount,
) -> Container {
    let mut command = vec![agentbox_helper::BIN.to_string()];
    command.extend(job.to_args());
    Container {
        name: name.into(),
        image: Some(helper.image.to_string()),
        image_pull_policy: Some(helper.pull_policy.to_string()),
        command: Some(command),
        volume_mounts: Some(vec![mount]),
        resources: Some(ResourceRequirements {
            requests: Some(BTreeMap::from([
                ("cpu".to_string(), Quantity("10m".into())),
                ("memory".to_string(), Quantity("16Mi".into())),
            ])),
            limits: Some(BTreeMap::from([(
                "memory".to_string(),
                Quantity("64Mi".into()),
            )])),
            ..Default::default()
        }),
        security_context: Some(SecurityContext {
            // Root, to act on files of any owner; the capabilities bound what root may do.
            run_as_user: Some(0),
            run_as_group: Some(0),
            run_as_non_root: Some(false),
            allow_privilege_escalation: Some(false),
            privileged: Some(false),
            read_only_root_filesystem: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                add: (!caps.is_empty()).then(|| caps.iter().map(|c| c.to_string()).collect()),
            }),
            seccomp_profile: Some(runtime_default()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub(super) fn runtime_default() -> SeccompProfile {
    SeccompProfile {
        type_: "RuntimeDefault".into(),
        ..Default::default()
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(crate) fn sandbox(extra: serde_json::Value) -> Sandbox {
        let mut spec = serde_json::json!({
            "image": "docker.io/library/busybox:1.37",
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

    pub(crate) const HELPER: HelperImage<'static> = HelperImage {
        image: "agentbox/helper:v1",
        pull_policy: "IfNotPresent",
    };

    pub(crate) fn cfg(node_root: &str) -> PodConfig<'_> {
        PodConfig {
            node_root,
            helper: Some(HELPER),
            security: security::Defaults {
                allowed_capabilities: &[],
                run_as_non_root: false,
                default_run_as_user: 65532,
            },
            default_runtime_class: None,
            processes: pids::ProcessLimits::NONE,
            sizes: sizelimit::SizeLimits::NONE,
            default_egress: agentbox_api::crd::Egress::All,
            network_wait: None,
            proxy: None,
        }
    }

    /// Every helper container: root, only the job's capabilities, nothing else.
    pub(crate) fn assert_least_privilege(c: &Container, caps: &[&str]) {
        let sc = c.security_context.as_ref().unwrap();
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(sc.privileged, Some(false));
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        let k = sc.capabilities.as_ref().unwrap();
        assert_eq!(k.drop, Some(vec!["ALL".to_string()]));
        let added: Vec<&str> = k.add.iter().flatten().map(String::as_str).collect();
        assert_eq!(added, caps);
        assert_eq!(sc.seccomp_profile.as_ref().unwrap().type_, "RuntimeDefault");
        assert_eq!(c.image.as_deref(), Some(HELPER.image));
        assert_eq!(c.command.as_ref().unwrap()[0], agentbox_helper::BIN);
        assert_eq!(c.volume_mounts.as_ref().unwrap().len(), 1);
    }

    #[test]
    fn a_limited_workspace_s_container_is_told_its_limit_outside_the_hash() {
        use agentbox_api::remote::LIMIT_ENV;
        let env = |p: &Pod| -> Vec<(String, Option<String>)> {
            p.spec.as_ref().unwrap().containers[0]
                .env
                .iter()
                .flatten()
                .map(|e| (e.name.clone(), e.value.clone()))
                .collect()
        };
        let hash = |p: &Pod| p.metadata.annotations.as_ref().unwrap()[SPEC_HASH].clone();
        // The spec's own entry of that name is replaced, its other entries kept.
        let own =
            serde_json::json!([{"name": LIMIT_ENV, "value": "1"}, {"name": "A", "value": "b"}]);
        let sbx = sandbox(serde_json::json!({"workspace": {"sizeLimit": "64Mi"}, "env": own}));
        let limited = build_pod(&sbx, &cfg("/w"), None);
        assert_eq!(
            env(&limited),
            [
                ("A".to_string(), Some("b".to_string())),
                (LIMIT_ENV.to_string(), Some((64u64 << 20).to_string()))
            ]
        );
        // Without a helper no limit is set up, so none is announced (the spec's env is left as
        // it is); the hash is the same.
        let bare = PodConfig {
            helper: None,
            ..cfg("/w")
        };
        let unenforced = build_pod(&sbx, &bare, None);
        assert_eq!(
            env(&unenforced),
            [
                (LIMIT_ENV.to_string(), Some("1".to_string())),
                ("A".to_string(), Some("b".to_string()))
            ]
        );
        assert_eq!(hash(&limited), hash(&unenforced));
        let plain = build_pod(&sandbox(serde_json::json!({})), &cfg("/w"), None);
        assert!(env(&plain).is_empty());
    }

    #[test]
    fn the_operators_default_runtime_class_applies_to_pods_whose_spec_names_none() {
        let dflt = PodConfig {
            default_runtime_class: Some("gvisor"),
            ..cfg("/w")
        };
        let rc = |sbx: &Sandbox, c: &PodConfig<'_>| {
            build_pod(sbx, c, None)
                .spec
                .and_then(|s| s.runtime_class_name)
        };
        let plain = sandbox(serde_json::json!({}));
        let kata = sandbox(serde_json::json!({"runtimeClassName": "kata"}));
        assert_eq!(rc(&plain, &dflt).as_deref(), Some("gvisor"));
        assert_eq!(rc(&kata, &dflt).as_deref(), Some("kata"));
        assert_eq!(rc(&plain, &cfg("/w")), None);
        // The class is part of the pod's spec hash and of a warm pod's shape: a warm pod of
        // another runtime class is never claimed.
        let hash = |c: &PodConfig<'_>| {
            build_pod(&plain, c, None).metadata.annotations.unwrap()[SPEC_HASH].clone()
        };
        assert_ne!(hash(&dflt), hash(&cfg("/w")));
        assert_ne!(
            shape_hash(&plain.spec, &dflt),
            shape_hash(&plain.spec, &cfg("/w"))
        );
    }

    #[test]
    fn pod_is_locked_down_owned_and_labelled() {
        let sbx = sandbox(serde_json::json!({"runtimeClassName": "gvisor"}));
        let pod = build_pod(&sbx, &cfg("/var/lib/agentbox/workspaces"), None);
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
        let free = build_pod(&sbx, &cfg("/w"), None);
        let pinned = build_pod(&sbx, &cfg("/w"), Some("node-a"));
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
        assert_ne!(hash(&free), hash(&build_pod(&other, &cfg("/w"), None)));
    }

    pub(crate) fn pool() -> SandboxPool {
        let mut p = SandboxPool::new(
            "py",
            serde_json::from_value(
                serde_json::json!({"templateRef": {"name": "tpl"}, "replicas": 2}),
            )
            .unwrap(),
        );
        p.metadata.namespace = Some("team".into());
        p.metadata.uid = Some("pool-uid".into());
        p
    }

    pub(crate) fn template() -> agentbox_api::crd::SandboxTemplateSpec {
        serde_json::from_value(serde_json::json!({
            "image": "docker.io/library/busybox:1.37",
            "env": [{"name": "MODE", "value": "tpl"}],
            "securityContext": {"runAsNonRoot": true},
            "workspace": {"files": [{"path": "AGENTS.md", "content": "rules"}]},
        }))
        .unwrap()
    }

    /// A Sandbox of template `tpl` with `extra` spec fields, resolved as the controller does.
    pub(crate) fn templated(extra: serde_json::Value) -> Sandbox {
        let mut spec = serde_json::json!({
            "templateRef": {"name": "tpl"},
            "scope": {"kind": "User", "agent": "coder", "user": "alice"},
        });
        for (k, v) in extra.as_object().unwrap() {
            spec[k] = v.clone();
        }
        let mut sbx = Sandbox::new("demo", serde_json::from_value(spec).unwrap());
        sbx.metadata.namespace = Some("team".into());
        sbx.metadata.uid = Some("1234-uid".into());
        sbx.spec = agentbox_api::template::resolve(&template(), &sbx.spec);
        sbx
    }

    #[test]
    fn a_cold_pod_that_relies_on_enforcement_waits_for_its_own_rules_and_a_warm_pod_does_not() {
        use agentbox_api::crd::Egress;
        let probe = PodConfig {
            network_wait: Some("busybox:check"),
            default_egress: Egress::Denied,
            ..cfg("/w")
        };
        let waits = |sbx: &Sandbox, c: &PodConfig<'_>| {
            build_pod(sbx, c, None)
                .spec
                .and_then(|s| s.init_containers)
                .unwrap_or_default()
                .iter()
                .any(|i| {
                    i.name == crate::controller::netcheck::WAIT_CONTAINER
                        && i.image.as_deref() == Some("busybox:check")
                })
        };
        let unset = sandbox(serde_json::json!({}));
        assert!(waits(&unset, &probe), "the default None");
        let listed = sandbox(serde_json::json!({"network": {"egress": "Allowlist",
            "allow": [{"cidr": "10.0.0.0/8"}]}}));
        assert!(waits(&listed, &probe));
        let all = sandbox(serde_json::json!({"network": {"egress": "All"}}));
        assert!(!waits(&all, &probe), "All relies on nothing");
        // Attested: no check, no beacon, no wait.
        let attested = PodConfig {
            network_wait: None,
            ..probe
        };
        assert!(!waits(&unset, &attested));
        // Not in the spec hash: a pod made before (or an edit of the egress) is the same pod.
        let hash = |c: &PodConfig<'_>| {
            build_pod(&unset, c, None)
                .metadata
                .annotations
                .and_then(|a| a.get(SPEC_HASH).cloned())
        };
        assert_eq!(hash(&probe), hash(&attested));
        // A warm pod has been under its template's policy long before a claim.
        let spec = agentbox_api::template::for_pool("tpl", &template());
        let warm = build_warm_pod(&pool(), &spec, &probe, "ab12c", 3);
        assert!(
            !warm
                .spec
                .and_then(|s| s.init_containers)
                .unwrap_or_default()
                .iter()
                .any(|i| i.name == crate::controller::netcheck::WAIT_CONTAINER)
        );
    }

    #[test]
    fn a_warm_pod_is_the_cold_pod_of_its_template_but_for_its_directory_and_metadata() {
        let c = cfg("/w");
        let spec = agentbox_api::template::for_pool("tpl", &template());
        let warm = build_warm_pod(&pool(), &spec, &c, "ab12c", 3);
        let cold = build_pod(&templated(serde_json::json!({})), &c, None);
        let mut warm_spec = warm.spec.clone().unwrap();
        let vol = warm_spec.volumes.as_mut().unwrap()[0]
            .host_path
            .as_mut()
            .unwrap();
        assert_eq!(vol.path, "/w/team/warm-ab12c");
        assert_eq!(vol.type_.as_deref(), Some("DirectoryOrCreate"));
        vol.path = "/w/team/1234-uid".into();
        assert_eq!(
            Some(warm_spec),
            cold.spec,
            "container, security, the own-workspace init container: all the same"
        );
        assert!(
            cold.spec.as_ref().unwrap().init_containers.is_some(),
            "non-root"
        );
        let meta = &warm.metadata;
        assert_eq!(meta.name.as_deref(), Some("py-warm-ab12c"));
        let want: BTreeMap<String, String> = [
            (labels::MANAGED_BY, labels::MANAGER),
            (labels::POOL, "py"),
            (labels::WARM, "true"),
            // its template's egress policy selects it from its start
            (labels::TEMPLATE, "tpl"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(meta.labels.as_ref(), Some(&want), "no scope labels");
        let ann = meta.annotations.as_ref().unwrap();
        assert_eq!(
            ann.keys().map(String::as_str).collect::<Vec<_>>(),
            vec![
                labels::POD_SHAPE_HASH,
                SPEC_HASH,
                labels::TEMPLATE_GENERATION,
                labels::WORKSPACE_HOST_DIR,
            ],
            "no scope annotations"
        );
        assert_eq!(ann[labels::WORKSPACE_HOST_DIR], "/w/team/warm-ab12c");
        assert_eq!(ann[labels::TEMPLATE_GENERATION], "3");
        let owner = &meta.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
            ("SandboxPool", "py", "pool-uid")
        );
        assert_eq!(
            (owner.controller, owner.block_owner_deletion),
            (Some(true), Some(true))
        );
        // The spec hash is the one a Sandbox gets for a pod on that directory.
        let mut at_warm = templated(serde_json::json!({}));
        at_warm.metadata.uid = Some("warm-ab12c".into());
        assert_eq!(
            ann[SPEC_HASH],
            build_pod(&at_warm, &c, None).metadata.annotations.unwrap()[SPEC_HASH]
        );
    }

    #[test]
    fn the_shape_hash_is_equal_for_a_sandbox_without_pod_shaping_overrides_only() {
        let c = cfg("/w");
        let pool_hash = shape_hash(&agentbox_api::template::for_pool("tpl", &template()), &c);
        let same = |extra: serde_json::Value| shape_hash(&templated(extra).spec, &c) == pool_hash;
        assert!(same(serde_json::json!({})));
        assert!(
            same(serde_json::json!({
                "workspace": {"files": [{"path": "task.md", "content": "t"}]},
                "snapshot": {"onStop": true},
                "lifecycle": {"idleTimeout": "5m"},
            })),
            "files, snapshot policy and lifecycle do not shape the pod"
        );
        assert!(!same(
            serde_json::json!({"env": [{"name": "EXTRA", "value": "x"}]})
        ));
        assert!(!same(
            serde_json::json!({"workspace": {"root": "/home/agent"}})
        ));
        assert!(!same(serde_json::json!({"workspace": {"mounts": [
            {"path": "data", "hostPath": "/srv/data"}]}})));
        // Neither the directory nor the node pin nor the helper image is part of it.
        let other = PodConfig {
            node_root: "/elsewhere",
            helper: Some(HelperImage {
                image: "agentbox/helper:v2",
                pull_policy: "Always",
            }),
            ..c
        };
        assert_eq!(
            shape_hash(&templated(serde_json::json!({})).spec, &other),
            pool_hash
        );
        // Another template image is another shape.
        let mut t = template();
        t.pod.image = Some("agentbox/base:v2".into());
        assert_ne!(
            shape_hash(&agentbox_api::template::for_pool("tpl", &t), &c),
            pool_hash
        );
    }

    #[test]
    fn a_pod_in_a_recorded_directory_mounts_it_and_hashes_it() {
        let sbx = sandbox(serde_json::json!({}));
        let derived = build_pod(&sbx, &cfg("/w"), None);
        let warm = build_pod_in(&sbx, &cfg("/w"), "/w/team/warm-abcde", None);
        let path = |p: &Pod| {
            p.spec.as_ref().unwrap().volumes.as_ref().unwrap()[0]
                .host_path
                .as_ref()
                .unwrap()
                .path
                .clone()
        };
        assert_eq!(path(&derived), "/w/team/1234-uid");
        assert_eq!(path(&warm), "/w/team/warm-abcde");
        let hash = |p: &Pod| p.metadata.annotations.as_ref().unwrap()[SPEC_HASH].clone();
        assert_ne!(
            hash(&derived),
            hash(&warm),
            "a pod is compared with its directory"
        );
        assert_eq!(
            hash(&derived),
            hash(&build_pod_in(&sbx, &cfg("/w"), "/w/team/1234-uid", None)),
            "build_pod is build_pod_in the derived directory"
        );
    }

    #[test]
    fn host_mounts_become_volumes_under_the_root() {
        let sbx = sandbox(
            serde_json::json!({"workspace": {"root": "/work/", "mounts": [
                {"path": "./data/", "hostPath": "/srv/shared/data", "readOnly": false}
            ]}}),
        );
        let pod = build_pod(&sbx, &cfg("/w"), None);
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
        let np = build_egress_policy(&sbx, Egress::All, None).unwrap();
        let spec = np.spec.unwrap();
        assert_eq!(spec.policy_types, Some(vec!["Egress".to_string()]));
        assert_eq!(spec.egress, Some(vec![]));
        let sel = spec.pod_selector.unwrap().match_labels.unwrap();
        assert_eq!(sel.get(labels::SANDBOX).map(String::as_str), Some("demo"));
    }

    #[test]
    fn the_clusters_default_egress_applies_to_a_spec_without_one() {
        let sbx = sandbox(serde_json::json!({}));
        assert!(build_egress_policy(&sbx, Egress::All, None).is_none());
        let np = build_egress_policy(&sbx, Egress::Denied, None).unwrap();
        assert_eq!(np.spec.unwrap().egress, Some(vec![]));
        let all = sandbox(serde_json::json!({"network": {"egress": "All"}}));
        assert!(build_egress_policy(&all, Egress::Denied, None).is_none());
    }

    #[test]
    fn an_allowlist_is_one_rule_per_block_with_its_ports() {
        let sbx = sandbox(
            serde_json::json!({"network": {"egress": "Allowlist", "allow": [
                {"cidr": "10.1.0.0/16", "ports": [{"port": 443}, {"port": 8000, "endPort": 8010, "protocol": "UDP"}]},
                {"cidr": "192.0.2.7/32"}
            ]}}),
        );
        let np = build_egress_policy(&sbx, Egress::Denied, None).unwrap();
        let rules = np.spec.unwrap().egress.unwrap();
        assert_eq!(rules.len(), 2);
        let block = |r: &NetworkPolicyEgressRule| {
            r.to.as_ref().unwrap()[0]
                .ip_block
                .as_ref()
                .unwrap()
                .cidr
                .clone()
        };
        assert_eq!(block(&rules[0]), "10.1.0.0/16");
        let ports = rules[0].ports.as_ref().unwrap();
        assert_eq!(ports[0].port, Some(IntOrString::Int(443)));
        assert_eq!(ports[0].protocol.as_deref(), Some("TCP"));
        assert_eq!(ports[1].end_port, Some(8010));
        assert_eq!(ports[1].protocol.as_deref(), Some("UDP"));
        assert_eq!(block(&rules[1]), "192.0.2.7/32");
        assert!(
            rules[1].ports.is_none(),
            "no ports: every port of the block"
        );
    }

    #[test]
    fn a_templates_policy_selects_its_pods_and_is_owned_by_it() {
        let used = TemplateUse {
            name: "tpl".into(),
            uid: "u-1".into(),
            generation: 1,
        };
        let spec = agentbox_api::template::for_pool(
            "tpl",
            &serde_json::from_value(serde_json::json!({"image": "busybox"})).unwrap(),
        );
        let np =
            build_template_policy(&used, Some("ns".into()), &spec, Egress::Denied, None).unwrap();
        assert_eq!(np.metadata.name.as_deref(), Some("tpl-tpl-egress"));
        let owner = &np.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("SandboxTemplate", "u-1")
        );
        let sel = np.spec.unwrap().pod_selector.unwrap().match_labels.unwrap();
        assert_eq!(sel.get(labels::TEMPLATE).map(String::as_str), Some("tpl"));
        assert!(build_template_policy(&used, None, &spec, Egress::All, None).is_none());
    }

    #[test]
    fn the_sandbox_container_drops_all_but_the_default_set() {
        let sbx = sandbox(serde_json::json!({}));
        let pod = build_pod(&sbx, &cfg("/w"), None);
        let spec = pod.spec.unwrap();
        let caps = spec.containers[0]
            .security_context
            .as_ref()
            .unwrap()
            .capabilities
            .clone()
            .unwrap();
        assert_eq!(caps.drop, Some(vec!["ALL".to_string()]));
        let added = caps.add.unwrap();
        assert_eq!(added.len(), security::DEFAULT_CAPABILITIES.len());
        assert!(!added.iter().any(|c| c == "MKNOD"), "no device nodes");
        assert!(
            spec.init_containers.is_none(),
            "root sandboxes need no helper"
        );
    }

    #[test]
    fn a_non_root_sandbox_gets_its_workspace_from_the_helper_first() {
        let sbx = sandbox(serde_json::json!({"securityContext": {"runAsNonRoot": true}}));
        let pod = build_pod(&sbx, &cfg("/w"), None);
        let spec = pod.spec.as_ref().unwrap();
        let psc = spec.security_context.as_ref().unwrap();
        assert_eq!(
            (psc.run_as_user, psc.run_as_group, psc.run_as_non_root),
            (Some(65532), Some(65532), Some(true))
        );
        let init = &spec.init_containers.as_ref().unwrap()[0];
        assert_eq!(init.name, OWN_CONTAINER);
        assert_least_privilege(init, OWN_CAPS);
        let args = init.command.as_ref().unwrap()[1..].to_vec();
        assert_eq!(
            agentbox_helper::Job::parse(&args).unwrap(),
            agentbox_helper::Job::Own {
                dir: OWN_MOUNT.into(),
                uid: 65532,
                gid: 65532
            }
        );
        assert_eq!(
            init.volume_mounts.as_ref().unwrap()[0].name,
            WORKSPACE_VOLUME,
            "the workspace only"
        );
        // Another helper image (an operator upgrade) is not a spec change.
        let other = PodConfig {
            helper: Some(HelperImage {
                image: "agentbox/helper:v2",
                pull_policy: "IfNotPresent",
            }),
            ..cfg("/w")
        };
        let hash = |p: &Pod| p.metadata.annotations.as_ref().unwrap()[SPEC_HASH].clone();
        assert_eq!(hash(&pod), hash(&build_pod(&sbx, &other, None)));
    }
}
