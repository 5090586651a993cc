//! What a SandboxPool's reconcile does, pure: which warm pods to make, delete and initialise,
//! and the status that follows.

use k8s_openapi::jiff::Timestamp;

use crate::controller::conditions;
use agentbox_api::crd::{PoolUpdateStrategy, SandboxPool, SandboxPoolStatus};
use agentbox_api::labels;

/// Condition type: the template the pool names is missing.
pub const TEMPLATE_NOT_FOUND: &str = "TemplateNotFound";

/// Why a pool's Ready condition is what it is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PoolReason {
    /// Every desired warm pod exists, is of the current template and is ready.
    Ready,
    /// Warm pods are being made, started or removed.
    #[default]
    Scaling,
    /// Warm pods of an older template version are being replaced (Recreate), or remain
    /// (OnDelete).
    Updating,
    /// The template does not exist.
    TemplateNotFound,
    /// The template makes pods this operator refuses (its configuration does not allow them).
    Invalid,
    /// The pods would run under a runtime class the namespace does not take (its annotation
    /// `agentbox.dev/required-runtime-class`).
    RuntimeClassRequired,
}

impl PoolReason {
    /// The condition reason.
    pub fn as_str(self) -> &'static str {
        match self {
            PoolReason::Ready => "Ready",
            PoolReason::Scaling => "Scaling",
            PoolReason::Updating => "Updating",
            PoolReason::TemplateNotFound => "TemplateNotFound",
            PoolReason::Invalid => "Invalid",
            PoolReason::RuntimeClassRequired => crate::controller::runtime::REFUSED,
        }
    }

    /// Whether reaching this reason is a problem a user must fix (a Warning Event on the
    /// transition).
    pub fn is_problem(self) -> bool {
        matches!(
            self,
            PoolReason::TemplateNotFound | PoolReason::Invalid | PoolReason::RuntimeClassRequired
        )
    }
}

/// What the template says the pool's pods should be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Want {
    /// Pods of this shape hash, made from this template generation.
    Pods {
        /// [`crate::controller::pod::shape_hash`] of the template resolved for the pool.
        shape_hash: String,
        /// The template's `metadata.generation`.
        generation: i64,
    },
    /// The template is missing (its name).
    Missing(String),
    /// The template makes pods the operator refuses (the problems).
    Invalid(Vec<String>),
    /// The namespace refuses the runtime class the pods would run under (why).
    Refused(String),
}

/// One of the pool's warm pods, as the decision needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WarmPod {
    /// Its name.
    pub name: String,
    /// When it was created (newer ones go first when scaling down).
    pub created: Option<Timestamp>,
    /// Its [`labels::POD_SHAPE_HASH`].
    pub shape_hash: String,
    /// Running with its container ready.
    pub running: bool,
    /// Initialised by the pool ([`labels::WARM_READY`]).
    pub initialised: bool,
    /// Ended (Succeeded or Failed): it will not run again.
    pub ended: bool,
    /// Why it does not start, as Kubernetes says (image pull errors, crash loops,
    /// unschedulable), if it is stuck.
    pub problem: Option<String>,
    /// The node it is bound to.
    pub node: Option<String>,
    /// The namespace's directory on that node is known to be root-only (prepared), or this
    /// operator has no helper to make it so: only then is the pod initialised, so no claim
    /// puts a scope's data under a directory other host users can reach.
    pub node_prepared: bool,
}

impl WarmPod {
    /// Ready to be claimed.
    pub fn ready(&self) -> bool {
        self.running && self.initialised && !self.ended
    }
}

/// What to do.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// How many warm pods to make.
    pub create: usize,
    /// Warm pods to delete.
    pub delete: Vec<String>,
    /// Running warm pods to initialise.
    pub initialise: Vec<String>,
    /// Nodes where the namespace's directory is to be prepared first (running warm pods
    /// there wait for it), by name.
    pub prepare: Vec<String>,
    /// The status after this plan's writes are made (counts as observed now).
    pub status: SandboxPoolStatus,
    /// The Ready condition's reason, with its message.
    pub reason: (PoolReason, String),
}

/// Decides a pool's writes from its warm pods (unclaimed, owned by it, not being deleted) and
/// what its template wants.
pub fn decide(pool: &SandboxPool, want: &Want, pods: &[WarmPod], now: Timestamp) -> Plan {
    let desired = usize::try_from(pool.spec.replicas.max(0)).unwrap_or(0);
    let mut plan = Plan::default();
    let (current, generation) = match want {
        Want::Pods {
            shape_hash,
            generation,
        } => (Some(shape_hash.as_str()), Some(*generation)),
        Want::Missing(_) | Want::Invalid(_) | Want::Refused(_) => (None, None),
    };
    // Ended pods never run again; pods of an unusable template can never be claimed.
    let (dead, live): (Vec<&WarmPod>, Vec<&WarmPod>) =
        pods.iter().partition(|p| p.ended || current.is_none());
    plan.delete.extend(dead.iter().map(|p| p.name.clone()));
    let stale = |p: &WarmPod| current.is_some_and(|h| p.shape_hash != h);
    let recreate = pool.spec.update_strategy == PoolUpdateStrategy::Recreate;
    let (mut kept, replaced): (Vec<&WarmPod>, Vec<&WarmPod>) =
        live.into_iter().partition(|p| !recreate || !stale(p));
    plan.delete.extend(replaced.iter().map(|p| p.name.clone()));
    if current.is_some() {
        if kept.len() < desired {
            plan.create = desired - kept.len();
        } else {
            // Surplus: stale first, then not ready, then the newest.
            kept.sort_by(|a, b| {
                (stale(b), !b.ready(), b.created).cmp(&(stale(a), !a.ready(), a.created))
            });
            let surplus = kept.len() - desired;
            plan.delete
                .extend(kept.drain(..surplus).map(|p| p.name.clone()));
        }
    }
    let starting = kept.iter().filter(|p| p.running && !p.initialised);
    plan.initialise = starting
        .clone()
        .filter(|p| p.node_prepared)
        .map(|p| p.name.clone())
        .collect();
    plan.prepare = starting
        .filter(|p| !p.node_prepared)
        .filter_map(|p| p.node.clone())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();

    let ready = kept.iter().filter(|p| p.ready()).count();
    let counts = Counts {
        desired,
        kept: kept.len(),
        ready,
        older: replaced.len() + kept.iter().filter(|p| stale(p)).count(),
        recreate,
    };
    plan.reason = reason(want, &counts, &kept, &plan);
    plan.status = status(pool, &plan.reason, kept.len(), ready, generation, now);
    plan
}

/// The pool's warm pods, counted for its reason.
struct Counts {
    /// `spec.replicas`.
    desired: usize,
    /// Pods kept (not deleted by this plan).
    kept: usize,
    /// Kept pods ready to be claimed.
    ready: usize,
    /// Pods of an older template version, replaced or kept.
    older: usize,
    /// Whether older pods are replaced (`Recreate`) rather than kept until deleted.
    recreate: bool,
}

/// Why the pool is as it is, and what it says of it.
fn reason(want: &Want, c: &Counts, kept: &[&WarmPod], plan: &Plan) -> (PoolReason, String) {
    let (ready, desired) = (c.ready, c.desired);
    match want {
        Want::Missing(name) => (
            PoolReason::TemplateNotFound,
            format!(
                "SandboxTemplate {name} not found in the pool's namespace; the pool makes pods when it is created"
            ),
        ),
        Want::Invalid(problems) => (
            PoolReason::Invalid,
            format!("the template's pods are refused: {}", problems.join("; ")),
        ),
        Want::Refused(why) => (PoolReason::RuntimeClassRequired, why.clone()),
        Want::Pods { .. } if c.older > 0 => (
            PoolReason::Updating,
            format!(
                "{} warm pod(s) of an older template version {}",
                c.older,
                if c.recreate {
                    "being replaced"
                } else {
                    "kept until deleted (OnDelete)"
                }
            ),
        ),
        Want::Pods { .. } if ready == desired && c.kept == desired && plan.create == 0 => (
            PoolReason::Ready,
            format!("{ready} of {desired} warm pods ready"),
        ),
        Want::Pods { .. } => {
            let mut message = format!("{ready} of {desired} warm pods ready");
            // The first stuck pod says why the pool does not fill (the same for all, usually).
            if let Some((name, why)) = kept
                .iter()
                .find_map(|p| p.problem.as_ref().map(|w| (&p.name, w)))
            {
                message.push_str(&format!("; {name}: {why}"));
            }
            if !plan.prepare.is_empty() {
                message.push_str(&format!(
                    "; making the namespace's directory root-only on {} first",
                    plan.prepare.join(", ")
                ));
            }
            (PoolReason::Scaling, message)
        }
    }
}

/// The pool's status with `kept` warm pods, `ready` of them ready.
fn status(
    pool: &SandboxPool,
    (reason, message): &(PoolReason, String),
    kept: usize,
    ready: usize,
    generation: Option<i64>,
    now: Timestamp,
) -> SandboxPoolStatus {
    let old = pool.status.clone().unwrap_or_default();
    let observed = pool.metadata.generation;
    let mut conds = old.conditions.clone();
    conditions::set(
        &mut conds,
        conditions::READY,
        *reason == PoolReason::Ready,
        reason.as_str(),
        message.clone(),
        observed,
        now,
    );
    let missing = *reason == PoolReason::TemplateNotFound;
    conditions::set(
        &mut conds,
        TEMPLATE_NOT_FOUND,
        missing,
        if missing {
            "TemplateNotFound"
        } else {
            "TemplateFound"
        },
        if missing {
            message.clone()
        } else {
            format!("SandboxTemplate {} exists", pool.spec.template_ref.name)
        },
        observed,
        now,
    );
    SandboxPoolStatus {
        replicas: i32::try_from(kept).unwrap_or(i32::MAX),
        ready_replicas: i32::try_from(ready).unwrap_or(i32::MAX),
        selector: Some(selector(pool)),
        template_generation: generation.or(old.template_generation),
        observed_generation: observed,
        conditions: conds,
    }
}

/// The label selector of a pool's warm pods (for `/scale`).
pub fn selector(pool: &SandboxPool) -> String {
    use kube::ResourceExt;
    format!(
        "{}={},{}=true",
        labels::POOL,
        labels::pool_label_value(&pool.name_any()),
        labels::WARM
    )
}

/// The reason of the Ready condition in `st`, if any.
pub fn ready_reason(st: Option<&SandboxPoolStatus>) -> Option<&str> {
    st.and_then(|s| conditions::get(&s.conditions, conditions::READY))
        .map(|c| c.reason.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(replicas: i32, strategy: &str) -> SandboxPool {
        let mut p: SandboxPool = serde_json::from_value(serde_json::json!({
            "apiVersion": "agentbox.dev/v1alpha1", "kind": "SandboxPool",
            "metadata": {"name": "py", "namespace": "team", "generation": 4},
            "spec": {"templateRef": {"name": "tpl"}, "replicas": replicas, "updateStrategy": strategy},
        }))
        .unwrap();
        p.status = None;
        p
    }

    fn at(secs: i64) -> Option<Timestamp> {
        Timestamp::from_second(1_700_000_000 + secs).ok()
    }

    fn pod(name: &str, hash: &str, created: i64, running: bool, init: bool) -> WarmPod {
        WarmPod {
            name: name.into(),
            created: at(created),
            shape_hash: hash.into(),
            running,
            initialised: init,
            ended: false,
            problem: None,
            node: Some("node-a".into()),
            node_prepared: true,
        }
    }

    fn want(hash: &str) -> Want {
        Want::Pods {
            shape_hash: hash.into(),
            generation: 2,
        }
    }

    fn now() -> Timestamp {
        Timestamp::from_second(1_700_001_000).unwrap()
    }

    #[test]
    fn an_empty_pool_makes_all_its_pods_at_once() {
        let plan = decide(&pool(3, "Recreate"), &want("h"), &[], now());
        assert_eq!(plan.create, 3);
        assert!(plan.delete.is_empty());
        assert_eq!(plan.reason.0, PoolReason::Scaling);
        assert_eq!((plan.status.replicas, plan.status.ready_replicas), (0, 0));
        assert_eq!(
            plan.status.selector.as_deref(),
            Some("agentbox.dev/pool=py,agentbox.dev/warm=true")
        );
        assert_eq!(plan.status.template_generation, Some(2));
        assert_eq!(plan.status.observed_generation, Some(4));
    }

    #[test]
    fn running_pods_are_initialised_only_once_their_nodes_directory_is_prepared() {
        let on = |mut p: WarmPod, node: &str, prepared: bool| {
            p.node = Some(node.into());
            p.node_prepared = prepared;
            p
        };
        let pods = [
            on(pod("a", "h", 0, true, false), "node-a", false),
            on(pod("b", "h", 1, true, false), "node-a", false),
            on(pod("c", "h", 2, true, false), "node-b", true),
            on(pod("d", "h", 3, false, false), "node-c", false),
            on(pod("e", "h", 4, true, true), "node-d", false),
        ];
        let plan = decide(&pool(5, "Recreate"), &want("h"), &pods, now());
        // Node a once, for both its pods; not node c (its pod does not run yet) nor d (its
        // pod was initialised before: by an earlier process, whose record this one lacks).
        assert_eq!(plan.prepare, ["node-a"]);
        assert_eq!(plan.initialise, ["c"]);
        assert_eq!(plan.create, 0);
        assert_eq!(plan.reason.0, PoolReason::Scaling);
        assert!(
            plan.reason
                .1
                .ends_with("; making the namespace's directory root-only on node-a first"),
            "{}",
            plan.reason.1
        );
        assert_eq!(plan.status.ready_replicas, 1);
        // Prepared: both are initialised, nothing more is asked of the node.
        let pods: Vec<WarmPod> = pods
            .into_iter()
            .map(|mut p| {
                p.node_prepared = true;
                p
            })
            .collect();
        let plan = decide(&pool(5, "Recreate"), &want("h"), &pods, now());
        assert!(plan.prepare.is_empty());
        let mut initialise = plan.initialise;
        initialise.sort();
        assert_eq!(initialise, ["a", "b", "c"]);
    }

    #[test]
    fn a_full_pool_of_ready_pods_is_ready_and_does_nothing() {
        let pods = [pod("a", "h", 0, true, true), pod("b", "h", 1, true, true)];
        let plan = decide(&pool(2, "Recreate"), &want("h"), &pods, now());
        assert_eq!((plan.create, plan.delete.len()), (0, 0));
        assert!(plan.initialise.is_empty());
        assert_eq!(plan.reason.0, PoolReason::Ready);
        assert!(conditions::is_true(&plan.status.conditions, "Ready"));
        assert!(!conditions::is_true(
            &plan.status.conditions,
            TEMPLATE_NOT_FOUND
        ));
        assert_eq!((plan.status.replicas, plan.status.ready_replicas), (2, 2));
    }

    #[test]
    fn running_pods_not_yet_initialised_are_initialised_and_not_ready_until_then() {
        let pods = [
            pod("a", "h", 0, true, false),
            pod("b", "h", 1, false, false),
        ];
        let plan = decide(&pool(2, "Recreate"), &want("h"), &pods, now());
        assert_eq!(plan.initialise, vec!["a".to_string()]);
        assert_eq!(plan.status.ready_replicas, 0);
        assert_eq!(plan.reason.0, PoolReason::Scaling);
    }

    #[test]
    fn scaling_down_deletes_not_ready_pods_first_then_the_newest() {
        let pods = [
            pod("old-ready", "h", 0, true, true),
            pod("new-ready", "h", 5, true, true),
            pod("starting", "h", 1, false, false),
            pod("mid-ready", "h", 3, true, true),
        ];
        let plan = decide(&pool(2, "Recreate"), &want("h"), &pods, now());
        assert_eq!(plan.create, 0);
        assert_eq!(
            plan.delete,
            vec!["starting".to_string(), "new-ready".to_string()]
        );
        let plan = decide(&pool(0, "Recreate"), &want("h"), &pods, now());
        assert_eq!(plan.delete.len(), 4);
        assert_eq!(plan.reason.0, PoolReason::Ready, "0 of 0 is ready");
    }

    #[test]
    fn recreate_replaces_pods_of_an_old_shape_and_on_delete_keeps_them() {
        let pods = [
            pod("old", "h1", 0, true, true),
            pod("new", "h2", 1, true, true),
        ];
        let plan = decide(&pool(2, "Recreate"), &want("h2"), &pods, now());
        assert_eq!(plan.delete, vec!["old".to_string()]);
        assert_eq!(plan.create, 1);
        assert_eq!(plan.reason.0, PoolReason::Updating);
        assert_eq!(plan.status.replicas, 1);

        let plan = decide(&pool(2, "OnDelete"), &want("h2"), &pods, now());
        assert!(plan.delete.is_empty());
        assert_eq!(plan.create, 0);
        assert_eq!(plan.reason.0, PoolReason::Updating);
        assert_eq!(plan.status.replicas, 2);
        // Scaling an OnDelete pool down takes the old pods first.
        let plan = decide(&pool(1, "OnDelete"), &want("h2"), &pods, now());
        assert_eq!(plan.delete, vec!["old".to_string()]);
        assert_eq!(plan.reason.0, PoolReason::Ready);
    }

    #[test]
    fn a_stuck_pod_says_why_the_pool_does_not_fill() {
        let mut stuck = pod("a", "h", 0, false, false);
        stuck.problem = Some("ErrImageNeverPull: image not present".into());
        let plan = decide(&pool(1, "Recreate"), &want("h"), &[stuck], now());
        assert_eq!(plan.create, 0, "kept: it may still start");
        assert_eq!(plan.reason.0, PoolReason::Scaling);
        assert_eq!(
            plan.reason.1,
            "0 of 1 warm pods ready; a: ErrImageNeverPull: image not present"
        );
    }

    #[test]
    fn ended_pods_are_replaced() {
        let mut dead = pod("dead", "h", 0, false, true);
        dead.ended = true;
        let plan = decide(&pool(1, "OnDelete"), &want("h"), &[dead], now());
        assert_eq!(plan.delete, vec!["dead".to_string()]);
        assert_eq!(plan.create, 1);
    }

    #[test]
    fn a_missing_or_refused_template_makes_no_pods_and_removes_the_warm_ones() {
        let pods = [pod("a", "h", 0, true, true)];
        let plan = decide(
            &pool(2, "Recreate"),
            &Want::Missing("tpl".into()),
            &pods,
            now(),
        );
        assert_eq!(plan.create, 0);
        assert_eq!(plan.delete, vec!["a".to_string()]);
        assert_eq!(plan.reason.0, PoolReason::TemplateNotFound);
        assert!(plan.reason.1.contains("SandboxTemplate tpl not found"));
        assert!(conditions::is_true(
            &plan.status.conditions,
            TEMPLATE_NOT_FOUND
        ));
        assert!(!conditions::is_true(&plan.status.conditions, "Ready"));
        assert_eq!(plan.status.replicas, 0);

        let plan = decide(
            &pool(2, "Recreate"),
            &Want::Invalid(vec!["capability SYS_ADMIN is not allowed".into()]),
            &[],
            now(),
        );
        assert_eq!(plan.create, 0);
        assert_eq!(plan.reason.0, PoolReason::Invalid);
        assert!(plan.reason.1.contains("SYS_ADMIN"));
        assert!(PoolReason::Invalid.is_problem() && !PoolReason::Scaling.is_problem());
    }

    #[test]
    fn a_runtime_class_the_namespace_refuses_makes_no_warm_pod_and_removes_those_there_are() {
        let pods = [pod("a", "h", 0, true, true)];
        let why = "namespace n requires runtime class \"gvisor\" (annotation agentbox.dev/required-runtime-class)";
        let plan = decide(
            &pool(2, "Recreate"),
            &Want::Refused(why.into()),
            &pods,
            now(),
        );
        assert_eq!(plan.create, 0);
        assert_eq!(plan.delete, vec!["a".to_string()]);
        assert_eq!(plan.reason.0, PoolReason::RuntimeClassRequired);
        assert_eq!(plan.reason.0.as_str(), "RuntimeClassRequired");
        assert_eq!(plan.reason.1, why);
        assert!(PoolReason::RuntimeClassRequired.is_problem());
        let ready = plan
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "RuntimeClassRequired")
        );
        assert!(
            ready
                .message
                .contains("agentbox.dev/required-runtime-class")
        );
    }

    #[test]
    fn the_status_is_unchanged_when_nothing_changed() {
        let pods = [pod("a", "h", 0, true, true)];
        let mut p = pool(1, "Recreate");
        let first = decide(&p, &want("h"), &pods, now());
        p.status = Some(first.status.clone());
        let later = Timestamp::from_second(1_700_009_000).unwrap();
        assert_eq!(decide(&p, &want("h"), &pods, later).status, first.status);
        assert_eq!(ready_reason(p.status.as_ref()), Some("Ready"));
    }
}
