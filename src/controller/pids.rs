//! A sandbox's process limit: the most processes and threads its pod may have at once, so a
//! fork bomb in one sandbox stops at its own limit instead of taking every process id of its
//! node (the kubelet's, and every other tenant's).
//!
//! Kubernetes has no per-pod field for it: the kubelet's `podPidsLimit` is one value per node.
//! agentbox sets each sandbox's own with its trusted helper, run as the pod's first init
//! container (before any of the sandbox's code): it mounts only the pod's own pids cgroup
//! (`<pids cgroup root>/burstable/pod<uid>`, a `subPathExpr` on the pod's UID) and lowers its
//! `pids.max` to the limit, never above what the kubelet set. Its report (the init container's
//! termination message) says what it set and what the kubelet had given the pod; the operator
//! shows both on the Sandbox as the conditions [`CONDITION`] and [`NODE_CONDITION`], with a
//! Warning Event when either is False. A limit that cannot be set fails the init container, so
//! the pod does not start (fail closed). Pure functions of the spec, the config and the pod.

use k8s_openapi::api::core::v1::{
    Container, ContainerStatus, EnvVar, EnvVarSource, HostPathVolumeSource, ObjectFieldSelector,
    Pod, Volume, VolumeMount,
};

use super::pod::{HelperImage, helper_container};
use agentbox_api::crd::SandboxSpec;
use agentbox_helper::Report;

/// Condition type on a Sandbox: its pod's process limit is set.
pub const CONDITION: &str = "ProcessLimited";
/// Condition type on a Sandbox: the kubelet of its node limits every pod's processes
/// (`podPidsLimit`), as found in the sandbox's pod.
pub const NODE_CONDITION: &str = "NodePidsLimited";
/// Name of the init container that sets the limit.
pub const INIT_CONTAINER: &str = "limit-processes";
/// The pod volume of the pods' pids cgroups (the QoS class's directory).
pub const VOLUME: &str = "pids-cgroup";
/// Where the init container mounts its pod's own pids cgroup.
const MOUNT: &str = "/pids";
/// The environment variable holding the pod's UID, for the mount's `subPathExpr`.
const POD_UID_ENV: &str = "POD_UID";
/// The kubelet's directory of Burstable pods under its pods' cgroup (cgroupfs driver). Every
/// pod with this init container is Burstable: the helper container requests CPU and sets no
/// CPU limit, so no pod holding it is Guaranteed or BestEffort.
const QOS_DIR: &str = "burstable";

/// What the operator's configuration says about process limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessLimits<'a> {
    /// The limit of sandboxes whose spec sets none (`--process-limit`; 0 there is `None`).
    pub default: Option<u32>,
    /// The host directory of the pods' pids cgroups (`--pids-cgroup-root`).
    pub cgroup_root: &'a str,
}

impl ProcessLimits<'static> {
    /// No default limit, the default cgroup root.
    pub const NONE: ProcessLimits<'static> = ProcessLimits {
        default: None,
        cgroup_root: crate::config::DEFAULT_PIDS_CGROUP_ROOT,
    };
}

/// The limit of a (resolved) sandbox spec: its own `processLimit`, else the operator's default.
pub fn effective(spec: &SandboxSpec, limits: &ProcessLimits<'_>) -> Option<u32> {
    spec.pod.process_limit.or(limits.default)
}

/// The init container that sets the pod's limit to `limit`: the helper's `pids` job on the
/// pod's own pids cgroup, mounted by the pod's UID (the kubelet expands `subPathExpr` when it
/// starts the container), and nothing else of the node.
pub fn init_container(limit: u32, helper: &HelperImage<'_>) -> Container {
    let job = agentbox_helper::Job::Pids {
        dir: MOUNT.into(),
        limit: u64::from(limit),
    };
    let mount = VolumeMount {
        name: VOLUME.into(),
        mount_path: MOUNT.into(),
        sub_path_expr: Some(format!("pod$({POD_UID_ENV})")),
        ..Default::default()
    };
    // Root owns the cgroup's files: writing `pids.max` needs no capability.
    let mut c = helper_container(INIT_CONTAINER, helper, &job, &[], mount);
    c.env = Some(vec![EnvVar {
        name: POD_UID_ENV.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: "metadata.uid".into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }]);
    c
}

/// The volume [`init_container`] mounts from: the node's directory of Burstable pods' pids
/// cgroups. It must exist (`Directory`): one the kubelet did not make would hold no pod.
pub fn volume(cgroup_root: &str) -> Volume {
    Volume {
        name: VOLUME.into(),
        host_path: Some(HostPathVolumeSource {
            path: format!("{}/{QOS_DIR}", cgroup_root.trim_end_matches('/')),
            type_: Some("Directory".into()),
        }),
        ..Default::default()
    }
}

/// What the pod says about its limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The helper set it: the limit, and what the kubelet had given the pod (`max`: nothing).
    Limited {
        /// `pids.max` as set.
        limit: String,
        /// `pids.max` as the kubelet made it.
        kubelet: String,
    },
    /// It could not be set: why (the pod does not start).
    NotEnforced(String),
    /// The pod has no init container that sets it (made without a limit).
    Missing,
}

/// The outcome of the pod's [`INIT_CONTAINER`]. `None` while it has not finished.
pub fn outcome(pod: &Pod) -> Option<Outcome> {
    let spec = pod.spec.as_ref()?;
    let has_init = spec
        .init_containers
        .iter()
        .flatten()
        .any(|c| c.name == INIT_CONTAINER);
    if !has_init {
        return Some(Outcome::Missing);
    }
    let st = pod
        .status
        .as_ref()?
        .init_container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == INIT_CONTAINER)?;
    init_outcome(st)
}

fn init_outcome(st: &ContainerStatus) -> Option<Outcome> {
    let state = st.state.as_ref()?;
    if let Some(t) = &state.terminated {
        let message = t.message.clone().unwrap_or_default();
        if t.exit_code == 0 {
            return Some(match Report::parse(&message) {
                Some(r) if r.get("job") == Some("pids") => Outcome::Limited {
                    limit: r.get("limit").unwrap_or("unknown").to_string(),
                    kubelet: r.get("kubelet").unwrap_or("unknown").to_string(),
                },
                _ => Outcome::NotEnforced(format!(
                    "the helper reported no limit: {:?}",
                    message.trim()
                )),
            });
        }
        return Some(Outcome::NotEnforced(failed(t.exit_code, &message)));
    }
    if let Some(w) = &state.waiting {
        let reason = w.reason.clone().unwrap_or_default();
        if matches!(
            reason.as_str(),
            "" | "PodInitializing" | "ContainerCreating"
        ) {
            return None;
        }
        // A crash loop: its last run says why.
        let last = st.last_state.as_ref().and_then(|s| s.terminated.as_ref());
        return Some(Outcome::NotEnforced(match last {
            Some(t) if t.exit_code != 0 => failed(t.exit_code, t.message.as_deref().unwrap_or("")),
            _ => format!("{reason}: {}", w.message.as_deref().unwrap_or("")),
        }));
    }
    None
}

fn failed(code: i32, message: &str) -> String {
    format!("the helper exited with code {code}: {}", message.trim())
}

/// A condition: status, reason, message.
pub type Cond = (bool, &'static str, String);

/// The [`CONDITION`] and [`NODE_CONDITION`] of a sandbox whose pod `pod` (on `node`) should
/// have `limit` (`None`: no limit asked for, no conditions). `helper`: the operator has a
/// helper image. The node's condition only once the helper has read the kubelet's limit.
pub fn conditions(
    pod: &Pod,
    node: &str,
    limit: Option<u32>,
    helper: bool,
) -> Option<(Cond, Option<Cond>)> {
    let limit = limit?;
    if !helper {
        return Some((
            (
                false,
                "NoHelperImage",
                format!(
                    "the process limit of {limit} is not set: this operator has no helper image (--helper-image) to set it with"
                ),
            ),
            None,
        ));
    }
    Some(match outcome(pod)? {
        Outcome::Limited { limit, kubelet } => {
            let node_cond = if kubelet == "max" {
                (
                    false,
                    "NoPodPidsLimit",
                    format!(
                        "the kubelet on node {node} gives pods no process limit (podPidsLimit): this sandbox has its own, but other pods there have none (docs/security.md)"
                    ),
                )
            } else {
                (
                    true,
                    "PodPidsLimit",
                    format!("the kubelet on node {node} limits every pod to {kubelet} processes"),
                )
            };
            (
                (
                    true,
                    "Limited",
                    format!(
                        "the sandbox's pod on node {node} may have at most {limit} processes and threads (pids.max; the kubelet's limit: {kubelet})"
                    ),
                ),
                Some(node_cond),
            )
        }
        Outcome::NotEnforced(why) => (
            (
                false,
                "NotEnforced",
                format!(
                    "the process limit of {limit} could not be set on node {node}, so the pod does not start: {why}"
                ),
            ),
            None,
        ),
        Outcome::Missing => (
            (
                false,
                "NotEnforced",
                format!(
                    "the sandbox's pod was made without a process limit; the limit of {limit} applies from its next start"
                ),
            ),
            None,
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::pod::tests::HELPER;

    fn pod(init: bool, status: serde_json::Value) -> Pod {
        let inits = if init {
            serde_json::json!([{"name": INIT_CONTAINER, "image": "h"}])
        } else {
            serde_json::json!([])
        };
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "sbx-a"},
            "spec": {"initContainers": inits, "containers": [{"name": "sandbox", "image": "i"}]},
            "status": {"initContainerStatuses": [status]},
        }))
        .unwrap()
    }

    fn init_status(state: serde_json::Value, last: serde_json::Value) -> serde_json::Value {
        serde_json::json!({"name": INIT_CONTAINER, "ready": false, "restartCount": 0,
            "image": "h", "imageID": "", "state": state, "lastState": last})
    }

    #[test]
    fn the_init_container_mounts_only_its_pods_cgroup_and_runs_the_pids_job() {
        let c = init_container(256, &HELPER);
        let m = &c.volume_mounts.as_ref().unwrap()[0];
        assert_eq!(m.sub_path_expr.as_deref(), Some("pod$(POD_UID)"));
        assert_eq!(m.mount_path, MOUNT);
        let env = &c.env.as_ref().unwrap()[0];
        assert_eq!(env.name, "POD_UID");
        let field = env.value_from.as_ref().unwrap().field_ref.as_ref().unwrap();
        assert_eq!(field.field_path, "metadata.uid");
        let args: Vec<String> = c.command.clone().unwrap()[1..].to_vec();
        assert_eq!(
            agentbox_helper::Job::parse(&args).unwrap(),
            agentbox_helper::Job::Pids {
                dir: MOUNT.into(),
                limit: 256
            }
        );
        let caps = c.security_context.unwrap().capabilities.unwrap();
        assert_eq!(caps.add, None);
        let v = volume("/sys/fs/cgroup/pids/kubepods/");
        let hp = v.host_path.unwrap();
        assert_eq!(hp.path, "/sys/fs/cgroup/pids/kubepods/burstable");
        assert_eq!(hp.type_.as_deref(), Some("Directory"));
    }

    #[test]
    fn outcomes_are_read_from_the_init_containers_status() {
        let done = |code: i32, message: &str| {
            pod(
                true,
                init_status(
                    serde_json::json!({"terminated": {"exitCode": code, "message": message}}),
                    serde_json::json!({}),
                ),
            )
        };
        let report = Report::default()
            .with("job", "pids")
            .with("limit", 256)
            .with("kubelet", "max")
            .with("current", 2)
            .line();
        assert_eq!(
            outcome(&done(0, &report)),
            Some(Outcome::Limited {
                limit: "256".into(),
                kubelet: "max".into()
            })
        );
        assert!(matches!(
            outcome(&done(0, "")),
            Some(Outcome::NotEnforced(_))
        ));
        assert!(matches!(
            outcome(&done(1, "agentbox-helper: writing /pids/pids.max: denied")),
            Some(Outcome::NotEnforced(m)) if m.contains("code 1") && m.contains("denied")
        ));
        let looping = pod(
            true,
            init_status(
                serde_json::json!({"waiting": {"reason": "CrashLoopBackOff", "message": "back-off"}}),
                serde_json::json!({"terminated": {"exitCode": 1, "message": "no process is in this cgroup"}}),
            ),
        );
        assert!(matches!(outcome(&looping),
            Some(Outcome::NotEnforced(m)) if m.contains("no process is in this cgroup")));
        let config = pod(
            true,
            init_status(
                serde_json::json!({"waiting": {"reason": "CreateContainerConfigError", "message": "failed to prepare subPath"}}),
                serde_json::json!({}),
            ),
        );
        assert!(matches!(outcome(&config),
            Some(Outcome::NotEnforced(m)) if m.contains("CreateContainerConfigError")));
        let starting = pod(
            true,
            init_status(
                serde_json::json!({"waiting": {"reason": "PodInitializing"}}),
                serde_json::json!({}),
            ),
        );
        assert_eq!(outcome(&starting), None);
        let none = pod(
            false,
            init_status(serde_json::json!({}), serde_json::json!({})),
        );
        assert_eq!(outcome(&none), Some(Outcome::Missing));
    }

    #[test]
    fn conditions_say_what_was_set_and_what_the_kubelet_gave() {
        let report = |kubelet: &str| {
            let line = Report::default()
                .with("job", "pids")
                .with("limit", 256)
                .with("kubelet", kubelet)
                .line();
            pod(
                true,
                init_status(
                    serde_json::json!({"terminated": {"exitCode": 0, "message": line}}),
                    serde_json::json!({}),
                ),
            )
        };
        assert_eq!(conditions(&report("max"), "n", None, true), None);
        let (own, node) = conditions(&report("max"), "n", Some(256), true).unwrap();
        assert_eq!((own.0, own.1), (true, "Limited"));
        assert!(own.2.contains("at most 256"), "{}", own.2);
        let node = node.unwrap();
        assert_eq!((node.0, node.1), (false, "NoPodPidsLimit"));
        let (_, node) = conditions(&report("4096"), "n", Some(256), true).unwrap();
        let node = node.unwrap();
        assert_eq!((node.0, node.1), (true, "PodPidsLimit"));
        assert!(node.2.contains("4096"));
        let (own, node) = conditions(&report("max"), "n", Some(256), false).unwrap();
        assert_eq!((own.0, own.1, node), (false, "NoHelperImage", None));
        let missing = pod(
            false,
            init_status(serde_json::json!({}), serde_json::json!({})),
        );
        let (own, _) = conditions(&missing, "n", Some(256), true).unwrap();
        assert_eq!((own.0, own.1), (false, "NotEnforced"));
    }

    #[test]
    fn the_spec_wins_over_the_operators_default() {
        let mut spec: SandboxSpec = serde_json::from_value(serde_json::json!({
            "image": "i", "scope": {"kind": "Global"}
        }))
        .unwrap();
        let limits = ProcessLimits {
            default: Some(1024),
            ..ProcessLimits::NONE
        };
        assert_eq!(effective(&spec, &limits), Some(1024));
        assert_eq!(effective(&spec, &ProcessLimits::NONE), None);
        spec.pod.process_limit = Some(256);
        assert_eq!(effective(&spec, &limits), Some(256));
    }
}
