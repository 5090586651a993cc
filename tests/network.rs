//! Egress against a real NetworkPolicy engine (hack/cluster's kube-router): `None` (the
//! default) reaches nothing, an allowlist reaches its blocks and ports and nothing next to
//! them, an edit of a running sandbox's policy applies within seconds both ways, and the
//! operator's `NetworkEnforced` condition says the policy is proven in force. The "outside"
//! servers are pods of the test's own namespace; probes are bounded (`nc -w 2`).
//! Under hack/test's gVisor matrix every pod here runs under gVisor.

mod common;

use common::net::{condition, listener, reaches, until_reaches};
use common::{TestEnv, create_sandbox, matrix_runtime_class, phase_is};
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

use agentbox_api::crd::Sandbox;

#[tokio::test]
#[ignore = "needs a cluster"]
async fn egress_none_reaches_nothing_an_allowlist_only_its_block_and_port_and_edits_apply_live() {
    let mut env = TestEnv::new("net").await;
    env.start_operator(&[]);
    let (l1, l2) = tokio::join!(
        listener(&env, "outside-1", &[8080, 8081], None),
        listener(&env, "outside-2", &[8080], None)
    );
    let base = |network: serde_json::Value| {
        let mut s = json!({"image": common::BASE_IMAGE, "scope": {"kind": "Global"}});
        if !network.is_null() {
            s["network"] = network;
        }
        s
    };
    // This build's CRDs again: a test process of an older build on the same cluster may have
    // applied CRDs without the allowlist since this one started.
    common::ensure_crds(&env.client).await;
    // The control: a sandbox with egress All reaches both listeners, on both ports, so what
    // the others do not reach is the policy's doing.
    create_sandbox(&env, "open", base(json!({"egress": "All"})))
        .await
        .unwrap();
    // No network: the cluster's default, None.
    create_sandbox(&env, "closed", base(serde_json::Value::Null))
        .await
        .unwrap();
    let allow = json!({"egress": "Allowlist", "allow": [{"cidr": format!("{l1}/32"), "ports": [{"port": 8080}]}]});
    create_sandbox(&env, "listed", base(allow)).await.unwrap();
    // A cold pod's own code runs only once its own rules are in force: this one's command
    // tries the listener from its first moment, 40 times, and writes down what it reached.
    let early = format!(
        "i=0; while [ $i -lt 40 ]; do \
           if printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 1 {l1} 8080 | grep -q ok; then \
             echo \"reached on try $i\" >> /tmp/early; fi; \
           i=$((i+1)); sleep 0.05; done; echo $i > /tmp/early-done; {}",
        agentbox_api::remote::KEEP_ALIVE
    );
    let mut early_spec = base(serde_json::Value::Null);
    early_spec["command"] = json!(["sh", "-c", early]);
    create_sandbox(&env, "early", early_spec).await.unwrap();
    let mut ready = Vec::new();
    for name in ["open", "closed", "listed", "early"] {
        ready.push(env.wait_for::<Sandbox>(name, 180, phase_is("Ready")).await);
    }
    // Proven, not assumed: the operator's check ran on the node.
    for s in &ready[1..] {
        let c = condition(s, "NetworkEnforced")
            .expect("NetworkEnforced on a sandbox that relies on a policy");
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", "Proven"),
            "{c:?}"
        );
    }
    assert!(
        condition(&ready[0], "NetworkEnforced").is_none(),
        "egress All relies on nothing"
    );

    // The control reaches both listeners, on both ports. What should be reached is polled:
    // one fetch can outlast its 2 s on a loaded machine (CI once saw it).
    until_reaches(&env, "open", &l1, 8080, true).await;
    until_reaches(&env, "open", &l1, 8081, true).await;
    until_reaches(&env, "open", &l2, 8080, true).await;

    // Ready, a cold sandbox is under its own rules already (its pod started only once they
    // were in force), so the first try is refused; and its command, run from the pod's
    // first moment, reached nothing.
    let early_pod = agentbox_api::labels::pod_name("early");
    let mut said = String::new();
    for _ in 0..60 {
        said = common::sh(
            &env,
            &early_pod,
            "cat /tmp/early-done /tmp/early 2>/dev/null",
        )
        .await
        .1;
        if !said.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    assert_eq!(said.trim(), "40", "the early command's tries: {said}");
    for (sandbox, port) in [("closed", 8080), ("listed", 8081), ("early", 8080)] {
        let (got, said) = common::net::probe(&env, sandbox, &l1, port).await;
        assert!(!got, "{sandbox} reached {l1}:{port} at Ready: {said}");
    }
    // None: no pod, and not the API server's address (the `kubernetes` Service; on this
    // cluster pods have no route to it at all, so this part only shows nothing opened it).
    for (ip, port) in [
        (l1.as_str(), 8080),
        (l1.as_str(), 8081),
        (l2.as_str(), 8080),
    ] {
        assert!(
            !reaches(&env, "closed", ip, port).await,
            "None reached {ip}:{port}"
        );
    }
    let kubernetes: Service = kube::Api::namespaced(env.client.clone(), "default")
        .get("kubernetes")
        .await
        .unwrap();
    let api_ip = kubernetes.spec.unwrap().cluster_ip.unwrap();
    assert!(
        !reaches(&env, "closed", &api_ip, 443).await,
        "None reached the API server"
    );

    // The allowlist: its block and port, not the other port, not the other address.
    until_reaches(&env, "listed", &l1, 8080, true).await;
    assert!(
        !reaches(&env, "listed", &l1, 8081).await,
        "another port of the allowlisted block"
    );
    assert!(!reaches(&env, "listed", &l2, 8080).await, "another address");

    // Edits of the running sandbox apply without a restart, both ways.
    let pods = env.api::<Pod>();
    let pod_name = agentbox_api::labels::pod_name("listed");
    let before = pods.get(&pod_name).await.unwrap().metadata.uid;
    let sandboxes = env.api::<Sandbox>();
    let widen = json!({"spec": {"network": {"egress": "Allowlist", "allow": [
        {"cidr": format!("{l1}/32"), "ports": [{"port": 8080}]},
        {"cidr": format!("{l2}/32"), "ports": [{"port": 8080}]}
    ]}}});
    common::ensure_crds(&env.client).await;
    sandboxes
        .patch("listed", &PatchParams::default(), &Patch::Merge(&widen))
        .await
        .unwrap();
    until_reaches(&env, "listed", &l2, 8080, true).await;
    let close = json!({"spec": {"network": {"egress": "None", "allow": null}}});
    sandboxes
        .patch("listed", &PatchParams::default(), &Patch::Merge(&close))
        .await
        .unwrap();
    until_reaches(&env, "listed", &l1, 8080, false).await;
    until_reaches(&env, "listed", &l2, 8080, false).await;
    let after = sandboxes.get("listed").await.unwrap();
    assert_eq!(
        pods.get(&pod_name).await.unwrap().metadata.uid,
        before,
        "the same pod: no restart"
    );
    assert_eq!(
        after.status.as_ref().and_then(|s| s.phase),
        Some(agentbox_api::crd::SandboxPhase::Ready)
    );
    env.finish().await;
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn bad_allowlists_are_refused_at_admission_with_what_is_wrong() {
    let env = TestEnv::new("net-admit").await;
    common::ensure_crds(&env.client).await;
    for (network, says) in [
        (
            json!({"egress": "Allowlist", "allow": [{"cidr": "10.0.0.300/8"}]}),
            "cidr must be an address block in CIDR notation",
        ),
        (
            json!({"egress": "Allowlist", "allow": [{"cidr": "10.0.0.0/8", "ports": [{"port": 70000}]}]}),
            "65535",
        ),
        (
            json!({"egress": "Allowlist", "allow": [{"cidr": "10.0.0.0/8", "ports": [{"port": 0}]}]}),
            "should be greater than or equal to 1",
        ),
        (
            json!({"egress": "Allowlist"}),
            "egress: Allowlist needs at least one network.allow entry",
        ),
        (
            json!({"egress": "None", "allow": [{"cidr": "10.0.0.0/8"}]}),
            "network.allow applies only with egress: Allowlist",
        ),
    ] {
        let spec =
            json!({"image": common::BASE_IMAGE, "scope": {"kind": "Global"}, "network": network});
        let err = create_sandbox(&env, "bad", spec)
            .await
            .expect_err("refused");
        let msg = err.to_string();
        assert!(msg.contains(says), "{network}: {msg}");
    }
    env.finish().await;
}

/// A pod a tenant plants in the namespace: `name`, on `node`, one container `check` (the
/// name the operator's probes exec into) running `script`.
async fn plant(env: &TestEnv, name: &str, node: &str, script: &str) -> String {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "check", "image": common::BASE_IMAGE,
                            "imagePullPolicy": "IfNotPresent", "command": ["sh", "-c", script]}]
        }
    }))
    .unwrap();
    let made = env
        .api::<Pod>()
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    env.wait_for::<Pod>(name, 120, |p: Option<&Pod>| {
        p.and_then(|p| p.status.as_ref())
            .is_some_and(|s| s.phase.as_deref() == Some("Running") && s.pod_ip.is_some())
    })
    .await;
    made.metadata.uid.unwrap()
}

/// The enforcement check's verdict cannot be forged by a tenant of the namespace it runs in.
/// Before, the check reused pods by a name derived from the node (and runtime class), so a
/// tenant could plant a "listener" that serves nothing and a "canary" that serves `ok` under
/// those names and have any node "Proven". Here the namespace is set up so that the honest
/// verdict is "not enforced" (a tenant's policy admits all egress of pods labelled as the
/// check's canaries, so the canary is not confined), and the planted pods wait under the old
/// names: the sandbox must not become Ready (NetworkPolicyNotEnforced), the planted pods are
/// neither used nor deleted, and once the tenant's policy goes the check proves the node.
#[tokio::test]
#[ignore = "needs a cluster"]
async fn a_tenants_planted_check_pods_cannot_forge_proven() {
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    use sha2::{Digest, Sha256};
    let mut env = TestEnv::new("net-forge").await;
    common::ensure_crds(&env.client).await;
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(env.client.clone());
    let node = nodes.list(&Default::default()).await.unwrap().items[0]
        .metadata
        .name
        .clone()
        .unwrap();
    // The names the check used before: agentbox-netcheck-<sha256(node \0 runtime class)>-*.
    let mut h = Sha256::new();
    h.update(node.as_bytes());
    h.update([0]);
    h.update(matrix_runtime_class().unwrap_or_default().as_bytes());
    let sfx: String = h.finalize()[..5]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let (lname, cname) = (
        format!("agentbox-netcheck-{sfx}-listener"),
        format!("agentbox-netcheck-{sfx}-canary"),
    );
    let allow: NetworkPolicy = serde_json::from_value(json!({
        "metadata": {"name": "tenant-allows-canaries"},
        "spec": {"podSelector": {"matchLabels": {"agentbox.dev/netcheck": "canary"}},
                 "policyTypes": ["Egress"], "egress": [{}]}
    }))
    .unwrap();
    let policies = env.api::<NetworkPolicy>();
    policies
        .create(&PostParams::default(), &allow)
        .await
        .unwrap();
    let (luid, cuid) = tokio::join!(
        plant(&env, &lname, &node, "exec sleep 3600"),
        plant(
            &env,
            &cname,
            &node,
            "mkdir -p /tmp/w && echo ok > /tmp/w/index.html && exec httpd -f -p 8080 -h /tmp/w"
        )
    );
    env.start_operator(&[]);
    create_sandbox(
        &env,
        "s",
        json!({"image": common::BASE_IMAGE, "scope": {"kind": "Global"},
               "nodeSelector": {"kubernetes.io/hostname": node}, "network": {"egress": "None"}}),
    )
    .await
    .unwrap();
    // The first verdict, whichever it is.
    let s = env
        .wait_for::<Sandbox>("s", 180, |s: Option<&Sandbox>| {
            s.and_then(|s| condition(s, "NetworkEnforced"))
                .is_some_and(|c| c.reason != "NetworkCheckPending")
        })
        .await;
    let c = condition(&s, "NetworkEnforced").unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "NetworkPolicyNotEnforced"),
        "the operator's verdict came from the tenant's planted pods: {c:?}"
    );
    assert_ne!(
        s.status.as_ref().and_then(|st| st.phase),
        Some(agentbox_api::crd::SandboxPhase::Ready)
    );
    // Its pod waits for its own rules (it never runs on a node not proven), and its Ready
    // condition names the cause, which every client's wait reports.
    let ready = condition(&s, "Ready").unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "NetworkPolicyNotEnforced"),
        "{ready:?}"
    );
    // The planted pods were neither used nor deleted: the same pods are there.
    let pods = env.api::<Pod>();
    for (name, uid) in [(&lname, &luid), (&cname, &cuid)] {
        assert_eq!(
            pods.get(name).await.unwrap().metadata.uid.as_ref(),
            Some(uid),
            "{name}"
        );
    }
    // The tenant's policy gone, the next check (a failed verdict is retried within seconds)
    // proves the node, and the sandbox becomes Ready.
    policies
        .delete("tenant-allows-canaries", &Default::default())
        .await
        .unwrap();
    let s = env.wait_for::<Sandbox>("s", 180, phase_is("Ready")).await;
    let c = condition(&s, "NetworkEnforced").unwrap();
    assert_eq!((c.status.as_str(), c.reason.as_str()), ("True", "Proven"));
    env.finish().await;
}
