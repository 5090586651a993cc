//! The chart's harness ServiceAccount against the real cluster, with the Rust client (the
//! Python SDK's twin is python/tests/integration/test_rbac.py): the chart's harness objects for
//! a namespace (`helm template --set harness.namespaces={ns}`) applied, a token of the
//! ServiceAccount, and a client with that token and nothing else. Everything a harness does
//! works in its namespace (create-or-get, wait Ready, exec, files, list, guard, snapshot); in a
//! neighbour namespace each of those is refused, and so is reading the namespace's Secrets.

mod common;

use std::time::Duration;

use agentbox_api::crd::{DeletionPolicy, SandboxSpec, Scope, ScopeKind};
use agentbox_api::exec::ExecRequest;
use agentbox_client::client::Sandboxes;
use common::{TestEnv, kubectl};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, ListParams};

/// Applies the chart's harness objects (ServiceAccount, Role, RoleBinding) for `ns`, as a
/// release with `harness.namespaces={ns}` makes them, and returns a token of the ServiceAccount.
fn harness_token(ns: &str) -> String {
    let objects = common::helm_template(&[
        "--set",
        &format!("harness.namespaces={{{ns}}}"),
        "--show-only",
        "templates/harness.yaml",
    ])
    .expect("helm template");
    assert!(objects.contains("kind: Role\n"), "{objects}");
    let (ok, _, err) = kubectl(&["apply", "-f", "-"], &objects);
    assert!(ok, "{err}");
    let (ok, token, err) = kubectl(
        &[
            "create",
            "token",
            "agentbox-harness",
            "-n",
            ns,
            "--duration=1h",
        ],
        "",
    );
    assert!(ok, "{err}");
    token.trim().to_string()
}

/// A client of the same cluster that authenticates with `token` only (no client certificate).
async fn client_with_token(token: &str) -> kube::Client {
    let mut cfg = kube::Config::infer().await.expect("kubeconfig");
    cfg.auth_info = kube::config::AuthInfo {
        token: Some(token.to_string().into()),
        ..Default::default()
    };
    agentbox_api::kubeclient::client_from_config(cfg).expect("client")
}

/// Whether an error is the API server's refusal (403 Forbidden), however it is wrapped.
fn forbidden(e: &dyn std::fmt::Display) -> bool {
    let s = e.to_string();
    s.contains("403") || s.to_lowercase().contains("forbidden")
}

fn spec() -> SandboxSpec {
    serde_json::from_value(serde_json::json!({
        "image": common::BASE_IMAGE,
        "scope": {"kind": "User", "agent": "harness", "user": "alice"},
    }))
    .expect("spec")
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn the_harness_service_account_does_what_a_harness_does_and_nothing_next_door() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut env = TestEnv::new("harness-rs").await;
    let neighbour = TestEnv::new("neighbour-rs").await;
    let store = format!("/var/lib/agentbox/test-snapshots/{}", env.ns);
    env.start_operator(&["--store-url", &format!("file://{store}")]);
    let client = client_with_token(&harness_token(&env.ns)).await;
    let scope = Scope {
        kind: ScopeKind::User,
        agent: Some("harness".into()),
        user: Some("alice".into()),
        session: None,
    };

    // In its namespace: everything a harness does.
    let sandboxes = Sandboxes::new(client.clone(), &env.ns);
    let mut sbx = sandboxes
        .get_or_create(&scope, spec())
        .await
        .expect("create as the harness");
    let same = sandboxes
        .get_or_create(&scope, spec())
        .await
        .expect("get as the harness (the create conflicts)");
    assert_eq!(same.name(), sbx.name());
    sbx.wait_ready(Duration::from_secs(120))
        .await
        .expect("wait Ready (a watch)");
    let out = sbx
        .exec(ExecRequest::shell("echo hi; exit 3").timeout(Duration::from_secs(30)))
        .await
        .expect("exec");
    assert_eq!(
        (out.status.code(), out.stdout_str().as_str()),
        (Some(3), "hi\n")
    );
    sbx.write_file("notes/todo.txt", "ship it\n")
        .await
        .expect("write a file");
    assert_eq!(
        sbx.read_file("notes/todo.txt").await.expect("read a file"),
        b"ship it\n"
    );
    let listed = sbx.list_dir("notes").await.expect("list a directory");
    assert!(listed.iter().any(|e| e.name == "todo.txt"), "{listed:?}");
    let session = sbx.session();
    let out = session
        .run(ExecRequest::shell("echo from the session"))
        .await
        .expect("a persistent session");
    assert_eq!(out.stdout_str(), "from the session\n");
    session.close().await;
    let all = sandboxes
        .list(Some("agentbox.dev/agent=harness"))
        .await
        .expect("list by scope labels");
    assert_eq!(all.len(), 1);
    assert!(
        sandboxes
            .templates()
            .await
            .expect("list templates")
            .is_empty()
    );
    assert!(sandboxes.pools().await.expect("list pools").is_empty());
    let guard = sbx
        .guard(Some(Duration::from_secs(30)))
        .await
        .expect("take the scope's guard");
    guard.release().await.expect("release the guard");
    let snap = sbx
        .snapshot(Some("harness-snap"), DeletionPolicy::Delete)
        .await
        .expect("create a snapshot");
    let snap = sandboxes
        .wait_snapshot(
            &snap.metadata.name.expect("snapshot name"),
            Duration::from_secs(300),
        )
        .await
        .expect("wait for the snapshot");
    sandboxes
        .get_snapshot(&snap.metadata.name.clone().unwrap_or_default())
        .await
        .expect("read the snapshot");

    // Next door: every one of those refused.
    let next = Sandboxes::new(client.clone(), &neighbour.ns);
    let Err(e) = next.get_or_create(&scope, spec()).await else {
        panic!("a Sandbox in the neighbour namespace: not refused");
    };
    assert!(forbidden(&e), "{e}");
    let Err(e) = next.list(None).await else {
        panic!("listing next door: not refused");
    };
    assert!(forbidden(&e), "{e}");
    let Err(e) = next.pools().await else {
        panic!("listing pools next door: not refused");
    };
    assert!(forbidden(&e), "{e}");
    let Err(e) = next.get_snapshot("harness-snap").await else {
        panic!("a snapshot next door: not refused");
    };
    assert!(forbidden(&e), "{e}");
    let Err(e) = agentbox_api::guard::acquire_scope(
        client.clone(),
        &neighbour.ns,
        &scope,
        &Default::default(),
        Some(Duration::from_secs(5)),
    )
    .await
    else {
        panic!("a guard next door: not refused");
    };
    assert!(forbidden(&e), "{e}");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &neighbour.ns);
    let Err(e) = agentbox_api::exec::run(
        &pods,
        "sbx-anything",
        "sandbox",
        ExecRequest::shell("true").timeout(Duration::from_secs(10)),
    )
    .await
    else {
        panic!("exec next door: not refused");
    };
    assert!(forbidden(&e), "{e}");
    // Nor anything beyond a harness's needs at home, such as the namespace's Secrets.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &env.ns);
    let Err(e) = secrets.list(&ListParams::default()).await else {
        panic!("secrets at home: not refused");
    };
    assert!(forbidden(&e), "{e}");

    common::delete_snapshots(&env).await;
    env.finish().await;
    neighbour.finish().await;
    let _ = std::fs::remove_dir_all(&store);
}
