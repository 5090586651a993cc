//! Spec checks the operator repeats in code: the CRD's CEL rules (in case the CRD is stale or
//! was edited) and what CEL cannot know, such as the operator's allowed host-mount prefixes,
//! capability allowlist and helper image.

use super::pod::PodConfig;
use agentbox_api::crd::{RestorePolicy, SandboxSpec, ScopeKind};
use agentbox_api::names;
use agentbox_api::paths::{self, PathError, is_clean_absolute, is_under};

/// Every problem with a sandbox spec, as messages a user understands. Empty when valid.
pub fn problems(
    spec: &SandboxSpec,
    allowed_host_prefixes: &[String],
    pod: &PodConfig<'_>,
) -> Vec<String> {
    let mut out = Vec::new();
    scope_problems(spec, &mut out);
    workspace_problems(spec, &mut out);
    mount_problems(spec, allowed_host_prefixes, &mut out);
    restore_problems(spec, &mut out);
    reference_problems(spec, &mut out);
    out.extend(super::security::problems(
        spec,
        pod.security,
        pod.helper.is_some(),
    ));
    out
}

/// The ids a scope's kind needs, and those it does not use.
fn scope_problems(spec: &SandboxSpec, out: &mut Vec<String>) {
    let s = &spec.scope;
    let need = |present: bool, id: &str, out: &mut Vec<String>| {
        if !present {
            out.push(format!("scope.{id} is required for a {:?} scope", s.kind));
        }
    };
    let forbid = |present: bool, id: &str, out: &mut Vec<String>| {
        if present {
            out.push(format!("scope.{id} is not used by a {:?} scope", s.kind));
        }
    };
    let has = |v: &Option<String>| v.as_deref().is_some_and(|v| !v.is_empty());
    match s.kind {
        ScopeKind::Session => {
            need(has(&s.agent), "agent", out);
            need(has(&s.session), "session", out);
            forbid(s.user.is_some(), "user", out);
        }
        ScopeKind::User => {
            need(has(&s.agent), "agent", out);
            need(has(&s.user), "user", out);
            forbid(s.session.is_some(), "session", out);
        }
        ScopeKind::Agent => {
            need(has(&s.agent), "agent", out);
            forbid(s.user.is_some(), "user", out);
            forbid(s.session.is_some(), "session", out);
        }
        ScopeKind::Global => {
            forbid(s.agent.is_some(), "agent", out);
            forbid(s.user.is_some(), "user", out);
            forbid(s.session.is_some(), "session", out);
        }
    }
}

/// The workspace root, the files and the projections.
fn workspace_problems(spec: &SandboxSpec, out: &mut Vec<String>) {
    if let Some(q) = &spec.workspace.size_limit {
        match agentbox_api::crd::size_limit_bytes(q) {
            Ok(b) if b < agentbox_api::crd::MIN_SIZE_LIMIT => {
                out.push(format!("workspace.sizeLimit {q:?} is less than 1Mi"));
            }
            Ok(_) => {}
            Err(e) => out.push(e),
        }
    }
    let root = &spec.workspace.root;
    if !is_clean_absolute(root) || root == "/" {
        out.push(format!(
            "workspace.root must be a clean absolute path other than '/', got {root:?}"
        ));
    }
    for f in &spec.workspace.files {
        check_relative("workspace.files[].path", &f.path, out);
        if f.content.is_some() == f.content_from.is_some() {
            out.push(format!(
                "file {:?} needs exactly one of content and contentFrom",
                f.path
            ));
        }
        if let Some(src) = &f.content_from
            && src.config_map_key_ref.is_some() == src.secret_key_ref.is_some()
        {
            out.push(format!(
                "file {:?}: contentFrom needs exactly one of configMapKeyRef and secretKeyRef",
                f.path
            ));
        }
        if let Some(m) = f.mode
            && !(0..=0o777).contains(&m)
        {
            out.push(format!(
                "file {:?}: mode must be between 0 and 0777",
                f.path
            ));
        }
    }
    for p in &spec.workspace.projections {
        check_relative("workspace.projections[].path", &p.path, out);
    }
}

/// Host mounts: clean relative paths, onto host paths under an allowed prefix.
fn mount_problems(spec: &SandboxSpec, allowed_host_prefixes: &[String], out: &mut Vec<String>) {
    for m in &spec.workspace.mounts {
        check_relative("workspace.mounts[].path", &m.path, out);
        if !is_clean_absolute(&m.host_path) {
            out.push(format!(
                "mount hostPath {:?} must be a clean absolute path",
                m.host_path
            ));
        } else if !allowed_host_prefixes
            .iter()
            .any(|p| is_under(&m.host_path, p))
        {
            out.push(if allowed_host_prefixes.is_empty() {
                format!(
                    "mount hostPath {:?} is not allowed: this operator allows no host mounts",
                    m.host_path
                )
            } else {
                format!(
                    "mount hostPath {:?} is not under an allowed prefix ({})",
                    m.host_path,
                    allowed_host_prefixes.join(", ")
                )
            });
        }
    }
}

/// `snapshot.name` goes with `restore: Named` and nothing else.
fn restore_problems(spec: &SandboxSpec, out: &mut Vec<String>) {
    match (spec.snapshot.restore, &spec.snapshot.name) {
        (RestorePolicy::Named, None) => {
            out.push("snapshot.name is required when snapshot.restore is Named".into())
        }
        (RestorePolicy::Latest | RestorePolicy::Never, Some(_)) => {
            out.push("snapshot.name is only used when snapshot.restore is Named".into())
        }
        _ => {}
    }
}

/// References to other objects: names only, so that none can change a request's path; data
/// keys of file sources likewise.
fn reference_problems(spec: &SandboxSpec, out: &mut Vec<String>) {
    let mut refs: Vec<(String, &str)> = Vec::new();
    if let Some(n) = &spec.snapshot.name {
        refs.push(("snapshot.name".into(), n));
    }
    if let Some(n) = &spec.pod.runtime_class_name {
        refs.push(("runtimeClassName".into(), n));
    }
    for p in &spec.workspace.projections {
        refs.push(("workspace.projections[].configMap".into(), &p.config_map));
    }
    for e in &spec.pod.env {
        let from = e.value_from.as_ref();
        if let Some(r) = from.and_then(|f| f.config_map_key_ref.as_ref()) {
            refs.push((format!("env {} configMapKeyRef.name", e.name), &r.name));
        }
        if let Some(r) = from.and_then(|f| f.secret_key_ref.as_ref()) {
            refs.push((format!("env {} secretKeyRef.name", e.name), &r.name));
        }
    }
    let mut keys = Vec::new();
    for f in &spec.workspace.files {
        let sources = f
            .content_from
            .iter()
            .flat_map(|s| [&s.config_map_key_ref, &s.secret_key_ref])
            .flatten();
        for r in sources {
            refs.push((format!("file {:?} source name", f.path), &r.name));
            if !names::is_data_key(&r.key) {
                keys.push(format!(
                    "file {:?}: key {:?} {}",
                    f.path,
                    r.key,
                    names::DATA_KEY_MESSAGE
                ));
            }
        }
    }
    out.extend(
        refs.iter()
            .filter(|(_, v)| !names::is_object_name(v))
            .map(|(what, v)| names::refusal(what, v)),
    );
    out.extend(keys);
}

/// A spec path relative to the workspace root, judged by the confiner the clients use too.
fn check_relative(what: &str, path: &str, out: &mut Vec<String>) {
    match paths::relative(path) {
        Ok(_) => {}
        Err(PathError::DotDot(_)) => out.push(format!("{what} {path:?} must not contain '..'")),
        Err(PathError::Reserved(_)) => out.push(format!(
            "{what} {path:?}: {} is reserved for the operator",
            agentbox_api::remote::STATE_DIR
        )),
        Err(_) => out.push(format!(
            "{what} {path:?} must be relative to the workspace root"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::pod::HelperImage;
    use crate::controller::security::Defaults;
    use agentbox_api::crd::{HostMount, HostMountType, Scope, WorkspaceFile};

    const POD: PodConfig<'static> = PodConfig {
        node_root: "/w",
        helper: Some(HelperImage {
            image: "agentbox/helper:v1",
            pull_policy: "IfNotPresent",
        }),
        security: Defaults {
            allowed_capabilities: &[],
            run_as_non_root: false,
            default_run_as_user: 65532,
        },
        default_runtime_class: None,
        processes: crate::controller::pids::ProcessLimits::NONE,
        sizes: crate::controller::sizelimit::SizeLimits::NONE,
        default_egress: agentbox_api::crd::Egress::All,
        network_wait: None,
        proxy: None,
    };

    fn problems(spec: &SandboxSpec, allowed: &[String]) -> Vec<String> {
        super::problems(spec, allowed, &POD)
    }

    fn spec() -> SandboxSpec {
        serde_json::from_value(serde_json::json!({
            "image": "docker.io/library/busybox:1.37",
            "scope": {"kind": "User", "agent": "coder", "user": "alice"}
        }))
        .unwrap()
    }

    fn mount(host: &str) -> HostMount {
        HostMount {
            path: "data".into(),
            host_path: host.into(),
            read_only: true,
            type_: HostMountType::Directory,
        }
    }

    #[test]
    fn a_plain_spec_is_valid() {
        assert!(problems(&spec(), &[]).is_empty());
    }

    #[test]
    fn scope_ids_follow_the_kind() {
        let mut s = spec();
        s.scope = Scope {
            kind: ScopeKind::Session,
            agent: Some("a".into()),
            user: None,
            session: None,
        };
        assert_eq!(
            problems(&s, &[]),
            vec!["scope.session is required for a Session scope"]
        );
        s.scope = Scope {
            kind: ScopeKind::Global,
            agent: Some("a".into()),
            user: None,
            session: None,
        };
        assert_eq!(
            problems(&s, &[]),
            vec!["scope.agent is not used by a Global scope"]
        );
        s.scope = Scope {
            kind: ScopeKind::User,
            agent: Some(String::new()),
            user: Some("u".into()),
            session: None,
        };
        assert_eq!(
            problems(&s, &[]),
            vec!["scope.agent is required for a User scope"]
        );
    }

    #[test]
    fn paths_must_be_clean() {
        let mut s = spec();
        s.workspace.root = "workspace".into();
        s.workspace.files = vec![
            WorkspaceFile {
                path: "../x".into(),
                content: Some("x".into()),
                content_from: None,
                mode: None,
                ephemeral: false,
            },
            WorkspaceFile {
                path: "/etc/x".into(),
                content: Some("x".into()),
                content_from: None,
                mode: None,
                ephemeral: false,
            },
            WorkspaceFile {
                path: "./.agentbox/marker".into(),
                content: Some("x".into()),
                content_from: None,
                mode: None,
                ephemeral: false,
            },
            WorkspaceFile {
                path: "ok".into(),
                content: None,
                content_from: None,
                mode: Some(0o1777),
                ephemeral: false,
            },
        ];
        let p = problems(&s, &[]);
        assert_eq!(p.len(), 6, "{p:#?}");
        assert!(p[0].contains("workspace.root"));
        assert!(p[1].contains("'..'"));
        assert!(p[2].contains("relative"));
        assert!(p[3].contains("reserved"));
        assert!(p[4].contains("exactly one"));
        assert!(p[5].contains("mode"));
    }

    #[test]
    fn host_mounts_only_under_allowed_prefixes() {
        let mut s = spec();
        s.workspace.mounts = vec![mount("/srv/shared/data")];
        assert!(problems(&s, &[])[0].contains("allows no host mounts"));
        assert!(problems(&s, &["/srv/shared".into()]).is_empty());
        assert!(problems(&s, &["/srv/shared/data".into()]).is_empty());
        assert!(problems(&s, &["/srv/sh".into()])[0].contains("not under an allowed prefix"));
        s.workspace.mounts = vec![mount("/srv/shared/../../etc")];
        assert!(problems(&s, &["/srv/shared".into()])[0].contains("clean absolute"));
    }

    #[test]
    fn references_must_be_object_names() {
        let s: SandboxSpec = serde_json::from_value(serde_json::json!({
            "image": "i", "scope": {"kind": "Global"},
            "runtimeClassName": "gVisor",
            "snapshot": {"restore": "Named", "name": "../../secrets/x"},
            "env": [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "a/b", "key": "k"}}}],
            "workspace": {
                "files": [{"path": "f", "contentFrom": {"configMapKeyRef": {"name": "cm?watch=1", "key": "a/b"}}}],
                "projections": [{"configMap": "Tools", "path": "t"}]
            }
        }))
        .unwrap();
        let p = problems(&s, &[]);
        assert_eq!(p.len(), 6, "{p:#?}");
        for (i, what) in [
            "snapshot.name \"../../secrets/x\"",
            "runtimeClassName \"gVisor\"",
            "configMap \"Tools\"",
            "env T secretKeyRef.name \"a/b\"",
            "source name \"cm?watch=1\"",
            "key \"a/b\"",
        ]
        .iter()
        .enumerate()
        {
            assert!(p[i].contains(what), "{i}: {} lacks {what}", p[i]);
        }
    }

    #[test]
    fn security_settings_are_checked_against_the_operator() {
        let s: SandboxSpec = serde_json::from_value(serde_json::json!({
            "image": "i", "scope": {"kind": "Global"},
            "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}
        }))
        .unwrap();
        assert!(problems(&s, &[])[0].contains("SYS_ADMIN"));
        let s: SandboxSpec = serde_json::from_value(serde_json::json!({
            "image": "i", "scope": {"kind": "Global"},
            "securityContext": {"runAsUser": 1000}
        }))
        .unwrap();
        assert!(problems(&s, &[]).is_empty());
        let no_helper = PodConfig {
            helper: None,
            ..POD
        };
        assert!(super::problems(&s, &[], &no_helper)[0].contains("helper image"));
    }
}
