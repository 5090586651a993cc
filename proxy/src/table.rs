//! The table file: the operator writes it into the proxy's pod (`agentbox-proxy write-table`
//! through the pod's exec, which only the operator's RBAC allows), the proxy reloads it when
//! it changes. Until the first table arrives every connection is refused.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::rules::Table;
use crate::server::Shared;

/// The largest table the proxy accepts.
pub const MAX_TABLE: u64 = 32 * 1024 * 1024;

/// Errors of reading or writing the table.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// Which file.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// The content is no table.
    #[error("the table is not valid: {0}")]
    Parse(#[from] serde_json::Error),
    /// The content is too large.
    #[error("the table is larger than {MAX_TABLE} bytes")]
    TooLarge,
}

/// Parses a table.
pub fn parse(bytes: &[u8]) -> Result<Table, Error> {
    if bytes.len() as u64 > MAX_TABLE {
        return Err(Error::TooLarge);
    }
    Ok(serde_json::from_slice(bytes)?)
}

/// Checks `bytes` and writes them to `path` atomically (a temporary file renamed over it), so
/// the proxy never reads half a table.
pub fn write(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    parse(bytes)?;
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

/// Reloads `path` into `shared` whenever its modification time or size changes, every
/// `every`. A table that does not parse is logged and the previous one kept.
pub async fn watch(path: PathBuf, shared: Arc<Shared>, every: Duration) {
    let mut seen: Option<(SystemTime, u64)> = None;
    loop {
        if let Ok(meta) = tokio::fs::metadata(&path).await {
            let stamp = (
                meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                meta.len(),
            );
            if seen != Some(stamp) {
                match tokio::fs::read(&path).await.map_err(|source| Error::Io {
                    path: path.clone(),
                    source,
                }) {
                    Ok(bytes) => match parse(&bytes) {
                        Ok(t) => {
                            shared.set_table(&t);
                            tracing::info!(sandboxes = t.sandboxes.len(), "table loaded");
                            seen = Some(stamp);
                        }
                        Err(e) => tracing::error!("{}: {e}", path.display()),
                    },
                    Err(e) => tracing::error!("{e}"),
                }
            }
        }
        tokio::time::sleep(every).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_is_written_whole_and_a_bad_one_not_at_all() {
        let dir = std::env::temp_dir().join(format!("abx-proxy-table-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("table.json");
        let good = br#"{"sandboxes": [{"ip": "10.0.0.1", "namespace": "n", "name": "s", "allow": [{"domain": "a.example", "ports": [[443, 443]]}]}]}"#;
        write(&p, good).unwrap();
        assert_eq!(
            parse(&std::fs::read(&p).unwrap()).unwrap().sandboxes.len(),
            1
        );
        assert!(matches!(
            write(&p, b"{\"sandboxes\": 3}"),
            Err(Error::Parse(_))
        ));
        assert_eq!(std::fs::read(&p).unwrap(), good, "the good table stays");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
