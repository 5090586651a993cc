//! The local cluster works end to end: a pod from the local base image with a hostPath
//! workspace, exec through the API with real exit codes, and Lease optimistic concurrency.

mod common;

use std::time::Duration;

use agentbox_api::exec::{self, ExecRequest, ExitStatus};
use common::TestEnv;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, PostParams};
use kube::runtime::conditions::is_pod_running;

#[tokio::test]
#[ignore = "needs a cluster"]
async fn pod_with_hostpath_exec_exit_codes_and_lease_conflict() {
    let env = TestEnv::new("cluster").await;
    let host_dir = format!("/var/lib/agentbox-test/{}", env.ns);
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "probe"},
        "spec": {
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "sandbox",
                "image": common::BASE_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", agentbox_operator::controller::pod::KEEP_ALIVE],
                "volumeMounts": [{"name": "ws", "mountPath": "/workspace"}],
                "securityContext": {"allowPrivilegeEscalation": false}
            }],
            "volumes": [{"name": "ws", "hostPath": {"path": host_dir, "type": "DirectoryOrCreate"}}]
        }
    }))
    .unwrap();
    let pods = env.api::<Pod>();
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("create pod");
    env.wait_for::<Pod>("probe", 120, is_pod_running()).await;

    let run = |argv: &[&str]| {
        let req = ExecRequest::argv(argv.iter().copied()).timeout(Duration::from_secs(30));
        exec::run(&pods, "probe", "sandbox", req)
    };
    let out = run(&["sh", "-c", "echo hi > /workspace/f && cat /workspace/f"])
        .await
        .unwrap();
    assert_eq!(out.stdout_str(), "hi\n");
    assert_eq!(out.status, ExitStatus::Code(0));
    assert_eq!(
        run(&["sh", "-c", "exit 3"]).await.unwrap().status,
        ExitStatus::Code(3)
    );
    // A command killed by a signal: the runtime reports 128+N on the status channel.
    let killed = run(&["sh", "-c", "kill -9 $$"]).await.unwrap();
    assert_eq!(killed.status, ExitStatus::Code(137));
    assert_eq!(killed.status.signal(), Some(9));
    let on_host = std::fs::read_to_string(format!("{host_dir}/f")).expect("file on the host");
    assert_eq!(on_host, "hi\n");

    // Leases: an update with a stale resourceVersion is refused with 409 Conflict.
    let leases = env.api::<Lease>();
    let mut lease = Lease::default();
    lease.metadata.name = Some("probe".into());
    lease.spec = Some(LeaseSpec {
        holder_identity: Some("a".into()),
        ..Default::default()
    });
    let created = leases.create(&PostParams::default(), &lease).await.unwrap();
    let mut first = created.clone();
    first.spec.as_mut().unwrap().holder_identity = Some("b".into());
    leases
        .replace("probe", &PostParams::default(), &first)
        .await
        .expect("fresh update");
    let mut stale = created;
    stale.spec.as_mut().unwrap().holder_identity = Some("c".into());
    match leases
        .replace("probe", &PostParams::default(), &stale)
        .await
    {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 409, "{s:?}"),
        other => panic!("stale update was not refused: {other:?}"),
    }
    leases
        .delete("probe", &DeleteParams::default())
        .await
        .unwrap();
    pods.delete("probe", &DeleteParams::default())
        .await
        .unwrap();
    env.wait_gone::<Pod>("probe", 60).await;
    std::fs::remove_dir_all(&host_dir).expect("remove host dir");
    env.finish().await;
}
