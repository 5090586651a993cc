//! `get` and `list`: one sandbox, or the sandboxes of a scope, as a table.

use std::process::ExitCode;

use super::{Fail, ScopeFlags, Target, open};
use crate::client::Sandboxes;

/// `agentbox get`.
pub(super) async fn get(sbx: &Sandboxes, t: &Target) -> Result<ExitCode, Fail> {
    let h = open(sbx, t).await?;
    print_sandboxes(&[h.sandbox().clone()]);
    print_endpoints(h.endpoints());
    Ok(ExitCode::SUCCESS)
}

/// The exposed ports of one sandbox (`spec.ports` → `status.endpoints`), after a blank line;
/// nothing for a sandbox without ports.
fn print_endpoints(endpoints: &[crate::crd::PortEndpoint]) {
    if endpoints.is_empty() {
        return;
    }
    println!();
    println!(
        "{:<16} {:>6} {:<8} {:<50} POD-IP",
        "PORT", "NUMBER", "PROTOCOL", "HOST"
    );
    for e in endpoints {
        println!(
            "{:<16} {:>6} {:<8} {:<50} {}",
            e.name,
            e.port,
            e.protocol.as_str(),
            e.host,
            e.pod_ip.as_deref().unwrap_or("-"),
        );
    }
}

/// `agentbox list`.
pub(super) async fn list(sbx: &Sandboxes, scope: &ScopeFlags) -> Result<ExitCode, Fail> {
    let selector = list_selector(scope)?;
    let items = sbx.list(selector.as_deref()).await?;
    print_sandboxes(&items);
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
        return Ok(Some(crate::labels::scope_selector(&scope)));
    }
    let mut parts = Vec::new();
    for (key, v) in [
        (crate::labels::AGENT, &f.agent),
        (crate::labels::USER, &f.user),
        (crate::labels::SESSION, &f.session),
    ] {
        if let Some(v) = v {
            if !crate::labels::is_valid_label_value(v) {
                return Err(Fail(format!(
                    "{v:?} is not a label value; give --kind and all ids to match by scope key"
                )));
            }
            parts.push(format!("{key}={v}"));
        }
    }
    Ok(Some(parts.join(",")))
}

/// Prints sandboxes as a table.
pub(super) fn print_sandboxes(items: &[crate::crd::Sandbox]) {
    println!(
        "{:<40} {:<13} {:<8} {:<30} SCOPE-KEY",
        "NAME", "PHASE", "SCOPE", "POD"
    );
    for s in items {
        let st = s.status.clone().unwrap_or_default();
        println!(
            "{:<40} {:<13} {:<8} {:<30} {}",
            s.metadata.name.as_deref().unwrap_or(""),
            st.phase.map(|p| p.as_str()).unwrap_or("-"),
            s.spec.scope.kind.label_value(),
            st.pod_name.as_deref().unwrap_or("-"),
            st.scope_key.as_deref().unwrap_or("-"),
        );
    }
}
