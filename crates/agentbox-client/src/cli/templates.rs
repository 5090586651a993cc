//! `templates`: the namespace's SandboxTemplates, as a table or as the API's objects.

use std::process::ExitCode;

use super::Fail;
use super::get::{Column, KindListArgs, created_age, or_dash, print_list};
use crate::client::Sandboxes;
use agentbox_api::crd::SandboxTemplate;

/// The columns: what `kubectl get sandboxtemplates` shows.
fn columns() -> Vec<Column<SandboxTemplate>> {
    vec![
        Column {
            header: "NAME",
            cell: |t, _| or_dash(t.metadata.name.as_deref()),
        },
        Column {
            header: "IMAGE",
            cell: |t, _| or_dash(t.spec.pod.image.as_deref()),
        },
        Column {
            header: "EGRESS",
            cell: |t, _| match t.spec.pod.network.egress {
                Some(agentbox_api::crd::Egress::All) => "All".into(),
                Some(agentbox_api::crd::Egress::Denied) => "None".into(),
                Some(agentbox_api::crd::Egress::Allowlist) => {
                    format!("Allowlist({})", t.spec.pod.network.allow.len())
                }
                None => "default".into(),
            },
        },
        Column {
            header: "IDLE-TIMEOUT",
            cell: |t, _| {
                t.spec
                    .lifecycle
                    .idle_timeout
                    .map_or_else(|| "-".into(), |d| d.to_string())
            },
        },
        Column {
            header: "AGE",
            cell: |t, now| created_age(&t.metadata, now),
        },
    ]
}

/// `agentbox templates`.
pub(super) async fn templates(sbx: &Sandboxes, a: &KindListArgs) -> Result<ExitCode, Fail> {
    print_list(&columns(), &sbx.templates().await?, a)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::get::{Output, render_list};
    use k8s_openapi::jiff::Timestamp;

    #[test]
    fn templates_show_their_image_egress_and_idle_timeout() {
        let t: SandboxTemplate = serde_json::from_value(serde_json::json!({
            "apiVersion": "agentbox.dev/v1alpha1", "kind": "SandboxTemplate",
            "metadata": {"name": "agent", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"image": "busybox:1.37", "network": {"egress": "None"},
                     "lifecycle": {"idleTimeout": "15m"}},
        }))
        .unwrap();
        let now: Timestamp = "2026-01-01T00:05:00Z".parse().unwrap();
        let out = render_list(&columns(), std::slice::from_ref(&t), None, now).unwrap();
        let lines: Vec<Vec<&str>> = out
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(
            lines,
            vec![
                vec!["NAME", "IMAGE", "EGRESS", "IDLE-TIMEOUT", "AGE"],
                vec!["agent", "busybox:1.37", "None", "900s", "5m"],
            ]
        );
        let json: serde_json::Value =
            serde_json::from_str(&render_list(&columns(), &[t], Some(Output::Json), now).unwrap())
                .unwrap();
        assert_eq!(json["kind"], "List");
        assert_eq!(json["items"][0]["spec"]["image"], "busybox:1.37");
    }
}
