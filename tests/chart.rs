//! The Helm chart without a cluster: its CRDs are the generated ones (templates, kept on
//! uninstall), `helm lint --strict` and `helm template` pass for the default and the notable value
//! sets, every RBAC rule carries a comment saying why, every value is documented and in the
//! schema, the values reach the operator's env, and the optional objects (aggregated roles,
//! harness ServiceAccounts, PodDisruptionBudget, the `helm test` pod, the Grafana dashboard and
//! the PrometheusRule) render as they should, querying only series the operator registers.

use std::process::Command;

mod common;
use common::{CHART_KUBE_VERSION as KUBE_VERSION, helm_bin, helm_template, repo_root};

fn helm(args: &[&str]) -> Result<String, String> {
    let out = Command::new(helm_bin())
        .args(args)
        .current_dir(repo_root())
        .output()
        .map_err(|e| format!("running helm: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() {
        Ok(stdout)
    } else {
        Err(format!("{stdout}{}", String::from_utf8_lossy(&out.stderr)))
    }
}

fn template(set: &[&str]) -> String {
    let mut args = vec!["-n", "agentbox-system"];
    for s in set {
        args.extend(["--set", s]);
    }
    helm_template(&args).unwrap_or_else(|e| panic!("helm template {set:?}: {e}"))
}

fn docs(rendered: &str) -> Vec<serde_yaml::Value> {
    rendered
        .split("\n---")
        .filter_map(|d| serde_yaml::from_str::<serde_yaml::Value>(d).ok())
        .filter(|v| v.get("kind").is_some())
        .collect()
}

fn find<'a>(
    docs: &'a [serde_yaml::Value],
    kind: &str,
    name: &str,
) -> Option<&'a serde_yaml::Value> {
    docs.iter()
        .find(|d| d["kind"].as_str() == Some(kind) && d["metadata"]["name"].as_str() == Some(name))
}

/// The operator's Deployment (the egress proxy's is another).
fn operator_deployment(docs: &[serde_yaml::Value]) -> Option<&serde_yaml::Value> {
    docs.iter().find(|d| {
        d["kind"].as_str() == Some("Deployment")
            && d["spec"]["template"]["spec"]["containers"][0]["name"].as_str() == Some("operator")
    })
}

fn env_value(docs: &[serde_yaml::Value], name: &str) -> Option<String> {
    let dep = operator_deployment(docs)?;
    dep["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_sequence()?
        .iter()
        .find(|e| e["name"].as_str() == Some(name))
        .and_then(|e| e["value"].as_str().map(str::to_string))
}

#[test]
fn chart_crds_are_the_generated_crds() {
    let generated =
        std::fs::read(repo_root().join("crds/agentbox.yaml")).expect("crds/agentbox.yaml");
    let chart = std::fs::read(repo_root().join("charts/agentbox/files/crds.yaml"))
        .expect("charts/agentbox/files/crds.yaml");
    assert!(
        generated == chart,
        "charts/agentbox/files/crds.yaml differs from crds/agentbox.yaml: \
         cp crds/agentbox.yaml charts/agentbox/files/crds.yaml"
    );
    // Helm would install a crds/ directory on its own, once, and never upgrade it.
    assert!(
        !repo_root().join("charts/agentbox/crds").exists(),
        "the CRDs are templates (templates/crds.yaml), not a crds/ directory"
    );
}

/// Numbers as f64, so that a CRD read back from Helm's rendering (integers) compares equal to
/// the generated one (floats where schemars wrote them).
fn normalized(v: serde_yaml::Value) -> serde_json::Value {
    fn walk(v: serde_json::Value) -> serde_json::Value {
        match v {
            serde_json::Value::Number(n) => serde_json::json!(n.as_f64()),
            serde_json::Value::Array(a) => a.into_iter().map(walk).collect(),
            serde_json::Value::Object(o) => o.into_iter().map(|(k, v)| (k, walk(v))).collect(),
            v => v,
        }
    }
    walk(serde_json::to_value(v).expect("YAML as JSON"))
}

#[test]
#[ignore = "needs helm (hack/cluster fetches it)"]
fn crds_are_templates_that_upgrade_and_stay_on_uninstall() {
    let generated: Vec<serde_json::Value> =
        docs(&std::fs::read_to_string(repo_root().join("crds/agentbox.yaml")).unwrap())
            .into_iter()
            .map(normalized)
            .collect();
    assert_eq!(generated.len(), 4);
    let crds = |set: &[&str]| -> Vec<serde_yaml::Value> {
        docs(&template(set))
            .into_iter()
            .filter(|d| d["kind"].as_str() == Some("CustomResourceDefinition"))
            .collect()
    };
    let rendered = crds(&[]);
    assert_eq!(rendered.len(), generated.len());
    for (r, g) in rendered.iter().zip(&generated) {
        let name = r["metadata"]["name"].as_str().unwrap_or_default();
        assert_eq!(normalized(r["spec"].clone()), g["spec"], "{name}: spec");
        assert_eq!(
            r["metadata"]["annotations"]["helm.sh/resource-policy"].as_str(),
            Some("keep"),
            "{name}"
        );
        assert_eq!(
            r["metadata"]["labels"]["app.kubernetes.io/managed-by"].as_str(),
            Some("Helm")
        );
    }
    for r in crds(&["crds.keep=false"]) {
        assert!(
            r["metadata"]["annotations"]["helm.sh/resource-policy"].is_null(),
            "crds.keep=false: {:?}",
            r["metadata"]
        );
    }
    assert!(crds(&["crds.install=false"]).is_empty());
}

#[test]
#[ignore = "needs helm (hack/cluster fetches it)"]
fn kubernetes_older_than_1_33_is_refused() {
    let old = helm(&[
        "template",
        "rel",
        "charts/agentbox",
        "--kube-version",
        "1.32.9",
    ]);
    let err = old.expect_err("the chart should refuse Kubernetes 1.32");
    assert!(err.contains("kubeVersion"), "{err}");
}

#[test]
#[ignore = "needs helm (hack/cluster fetches it)"]
fn aggregated_roles_extend_edit_and_view() {
    let all = docs(&template(&[]));
    let edit = find(&all, "ClusterRole", "rel-agentbox-edit").expect("edit role");
    let view = find(&all, "ClusterRole", "rel-agentbox-view").expect("view role");
    let labels =
        |r: &serde_yaml::Value, k: &str| r["metadata"]["labels"][k].as_str().map(String::from);
    assert_eq!(
        labels(edit, "rbac.authorization.k8s.io/aggregate-to-edit").as_deref(),
        Some("true")
    );
    assert_eq!(
        labels(view, "rbac.authorization.k8s.io/aggregate-to-view").as_deref(),
        Some("true")
    );
    let verbs = |r: &serde_yaml::Value| -> Vec<String> {
        r["rules"][0]["verbs"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(verbs(view), ["get", "list", "watch"]);
    assert!(verbs(edit).contains(&"create".to_string()));
    for r in [edit, view] {
        let res: Vec<&str> = r["rules"][0]["resources"]
            .as_sequence()
            .unwrap()
            .iter()
            .filter_map(|v| v.as_str())
            .collect();
        assert_eq!(
            res,
            [
                "sandboxes",
                "sandboxsnapshots",
                "sandboxtemplates",
                "sandboxpools"
            ],
            "no status subresources"
        );
    }
    let off = docs(&template(&["rbac.aggregate=false"]));
    assert!(find(&off, "ClusterRole", "rel-agentbox-edit").is_none());
}

/// The rules of a Role or ClusterRole as (apiGroup, resource, verbs) triples, sorted.
fn rules_of(role: &serde_yaml::Value) -> Vec<(String, String, String)> {
    let strs = |v: &serde_yaml::Value| -> Vec<String> {
        v.as_sequence()
            .map(|s| {
                s.iter()
                    .filter_map(|x| x.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut out = Vec::new();
    for rule in role["rules"].as_sequence().unwrap() {
        for g in strs(&rule["apiGroups"]) {
            for r in strs(&rule["resources"]) {
                out.push((g.clone(), r, strs(&rule["verbs"]).join(",")));
            }
        }
    }
    out.sort();
    out
}

/// What the Rust client, the Python SDK and the CLI call (tests/rbac.rs runs both with these
/// rules and nothing else).
fn harness_rules() -> Vec<(String, String, String)> {
    let mut want: Vec<(String, String, String)> = [
        (
            "agentbox.dev",
            "sandboxes",
            "get,list,watch,create,patch,delete",
        ),
        ("agentbox.dev", "sandboxsnapshots", "get,list,watch,create"),
        ("agentbox.dev", "sandboxtemplates", "get,list"),
        ("agentbox.dev", "sandboxpools", "get,list"),
        ("", "pods/exec", "get,create"),
        ("coordination.k8s.io", "leases", "get,watch,create,update"),
    ]
    .iter()
    .map(|(g, r, v)| (g.to_string(), r.to_string(), v.to_string()))
    .collect();
    want.sort();
    want
}

#[test]
#[ignore = "needs helm (hack/cluster fetches it)"]
fn harness_service_accounts_get_exactly_what_a_harness_calls() {
    assert!(
        !docs(&template(&[]))
            .iter()
            .any(|d| d["metadata"]["name"].as_str() == Some("agentbox-harness")),
        "none by default"
    );
    let all = docs(&template(&["harness.namespaces={team-a,team-b}"]));
    for ns in ["team-a", "team-b"] {
        let in_ns = |kind: &str| {
            all.iter()
                .find(|d| {
                    d["kind"].as_str() == Some(kind)
                        && d["metadata"]["name"].as_str() == Some("agentbox-harness")
                        && d["metadata"]["namespace"].as_str() == Some(ns)
                })
                .unwrap_or_else(|| panic!("{kind} agentbox-harness in {ns}"))
        };
        in_ns("ServiceAccount");
        assert_eq!(rules_of(in_ns("Role")), harness_rules(), "{ns}");
        let rb = in_ns("RoleBinding");
        assert_eq!(rb["roleRef"]["name"].as_str(), Some("agentbox-harness"));
        assert_eq!(rb["subjects"][0]["namespace"].as_str(), Some(ns));
    }
    let r = helm_template(&["--set", "harness.namespaces={Team_A}"]);
    assert!(r.is_err(), "a namespace that is not a name is refused");
}

#[test]
#[ignore = "needs helm (hack/cluster fetches it)"]
fn a_disruption_budget_only_with_more_than_one_replica() {
    // (The egress proxy's own budget follows its own replicas: egressProxy.replicas.)
    assert!(find(&docs(&template(&[])), "PodDisruptionBudget", "rel-agentbox").is_none());
    let two = docs(&template(&["replicas=2"]));
    let pdb = find(&two, "PodDisruptionBudget", "rel-agentbox").expect("a PDB with 2 replicas");
    assert_eq!(pdb["spec"]["maxUnavailable"].as_i64(), Some(1));
    let dep = find(&two, "Deployment", "rel-agentbox").unwrap();
    assert_eq!(
        pdb["spec"]["selector"]["matchLabels"],
        dep["spec"]["selector"]["matchLabels"]
    );
}

#[test]
#[ignore = "needs helm (hack/cluster fetches it)"]
fn helm_test_runs_the_selftest_as_a_harness_in_the_managed_namespace() {
    for (set, ns, host_network) in [
        (&[][..], "agentbox-system", None),
        (
            &["watchNamespace=team-a", "hostNetwork=true"][..],
            "team-a",
            Some(true),
        ),
    ] {
        let all = docs(&template(set));
        let pod = find(&all, "Pod", "rel-agentbox-test").expect("test pod");
        assert_eq!(
            pod["metadata"]["annotations"]["helm.sh/hook"].as_str(),
            Some("test")
        );
        assert_eq!(pod["metadata"]["namespace"].as_str(), Some(ns));
        assert_eq!(pod["spec"]["hostNetwork"].as_bool(), host_network);
        let c = &pod["spec"]["containers"][0];
        assert_eq!(
            c["command"][0].as_str(),
            Some("/usr/local/bin/agentbox-selftest")
        );
        let dep = find(&all, "Deployment", "rel-agentbox").unwrap();
        assert_eq!(
            c["image"], dep["spec"]["template"]["spec"]["containers"][0]["image"],
            "the operator image"
        );
        let args: Vec<&str> = c["args"]
            .as_sequence()
            .unwrap()
            .iter()
            .filter_map(|a| a.as_str())
            .collect();
        assert!(
            args.contains(&format!("--namespace={ns}").as_str()),
            "{args:?}"
        );
        assert!(
            args.contains(&"--image=docker.io/library/busybox:1.37"),
            "{args:?}"
        );
        let role = find(&all, "Role", "rel-agentbox-test").expect("test Role");
        assert_eq!(rules_of(role), harness_rules());
        assert_eq!(role["metadata"]["namespace"].as_str(), Some(ns));
    }
}

/// Every key of values.yaml is described by values.schema.json: the schema has a property for
/// it, down to the keys whose schema is free-form (e.g. `resources`).
#[test]
fn every_value_is_in_the_schema() {
    let values: serde_yaml::Value = serde_yaml::from_str(
        &std::fs::read_to_string(repo_root().join("charts/agentbox/values.yaml")).unwrap(),
    )
    .unwrap();
    let schema: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(repo_root().join("charts/agentbox/values.schema.json")).unwrap(),
    )
    .unwrap();
    fn walk(v: &serde_yaml::Value, s: &serde_json::Value, path: &str, n: &mut usize) {
        let Some(map) = v.as_mapping() else { return };
        let Some(props) = s.get("properties").and_then(|p| p.as_object()) else {
            return;
        };
        for (k, child) in map {
            let k = k.as_str().unwrap_or_default();
            let p = format!("{path}.{k}");
            let sub = props
                .get(k)
                .unwrap_or_else(|| panic!("values.schema.json has no property for {p}"));
            assert!(
                sub.get("type").is_some() || sub.get("$ref").is_some(),
                "{p}: the schema gives no type"
            );
            *n += 1;
            walk(child, sub, &p, n);
        }
    }
    let mut n = 0;
    walk(&values, &schema, "", &mut n);
    assert!(n > 60, "{n} values checked");
}

#[test]
#[ignore = "needs helm (hack/cluster fetches it)"]
fn helm_lint_and_template_are_clean() {
    let lint = helm(&[
        "lint",
        "--strict",
        "--kube-version",
        KUBE_VERSION,
        "charts/agentbox",
    ])
    .expect("helm lint --strict");
    assert!(lint.contains("0 chart(s) failed"), "{lint}");
    template(&[]);
    template(&[
        "watchNamespace=team-a",
        "allowedHostPrefixes={/srv/shared,/data}",
    ]);
    template(&[
        "store.url=s3://bucket/agentbox",
        "store.credentialsSecret=agentbox-store",
    ]);
    template(&["metrics.serviceMonitor.enabled=true", "replicas=3"]);
    template(&[
        "metrics.dashboard.enabled=true",
        "metrics.prometheusRule.enabled=true",
    ]);
    template(&[
        "leaderElection.enabled=false",
        "rbac.create=false",
        "serviceAccount.create=false",
    ]);
    // The schema and the template guards refuse what cannot work.
    for bad in [
        "nodeRoot=relative/path",
        "nodeRoot=/var/../etc",
        "image.pullPolicy=Sometimes",
        "helperImagePullPolicy=Sometimes",
        "sandboxDefaults.runAsUser=0",
        "sandboxDefaults.allowedCapabilities={cap_net_raw}",
        "replicas=2,leaderElection.enabled=false",
        "metrics.prometheusRule.enabled=true,metrics.service.enabled=false",
        "unknownKey=1",
    ] {
        let r = helm_template(&["--set", bad]);
        assert!(r.is_err(), "{bad} should be refused");
    }
}

#[test]
#[ignore = "needs helm (hack/cluster fetches it)"]
fn every_rbac_rule_says_why() {
    for set in [&[][..], &["watchNamespace=team-a"][..]] {
        let out = template(set);
        let lines: Vec<&str> = out.lines().collect();
        let mut rules = 0;
        for (i, l) in lines.iter().enumerate() {
            if l.starts_with("- apiGroups:") {
                rules += 1;
                let prev = lines[i - 1].trim_start();
                assert!(
                    prev.starts_with("# ") && prev.len() > 20,
                    "rule without a comment ({set:?}): {l}\n after: {prev}"
                );
            }
        }
        assert!(rules >= 12, "{rules} rules rendered");
    }
}

#[test]
#[ignore = "needs helm (hack/cluster fetches it)"]
fn watch_namespace_scopes_rbac_to_a_role() {
    let all = docs(&template(&[]));
    let cr = find(&all, "ClusterRole", "rel-agentbox").expect("ClusterRole");
    assert!(
        cr["rules"].as_sequence().unwrap().len() > 1,
        "cluster-wide rules"
    );
    assert!(find(&all, "Role", "rel-agentbox").is_none());

    let scoped = docs(&template(&["watchNamespace=team-a"]));
    let cr = find(&scoped, "ClusterRole", "rel-agentbox").expect("ClusterRole");
    let cluster_rules = cr["rules"].as_sequence().unwrap();
    assert_eq!(
        cluster_rules.len(),
        2,
        "only nodes (get, list) and runtimeclasses (get) are cluster-wide"
    );
    assert_eq!(cluster_rules[0]["resources"][0].as_str(), Some("nodes"));
    assert_eq!(
        cluster_rules[1]["resources"][0].as_str(),
        Some("runtimeclasses")
    );
    assert_eq!(
        cluster_rules[1]["verbs"].as_sequence().map(Vec::len),
        Some(1)
    );
    let role = find(&scoped, "Role", "rel-agentbox").expect("Role in the watched namespace");
    assert_eq!(role["metadata"]["namespace"].as_str(), Some("team-a"));
    let lease_role = find(&scoped, "Role", "rel-agentbox-leader-election").expect("lease Role");
    assert_eq!(
        lease_role["metadata"]["namespace"].as_str(),
        Some("agentbox-system")
    );
    assert_eq!(
        env_value(&scoped, "AGENTBOX_NAMESPACE").as_deref(),
        Some("team-a")
    );
}

#[test]
#[ignore = "needs helm (hack/cluster fetches it)"]
fn values_reach_the_operator_environment() {
    let d = docs(&template(&[
        "nodeRoot=/srv/ws",
        "allowedHostPrefixes={/srv/shared,/data}",
        "logging.json=true",
        "store.url=s3://bucket/agentbox",
        "store.credentialsSecret=agentbox-store",
        "leaderElection.leaseName=my-lease",
        "metrics.port=9090",
    ]));
    assert_eq!(
        env_value(&d, "AGENTBOX_NODE_ROOT").as_deref(),
        Some("/srv/ws")
    );
    assert_eq!(
        env_value(&d, "AGENTBOX_ALLOWED_HOST_PREFIXES").as_deref(),
        Some("/srv/shared,/data")
    );
    assert_eq!(env_value(&d, "AGENTBOX_LOG_JSON").as_deref(), Some("true"));
    assert_eq!(
        env_value(&d, "AGENTBOX_LEADER_ELECTION_NAME").as_deref(),
        Some("my-lease")
    );
    assert_eq!(
        env_value(&d, "AGENTBOX_LEADER_ELECTION_NAMESPACE").as_deref(),
        Some("agentbox-system")
    );
    assert_eq!(
        env_value(&d, "AGENTBOX_METRICS_ADDR").as_deref(),
        Some("0.0.0.0:9090")
    );
    assert_eq!(
        env_value(&d, "AGENTBOX_STORE_URL").as_deref(),
        Some("s3://bucket/agentbox")
    );
    // The helper image defaults to the operator's own (which carries agentbox-helper): never a
    // sandbox's image.
    let image = operator_deployment(&d)
        .map(|dep| dep["spec"]["template"]["spec"]["containers"][0]["image"].clone())
        .and_then(|i| i.as_str().map(str::to_string));
    assert_eq!(env_value(&d, "AGENTBOX_HELPER_IMAGE"), image);
    assert_eq!(
        env_value(&d, "AGENTBOX_HELPER_IMAGE_PULL_POLICY").as_deref(),
        Some("IfNotPresent")
    );
    assert_eq!(
        env_value(&d, "AGENTBOX_RUN_AS_NON_ROOT").as_deref(),
        Some("false")
    );
    // A start that cannot go on is told within 30 s by default, and the grace is the user's.
    assert_eq!(
        env_value(&d, "AGENTBOX_STALL_GRACE_SECONDS").as_deref(),
        Some("20")
    );
    let patient = docs(&template(&["stallGraceSeconds=90"]));
    assert_eq!(
        env_value(&patient, "AGENTBOX_STALL_GRACE_SECONDS").as_deref(),
        Some("90")
    );
    let secure = docs(&template(&[
        "helperImage=registry.example.com/agentbox/helper:1",
        "helperImagePullPolicy=Always",
        "sandboxDefaults.runAsNonRoot=true",
        "sandboxDefaults.runAsUser=1000",
        "sandboxDefaults.allowedCapabilities={NET_RAW,SYS_PTRACE}",
    ]));
    for (k, v) in [
        (
            "AGENTBOX_HELPER_IMAGE",
            "registry.example.com/agentbox/helper:1",
        ),
        ("AGENTBOX_HELPER_IMAGE_PULL_POLICY", "Always"),
        ("AGENTBOX_RUN_AS_NON_ROOT", "true"),
        ("AGENTBOX_DEFAULT_RUN_AS_USER", "1000"),
        ("AGENTBOX_ALLOWED_CAPABILITIES", "NET_RAW,SYS_PTRACE"),
    ] {
        assert_eq!(env_value(&secure, k).as_deref(), Some(v), "{k}");
    }
    let dep = operator_deployment(&d).unwrap();
    let c = &dep["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        c["envFrom"][0]["secretRef"]["name"].as_str(),
        Some("agentbox-store")
    );
    let sc = &c["securityContext"];
    assert_eq!(sc["readOnlyRootFilesystem"].as_bool(), Some(true));
    assert_eq!(sc["runAsNonRoot"].as_bool(), Some(true));
    assert_eq!(sc["capabilities"]["drop"][0].as_str(), Some("ALL"));
    assert_eq!(
        sc["seccompProfile"]["type"].as_str(),
        Some("RuntimeDefault")
    );
    assert_eq!(
        c["livenessProbe"]["httpGet"]["path"].as_str(),
        Some("/healthz")
    );
    assert_eq!(
        c["readinessProbe"]["httpGet"]["path"].as_str(),
        Some("/readyz")
    );
}

/// Every key of values.yaml has a comment above it, or sits inside a documented key's value
/// (e.g. the fields of `resources`).
#[test]
fn every_value_is_documented() {
    let text = std::fs::read_to_string(repo_root().join("charts/agentbox/values.yaml")).unwrap();
    let mut documented_indent: Option<usize> = None;
    let mut prev = "";
    for line in text.lines() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        if trimmed.is_empty() {
            prev = "";
            continue;
        }
        if trimmed.starts_with('#') || trimmed.starts_with('-') {
            prev = trimmed;
            continue;
        }
        if documented_indent.is_some_and(|d| indent > d) {
            prev = trimmed;
            continue;
        }
        documented_indent = None;
        let Some((key, rest)) = trimmed.split_once(':') else {
            prev = trimmed;
            continue;
        };
        let has_comment = prev.starts_with('#');
        let is_section = rest.trim().is_empty();
        if has_comment && is_section {
            documented_indent = Some(indent);
        }
        assert!(
            has_comment || is_section,
            "values.yaml: {key:?} has no comment above it"
        );
        prev = trimmed;
    }
}

/// Every `agentbox_…` metric name in `text`.
fn metric_names(text: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("agentbox_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        names.insert(tail[..end].to_string());
        rest = &tail[end..];
    }
    names
}

/// The dashboard (parsed) and the alert expressions of a rendering with both enabled.
fn dashboard_and_rules() -> (serde_json::Value, Vec<(String, String)>) {
    let rendered = template(&[
        "metrics.dashboard.enabled=true",
        "metrics.prometheusRule.enabled=true",
    ]);
    let docs = docs(&rendered);
    let cm = find(&docs, "ConfigMap", "rel-agentbox-dashboard").expect("dashboard ConfigMap");
    assert_eq!(
        cm["metadata"]["labels"]["grafana_dashboard"].as_str(),
        Some("1")
    );
    let json = cm["data"]["agentbox.json"].as_str().expect("agentbox.json");
    let dashboard: serde_json::Value = serde_json::from_str(json).expect("dashboard JSON");
    let rule = find(&docs, "PrometheusRule", "rel-agentbox").expect("PrometheusRule");
    assert_eq!(
        rule["apiVersion"].as_str(),
        Some("monitoring.coreos.com/v1")
    );
    let alerts = rule["spec"]["groups"]
        .as_sequence()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_sequence().into_iter().flatten())
        .map(|r| {
            let name = r["alert"].as_str().unwrap_or_default().to_string();
            (name, r["expr"].as_str().unwrap_or_default().to_string())
        })
        .collect();
    (dashboard, alerts)
}

#[test]
#[ignore = "needs helm (hack/cluster fetches it)"]
fn the_dashboard_and_the_alerts_render_only_when_enabled() {
    let default = docs(&template(&[]));
    assert!(find(&default, "ConfigMap", "rel-agentbox-dashboard").is_none());
    assert!(
        !default
            .iter()
            .any(|d| d["kind"].as_str() == Some("PrometheusRule"))
    );
    let (dashboard, alerts) = dashboard_and_rules();
    let panels = dashboard["panels"].as_array().expect("panels");
    let queries = panels
        .iter()
        .filter(|p| p["type"] != "row")
        .filter(|p| p["targets"].as_array().is_some_and(|t| !t.is_empty()))
        .count();
    assert!(queries >= 10, "{queries} panels with queries");
    let names: Vec<&str> = alerts.iter().map(|(n, _)| n.as_str()).collect();
    for want in [
        "AgentboxOperatorDown",
        "AgentboxNoLeader",
        "AgentboxReconcileErrors",
        "AgentboxSnapshotFailures",
        "AgentboxSlowStarts",
    ] {
        assert!(names.contains(&want), "{want} not in {names:?}");
    }
    // Each alert selects the series of this release's ServiceMonitor job.
    for (name, expr) in &alerts {
        assert!(
            expr.contains(r#"job="rel-agentbox-metrics""#),
            "{name}: {expr}"
        );
    }
    // The dashboard ConfigMap goes where the sidecar looks when told.
    let elsewhere = docs(&template(&[
        "metrics.dashboard.enabled=true",
        "metrics.dashboard.namespace=monitoring",
    ]));
    let cm = find(&elsewhere, "ConfigMap", "rel-agentbox-dashboard").expect("ConfigMap");
    assert_eq!(cm["metadata"]["namespace"].as_str(), Some("monitoring"));
}

#[test]
#[ignore = "needs helm (hack/cluster fetches it)"]
fn the_dashboard_and_the_alerts_query_only_what_the_operator_registers() {
    let registered = agentbox_operator::metrics::Metrics::default()
        .sample_names()
        .clone();
    let (dashboard, alerts) = dashboard_and_rules();
    let exprs: Vec<String> = dashboard["panels"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| p["targets"].as_array().into_iter().flatten())
        .filter_map(|t| t["expr"].as_str().map(str::to_string))
        .chain(alerts.into_iter().map(|(_, e)| e))
        .collect();
    let queried = metric_names(&exprs.join("\n"));
    let proxy = proxy_series();
    for name in &queried {
        assert!(
            registered.contains(name) || proxy.contains(name),
            "{name} is queried but neither the operator nor the egress proxy registers such a series: {registered:?} {proxy:?}"
        );
    }
    // And the dashboard shows every metric the operator has (some sample of each).
    let shown = metric_names(&dashboard.to_string());
    let families: std::collections::BTreeSet<&str> = registered
        .iter()
        .map(|n| {
            ["_total", "_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| n.strip_suffix(s))
                .unwrap_or(n)
        })
        .collect();
    for family in families {
        assert!(
            shown.iter().any(|n| n.starts_with(family)),
            "the dashboard has no panel for {family}"
        );
    }
    // And every metric of the egress proxy (its own /metrics, in the same dashboard).
    let proxy_families = proxy_families();
    assert!(
        proxy_families.len() >= 4,
        "the proxy's families: {proxy_families:?}"
    );
    for family in &proxy_families {
        assert!(
            shown.iter().any(|n| n.starts_with(family.as_str())),
            "the dashboard has no panel for the egress proxy's {family}"
        );
    }
}

/// The egress proxy's registry encoded with a sample in every family: a labelled family
/// without samples (the refusals', before the first) is not encoded at all.
fn proxy_metrics_text() -> String {
    let m = agentbox_proxy::metrics::Metrics::new();
    m.refused("ns", "sandbox", "not_allowed");
    m.encode()
}

/// The egress proxy's metric families, from its own registry's `# TYPE` lines.
fn proxy_families() -> std::collections::BTreeSet<String> {
    proxy_metrics_text()
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

/// The series names the egress proxy can serve: its families, counters with `_total`.
fn proxy_series() -> std::collections::BTreeSet<String> {
    let text = proxy_metrics_text();
    let mut out = std::collections::BTreeSet::new();
    for l in text.lines().filter_map(|l| l.strip_prefix("# TYPE ")) {
        let mut it = l.split_whitespace();
        let (Some(name), Some(kind)) = (it.next(), it.next()) else {
            continue;
        };
        match kind {
            "counter" => out.insert(format!("{name}_total")),
            "histogram" => {
                for s in ["_bucket", "_sum", "_count"] {
                    out.insert(format!("{name}{s}"));
                }
                true
            }
            _ => out.insert(name.to_string()),
        };
    }
    out
}

/// The Deployment, Service and NetworkPolicy of the egress proxy (default values), and what
/// the operator is told of them.
#[test]
#[ignore = "needs helm (hack/cluster fetches it)"]
fn the_chart_runs_the_egress_proxy_and_points_the_operator_at_it() {
    let d = docs(&template(&[]));
    let dep = find(&d, "Deployment", "rel-agentbox-proxy").expect("the proxy's Deployment");
    let op = find(&d, "Deployment", "rel-agentbox").expect("the operator's Deployment");
    assert_eq!(dep["spec"]["replicas"].as_i64(), Some(2));
    let pod = &dep["spec"]["template"]["spec"];
    assert_eq!(pod["automountServiceAccountToken"].as_bool(), Some(false));
    let c = &pod["containers"][0];
    let opc = &op["spec"]["template"]["spec"]["containers"][0];
    // The operator's image, which carries agentbox-proxy, and its security settings.
    assert_eq!(c["image"], opc["image"]);
    assert_eq!(c["securityContext"], opc["securityContext"]);
    assert_eq!(
        pod["securityContext"],
        op["spec"]["template"]["spec"]["securityContext"]
    );
    assert_eq!(
        c["command"][0].as_str(),
        Some("/usr/local/bin/agentbox-proxy")
    );
    assert_eq!(c["command"][1].as_str(), Some("serve"));
    let args: Vec<&str> = c["args"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(|a| a.as_str())
        .collect();
    for want in [
        "--listen=0.0.0.0:3128",
        "--metrics=0.0.0.0:9090",
        "--max-per-sandbox=256",
        "--max-connections=8192",
        "--head-timeout=10",
        "--idle-timeout=300",
    ] {
        assert!(args.contains(&want), "{want} not in {args:?}");
    }
    assert_eq!(c["resources"]["limits"]["memory"].as_str(), Some("256Mi"));
    for probe in ["livenessProbe", "readinessProbe"] {
        assert_eq!(
            c[probe]["exec"]["command"][1].as_str(),
            Some("probe"),
            "{probe}"
        );
    }
    assert_eq!(
        c["volumeMounts"][0]["mountPath"].as_str(),
        Some("/run/agentbox-proxy")
    );
    // The operator's flags name the Service, the namespace, the pods' labels and the port.
    assert_eq!(
        env_value(&d, "AGENTBOX_EGRESS_PROXY_URL").as_deref(),
        Some("http://rel-agentbox-proxy.agentbox-system.svc:3128")
    );
    assert_eq!(
        env_value(&d, "AGENTBOX_EGRESS_PROXY_NAMESPACE").as_deref(),
        Some("agentbox-system")
    );
    assert_eq!(
        env_value(&d, "AGENTBOX_EGRESS_PROXY_PORT").as_deref(),
        Some("3128")
    );
    let selector = env_value(&d, "AGENTBOX_EGRESS_PROXY_SELECTOR").unwrap();
    let labels = &dep["spec"]["template"]["metadata"]["labels"];
    for pair in selector.split(',') {
        let (k, v) = pair.split_once('=').unwrap();
        assert_eq!(labels[k].as_str(), Some(v), "{k} of {selector}");
    }
    // ... and not the operator's own pods: its Deployment's selector does not take them.
    let op_sel = op["spec"]["selector"]["matchLabels"].as_mapping().unwrap();
    assert!(
        !op_sel
            .iter()
            .all(|(k, v)| labels[k.as_str().unwrap()] == *v),
        "the operator's selector takes the proxy's pods"
    );
    let svc = find(&d, "Service", "rel-agentbox-proxy").expect("the proxy's Service");
    assert_eq!(svc["spec"]["ports"][0]["port"].as_i64(), Some(3128));
    assert_eq!(
        svc["spec"]["selector"],
        dep["spec"]["selector"]["matchLabels"]
    );
    // Its NetworkPolicy: in, sandbox pods on the proxy port; out, DNS and the outside but
    // link-local (the metadata address).
    let np = find(&d, "NetworkPolicy", "rel-agentbox-proxy").expect("the proxy's NetworkPolicy");
    assert_eq!(
        np["spec"]["podSelector"]["matchLabels"],
        svc["spec"]["selector"]
    );
    let ingress = &np["spec"]["ingress"][0];
    assert_eq!(
        ingress["from"][0]["podSelector"]["matchExpressions"][0]["key"].as_str(),
        Some("agentbox.dev/sandbox")
    );
    assert_eq!(ingress["ports"][0]["port"].as_i64(), Some(3128));
    let egress = np["spec"]["egress"].as_sequence().unwrap();
    assert_eq!(egress[0]["ports"][0]["port"].as_i64(), Some(53));
    assert_eq!(
        egress[1]["to"][0]["ipBlock"]["except"][0].as_str(),
        Some("169.254.0.0/16")
    );
    assert!(find(&d, "PodDisruptionBudget", "rel-agentbox-proxy").is_some());

    // A fixed ClusterIP: sandboxes need no DNS to find the proxy.
    let fixed = docs(&template(&["egressProxy.service.clusterIP=10.96.0.20"]));
    assert_eq!(
        env_value(&fixed, "AGENTBOX_EGRESS_PROXY_URL").as_deref(),
        Some("http://10.96.0.20:3128")
    );
    // The limits and names are the administrator's.
    let tuned = docs(&template(&[
        "egressProxy.maxPerSandbox=32",
        "egressProxy.replicas=1",
        "egressProxy.staticHosts={mirror.internal=10.1.2.3}",
        "egressProxy.clusterCIDRs={10.244.0.0/16}",
    ]));
    let tdep = find(&tuned, "Deployment", "rel-agentbox-proxy").unwrap();
    let targs =
        serde_json::to_string(&tdep["spec"]["template"]["spec"]["containers"][0]["args"]).unwrap();
    for want in [
        "--max-per-sandbox=32",
        "--static-host=mirror.internal=10.1.2.3",
        "--cluster-cidr=10.244.0.0/16",
    ] {
        assert!(targs.contains(want), "{want} not in {targs}");
    }
    assert!(find(&tuned, "PodDisruptionBudget", "rel-agentbox-proxy").is_none());
    // With a watched namespace elsewhere, the release namespace's Role lets the operator watch
    // the proxy's pods (it execs into them already).
    let scoped = docs(&template(&["watchNamespace=team-a"]));
    let role = find(&scoped, "Role", "rel-agentbox-helpers").expect("the helpers Role");
    assert!(
        rules_of(role)
            .iter()
            .any(|(_, r, v)| r == "pods" && v == "watch"),
        "{:?}",
        rules_of(role)
    );

    // Off: no proxy objects, no proxy for the operator.
    let off = docs(&template(&["egressProxy.enabled=false"]));
    assert!(find(&off, "Deployment", "rel-agentbox-proxy").is_none());
    assert!(find(&off, "NetworkPolicy", "rel-agentbox-proxy").is_none());
    assert_eq!(env_value(&off, "AGENTBOX_EGRESS_PROXY_URL"), None);
}
