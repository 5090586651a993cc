//! The egress proxy in production (issue 46), against the real cluster:
//! - the chart's proxy (its Deployment and NetworkPolicy as `helm template` renders them, the
//!   image swapped for the test cluster's proxy image and the namespace for the test's)
//!   serves a sandbox's domain entry, and holds against a hostile sandbox: one that opens
//!   connections without end and stalls them (sends nothing; sends a header byte a second).
//!   Its per-sandbox limit refuses the excess, its head deadline closes the stalled ones, a
//!   second sandbox is served meanwhile, and its memory stays bounded (read on the node from
//!   /proc of its process: the figures are printed);
//! - an operator without a proxy says so on a Sandbox with domain entries (condition
//!   `DomainEgress=False`, reason `NoEgressProxy`, a Warning Event), and the entries stay
//!   closed.
//!
//! The cluster has no DNS: the test names map to an "outside" pod (busybox httpd) through the
//! proxy's `--static-host` (the chart's `egressProxy.staticHosts`), its private address
//! permitted by `--permit-cidr` (`egressProxy.permitCIDRs`). The proxy's metrics are read
//! from that pod (the node has no route into the pod network).

mod common;

use std::time::Duration;

use common::{TestEnv, create_sandbox, helm_template, matrix_runtime_class, phase_is};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{ListParams, PostParams};
use serde_json::json;

use agentbox_api::crd::Sandbox;
use agentbox_api::exec::{ExecRequest, run};

async fn running_ip(env: &TestEnv, name: &str) -> String {
    let p = env
        .wait_for::<Pod>(name, 180, |p: Option<&Pod>| {
            p.and_then(|p| p.status.as_ref())
                .is_some_and(|s| s.phase.as_deref() == Some("Running") && s.pod_ip.is_some())
        })
        .await;
    p.status.unwrap().pod_ip.unwrap()
}

/// The "outside" server: HTTP `ok` on port 80. Returns its IP once it runs.
async fn outside(env: &TestEnv) -> String {
    let script = "mkdir -p /tmp/w && echo ok > /tmp/w/index.html && httpd -f -p 80 -h /tmp/w";
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "outside"},
        "spec": {
            "runtimeClassName": matrix_runtime_class(),
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "l", "image": common::BASE_IMAGE, "imagePullPolicy": "IfNotPresent",
                            "command": ["sh", "-c", script]}]
        }
    }))
    .unwrap();
    env.api::<Pod>()
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    running_ip(env, "outside").await
}

/// Runs `script` in container `container` of pod `pod`; stdout and stderr together.
async fn sh_in(env: &TestEnv, pod: &str, container: &str, script: &str) -> String {
    let out = run(
        &env.api::<Pod>(),
        pod,
        container,
        ExecRequest::shell(script.to_string()).timeout(Duration::from_secs(30)),
    )
    .await
    .expect("exec");
    format!("{}{}", out.stdout_str(), out.stderr_str())
}

/// Runs `script` in sandbox `sandbox`.
async fn sh(env: &TestEnv, sandbox: &str, script: &str) -> String {
    sh_in(
        env,
        &agentbox_api::labels::pod_name(sandbox),
        "sandbox",
        script,
    )
    .await
}

/// GET `http://allowed.test/` from `sandbox` through the proxy its environment names.
async fn fetch(env: &TestEnv, sandbox: &str) -> String {
    sh(
        env,
        sandbox,
        "p=${http_proxy#http://}; p=${p%/}; \
         printf 'GET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n' \
         | nc -w 5 ${p%:*} ${p##*:}",
    )
    .await
}

fn got_ok(response: &str) -> bool {
    response.starts_with("HTTP/1.")
        && response.contains(" 200 ")
        && response.trim_end().ends_with("ok")
}

/// The proxy's metrics (its whole /metrics text), read from the outside pod.
async fn metrics(env: &TestEnv, proxy_ip: &str) -> String {
    sh_in(
        env,
        "outside",
        "l",
        &format!("printf 'GET /metrics HTTP/1.0\\r\\n\\r\\n' | nc -w 3 {proxy_ip} 9090"),
    )
    .await
}

/// The sum of the samples of `name` whose labels contain every one of `labels`.
fn sample(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let bare = series.split('{').next()?;
            (bare == name && labels.iter().all(|want| series.contains(want)))
                .then(|| value.parse::<f64>().ok())
                .flatten()
        })
        .sum()
}

/// The resident set and its peak (KiB) of the agentbox-proxy process of pod `uid`, read on
/// the node (this machine): its cgroup (v1, memory hierarchy) by the pod's UID, its process
/// by name there. `None` where the node is not this machine's or the cgroup is not found.
fn proxy_memory(uid: &str) -> Option<(u64, u64)> {
    fn find(dir: &std::path::Path, uid: &str, depth: u32) -> Option<std::path::PathBuf> {
        for e in std::fs::read_dir(dir).ok()?.flatten() {
            let p = e.path();
            if !p.is_dir() {
                continue;
            }
            let name = e.file_name().to_string_lossy().into_owned();
            if name.contains(uid) || name.contains(&uid.replace('-', "_")) {
                return Some(p);
            }
            if depth > 0
                && let Some(found) = find(&p, uid, depth - 1)
            {
                return Some(found);
            }
        }
        None
    }
    let pod_dir = find(std::path::Path::new("/sys/fs/cgroup/memory"), uid, 5)?;
    for c in std::fs::read_dir(&pod_dir).ok()?.flatten() {
        let procs = std::fs::read_to_string(c.path().join("cgroup.procs")).unwrap_or_default();
        for pid in procs.lines() {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            if comm.trim() != "agentbox-proxy" {
                continue;
            }
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
            let kib = |key: &str| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix(key))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            };
            return Some((kib("VmRSS:")?, kib("VmHWM:")?));
        }
    }
    None
}

/// The chart's proxy Deployment and NetworkPolicy for `values`, placed in the test's
/// namespace and run from the test cluster's proxy image (the chart's is the operator's,
/// which carries the same binary).
fn chart_proxy(env: &TestEnv, image: &str, values: &[String]) -> (Deployment, NetworkPolicy) {
    let mut args = vec!["-n".to_string(), env.ns.clone()];
    for v in values {
        args.extend(["--set".to_string(), v.clone()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let rendered = helm_template(&args).expect("helm template");
    let docs: Vec<serde_json::Value> = rendered
        .split("\n---")
        .filter_map(|d| serde_yaml::from_str::<serde_json::Value>(d).ok())
        .filter(|v| v.get("kind").is_some())
        .collect();
    let pick = |kind: &str| {
        docs.iter()
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == "rel-agentbox-proxy")
            .cloned()
            .unwrap_or_else(|| panic!("the chart renders no proxy {kind}"))
    };
    let mut dep = pick("Deployment");
    let c = &mut dep["spec"]["template"]["spec"]["containers"][0];
    c["image"] = json!(image);
    c["imagePullPolicy"] = json!("IfNotPresent");
    if let Some(rc) = matrix_runtime_class() {
        dep["spec"]["template"]["spec"]["runtimeClassName"] = json!(rc);
    }
    (
        serde_json::from_value(dep).unwrap(),
        serde_json::from_value(pick("NetworkPolicy")).unwrap(),
    )
}

const MAX_PER_SANDBOX: usize = 8;
const HEAD_TIMEOUT: u64 = 3;

#[tokio::test]
#[ignore = "needs a cluster"]
async fn the_charts_proxy_serves_a_domain_and_holds_against_a_flooding_sandbox() {
    let image = common::proxy_image();
    let mut env = TestEnv::new("proxyops").await;
    let allowed_ip = outside(&env).await;
    let (dep, np) = chart_proxy(
        &env,
        &image,
        &[
            "egressProxy.replicas=1".into(),
            format!("egressProxy.maxPerSandbox={MAX_PER_SANDBOX}"),
            format!("egressProxy.headTimeoutSeconds={HEAD_TIMEOUT}"),
            "egressProxy.idleTimeoutSeconds=20".into(),
            format!("egressProxy.staticHosts={{allowed.test={allowed_ip}}}"),
            format!("egressProxy.permitCIDRs={{{allowed_ip}/32}}"),
        ],
    );
    let selector = dep
        .spec
        .as_ref()
        .and_then(|s| s.selector.match_labels.clone())
        .unwrap()
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    env.api::<NetworkPolicy>()
        .create(&PostParams::default(), &np)
        .await
        .unwrap();
    env.api::<Deployment>()
        .create(&PostParams::default(), &dep)
        .await
        .unwrap();
    // Its pod, Ready by the chart's probes (run inside it).
    let pods = env.api::<Pod>();
    let mut proxy_pod = None;
    for _ in 0..360 {
        let list = pods
            .list(&ListParams::default().labels(&selector))
            .await
            .unwrap();
        proxy_pod = list.items.into_iter().find(|p| {
            p.status.as_ref().is_some_and(|s| {
                s.pod_ip.is_some()
                    && s.conditions
                        .iter()
                        .flatten()
                        .any(|c| c.type_ == "Ready" && c.status == "True")
            })
        });
        if proxy_pod.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let proxy_pod = proxy_pod.expect("the chart's proxy pod is Ready within 180 s");
    let proxy_ip = proxy_pod.status.as_ref().unwrap().pod_ip.clone().unwrap();
    let proxy_uid = proxy_pod.metadata.uid.clone().unwrap();
    let url = format!("http://{proxy_ip}:3128");
    let ns = env.ns.clone();
    env.start_operator(&[
        "--egress-proxy-url",
        &url,
        "--egress-proxy-namespace",
        &ns,
        "--egress-proxy-selector",
        &selector,
    ]);
    let spec = json!({"image": common::BASE_IMAGE, "scope": {"kind": "Global"},
        "network": {"egress": "Allowlist", "allow": [{"domain": "allowed.test", "ports": [{"port": 80}]}]}});
    let (a, b) = tokio::join!(
        create_sandbox(&env, "dom", spec.clone()),
        create_sandbox(&env, "flood", spec.clone())
    );
    a.unwrap();
    b.unwrap();
    env.wait_for::<Sandbox>("dom", 180, phase_is("Ready")).await;
    let served = env
        .wait_for::<Sandbox>("flood", 180, phase_is("Ready"))
        .await;
    let cond = common::condition_message(&served, "DomainEgress");
    assert!(cond.contains("through the egress proxy"), "{cond}");

    // The chart's proxy serves the domain entry (polled: the table follows a new pod within
    // seconds).
    let mut last = String::new();
    for _ in 0..120 {
        last = fetch(&env, "dom").await;
        if got_ok(&last) && got_ok(&fetch(&env, "flood").await) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        got_ok(&last),
        "allowed.test through the chart's proxy: {last}"
    );
    let before = proxy_memory(&proxy_uid);

    // The flood: for 6 s, a new connection every 100 ms that sends nothing (each held open
    // 12 s from the sandbox's side), and 4 that send a header byte a second for 12 s. Each
    // answer lands in a file of its own. It runs in a session of its own (setsid), so that
    // the exec that starts it returns at once and ends none of it.
    let flood = format!(
        "p={proxy_ip}; i=0\n\
         for j in 1 2 3 4; do ((for k in $(seq 12); do printf G; sleep 1; done) | nc $p 3128 > /tmp/slow$j 2>&1) </dev/null >/dev/null 2>&1 & done\n\
         end=$(( $(cut -d. -f1 /proc/uptime) + 6 ))\n\
         while [ $(cut -d. -f1 /proc/uptime) -lt $end ]; do i=$((i+1)); (sleep 12 | nc $p 3128 > /tmp/stall$i 2>&1) </dev/null >/dev/null 2>&1 & sleep 0.1; done\n\
         echo opened $i > /tmp/flood.done\n"
    );
    let pods_api = env.api::<Pod>();
    let r = run(
        &pods_api,
        &agentbox_api::labels::pod_name("flood"),
        "sandbox",
        ExecRequest::shell("cat > /tmp/flood.sh").stdin(flood.into_bytes()),
    )
    .await
    .unwrap();
    assert!(r.success(), "{}", r.stderr_str());
    sh(
        &env,
        "flood",
        "setsid sh /tmp/flood.sh </dev/null >/tmp/flood.out 2>&1 &",
    )
    .await;
    let flooding = async {
        for _ in 0..120 {
            let out = sh(&env, "flood", "cat /tmp/flood.done 2>/dev/null").await;
            if out.contains("opened") {
                return out;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let out = sh(&env, "flood", "cat /tmp/flood.out").await;
        panic!("the flood did not finish in 60 s: {out}");
    };
    // While it floods: the second sandbox is served, and the flooder holds no more than its
    // limit (read twice during the flood).
    let during = async {
        let mut seen = Vec::new();
        tokio::time::sleep(Duration::from_secs(2)).await;
        for _ in 0..2 {
            let m = metrics(&env, &proxy_ip).await;
            seen.push(sample(&m, "agentbox_proxy_open_connections", &[]));
            let out = fetch(&env, "dom").await;
            assert!(got_ok(&out), "the other sandbox during the flood: {out}");
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        seen
    };
    let (opened, open_during) = tokio::join!(flooding, during);
    let opened: usize = opened
        .lines()
        .find_map(|l| l.strip_prefix("opened "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("the flood said: {opened}"));
    assert!(
        opened > 2 * MAX_PER_SANDBOX,
        "only {opened} connections opened"
    );
    for open in &open_during {
        // The flooder's at most, and the other sandbox's one fetch at most.
        assert!(
            *open <= (MAX_PER_SANDBOX + 1) as f64,
            "open connections during the flood: {open_during:?}"
        );
    }
    let during_mem = proxy_memory(&proxy_uid);

    // The head deadline closes the stalled ones while the sandbox still holds its side open
    // (its nc processes live 12 s): within a few seconds of the flood's end nothing is open.
    let mut m = String::new();
    for _ in 0..40 {
        m = metrics(&env, &proxy_ip).await;
        if sample(&m, "agentbox_proxy_open_connections", &[]) == 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(
        sample(&m, "agentbox_proxy_open_connections", &[]),
        0.0,
        "stalled connections left open: {m}"
    );
    let flood_label = "sandbox=\"flood\"";
    let limited = sample(
        &m,
        "agentbox_proxy_refused_total",
        &[flood_label, "reason=\"sandbox_limit\""],
    );
    let timed_out = sample(
        &m,
        "agentbox_proxy_refused_total",
        &[flood_label, "reason=\"timeout\""],
    );
    assert!(
        limited >= (opened + 4 - 2 * MAX_PER_SANDBOX) as f64 / 2.0 && limited > 0.0,
        "refused for the limit: {limited} of {opened} + 4: {m}"
    );
    assert!(
        timed_out >= 1.0,
        "no stalled connection closed by the head deadline: {m}"
    );
    assert_eq!(
        sample(&m, "agentbox_proxy_refused_total", &["sandbox=\"dom\""]),
        0.0,
        "the other sandbox was refused: {m}"
    );
    // What the flooder got: 429 for the excess, 408 for the stalled (the slow writers too).
    let answers = sh(&env, "flood", "sleep 1; cat /tmp/stall* /tmp/slow* 2>/dev/null | grep -o 'HTTP/1.1 [0-9]*' | sort | uniq -c").await;
    assert!(answers.contains("HTTP/1.1 429"), "{answers}");
    assert!(answers.contains("HTTP/1.1 408"), "{answers}");
    let slow = sh(&env, "flood", "cat /tmp/slow*").await;
    assert!(
        !slow.contains(" 200 "),
        "a byte-a-second head was let through: {slow}"
    );
    // Still serving after the flood.
    let out = fetch(&env, "dom").await;
    assert!(got_ok(&out), "after the flood: {out}");

    // The memory figures (this machine's node only; the assertion bounds the peak well under
    // the chart's limit, 256 MiB).
    let after = proxy_memory(&proxy_uid);
    println!(
        "proxy memory (VmRSS, VmHWM KiB): before {before:?}, during {during_mem:?}, after {after:?}; \
         flood: {opened} stalled + 4 byte-a-second connections, {limited} refused by the limit, \
         {timed_out} closed by the head deadline; open during the flood {open_during:?}; answers {}",
        answers.split_whitespace().collect::<Vec<_>>().join(" ")
    );
    if let Some((_, peak)) = after {
        assert!(
            peak < 64 * 1024,
            "the proxy's peak resident set: {peak} KiB"
        );
    }
    env.finish().await;
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn domain_entries_without_a_proxy_are_closed_and_said_so() {
    let mut env = TestEnv::new("noproxy").await;
    let allowed_ip = outside(&env).await;
    // No --egress-proxy-url.
    env.start_operator(&[]);
    let spec = json!({"image": common::BASE_IMAGE, "scope": {"kind": "Global"},
        "network": {"egress": "Allowlist", "allow": [
            {"domain": "allowed.test", "ports": [{"port": 80}]},
            {"cidr": format!("{allowed_ip}/32"), "ports": [{"port": 8080}]}]}});
    create_sandbox(&env, "dom", spec).await.unwrap();
    let s = env
        .wait_for::<Sandbox>("dom", 180, |s: Option<&Sandbox>| {
            s.and_then(|s| s.status.as_ref()).is_some_and(|st| {
                st.conditions.iter().any(|c| {
                    c.type_ == "DomainEgress" && c.status == "False" && c.reason == "NoEgressProxy"
                })
            })
        })
        .await;
    let message = common::condition_message(&s, "DomainEgress");
    assert!(
        message.contains("allowed.test") && message.contains("stays closed"),
        "{message}"
    );
    let events = common::events(&env, "dom", "NoEgressProxy").await;
    assert!(
        events.iter().any(|e| e.type_.as_deref() == Some("Warning")
            && e.note
                .as_deref()
                .is_some_and(|n| n.contains("allowed.test"))),
        "no Warning Event NoEgressProxy: {events:?}"
    );
    // Fail closed: no proxy settings in its environment, and the listener (reachable only by
    // name) is out of reach on its port: the cidr entry allows another one.
    env.wait_for::<Sandbox>("dom", 180, phase_is("Ready")).await;
    let envs = sh(&env, "dom", "env").await;
    assert!(!envs.contains("HTTP_PROXY="), "{envs}");
    let out = sh(
        &env,
        "dom",
        &format!(
            "printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 3 {allowed_ip} 80; echo \"nc exit $?\""
        ),
    )
    .await;
    assert!(!out.lines().any(|l| l.trim() == "ok"), "reached: {out}");
    // One Event, not one per reconcile: a few seconds later there is still one.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let n: i32 = common::events_now(&env, "dom", "NoEgressProxy")
        .await
        .iter()
        .map(|e| e.series.as_ref().map_or(1, |s| s.count))
        .sum();
    assert_eq!(n, 1, "NoEgressProxy Events");
    env.finish().await;
}
