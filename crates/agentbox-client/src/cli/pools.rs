//! `pools`: the namespace's SandboxPools, as a table or as the API's objects.

use std::process::ExitCode;

use super::Fail;
use super::get::{Column, KindListArgs, created_age, or_dash, print_list};
use crate::client::Sandboxes;
use agentbox_api::crd::SandboxPool;

/// The columns: name, template, desired and ready warm pods, the Ready condition's reason.
fn columns() -> Vec<Column<SandboxPool>> {
    vec![
        Column {
            header: "NAME",
            cell: |p, _| or_dash(p.metadata.name.as_deref()),
        },
        Column {
            header: "TEMPLATE",
            cell: |p, _| p.spec.template_ref.name.clone(),
        },
        Column {
            header: "DESIRED",
            cell: |p, _| p.spec.replicas.to_string(),
        },
        Column {
            header: "READY",
            cell: |p, _| {
                p.status
                    .as_ref()
                    .map_or(0, |s| s.ready_replicas)
                    .to_string()
            },
        },
        Column {
            header: "REASON",
            cell: |p, _| {
                let ready = p
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"));
                or_dash(ready.map(|c| c.reason.as_str()))
            },
        },
        Column {
            header: "AGE",
            cell: |p, now| created_age(&p.metadata, now),
        },
    ]
}

/// `agentbox pools`.
pub(super) async fn pools(sbx: &Sandboxes, a: &KindListArgs) -> Result<ExitCode, Fail> {
    print_list(&columns(), &sbx.pools().await?, a)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::get::{Output, render_list};
    use k8s_openapi::jiff::Timestamp;

    #[test]
    fn pools_show_their_template_desired_and_ready_counts() {
        let p: SandboxPool = serde_json::from_value(serde_json::json!({
            "apiVersion": "agentbox.dev/v1alpha1", "kind": "SandboxPool",
            "metadata": {"name": "py", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"templateRef": {"name": "agent"}, "replicas": 3},
            "status": {"replicas": 3, "readyReplicas": 2, "conditions": [{
                "type": "Ready", "status": "False", "reason": "Scaling", "message": "2 of 3",
                "lastTransitionTime": "2026-01-01T00:00:00Z"}]},
        }))
        .unwrap();
        let fresh: SandboxPool = serde_json::from_value(serde_json::json!({
            "apiVersion": "agentbox.dev/v1alpha1", "kind": "SandboxPool",
            "metadata": {"name": "new"},
            "spec": {"templateRef": {"name": "agent"}, "replicas": 1},
        }))
        .unwrap();
        let now: Timestamp = "2026-01-01T00:05:00Z".parse().unwrap();
        let out = render_list(&columns(), &[p.clone(), fresh], None, now).unwrap();
        let lines: Vec<Vec<&str>> = out
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(
            lines,
            vec![
                vec!["NAME", "TEMPLATE", "DESIRED", "READY", "REASON", "AGE"],
                vec!["py", "agent", "3", "2", "Scaling", "5m"],
                vec!["new", "agent", "1", "0", "-", "-"],
            ]
        );
        let yaml: serde_json::Value =
            serde_yaml::from_str(&render_list(&columns(), &[p], Some(Output::Yaml), now).unwrap())
                .unwrap();
        assert_eq!(yaml["items"][0]["spec"]["replicas"], 3);
    }
}
