//! Credentials added at the egress hop (issue 46), against the real cluster: a TLS server pod
//! of the test's namespace (proxy/examples/cred_server.rs, built static and copied into a
//! busybox pod, with a certificate of a CA made here) records the request heads it gets; the
//! proxy pod (AGENTBOX_PROXY_IMAGE, else hack/proxy-image --dev) trusts that CA by
//! `--upstream-ca`; the operator reads the Secret and writes the value into the proxy's table.
//! The sandbox sends `GET http://api.cred.test/` with a header of its own through the proxy
//! its environment names; the server gets the Secret's value instead; then the value is looked
//! for, and found nowhere: the sandbox pod's environments, command lines and files, the
//! Sandbox, the namespace's Events, the operator's and the proxy's logs, and the API server's
//! audit log. A Sandbox naming the key for a domain its Secret does not allow gets no pod (a
//! condition and a Warning Event naming the cause), and recovers when the Secret's owner
//! allows the domain. A Running sandbox edited to a key its Secret lacks keeps its pod and its
//! other entries, and says the refusal on its `Credentials` condition and in one Warning
//! Event; edited back, the condition turns True.

mod common;

use std::time::Duration;

use common::{TestEnv, create_sandbox, matrix_runtime_class, phase_is};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::api::{ListParams, LogParams, Patch, PatchParams, PostParams};
use serde_json::json;

use agentbox_api::crd::Sandbox;
use agentbox_api::exec::{ExecRequest, run, run_unwrapped_stdin};

const TARGET: &str = "x86_64-unknown-linux-gnu";

/// The static TLS server binary: AGENTBOX_CRED_SERVER_BIN (hack/test builds it before its
/// lanes), else built here.
fn server_bin() -> Vec<u8> {
    if let Some(p) = std::env::var("AGENTBOX_CRED_SERVER_BIN")
        .ok()
        .filter(|s| !s.is_empty())
    {
        return std::fs::read(&p).unwrap_or_else(|e| panic!("{p}: {e}"));
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let target_dir = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| {
        format!(
            "{}/.cache/agentbox/target",
            std::env::var("HOME").unwrap_or_else(|_| "/root".into())
        )
    });
    let mut cmd = std::process::Command::new(std::env::var("CARGO").unwrap_or("cargo".into()));
    cmd.args([
        "build",
        "--locked",
        "-p",
        "agentbox-proxy",
        "--example",
        "cred_server",
        "--target",
        TARGET,
    ])
    .env("RUSTFLAGS", "-C target-feature=+crt-static")
    .env("CARGO_TARGET_DIR", &target_dir)
    .current_dir(root);
    for (k, _) in std::env::vars() {
        if k.starts_with("CARGO_PKG_")
            || k.starts_with("CARGO_MANIFEST_")
            || k == "CARGO_CRATE_NAME"
        {
            cmd.env_remove(k);
        }
    }
    let st = cmd.status().expect("cargo runs");
    assert!(st.success(), "building cred_server failed");
    std::fs::read(format!("{target_dir}/{TARGET}/debug/examples/cred_server")).unwrap()
}

/// A CA (PEM) and a server certificate and key (PEM) for `name`, signed by it.
fn pki(name: &str) -> (String, String, String) {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let issuer = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec![name.to_string()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    (issuer.pem(), cert.pem(), key.serialize_pem())
}

async fn running_ip(env: &TestEnv, name: &str) -> String {
    let p = env
        .wait_for::<Pod>(name, 180, |p: Option<&Pod>| {
            p.and_then(|p| p.status.as_ref())
                .is_some_and(|s| s.phase.as_deref() == Some("Running") && s.pod_ip.is_some())
        })
        .await;
    p.status.unwrap().pod_ip.unwrap()
}

/// Writes `data` to `path` in container `c` of pod `pod` (a shell's `cat`, stdin).
async fn put(env: &TestEnv, pod: &str, c: &str, path: &str, data: Vec<u8>, mode: &str) {
    let r = run(
        &env.api::<Pod>(),
        pod,
        c,
        ExecRequest::shell(format!(
            "cat > {path}.part && chmod {mode} {path}.part && mv {path}.part {path}"
        ))
        .stdin(data),
    )
    .await
    .expect("exec");
    assert!(r.success(), "{path}: {}", r.stderr_str());
}

/// Runs `script` in the sandbox's container: stdout and stderr.
async fn sh(env: &TestEnv, sandbox: &str, script: &str) -> String {
    let out = run(
        &env.api::<Pod>(),
        &agentbox_api::labels::pod_name(sandbox),
        "sandbox",
        ExecRequest::shell(script.to_string()).timeout(Duration::from_secs(30)),
    )
    .await
    .expect("exec");
    format!("{}{}", out.stdout_str(), out.stderr_str())
}

/// The files of the sandbox pod (under `paths`, and its processes' environments and command
/// lines) that hold `needle`. The needle travels on stdin (`grep -f /dev/stdin`), so it is in
/// no command line and no file of the pod while it is looked for. (A basic regular expression,
/// not `-F`: busybox's `grep -F` misses a match in a file without line breaks, such as
/// /proc/N/environ; the needles here have no character special to it.)
async fn holders(env: &TestEnv, sandbox: &str, needle: &str) -> String {
    let script = "grep -rls -f /dev/stdin /workspace /etc /tmp /var/run /proc/[0-9]*/environ /proc/[0-9]*/cmdline; echo \"grep exit $?\"";
    let r = run_unwrapped_stdin(
        &env.api::<Pod>(),
        &agentbox_api::labels::pod_name(sandbox),
        "sandbox",
        vec!["sh".into(), "-c".into(), script.into()],
        bytes::Bytes::from(format!("{needle}\n")),
    )
    .await
    .expect("exec");
    r.stdout_str().to_string()
}

async fn condition_reason(env: &TestEnv, name: &str) -> Option<(String, String)> {
    let s = env.api::<Sandbox>().get(name).await.ok()?;
    let c = s
        .status?
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Ready")?;
    Some((c.reason, c.message))
}

/// The sandbox's `Credentials` condition: status, reason, message.
async fn credentials_condition(env: &TestEnv, name: &str) -> Option<(String, String, String)> {
    let s = env.api::<Sandbox>().get(name).await.ok()?;
    let c = s
        .status?
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Credentials")?;
    Some((c.status, c.reason, c.message))
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn a_credential_arrives_at_the_server_and_is_found_nowhere_else() {
    let image = common::proxy_image();
    let bin = server_bin();
    let mut env = TestEnv::new("credential").await;
    let keeper_client = env.client.clone();
    let keeper = tokio::spawn(async move {
        loop {
            common::ensure_crds(&keeper_client).await;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
    // A fresh value each run; also looked for base64-encoded (a Secret's data form).
    let key = format!(
        "Bearer sk-cred46-{:016x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
            ^ u64::from(std::process::id())
    );
    // (A ByteString serialises as base64.)
    let key_b64 = serde_json::to_value(k8s_openapi::ByteString(key.clone().into_bytes()))
        .unwrap()
        .as_str()
        .unwrap()
        .to_string();
    let (ca, cert, tls_key) = pki("api.cred.test");

    // The TLS server: busybox waiting for its binary, then serving on 443.
    let server: Pod = serde_json::from_value(json!({
        "metadata": {"name": "tls-server", "labels": {"test-role": "outside"}},
        "spec": {
            "runtimeClassName": matrix_runtime_class(),
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "s", "image": common::BASE_IMAGE, "imagePullPolicy": "IfNotPresent",
                            "command": ["sh", "-c", "while [ ! -x /tmp/srv ]; do sleep 0.2; done; exec /tmp/srv /tmp/cert.pem /tmp/key.pem 443 /tmp/heads"]}]
        }
    }))
    .unwrap();
    env.api::<Pod>()
        .create(&PostParams::default(), &server)
        .await
        .unwrap();
    let server_ip = running_ip(&env, "tls-server").await;
    put(
        &env,
        "tls-server",
        "s",
        "/tmp/cert.pem",
        cert.into_bytes(),
        "644",
    )
    .await;
    put(
        &env,
        "tls-server",
        "s",
        "/tmp/key.pem",
        tls_key.into_bytes(),
        "600",
    )
    .await;
    put(&env, "tls-server", "s", "/tmp/srv", bin, "755").await;

    // The proxy trusts the test's CA (a ConfigMap: a CA certificate is public).
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "proxy-ca"}, "data": {"ca.pem": ca}
    }))
    .unwrap();
    env.api::<ConfigMap>()
        .create(&PostParams::default(), &cm)
        .await
        .unwrap();
    let mut args = vec!["--upstream-ca".to_string(), "/etc/proxy-ca/ca.pem".into()];
    for n in ["api.cred.test", "other.cred.test"] {
        args.extend(["--static-host".to_string(), format!("{n}={server_ip}")]);
    }
    args.extend(["--permit-cidr".to_string(), format!("{server_ip}/32")]);
    let proxy_pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "agentbox-proxy", "labels": {"app.kubernetes.io/name": "agentbox-proxy"}},
        "spec": {
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 1,
            "securityContext": {"runAsUser": 65532, "runAsGroup": 65532, "runAsNonRoot": true},
            "containers": [{"name": "proxy", "image": image, "imagePullPolicy": "IfNotPresent",
                            "args": args,
                            "securityContext": {"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
                                                "capabilities": {"drop": ["ALL"]}},
                            "volumeMounts": [{"name": "table", "mountPath": "/run/agentbox-proxy"},
                                             {"name": "ca", "mountPath": "/etc/proxy-ca"}]}],
            "volumes": [{"name": "table", "emptyDir": {"medium": "Memory"}},
                        {"name": "ca", "configMap": {"name": "proxy-ca"}}]
        }
    }))
    .unwrap();
    env.api::<Pod>()
        .create(&PostParams::default(), &proxy_pod)
        .await
        .unwrap();
    let proxy_ip = running_ip(&env, "agentbox-proxy").await;
    let url = format!("http://{proxy_ip}:3128");
    let ns = env.ns.clone();
    env.start_operator(&["--egress-proxy-url", &url, "--egress-proxy-namespace", &ns]);

    // The Secret, whose owner allows api.cred.test only.
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "model-key", "annotations": {"agentbox.dev/credential-domains": "api.cred.test"}},
        "stringData": {"token": key}
    }))
    .unwrap();
    env.api::<Secret>()
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();

    let spec = |domain: &str| {
        json!({"image": common::BASE_IMAGE, "scope": {"kind": "Global"},
        "network": {"egress": "Allowlist", "allow": [
            {"domain": domain, "ports": [{"port": 443}],
             "credential": {"secretName": "model-key", "key": "token"}}
        ]}})
    };
    create_sandbox(&env, "cred", spec("api.cred.test"))
        .await
        .expect("create cred");
    create_sandbox(&env, "elsewhere", spec("other.cred.test"))
        .await
        .expect("create elsewhere");
    env.wait_for::<Sandbox>("cred", 180, phase_is("Ready"))
        .await;

    // Through the proxy, plain HTTP with a header of the sandbox's own: the server gets the
    // Secret's value in its place (polled: the proxy's table follows the new pod).
    let pods = env.api::<Pod>();
    let mut last = String::new();
    for _ in 0..120 {
        last = sh(
            &env,
            "cred",
            "p=${http_proxy#http://}; p=${p%/}; \
             printf 'GET http://api.cred.test/v1/models HTTP/1.1\\r\\nHost: api.cred.test\\r\\nAuthorization: Bearer sandbox-own\\r\\nConnection: close\\r\\n\\r\\n' \
             | nc -w 5 ${p%:*} ${p##*:}",
        )
        .await;
        if last.contains("cred-server-ok") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(last.contains("cred-server-ok"), "through the proxy: {last}");
    assert!(!last.contains(&key), "the response holds the key: {last}");
    // What the server got (its file of request heads, read by exec).
    let server_log = {
        let r = run(
            &pods,
            "tls-server",
            "s",
            ExecRequest::shell("cat /tmp/heads".to_string()),
        )
        .await
        .expect("exec");
        r.stdout_str().to_string()
    };
    assert!(
        server_log.contains(&format!("got: Authorization: {key}")),
        "the server did not get the credential: {server_log}"
    );
    assert!(
        !server_log.contains("sandbox-own"),
        "the sandbox's own header went through: {server_log}"
    );
    // A CONNECT to the credentialed name is refused.
    let out = sh(
        &env,
        "cred",
        &format!(
            "printf 'CONNECT api.cred.test:443 HTTP/1.1\\r\\nHost: api.cred.test:443\\r\\n\\r\\n' | nc -w 4 {proxy_ip} 3128"
        ),
    )
    .await;
    assert!(
        out.contains("403") && out.contains("plain http://"),
        "{out}"
    );

    // The Sandbox naming the key for other.cred.test: no pod, a condition and an Event.
    let mut refused = None;
    for _ in 0..120 {
        refused = condition_reason(&env, "elsewhere").await;
        if refused
            .as_ref()
            .is_some_and(|(r, _)| r == "CredentialRefused")
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (reason, message) = refused.expect("a Ready condition");
    assert_eq!(reason, "CredentialRefused", "{message}");
    assert!(
        message.contains("model-key") && message.contains("other.cred.test"),
        "{message}"
    );
    let evs = common::events(&env, "elsewhere", "CredentialRefused").await;
    assert!(!evs.is_empty(), "no CredentialRefused Event");
    assert!(
        pods.get_opt(&agentbox_api::labels::pod_name("elsewhere"))
            .await
            .unwrap()
            .is_none(),
        "a pod runs with the refused entry"
    );

    // Found nowhere: the sandbox pod (environments, command lines, files), the Sandbox, the
    // Events, the operator's and the proxy's logs, the audit log. First the search's own
    // check: it finds what is there.
    let control = holders(&env, "cred", "HTTP_PROXY=").await;
    assert!(
        control.contains("/environ"),
        "the search finds nothing at all: {control}"
    );
    for needle in [key.as_str(), key_b64.as_str()] {
        let found = holders(&env, "cred", needle).await;
        assert!(
            found.lines().all(|l| l.starts_with("grep exit")),
            "the sandbox pod holds the value: {found}"
        );
    }
    let mut places: Vec<(&str, String)> = Vec::new();
    for s in ["cred", "elsewhere"] {
        let obj = env.api::<Sandbox>().get(s).await.unwrap();
        places.push(("a Sandbox", serde_json::to_string(&obj).unwrap()));
        let p = pods
            .get_opt(&agentbox_api::labels::pod_name(s))
            .await
            .unwrap();
        places.push(("a sandbox pod's spec", serde_json::to_string(&p).unwrap()));
    }
    let events = env
        .api::<k8s_openapi::api::events::v1::Event>()
        .list(&ListParams::default())
        .await
        .unwrap();
    places.push(("the Events", serde_json::to_string(&events).unwrap()));
    places.push(("the operator's log", env.operator_logs()));
    places.push((
        "the proxy's log",
        pods.logs("agentbox-proxy", &LogParams::default())
            .await
            .unwrap(),
    ));
    places.push(("the audit log", common::audit_log_text()));
    for (what, text) in &places {
        assert!(!text.contains(&key), "{what} holds the value");
        assert!(!text.contains(&key_b64), "{what} holds the value (base64)");
    }

    // The Secret's owner allows other.cred.test: the refused Sandbox recovers as it is.
    let patch = json!({"metadata": {"annotations": {"agentbox.dev/credential-domains": "api.cred.test,other.cred.test"}}});
    env.api::<Secret>()
        .patch("model-key", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    env.wait_for::<Sandbox>("elsewhere", 120, phase_is("Ready"))
        .await;

    // A Running sandbox edited to a credential its Secret refuses (a key it does not have),
    // beside a plain domain entry: the condition `Credentials` False and one Warning Event
    // naming the Secret, key and domain; the pod stays (same UID) and the plain entry still
    // works through the proxy.
    let uid_before = pods
        .get(&agentbox_api::labels::pod_name("cred"))
        .await
        .unwrap()
        .metadata
        .uid;
    let edit = |key: &str| {
        json!({"spec": {"network": {"egress": "Allowlist", "allow": [
            {"domain": "api.cred.test", "ports": [{"port": 443}],
             "credential": {"secretName": "model-key", "key": key}},
            {"domain": "other.cred.test", "ports": [{"port": 443}]}
        ]}}})
    };
    env.api::<Sandbox>()
        .patch(
            "cred",
            &PatchParams::default(),
            &Patch::Merge(&edit("no-such-key")),
        )
        .await
        .unwrap();
    let mut cond = None;
    for _ in 0..120 {
        cond = credentials_condition(&env, "cred").await;
        if cond.as_ref().is_some_and(|(s, _, _)| s == "False") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (status, reason, message) = cond.expect("a Credentials condition");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "CredentialRefused"),
        "{message}"
    );
    for part in ["model-key", "no-such-key", "api.cred.test"] {
        assert!(message.contains(part), "{part} not in {message}");
    }
    let evs = common::events(&env, "cred", "CredentialRefused").await;
    assert_eq!(evs.len(), 1, "one Warning Event for the change: {evs:?}");
    assert_eq!(evs[0].type_.as_deref(), Some("Warning"));
    let count = |e: &k8s_openapi::api::events::v1::Event| e.series.as_ref().map_or(1, |s| s.count);
    assert_eq!(count(&evs[0]), 1, "{evs:?}");
    // Through the proxy to the plain entry (polled: the table follows the edit).
    let mut last = String::new();
    for _ in 0..60 {
        last = sh(
            &env,
            "cred",
            "p=${http_proxy#http://}; p=${p%/}; \
             printf 'CONNECT other.cred.test:443 HTTP/1.1\\r\\nHost: other.cred.test:443\\r\\n\\r\\n' \
             | nc -w 3 ${p%:*} ${p##*:}",
        )
        .await;
        if last.contains(" 200") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        last.contains(" 200"),
        "the plain entry through the proxy: {last}"
    );
    // Several feeder ticks later: still one Event, still False, the same pod, and no write
    // to the Sandbox meanwhile (the condition is written when it changes, not per tick).
    let rv_before = env
        .api::<Sandbox>()
        .get("cred")
        .await
        .unwrap()
        .metadata
        .resource_version;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let evs = common::events_now(&env, "cred", "CredentialRefused").await;
    assert_eq!(
        (evs.len(), evs.first().map(count)),
        (1, Some(1)),
        "one Event per change, not per tick: {evs:?}"
    );
    let sbx = env.api::<Sandbox>().get("cred").await.unwrap();
    assert_eq!(
        sbx.metadata.resource_version, rv_before,
        "the Sandbox was written at rest"
    );
    assert_eq!(
        sbx.status.as_ref().and_then(|s| s.phase),
        Some(agentbox_api::crd::SandboxPhase::Ready),
        "the sandbox keeps running"
    );
    let uid_after = pods
        .get(&agentbox_api::labels::pod_name("cred"))
        .await
        .unwrap()
        .metadata
        .uid;
    assert_eq!(uid_before, uid_after, "the pod was replaced");

    // Fixed: the condition turns True (a Normal Event says so), the pod still the same.
    env.api::<Sandbox>()
        .patch(
            "cred",
            &PatchParams::default(),
            &Patch::Merge(&edit("token")),
        )
        .await
        .unwrap();
    let mut cond = None;
    for _ in 0..120 {
        cond = credentials_condition(&env, "cred").await;
        if cond.as_ref().is_some_and(|(s, _, _)| s == "True") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (status, reason, message) = cond.expect("a Credentials condition");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "CredentialsAllowed"),
        "{message}"
    );
    assert!(
        !common::events(&env, "cred", "CredentialsAllowed")
            .await
            .is_empty()
    );
    let uid_fixed = pods
        .get(&agentbox_api::labels::pod_name("cred"))
        .await
        .unwrap()
        .metadata
        .uid;
    assert_eq!(uid_before, uid_fixed, "the pod was replaced");
    // None of it holds the value.
    let obj = serde_json::to_string(&env.api::<Sandbox>().get("cred").await.unwrap()).unwrap();
    let events = env
        .api::<k8s_openapi::api::events::v1::Event>()
        .list(&ListParams::default())
        .await
        .unwrap();
    let events = serde_json::to_string(&events).unwrap();
    for text in [obj, events, env.operator_logs()] {
        assert!(!text.contains(&key) && !text.contains(&key_b64));
    }

    keeper.abort();
    env.finish().await;
}
