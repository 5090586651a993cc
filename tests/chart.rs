//! The Helm chart without a cluster: its CRDs are the generated ones, `helm lint --strict` and
//! `helm template` pass for the default and the notable value sets, every RBAC rule carries a
//! comment saying why, every value is documented, and the values reach the operator's env.

use std::process::Command;

mod common;
use common::{helm_bin, repo_root};

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
    let mut args = vec![
        "template",
        "rel",
        "charts/agentbox",
        "-n",
        "agentbox-system",
    ];
    for s in set {
        args.extend(["--set", s]);
    }
    helm(&args).unwrap_or_else(|e| panic!("helm template {set:?}: {e}"))
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

fn env_value(docs: &[serde_yaml::Value], name: &str) -> Option<String> {
    let dep = docs
        .iter()
        .find(|d| d["kind"].as_str() == Some("Deployment"))?;
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
    let chart = std::fs::read(repo_root().join("charts/agentbox/crds/agentbox.yaml"))
        .expect("charts/agentbox/crds/agentbox.yaml");
    assert!(
        generated == chart,
        "charts/agentbox/crds/agentbox.yaml differs from crds/agentbox.yaml: \
         cp crds/agentbox.yaml charts/agentbox/crds/agentbox.yaml"
    );
}

#[test]
fn helm_lint_and_template_are_clean() {
    let lint = helm(&["lint", "--strict", "charts/agentbox"]).expect("helm lint --strict");
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
        "unknownKey=1",
    ] {
        let r = helm(&["template", "rel", "charts/agentbox", "--set", bad]);
        assert!(r.is_err(), "{bad} should be refused");
    }
}

#[test]
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
    assert_eq!(cluster_rules.len(), 1, "only nodes get is cluster-wide");
    assert_eq!(cluster_rules[0]["resources"][0].as_str(), Some("nodes"));
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
    let image = d
        .iter()
        .find(|x| x["kind"].as_str() == Some("Deployment"))
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
    let dep = d
        .iter()
        .find(|x| x["kind"].as_str() == Some("Deployment"))
        .unwrap();
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
