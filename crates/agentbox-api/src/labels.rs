//! Scope keys, label and annotation keys, and the names agentbox derives for its objects.
//!
//! Label values are at most 63 characters of `[A-Za-z0-9._-]`; raw scope ids (emails, UUIDs,
//! free text) are not. So every object carries the scope kind and a hashed scope key as labels,
//! readable id labels only when the raw id happens to be a valid label value, and the raw ids
//! in annotations.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use crate::crd::{Scope, ScopeKind};

/// Label: scope kind (`session`, `user`, `agent`, `global`).
pub const SCOPE: &str = "agentbox.dev/scope";
/// Label: the scope key (see [`scope_key`]).
pub const SCOPE_KEY: &str = "agentbox.dev/scope-key";
/// Label: readable agent id, present only when the id is a valid label value.
pub const AGENT: &str = "agentbox.dev/agent";
/// Label: readable user id, present only when the id is a valid label value.
pub const USER: &str = "agentbox.dev/user";
/// Label: readable session id, present only when the id is a valid label value.
pub const SESSION: &str = "agentbox.dev/session";
/// Label: the Sandbox an object belongs to (its name, bounded to a label value).
pub const SANDBOX: &str = "agentbox.dev/sandbox";
/// Label: the standard managed-by label.
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Value of [`MANAGED_BY`] on everything agentbox makes.
pub const MANAGER: &str = "agentbox";

/// Label on a SandboxPool's pods: the pool (its name, bounded to a label value). A claimed
/// pod keeps it, so the pool's watch sees the claim and refills.
pub const POOL: &str = "agentbox.dev/pool";
/// Label on the pods made from a SandboxTemplate (a pool's warm pods, claimed or not, and the
/// pods of sandboxes that name it): the template (its name, bounded to a label value). The
/// template's egress NetworkPolicy selects them.
pub const TEMPLATE: &str = "agentbox.dev/template";
/// Label on a pool's pod while it is unclaimed: `"true"`. The pool counts and manages only
/// pods that carry it and whose controller owner is the pool; a claim removes it.
pub const WARM: &str = "agentbox.dev/warm";
/// Annotation on a warm pod: the host directory of its workspace
/// (`<nodeRoot>/<namespace>/warm-<suffix>`), which becomes the claiming Sandbox's workspace.
pub const WORKSPACE_HOST_DIR: &str = "agentbox.dev/workspace-host-dir";
/// Annotation on a warm pod: the operator's shape hash (`controller::pod::shape_hash`) of the spec it was made
/// from. A Sandbox adopts only a pod whose shape hash equals its own resolved spec's.
pub const POD_SHAPE_HASH: &str = "agentbox.dev/pod-shape-hash";
/// Annotation on a warm pod: `"true"` once its workspace directory is initialised (the
/// scope-free part of a start) and its container answered exec; see
/// the operator's `controller::pool::is_claimable`.
pub const WARM_READY: &str = "agentbox.dev/warm-ready";
/// Annotation on a warm pod, set with [`WARM_READY`]: `"true"` when its pool's initialisation
/// wrote the pool's marker (`remote::WARM_MARKER`) in its directory, so that a claim with
/// nothing to write runs no command. A warm pod without it (made by an operator before it)
/// gets the claiming sandbox's marker written, as before.
pub const WARM_MARKED: &str = "agentbox.dev/warm-marked";
/// Annotation on a warm pod: `metadata.generation` of the template it was made from.
pub const TEMPLATE_GENERATION: &str = "agentbox.dev/template-generation";
/// Prefix of a warm pod's workspace directory name (`warm-<5 lowercase alphanumerics>`).
pub const WARM_DIR_PREFIX: &str = "warm-";
/// Length of the random suffix of a warm pod's name and directory.
pub const WARM_SUFFIX_LEN: usize = 5;

/// Annotation: raw agent id.
pub const AGENT_ID: &str = "agentbox.dev/agent-id";
/// Annotation: raw user id.
pub const USER_ID: &str = "agentbox.dev/user-id";
/// Annotation: raw session id.
pub const SESSION_ID: &str = "agentbox.dev/session-id";

/// Hex characters of the scope key: 160 bits, so collisions are not a practical concern, and
/// short enough to sit inside names with a prefix.
pub const SCOPE_KEY_LEN: usize = 40;

/// Longest Kubernetes label value and DNS-1123 label (pod names used as hostnames).
pub const MAX_LABEL: usize = 63;

/// The scope key: hex SHA-256 over a versioned tag, the scope kind and each id, length-prefixed
/// so that no two different scopes hash the same input (`a`+`bc` vs `ab`+`c`), truncated to
/// [`SCOPE_KEY_LEN`]. Ids that the kind does not use are ignored, so the key depends only on what
/// identifies the scope.
pub fn scope_key(scope: &Scope) -> String {
    let mut h = Sha256::new();
    h.update(b"agentbox.dev/scope-key/v1\0");
    h.update(scope.kind.label_value().as_bytes());
    for id in scope_ids(scope) {
        match id {
            Some(v) => {
                h.update([1u8]);
                h.update((v.len() as u64).to_be_bytes());
                h.update(v.as_bytes());
            }
            None => h.update([0u8]),
        }
    }
    let mut key = hex::encode(h.finalize());
    key.truncate(SCOPE_KEY_LEN);
    key
}

/// The ids that identify a scope of its kind, in the order agent, user, session.
fn scope_ids(scope: &Scope) -> [Option<&str>; 3] {
    let agent = scope.agent.as_deref();
    match scope.kind {
        ScopeKind::Session => [agent, None, scope.session.as_deref()],
        ScopeKind::User => [agent, scope.user.as_deref(), None],
        ScopeKind::Agent => [agent, None, None],
        ScopeKind::Global => [None, None, None],
    }
}

/// Whether `v` is a valid Kubernetes label value: at most 63 characters, empty or starting and
/// ending with an alphanumeric, with `-`, `_`, `.` and alphanumerics between.
pub fn is_valid_label_value(v: &str) -> bool {
    if v.is_empty() {
        return true;
    }
    let b = v.as_bytes();
    b.len() <= MAX_LABEL
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// Labels every object of a scope carries: kind, key, and the readable ids that are valid
/// label values. An empty readable id is left out: it would match nothing useful.
pub fn scope_labels(scope: &Scope) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    labels.insert(SCOPE.to_string(), scope.kind.label_value().to_string());
    labels.insert(SCOPE_KEY.to_string(), scope_key(scope));
    labels.insert(MANAGED_BY.to_string(), MANAGER.to_string());
    let [agent, user, session] = scope_ids(scope);
    for (key, id) in [(AGENT, agent), (USER, user), (SESSION, session)] {
        if let Some(v) = id.filter(|v| !v.is_empty() && is_valid_label_value(v)) {
            labels.insert(key.to_string(), v.to_string());
        }
    }
    labels
}

/// Annotations holding the raw ids of a scope.
pub fn scope_annotations(scope: &Scope) -> BTreeMap<String, String> {
    let [agent, user, session] = scope_ids(scope);
    [(AGENT_ID, agent), (USER_ID, user), (SESSION_ID, session)]
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| (k.to_string(), v.to_string())))
        .collect()
}

/// A label selector string matching every object of a scope.
pub fn scope_selector(scope: &Scope) -> String {
    format!("{SCOPE_KEY}={}", scope_key(scope))
}

/// `base` itself when it fits in `max` characters; otherwise a prefix of it, a dash, and 16 hex
/// characters of its SHA-256, so that long names stay distinct and deterministic. The prefix is
/// trimmed of trailing `-`/`.` so the result stays a valid DNS label.
pub fn bounded_name(base: &str, max: usize) -> String {
    if base.len() <= max {
        return base.to_string();
    }
    let digest = hex::encode(Sha256::digest(base.as_bytes()));
    let keep = max.saturating_sub(17);
    // Names are ASCII (DNS-1123), so byte slicing is safe; guard anyway for arbitrary input.
    let mut prefix: String = base.chars().take(keep).collect();
    while prefix.ends_with(['-', '.']) {
        prefix.pop();
    }
    format!("{prefix}-{}", &digest[..16])
}

/// Deterministic Sandbox name for a scope, so that two harnesses racing to create the sandbox of
/// one scope create the same object and one of them gets a conflict instead of a duplicate.
pub fn sandbox_name_for_scope(scope: &Scope) -> String {
    format!("{}-{}", scope.kind.label_value(), &scope_key(scope)[..24])
}

/// Name of the pod of a sandbox (a DNS label, since it becomes the hostname).
pub fn pod_name(sandbox: &str) -> String {
    bounded_name(&format!("sbx-{sandbox}"), MAX_LABEL)
}

/// Value of the [`SANDBOX`] label for a sandbox name.
pub fn sandbox_label_value(sandbox: &str) -> String {
    bounded_name(sandbox, MAX_LABEL)
}

/// Value of the [`POOL`] label for a pool name.
pub fn pool_label_value(pool: &str) -> String {
    bounded_name(pool, MAX_LABEL)
}

/// Value of the [`TEMPLATE`] label for a template name.
pub fn template_label_value(template: &str) -> String {
    bounded_name(template, MAX_LABEL)
}

/// Name of a template's egress NetworkPolicy.
pub fn template_policy_name(template: &str) -> String {
    bounded_name(&format!("tpl-{template}-egress"), 253)
}

/// Name of a pool's warm pod with random `suffix`: `<pool>-warm-<suffix>`, the pool part cut
/// (and its dots made dashes) so that the name stays a DNS label.
pub fn warm_pod_name(pool: &str, suffix: &str) -> String {
    let tail = format!("-warm-{suffix}");
    let mut head: String = pool
        .chars()
        .map(|c| if c == '.' { '-' } else { c })
        .take(MAX_LABEL.saturating_sub(tail.len()))
        .collect();
    while head.ends_with('-') {
        head.pop();
    }
    format!("{head}{tail}")
}

/// Name of a warm pod's workspace directory (in its namespace's directory) for `suffix`.
pub fn warm_dir_name(suffix: &str) -> String {
    format!("{WARM_DIR_PREFIX}{suffix}")
}

/// Whether `name` is laid out like a warm pod's workspace directory: `warm-` and
/// [`WARM_SUFFIX_LEN`] lowercase alphanumerics.
pub fn is_warm_dir_name(name: &str) -> bool {
    name.strip_prefix(WARM_DIR_PREFIX).is_some_and(|s| {
        s.len() == WARM_SUFFIX_LEN
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    })
}

/// A random suffix for a warm pod's name and directory.
pub fn warm_suffix() -> String {
    use rand::Rng;
    const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut r = rand::rng();
    (0..WARM_SUFFIX_LEN)
        .map(|_| char::from(CHARS[r.random_range(0..CHARS.len())]))
        .collect()
}

/// Name of the NetworkPolicy that denies a sandbox's egress.
pub fn network_policy_name(sandbox: &str) -> String {
    bounded_name(&format!("sbx-{sandbox}-egress"), 253)
}

/// Name of the execution-guard Lease of a scope key.
pub fn lease_name(scope_key: &str) -> String {
    format!("agentbox-guard-{scope_key}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(
        kind: ScopeKind,
        agent: Option<&str>,
        user: Option<&str>,
        session: Option<&str>,
    ) -> Scope {
        Scope {
            kind,
            agent: agent.map(str::to_string),
            user: user.map(str::to_string),
            session: session.map(str::to_string),
        }
    }

    #[test]
    fn warm_pod_names_are_dns_labels_and_their_directories_are_recognised() {
        let s = warm_suffix();
        assert_eq!(s.len(), WARM_SUFFIX_LEN);
        assert!(is_warm_dir_name(&warm_dir_name(&s)));
        assert_eq!(warm_pod_name("py", "ab12c"), "py-warm-ab12c");
        let long = warm_pod_name(&format!("a.b{}", "x".repeat(300)), "ab12c");
        assert_eq!(long.len(), MAX_LABEL);
        assert!(long.starts_with("a-bx") && long.ends_with("-warm-ab12c"));
        assert!(is_valid_label_value(&long));
        assert_eq!(
            warm_pod_name(&format!("{}-", "y".repeat(51)), "ab12c").len(),
            62
        );
        for not in [
            "warm-",
            "warm-ABCDE",
            "warm-abcd",
            "warm-abcdef",
            "cold-abcde",
            "warm-ab.de",
        ] {
            assert!(!is_warm_dir_name(not), "{not}");
        }
        assert!(is_valid_label_value(&pool_label_value(&"p".repeat(253))));
    }

    #[test]
    fn scope_key_is_stable_hex_of_fixed_length() {
        let s = scope(ScopeKind::User, Some("coder"), Some("alice"), None);
        let k = scope_key(&s);
        assert_eq!(k.len(), SCOPE_KEY_LEN);
        assert!(
            k.bytes()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
        assert_eq!(k, scope_key(&s.clone()));
        assert!(is_valid_label_value(&k));
    }

    #[test]
    fn scope_key_separates_kinds_and_id_boundaries() {
        let a = scope(ScopeKind::User, Some("ab"), Some("c"), None);
        let b = scope(ScopeKind::User, Some("a"), Some("bc"), None);
        assert_ne!(scope_key(&a), scope_key(&b));
        let agent = scope(ScopeKind::Agent, Some("x"), None, None);
        let user_empty = scope(ScopeKind::User, Some("x"), Some(""), None);
        assert_ne!(scope_key(&agent), scope_key(&user_empty));
        let session = scope(ScopeKind::Session, Some("x"), None, Some("u"));
        let user = scope(ScopeKind::User, Some("x"), Some("u"), None);
        assert_ne!(scope_key(&session), scope_key(&user));
    }

    #[test]
    fn ids_the_kind_does_not_use_do_not_change_the_key() {
        let a = scope(ScopeKind::Agent, Some("x"), None, None);
        let b = scope(ScopeKind::Agent, Some("x"), Some("stray"), Some("stray"));
        assert_eq!(scope_key(&a), scope_key(&b));
        let g1 = scope(ScopeKind::Global, None, None, None);
        let g2 = scope(ScopeKind::Global, Some("x"), None, None);
        assert_eq!(scope_key(&g1), scope_key(&g2));
    }

    #[test]
    fn label_value_validity() {
        for ok in ["", "a", "alice", "a.b_c-d", "A1", &"x".repeat(63)] {
            assert!(is_valid_label_value(ok), "{ok:?} should be valid");
        }
        for bad in [
            "-a",
            "a-",
            ".a",
            "a.",
            "a b",
            "alice@example.com",
            "a/b",
            "ünï",
            "日本",
            &"x".repeat(64),
        ] {
            assert!(!is_valid_label_value(bad), "{bad:?} should be invalid");
        }
    }

    #[test]
    fn readable_labels_only_for_valid_values_and_raw_ids_in_annotations() {
        let s = scope(
            ScopeKind::Session,
            Some("coder"),
            None,
            Some("alice@example.com/1"),
        );
        let labels = scope_labels(&s);
        assert_eq!(labels.get(SCOPE).map(String::as_str), Some("session"));
        assert_eq!(labels.get(SCOPE_KEY), Some(&scope_key(&s)));
        assert_eq!(labels.get(AGENT).map(String::as_str), Some("coder"));
        assert!(!labels.contains_key(SESSION));
        assert!(!labels.contains_key(USER));
        assert!(labels.values().all(|v| is_valid_label_value(v)));
        let ann = scope_annotations(&s);
        assert_eq!(
            ann.get(SESSION_ID).map(String::as_str),
            Some("alice@example.com/1")
        );
        assert_eq!(ann.get(AGENT_ID).map(String::as_str), Some("coder"));
        assert!(!ann.contains_key(USER_ID));
    }

    #[test]
    fn long_and_unicode_ids_still_give_valid_labels() {
        let long = "u".repeat(253);
        let s = scope(ScopeKind::User, Some("ägent"), Some(&long), None);
        let labels = scope_labels(&s);
        assert!(!labels.contains_key(AGENT));
        assert!(!labels.contains_key(USER));
        assert!(labels.values().all(|v| is_valid_label_value(v)));
        assert_eq!(scope_annotations(&s).get(USER_ID), Some(&long));
    }

    #[test]
    fn readable_forms_that_collide_still_get_distinct_keys() {
        // Two ids whose readable label would be identical are told apart by the key.
        let a = scope(ScopeKind::User, Some("coder"), Some("alice"), None);
        let b = scope(ScopeKind::User, Some("coder"), Some("Alice"), None);
        assert_ne!(
            scope_labels(&a).get(SCOPE_KEY),
            scope_labels(&b).get(SCOPE_KEY)
        );
        assert_ne!(sandbox_name_for_scope(&a), sandbox_name_for_scope(&b));
    }

    #[test]
    fn names_are_bounded_deterministic_and_distinct() {
        let long_a = format!("{}a", "n".repeat(300));
        let long_b = format!("{}b", "n".repeat(300));
        let pa = pod_name(&long_a);
        assert_eq!(pa.len(), MAX_LABEL);
        assert_eq!(pa, pod_name(&long_a));
        assert_ne!(pa, pod_name(&long_b));
        assert_eq!(pod_name("short"), "sbx-short");
        assert!(sandbox_label_value(&long_a).len() <= MAX_LABEL);
        assert!(network_policy_name(&long_a).len() <= 253);
        // A prefix that would end in a dash is trimmed so the name stays a DNS label.
        let dashy = format!("{}-{}", "a".repeat(45), "b".repeat(40));
        let n = bounded_name(&dashy, MAX_LABEL);
        assert!(!n.contains("--"), "{n}");
        let s = scope(ScopeKind::Global, None, None, None);
        let name = sandbox_name_for_scope(&s);
        assert!(name.len() <= MAX_LABEL && name.starts_with("global-"));
        assert!(lease_name(&scope_key(&s)).len() <= MAX_LABEL);
    }
}
