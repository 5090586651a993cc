//! SandboxTemplates against the real local cluster: a Sandbox made from a template runs the
//! template's image, command and env with its own scope, env and files; overrides and bad
//! templates are refused at admission naming the field; a missing template holds a Sandbox
//! Pending until it is created; a template edit leaves a running sandbox's pod alone and
//! applies from its next start.

mod common;

use agentbox_api::crd::{Sandbox, SandboxTemplate};
use common::{TestEnv, cli, condition_message, create_sandbox, phase_is, sh, wait_condition};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

/// The keep-alive command of the test template: the template's own, so the test sees it on
/// the pod (the operator's default is another).
const COMMAND: [&str; 3] = [
    "sh",
    "-c",
    "trap 'exit 0' TERM; while true; do sleep 1; done",
];

fn template_json(name: &str, mode: &str) -> serde_json::Value {
    json!({
        "apiVersion": "agentbox.dev/v1alpha1", "kind": "SandboxTemplate",
        "metadata": {"name": name},
        "spec": {
            "image": common::BASE_IMAGE,
            "imagePullPolicy": "Never",
            "command": COMMAND,
            "env": [{"name": "FROM_TEMPLATE", "value": "yes"}, {"name": "MODE", "value": mode}],
            "workspace": {"files": [{"path": "AGENTS.md", "content": "template rules\n"}]},
        }
    })
}

async fn create_template(
    env: &TestEnv,
    name: &str,
    mode: &str,
) -> Result<SandboxTemplate, kube::Error> {
    let t: SandboxTemplate =
        serde_json::from_value(template_json(name, mode)).expect("template json");
    env.api::<SandboxTemplate>()
        .create(&PostParams::default(), &t)
        .await
}

fn templated(template: &str, user: &str) -> serde_json::Value {
    json!({
        "templateRef": {"name": template},
        "scope": {"kind": "User", "agent": "coder", "user": user},
        "env": [{"name": "MODE", "value": "sandbox"}],
        "workspace": {"files": [{"path": "task.md", "content": "the task\n"}]},
    })
}

fn pod_of(s: &Sandbox) -> String {
    s.status
        .as_ref()
        .and_then(|st| st.pod_name.clone())
        .expect("pod name")
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn a_templated_sandbox_runs_the_template_with_its_own_scope_env_and_files() {
    let mut env = TestEnv::new("tpl-run").await;
    env.start_operator(&[]);
    create_template(&env, "agent", "template")
        .await
        .expect("create template");
    create_sandbox(&env, "alice", templated("agent", "alice"))
        .await
        .expect("create sandbox");
    let sbx = env
        .wait_for::<Sandbox>("alice", 120, phase_is("Ready"))
        .await;
    let st = sbx.status.clone().expect("status");
    let used = st.template.clone().expect("status.template");
    assert_eq!(used.name, "agent");
    assert_eq!(used.generation, 1);
    assert_eq!(
        sbx.labels().get("agentbox.dev/user").map(String::as_str),
        Some("alice"),
        "the sandbox's own scope labels it"
    );
    let pod_name = pod_of(&sbx);
    let pod = env.api::<Pod>().get(&pod_name).await.expect("pod");
    let c = &pod.spec.as_ref().expect("pod spec").containers[0];
    assert_eq!(c.image.as_deref(), Some(common::BASE_IMAGE));
    assert_eq!(
        c.command.clone().unwrap_or_default(),
        COMMAND.map(String::from).to_vec()
    );
    let (code, out) = sh(
        &env,
        &pod_name,
        "echo \"$FROM_TEMPLATE $MODE\"; cat AGENTS.md task.md",
    )
    .await;
    assert_eq!(code, Some(0));
    assert_eq!(
        out, "yes sandbox\ntemplate rules\nthe task\n",
        "template env with the sandbox's MODE, the template's file and the sandbox's"
    );

    // The template is edited: a sandbox made now gets the new version; the running one keeps
    // its pod and the version it was made from.
    env.api::<SandboxTemplate>()
        .patch(
            "agent",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"env": [
                {"name": "FROM_TEMPLATE", "value": "edited"}, {"name": "MODE", "value": "template"}]}})),
        )
        .await
        .expect("edit template");
    create_sandbox(&env, "bob", templated("agent", "bob"))
        .await
        .expect("create second sandbox");
    let bob = env.wait_for::<Sandbox>("bob", 120, phase_is("Ready")).await;
    assert_eq!(
        bob.status
            .as_ref()
            .and_then(|s| s.template.as_ref())
            .map(|t| t.generation),
        Some(2)
    );
    let (_, out) = sh(&env, &pod_of(&bob), "echo \"$FROM_TEMPLATE\"").await;
    assert_eq!(out, "edited\n");
    let alice = env.api::<Sandbox>().get("alice").await.expect("alice");
    assert_eq!(pod_of(&alice), pod_name, "the running pod is kept");
    assert_eq!(
        alice
            .status
            .as_ref()
            .and_then(|s| s.template.as_ref())
            .map(|t| t.generation),
        Some(1)
    );
    let pod_now = env.api::<Pod>().get(&pod_name).await.expect("pod");
    assert_eq!(pod_now.uid(), pod.uid(), "same pod, not replaced");
    let (_, out) = sh(&env, &pod_name, "echo \"$FROM_TEMPLATE\"").await;
    assert_eq!(out, "yes\n");

    // Its next start (a suspend and resume) uses the template as it is then.
    let mode = |m: &str| json!({"spec": {"lifecycle": {"mode": m}}});
    let api = env.api::<Sandbox>();
    api.patch(
        "alice",
        &PatchParams::default(),
        &Patch::Merge(&mode("Suspended")),
    )
    .await
    .expect("suspend");
    env.wait_for::<Sandbox>("alice", 120, phase_is("Suspended"))
        .await;
    api.patch(
        "alice",
        &PatchParams::default(),
        &Patch::Merge(&mode("Running")),
    )
    .await
    .expect("resume");
    let alice = env
        .wait_for::<Sandbox>("alice", 120, |s: Option<&Sandbox>| {
            s.and_then(|s| s.status.as_ref()).is_some_and(|st| {
                st.phase.map(|p| p.as_str()) == Some("Ready")
                    && st.template.as_ref().map(|t| t.generation) == Some(2)
            })
        })
        .await;
    let (_, out) = sh(
        &env,
        &pod_of(&alice),
        "echo \"$FROM_TEMPLATE\"; cat task.md",
    )
    .await;
    assert_eq!(
        out, "edited\nthe task\n",
        "new template env, workspace kept"
    );
    env.finish().await;
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn a_missing_template_holds_the_sandbox_pending_until_it_is_created() {
    let mut env = TestEnv::new("tpl-late").await;
    env.start_operator(&[]);
    create_sandbox(&env, "early", templated("late", "carol"))
        .await
        .expect("create sandbox");
    let sbx = wait_condition(&env, "early", "Ready", "False", "TemplateNotFound").await;
    let st = sbx.status.expect("status");
    assert_eq!(st.phase.map(|p| p.as_str()), Some("Pending"));
    let ready = st
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .expect("Ready");
    assert_eq!(ready.status, "False");
    assert!(
        ready.message.contains("SandboxTemplate late not found"),
        "{}",
        ready.message
    );
    let warned = common::events(&env, "early", "TemplateNotFound").await;
    assert!(
        warned.iter().any(|e| e.type_.as_deref() == Some("Warning")),
        "{warned:?}"
    );
    assert!(
        env.sandbox_pods("early").await.is_empty(),
        "no pod without a template"
    );

    create_template(&env, "late", "template")
        .await
        .expect("create template");
    let sbx = env
        .wait_for::<Sandbox>("early", 120, phase_is("Ready"))
        .await;
    let (_, out) = sh(&env, &pod_of(&sbx), "echo \"$FROM_TEMPLATE $MODE\"").await;
    assert_eq!(out, "yes sandbox\n");
    env.finish().await;
}

/// What only the operator can check of a template (a ConfigMap it names is missing) is
/// reported on the sandboxes made from it, as for a sandbox's own spec.
#[tokio::test]
#[ignore = "needs a cluster"]
async fn a_template_naming_a_missing_configmap_is_reported_on_its_sandbox() {
    let mut env = TestEnv::new("tpl-cm").await;
    env.start_operator(&[]);
    let mut t = template_json("proj", "template");
    t["spec"]["workspace"]["projections"] = json!([{"configMap": "absent", "path": "skills"}]);
    let t: SandboxTemplate = serde_json::from_value(t).expect("template json");
    env.api::<SandboxTemplate>()
        .create(&PostParams::default(), &t)
        .await
        .expect("create template");
    create_sandbox(&env, "nocm", templated("proj", "judy"))
        .await
        .expect("create sandbox");
    let sbx = wait_condition(&env, "nocm", "WorkspaceReady", "False", "SourceMissing").await;
    let message = condition_message(&sbx, "WorkspaceReady");
    assert!(message.contains("ConfigMap absent not found"), "{message}");
    assert_ne!(
        sbx.status.and_then(|st| st.phase).map(|p| p.as_str()),
        Some("Ready")
    );
    env.finish().await;
}

/// Admission, no operator: the API server refuses with the CRDs' own messages.
#[tokio::test]
#[ignore = "needs a cluster"]
async fn overrides_and_bad_templates_are_refused_at_admission_naming_the_field() {
    let env = TestEnv::new("tpl-admit").await;
    let refused = |r: Result<Sandbox, kube::Error>, expected: &str| match r {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 422, "{expected}: {s:?}");
            assert!(
                s.message.contains(expected),
                "{:?} does not say {expected:?}",
                s.message
            );
        }
        other => panic!("accepted, expected {expected:?}: {other:?}"),
    };
    let with = |extra: serde_json::Value| {
        let mut spec = templated("agent", "dave");
        for (k, v) in extra.as_object().expect("object") {
            spec[k] = v.clone();
        }
        spec
    };
    for (i, (extra, expected)) in [
        (
            json!({"image": "other:1"}),
            "image comes from the template: a Sandbox with templateRef cannot set it",
        ),
        (
            json!({"command": ["sh"]}),
            "command comes from the template: a Sandbox with templateRef cannot set it",
        ),
        (
            json!({"securityContext": {"runAsUser": 0}}),
            "securityContext comes from the template",
        ),
        (
            json!({"network": {"egress": "None"}}),
            "network comes from the template",
        ),
        (
            json!({"templateRef": {"name": "Not_A_Name"}}),
            "must be a Kubernetes object name",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        refused(
            create_sandbox(&env, &format!("over-{i}"), with(extra)).await,
            expected,
        );
    }
    refused(
        create_sandbox(&env, "bare", json!({"scope": {"kind": "Global"}})).await,
        "image is required unless templateRef names a SandboxTemplate",
    );

    // Immutable: templateRef neither changes nor goes.
    create_sandbox(&env, "ok", templated("agent", "erin"))
        .await
        .expect("create");
    let api = env.api::<Sandbox>();
    for (patch, expected) in [
        (
            json!({"spec": {"templateRef": {"name": "other"}}}),
            "templateRef is immutable",
        ),
        (
            json!({"spec": {"templateRef": null, "image": "x"}}),
            "templateRef cannot be added or removed",
        ),
    ] {
        refused(
            api.patch("ok", &PatchParams::default(), &Patch::Merge(&patch))
                .await,
            expected,
        );
    }

    // A template gets the Sandbox's own rules.
    let templates = env.api::<SandboxTemplate>();
    for (i, (spec, expected)) in [
        (
            json!({"image": "i", "env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}),
            "env names must be unique: A appears more than once",
        ),
        (json!({"image": "i", "lifecycle": {"idleTimeout": "5s"}}), "idleTimeout must be at least 10s"),
        (json!({"image": "i", "workspace": {"files": [{"path": "../x", "content": "x"}]}}), "file paths must not contain '..'"),
        (json!({"command": ["sh"]}), "a SandboxTemplate needs an image"),
    ]
    .into_iter()
    .enumerate()
    {
        // Applied as raw JSON: a template without an image is no SandboxTemplate in Rust.
        let name = format!("bad-{i}");
        let body = json!({
            "apiVersion": "agentbox.dev/v1alpha1", "kind": "SandboxTemplate",
            "metadata": {"name": name}, "spec": spec,
        });
        match templates
            .patch(&name, &PatchParams::apply("agentbox-tests"), &Patch::Apply(&body))
            .await
        {
            Err(kube::Error::Api(s)) => {
                assert_eq!(s.code, 422, "{expected}: {s:?}");
                assert!(s.message.contains(expected), "{:?} does not say {expected:?}", s.message);
            }
            other => panic!("template accepted, expected {expected:?}: {other:?}"),
        }
    }
    env.finish().await;
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn the_client_and_the_cli_create_sandboxes_from_templates() {
    use agentbox_api::crd::{Scope, ScopeKind};
    use agentbox_client::client::{ClientError, Sandboxes};
    use std::time::Duration;
    let mut env = TestEnv::new("tpl-client").await;
    env.start_operator(&[]);
    let sbxs = Sandboxes::new(env.client.clone(), env.ns.clone());
    let scope = |user: &str| Scope {
        kind: ScopeKind::User,
        agent: Some("coder".into()),
        user: Some(user.into()),
        session: None,
    };
    match sbxs
        .get_or_create_from_template(&scope("gina"), "nope")
        .await
    {
        Err(ClientError::NotFound(what)) => assert!(what.contains("sandboxtemplate"), "{what}"),
        other => panic!(
            "a missing template must be NotFound: {:?}",
            other.map(|h| h.name().to_string())
        ),
    }
    assert!(
        env.api::<Sandbox>()
            .list(&Default::default())
            .await
            .expect("list")
            .items
            .is_empty(),
        "nothing created for a missing template"
    );
    create_template(&env, "agent", "template")
        .await
        .expect("create template");
    let mut h = sbxs
        .get_or_create_from_template(&scope("gina"), "agent")
        .await
        .expect("get_or_create_from_template");
    h.wait_ready(Duration::from_secs(120)).await.expect("Ready");
    let out = h
        .exec(agentbox_api::exec::ExecRequest::shell(
            "echo \"$FROM_TEMPLATE\"; cat AGENTS.md",
        ))
        .await
        .expect("exec");
    assert_eq!(out.stdout_str(), "yes\ntemplate rules\n");
    assert_eq!(
        sbxs.templates()
            .await
            .expect("templates")
            .iter()
            .map(|t| t.name_any())
            .collect::<Vec<_>>(),
        ["agent"]
    );

    let (code, out, err) = cli(&env, &["templates"]);
    assert_eq!(code, Some(0), "{err}");
    let rows: Vec<Vec<&str>> = out
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows[0], ["NAME", "IMAGE", "EGRESS", "IDLE-TIMEOUT", "AGE"]);
    // The template sets no egress: the operator's default applies.
    assert_eq!(rows[1][..4], ["agent", common::BASE_IMAGE, "default", "-"]);
    let (code, out, err) = cli(
        &env,
        &[
            "create",
            "--template",
            "agent",
            "--agent",
            "coder",
            "--user",
            "hank",
            "--wait",
        ],
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("Ready"), "{out}");
    let (code, _, err) = cli(
        &env,
        &[
            "create",
            "--template",
            "missing",
            "--user",
            "ivy",
            "--agent",
            "coder",
        ],
    );
    assert_eq!(code, Some(1));
    assert!(err.contains("not found: sandboxtemplate"), "{err}");
    env.finish().await;
}
