//! Workspace paths, judged without the pod: the one confiner the controllers (spec paths) and
//! the clients (file operations) share. Pure string rules; symlinks are checked in the pod by
//! the scripts of [`crate::remote`].

/// Directory inside the workspace that belongs to the operator (marker, staging, temp files):
/// spec paths may not name it, and the scripts of [`crate::remote`] keep everything they
/// leave under it.
pub const STATE_DIR: &str = ".agentbox";

/// A path that may not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// The path has a `..` component.
    #[error("path {0:?} contains '..'")]
    DotDot(String),
    /// An absolute path outside the workspace root.
    #[error("path {0:?} is outside the workspace root {1:?}")]
    OutsideRoot(String, String),
    /// The path resolves (through a symlink) outside the workspace.
    #[error("path {0:?} resolves outside the workspace (symlink)")]
    Escapes(String),
    /// Empty, or contains NUL.
    #[error("invalid path {0:?}")]
    Invalid(String),
    /// Absolute where a path relative to the workspace root is asked for.
    #[error("path {0:?} must be relative to the workspace root")]
    Absolute(String),
    /// Inside the operator's state directory.
    #[error("path {0:?}: {STATE_DIR} is reserved for the operator")]
    Reserved(String),
}

/// The components of `path` without empty and `.` ones; `..` is refused anywhere (even where
/// it would stay inside, so that no reader has to resolve it).
fn components(path: &str) -> Result<Vec<&str>, PathError> {
    if path.contains('\0') {
        return Err(PathError::Invalid(path.to_string()));
    }
    let parts: Vec<&str> = path
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect();
    if parts.contains(&"..") {
        return Err(PathError::DotDot(path.to_string()));
    }
    Ok(parts)
}

/// Maps `path` (relative to `root`, or absolute under it) to an absolute, normalised path under
/// `root`, refusing `..` anywhere and absolute paths outside the root. `""` and `"."` are the
/// root itself. Used by the clients' file operations.
pub fn confine(root: &str, path: &str) -> Result<String, PathError> {
    if !root.starts_with('/') {
        return Err(PathError::Invalid(path.to_string()));
    }
    let root_parts = components(root).map_err(|_| PathError::Invalid(root.to_string()))?;
    let parts = components(path)?;
    let rel: &[&str] = if path.starts_with('/') {
        if parts.len() < root_parts.len() || parts[..root_parts.len()] != root_parts[..] {
            return Err(PathError::OutsideRoot(path.to_string(), root.to_string()));
        }
        &parts[root_parts.len()..]
    } else {
        &parts
    };
    let mut out = String::new();
    for c in root_parts.iter().chain(rel) {
        out.push('/');
        out.push_str(c);
    }
    if out.is_empty() {
        out.push('/');
    }
    Ok(out)
}

/// Checks a path a spec gives relative to the workspace root (files, projections, mounts) and
/// returns it normalised (`./a//b/` is `a/b`): not empty, not absolute, no `..`, not in the
/// operator's state directory. Used by the controllers' validation.
pub fn relative(path: &str) -> Result<String, PathError> {
    if path.starts_with('/') {
        return Err(PathError::Absolute(path.to_string()));
    }
    let parts = components(path)?;
    match parts.first() {
        None => Err(PathError::Invalid(path.to_string())),
        Some(&first) if first == STATE_DIR => Err(PathError::Reserved(path.to_string())),
        Some(_) => Ok(parts.join("/")),
    }
}

/// Normalises a path [`relative`] accepted: drops `./` and empty segments.
pub fn normalize(path: &str) -> String {
    path.split('/')
        .filter(|s| !s.is_empty() && *s != ".")
        .collect::<Vec<_>>()
        .join("/")
}

/// Whether `path` is absolute and has no `.` or `..` component (a workspace root, a host path).
pub fn is_clean_absolute(path: &str) -> bool {
    path.starts_with('/') && !path.split('/').skip(1).any(|s| s == "." || s == "..")
}

/// Whether `path` is `prefix` or lies beneath it (segment-wise: `/srv/ab` is not under `/srv/a`).
pub fn is_under(path: &str, prefix: &str) -> bool {
    let path = path.trim_end_matches('/');
    let prefix = prefix.trim_end_matches('/');
    path == prefix
        || path
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_join_the_root() {
        assert_eq!(
            confine("/workspace", "a/b.txt").unwrap(),
            "/workspace/a/b.txt"
        );
        assert_eq!(confine("/workspace", "./a//b/").unwrap(), "/workspace/a/b");
        assert_eq!(confine("/workspace", "").unwrap(), "/workspace");
        assert_eq!(confine("/workspace", ".").unwrap(), "/workspace");
        assert_eq!(confine("/", "etc").unwrap(), "/etc");
        assert_eq!(confine("/", "").unwrap(), "/");
    }

    #[test]
    fn dotdot_is_refused_everywhere() {
        for p in [
            "../x",
            "a/../../x",
            "a/..",
            "..",
            "/workspace/../etc",
            "a/../b",
        ] {
            assert!(
                matches!(confine("/workspace", p), Err(PathError::DotDot(_))),
                "{p}"
            );
            if !p.starts_with('/') {
                assert!(matches!(relative(p), Err(PathError::DotDot(_))), "{p}");
            }
        }
        // A name that merely contains dots is fine.
        assert_eq!(
            confine("/workspace", "..a/b..").unwrap(),
            "/workspace/..a/b.."
        );
        assert_eq!(relative("..a/b..").unwrap(), "..a/b..");
    }

    #[test]
    fn absolute_paths_must_be_under_the_root() {
        for p in ["/etc/passwd", "/workspace2/x", "/"] {
            assert!(
                matches!(confine("/workspace", p), Err(PathError::OutsideRoot(..))),
                "{p}"
            );
        }
        assert_eq!(
            confine("/workspace", "/workspace/x").unwrap(),
            "/workspace/x"
        );
        assert_eq!(confine("/workspace/", "/workspace").unwrap(), "/workspace");
        assert_eq!(confine("/w/s", "/w/s/t").unwrap(), "/w/s/t");
    }

    #[test]
    fn nul_and_relative_roots_are_invalid() {
        assert!(matches!(
            confine("/workspace", "a\0b"),
            Err(PathError::Invalid(_))
        ));
        assert!(matches!(
            confine("workspace", "a"),
            Err(PathError::Invalid(_))
        ));
        assert!(matches!(
            confine("/work/../space", "a"),
            Err(PathError::Invalid(_))
        ));
    }

    #[test]
    fn spec_paths_are_relative_outside_the_state_directory_and_normalised() {
        assert_eq!(relative("./a//b/").unwrap(), "a/b");
        assert_eq!(relative("a/./b").unwrap(), "a/b");
        assert!(matches!(relative("/etc/x"), Err(PathError::Absolute(_))));
        assert!(matches!(relative(""), Err(PathError::Invalid(_))));
        assert!(matches!(relative("./"), Err(PathError::Invalid(_))));
        assert!(matches!(relative("a\0"), Err(PathError::Invalid(_))));
        assert!(matches!(
            relative(".agentbox/marker"),
            Err(PathError::Reserved(_))
        ));
        assert!(matches!(
            relative("./.agentbox"),
            Err(PathError::Reserved(_))
        ));
        assert_eq!(relative("a/.agentbox").unwrap(), "a/.agentbox");
        assert_eq!(normalize("./a//b/"), "a/b");
    }

    #[test]
    fn clean_absolute_paths() {
        assert!(is_clean_absolute("/srv/data"));
        assert!(is_clean_absolute("/"));
        assert!(!is_clean_absolute("srv"));
        assert!(!is_clean_absolute("/srv/../etc"));
        assert!(!is_clean_absolute("/srv/./x"));
    }

    #[test]
    fn under_is_segment_wise() {
        assert!(is_under("/a/b", "/a"));
        assert!(is_under("/a", "/a/"));
        assert!(!is_under("/ab", "/a"));
        assert!(!is_under("/", "/a"));
    }
}
