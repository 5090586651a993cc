//! A bare sandbox-like pod for the exec and guard tests (no operator needed): the base image,
//! one container named `sandbox`, a keep-alive command, no service-account token; under
//! `AGENTBOX_TEST_RUNTIME_CLASS` (hack/test's gVisor matrix), that RuntimeClass.
#![allow(dead_code)]

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use kube::runtime::conditions::is_pod_running;
use kube::runtime::wait::await_condition;

/// Creates pod `name` in `ns` and waits until it runs.
pub async fn start(client: &kube::Client, ns: &str, name: &str) -> Api<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let mut pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "sandbox",
                "image": "docker.io/library/busybox:1.37",
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", "trap 'exit 0' TERM; mkdir -p /workspace; while :; do sleep 3600 & wait; done"],
            }],
        },
    }))
    .expect("pod json");
    // hack/test's gVisor matrix (AGENTBOX_TEST_RUNTIME_CLASS, as tests/common reads it): the
    // bare pod runs under that RuntimeClass too.
    if let (Some(spec), Ok(rc)) = (
        pod.spec.as_mut(),
        std::env::var("AGENTBOX_TEST_RUNTIME_CLASS"),
    ) && !rc.trim().is_empty()
    {
        spec.runtime_class_name = Some(rc);
    }
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("create pod");
    let running = tokio::time::timeout(
        Duration::from_secs(120),
        await_condition(pods.clone(), name, is_pod_running()),
    )
    .await;
    if !matches!(running, Ok(Ok(_))) {
        let last = pods.get_opt(name).await.ok().flatten();
        panic!(
            "pod {name} not running: {running:?}; last: {:#?}",
            last.and_then(|p| p.status)
        );
    }
    pods
}

/// Percentile (0..=100) of durations, in milliseconds.
pub fn pct(samples: &mut [Duration], p: usize) -> f64 {
    samples.sort();
    if samples.is_empty() {
        return f64::NAN;
    }
    let i = ((samples.len() - 1) * p) / 100;
    samples[i].as_secs_f64() * 1000.0
}
