//! The helper pods: one job of the trusted node-side helper (agentbox-helper) each, bound to
//! one node — removing a deleted sandbox's workspace, listing and sweeping a namespace's
//! directories, pruning the node root, preparing a namespace's directory — their names and
//! labels, and how their outcome and a refused create are read. The sandbox pod and its
//! `own-workspace` init container are [`super::pod`]'s.

use std::collections::BTreeMap;

use agentbox_helper::Report;
use k8s_openapi::api::core::v1::{
    HostPathVolumeSource, Pod, PodSecurityContext, PodSpec, Toleration, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::{Resource, ResourceExt};
use sha2::{Digest, Sha256};

use super::placement::NodeDir;
use super::pod::{
    HelperImage, PREPARE_CAPS, PodConfig, REMOVE_CAPS, helper_container, namespace_host_path,
    owner_ref, runtime_default,
};
use agentbox_api::crd::{Sandbox, SandboxPool, SandboxSnapshot, SandboxSpec};
use agentbox_api::labels;

/// Where helper pods mount the namespace's workspace directory.
pub const NAMESPACE_MOUNT: &str = "/ns";
/// Where an archive pod mounts the workspace it archives.
pub const WORKSPACE_MOUNT: &str = "/workspace";
/// Label on helper pods: which job (`remove`, `prepare`, `archive`).
pub const HELPER_LABEL: &str = "agentbox.dev/helper";
/// The container of an archive pod (see [`build_archive_pod`]), the one the operator execs in.
pub const ARCHIVE_CONTAINER: &str = "archive";
/// The one capability an archive pod has: root reads and searches every file and directory of
/// the workspace whatever its owner and mode (a non-root sandbox's workspace is `0700`, its
/// files may be `000`). `DAC_OVERRIDE`, not `DAC_READ_SEARCH`: the latter also grants
/// `open_by_handle_at(2)` (the runtime's default seccomp profile allows it to a holder of that
/// capability), which opens any file of the mount's filesystem by its handle, past the
/// mounted directory (the "shocker" container escape), and a harness allowed `pods/exec` in the
/// namespace could run a program the sandbox left in its workspace in this pod. What
/// `DAC_OVERRIDE` adds, writing, the read-only mount takes away; the sandbox's own container
/// has it too.
pub const ARCHIVE_CAPS: &[&str] = &["DAC_OVERRIDE"];
/// The container of a restore pod (see [`build_restore_pod`]), the one the operator execs in.
pub const RESTORE_CONTAINER: &str = "restore";
/// What a restore pod's root needs to write a workspace as the sandbox's own `tar -x` would:
/// enter and write its directories whatever their owner and mode (`DAC_OVERRIDE`), give what
/// it makes to the sandbox's user (`CHOWN`), then set the modes and times of what is no longer
/// its own (`FOWNER`). No `FSETID`: the canonical archive carries no setuid or setgid bit, and
/// without it none can be set on a file of another owner. No `DAC_READ_SEARCH` (see
/// [`ARCHIVE_CAPS`]). The sandbox's own container under runc has all three.
pub const RESTORE_CAPS: &[&str] = &["CHOWN", "DAC_OVERRIDE", "FOWNER"];

/// The labels of one of a sandbox's helper pods (`job`: `remove`, `archive`): its scope's
/// labels (so the operator's watch of its own pods sees it) and the job, but not the
/// sandbox's own [`labels::SANDBOX`] label, which is what the sandbox's Service, egress
/// policy and "the sandbox's pod" select by: a helper pod is never taken for the sandbox.
fn sandbox_helper_labels(sbx: &Sandbox, job: &str) -> BTreeMap<String, String> {
    let mut l = labels::scope_labels(&sbx.spec.scope);
    l.insert(HELPER_LABEL.into(), job.into());
    l
}

/// Name of the pod that removes a sandbox's workspace directory from its node.
pub fn cleanup_pod_name(sbx: &Sandbox) -> String {
    // Named for this sandbox's uid, not its name: a leftover from an earlier sandbox of the
    // same name is never taken for this one's.
    format!("sbx-cleanup-{}", sbx.uid().unwrap_or_default())
}

/// Name of the pod that removes this sandbox's workspace directory left on the lost `node`:
/// distinct from [`cleanup_pod_name`], so a deletion's cleanup never takes its completion for
/// the removal of the directory on the node the sandbox runs on.
pub fn abandoned_cleanup_pod_name(sbx: &Sandbox, node: &str) -> String {
    format!(
        "sbx-cleanup-{}-{}",
        sbx.uid().unwrap_or_default(),
        hex::encode(&Sha256::digest(node.as_bytes())[..4])
    )
}

/// Name of the pod that prepares and checks a namespace's workspace directory on `node`.
pub fn prepare_pod_name(node: &str) -> String {
    format!(
        "agentbox-prepare-{}",
        hex::encode(&Sha256::digest(node.as_bytes())[..8])
    )
}

/// The host directory a helper pod mounts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HelperMount<'a> {
    /// The namespace's workspace directory, read-write at [`NAMESPACE_MOUNT`]: the parent of
    /// the workspaces a job changes.
    Namespace,
    /// The same directory read-only: only to name its entries. Never more than the
    /// namespace's own directory: helper pods run in the tenant's namespace, where a harness
    /// may be allowed `pods/exec`, so what one mounts must not reach another namespace's
    /// workspaces (not even their names).
    NamespaceReadOnly,
    /// The node root (every namespace's directory), read-only, to name the namespaces that
    /// have directories there. Only ever in `--helper-namespace`, the operator's own, where no
    /// harness may exec.
    NodeRootReadOnly,
    /// The node root read-write, to remove a deleted namespace's empty directory. Only ever in
    /// `--helper-namespace`.
    NodeRoot,
    /// One sandbox's workspace directory (this host path), read-only at [`WORKSPACE_MOUNT`], to
    /// archive it: nothing of the namespace's other workspaces. It must exist (a missing one
    /// is not created empty).
    WorkspaceReadOnly(&'a str),
    /// The same, read-write, to extract a restore into it.
    Workspace(&'a str),
}

impl HelperMount<'_> {
    /// The pod's one volume and its container's mount of it.
    fn volume(self, node_root: &str, ns: &str) -> (Volume, VolumeMount) {
        let (name, mount_path, path) = match self {
            HelperMount::Namespace | HelperMount::NamespaceReadOnly => (
                "namespace",
                NAMESPACE_MOUNT,
                namespace_host_path(node_root, ns),
            ),
            HelperMount::NodeRoot | HelperMount::NodeRootReadOnly => {
                ("namespace", NAMESPACE_MOUNT, node_root.to_string())
            }
            HelperMount::WorkspaceReadOnly(dir) | HelperMount::Workspace(dir) => {
                ("workspace", WORKSPACE_MOUNT, dir.to_string())
            }
        };
        let read_only = !matches!(
            self,
            HelperMount::Namespace | HelperMount::NodeRoot | HelperMount::Workspace(_)
        );
        // A namespace directory removed by hand must not leave the pod stuck on its mount; an
        // empty one created here holds nothing (and `prepare` makes it root-only once a
        // sandbox of the namespace starts on the node). A workspace is never made: an empty
        // one would be archived as the sandbox's.
        let type_ = match self {
            HelperMount::WorkspaceReadOnly(_) | HelperMount::Workspace(_) => "Directory",
            _ => "DirectoryOrCreate",
        };
        let volume = Volume {
            name: name.into(),
            host_path: Some(HostPathVolumeSource {
                path,
                type_: Some(type_.into()),
            }),
            ..Default::default()
        };
        let mount = VolumeMount {
            name: name.into(),
            mount_path: mount_path.into(),
            read_only: read_only.then_some(true),
            ..Default::default()
        };
        (volume, mount)
    }
}

/// One helper pod's work: where it runs, what it runs and with which rights.
struct Work<'a> {
    /// The pod's name.
    name: String,
    /// The node it is bound to.
    node: &'a str,
    /// Its container's name (the job's kind: `prepare`, `list`, `remove`, `prune`).
    kind: &'a str,
    /// The helper's job.
    job: agentbox_helper::Job,
    /// The capabilities the job needs, and no more.
    caps: &'a [&'a str],
    /// The directory it mounts.
    mount: HelperMount<'a>,
    /// Its labels.
    labels: BTreeMap<String, String>,
}

/// A pod bound directly to `work.node` (no scheduling: it must run exactly there, even on a
/// cordoned node) in namespace `ns` that runs one helper job on the directory its mount
/// names. It tolerates `tolerations`, nothing more.
fn helper_pod(
    ns: &str,
    tolerations: Option<Vec<Toleration>>,
    cfg: &PodConfig<'_>,
    helper: &HelperImage<'_>,
    work: Work<'_>,
) -> Pod {
    let Work {
        name,
        node,
        kind,
        job,
        caps,
        mount,
        labels,
    } = work;
    let (volume, volume_mount) = mount.volume(cfg.node_root, ns);
    Pod {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(ns.to_string()),
            labels: Some(labels),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.to_string()),
            restart_policy: Some("Never".into()),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            termination_grace_period_seconds: Some(1),
            tolerations,
            containers: vec![helper_container(kind, helper, &job, caps, volume_mount)],
            volumes: Some(vec![volume]),
            security_context: Some(PodSecurityContext {
                seccomp_profile: Some(runtime_default()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: None,
    }
}

/// A helper pod for one of a sandbox's own jobs: in its namespace, with its tolerations, on
/// the namespace's directory.
fn sandbox_helper_pod(
    sbx: &Sandbox,
    cfg: &PodConfig<'_>,
    helper: &HelperImage<'_>,
    work: Work<'_>,
) -> Pod {
    let tolerations =
        (!sbx.spec.pod.tolerations.is_empty()).then(|| sbx.spec.pod.tolerations.clone());
    let ns = sbx.namespace().unwrap_or_default();
    helper_pod(&ns, tolerations, cfg, helper, work)
}

/// The pod `name` that removes this sandbox's workspace directory `at.dir` (an entry of the
/// namespace's directory, see [`super::placement::dir_name`]; only it) from `at.node`:
/// the helper's `remove` job on the namespace's directory, which it needs mounted to unlink the
/// workspace's entry. `None` without a helper image: the sandbox's own image is never used,
/// since whatever it calls `rm` is the sandbox author's code.
pub fn build_cleanup_pod(
    sbx: &Sandbox,
    cfg: &PodConfig<'_>,
    at: NodeDir<'_>,
    name: String,
) -> Option<Pod> {
    let (node, dir) = (at.node, at.dir);
    let helper = cfg.helper.as_ref()?;
    let job = agentbox_helper::Job::Remove {
        root: NAMESPACE_MOUNT.into(),
        names: vec![dir.to_string()],
    };
    let labels = sandbox_helper_labels(sbx, "remove");
    // Not owned: a foreground deletion of the sandbox would have the garbage collector remove
    // it before it ran. The reconciler deletes it once it has succeeded.
    let work = Work {
        name,
        node,
        kind: "remove",
        job,
        caps: REMOVE_CAPS,
        mount: HelperMount::Namespace,
        labels,
    };
    Some(sandbox_helper_pod(sbx, cfg, helper, work))
}

/// Name of the pod that archives a snapshot's workspace: one per SandboxSnapshot (its uid), so
/// a retried attempt finds its own pod and no other snapshot's.
pub fn archive_pod_name(snap: &SandboxSnapshot) -> String {
    format!("snap-archive-{}", snap.uid().unwrap_or_default())
}

/// The pod in which the operator runs the helper's `archive` job on the workspace `at.dir` of
/// `sbx` on `at.node`, by exec, for snapshot `snap` (see the snapshot controller's choice of
/// path): that directory alone mounted read-only, root with [`ARCHIVE_CAPS`] only, no service
/// account token, the runtime's default seccomp profile and no runtime class (the trusted
/// helper runs under the node's default runtime, runc, whatever runtime the sandbox has). Its
/// main process holds for `hold_secs` and then ends, so a pod the operator lost ends by
/// itself; it is owned by the snapshot, so it goes with it; the operator deletes it when the
/// attempt ends. `None` without a helper image.
pub fn build_archive_pod(
    sbx: &Sandbox,
    snap: &SandboxSnapshot,
    cfg: &PodConfig<'_>,
    at: NodeDir<'_>,
    hold_secs: u64,
) -> Option<Pod> {
    let helper = cfg.helper.as_ref()?;
    let labels = sandbox_helper_labels(sbx, "archive");
    let work = Work {
        name: archive_pod_name(snap),
        node: at.node,
        kind: ARCHIVE_CONTAINER,
        job: agentbox_helper::Job::Hold { secs: hold_secs },
        caps: ARCHIVE_CAPS,
        mount: HelperMount::WorkspaceReadOnly(at.dir),
        labels,
    };
    let mut pod = sandbox_helper_pod(sbx, cfg, helper, work);
    // Not as controller: nothing controls it but the attempt that made it.
    pod.metadata.owner_references = snap.controller_owner_ref(&()).map(|mut o| {
        o.controller = None;
        o.block_owner_deletion = None;
        vec![o]
    });
    Some(pod)
}

/// Name of the pod that extracts a restore into a sandbox's workspace: one per sandbox (its
/// uid), since a sandbox restores one snapshot at a time, under its scope's guard.
pub fn restore_pod_name(sbx: &Sandbox) -> String {
    format!("sbx-restore-{}", sbx.uid().unwrap_or_default())
}

/// The pod in which the operator runs the helper's `extract` job into the workspace `at.dir`
/// of `sbx` on `at.node`, by exec, for a restore (see the restore's choice of path): that
/// directory alone mounted read-write, root with [`RESTORE_CAPS`] only, no service account
/// token, the runtime's default seccomp profile and no runtime class (the trusted helper runs
/// under the node's default runtime whatever runtime the sandbox has). Its main process holds
/// for `hold_secs`, so a pod the operator lost ends by itself; it is owned by the sandbox (not
/// as controller: it is not the sandbox's pod), so it goes with it; the operator deletes it
/// when the restore ends. `None` without a helper image.
pub fn build_restore_pod(
    sbx: &Sandbox,
    cfg: &PodConfig<'_>,
    at: NodeDir<'_>,
    hold_secs: u64,
) -> Option<Pod> {
    let helper = cfg.helper.as_ref()?;
    let work = Work {
        name: restore_pod_name(sbx),
        node: at.node,
        kind: RESTORE_CONTAINER,
        job: agentbox_helper::Job::Hold { secs: hold_secs },
        caps: RESTORE_CAPS,
        mount: HelperMount::Workspace(at.dir),
        labels: sandbox_helper_labels(sbx, "restore"),
    };
    let mut pod = sandbox_helper_pod(sbx, cfg, helper, work);
    pod.metadata.owner_references = owner_ref(sbx).map(|mut o| {
        o.controller = None;
        o.block_owner_deletion = None;
        vec![o]
    });
    Some(pod)
}

/// The helper's command line that extracts the archive on its stdin into the staging
/// directory `id` of a restore pod's workspace.
pub fn extract_argv(id: &str) -> Vec<String> {
    let mut argv = vec![agentbox_helper::BIN.to_string()];
    argv.extend(
        agentbox_helper::Job::Extract {
            dir: WORKSPACE_MOUNT.into(),
            id: id.to_string(),
        }
        .to_args(),
    );
    argv
}

/// The helper's command line that writes the archive of an archive pod's workspace.
pub fn archive_argv() -> Vec<String> {
    let mut argv = vec![agentbox_helper::BIN.to_string()];
    argv.extend(
        agentbox_helper::Job::Archive {
            dir: WORKSPACE_MOUNT.into(),
        }
        .to_args(),
    );
    argv
}

/// Name of the orphan sweep's pod on `node` for `job` (`list` or `sweep`), one per node in each
/// namespace: a pod left by an operator that stopped midway is found again by it.
pub fn sweep_pod_name(job: &str, node: &str) -> String {
    format!(
        "agentbox-{job}-{}",
        hex::encode(&Sha256::digest(node.as_bytes())[..8])
    )
}

/// Label of a sweep pod: the namespace whose workspace directory it works on (it may run in
/// another, `--helper-namespace`, when that one takes no new pods).
pub const FOR_NAMESPACE_LABEL: &str = "agentbox.dev/for-namespace";

/// Labels of the orphan sweep's pods (owned by no sandbox: the sweep deletes them itself).
fn sweep_labels(job: &str, ns: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (labels::MANAGED_BY.to_string(), labels::MANAGER.to_string()),
        (HELPER_LABEL.to_string(), job.to_string()),
        (FOR_NAMESPACE_LABEL.to_string(), ns.to_string()),
    ])
}

/// Tolerates every taint: a sweep pod runs only on a node that serves (the sweep checks), and
/// it must reach the workspaces there whatever the sandboxes tolerated.
fn tolerate_all() -> Option<Vec<Toleration>> {
    Some(vec![Toleration {
        operator: Some("Exists".into()),
        ..Default::default()
    }])
}

/// One of the sweep's pods, in `ns`: `work` (named for its job on its node: see
/// [`sweep_pod_name`]), tolerating every taint. `None` without a helper image.
fn sweep_pod(ns: &str, cfg: &PodConfig<'_>, work: Work<'_>) -> Option<Pod> {
    let helper = cfg.helper.as_ref()?;
    Some(helper_pod(ns, tolerate_all(), cfg, helper, work))
}

/// The pod that names the entries of namespace `ns`'s workspace directory on `node` (the
/// helper's `list` job, leaving out `skip`), with that directory alone mounted read-only and
/// no capability. `None` without a helper image.
pub fn build_list_pod(ns: &str, cfg: &PodConfig<'_>, node: &str, skip: Vec<String>) -> Option<Pod> {
    let job = agentbox_helper::Job::List {
        dir: NAMESPACE_MOUNT.into(),
        skip,
    };
    let work = Work {
        name: sweep_pod_name("list", node),
        node,
        kind: "list",
        job,
        caps: PREPARE_CAPS,
        mount: HelperMount::NamespaceReadOnly,
        labels: sweep_labels("list", ns),
    };
    sweep_pod(ns, cfg, work)
}

/// The pod that removes the orphaned workspace directories `names` of namespace `ns` from
/// `node` (the helper's `remove` job). `None` without a helper image.
pub fn build_sweep_pod(
    ns: &str,
    cfg: &PodConfig<'_>,
    node: &str,
    names: Vec<String>,
) -> Option<Pod> {
    let job = agentbox_helper::Job::Remove {
        root: NAMESPACE_MOUNT.into(),
        names,
    };
    let work = Work {
        name: sweep_pod_name("sweep", node),
        node,
        kind: "remove",
        job,
        caps: REMOVE_CAPS,
        mount: HelperMount::Namespace,
        labels: sweep_labels("sweep", ns),
    };
    sweep_pod(ns, cfg, work)
}

/// Labels of the sweep's pods on the node root itself (no namespace of their own to name).
fn root_sweep_labels(job: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (labels::MANAGED_BY.to_string(), labels::MANAGER.to_string()),
        (HELPER_LABEL.to_string(), job.to_string()),
    ])
}

/// The pod, in `helper_ns` (`--helper-namespace`, never a tenant's), that names the entries of
/// the node root on `node` (the namespaces with a directory there, leaving out `skip`), the
/// node root mounted read-only and no capability. `None` without a helper image.
pub fn build_root_list_pod(
    helper_ns: &str,
    cfg: &PodConfig<'_>,
    node: &str,
    skip: Vec<String>,
) -> Option<Pod> {
    let job = agentbox_helper::Job::List {
        dir: NAMESPACE_MOUNT.into(),
        skip,
    };
    let work = Work {
        name: sweep_pod_name("list-root", node),
        node,
        kind: "list",
        job,
        caps: PREPARE_CAPS,
        mount: HelperMount::NodeRootReadOnly,
        labels: root_sweep_labels("list"),
    };
    sweep_pod(helper_ns, cfg, work)
}

/// The pod, in `helper_ns`, that removes the directories `names` (of deleted namespaces) from
/// the node root on `node` if they are empty (the helper's `prune` job). `None` without a
/// helper image.
pub fn build_prune_pod(
    helper_ns: &str,
    cfg: &PodConfig<'_>,
    node: &str,
    names: Vec<String>,
) -> Option<Pod> {
    let job = agentbox_helper::Job::Prune {
        root: NAMESPACE_MOUNT.into(),
        names,
    };
    let work = Work {
        name: sweep_pod_name("prune", node),
        node,
        kind: "prune",
        job,
        caps: PREPARE_CAPS,
        mount: HelperMount::NodeRoot,
        labels: root_sweep_labels("sweep"),
    };
    sweep_pod(helper_ns, cfg, work)
}

/// The pod that makes the namespace's workspace directory on `node` root-only and reports
/// whether its mount is `nosuid,nodev`. Owned (not as controller) by the sandbox whose start
/// asked for it, so its completion wakes that sandbox, and it goes with it. `None` without a
/// helper image.
pub fn build_prepare_pod(sbx: &Sandbox, cfg: &PodConfig<'_>, node: &str) -> Option<Pod> {
    prepare_pod(
        &sbx.namespace().unwrap_or_default(),
        &sbx.spec.pod.tolerations,
        owner_ref(sbx),
        cfg,
        node,
    )
}

/// The pod that prepares the namespace's workspace directory on `node` for a pool's warm pods
/// there ([`build_prepare_pod`]'s job), before any of them can be claimed: so a claimed
/// workspace is never under a directory other host users can reach. It tolerates what the
/// pool's pods (`spec`, its template resolved) tolerate. Owned (not as controller) by the
/// pool, so it goes with it. `None` without a helper image.
pub fn build_pool_prepare_pod(
    pool: &SandboxPool,
    spec: &SandboxSpec,
    cfg: &PodConfig<'_>,
    node: &str,
) -> Option<Pod> {
    prepare_pod(
        &pool.namespace().unwrap_or_default(),
        &spec.pod.tolerations,
        pool.controller_owner_ref(&()),
        cfg,
        node,
    )
}

/// The `prepare` helper pod of namespace `ns` on `node`, whoever asks (one name per node:
/// the first to ask makes it), owned by `owner` but not as its controller.
fn prepare_pod(
    ns: &str,
    tolerations: &[Toleration],
    owner: Option<OwnerReference>,
    cfg: &PodConfig<'_>,
    node: &str,
) -> Option<Pod> {
    let helper = cfg.helper.as_ref()?;
    let job = agentbox_helper::Job::Prepare {
        dir: NAMESPACE_MOUNT.into(),
    };
    let labels = BTreeMap::from([
        (labels::MANAGED_BY.to_string(), labels::MANAGER.to_string()),
        (HELPER_LABEL.to_string(), "prepare".to_string()),
    ]);
    let work = Work {
        name: prepare_pod_name(node),
        node,
        kind: "prepare",
        job,
        caps: PREPARE_CAPS,
        mount: HelperMount::Namespace,
        labels,
    };
    let tolerations = (!tolerations.is_empty()).then(|| tolerations.to_vec());
    let mut pod = helper_pod(ns, tolerations, cfg, helper, work);
    pod.metadata.owner_references = owner.map(|mut o| {
        o.controller = None;
        o.block_owner_deletion = None;
        vec![o]
    });
    Some(pod)
}

/// Container waiting reasons that will not go away by themselves.
const STUCK: [&str; 6] = [
    "ErrImagePull",
    "ImagePullBackOff",
    "ErrImageNeverPull",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
];

/// The outcome of a helper pod: its report once it has succeeded, else what went wrong — the
/// failure it wrote, or the reason it cannot start (a helper image missing on the node, say).
/// `None` while it runs.
pub fn helper_outcome(pod: &Pod) -> Option<Result<Report, String>> {
    let status = pod.status.as_ref()?;
    let stuck = status
        .container_statuses
        .iter()
        .flatten()
        .find_map(|c| c.state.as_ref()?.waiting.as_ref())
        .filter(|w| STUCK.contains(&w.reason.as_deref().unwrap_or_default()));
    if let Some(w) = stuck {
        return Some(Err(format!(
            "the helper pod cannot start ({}): {}",
            w.reason.as_deref().unwrap_or_default(),
            w.message.as_deref().unwrap_or_default()
        )));
    }
    let phase = status.phase.as_deref()?;
    if !matches!(phase, "Succeeded" | "Failed") {
        return None;
    }
    let message = status
        .container_statuses
        .iter()
        .flatten()
        .find_map(|c| c.state.as_ref()?.terminated.as_ref()?.message.clone())
        .unwrap_or_default();
    Some(match (phase, Report::parse(&message)) {
        ("Succeeded", Some(r)) => Ok(r),
        _ if message.trim().is_empty() => {
            Err(format!("the helper pod ended {phase} without a report"))
        }
        _ => Err(message.trim().to_string()),
    })
}

/// Whether the API server refused a pod because its namespace takes no new pods: it is being
/// deleted (403, NamespaceLifecycle admission) or is gone (404).
pub fn namespace_takes_no_pods(e: &kube::Error) -> bool {
    let kube::Error::Api(s) = e else {
        return false;
    };
    let terminating = s.code == 403 && s.message.contains("being terminated");
    let gone = s.code == 404 && s.details.as_ref().is_some_and(|d| d.kind == "namespaces");
    terminating || gone
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::pod::tests::*;

    #[test]
    fn an_archive_pod_reads_only_this_workspace_with_one_capability() {
        let sbx = sandbox(serde_json::json!({}));
        let mut snap = SandboxSnapshot::new(
            "snap-1",
            serde_json::from_value(serde_json::json!({"sandboxRef": {"name": "demo"}})).unwrap(),
        );
        snap.metadata.namespace = Some("team".into());
        snap.metadata.uid = Some("snap-uid".into());
        let at = NodeDir {
            node: "node-a",
            dir: "/w/team/1234-uid",
        };
        let pod = build_archive_pod(&sbx, &snap, &cfg("/w"), at, 900).unwrap();
        assert_eq!(pod.metadata.name.as_deref(), Some("snap-archive-snap-uid"));
        let owners = pod.metadata.owner_references.as_ref().unwrap();
        assert_eq!(owners.len(), 1);
        assert_eq!(owners[0].uid, "snap-uid");
        assert_eq!(owners[0].kind, "SandboxSnapshot");
        let l = pod.metadata.labels.as_ref().unwrap();
        assert_eq!(l[HELPER_LABEL], "archive");
        // Never taken for the sandbox's pod (its Service selects by this label).
        assert!(!l.contains_key(labels::SANDBOX), "{l:?}");
        assert_eq!(l[labels::MANAGED_BY], labels::MANAGER);
        let spec = pod.spec.unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("node-a"));
        assert_eq!(spec.automount_service_account_token, Some(false));
        assert_eq!(
            spec.runtime_class_name, None,
            "runc, not the sandbox's runtime"
        );
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        let vols = spec.volumes.unwrap();
        assert_eq!(vols.len(), 1);
        let host = vols[0].host_path.as_ref().unwrap();
        assert_eq!(
            host.path, "/w/team/1234-uid",
            "the workspace, not its namespace's"
        );
        assert_eq!(host.type_.as_deref(), Some("Directory"), "never made empty");
        assert_eq!(spec.containers.len(), 1);
        let c = &spec.containers[0];
        assert_eq!(c.name, ARCHIVE_CONTAINER);
        assert_least_privilege(c, ARCHIVE_CAPS);
        let m = &c.volume_mounts.as_ref().unwrap()[0];
        assert_eq!(
            (m.mount_path.as_str(), m.read_only),
            (WORKSPACE_MOUNT, Some(true))
        );
        assert_eq!(
            agentbox_helper::Job::parse(&c.command.as_ref().unwrap()[1..]).unwrap(),
            agentbox_helper::Job::Hold { secs: 900 }
        );
        assert_eq!(
            agentbox_helper::Job::parse(&archive_argv()[1..]).unwrap(),
            agentbox_helper::Job::Archive {
                dir: WORKSPACE_MOUNT.into()
            }
        );
        assert!(
            build_archive_pod(
                &sbx,
                &snap,
                &PodConfig {
                    helper: None,
                    ..cfg("/w")
                },
                at,
                1
            )
            .is_none()
        );
    }

    #[test]
    fn a_restore_pod_writes_only_this_workspace_with_three_capabilities() {
        let mut sbx = sandbox(serde_json::json!({}));
        sbx.metadata.uid = Some("sbx-uid".into());
        let at = NodeDir {
            node: "node-a",
            dir: "/w/team/1234-uid",
        };
        let pod = build_restore_pod(&sbx, &cfg("/w"), at, 900).unwrap();
        assert_eq!(pod.metadata.name.as_deref(), Some("sbx-restore-sbx-uid"));
        let owners = pod.metadata.owner_references.as_ref().unwrap();
        assert_eq!(
            (owners.len(), owners[0].kind.as_str(), owners[0].controller),
            (1, "Sandbox", None),
            "owned, but not the sandbox's pod"
        );
        let l = pod.metadata.labels.as_ref().unwrap();
        assert_eq!(l[HELPER_LABEL], "restore");
        assert!(!l.contains_key(labels::SANDBOX), "{l:?}");
        let spec = pod.spec.unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("node-a"));
        assert_eq!(spec.runtime_class_name, None, "runc, not gVisor");
        assert_eq!(spec.automount_service_account_token, Some(false));
        let vols = spec.volumes.unwrap();
        let host = vols[0].host_path.as_ref().unwrap();
        assert_eq!(
            (vols.len(), host.path.as_str(), host.type_.as_deref()),
            (1, "/w/team/1234-uid", Some("Directory"))
        );
        let c = &spec.containers[0];
        assert_eq!(c.name, RESTORE_CONTAINER);
        assert_least_privilege(c, RESTORE_CAPS);
        let m = &c.volume_mounts.as_ref().unwrap()[0];
        assert_eq!(
            (m.mount_path.as_str(), m.read_only),
            (WORKSPACE_MOUNT, None)
        );
        assert_eq!(
            agentbox_helper::Job::parse(&extract_argv("0a1b")[1..]).unwrap(),
            agentbox_helper::Job::Extract {
                dir: WORKSPACE_MOUNT.into(),
                id: "0a1b".into()
            }
        );
        let none = PodConfig {
            helper: None,
            ..cfg("/w")
        };
        assert!(build_restore_pod(&sbx, &none, at, 900).is_none());
    }

    #[test]
    fn cleanup_pod_runs_the_helper_on_this_workspace_only() {
        let sbx = sandbox(serde_json::json!({"tolerations": [
            {"key": "dedicated", "operator": "Equal", "value": "agents", "effect": "NoSchedule"}
        ]}));
        let pod = build_cleanup_pod(
            &sbx,
            &cfg("/w"),
            NodeDir {
                node: "node-a",
                dir: "1234-uid",
            },
            cleanup_pod_name(&sbx),
        )
        .unwrap();
        let l = pod.metadata.labels.as_ref().unwrap();
        assert_eq!(l[HELPER_LABEL], "remove");
        assert!(!l.contains_key(labels::SANDBOX), "{l:?}");
        let spec = pod.spec.unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("node-a"));
        assert_eq!(spec.automount_service_account_token, Some(false));
        let vols = spec.volumes.unwrap();
        assert_eq!(vols.len(), 1);
        assert_eq!(vols[0].host_path.as_ref().unwrap().path, "/w/team");
        let c = &spec.containers[0];
        assert_least_privilege(c, REMOVE_CAPS);
        assert_eq!(
            agentbox_helper::Job::parse(&c.command.as_ref().unwrap()[1..]).unwrap(),
            agentbox_helper::Job::Remove {
                root: NAMESPACE_MOUNT.into(),
                names: vec!["1234-uid".into()]
            }
        );
        // Exactly the sandbox's tolerations: no blanket "tolerate everything".
        let tol = spec.tolerations.unwrap();
        assert_eq!(tol, sbx.spec.pod.tolerations);
        assert!(
            build_cleanup_pod(
                &sandbox(serde_json::json!({})),
                &cfg("/w"),
                NodeDir {
                    node: "n",
                    dir: "d"
                },
                "c".into()
            )
            .unwrap()
            .spec
            .unwrap()
            .tolerations
            .is_none()
        );
        // Without a helper image there is no cleanup pod: never the sandbox's own image.
        let none = PodConfig {
            helper: None,
            ..cfg("/w")
        };
        assert!(
            build_cleanup_pod(
                &sbx,
                &none,
                NodeDir {
                    node: "node-a",
                    dir: "d"
                },
                "c".into()
            )
            .is_none()
        );
        // The pod that removes a directory left on a lost node is named for that node.
        assert_ne!(
            abandoned_cleanup_pod_name(&sbx, "node-a"),
            abandoned_cleanup_pod_name(&sbx, "node-b")
        );
        assert!(abandoned_cleanup_pod_name(&sbx, "node-a").starts_with(&cleanup_pod_name(&sbx)));
        assert!(build_prepare_pod(&sbx, &none, "node-a").is_none());
    }

    #[test]
    fn sweep_pods_list_read_only_and_remove_only_the_names_given() {
        let list = build_list_pod("team", &cfg("/w"), "node-a", vec!["u1".into()]).unwrap();
        let sweep = build_sweep_pod("team", &cfg("/w"), "node-a", vec!["u2".into()]).unwrap();
        // The sweep's leftover selector (`agentbox.dev/helper in (list,sweep)`, per namespace)
        // must select both.
        for (p, job) in [(&list, "list"), (&sweep, "sweep")] {
            let l = p.metadata.labels.as_ref().unwrap();
            assert_eq!(l.get(HELPER_LABEL).map(String::as_str), Some(job));
            assert_eq!(l.get(FOR_NAMESPACE_LABEL).map(String::as_str), Some("team"));
        }
        let spec = list.spec.as_ref().unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("node-a"));
        assert_least_privilege(&spec.containers[0], &[]);
        let m = &spec.containers[0].volume_mounts.as_ref().unwrap()[0];
        assert_eq!(
            (m.mount_path.as_str(), m.read_only),
            (NAMESPACE_MOUNT, Some(true))
        );
        let volumes = spec.volumes.as_ref().unwrap();
        assert_eq!(volumes.len(), 1);
        let hp = volumes[0].host_path.as_ref().unwrap();
        assert_eq!(
            hp.path.as_str(),
            "/w/team",
            "the namespace's own directory, never the node root: another namespace's \
             workspace names stay out of reach of whoever may exec into the pod"
        );
        let args = &spec.containers[0].command.as_ref().unwrap()[1..];
        assert_eq!(
            agentbox_helper::Job::parse(args).unwrap(),
            agentbox_helper::Job::List {
                dir: NAMESPACE_MOUNT.into(),
                skip: vec!["u1".into()]
            }
        );
        assert!(list.metadata.owner_references.is_none());

        let spec = sweep.spec.as_ref().unwrap();
        assert_least_privilege(&spec.containers[0], REMOVE_CAPS);
        let hp = spec.volumes.as_ref().unwrap()[0]
            .host_path
            .as_ref()
            .unwrap();
        assert_eq!(hp.path, "/w/team");
        let args = &spec.containers[0].command.as_ref().unwrap()[1..];
        assert_eq!(
            agentbox_helper::Job::parse(args).unwrap(),
            agentbox_helper::Job::Remove {
                root: NAMESPACE_MOUNT.into(),
                names: vec!["u2".into()]
            }
        );
        assert_ne!(list.metadata.name, sweep.metadata.name);
        let none = PodConfig {
            helper: None,
            ..cfg("/w")
        };
        assert!(build_list_pod("team", &none, "n", vec![]).is_none());
        assert!(build_sweep_pod("team", &none, "n", vec![]).is_none());
    }

    #[test]
    fn node_root_pods_run_in_the_helper_namespace_list_read_only_and_only_prune() {
        let list = build_root_list_pod("ops", &cfg("/w"), "node-a", vec!["team".into()]).unwrap();
        let prune = build_prune_pod("ops", &cfg("/w"), "node-a", vec!["gone".into()]).unwrap();
        for (p, read_only, job) in [(&list, Some(true), "list"), (&prune, None, "sweep")] {
            assert_eq!(p.metadata.namespace.as_deref(), Some("ops"));
            let l = p.metadata.labels.as_ref().unwrap();
            assert_eq!(l.get(HELPER_LABEL).map(String::as_str), Some(job));
            let spec = p.spec.as_ref().unwrap();
            assert_eq!(spec.node_name.as_deref(), Some("node-a"));
            assert_least_privilege(&spec.containers[0], &[]);
            let m = &spec.containers[0].volume_mounts.as_ref().unwrap()[0];
            assert_eq!(
                (m.mount_path.as_str(), m.read_only),
                (NAMESPACE_MOUNT, read_only)
            );
            let hp = spec.volumes.as_ref().unwrap()[0]
                .host_path
                .as_ref()
                .unwrap();
            assert_eq!(hp.path, "/w");
        }
        let args = |p: &Pod| {
            p.spec.as_ref().unwrap().containers[0]
                .command
                .as_ref()
                .unwrap()[1..]
                .to_vec()
        };
        assert_eq!(
            agentbox_helper::Job::parse(&args(&list)).unwrap(),
            agentbox_helper::Job::List {
                dir: NAMESPACE_MOUNT.into(),
                skip: vec!["team".into()]
            }
        );
        assert_eq!(
            agentbox_helper::Job::parse(&args(&prune)).unwrap(),
            agentbox_helper::Job::Prune {
                root: NAMESPACE_MOUNT.into(),
                names: vec!["gone".into()]
            },
            "an empty directory only: never a remove at the node root"
        );
    }

    #[test]
    fn prepare_pod_needs_no_capability_and_is_owned_by_the_asking_sandbox() {
        let sbx = sandbox(serde_json::json!({}));
        let pod = build_prepare_pod(&sbx, &cfg("/w"), "node-a").unwrap();
        assert_eq!(pod.metadata.name, Some(prepare_pod_name("node-a")));
        assert_ne!(prepare_pod_name("node-a"), prepare_pod_name("node-b"));
        let owner = &pod.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!((owner.kind.as_str(), owner.controller), ("Sandbox", None));
        let spec = pod.spec.unwrap();
        assert_least_privilege(&spec.containers[0], PREPARE_CAPS);
        assert_eq!(
            spec.volumes.unwrap()[0].host_path.as_ref().unwrap().path,
            "/w/team"
        );
    }

    #[test]
    fn a_pools_prepare_pod_is_the_same_job_owned_by_the_pool_with_its_tolerations() {
        let mut spec = agentbox_api::template::for_pool("tpl", &template());
        spec.pod.tolerations = vec![
            serde_json::from_value(
                serde_json::json!({"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}),
            )
            .unwrap(),
        ];
        let pod = build_pool_prepare_pod(&pool(), &spec, &cfg("/w"), "node-a").unwrap();
        let sbx = build_prepare_pod(&sandbox(serde_json::json!({})), &cfg("/w"), "node-a").unwrap();
        // One pod per node and namespace, whoever asks: the same name, labels and container.
        assert_eq!(pod.metadata.name, sbx.metadata.name);
        assert_eq!(pod.metadata.namespace.as_deref(), Some("team"));
        assert_eq!(pod.metadata.labels, sbx.metadata.labels);
        let owner = &pod.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
            ("SandboxPool", "pool-uid", None)
        );
        let (pspec, sspec) = (pod.spec.unwrap(), sbx.spec.unwrap());
        assert_eq!(pspec.containers, sspec.containers);
        assert_eq!(pspec.volumes, sspec.volumes);
        assert_eq!(pspec.node_name.as_deref(), Some("node-a"));
        let tolerations = pspec.tolerations.unwrap();
        assert!(
            tolerations.iter().any(|t| t.key.as_deref() == Some("gpu")),
            "{tolerations:?}"
        );
        let none = PodConfig {
            helper: None,
            ..cfg("/w")
        };
        assert!(build_pool_prepare_pod(&pool(), &spec, &none, "node-a").is_none());
    }
}
