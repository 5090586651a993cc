//! A workspace's size limit (`workspace.sizeLimit`): a workspace is a directory on its node,
//! which an `ephemeral-storage` limit does not count, so one sandbox writing without end would
//! fill the disk every other workspace (and often the kubelet) lives on.
//!
//! Two pieces of the trusted helper in the sandbox pod carry it:
//! - the init container [`INIT_CONTAINER`] (the helper's `quota` job, `CAP_SYS_ADMIN`, the
//!   namespace's workspace directory mounted) makes the workspace a btrfs subvolume with a
//!   quota group limit where the node root can (a hard limit: writes past it fail with
//!   `EDQUOT`), and otherwise reports why not; with `--workspace-quota-fallback refuse` it
//!   fails instead, so the pod does not start;
//! - the sidecar [`SIDECAR`] (the helper's `watch` job, the workspace mounted read-only)
//!   measures the workspace every `--workspace-usage-interval-seconds` and ends with an
//!   over-limit report once it holds more than the limit, which brings the operator's look:
//!   the sandbox is suspended (its workspace kept, so a raised limit or a restore elsewhere
//!   can have it back) and says why. Under a hard limit it only measures.
//!
//! The condition [`CONDITION`] says which a sandbox got. Pure functions of the spec, the
//! configuration and the pod.

use std::path::Path;

use agentbox_api::crd::{SandboxSpec, size_limit_bytes};
use agentbox_api::remote::LIMIT_ENV;
use agentbox_helper::Report;
use agentbox_helper::quota::{Fallback, OVER_LIMIT_EXIT};
use k8s_openapi::api::core::v1::{
    Container, ContainerStatus, EnvVar, HostPathVolumeSource, Pod, Volume, VolumeMount,
};

use super::pod::{HelperImage, helper_container};

/// Condition type on a Sandbox: how its workspace's size limit is enforced.
pub const CONDITION: &str = "WorkspaceLimited";
/// Reason of [`CONDITION`]: a hard limit (a quota).
pub const QUOTA: &str = "Quota";
/// Reason of [`CONDITION`]: no hard limit; measured, and stopped over it.
pub const MEASURED: &str = "Measured";
/// Reason of [`CONDITION`] and of the Warning Event: the workspace held more than its limit,
/// and the sandbox was suspended.
pub const OVER_LIMIT: &str = "WorkspaceOverLimit";
/// Reason of [`CONDITION`]: the limit could not be set up; the pod does not start.
pub const NOT_ENFORCED: &str = "NotEnforced";
/// Name of the init container that sets the limit.
pub const INIT_CONTAINER: &str = "limit-workspace";
/// Name of the sidecar that measures the workspace.
pub const SIDECAR: &str = "workspace-usage";
/// The pod volume of the namespace's workspace directory (the init container's only).
pub const VOLUME: &str = "workspace-parent";
/// Where the init container mounts the namespace's workspace directory.
const PARENT_MOUNT: &str = "/ns";
/// Where the sidecar mounts the workspace.
const WATCH_MOUNT: &str = "/ws";
/// The capability of the `quota` job: setting a quota group limit is an administrator's act.
const QUOTA_CAPS: &[&str] = &["SYS_ADMIN"];
/// The capability of the `watch` job: reading a workspace whatever its owner and modes (it is
/// mounted read-only).
const WATCH_CAPS: &[&str] = &["DAC_OVERRIDE"];

/// What the operator's configuration says about workspace size limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SizeLimits {
    /// The limit of sandboxes whose spec sets none (`--workspace-size-limit`).
    pub default: Option<u64>,
    /// Where no hard limit can be set (`--workspace-quota-fallback`).
    pub fallback: Fallback,
    /// Seconds between measurements (`--workspace-usage-interval-seconds`).
    pub interval_secs: u64,
}

impl SizeLimits {
    /// No default limit; measured every 30 s where not hard.
    pub const NONE: SizeLimits = SizeLimits {
        default: None,
        fallback: Fallback::Measure,
        interval_secs: 30,
    };
}

/// The limit in bytes of a (resolved) sandbox spec: its own `workspace.sizeLimit`, else the
/// operator's default. A value that does not parse is a spec problem (see
/// [`super::validate`]), never reached here; it counts as the default.
pub fn effective(spec: &SandboxSpec, limits: &SizeLimits) -> Option<u64> {
    spec.workspace
        .size_limit
        .as_deref()
        .and_then(|q| size_limit_bytes(q).ok())
        .or(limits.default)
}

/// The init container, the sidecar and the volume that give a pod whose workspace is the host
/// directory `host_dir` (`<namespace dir>/<name>`) the limit `bytes`. `workspace_volume`: the
/// pod's volume of the workspace. `None` when `host_dir` has no parent and name (never for
/// the directories the operator chooses).
pub fn containers(
    host_dir: &str,
    workspace_volume: &str,
    bytes: u64,
    limits: &SizeLimits,
    helper: &HelperImage<'_>,
) -> Option<(Container, Container, Volume)> {
    let path = Path::new(host_dir);
    let name = path.file_name()?.to_str()?.to_string();
    let parent = path.parent()?.to_str()?.to_string();
    let job = agentbox_helper::Job::Quota {
        root: PARENT_MOUNT.into(),
        name,
        bytes,
        fallback: limits.fallback,
    };
    let mount = VolumeMount {
        name: VOLUME.into(),
        mount_path: PARENT_MOUNT.into(),
        ..Default::default()
    };
    let init = helper_container(INIT_CONTAINER, helper, &job, QUOTA_CAPS, mount);
    let job = agentbox_helper::Job::Watch {
        dir: WATCH_MOUNT.into(),
        bytes,
        interval_secs: limits.interval_secs.max(1),
    };
    let mount = VolumeMount {
        name: workspace_volume.into(),
        mount_path: WATCH_MOUNT.into(),
        read_only: Some(true),
        ..Default::default()
    };
    let mut sidecar = helper_container(SIDECAR, helper, &job, WATCH_CAPS, mount);
    // A native sidecar: started before the sandbox's container, ended after it, restarted
    // when it ends.
    sidecar.restart_policy = Some("Always".into());
    let volume = Volume {
        name: VOLUME.into(),
        host_path: Some(HostPathVolumeSource {
            path: parent,
            type_: Some("DirectoryOrCreate".into()),
        }),
        ..Default::default()
    };
    Some((init, sidecar, volume))
}

/// Gives the sandbox's container its limit in [`LIMIT_ENV`], replacing an entry of that name
/// from the spec: the clients' directory upload ([`agentbox_api::remote::UPLOAD`]) refuses,
/// before extracting anything, an upload that would pass it (a hard limit would stop `tar`
/// midway). Set where the limit is, not in the pod's spec hash (the limit already is): a pod
/// made before it was given keeps running, and its uploads are checked only by the limit itself.
pub fn give_limit(container: &mut Container, bytes: u64) {
    let env = container.env.get_or_insert_with(Vec::new);
    env.retain(|e| e.name != LIMIT_ENV);
    env.push(EnvVar {
        name: LIMIT_ENV.into(),
        value: Some(bytes.to_string()),
        value_from: None,
    });
}

/// The limit a pod was made with: the argument of its [`INIT_CONTAINER`].
pub fn pod_limit(pod: &Pod) -> Option<u64> {
    let c = pod
        .spec
        .as_ref()?
        .init_containers
        .iter()
        .flatten()
        .find(|c| c.name == INIT_CONTAINER)?;
    let args = c.command.as_ref()?;
    match agentbox_helper::Job::parse(args.get(1..)?).ok()? {
        agentbox_helper::Job::Quota { bytes, .. } => Some(bytes),
        _ => None,
    }
}

/// How the pod's limit is enforced, as its init container reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Enforced {
    /// A hard limit.
    Quota,
    /// Measured only: why there is no hard limit.
    Measured(String),
    /// Not set up: why (the pod does not start).
    NotEnforced(String),
}

/// What the pod says about its limit: `None` while its init container has not finished.
pub fn enforced(pod: &Pod) -> Option<Enforced> {
    let st = init_status(pod)?;
    let state = st.state.as_ref()?;
    if let Some(t) = &state.terminated {
        let message = t.message.clone().unwrap_or_default();
        if t.exit_code != 0 {
            return Some(Enforced::NotEnforced(format!(
                "the helper exited with code {}: {}",
                t.exit_code,
                message.trim()
            )));
        }
        return Some(match Report::parse(&message) {
            Some(r) if r.get("mode") == Some("quota") => Enforced::Quota,
            Some(r) if r.get("mode") == Some("measure") => Enforced::Measured(
                r.get("reason")
                    .unwrap_or("no reason given")
                    .replace('_', " "),
            ),
            _ => Enforced::NotEnforced(format!(
                "the helper reported no limit: {:?}",
                message.trim()
            )),
        });
    }
    let w = state.waiting.as_ref()?;
    let reason = w.reason.clone().unwrap_or_default();
    if matches!(
        reason.as_str(),
        "" | "PodInitializing" | "ContainerCreating"
    ) {
        return None;
    }
    let last = st.last_state.as_ref().and_then(|s| s.terminated.as_ref());
    Some(Enforced::NotEnforced(match last {
        Some(t) if t.exit_code != 0 => format!(
            "the helper exited with code {}: {}",
            t.exit_code,
            t.message.as_deref().unwrap_or("").trim()
        ),
        _ => format!("{reason}: {}", w.message.as_deref().unwrap_or("")),
    }))
}

fn init_status(pod: &Pod) -> Option<&ContainerStatus> {
    pod.status
        .as_ref()?
        .init_container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == INIT_CONTAINER)
}

/// A measurement over the limit: bytes held, and the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Over {
    /// Bytes the workspace held.
    pub used: u64,
    /// The limit.
    pub limit: u64,
}

/// The sidecar's over-limit report, if its current or last run ended with one.
pub fn over(pod: &Pod) -> Option<Over> {
    let st = pod
        .status
        .as_ref()?
        .init_container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == SIDECAR)?;
    let runs = [
        st.state.as_ref().and_then(|s| s.terminated.as_ref()),
        st.last_state.as_ref().and_then(|s| s.terminated.as_ref()),
    ];
    runs.into_iter().flatten().find_map(|t| {
        if t.exit_code != OVER_LIMIT_EXIT {
            return None;
        }
        let r = Report::parse(t.message.as_deref()?)?;
        if r.flag("over") != Some(true) {
            return None;
        }
        Some(Over {
            used: r.get("used")?.parse().ok()?,
            limit: r.get("limit")?.parse().ok()?,
        })
    })
}

/// The bytes of the last measurement in a log of the sidecar, if any.
pub fn measured(log: &str) -> Option<u64> {
    let r = Report::parse(log)?;
    if r.get("job") != Some("watch") {
        return None;
    }
    r.get("used")?.parse().ok()
}

/// The usage to show, given the one shown (`shown`) and a new measurement: the shown one
/// while the measurement is within a MiB of it (no status write for every byte), else the
/// measurement.
pub fn reported(shown: Option<u64>, measured: u64) -> u64 {
    match shown {
        Some(s) if s.abs_diff(measured) < 1 << 20 => s,
        _ => measured,
    }
}

/// The restore limits of a workspace limited to `size` bytes: no more extracted bytes than
/// that (nor than the operator's own limit).
pub fn restore_limits(
    mut limits: crate::snapshot::archive::Limits,
    size: Option<u64>,
) -> crate::snapshot::archive::Limits {
    if let Some(size) = size {
        limits.max_extracted_bytes = match limits.max_extracted_bytes {
            0 => size,
            n => n.min(size),
        };
    }
    limits
}

/// Bytes in MiB, for messages.
fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1u32 << 20))
}

/// A condition: status, reason, message.
pub type Cond = (bool, &'static str, String);

/// The [`CONDITION`] of a sandbox whose pod `pod` on `node` should have the limit `limit`
/// (`None`: no limit, no condition). `helper`: the operator has a helper image. `None` while
/// the init container has not reported.
pub fn condition(pod: &Pod, node: &str, limit: Option<u64>, helper: bool) -> Option<Cond> {
    let limit = limit?;
    if !helper {
        return Some((
            false,
            NOT_ENFORCED,
            format!(
                "the workspace size limit of {} is not enforced: this operator has no helper image (--helper-image)",
                mib(limit)
            ),
        ));
    }
    if pod_limit(pod).is_none() {
        return Some((
            false,
            NOT_ENFORCED,
            format!(
                "the sandbox's pod was made without its workspace size limit; the limit of {} applies from its next start",
                mib(limit)
            ),
        ));
    }
    if let Some(o) = over(pod) {
        return Some((false, OVER_LIMIT, over_message(o, node)));
    }
    Some(match enforced(pod)? {
        Enforced::Quota => (
            true,
            QUOTA,
            format!(
                "the workspace on node {node} is a btrfs subvolume with a quota of {}: writes past it fail with EDQUOT (Disk quota exceeded)",
                mib(limit)
            ),
        ),
        Enforced::Measured(why) => (
            false,
            MEASURED,
            format!(
                "the workspace on node {node} has no hard limit ({why}); it is measured and the sandbox is suspended once it holds more than {}",
                mib(limit)
            ),
        ),
        Enforced::NotEnforced(why) => (
            false,
            NOT_ENFORCED,
            format!(
                "the workspace size limit of {} could not be set up on node {node}, so the pod does not start: {why}",
                mib(limit)
            ),
        ),
    })
}

/// The message of an over-limit suspension.
pub fn over_message(o: Over, node: &str) -> String {
    format!(
        "the workspace on node {node} holds {} ({} bytes), more than its size limit of {} ({} bytes): the sandbox is suspended; raise workspace.sizeLimit or remove data to run it again",
        mib(o.used),
        o.used,
        mib(o.limit),
        o.limit
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::pod::tests::HELPER;

    fn pod(inits: serde_json::Value, statuses: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "sbx-a"},
            "spec": {"initContainers": inits, "containers": [{"name": "sandbox", "image": "i"}]},
            "status": {"initContainerStatuses": statuses},
        }))
        .unwrap()
    }

    fn status(name: &str, state: serde_json::Value, last: serde_json::Value) -> serde_json::Value {
        serde_json::json!({"name": name, "ready": false, "restartCount": 0,
            "image": "h", "imageID": "", "state": state, "lastState": last})
    }

    fn made(bytes: u64) -> serde_json::Value {
        let (init, sidecar, _) = containers(
            "/w/team/uid-1",
            "workspace",
            bytes,
            &SizeLimits::NONE,
            &HELPER,
        )
        .unwrap();
        serde_json::json!([init, sidecar])
    }

    #[test]
    fn the_init_container_limits_its_workspace_and_the_sidecar_watches_it_read_only() {
        let limits = SizeLimits {
            fallback: Fallback::Refuse,
            interval_secs: 5,
            ..SizeLimits::NONE
        };
        let (init, sidecar, volume) =
            containers("/w/team/uid-1", "workspace", 64 << 20, &limits, &HELPER).unwrap();
        assert_eq!(
            agentbox_helper::Job::parse(&init.command.clone().unwrap()[1..]).unwrap(),
            agentbox_helper::Job::Quota {
                root: PARENT_MOUNT.into(),
                name: "uid-1".into(),
                bytes: 64 << 20,
                fallback: Fallback::Refuse,
            }
        );
        assert_eq!(volume.host_path.unwrap().path, "/w/team");
        let caps = init.security_context.unwrap().capabilities.unwrap();
        assert_eq!(caps.add, Some(vec!["SYS_ADMIN".to_string()]));
        assert_eq!(sidecar.restart_policy.as_deref(), Some("Always"));
        let m = &sidecar.volume_mounts.as_ref().unwrap()[0];
        assert_eq!((m.name.as_str(), m.read_only), ("workspace", Some(true)));
        assert_eq!(
            agentbox_helper::Job::parse(&sidecar.command.clone().unwrap()[1..]).unwrap(),
            agentbox_helper::Job::Watch {
                dir: WATCH_MOUNT.into(),
                bytes: 64 << 20,
                interval_secs: 5
            }
        );
        let caps = sidecar.security_context.unwrap().capabilities.unwrap();
        assert_eq!(caps.add, Some(vec!["DAC_OVERRIDE".to_string()]));
        assert!(containers("/", "workspace", 1, &limits, &HELPER).is_none());
    }

    #[test]
    fn usage_is_read_from_the_last_report_and_shown_to_the_mib() {
        let line = Report::default()
            .with("job", "watch")
            .with("used", 5 << 20)
            .with("limit", 64 << 20)
            .line();
        assert_eq!(measured(&format!("{line}\n")), Some(5 << 20));
        assert_eq!(measured(""), None);
        assert_eq!(measured("agentbox-helper/v1 job=list names="), None);
        assert_eq!(reported(None, 10), 10);
        assert_eq!(reported(Some(10), 10 + (1 << 20) - 1), 10);
        assert_eq!(reported(Some(10), 10 + (1 << 20)), 10 + (1 << 20));
        assert_eq!(reported(Some(5 << 20), 0), 0);
    }

    #[test]
    fn a_restore_may_extract_no_more_than_the_limit() {
        let base = crate::snapshot::archive::Limits::default();
        assert_eq!(restore_limits(base, None), base);
        let limited = restore_limits(base, Some(64 << 20));
        assert_eq!(limited.max_extracted_bytes, 64 << 20);
        assert_eq!(limited.max_members, base.max_members);
        let huge = restore_limits(base, Some(u64::MAX));
        assert_eq!(huge.max_extracted_bytes, base.max_extracted_bytes);
        let unlimited = crate::snapshot::archive::Limits {
            max_extracted_bytes: 0,
            ..base
        };
        assert_eq!(restore_limits(unlimited, Some(5)).max_extracted_bytes, 5);
    }

    #[test]
    fn the_spec_wins_over_the_operators_default() {
        let mut spec: SandboxSpec = serde_json::from_value(serde_json::json!({
            "image": "i", "scope": {"kind": "Global"}
        }))
        .unwrap();
        let limits = SizeLimits {
            default: Some(1 << 30),
            ..SizeLimits::NONE
        };
        assert_eq!(effective(&spec, &SizeLimits::NONE), None);
        assert_eq!(effective(&spec, &limits), Some(1 << 30));
        spec.workspace.size_limit = Some("64Mi".into());
        assert_eq!(effective(&spec, &limits), Some(64 << 20));
    }

    #[test]
    fn conditions_follow_the_init_containers_report_and_the_sidecars_end() {
        let done = |message: &str, code: i32| {
            status(
                INIT_CONTAINER,
                serde_json::json!({"terminated": {"exitCode": code, "message": message}}),
                serde_json::json!({}),
            )
        };
        let quota = Report::default()
            .with("job", "quota")
            .with("limit", 64 << 20)
            .with("mode", "quota")
            .line();
        let p = pod(made(64 << 20), serde_json::json!([done(&quota, 0)]));
        assert_eq!(pod_limit(&p), Some(64 << 20));
        let (ok, reason, message) = condition(&p, "n", Some(64 << 20), true).unwrap();
        assert_eq!((ok, reason), (true, QUOTA));
        assert!(message.contains("64.0 MiB"), "{message}");
        assert_eq!(condition(&p, "n", None, true), None);

        let measure = Report::default()
            .with("job", "quota")
            .with("mode", "measure")
            .with("reason", "no btrfs here")
            .line();
        let p = pod(made(64 << 20), serde_json::json!([done(&measure, 0)]));
        let (ok, reason, message) = condition(&p, "n", Some(64 << 20), true).unwrap();
        assert_eq!((ok, reason), (false, MEASURED));
        assert!(message.contains("no btrfs here"), "{message}");

        let p = pod(
            made(64 << 20),
            serde_json::json!([done("agentbox-helper: refuses", 1)]),
        );
        let (ok, reason, _) = condition(&p, "n", Some(64 << 20), true).unwrap();
        assert_eq!((ok, reason), (false, NOT_ENFORCED));

        // The sidecar's over-limit end, in its last state after the kubelet restarted it.
        let over_line = Report::default()
            .with("job", "watch")
            .with("used", 70 << 20)
            .with("limit", 64 << 20)
            .with("over", true)
            .line();
        let sidecar = status(
            SIDECAR,
            serde_json::json!({"running": {}}),
            serde_json::json!({"terminated": {"exitCode": OVER_LIMIT_EXIT, "message": over_line}}),
        );
        let p = pod(
            made(64 << 20),
            serde_json::json!([done(&measure, 0), sidecar]),
        );
        assert_eq!(
            over(&p),
            Some(Over {
                used: 70 << 20,
                limit: 64 << 20
            })
        );
        let (ok, reason, message) = condition(&p, "n", Some(64 << 20), true).unwrap();
        assert_eq!((ok, reason), (false, OVER_LIMIT));
        assert!(message.contains("70.0 MiB"), "{message}");
        // Another end of the sidecar is no over-limit report.
        let crashed = status(
            SIDECAR,
            serde_json::json!({"terminated": {"exitCode": 1, "message": "agentbox-helper: reading /ws: denied"}}),
            serde_json::json!({}),
        );
        let p = pod(
            made(64 << 20),
            serde_json::json!([done(&measure, 0), crashed]),
        );
        assert_eq!(over(&p), None);

        let starting = pod(
            made(64 << 20),
            serde_json::json!([status(
                INIT_CONTAINER,
                serde_json::json!({"waiting": {"reason": "PodInitializing"}}),
                serde_json::json!({})
            )]),
        );
        assert_eq!(condition(&starting, "n", Some(1), true), None);
        let bare = pod(serde_json::json!([]), serde_json::json!([]));
        let (ok, reason, _) = condition(&bare, "n", Some(1), true).unwrap();
        assert_eq!((ok, reason), (false, NOT_ENFORCED));
        let (ok, reason, _) = condition(&bare, "n", Some(1), false).unwrap();
        assert_eq!((ok, reason), (false, NOT_ENFORCED));
    }
}
