//! ConfigMaps and Secrets the operator reads on a Sandbox's behalf: workspace files
//! (`contentFrom`), projections, and environment variables taken from a key (`valueFrom`, which
//! the kubelet resolves once the operator has created the pod).
//!
//! The operator may read every ConfigMap and Secret of the namespaces it serves; a user who may
//! only create Sandboxes may not. So that creating a Sandbox is not a way around RBAC (a
//! confused deputy), the operator reads an object for a sandbox only when the object opts in
//! with the label [`READABLE`]` = "true"`, which only someone who may edit the object can set.
//! Everything else is refused with a condition and an Event that name the object and the fix.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::Api;
use kube::{Resource, ResourceExt};

use super::init_plan::{self, FileEntry, ResolvedProjection};
use crate::controller::context::{Context, Error};
use agentbox_api::crd::Sandbox;
use agentbox_api::names;

/// Label that lets sandboxes read a ConfigMap or Secret (value `"true"`).
pub const READABLE: &str = "agentbox.dev/sandbox-readable";

/// The kind of a source object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A ConfigMap.
    ConfigMap,
    /// A Secret.
    Secret,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::ConfigMap => "ConfigMap",
            Kind::Secret => "Secret",
        }
    }

    fn kubectl(self) -> &'static str {
        match self {
            Kind::ConfigMap => "configmap",
            Kind::Secret => "secret",
        }
    }
}

/// Whether an object's labels let sandboxes read it.
pub fn readable(labels: &BTreeMap<String, String>) -> bool {
    labels.get(READABLE).is_some_and(|v| v == "true")
}

/// The refusal for an object that has not opted in, naming it and the fix.
pub fn not_readable(used_by: &str, kind: Kind, name: &str) -> Error {
    Error::SourceNotReadable(format!(
        "{used_by}: {} {name} is not readable by sandboxes; whoever may edit it can allow that with `kubectl label {} {name} {READABLE}=true`",
        kind.as_str(),
        kind.kubectl()
    ))
}

/// An environment variable's reference to a ConfigMap or Secret key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvRef {
    /// The variable's name.
    pub var: String,
    /// ConfigMap or Secret.
    pub kind: Kind,
    /// The object's name.
    pub name: String,
    /// The variable may be left out when the object or key is missing.
    pub optional: bool,
}

/// The ConfigMap and Secret keys the sandbox's environment takes values from.
pub fn env_refs(sbx: &Sandbox) -> Vec<EnvRef> {
    sbx.spec
        .pod
        .env
        .iter()
        .filter_map(|e| {
            let from = e.value_from.as_ref()?;
            let (kind, name, optional) = if let Some(r) = &from.config_map_key_ref {
                (Kind::ConfigMap, r.name.clone(), r.optional)
            } else {
                let r = from.secret_key_ref.as_ref()?;
                (Kind::Secret, r.name.clone(), r.optional)
            };
            Some(EnvRef {
                var: e.name.clone(),
                kind,
                name,
                optional: optional.unwrap_or(false),
            })
        })
        .collect()
}

/// Reads source objects, each once, refusing those that have not opted in.
struct Reader {
    config_maps: Api<ConfigMap>,
    secrets: Api<Secret>,
    cm_cache: BTreeMap<String, Option<ConfigMap>>,
    secret_cache: BTreeMap<String, Option<Secret>>,
}

/// A source object as read.
enum Source<'a> {
    ConfigMap(&'a ConfigMap),
    Secret(&'a Secret),
}

impl Reader {
    fn new(ctx: &Context, ns: &str) -> Self {
        Reader {
            config_maps: Api::namespaced(ctx.client.clone(), ns),
            secrets: Api::namespaced(ctx.client.clone(), ns),
            cm_cache: BTreeMap::new(),
            secret_cache: BTreeMap::new(),
        }
    }

    /// The object, `None` when it does not exist; refused when its name is not an object name
    /// (it would change the request's path) or it has not opted in.
    async fn get(
        &mut self,
        used_by: &str,
        kind: Kind,
        name: &str,
    ) -> Result<Option<Source<'_>>, Error> {
        if !names::is_object_name(name) {
            return Err(Error::SourceMissing(format!(
                "{used_by}: {}",
                names::refusal(&format!("{} name", kind.as_str()), name)
            )));
        }
        let found = match kind {
            Kind::ConfigMap => cached(&self.config_maps, &mut self.cm_cache, name)
                .await?
                .map(Source::ConfigMap),
            Kind::Secret => cached(&self.secrets, &mut self.secret_cache, name)
                .await?
                .map(Source::Secret),
        };
        let labels = match &found {
            Some(Source::ConfigMap(o)) => o.labels(),
            Some(Source::Secret(o)) if crate::controller::credential::is_credential(o) => {
                // A Secret of credentials goes only to the egress proxy, for its domains:
                // never into a sandbox, whatever its labels say.
                return Err(Error::SourceNotReadable(format!(
                    "{used_by}: Secret {name} holds credentials for the egress proxy (annotation {}): a sandbox's files and environment cannot name it",
                    crate::controller::credential::DOMAINS
                )));
            }
            Some(Source::Secret(o)) => o.labels(),
            None => return Ok(None),
        };
        if !readable(labels) {
            return Err(not_readable(used_by, kind, name));
        }
        Ok(found)
    }
}

/// Reads an object once per reconcile: later references to it use the first read.
async fn cached<'a, K>(
    api: &Api<K>,
    cache: &'a mut BTreeMap<String, Option<K>>,
    name: &str,
) -> Result<Option<&'a K>, Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    if !cache.contains_key(name) {
        cache.insert(name.to_string(), api.get_opt(name).await?);
    }
    Ok(cache.get(name).and_then(Option::as_ref))
}

fn missing(used_by: &str, kind: Kind, name: &str) -> Error {
    Error::SourceMissing(format!("{used_by}: {} {name} not found", kind.as_str()))
}

fn config_map_value(cm: &ConfigMap, key: &str) -> Option<Vec<u8>> {
    cm.data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|s| s.clone().into_bytes())
        .or_else(|| {
            cm.binary_data
                .as_ref()
                .and_then(|d| d.get(key))
                .map(|b| b.0.clone())
        })
}

/// Reads every file's content: inline, or a ConfigMap/Secret key of an object that opted in.
pub async fn resolve_files(sbx: &Sandbox, ctx: &Context) -> Result<Vec<FileEntry>, Error> {
    let ns = sbx.namespace().ok_or(Error::NotNamespaced)?;
    let mut reader = Reader::new(ctx, &ns);
    let mut out = Vec::new();
    for f in &sbx.spec.workspace.files {
        let used_by = format!("file {:?}", f.path);
        let data = match (&f.content, &f.content_from) {
            (Some(c), _) => c.clone().into_bytes(),
            (None, Some(src)) => {
                let (kind, r) = match (&src.config_map_key_ref, &src.secret_key_ref) {
                    (Some(r), _) => (Kind::ConfigMap, r),
                    (None, Some(r)) => (Kind::Secret, r),
                    (None, None) => {
                        return Err(Error::SourceMissing(format!("{used_by} has no source")));
                    }
                };
                let value = match reader.get(&used_by, kind, &r.name).await? {
                    None => return Err(missing(&used_by, kind, &r.name)),
                    Some(Source::ConfigMap(cm)) => config_map_value(cm, &r.key),
                    Some(Source::Secret(s)) => s
                        .data
                        .as_ref()
                        .and_then(|d| d.get(&r.key))
                        .map(|b| b.0.clone()),
                };
                value.ok_or_else(|| {
                    Error::SourceMissing(format!(
                        "{used_by}: {} {} has no key {}",
                        kind.as_str(),
                        r.name,
                        r.key
                    ))
                })?
            }
            (None, None) => {
                return Err(Error::SourceMissing(format!("{used_by} has no content")));
            }
        };
        out.push(FileEntry {
            path: init_plan::normalize(&f.path),
            data,
            mode: f.mode.map_or(0o644, |m| (m & 0o777) as u32),
            ephemeral: f.ephemeral,
        });
    }
    Ok(out)
}

/// Reads every projected ConfigMap (each must have opted in), keys sorted.
pub async fn resolve_projections(
    sbx: &Sandbox,
    ctx: &Context,
) -> Result<Vec<ResolvedProjection>, Error> {
    let ns = sbx.namespace().ok_or(Error::NotNamespaced)?;
    let mut reader = Reader::new(ctx, &ns);
    let mut out = Vec::new();
    for p in &sbx.spec.workspace.projections {
        let used_by = format!("projection {:?}", p.path);
        let Some(Source::ConfigMap(cm)) =
            reader.get(&used_by, Kind::ConfigMap, &p.config_map).await?
        else {
            return Err(missing(&used_by, Kind::ConfigMap, &p.config_map));
        };
        let mut entries: Vec<(String, Vec<u8>)> = cm
            .data
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.into_bytes()))
            .chain(
                cm.binary_data
                    .clone()
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| (k, v.0)),
            )
            .collect();
        entries.sort();
        out.push(ResolvedProjection {
            config_map: p.config_map.clone(),
            dir: init_plan::normalize(&p.path),
            entries,
        });
    }
    Ok(out)
}

/// Checks that every object the sandbox's environment takes a value from has opted in, before
/// the operator creates the pod (after which the kubelet reads it, on the operator's word). A
/// missing object is refused too, unless the reference is optional.
pub async fn check_env(sbx: &Sandbox, ctx: &Context) -> Result<(), Error> {
    let refs = env_refs(sbx);
    if refs.is_empty() {
        return Ok(());
    }
    let ns = sbx.namespace().ok_or(Error::NotNamespaced)?;
    let mut reader = Reader::new(ctx, &ns);
    for r in refs {
        let used_by = format!("env {}", r.var);
        if reader.get(&used_by, r.kind, &r.name).await?.is_none() && !r.optional {
            return Err(missing(&used_by, r.kind, &r.name));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_opt_in_label_makes_an_object_readable() {
        let l = |k: &str, v: &str| BTreeMap::from([(k.to_string(), v.to_string())]);
        assert!(readable(&l(READABLE, "true")));
        assert!(!readable(&l(READABLE, "True")));
        assert!(!readable(&l(READABLE, "yes")));
        assert!(!readable(&l("agentbox.dev/sandbox", "true")));
        assert!(!readable(&BTreeMap::new()));
    }

    #[test]
    fn the_refusal_names_the_object_and_the_fix() {
        let e = not_readable("file \"token\"", Kind::Secret, "db-password");
        let (reason, msg) = e.reason_and_message();
        assert_eq!(reason, "SourceNotReadable");
        assert!(msg.contains("Secret db-password"), "{msg}");
        assert!(
            msg.contains("kubectl label secret db-password agentbox.dev/sandbox-readable=true"),
            "{msg}"
        );
    }

    #[test]
    fn env_refs_find_config_map_and_secret_keys() {
        let sbx: Sandbox = serde_json::from_value(serde_json::json!({
            "apiVersion": "agentbox.dev/v1alpha1", "kind": "Sandbox",
            "metadata": {"name": "s", "namespace": "n"},
            "spec": {"image": "i", "scope": {"kind": "Global"}, "env": [
                {"name": "PLAIN", "value": "x"},
                {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "db", "key": "k"}}},
                {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "m", "optional": true}}},
                {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            ]},
        }))
        .unwrap();
        assert_eq!(
            env_refs(&sbx),
            vec![
                EnvRef {
                    var: "TOKEN".into(),
                    kind: Kind::Secret,
                    name: "db".into(),
                    optional: false
                },
                EnvRef {
                    var: "MODE".into(),
                    kind: Kind::ConfigMap,
                    name: "cfg".into(),
                    optional: true
                },
            ]
        );
    }
}
