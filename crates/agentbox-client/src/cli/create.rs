//! `create`: the sandbox of a scope, made from a SandboxTemplate (or an image), or the one
//! that exists already.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use super::get::print_sandboxes;
use super::{Fail, ScopeFlags};
use crate::client::Sandboxes;
use agentbox_api::crd::{
    CredentialFault, Egress, EgressAllow, EgressCredential, EgressPort, Network, PortProtocol,
    SandboxSpec, Scope,
};

#[derive(Args)]
pub(super) struct CreateArgs {
    #[command(flatten)]
    scope: ScopeFlags,
    /// The SandboxTemplate (in the namespace) to make the sandbox from.
    #[arg(long, conflicts_with = "image", required_unless_present = "image")]
    template: Option<String>,
    /// The image to run, for a sandbox without a template.
    #[arg(long)]
    image: Option<String>,
    /// What the sandbox may reach (a sandbox without a template): None, All or Allowlist.
    /// Unset: the cluster's default (None unless the administrator changed it); with --allow,
    /// Allowlist.
    #[arg(long, value_parser = ["None", "All", "Allowlist"], conflicts_with = "template")]
    egress: Option<String>,
    /// An allowed destination: CIDR, or CIDR:PORTS with PORTS a comma-separated list of
    /// ports or ranges (443, 8000-8010), each optionally /udp or /sctp; or a domain name
    /// (pypi.org, *.github.com, optionally :PORTS, TCP only) reached through the egress
    /// proxy. Repeatable.
    #[arg(long, value_name = "CIDR|DOMAIN[:PORTS]", conflicts_with = "template")]
    allow: Vec<String>,
    /// A credential the egress proxy adds for an --allow domain (exact name):
    /// DOMAIN=SECRET/KEY, optionally /HEADER (default Authorization). The sandbox calls
    /// http://DOMAIN/...; the proxy speaks TLS to the server and sets the header to the
    /// Secret key's value, which the sandbox never sees. The Secret's annotation
    /// agentbox.dev/credential-domains must allow DOMAIN. Repeatable.
    #[arg(
        long,
        value_name = "DOMAIN=SECRET/KEY[/HEADER]",
        conflicts_with = "template"
    )]
    credential: Vec<String>,
    /// Wait until it is Ready — at most this many seconds.
    #[arg(long, value_name = "SECONDS", num_args = 0..=1, default_missing_value = "120")]
    wait: Option<u64>,
}

/// One `--allow` value: `CIDR[:PORTS]` or `DOMAIN[:PORTS]` (a name such as pypi.org or
/// *.github.com, reached through the egress proxy).
fn parse_allow(v: &str) -> Result<EgressAllow, Fail> {
    let bad = |why: &str| Fail(format!("--allow {v:?}: {why}"));
    let (cidr, ports) = match v.split_once(':') {
        // An IPv6 block has colons of its own: its ports follow the last "]:" or none.
        Some(_) if v.contains("::") || v.matches(':').count() > 1 => match v.rsplit_once("]:") {
            Some((c, p)) => (c.trim_start_matches('['), Some(p)),
            None => (v.trim_start_matches('[').trim_end_matches(']'), None),
        },
        Some((c, p)) => (c, Some(p)),
        None => (v, None),
    };
    // A name (pypi.org, *.github.com) rather than an address: a domain entry, through the
    // egress proxy. The API server checks its form.
    let is_domain =
        !cidr.contains(['/', ':']) && cidr.contains(|c: char| c.is_ascii_alphabetic() || c == '*');
    if !cidr.contains('/') && !is_domain {
        return Err(bad(
            "the address block needs its prefix length, such as 10.0.0.0/8 or 192.0.2.7/32",
        ));
    }
    let mut out = Vec::new();
    for p in ports.unwrap_or("").split(',').filter(|p| !p.is_empty()) {
        let (range, proto) = match p.split_once('/') {
            Some((r, "tcp")) => (r, PortProtocol::Tcp),
            Some((r, "udp")) => (r, PortProtocol::Udp),
            Some((r, "sctp")) => (r, PortProtocol::Sctp),
            Some(_) => return Err(bad("a port's protocol is tcp, udp or sctp")),
            None => (p, PortProtocol::Tcp),
        };
        let num = |s: &str| match s.parse::<i32>() {
            Ok(n) if (1..=65535).contains(&n) => Ok(n),
            _ => Err(bad("ports are numbers from 1 to 65535")),
        };
        let (port, end_port) = match range.split_once('-') {
            Some((a, b)) => (num(a)?, Some(num(b)?)),
            None => (num(range)?, None),
        };
        out.push(EgressPort {
            port,
            end_port,
            protocol: proto,
        });
    }
    Ok(EgressAllow {
        cidr: (!is_domain).then(|| cidr.to_string()),
        domain: is_domain.then(|| cidr.to_string()),
        ports: out,
        credential: None,
    })
}

/// One `--credential` value: `DOMAIN=SECRET/KEY[/HEADER]`.
fn parse_credential(v: &str) -> Result<(String, EgressCredential), Fail> {
    let bad = |why: &str| Fail(format!("--credential {v:?}: {why}"));
    let (domain, rest) = v
        .split_once('=')
        .ok_or_else(|| bad("expected DOMAIN=SECRET/KEY[/HEADER]"))?;
    let mut parts = rest.split('/');
    let (Some(secret), Some(key)) = (parts.next(), parts.next()) else {
        return Err(bad("expected DOMAIN=SECRET/KEY[/HEADER]"));
    };
    let header = parts.next();
    if parts.next().is_some() || secret.is_empty() || key.is_empty() || header == Some("") {
        return Err(bad("expected DOMAIN=SECRET/KEY[/HEADER]"));
    }
    let cred = EgressCredential {
        secret_name: secret.to_string(),
        key: key.to_string(),
        header: header.map(str::to_string),
    };
    match cred.fault(Some(domain)) {
        None => Ok((domain.to_string(), cred)),
        Some(CredentialFault::Domain) => Err(bad(
            "a credential goes with an exact domain, not a wildcard (the key would go to every name below it)",
        )),
        Some(CredentialFault::SecretName) => Err(bad(&format!(
            "SECRET {}",
            agentbox_api::names::OBJECT_NAME_MESSAGE
        ))),
        Some(CredentialFault::Key) => Err(bad(
            "KEY must be a Secret key: letters, digits, '-', '_' and '.'",
        )),
        Some(CredentialFault::Header) => Err(bad(
            "HEADER must be an HTTP header name that is not Host, Connection, Content-Length, Transfer-Encoding, Keep-Alive, Upgrade, TE, Trailer or Proxy-*",
        )),
    }
}

/// The network of a sandbox without a template, from `--egress` and `--allow`.
fn network(a: &CreateArgs) -> Result<Network, Fail> {
    let mut allow = a
        .allow
        .iter()
        .map(|v| parse_allow(v))
        .collect::<Result<Vec<_>, _>>()?;
    for c in &a.credential {
        let (domain, cred) = parse_credential(c)?;
        let entry = allow
            .iter_mut()
            .find(|e| e.domain.as_deref() == Some(domain.as_str()))
            .ok_or_else(|| {
                Fail(format!(
                    "--credential {c:?}: no --allow names the domain {domain}"
                ))
            })?;
        entry.credential = Some(cred);
    }
    let egress = match (a.egress.as_deref(), allow.is_empty()) {
        (None, true) => None,
        (None | Some("Allowlist"), false) => Some(Egress::Allowlist),
        (Some("None"), true) => Some(Egress::Denied),
        (Some("All"), true) => Some(Egress::All),
        (Some("Allowlist"), true) => {
            return Err(Fail("--egress Allowlist needs at least one --allow".into()));
        }
        (Some(_), _) => {
            return Err(Fail(
                "--allow goes with --egress Allowlist (or no --egress)".into(),
            ));
        }
    };
    Ok(Network { egress, allow })
}

/// The spec `create` asks for: from the template, else from the image.
fn spec(a: &CreateArgs, scope: Scope) -> Result<SandboxSpec, Fail> {
    match (&a.template, &a.image) {
        (Some(t), _) => Ok(SandboxSpec::from_template(t, scope)),
        (None, Some(i)) => {
            let mut s = SandboxSpec::from_image(i, scope);
            s.pod.network = network(a)?;
            Ok(s)
        }
        (None, None) => Err(Fail("give --template or --image".into())),
    }
}

/// `agentbox create`.
pub(super) async fn create(sbx: &Sandboxes, a: CreateArgs) -> Result<ExitCode, Fail> {
    let scope = a.scope.scope()?;
    let mut h = sbx.get_or_create(&scope, spec(&a, scope.clone())?).await?;
    if let Some(secs) = a.wait {
        h.wait_ready(Duration::from_secs(secs)).await?;
    }
    print_sandboxes(&[h.sandbox().clone()]);
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentbox_api::crd::ScopeKind;

    fn args(template: Option<&str>, image: Option<&str>) -> CreateArgs {
        CreateArgs {
            scope: ScopeFlags::default(),
            template: template.map(String::from),
            image: image.map(String::from),
            egress: None,
            allow: Vec::new(),
            credential: Vec::new(),
            wait: None,
        }
    }

    fn global() -> Scope {
        Scope {
            kind: ScopeKind::Global,
            agent: None,
            user: None,
            session: None,
        }
    }

    #[test]
    fn a_template_gives_a_templated_spec_and_an_image_a_plain_one() {
        let s = spec(&args(Some("agent"), None), global()).unwrap();
        assert_eq!(s.template_ref.map(|r| r.name).as_deref(), Some("agent"));
        assert_eq!(s.pod.image, None, "the image is the template's");
        let s = spec(&args(None, Some("busybox")), global()).unwrap();
        assert_eq!(s.template_ref, None);
        assert_eq!(s.pod.image.as_deref(), Some("busybox"));
        assert!(spec(&args(None, None), global()).is_err());
    }

    #[test]
    fn allow_flags_make_an_allowlist_and_bad_ones_say_why() {
        let mut a = args(None, Some("busybox"));
        a.allow = vec!["10.0.0.0/8:443,8000-8010/udp".into(), "192.0.2.7/32".into()];
        let s = spec(&a, global()).unwrap();
        assert_eq!(s.pod.network.egress, Some(Egress::Allowlist));
        let allow = &s.pod.network.allow;
        assert_eq!(allow[0].cidr.as_deref(), Some("10.0.0.0/8"));
        assert_eq!(allow[0].ports[0].port, 443);
        assert_eq!(allow[0].ports[1].end_port, Some(8010));
        assert_eq!(allow[0].ports[1].protocol, PortProtocol::Udp);
        assert!(allow[1].ports.is_empty());
        a.allow = vec!["pypi.org:443".into(), "*.github.com".into()];
        let s = spec(&a, global()).unwrap();
        let allow = &s.pod.network.allow;
        assert_eq!(allow[0].domain.as_deref(), Some("pypi.org"));
        assert_eq!(
            (allow[0].cidr.as_deref(), allow[0].ports[0].port),
            (None, 443)
        );
        assert_eq!(allow[1].domain.as_deref(), Some("*.github.com"));
        a.allow = vec!["10.0.0.1:99999".into()];
        let e = spec(&a, global()).unwrap_err().0;
        assert!(e.contains("prefix length"), "{e}");
        a.allow = vec!["10.0.0.0/8:0".into()];
        assert!(spec(&a, global()).unwrap_err().0.contains("1 to 65535"));
        let mut n = args(None, Some("busybox"));
        n.egress = Some("All".into());
        assert_eq!(
            spec(&n, global()).unwrap().pod.network.egress,
            Some(Egress::All)
        );
        let plain = spec(&args(None, Some("busybox")), global()).unwrap();
        assert_eq!(plain.pod.network.egress, None, "the cluster's default");
    }

    #[test]
    fn credential_flags_attach_to_their_domain_entry() {
        let mut a = args(None, Some("busybox"));
        a.allow = vec!["api.example.com:443".into(), "pypi.org".into()];
        a.credential = vec!["api.example.com=model-key/token".into()];
        let s = spec(&a, global()).unwrap();
        let c = s.pod.network.allow[0].credential.as_ref().unwrap();
        assert_eq!(
            (c.secret_name.as_str(), c.key.as_str()),
            ("model-key", "token")
        );
        assert_eq!(c.header_or_default(), "Authorization");
        assert_eq!(s.pod.network.allow[1].credential, None);
        a.credential = vec!["api.example.com=model-key/token/X-Api-Key".into()];
        let s = spec(&a, global()).unwrap();
        let c = s.pod.network.allow[0].credential.as_ref().unwrap();
        assert_eq!(c.header_or_default(), "X-Api-Key");
        for (bad, says) in [
            ("other.example.com=k/t", "no --allow names"),
            ("api.example.com=k", "DOMAIN=SECRET/KEY"),
            ("api.example.com=k/t/h/x", "DOMAIN=SECRET/KEY"),
            ("*.example.com=k/t", "exact domain"),
            (
                "api.example.com=Model_Key/t",
                "SECRET must be a Kubernetes object name",
            ),
            ("api.example.com=k/..", "KEY must be a Secret key"),
            (
                "api.example.com=k/t/Host",
                "HEADER must be an HTTP header name",
            ),
            ("api.example.com=k/t/X Key", "HEADER must be"),
        ] {
            a.credential = vec![bad.into()];
            let e = spec(&a, global()).unwrap_err().0;
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
