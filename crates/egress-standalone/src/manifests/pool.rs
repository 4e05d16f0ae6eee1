//! `kind: ProxyPool` documents in the manifest directory: the same YAML as the Kubernetes
//! resource, read beside the Proxy manifests by [`crate::manifests`].
//!
//! Guarantees: a document is a pool when its `kind` is `ProxyPool` (anything else is read as a
//! Proxy, as before); every error names the file, the document and the field path, as a
//! Proxy's do; a pool's spec is checked by the core's validation into a [`PoolPolicy`], and a
//! `credentialsRef` in its template is read under the same confinement as a Proxy's.

use std::path::{Path, PathBuf};

use egress_core::config::lenient;
use egress_core::model::API_VERSION;
use egress_core::pool::spec::POOL_KIND;
use egress_core::pool::validate::validate_pool_name;
use egress_core::pool::{PoolPolicy, ProxyPoolManifest, ProxyPoolSpec};
use sha2::{Digest, Sha256};

use super::files::{Credentials, ManifestError, is_dns_label, read_credentials};

/// One valid ProxyPool from a manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadedPool {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// The spec as written.
    pub spec: ProxyPoolSpec,
    /// The spec resolved.
    pub policy: PoolPolicy,
    /// Credentials read from `spec.template.spec.proxy.credentialsRef`, when set.
    pub credentials: Option<Credentials>,
    /// The gateway's client credentials read from `spec.gateway.clientCredentials` (empty
    /// when there is no gateway or it uses the pool's own credentials).
    pub gateway_clients: Vec<Credentials>,
    /// The file it came from.
    pub file: PathBuf,
    /// sha256 over the spec and the credentials: changes exactly when either does.
    pub spec_hash: [u8; 32],
}

impl LoadedPool {
    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// Only the `kind` of a document.
#[derive(serde::Deserialize)]
struct KindOnly {
    #[serde(default)]
    kind: Option<String>,
}

/// Whether the document's `kind` is `ProxyPool`.
pub(crate) fn is_pool_document(doc: &str) -> bool {
    serde_saphyr::from_str::<KindOnly>(doc)
        .ok()
        .and_then(|k| k.kind)
        .is_some_and(|k| k == POOL_KIND)
}

/// Parses and checks one ProxyPool document (`d`: its index in `file`).
pub(crate) fn parse_pool(
    file: &Path,
    d: usize,
    doc: &str,
    dir: &Path,
) -> Result<LoadedPool, Vec<ManifestError>> {
    let mk = |path: &str, message: String| ManifestError {
        file: file.to_path_buf(),
        document: Some(d),
        path: path.to_owned(),
        message: egress_provider::error::redact(&message),
    };
    let m = match serde_saphyr::from_str::<ProxyPoolManifest>(doc) {
        Ok(m) => m,
        Err(e) => {
            return Err(match lenient::parse_collecting::<ProxyPoolManifest>(doc) {
                Ok(c) if !c.errors.is_empty() => c
                    .errors
                    .iter()
                    .map(|e| mk(&e.path, e.message.clone()))
                    .collect(),
                _ => vec![mk("", format!("not a ProxyPool manifest: {e}"))],
            });
        }
    };
    let mut errs = Vec::new();
    if m.api_version != API_VERSION {
        errs.push(mk(
            "apiVersion",
            format!("{:?} is not {API_VERSION:?}", m.api_version),
        ));
    }
    if let Some(e) = validate_pool_name(&m.metadata.name) {
        errs.push(mk(&e.path, e.message));
    }
    if !is_dns_label(&m.metadata.namespace) {
        errs.push(mk(
            "metadata.namespace",
            format!("{:?} is not a DNS label", m.metadata.namespace),
        ));
    }
    let policy = match m.spec.validate() {
        Ok(p) => Some(p),
        Err(es) => {
            errs.extend(es.into_iter().map(|e| mk(&e.path, e.message)));
            None
        }
    };
    let credentials = match &m.spec.template.spec.proxy.credentials_ref {
        Some(r) => match read_credentials(dir, r) {
            Ok(c) => Some(c),
            Err(e) => {
                errs.push(mk("spec.template.spec.proxy.credentialsRef", e));
                None
            }
        },
        None => None,
    };
    let mut gateway_clients = Vec::new();
    for (i, r) in m
        .spec
        .gateway
        .iter()
        .flat_map(|g| g.client_credentials.iter())
        .enumerate()
    {
        match read_credentials(dir, r) {
            Ok(c) => gateway_clients.push(c),
            Err(e) => errs.push(mk(&format!("spec.gateway.clientCredentials[{i}]"), e)),
        }
    }
    let Some(policy) = policy.filter(|_| errs.is_empty()) else {
        return Err(errs);
    };
    let mut h = Sha256::new();
    h.update(format!("{:?}", m.spec).as_bytes());
    if let Some(c) = &credentials {
        h.update(b"\0creds\0");
        h.update(c.username.as_bytes());
        h.update(b"\0");
        h.update(c.password.as_bytes());
    }
    for c in &gateway_clients {
        h.update(b"\0client\0");
        h.update(c.username.as_bytes());
        h.update(b"\0");
        h.update(c.password.as_bytes());
    }
    Ok(LoadedPool {
        namespace: m.metadata.namespace,
        name: m.metadata.name,
        spec: m.spec,
        policy,
        credentials,
        gateway_clients,
        file: file.to_path_buf(),
        spec_hash: h.finalize().into(),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;

    const POOL: &str = "apiVersion: egress-proxies.dev/v1alpha1\nkind: ProxyPool\nmetadata:\n  \
name: web\nspec:\n  replicas: 3\n  template:\n    spec:\n      provider: local\n      image: tiny\n      \
proxy:\n        allowedClientCidrs: [10.0.0.0/8]\n  update: {maxSurge: 10%}\n";

    #[test]
    fn a_pool_document_parses_and_its_errors_name_file_document_and_field() {
        assert!(is_pool_document(POOL));
        assert!(!is_pool_document("kind: Proxy\n"));
        let p = parse_pool(Path::new("/d/a.yaml"), 0, POOL, Path::new("/d")).unwrap();
        assert_eq!((p.key().as_str(), p.policy.replicas), ("default/web", 3));
        assert_eq!(p.policy.max_surge, 1);
        let bad = POOL
            .replace("replicas: 3", "replicas: 3\n  bogus: 1")
            .replace("name: web", "name: Web");
        let errs = parse_pool(Path::new("/d/a.yaml"), 2, &bad, Path::new("/d")).unwrap_err();
        assert_eq!(errs[0].path, "spec.bogus", "{errs:?}");
        let bad = POOL
            .replace("maxSurge: 10%", "maxSurge: 0")
            .replace("name: web", "name: Web");
        let errs = parse_pool(Path::new("/d/a.yaml"), 2, &bad, Path::new("/d")).unwrap_err();
        let shown: Vec<String> = errs.iter().map(ToString::to_string).collect();
        assert!(
            shown
                .iter()
                .any(|e| e.starts_with("/d/a.yaml document 2: metadata.name")),
            "{shown:?}"
        );
        assert!(shown.iter().any(|e| e.contains("spec.update")), "{shown:?}");
    }

    #[test]
    fn a_pool_written_with_a_flat_template_is_refused_with_the_shape_to_write() {
        let flat = "apiVersion: egress-proxies.dev/v1alpha1\nkind: ProxyPool\nmetadata:\n  \
                    name: web\nspec:\n  replicas: 3\n  template:\n    provider: local\n    \
                    image: tiny\n    proxy:\n      allowedClientCidrs: [10.0.0.0/8]\n";
        let errs = parse_pool(Path::new("/d/a.yaml"), 1, flat, Path::new("/d")).unwrap_err();
        let shown: Vec<String> = errs.iter().map(ToString::to_string).collect();
        assert_eq!(shown.len(), 1, "{shown:?}");
        assert!(
            shown[0].starts_with("/d/a.yaml document 1: spec.template: provider, image, proxy"),
            "{shown:?}"
        );
        assert!(shown[0].contains("template.spec") && shown[0].contains("v1alpha1"));
    }
}
