//! `templates`: the namespace's SandboxTemplates, as a table or as the API's objects.

use std::process::ExitCode;

use clap::Args;
use k8s_openapi::jiff::Timestamp;

use super::Fail;
use super::get::{Column, Output, created_age, list_value, or_dash, table};
use crate::client::Sandboxes;
use crate::crd::SandboxTemplate;

#[derive(Args)]
pub(super) struct TemplatesArgs {
    /// Output format: json or yaml (default, and with wide: a table).
    #[arg(short, long, value_enum)]
    output: Option<Output>,
}

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
                crate::crd::Egress::All => "All".into(),
                crate::crd::Egress::Denied => "None".into(),
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

/// The text to print for `items`.
fn render(
    items: &[SandboxTemplate],
    output: Option<Output>,
    now: Timestamp,
) -> Result<String, Fail> {
    match output {
        Some(Output::Json) => Ok(serde_json::to_string_pretty(&list_value(items)?)? + "\n"),
        Some(Output::Yaml) => Ok(serde_yaml::to_string(&list_value(items)?)?),
        Some(Output::Wide) | None => Ok(table(&columns(), items, now)),
    }
}

/// `agentbox templates`.
pub(super) async fn templates(sbx: &Sandboxes, a: &TemplatesArgs) -> Result<ExitCode, Fail> {
    let items = sbx.templates().await?;
    print!("{}", render(&items, a.output, Timestamp::now())?);
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let out = render(std::slice::from_ref(&t), None, now).unwrap();
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
            serde_json::from_str(&render(&[t], Some(Output::Json), now).unwrap()).unwrap();
        assert_eq!(json["kind"], "List");
        assert_eq!(json["items"][0]["spec"]["image"], "busybox:1.37");
    }
}
