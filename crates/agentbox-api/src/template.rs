//! How a Sandbox and the SandboxTemplate it names combine into the spec the operator works on,
//! pure. The rules are the ones `kubectl explain sandbox.spec.templateRef` states; admission
//! has already refused a templated Sandbox that sets a pod-shaping field, so here the
//! template's value of each such field is simply taken.

use crate::crd::{
    Lifecycle, PodShape, SandboxSpec, SandboxTemplateSpec, Scope, ScopeKind, SnapshotPolicy,
    WorkspaceSpec,
};

/// The effective spec of a Sandbox whose `spec` names `template`: the template's pod-shaping
/// fields, the sandbox's scope, root and mounts, the template's files and env with the
/// sandbox's added (the sandbox's win on the same path or name), the sandbox's snapshot policy
/// when it is not the default (else the template's), the sandbox's lifecycle with the
/// template's idle timeout when the sandbox sets none.
pub fn resolve(template: &SandboxTemplateSpec, spec: &SandboxSpec) -> SandboxSpec {
    let t = template.clone();
    SandboxSpec {
        template_ref: spec.template_ref.clone(),
        pod: PodShape {
            env: merge_by(t.pod.env, &spec.pod.env, |e| e.name.clone()),
            ..t.pod
        },
        scope: spec.scope.clone(),
        workspace: WorkspaceSpec {
            root: spec.workspace.root.clone(),
            files: merge_by(t.workspace.files, &spec.workspace.files, |f| f.path.clone()),
            projections: t.workspace.projections,
            mounts: spec.workspace.mounts.clone(),
            size_limit: t.workspace.size_limit,
        },
        snapshot: if spec.snapshot == SnapshotPolicy::default() {
            t.snapshot
        } else {
            spec.snapshot.clone()
        },
        lifecycle: Lifecycle {
            mode: spec.lifecycle.mode,
            shutdown_time: spec.lifecycle.shutdown_time.clone(),
            idle_timeout: spec.lifecycle.idle_timeout.or(t.lifecycle.idle_timeout),
            guard: spec.lifecycle.guard.clone(),
        },
    }
}

/// The effective spec of a Sandbox that names template `name` and overrides nothing: what a
/// SandboxPool's warm pods are made from. Its scope (Global) shapes no pod.
pub fn for_pool(name: &str, template: &SandboxTemplateSpec) -> SandboxSpec {
    let bare = SandboxSpec::from_template(
        name,
        Scope {
            kind: ScopeKind::Global,
            agent: None,
            user: None,
            session: None,
        },
    );
    resolve(template, &bare)
}

/// The template's entries in their order, minus those an entry of `own` has the key of, then
/// `own`'s entries in theirs.
fn merge_by<T: Clone>(base: Vec<T>, own: &[T], key: impl Fn(&T) -> String) -> Vec<T> {
    let mine: std::collections::HashSet<String> = own.iter().map(&key).collect();
    base.into_iter()
        .filter(|e| !mine.contains(&key(e)))
        .chain(own.iter().cloned())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{Egress, LifecycleMode, RestorePolicy, ScopeKind};
    use serde_json::json;

    fn template() -> SandboxTemplateSpec {
        serde_json::from_value(json!({
            "image": "registry.example/agent:1",
            "imagePullPolicy": "Never",
            "command": ["sh", "-c", "sleep infinity"],
            "env": [{"name": "MODE", "value": "tpl"}, {"name": "KEEP", "value": "1"}],
            "runtimeClassName": "gvisor",
            "network": {"egress": "None"},
            "ports": [{"name": "http", "port": 8080}],
            "workspace": {
                "files": [{"path": "README.md", "content": "tpl"}, {"path": "AGENTS.md", "content": "rules"}],
                "projections": [{"configMap": "skills", "path": "skills"}]
            },
            "snapshot": {"onStop": true},
            "lifecycle": {"idleTimeout": "15m"}
        }))
        .unwrap()
    }

    fn sandbox(extra: serde_json::Value) -> SandboxSpec {
        let mut spec = json!({
            "templateRef": {"name": "agent"},
            "scope": {"kind": "User", "agent": "coder", "user": "alice"},
        });
        for (k, v) in extra.as_object().unwrap() {
            spec[k] = v.clone();
        }
        serde_json::from_value(spec).unwrap()
    }

    #[test]
    fn pod_shaping_fields_come_from_the_template_and_the_scope_from_the_sandbox() {
        let got = resolve(&template(), &sandbox(json!({})));
        assert_eq!(got.pod.image.as_deref(), Some("registry.example/agent:1"));
        assert_eq!(got.pod.command, template().pod.command);
        assert_eq!(got.pod.runtime_class_name.as_deref(), Some("gvisor"));
        assert_eq!(got.pod.network.egress, Some(Egress::Denied));
        assert_eq!(got.pod.ports, template().pod.ports);
        assert_eq!(got.workspace.projections, template().workspace.projections);
        assert_eq!(got.scope.kind, ScopeKind::User);
        assert_eq!(got.scope.user.as_deref(), Some("alice"));
        assert_eq!(got.template_ref.map(|r| r.name).as_deref(), Some("agent"));
    }

    #[test]
    fn sandbox_env_is_appended_and_replaces_a_variable_of_the_same_name() {
        let got = resolve(
            &template(),
            &sandbox(
                json!({"env": [{"name": "MODE", "value": "mine"}, {"name": "EXTRA", "value": "x"}]}),
            ),
        );
        let pairs: Vec<(String, Option<String>)> =
            got.pod.env.into_iter().map(|e| (e.name, e.value)).collect();
        assert_eq!(
            pairs,
            vec![
                ("KEEP".into(), Some("1".into())),
                ("MODE".into(), Some("mine".into())),
                ("EXTRA".into(), Some("x".into())),
            ]
        );
    }

    #[test]
    fn sandbox_files_are_added_and_replace_a_file_of_the_same_path() {
        let got = resolve(
            &template(),
            &sandbox(json!({"workspace": {"root": "/home/agent", "files": [
                {"path": "README.md", "content": "mine"}, {"path": "task.txt", "content": "t"}]}})),
        );
        let files: Vec<(String, Option<String>)> = got
            .workspace
            .files
            .into_iter()
            .map(|f| (f.path, f.content))
            .collect();
        assert_eq!(
            files,
            vec![
                ("AGENTS.md".into(), Some("rules".into())),
                ("README.md".into(), Some("mine".into())),
                ("task.txt".into(), Some("t".into())),
            ]
        );
        assert_eq!(got.workspace.root, "/home/agent");
    }

    #[test]
    fn a_default_snapshot_policy_takes_the_templates_and_any_other_replaces_it() {
        let inherited = resolve(&template(), &sandbox(json!({})));
        assert!(inherited.snapshot.on_stop);
        let own = resolve(
            &template(),
            &sandbox(json!({"snapshot": {"restore": "Named", "name": "snap-1"}})),
        );
        assert_eq!(own.snapshot.restore, RestorePolicy::Named);
        assert_eq!(own.snapshot.name.as_deref(), Some("snap-1"));
        assert!(
            !own.snapshot.on_stop,
            "the sandbox's policy replaces it whole"
        );
    }

    #[test]
    fn lifecycle_mode_is_the_sandboxes_and_idle_timeout_defaults_to_the_templates() {
        let inherited = resolve(
            &template(),
            &sandbox(json!({"lifecycle": {"mode": "Suspended"}})),
        );
        assert_eq!(inherited.lifecycle.mode, LifecycleMode::Suspended);
        assert_eq!(
            inherited
                .lifecycle
                .idle_timeout
                .map(std::time::Duration::from),
            Some(std::time::Duration::from_secs(900))
        );
        let own = resolve(
            &template(),
            &sandbox(json!({"lifecycle": {"idleTimeout": "30s"}})),
        );
        assert_eq!(
            own.lifecycle.idle_timeout.map(std::time::Duration::from),
            Some(std::time::Duration::from_secs(30))
        );
        assert_eq!(own.lifecycle.mode, LifecycleMode::Running);
    }
}
