//! Credentials of `network.allow` domain entries (issue 46): which Secret key the egress proxy
//! may add as a header for which domain. The Secret says where it may go: its owner lists the
//! domains in the annotation [`DOMAINS`] (exact names, or `*.` wildcards for any name strictly
//! below), so a Sandbox's author cannot point a key at a host of their own. The decision is
//! [`decide`] (pure); the operator reads Secrets by name only (RBAC `get` on `secrets`, no
//! list or watch), refuses a Sandbox whose credential does not pass before it makes a pod
//! (condition and Warning Event `CredentialRefused`, naming the Secret, key and domain, never
//! the value), and writes the values that pass into the proxy's table over exec stdin.

use std::collections::HashMap;
use std::fmt;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::{Client, ResourceExt};

use crate::controller::context::{Context, Error};
use agentbox_api::crd::{EgressCredential, Network, Sandbox};
use agentbox_api::names;
use agentbox_proxy::credential::{self, BadValue, Credential, SecretValue};

/// The Secret annotation that lists the domains its keys may be sent to.
pub const DOMAINS: &str = "agentbox.dev/credential-domains";

/// What [`decide`] needs of a Secret (no more of it is kept).
#[derive(Clone, PartialEq, Eq)]
pub struct SecretFacts {
    /// The annotation [`DOMAINS`], if set.
    pub domains: Option<String>,
    /// The key's value, if the Secret has the key.
    pub value: Option<Vec<u8>>,
}

impl fmt::Debug for SecretFacts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretFacts")
            .field("domains", &self.domains)
            .field("value", &self.value.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl SecretFacts {
    /// The facts of `secret` for `key`.
    pub fn of(secret: &Secret, key: &str) -> SecretFacts {
        SecretFacts {
            domains: secret.annotations().get(DOMAINS).cloned(),
            value: secret
                .data
                .as_ref()
                .and_then(|d| d.get(key))
                .map(|b| b.0.clone()),
        }
    }
}

/// Why a credential is refused. Every message names the Secret, key or domain, and says the
/// fix; none holds any part of a value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The entry's domain is a wildcard (the API server's rule, repeated: an older CRD).
    #[error("network.allow {domain}: a credential goes with an exact domain, not a wildcard")]
    Wildcard {
        /// The entry's domain.
        domain: String,
    },
    /// The header's name is not one the proxy may set.
    #[error("network.allow {domain}: {header:?} cannot be a credential's header")]
    Header {
        /// The entry's domain.
        domain: String,
        /// The header named.
        header: String,
    },
    /// A name that is no object name or key (it would change the request's path).
    #[error("network.allow {domain}: {why}")]
    Name {
        /// The entry's domain.
        domain: String,
        /// What is wrong.
        why: String,
    },
    /// The Secret does not exist.
    #[error("network.allow {domain}: Secret {secret} not found")]
    SecretMissing {
        /// The entry's domain.
        domain: String,
        /// The Secret.
        secret: String,
    },
    /// The Secret has no annotation: its owner has not said it may be sent anywhere.
    #[error(
        "network.allow {domain}: Secret {secret} has no annotation {DOMAINS}; whoever owns it can allow the domain with `kubectl annotate secret {secret} {DOMAINS}={domain}`"
    )]
    NotForCredentials {
        /// The entry's domain.
        domain: String,
        /// The Secret.
        secret: String,
    },
    /// The Secret's annotation does not list the domain.
    #[error(
        "network.allow {domain}: Secret {secret} may be sent only to {allowed} (its annotation {DOMAINS}), not to {domain}"
    )]
    DomainNotAllowed {
        /// The entry's domain.
        domain: String,
        /// The Secret.
        secret: String,
        /// The annotation's domains.
        allowed: String,
    },
    /// The Secret has no such key.
    #[error("network.allow {domain}: Secret {secret} has no key {key}")]
    KeyMissing {
        /// The entry's domain.
        domain: String,
        /// The Secret.
        secret: String,
        /// The key.
        key: String,
    },
    /// The key's value cannot be a header's value.
    #[error("network.allow {domain}: Secret {secret} key {key}: {why}")]
    BadValue {
        /// The entry's domain.
        domain: String,
        /// The Secret.
        secret: String,
        /// The key.
        key: String,
        /// What is wrong (no part of the value).
        why: BadValue,
    },
}

/// Whether the annotation's list (comma-separated; exact names, or `*.` and a name for any
/// name strictly below it) allows `domain`.
pub fn annotation_allows(list: &str, domain: &str) -> bool {
    let domain = domain.trim_end_matches('.').to_ascii_lowercase();
    list.split(',')
        .map(|d| d.trim().trim_end_matches('.').to_ascii_lowercase())
        .filter(|d| !d.is_empty())
        .any(|d| match d.strip_prefix("*.") {
            Some(parent) if !parent.is_empty() => domain
                .strip_suffix(parent)
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
            Some(_) => false,
            None => d == domain,
        })
}

/// The credential the proxy may add for `domain` (pure): the Secret (`None` when it does not
/// exist) must list the domain in its annotation and have the key, whose value (one trailing
/// line break dropped: `kubectl create secret --from-file` keeps a file's last newline) must
/// be header text.
pub fn decide(
    domain: &str,
    cred: &EgressCredential,
    secret: Option<&SecretFacts>,
) -> Result<Credential, Refusal> {
    let d = || domain.to_string();
    let s = || cred.secret_name.clone();
    if domain.starts_with("*.") {
        return Err(Refusal::Wildcard { domain: d() });
    }
    let header = cred.header_or_default();
    // The CRD's rule (the clients check it too) and the proxy's own.
    if !agentbox_api::crd::is_credential_header(header) || !credential::header_name_ok(header) {
        return Err(Refusal::Header {
            domain: d(),
            header: header.to_string(),
        });
    }
    if !names::is_object_name(&cred.secret_name) {
        return Err(Refusal::Name {
            domain: d(),
            why: names::refusal("Secret name", &cred.secret_name),
        });
    }
    if !names::is_data_key(&cred.key) {
        return Err(Refusal::Name {
            domain: d(),
            why: names::refusal("Secret key", &cred.key),
        });
    }
    let Some(secret) = secret else {
        return Err(Refusal::SecretMissing {
            domain: d(),
            secret: s(),
        });
    };
    let Some(allowed) = secret.domains.as_deref() else {
        return Err(Refusal::NotForCredentials {
            domain: d(),
            secret: s(),
        });
    };
    if !annotation_allows(allowed, domain) {
        return Err(Refusal::DomainNotAllowed {
            domain: d(),
            secret: s(),
            allowed: allowed.to_string(),
        });
    }
    let Some(raw) = secret.value.as_deref() else {
        return Err(Refusal::KeyMissing {
            domain: d(),
            secret: s(),
            key: cred.key.clone(),
        });
    };
    let raw = raw
        .strip_suffix(b"\r\n")
        .or_else(|| raw.strip_suffix(b"\n"))
        .unwrap_or(raw);
    let bad = |why| Refusal::BadValue {
        domain: d(),
        secret: s(),
        key: cred.key.clone(),
        why,
    };
    let text = String::from_utf8(raw.to_vec()).map_err(|_| bad(BadValue::NotHeaderText))?;
    let value = SecretValue::new(text).map_err(bad)?;
    Ok(Credential {
        header: header.to_string(),
        value,
    })
}

/// The credentialed entries of a network: (domain, credential).
pub fn refs(network: &Network) -> Vec<(&str, &EgressCredential)> {
    network
        .allow
        .iter()
        .filter_map(|a| Some((a.domain.as_deref()?, a.credential.as_ref()?)))
        .collect()
}

/// Whether a Secret is one of credentials (annotated): such a Secret is never read for a
/// sandbox's files or environment, whatever its labels.
pub fn is_credential(secret: &Secret) -> bool {
    secret.annotations().contains_key(DOMAINS)
}

/// Checks every credential of the sandbox's network before its pod is made: a refusal is
/// [`Error::CredentialRefused`] (the caller records the condition and the Event).
pub async fn check(sbx: &Sandbox, network: &Network, ctx: &Context) -> Result<(), Error> {
    let refs = refs(network);
    if refs.is_empty() {
        return Ok(());
    }
    let ns = sbx.namespace().ok_or(Error::NotNamespaced)?;
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let mut read: HashMap<String, Option<Secret>> = HashMap::new();
    for (domain, cred) in refs {
        // Names are checked before they go into a request path.
        let secret = if names::is_object_name(&cred.secret_name) {
            if !read.contains_key(&cred.secret_name) {
                let got = secrets.get_opt(&cred.secret_name).await?;
                read.insert(cred.secret_name.clone(), got);
            }
            read.get(&cred.secret_name).and_then(Option::as_ref)
        } else {
            None
        };
        let facts = secret.map(|s| SecretFacts::of(s, &cred.key));
        decide(domain, cred, facts.as_ref())
            .map_err(|r| Error::CredentialRefused(r.to_string()))?;
    }
    Ok(())
}

/// How long the egress proxy's feeder keeps a Secret it read before it reads it again (so a
/// rotated key or an edited annotation reaches the proxy within this).
pub const REFRESH: Duration = Duration::from_secs(5);

/// The feeder's Secrets, read by name when a credential names them and again after
/// [`REFRESH`]; those no sandbox names any more are forgotten.
pub struct SecretCache {
    client: Client,
    held: HashMap<(String, String), (Instant, Option<Secret>)>,
}

impl SecretCache {
    /// An empty cache.
    pub fn new(client: Client) -> SecretCache {
        SecretCache {
            client,
            held: HashMap::new(),
        }
    }

    /// Reads what `wanted` (namespace, Secret) names and is not fresh, forgets the rest. A
    /// failed read keeps what was held (the proxy keeps its credential through an API
    /// server's hiccup), or holds nothing.
    pub async fn refresh(&mut self, wanted: &[(String, String)]) {
        self.held.retain(|k, _| wanted.contains(k));
        for (ns, name) in wanted {
            if !names::is_object_name(name) {
                continue;
            }
            let key = (ns.clone(), name.clone());
            if self
                .held
                .get(&key)
                .is_some_and(|(at, _)| at.elapsed() < REFRESH)
            {
                continue;
            }
            let api: Api<Secret> = Api::namespaced(self.client.clone(), ns);
            match api.get_opt(name).await {
                Ok(s) => {
                    self.held.insert(key, (Instant::now(), s));
                }
                Err(e) => {
                    tracing::warn!(namespace = %ns, secret = %name, "reading a credential's Secret: {e}");
                }
            }
        }
    }

    /// The facts of `key` of Secret `name` in `ns`, `None` when it does not exist (or was not
    /// read).
    pub fn facts(&self, ns: &str, name: &str, key: &str) -> Option<SecretFacts> {
        self.held
            .get(&(ns.to_string(), name.to_string()))
            .and_then(|(_, s)| s.as_ref())
            .map(|s| SecretFacts::of(s, key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_proxy_owns_the_headers_admission_refuses() {
        // Two crates, one list: a header admitted but owned by the proxy would be dropped at
        // the hop in silence, one refused but not owned would be refused for nothing.
        assert_eq!(
            agentbox_proxy::credential::RESERVED,
            agentbox_api::crd::PROXY_HEADERS
        );
    }

    fn cred(secret: &str, key: &str, header: Option<&str>) -> EgressCredential {
        EgressCredential {
            secret_name: secret.into(),
            key: key.into(),
            header: header.map(str::to_string),
        }
    }

    fn facts(domains: Option<&str>, value: Option<&[u8]>) -> SecretFacts {
        SecretFacts {
            domains: domains.map(str::to_string),
            value: value.map(<[u8]>::to_vec),
        }
    }

    #[test]
    fn the_annotation_lists_exact_names_and_wildcards_below() {
        let list = "api.example.com, *.example.org";
        assert!(annotation_allows(list, "api.example.com"));
        assert!(annotation_allows(list, "API.example.com."));
        assert!(annotation_allows(list, "a.example.org"));
        assert!(annotation_allows(list, "b.a.example.org"));
        assert!(!annotation_allows(list, "example.org"), "the parent");
        assert!(!annotation_allows(list, "xexample.org"));
        assert!(!annotation_allows(list, "evil.api.example.com"));
        assert!(!annotation_allows(list, "example.com"));
        assert!(!annotation_allows("*.", "a.b"));
        assert!(!annotation_allows("", "api.example.com"));
    }

    #[test]
    fn a_secret_that_allows_the_domain_gives_its_value_and_header() {
        let c = decide(
            "api.example.com",
            &cred("k", "token", None),
            Some(&facts(Some("api.example.com"), Some(b"Bearer sk-1\n"))),
        )
        .unwrap();
        assert_eq!(c.header, "Authorization");
        assert_eq!(
            serde_json::to_value(&c.value).unwrap(),
            serde_json::json!("Bearer sk-1"),
            "one trailing newline dropped"
        );
        let c = decide(
            "api.example.com",
            &cred("k", "token", Some("X-Api-Key")),
            Some(&facts(Some("*.example.com"), Some(b"sk-1"))),
        )
        .unwrap();
        assert_eq!(c.header, "X-Api-Key");
    }

    #[test]
    fn every_refusal_names_the_cause_and_never_the_value() {
        let secret_value: &[u8] = b"sk-must-not-show";
        let cases: Vec<(&str, EgressCredential, Option<SecretFacts>, &str)> = vec![
            (
                "api.example.com",
                cred("k", "token", None),
                None,
                "not found",
            ),
            (
                "api.example.com",
                cred("k", "token", None),
                Some(facts(None, Some(secret_value))),
                "has no annotation agentbox.dev/credential-domains",
            ),
            (
                "evil.example.net",
                cred("k", "token", None),
                Some(facts(Some("api.example.com"), Some(secret_value))),
                "may be sent only to api.example.com",
            ),
            (
                "api.example.com",
                cred("k", "other", None),
                Some(facts(Some("api.example.com"), None)),
                "has no key other",
            ),
            (
                "api.example.com",
                cred("k", "token", None),
                Some(facts(
                    Some("api.example.com"),
                    Some(b"sk-must-not-show\r\nX: y"),
                )),
                "not HTTP header text",
            ),
            (
                "*.example.com",
                cred("k", "token", None),
                Some(facts(Some("*.example.com"), Some(secret_value))),
                "exact domain",
            ),
            (
                "api.example.com",
                cred("k", "token", Some("Host")),
                Some(facts(Some("api.example.com"), Some(secret_value))),
                "cannot be a credential's header",
            ),
            (
                "api.example.com",
                cred("../k", "token", None),
                None,
                "Secret name",
            ),
        ];
        for (domain, c, f, says) in cases {
            let r = decide(domain, &c, f.as_ref()).unwrap_err();
            let msg = r.to_string();
            assert!(msg.contains(says), "{domain} {c:?}: {msg}");
            assert!(msg.contains(domain), "{msg}");
            assert!(!msg.contains("sk-must-not-show"), "{msg}");
            assert!(!format!("{r:?} {f:?}").contains("sk-must-not-show"));
        }
    }

    #[test]
    fn the_operator_refuses_what_the_clients_refuse() {
        // The clients check the CRD's rules (EgressCredential::fault, the vectors); the
        // operator checks again in decide (an older CRD): the two agree on every case.
        let allowed = facts(Some("api.example.com"), Some(b"v"));
        let cases = agentbox_api::vectors::vectors();
        let cases = cases["credentials"].as_array().expect("credential vectors");
        assert!(cases.len() > 10);
        for c in cases {
            let Some(domain) = c["domain"].as_str() else {
                continue; // a cidr entry: decide sees only domain entries
            };
            let cred = cred(
                c["secretName"].as_str().unwrap(),
                c["key"].as_str().unwrap(),
                c["header"].as_str(),
            );
            assert_eq!(
                decide(domain, &cred, Some(&allowed)).is_err(),
                !c["fault"].is_null(),
                "{c}"
            );
        }
    }

    #[test]
    fn refs_are_the_domain_entries_with_a_credential() {
        let n: Network =
            serde_json::from_value(serde_json::json!({"egress": "Allowlist", "allow": [
                {"domain": "api.example.com", "credential": {"secretName": "k", "key": "t"}},
                {"domain": "pypi.org"},
                {"cidr": "10.0.0.0/8"}
            ]}))
            .unwrap();
        let r = refs(&n);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].0, "api.example.com");
    }
}
