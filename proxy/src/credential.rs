//! Credentials added at the hop: for a domain whose allowlist entry carries a credential, the
//! sandbox sends plain HTTP to the proxy (`http://api.example.com/...`), and the proxy opens
//! TLS to the server itself, verifies the server's certificate, sets the credential's header
//! (replacing any the sandbox sent) and relays the exchange. The value comes from the
//! operator's table (which it read from a Secret whose owner allowed that domain) and goes
//! nowhere else: not to another name, not over plain TCP, not into a log line or a metric.
//!
//! What the proxy refuses for a credentialed name: a CONNECT (the proxy could not add a header
//! inside the sandbox's own TLS, and passing the tunnel through would let the sandbox reach
//! the server without the proxy's checks of what it sends); a server whose certificate does
//! not verify for that name against the roots the proxy trusts.

use std::fmt;
use std::sync::Arc;

use rustls::pki_types::CertificateDer;
use serde::{Deserialize, Serialize};

/// A credential's value: only ever written into the upstream request. Its `Debug` prints
/// no part of it (tables and entries are Debug-printed in logs and test failures).
#[derive(Serialize, Deserialize, Clone, PartialEq, Eq)]
#[serde(transparent)]
pub struct SecretValue(String);

impl SecretValue {
    /// Wraps a value. Refused unless it can be an HTTP header's value (visible ASCII,
    /// spaces and tabs, no line break), so it cannot add headers of its own to a request.
    pub fn new(value: String) -> Result<SecretValue, BadValue> {
        if value.is_empty() {
            return Err(BadValue::Empty);
        }
        if !value
            .bytes()
            .all(|b| b == b'\t' || (b' '..=b'~').contains(&b))
        {
            return Err(BadValue::NotHeaderText);
        }
        Ok(SecretValue(value))
    }

    /// The value, for the one place that writes it: the upstream request.
    fn expose(&self) -> &str {
        &self.0
    }

    /// Whether it can be sent (a table's value is checked again: the table is a file).
    fn valid(&self) -> bool {
        SecretValue::new(self.0.clone()).is_ok()
    }
}

impl fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretValue(<redacted>)")
    }
}

/// Why a value cannot be a header's value (the message names no part of it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BadValue {
    /// Nothing to send.
    #[error("the value is empty")]
    Empty,
    /// A byte an HTTP header value cannot hold (a line break, a control or non-ASCII byte).
    #[error("the value is not HTTP header text (visible ASCII, spaces and tabs, no line break)")]
    NotHeaderText,
}

/// The credential of one domain entry, as the operator writes it into the table.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Credential {
    /// The header's name (`Authorization` by default in the Sandbox's spec).
    pub header: String,
    /// The header's value.
    pub value: SecretValue,
}

/// Header names the proxy owns: a credential never replaces them. The admission rule and the
/// clients refuse the same names (`agentbox_api::crd::PROXY_HEADERS`; this crate does not
/// depend on that one): the operator's unit tests hold the two lists equal.
pub const RESERVED: [&str; 8] = [
    "host",
    "connection",
    "content-length",
    "transfer-encoding",
    "keep-alive",
    "upgrade",
    "te",
    "trailer",
];

/// Whether `name` is an HTTP token the proxy may set as a credential's header.
pub fn header_name_ok(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
        && !RESERVED.contains(&lower.as_str())
        && !lower.starts_with("proxy-")
}

impl Credential {
    /// Whether the table's entry can be used (a bad one allows nothing for its name).
    pub fn usable(&self) -> bool {
        header_name_ok(&self.header) && self.value.valid()
    }
}

/// The upstream port for a request to `port`: 443 for HTTP's default 80 (the sandbox calls
/// `http://name/`), otherwise the same number (a server of TLS on another port).
pub fn upstream_port(port: u16) -> u16 {
    if port == 80 { 443 } else { port }
}

/// The request head sent upstream: the sandbox's request line and headers (without the
/// proxy's own, without any header of the credential's name), then the credential's header
/// and `Connection: close`. Pure: tested below without a network.
pub fn request_head(
    method: &str,
    path: &str,
    version: u8,
    headers: &[(String, String)],
    credential: &Credential,
) -> String {
    let mut out = format!("{method} {path} HTTP/1.{version}\r\n");
    for (name, value) in headers {
        let lower = name.to_ascii_lowercase();
        if lower.starts_with("proxy-")
            || lower == "connection"
            || lower == "keep-alive"
            || name.eq_ignore_ascii_case(&credential.header)
        {
            continue;
        }
        out.push_str(name);
        out.push_str(": ");
        out.push_str(value);
        out.push_str("\r\n");
    }
    out.push_str(&credential.header);
    out.push_str(": ");
    out.push_str(credential.value.expose());
    out.push_str("\r\nConnection: close\r\n\r\n");
    out
}

/// Errors of the proxy's TLS settings.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The extra CA bundle could not be read or holds no certificate.
    #[error("the upstream CA bundle {path}: {why}")]
    Bundle {
        /// The file.
        path: String,
        /// What is wrong with it.
        why: String,
    },
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}

/// Reads a PEM bundle of CA certificates (`--upstream-ca`).
pub fn read_bundle(path: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    use rustls::pki_types::pem::PemObject;
    let bad = |why: String| TlsError::Bundle {
        path: path.to_string(),
        why,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| bad(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(e.to_string()))?;
    if certs.is_empty() {
        return Err(bad("no certificate in it".into()));
    }
    Ok(certs)
}

/// The TLS client of credentialed requests: the Mozilla roots (compiled in) and `extra`,
/// HTTP/1.1 only, ring as the rest of the workspace.
pub fn client_config(
    extra: &[CertificateDer<'static>],
) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add_parsable_certificates(webpki_root_certs::TLS_SERVER_ROOT_CERTS.iter().cloned());
    for c in extra {
        roots.add(c.clone())?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cred(header: &str, value: &str) -> Credential {
        Credential {
            header: header.into(),
            value: SecretValue::new(value.into()).unwrap(),
        }
    }

    #[test]
    fn the_value_never_debug_prints() {
        let c = cred("Authorization", "Bearer sk-very-secret");
        let shown = format!("{c:?} {:?}", c.value);
        assert!(!shown.contains("sk-very-secret"), "{shown}");
        assert!(shown.contains("redacted"), "{shown}");
    }

    #[test]
    fn a_value_that_could_add_lines_is_refused() {
        assert_eq!(
            SecretValue::new("a\r\nX-Evil: 1".into()),
            Err(BadValue::NotHeaderText)
        );
        assert_eq!(SecretValue::new("a\n".into()), Err(BadValue::NotHeaderText));
        assert_eq!(SecretValue::new(String::new()), Err(BadValue::Empty));
        assert!(SecretValue::new("Bearer abc\t=".into()).is_ok());
    }

    #[test]
    fn the_header_replaces_the_sandboxs_and_the_proxys_own_go() {
        let headers = vec![
            ("Host".to_string(), "api.example.com".to_string()),
            (
                "authorization".to_string(),
                "Bearer sandbox-guess".to_string(),
            ),
            ("Proxy-Authorization".to_string(), "x".to_string()),
            ("Connection".to_string(), "keep-alive".to_string()),
            ("Accept".to_string(), "*/*".to_string()),
        ];
        let h = request_head(
            "GET",
            "/v1/models",
            1,
            &headers,
            &cred("Authorization", "Bearer k"),
        );
        assert_eq!(
            h,
            "GET /v1/models HTTP/1.1\r\nHost: api.example.com\r\nAccept: */*\r\nAuthorization: Bearer k\r\nConnection: close\r\n\r\n"
        );
    }

    #[test]
    fn header_names_are_tokens_the_proxy_does_not_own() {
        assert!(header_name_ok("Authorization"));
        assert!(header_name_ok("X-Api-Key"));
        for bad in [
            "",
            "Host",
            "content-length",
            "Proxy-Authorization",
            "A B",
            "A:B",
        ] {
            assert!(!header_name_ok(bad), "{bad}");
        }
    }

    #[test]
    fn port_80_becomes_443_and_others_stay() {
        assert_eq!(upstream_port(80), 443);
        assert_eq!(upstream_port(8443), 8443);
    }

    #[test]
    fn the_compiled_in_roots_load() {
        assert!(client_config(&[]).is_ok());
    }
}
