//! Names that refer to other Kubernetes objects, checked as the API server checks them.
//!
//! A reference in a spec (a snapshot's `sandboxRef.name`, a file's `configMapKeyRef`, a
//! `runtimeClassName`, ...) becomes part of a request path when the operator reads the object
//! (kube does not escape names), so a name with `/` or `..` in it would make the operator ask
//! for something else. The CRD refuses such names at admission with the CEL rules below; the
//! controllers check again with [`is_object_name`] before they build a request, in case the CRD
//! installed is older than the operator.

/// Longest DNS-1123 subdomain, the name of most Kubernetes objects.
pub const MAX_OBJECT_NAME: usize = 253;

/// CEL rule: the value is a DNS-1123 subdomain (lowercase alphanumerics, `-` and `.`, starting
/// and ending with an alphanumeric; the length is bounded by the schema). `[.]` avoids a
/// backslash escape that would have to survive three quoting layers.
pub const OBJECT_NAME_RULE: &str =
    "self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')";
/// The message of [`OBJECT_NAME_RULE`].
pub const OBJECT_NAME_MESSAGE: &str = "must be a Kubernetes object name: lowercase letters, digits, '-' and '.', starting and ending with a letter or digit";

/// CEL rule: the value is a ConfigMap or Secret key (`[-._a-zA-Z0-9]+`).
pub const DATA_KEY_RULE: &str = "self.matches('^[-._a-zA-Z0-9]+$')";
/// The message of [`DATA_KEY_RULE`].
pub const DATA_KEY_MESSAGE: &str =
    "must be a ConfigMap or Secret key: letters, digits, '-', '_' and '.'";

/// Whether `s` is a DNS-1123 subdomain: at most 253 characters of lowercase alphanumerics, `-`
/// and `.`, each dot-separated part starting and ending with an alphanumeric.
pub fn is_object_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_OBJECT_NAME
        && s.split('.').all(|part| {
            let b = part.as_bytes();
            !b.is_empty()
                && b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        })
}

/// Whether `s` is a valid ConfigMap or Secret key: 1 to 253 characters of `[-._a-zA-Z0-9]`,
/// and not `.` or `..`.
pub fn is_data_key(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_OBJECT_NAME
        && s != "."
        && s != ".."
        && s.bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// Whether `s` looks like a capability name as Kubernetes writes them: upper-case letters,
/// digits and `_`, starting with a letter, at most 32 characters, without the `CAP_` prefix.
pub fn is_capability_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 32
        && b[0].is_ascii_uppercase()
        && b.iter()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == b'_')
        && !s.starts_with("CAP_")
}

/// Why a reference is refused, for a condition message: `what` (e.g. `snapshot.name`) and the
/// value, quoted.
pub fn refusal(what: &str, value: &str) -> String {
    format!("{what} {value:?} {OBJECT_NAME_MESSAGE}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_names_are_dns_subdomains() {
        for ok in ["a", "sbx-1", "my.snapshot-2", "0abc", &"a".repeat(253)] {
            assert!(is_object_name(ok), "{ok:?}");
        }
        for bad in [
            "",
            "A",
            "-a",
            "a-",
            "a..b",
            ".a",
            "a/b",
            "../secrets/x",
            "a?watch=1",
            "a b",
            "a_b",
            &"a".repeat(254),
        ] {
            assert!(!is_object_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn data_keys() {
        for ok in ["settings.json", "A_b-c", ".hidden"] {
            assert!(is_data_key(ok), "{ok:?}");
        }
        for bad in ["", ".", "..", "a/b", "a b"] {
            assert!(!is_data_key(bad), "{bad:?}");
        }
    }

    #[test]
    fn capability_names() {
        for ok in ["NET_RAW", "SYS_PTRACE", "CHOWN"] {
            assert!(is_capability_name(ok), "{ok:?}");
        }
        for bad in [
            "",
            "net_raw",
            "CAP_NET_RAW",
            "NET RAW",
            "1X",
            &"A".repeat(33),
        ] {
            assert!(!is_capability_name(bad), "{bad:?}");
        }
    }

    /// The CEL rule and the code agree (the rule is evaluated by kube's CEL interpreter, the
    /// same language the API server runs).
    #[test]
    fn the_cel_rule_agrees_with_the_code() {
        let validate = |schema: &serde_json::Value, v: &serde_json::Value, old| {
            kube::core::cel::Validator::new().validate(schema, v, old)
        };
        let schema = serde_json::json!({
            "type": "object",
            "properties": {"n": {"type": "string", "maxLength": 253,
                "x-kubernetes-validations": [{"rule": OBJECT_NAME_RULE}]},
                "k": {"type": "string", "maxLength": 253,
                "x-kubernetes-validations": [{"rule": DATA_KEY_RULE}]}},
        });
        for n in [
            "a", "sbx-1", "my.snap", "A", "a/b", "../x", "a..b", "-a", "a_b",
        ] {
            let v = serde_json::json!({"n": n});
            assert_eq!(
                validate(&schema, &v, None).is_ok(),
                is_object_name(n),
                "{n:?}"
            );
        }
        for k in ["a.json", "A_b", "a/b", "a b"] {
            let v = serde_json::json!({"k": k});
            assert_eq!(validate(&schema, &v, None).is_ok(), is_data_key(k), "{k:?}");
        }
    }
}
