//! Exposed ports against the real local cluster: `spec.ports` becomes an owned Service that
//! selects only the sandbox's pod, `status.endpoints` says where each port is reached, a server
//! started in the sandbox answers through it, and a sandbox without ports costs no request on
//! Services at all (counted in the API server's audit log).

mod common;

use std::time::Duration;

use agentbox_api::crd::{Sandbox, SandboxPhase};
use agentbox_api::labels;
use common::{TestEnv, create_sandbox, sh};
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::ResourceExt;
use kube::api::{ListParams, Patch, PatchParams};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Condition: Ready, with an endpoint for every port carrying the pod's IP.
fn ready_with_endpoints(s: Option<&Sandbox>) -> bool {
    s.and_then(|s| s.status.as_ref()).is_some_and(|st| {
        st.phase == Some(SandboxPhase::Ready)
            && !st.endpoints.is_empty()
            && st.endpoints.iter().all(|e| e.pod_ip.is_some())
    })
}

/// Requests on Services named `name` in the audit log of the local cluster (it logs writes).
fn service_writes(ns: &str, name: &str) -> Vec<String> {
    let text = common::audit_log_text();
    text.lines()
        .filter(|l| l.contains(ns))
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| {
            let s = |p: &str| v.pointer(p).and_then(|x| x.as_str()).unwrap_or_default();
            s("/stage") == "ResponseComplete"
                && s("/objectRef/resource") == "services"
                && s("/objectRef/namespace") == ns
                && s("/objectRef/name") == name
        })
        .map(|v| {
            v.pointer("/verb")
                .and_then(|x| x.as_str())
                .unwrap_or("")
                .to_string()
        })
        .collect()
}

/// One HTTP/1.0 GET over a port-forward to `port` of `pod` (through the API server on
/// loopback: the test process has no route to the pod network).
async fn http_get(env: &TestEnv, pod: &str, port: u16) -> String {
    let mut pf = env
        .api::<Pod>()
        .portforward(pod, &[port])
        .await
        .expect("port-forward");
    let mut stream = pf.take_stream(port).expect("the forwarded port's stream");
    stream
        .write_all(b"GET / HTTP/1.0\r\nHost: sandbox\r\n\r\n")
        .await
        .expect("send the request");
    let mut body = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut body))
        .await
        .expect("an answer in time")
        .expect("read the answer");
    drop(stream);
    let _ = pf.join().await;
    String::from_utf8_lossy(&body).into_owned()
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn ports_become_an_owned_service_and_a_server_in_the_sandbox_is_reached_through_the_endpoint()
{
    let mut env = TestEnv::new("ports").await;
    env.start_operator(&[]);
    let spec = |ports: serde_json::Value| {
        json!({
            "image": common::BASE_IMAGE,
            "imagePullPolicy": "Never",
            "scope": {"kind": "Agent", "agent": "web"},
            "ports": ports,
        })
    };
    create_sandbox(&env, "web", spec(json!([{"name": "http", "port": 8080}])))
        .await
        .expect("create web");
    create_sandbox(&env, "plain", spec(json!([])))
        .await
        .expect("create plain");

    // Admission: a duplicate name is refused with a message naming it.
    let err = create_sandbox(
        &env,
        "dup",
        spec(json!([{"name": "http", "port": 80}, {"name": "http", "port": 81}])),
    )
    .await
    .expect_err("duplicate port names are refused");
    assert!(
        err.to_string()
            .contains("port names must be unique: http appears more than once"),
        "{err}"
    );

    let web = env
        .wait_for::<Sandbox>("web", 120, ready_with_endpoints)
        .await;
    env.wait_for::<Sandbox>("plain", 120, common::phase_is("Ready"))
        .await;
    let st = web.status.clone().expect("status");
    let ep = &st.endpoints[0];
    let svc_name = agentbox_operator::controller::sandbox::service::service_name("web");
    assert_eq!(
        (ep.name.as_str(), ep.port, ep.protocol.as_str()),
        ("http", 8080, "TCP")
    );
    assert_eq!(ep.host, format!("{svc_name}.{}.svc", env.ns));

    // The Service: owned by the Sandbox, selecting its pod only, with exactly the named port.
    let svc = env
        .api::<Service>()
        .get(&svc_name)
        .await
        .expect("the service");
    let owner = &svc.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("Sandbox", web.uid().unwrap().as_str())
    );
    let sspec = svc.spec.clone().expect("service spec");
    assert_eq!(
        sspec.selector.clone().unwrap_or_default(),
        [(labels::SANDBOX.to_string(), "web".to_string())].into()
    );
    let ports: Vec<(String, i32)> = sspec
        .ports
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|p| (p.name.unwrap_or_default(), p.port))
        .collect();
    assert_eq!(ports, vec![("http".to_string(), 8080)]);
    // The cluster's own endpoint controller agrees: one address, the web pod's.
    let pod_ip = ep.pod_ip.clone().expect("pod ip");
    let mut addresses = Vec::new();
    for _ in 0..100 {
        let slices = env
            .api::<EndpointSlice>()
            .list(&ListParams::default().labels(&format!("kubernetes.io/service-name={svc_name}")))
            .await
            .expect("endpoint slices");
        addresses = slices
            .items
            .iter()
            .flat_map(|s| s.endpoints.iter().flat_map(|e| e.addresses.clone()))
            .collect();
        if !addresses.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(addresses, vec![pod_ip.clone()]);
    // No Service for the sandbox without ports, and no request about one.
    assert!(
        env.api::<Service>()
            .get_opt(&agentbox_operator::controller::sandbox::service::service_name("plain"))
            .await
            .expect("get")
            .is_none()
    );
    let plain = env.api::<Sandbox>().get("plain").await.expect("plain");
    assert!(plain.status.expect("status").endpoints.is_empty());

    // A server in the sandbox, reached through the recorded endpoint's port.
    let pod = st.pod_name.clone().expect("pod name");
    let (code, out) = sh(
        &env,
        &pod,
        "mkdir -p /tmp/www && echo hello-from-the-sandbox > /tmp/www/index.html && httpd -p 8080 -h /tmp/www && echo started",
    )
    .await;
    assert_eq!((code, out.trim()), (Some(0), "started"));
    let answer = http_get(&env, &pod, u16::try_from(ep.port).expect("port")).await;
    assert!(answer.contains("200 OK"), "{answer}");
    assert!(answer.contains("hello-from-the-sandbox"), "{answer}");

    // Ports removed: the Service goes, and so do the endpoints.
    env.api::<Sandbox>()
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"ports": null}})),
        )
        .await
        .expect("remove the ports");
    env.wait_for::<Sandbox>("web", 60, |s: Option<&Sandbox>| {
        s.and_then(|s| s.status.as_ref())
            .is_some_and(|st| st.endpoints.is_empty() && st.phase == Some(SandboxPhase::Ready))
    })
    .await;
    env.wait_gone::<Service>(&svc_name, 30).await;

    // Writes: the ported sandbox's Service was applied once and deleted once; the sandbox
    // without ports caused no request on Services at all.
    assert_eq!(
        service_writes(&env.ns, &svc_name),
        vec!["patch".to_string(), "delete".to_string()]
    );
    assert!(
        service_writes(
            &env.ns,
            &agentbox_operator::controller::sandbox::service::service_name("plain")
        )
        .is_empty()
    );

    // Ports again, then the Sandbox is deleted: its Service goes with it (owner reference).
    env.api::<Sandbox>()
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"ports": [{"name": "http", "port": 8080}]}})),
        )
        .await
        .expect("ports again");
    env.wait_for::<Sandbox>("web", 60, ready_with_endpoints)
        .await;
    env.wait_for::<Service>(&svc_name, 30, |s: Option<&Service>| s.is_some())
        .await;
    env.api::<Sandbox>()
        .delete("web", &Default::default())
        .await
        .expect("delete web");
    env.wait_gone::<Sandbox>("web", 120).await;
    env.wait_gone::<Service>(&svc_name, 60).await;
    env.finish().await;
}
