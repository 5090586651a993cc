//! Egress probes of the network tests (tests/network.rs, tests/nodes.rs): "outside" servers
//! are listener pods of the test's namespace, and a probe is one bounded fetch (`nc -w 2`)
//! from a sandbox's pod.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::PostParams;
use serde_json::json;

use super::{BASE_IMAGE, TestEnv, matrix_runtime_class};

/// A listener pod serving `ok` on each of `ports` (busybox httpd), under the matrix's runtime
/// class, on `node` when given (tolerating every taint: node 2's test taint); returns its IP
/// once it runs.
pub async fn listener(env: &TestEnv, name: &str, ports: &[u16], node: Option<&str>) -> String {
    let serve: Vec<String> = ports
        .iter()
        .map(|p| format!("httpd -p {p} -h /tmp/w"))
        .collect();
    let script = format!(
        "mkdir -p /tmp/w && echo ok > /tmp/w/index.html && {} && exec sleep 3600",
        serve.join(" && ")
    );
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"test-role": "listener"}},
        "spec": {
            "nodeName": node,
            "tolerations": node.map(|_| json!([{"operator": "Exists"}])),
            "runtimeClassName": matrix_runtime_class(),
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "l", "image": BASE_IMAGE, "imagePullPolicy": "IfNotPresent",
                            "command": ["sh", "-c", script]}]
        }
    }))
    .unwrap();
    env.api::<Pod>()
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    let p = env
        .wait_for::<Pod>(name, 120, |p: Option<&Pod>| {
            p.and_then(|p| p.status.as_ref())
                .is_some_and(|s| s.phase.as_deref() == Some("Running") && s.pod_ip.is_some())
        })
        .await;
    p.status.unwrap().pod_ip.unwrap()
}

/// Whether the sandbox's pod fetches `ok` from `ip:port` (one try, at most 2 s).
pub async fn reaches(env: &TestEnv, sandbox: &str, ip: &str, port: u16) -> bool {
    probe(env, sandbox, ip, port).await.0
}

/// One fetch of `ip:port` from the sandbox's pod: whether it got `ok`, and what the probe
/// printed (for the failure message).
pub async fn probe(env: &TestEnv, sandbox: &str, ip: &str, port: u16) -> (bool, String) {
    let pod = agentbox_api::labels::pod_name(sandbox);
    let out = agentbox_api::exec::run(
        &env.api::<Pod>(),
        &pod,
        "sandbox",
        agentbox_api::exec::ExecRequest::shell(format!(
            "printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 2 {ip} {port}; echo \"nc exit $?\""
        ))
        .timeout(Duration::from_secs(10)),
    )
    .await
    .expect("exec");
    let stdout = out.stdout_str();
    let got = stdout.lines().rev().nth(1).map(str::trim) == Some("ok");
    (got, format!("{stdout}{}", out.stderr_str()))
}

/// Polls until `reaches` is `want` (at most 10 s: an edit applies within seconds, and on a
/// loaded machine one fetch that should succeed can outlast its 2 s).
pub async fn until_reaches(env: &TestEnv, sandbox: &str, ip: &str, port: u16, want: bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (got, said) = probe(env, sandbox, ip, port).await;
        if got == want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{sandbox} -> {ip}:{port}: still {} after 10 s; the last probe said: {said}",
            if want { "unreachable" } else { "reachable" }
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The Sandbox's condition `type_`.
pub fn condition<'a>(
    s: &'a agentbox_api::crd::Sandbox,
    type_: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    s.status
        .as_ref()
        .and_then(|st| st.conditions.iter().find(|c| c.type_ == type_))
}
