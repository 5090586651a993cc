//! What a sandbox container may do: its capabilities and the user it runs as (pure).
//!
//! The container drops every capability and gets back [`DEFAULT_CAPABILITIES`]: enough to
//! install packages and manage files as root inside the container, without `MKNOD` (no device
//! nodes on the node's disk), `NET_RAW` (no forged packets), `SETFCAP`/`SETPCAP`, `SYS_CHROOT`,
//! `FSETID` or `AUDIT_WRITE`. A Sandbox may drop more, and add only what the operator's
//! allowlist holds. A non-root sandbox runs as a uid the operator knows, so its helper can hand
//! the workspace to it.

use agentbox_api::crd::SandboxSpec;
use agentbox_api::names::is_capability_name;

/// Capabilities a sandbox container keeps by default (Kubernetes names, without `CAP_`).
pub const DEFAULT_CAPABILITIES: [&str; 7] = [
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "KILL",
    "NET_BIND_SERVICE",
    "SETGID",
    "SETUID",
];

/// The operator's defaults that shape a sandbox's security settings.
#[derive(Debug, Clone, Copy)]
pub struct Defaults<'a> {
    /// Capabilities a Sandbox may add.
    pub allowed_capabilities: &'a [String],
    /// Sandboxes that say nothing run as non-root.
    pub run_as_non_root: bool,
    /// The uid of a non-root sandbox without `runAsUser`.
    pub default_run_as_user: i64,
}

/// A sandbox's effective security settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Effective {
    /// Capabilities added back after dropping all, sorted.
    pub capabilities: Vec<String>,
    /// The pod's `runAsUser`.
    pub run_as_user: Option<i64>,
    /// The pod's `runAsGroup`.
    pub run_as_group: Option<i64>,
    /// The pod's `runAsNonRoot`.
    pub run_as_non_root: Option<bool>,
    /// For a non-root sandbox, the uid and gid its workspace must belong to.
    pub workspace_owner: Option<(u32, u32)>,
}

/// The effective settings of `spec` under `d`. Call [`problems`] first: an added capability
/// outside the allowlist is left out here, never granted.
pub fn effective(spec: &SandboxSpec, d: Defaults<'_>) -> Effective {
    let sc = spec.pod.security_context.clone().unwrap_or_default();
    let caps = sc.capabilities.unwrap_or_default();
    let drop_all = caps.drop.iter().any(|c| c == "ALL");
    let mut capabilities: Vec<String> = DEFAULT_CAPABILITIES
        .iter()
        .map(|c| c.to_string())
        .filter(|c| !drop_all && !caps.drop.contains(c))
        .chain(
            caps.add
                .iter()
                .filter(|c| d.allowed_capabilities.contains(c))
                .cloned(),
        )
        .collect();
    capabilities.sort();
    capabilities.dedup();
    let non_root = sc.run_as_non_root.unwrap_or(d.run_as_non_root);
    let run_as_user = sc.run_as_user.or(non_root.then_some(d.default_run_as_user));
    let run_as_group = sc.run_as_group.or(run_as_user.filter(|u| *u > 0));
    let workspace_owner = match (run_as_user, run_as_group) {
        (Some(u), Some(g)) if u > 0 => u32::try_from(u).ok().zip(u32::try_from(g).ok()),
        _ => None,
    };
    Effective {
        capabilities,
        run_as_user,
        run_as_group,
        run_as_non_root: (sc.run_as_non_root.is_some() || non_root).then_some(non_root),
        workspace_owner,
    }
}

/// What the operator refuses in a spec's security settings, as messages.
pub fn problems(spec: &SandboxSpec, d: Defaults<'_>, have_helper: bool) -> Vec<String> {
    let mut out = Vec::new();
    let sc = spec.pod.security_context.clone().unwrap_or_default();
    let caps = sc.capabilities.clone().unwrap_or_default();
    for c in caps.add.iter().chain(&caps.drop) {
        if !is_capability_name(c) && c != "ALL" {
            out.push(format!(
                "capability {c:?} is not a capability name (like NET_RAW, without CAP_)"
            ));
        }
    }
    for c in &caps.add {
        if is_capability_name(c)
            && !DEFAULT_CAPABILITIES.contains(&c.as_str())
            && !d.allowed_capabilities.contains(c)
        {
            out.push(if d.allowed_capabilities.is_empty() {
                format!(
                    "capability {c} may not be added: this operator allows no capabilities beyond the default set"
                )
            } else {
                format!(
                    "capability {c} may not be added: this operator allows only {}",
                    d.allowed_capabilities.join(", ")
                )
            });
        }
    }
    if sc.run_as_non_root == Some(true) && sc.run_as_user == Some(0) {
        out.push("runAsNonRoot cannot be combined with runAsUser 0".into());
    }
    if effective(spec, d).workspace_owner.is_some() && !have_helper {
        out.push(
            "a non-root sandbox needs the operator's helper image to hand it its workspace, and this operator has none (--helper-image)"
                .into(),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(sc: serde_json::Value) -> SandboxSpec {
        serde_json::from_value(serde_json::json!({
            "image": "i", "scope": {"kind": "Global"}, "securityContext": sc,
        }))
        .unwrap()
    }

    fn defaults(allowed: &[String], non_root: bool) -> Defaults<'_> {
        Defaults {
            allowed_capabilities: allowed,
            run_as_non_root: non_root,
            default_run_as_user: 65532,
        }
    }

    #[test]
    fn the_default_set_has_no_mknod_and_runs_as_the_image_says() {
        let e = effective(&spec(serde_json::json!({})), defaults(&[], false));
        assert_eq!(e.capabilities.len(), DEFAULT_CAPABILITIES.len());
        assert!(
            !e.capabilities
                .iter()
                .any(|c| c == "MKNOD" || c == "NET_RAW")
        );
        assert_eq!((e.run_as_user, e.run_as_non_root), (None, None));
        assert_eq!(e.workspace_owner, None);
    }

    #[test]
    fn added_capabilities_need_the_allowlist_and_drops_always_work() {
        let allowed = vec!["NET_RAW".to_string()];
        let s = spec(
            serde_json::json!({"capabilities": {"add": ["NET_RAW", "SYS_ADMIN"], "drop": ["SETUID"]}}),
        );
        let p = problems(&s, defaults(&allowed, false), true);
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].contains("SYS_ADMIN") && p[0].contains("allows only NET_RAW"));
        let e = effective(&s, defaults(&allowed, false));
        assert!(e.capabilities.contains(&"NET_RAW".to_string()));
        assert!(
            !e.capabilities
                .iter()
                .any(|c| c == "SYS_ADMIN" || c == "SETUID")
        );
        let none = effective(
            &spec(serde_json::json!({"capabilities": {"drop": ["ALL"]}})),
            defaults(&[], false),
        );
        assert!(none.capabilities.is_empty());
        let p = problems(
            &spec(serde_json::json!({"capabilities": {"add": ["MKNOD"]}})),
            defaults(&[], false),
            true,
        );
        assert!(p[0].contains("allows no capabilities"), "{p:?}");
        let p = problems(
            &spec(serde_json::json!({"capabilities": {"add": ["CAP_MKNOD", "net_raw"]}})),
            defaults(&[], false),
            true,
        );
        assert_eq!(p.len(), 2, "{p:?}");
    }

    #[test]
    fn non_root_gets_a_known_uid_and_a_workspace_owner() {
        let e = effective(&spec(serde_json::json!({})), defaults(&[], true));
        assert_eq!(e.run_as_user, Some(65532));
        assert_eq!(e.run_as_group, Some(65532));
        assert_eq!(e.run_as_non_root, Some(true));
        assert_eq!(e.workspace_owner, Some((65532, 65532)));
        let e = effective(
            &spec(serde_json::json!({"runAsUser": 1000, "runAsGroup": 100})),
            defaults(&[], false),
        );
        assert_eq!(e.workspace_owner, Some((1000, 100)));
        assert_eq!(e.run_as_non_root, None);
        // A sandbox may opt out of the operator's default.
        let e = effective(
            &spec(serde_json::json!({"runAsNonRoot": false})),
            defaults(&[], true),
        );
        assert_eq!((e.run_as_user, e.run_as_non_root), (None, Some(false)));
        let root = spec(serde_json::json!({"runAsNonRoot": true, "runAsUser": 0}));
        assert!(!problems(&root, defaults(&[], false), true).is_empty());
        let p = problems(&spec(serde_json::json!({})), defaults(&[], true), false);
        assert!(p[0].contains("helper image"), "{p:?}");
    }
}
