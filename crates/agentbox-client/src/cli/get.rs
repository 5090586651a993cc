//! `get` and `list`: one sandbox, or the sandboxes of a scope, as a table (`-o wide` with more
//! columns) or as the API's objects (`-o json|yaml`). What to print is decided by pure
//! functions ([`view`], [`render`]) so it is tested without a cluster.

use std::process::ExitCode;

use clap::{Args, ValueEnum};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::ListParams;

use super::{Fail, ScopeFlags, Target, open};
use crate::client::Sandboxes;
use agentbox_api::crd::{PortEndpoint, Sandbox};

/// `-o`: the output formats besides the default table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(super) enum Output {
    /// The object (or a `kind: List` of them) as JSON.
    Json,
    /// The object (or a `kind: List` of them) as YAML.
    Yaml,
    /// The table with more columns (pod, node, scope key).
    Wide,
}

#[derive(Args)]
pub(super) struct GetArgs {
    #[command(flatten)]
    target: Target,
    /// Output format: json, yaml or wide (default: a table).
    #[arg(short, long, value_enum)]
    output: Option<Output>,
}

#[derive(Args)]
pub(super) struct ListArgs {
    #[command(flatten)]
    scope: ScopeFlags,
    /// Output format: json, yaml or wide (default: a table).
    #[arg(short, long, value_enum)]
    output: Option<Output>,
    /// List the sandboxes of every namespace (ignores --namespace).
    #[arg(short = 'A', long)]
    all_namespaces: bool,
}

/// How sandboxes are shown, from the flags alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum View {
    /// A table; `wide` adds columns, `namespace` a first NAMESPACE column.
    Table {
        wide: bool,
        namespace: bool,
    },
    Json,
    Yaml,
}

/// The view for `-o` and `-A`: objects as the API has them, or a table that names the
/// namespace when it spans several.
fn view(output: Option<Output>, all_namespaces: bool) -> View {
    match output {
        Some(Output::Json) => View::Json,
        Some(Output::Yaml) => View::Yaml,
        wide => View::Table {
            wide: wide == Some(Output::Wide),
            namespace: all_namespaces,
        },
    }
}

/// What is shown: `get`'s one object, or `list`'s many (a `kind: List` in JSON and YAML, as
/// kubectl prints them).
#[derive(Clone, Copy)]
enum Shown<'a> {
    One(&'a Sandbox),
    Many(&'a [Sandbox]),
}

impl Shown<'_> {
    fn items(&self) -> &[Sandbox] {
        match self {
            Shown::One(s) => std::slice::from_ref(*s),
            Shown::Many(items) => items,
        }
    }

    fn to_value(self) -> Result<serde_json::Value, serde_json::Error> {
        match self {
            Shown::One(s) => serde_json::to_value(s),
            Shown::Many(items) => list_value(items),
        }
    }
}

/// Objects as a `kind: List`, as kubectl prints several in JSON and YAML.
pub(super) fn list_value<T: serde::Serialize>(
    items: &[T],
) -> Result<serde_json::Value, serde_json::Error> {
    Ok(serde_json::json!({
        "apiVersion": "v1",
        "kind": "List",
        "metadata": {"resourceVersion": ""},
        "items": serde_json::to_value(items)?,
    }))
}

/// The flags of a listing of one kind (`agentbox templates`, `agentbox pools`).
#[derive(Args)]
pub(super) struct KindListArgs {
    /// Output format: json or yaml (default, and with wide: a table).
    #[arg(short, long, value_enum)]
    output: Option<Output>,
}

/// Prints `items` as `a` asks.
pub(super) fn print_list<T: serde::Serialize>(
    columns: &[Column<T>],
    items: &[T],
    a: &KindListArgs,
) -> Result<std::process::ExitCode, Fail> {
    print!(
        "{}",
        render_list(columns, items, a.output, Timestamp::now())?
    );
    Ok(std::process::ExitCode::SUCCESS)
}

/// The text to print for a list of one kind: a `kind: List` in JSON or YAML, else a table
/// of `columns`.
pub(super) fn render_list<T: serde::Serialize>(
    columns: &[Column<T>],
    items: &[T],
    output: Option<Output>,
    now: Timestamp,
) -> Result<String, Fail> {
    match output {
        Some(Output::Json) => Ok(serde_json::to_string_pretty(&list_value(items)?)? + "\n"),
        Some(Output::Yaml) => Ok(serde_yaml::to_string(&list_value(items)?)?),
        Some(Output::Wide) | None => Ok(table(columns, items, now)),
    }
}

/// An object's age (since its `creationTimestamp`) as kubectl shows it, `-` without one.
pub(super) fn created_age(meta: &kube::api::ObjectMeta, now: Timestamp) -> String {
    meta.creation_timestamp
        .as_ref()
        .map_or_else(|| "-".into(), |t| age(t.0, now))
}

/// The text to print for `shown` in `view`, ages counted to `now`. A single sandbox's table
/// is followed by its endpoints.
fn render(shown: Shown<'_>, view: View, now: Timestamp) -> Result<String, Fail> {
    match view {
        View::Json => Ok(serde_json::to_string_pretty(&shown.to_value()?)? + "\n"),
        View::Yaml => Ok(serde_yaml::to_string(&shown.to_value()?)?),
        View::Table { wide, namespace } => {
            let mut out = table(&columns(wide, namespace), shown.items(), now);
            if let Shown::One(s) = shown {
                out.push_str(&endpoints(
                    s.status.as_ref().map_or(&[][..], |st| &st.endpoints),
                ));
            }
            Ok(out)
        }
    }
}

/// One column of a table: its header and how an object (a Sandbox by default) fills it.
pub(super) struct Column<T = Sandbox> {
    pub(super) header: &'static str,
    pub(super) cell: fn(&T, Timestamp) -> String,
}

pub(super) fn or_dash(s: Option<&str>) -> String {
    s.filter(|s| !s.is_empty()).unwrap_or("-").to_string()
}

fn status_field(
    s: &Sandbox,
    f: impl Fn(&agentbox_api::crd::SandboxStatus) -> Option<&str>,
) -> String {
    or_dash(s.status.as_ref().and_then(f))
}

/// The columns: NAME PHASE SCOPE AGE, after NAMESPACE with `-A`; `wide` adds where the
/// sandbox runs and its scope key.
fn columns(wide: bool, namespace: bool) -> Vec<Column> {
    let mut cols = Vec::new();
    if namespace {
        cols.push(Column::<Sandbox> {
            header: "NAMESPACE",
            cell: |s, _| or_dash(s.metadata.namespace.as_deref()),
        });
    }
    cols.extend([
        Column::<Sandbox> {
            header: "NAME",
            cell: |s, _| or_dash(s.metadata.name.as_deref()),
        },
        Column::<Sandbox> {
            header: "PHASE",
            cell: |s, _| status_field(s, |st| st.phase.map(|p| p.as_str())),
        },
        Column::<Sandbox> {
            header: "SCOPE",
            cell: |s, _| s.spec.scope.kind.label_value().to_string(),
        },
        Column::<Sandbox> {
            header: "AGE",
            cell: |s, now| created_age(&s.metadata, now),
        },
    ]);
    if wide {
        cols.extend([
            Column::<Sandbox> {
                header: "POD",
                cell: |s, _| status_field(s, |st| st.pod_name.as_deref()),
            },
            Column::<Sandbox> {
                header: "NODE",
                cell: |s, _| status_field(s, |st| st.node_name.as_deref()),
            },
            Column::<Sandbox> {
                header: "SCOPE-KEY",
                cell: |s, _| status_field(s, |st| st.scope_key.as_deref()),
            },
        ]);
    }
    cols
}

/// A table with a header row, columns as wide as their widest cell, three spaces apart (as
/// kubectl prints them).
pub(super) fn table<T>(cols: &[Column<T>], items: &[T], now: Timestamp) -> String {
    let rows: Vec<Vec<String>> = std::iter::once(cols.iter().map(|c| c.header.into()).collect())
        .chain(
            items
                .iter()
                .map(|s| cols.iter().map(|c| (c.cell)(s, now)).collect()),
        )
        .collect();
    let widths: Vec<usize> = (0..cols.len())
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in rows {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(line.join("   ").trim_end());
        out.push('\n');
    }
    out
}

/// An age as kubectl shows it: the largest unit only below two of the next (`90s`, `5m`,
/// `3h`, `12d`); `0s` for a clock behind the server's.
pub(super) fn age(created: Timestamp, now: Timestamp) -> String {
    let secs = now.as_second().saturating_sub(created.as_second()).max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 2 * 3600 => format!("{}m", s / 60),
        s if s < 2 * 86400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

/// The exposed ports of one sandbox (`spec.ports` → `status.endpoints`), after a blank line;
/// nothing for a sandbox without ports.
fn endpoints(endpoints: &[PortEndpoint]) -> String {
    if endpoints.is_empty() {
        return String::new();
    }
    let mut out = format!(
        "\n{:<16} {:>6} {:<8} {:<50} POD-IP\n",
        "PORT", "NUMBER", "PROTOCOL", "HOST"
    );
    for e in endpoints {
        out.push_str(&format!(
            "{:<16} {:>6} {:<8} {:<50} {}\n",
            e.name,
            e.port,
            e.protocol.as_str(),
            e.host,
            e.pod_ip.as_deref().unwrap_or("-"),
        ));
    }
    out
}

/// `agentbox get`.
pub(super) async fn get(sbx: &Sandboxes, a: &GetArgs) -> Result<ExitCode, Fail> {
    let h = open(sbx, &a.target).await?;
    let text = render(
        Shown::One(h.sandbox()),
        view(a.output, false),
        Timestamp::now(),
    )?;
    print!("{text}");
    Ok(ExitCode::SUCCESS)
}

/// Prints sandboxes as the default table (what `restore` shows of the sandbox it made).
pub(super) fn print_sandboxes(items: &[Sandbox]) {
    print!("{}", table(&columns(false, false), items, Timestamp::now()));
}

/// `agentbox list`.
pub(super) async fn list(
    client: &kube::Client,
    sbx: &Sandboxes,
    a: &ListArgs,
) -> Result<ExitCode, Fail> {
    let selector = list_selector(&a.scope)?;
    let items = if a.all_namespaces {
        let mut lp = ListParams::default();
        if let Some(s) = &selector {
            lp = lp.labels(s);
        }
        Api::<Sandbox>::all(client.clone()).list(&lp).await?.items
    } else {
        sbx.list(selector.as_deref()).await?
    };
    let text = render(
        Shown::Many(&items),
        view(a.output, a.all_namespaces),
        Timestamp::now(),
    )?;
    print!("{text}");
    Ok(ExitCode::SUCCESS)
}

/// A label selector for the scope flags given (only the readable id labels can be matched
/// without all ids; with a full scope the scope key is exact).
fn list_selector(f: &ScopeFlags) -> Result<Option<String>, Fail> {
    if f.is_empty() {
        return Ok(None);
    }
    if f.kind.is_some() {
        let scope = f.scope()?;
        return Ok(Some(agentbox_api::labels::scope_selector(&scope)));
    }
    let mut parts = Vec::new();
    for (key, v) in [
        (agentbox_api::labels::AGENT, &f.agent),
        (agentbox_api::labels::USER, &f.user),
        (agentbox_api::labels::SESSION, &f.session),
    ] {
        if let Some(v) = v {
            if !agentbox_api::labels::is_valid_label_value(v) {
                return Err(Fail(format!(
                    "{v:?} is not a label value; give --kind and all ids to match by scope key"
                )));
            }
            parts.push(format!("{key}={v}"));
        }
    }
    Ok(Some(parts.join(",")))
}

#[cfg(test)]
mod tests {
    use super::super::{Cli, Cmd, parse_from};
    use super::*;

    fn sandbox(name: &str, ns: &str, with_status: bool) -> Sandbox {
        let mut v = serde_json::json!({
            "apiVersion": "agentbox.dev/v1alpha1",
            "kind": "Sandbox",
            "metadata": {
                "name": name,
                "namespace": ns,
                "creationTimestamp": "2026-01-01T00:00:00Z",
            },
            "spec": {"image": "busybox", "scope": {"kind": "Session", "agent": "a", "user": "u", "session": "s"}},
        });
        if with_status {
            v["status"] = serde_json::json!({
                "phase": "Ready",
                "podName": format!("{name}-pod"),
                "nodeName": "node-1",
                "scopeKey": "abc123",
                "endpoints": [{"name": "http", "port": 8080, "protocol": "TCP", "host": "h.svc"}],
            });
        }
        serde_json::from_value(v).unwrap()
    }

    fn now() -> Timestamp {
        "2026-01-01T03:00:00Z".parse().unwrap()
    }

    fn headers(cols: &[Column]) -> Vec<&'static str> {
        cols.iter().map(|c| c.header).collect()
    }

    #[test]
    fn the_flags_choose_the_view() {
        let table = View::Table {
            wide: false,
            namespace: false,
        };
        assert_eq!(view(None, false), table);
        assert_eq!(
            view(Some(Output::Wide), true),
            View::Table {
                wide: true,
                namespace: true
            }
        );
        assert_eq!(view(Some(Output::Json), true), View::Json);
        assert_eq!(view(Some(Output::Yaml), false), View::Yaml);
    }

    #[test]
    fn wide_adds_where_it_runs_and_all_namespaces_adds_the_namespace() {
        assert_eq!(
            headers(&columns(false, false)),
            ["NAME", "PHASE", "SCOPE", "AGE"]
        );
        assert_eq!(
            headers(&columns(true, true)),
            [
                "NAMESPACE",
                "NAME",
                "PHASE",
                "SCOPE",
                "AGE",
                "POD",
                "NODE",
                "SCOPE-KEY"
            ]
        );
    }

    #[test]
    fn tables_align_their_columns_and_fill_the_cells() {
        let items = [
            sandbox("a", "ns1", true),
            sandbox("longer-name", "ns2", false),
        ];
        let out = render(Shown::Many(&items), view(Some(Output::Wide), true), now()).unwrap();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 3, "{out}");
        let cells = |l: &str| l.split_whitespace().map(String::from).collect::<Vec<_>>();
        assert_eq!(
            cells(lines[1]),
            [
                "ns1", "a", "Ready", "session", "3h", "a-pod", "node-1", "abc123"
            ]
        );
        assert_eq!(
            cells(lines[2]),
            ["ns2", "longer-name", "-", "session", "3h", "-", "-", "-"]
        );
        // Every column starts where its header does.
        let at = |l: &str, c: &str| l.find(c).unwrap();
        assert_eq!(at(lines[0], "PHASE"), at(lines[1], "Ready"));
        assert_eq!(at(lines[0], "PHASE"), at(lines[2], "-   "));
        assert_eq!(at(lines[0], "NODE"), at(lines[1], "node-1"));
        // A list's table has no endpoints; one sandbox's table does.
        assert!(!out.contains("h.svc"));
        let one = render(Shown::One(&items[0]), view(None, false), now()).unwrap();
        assert!(
            one.starts_with("NAME   PHASE   SCOPE     AGE\na      Ready   session   3h\n"),
            "{one}"
        );
        assert!(one.contains("http") && one.contains("h.svc"), "{one}");
    }

    #[test]
    fn json_and_yaml_are_the_objects_and_a_list_is_a_kind_list() {
        let items = [sandbox("a", "ns1", true), sandbox("b", "ns2", false)];
        let one: serde_json::Value =
            serde_json::from_str(&render(Shown::One(&items[0]), View::Json, now()).unwrap())
                .unwrap();
        assert_eq!(one["kind"], "Sandbox");
        assert_eq!(one["apiVersion"], "agentbox.dev/v1alpha1");
        assert_eq!(one["metadata"]["name"], "a");
        assert_eq!(one["status"]["nodeName"], "node-1");
        let list: serde_json::Value =
            serde_yaml::from_str(&render(Shown::Many(&items), View::Yaml, now()).unwrap()).unwrap();
        assert_eq!(list["kind"], "List");
        assert_eq!(list["apiVersion"], "v1");
        let names: Vec<&str> = list["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["metadata"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(list["items"][1]["kind"], "Sandbox");
        // An empty list is still a list.
        let empty: serde_json::Value =
            serde_json::from_str(&render(Shown::Many(&[]), View::Json, now()).unwrap()).unwrap();
        assert_eq!(empty["items"], serde_json::json!([]));
    }

    #[test]
    fn ages_use_the_largest_unit() {
        let t = |s: &str| s.parse::<Timestamp>().unwrap();
        let created = t("2026-01-01T00:00:00Z");
        assert_eq!(age(created, t("2026-01-01T00:01:59Z")), "119s");
        assert_eq!(age(created, t("2026-01-01T00:05:00Z")), "5m");
        assert_eq!(age(created, t("2026-01-01T03:00:00Z")), "3h");
        assert_eq!(age(created, t("2026-01-05T00:00:00Z")), "4d");
        assert_eq!(age(t("2026-01-02T00:00:00Z"), created), "0s", "clock skew");
    }

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        parse_from(std::iter::once("agentbox").chain(args.iter().copied()))
    }

    #[test]
    fn list_and_get_take_output_and_all_namespaces() {
        let Ok(Cli {
            cmd: Cmd::List(a), ..
        }) = parse(&["list", "-A", "-o", "json", "--agent", "x"])
        else {
            panic!("list parses");
        };
        assert!(a.all_namespaces);
        assert_eq!(a.output, Some(Output::Json));
        assert_eq!(a.scope.agent.as_deref(), Some("x"));
        let Ok(Cli {
            cmd: Cmd::Get(g), ..
        }) = parse(&["get", "box", "--output", "wide"])
        else {
            panic!("get parses");
        };
        assert_eq!(g.output, Some(Output::Wide));
        assert_eq!(g.target.name.as_deref(), Some("box"));
        let err = parse(&["list", "-o", "xml"]).err().unwrap();
        assert_eq!(err.kind(), clap::error::ErrorKind::InvalidValue);
        // -A is list's alone.
        assert!(parse(&["get", "box", "-A"]).is_err());
    }
}
