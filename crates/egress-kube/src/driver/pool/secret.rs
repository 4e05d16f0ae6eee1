//! A pool's generated credentials: one Secret `POOL-credentials` in the pool's namespace,
//! created by the operator when it is missing, owned by the pool (Kubernetes' garbage
//! collector removes it with the pool) and labelled for egress-proxies, so members may name
//! it in `credentialsRef`.
//!
//! Guarantees: an existing Secret is never written (created with a POST, which fails when the
//! name is taken; never updated or patched), so a user who edits it or deletes it decides the
//! next credentials, and the members follow through their template hash; a Secret of that
//! name not made for this pool (without the pool's label) is never used; the password comes
//! from the operating system's generator; every call is bounded by [`API_SLACK`].

use std::collections::BTreeMap;

use egress_core::controller::ProxyCredentials;
use egress_core::pool::credentials;
use egress_core::pool::member::LABEL_POOL;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, PostParams};
use kube::{Client, Resource, ResourceExt};

use super::super::API_SLACK;
use super::super::publish::{MANAGED_BY, MANAGED_BY_LABEL};
use crate::api::{CREDENTIALS_LABEL, CREDENTIALS_SECRET_TYPE, ProxyPool};

/// The name of `pool`'s generated-credentials Secret.
pub(crate) fn secret_name(pool: &str) -> String {
    format!("{pool}-credentials")
}

/// What the pool's Secret holds, as the pool sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PoolSecret {
    /// Usable credentials.
    Present(ProxyCredentials),
    /// A Secret of that name that is not this pool's, or without both keys.
    Unusable(String),
}

/// Why the Secret could not be read or made.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SecretError {
    /// A call failed.
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// A call did not answer in time.
    #[error("a Secret call took longer than {0:?}")]
    Timeout(std::time::Duration),
    /// The operating system's generator failed.
    #[error("no randomness for the generated password: {0}")]
    Random(String),
}

async fn bounded<T>(
    f: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, SecretError> {
    tokio::time::timeout(API_SLACK, f)
        .await
        .map_err(|_| SecretError::Timeout(API_SLACK))?
        .map_err(SecretError::Kube)
}

fn read(pool: &ProxyPool, s: &Secret) -> PoolSecret {
    let name = s.name_any();
    let labels = s.metadata.labels.as_ref();
    let label = |k: &str| labels.and_then(|l| l.get(k)).map(String::as_str);
    if label(LABEL_POOL) != Some(pool.name_any().as_str()) {
        return PoolSecret::Unusable(format!(
            "Secret {name} exists and was not made for this pool (no label {LABEL_POOL}={}); \
             delete or rename it",
            pool.name_any()
        ));
    }
    let data = s.data.clone().unwrap_or_default();
    let field = |k: &str| {
        data.get(k)
            .and_then(|v| String::from_utf8(v.0.clone()).ok())
            .filter(|v| !v.is_empty())
    };
    match (field("username"), field("password")) {
        (Some(username), Some(password)) => {
            PoolSecret::Present(ProxyCredentials { username, password })
        }
        _ => PoolSecret::Unusable(format!(
            "Secret {name} lacks a non-empty username or password; delete it to have new \
             credentials generated"
        )),
    }
}

/// The body of a new Secret for `pool` holding `c`.
pub(crate) fn secret_body(pool: &ProxyPool, c: &ProxyCredentials) -> Secret {
    let labels: BTreeMap<String, String> = [
        (CREDENTIALS_LABEL.to_owned(), "true".to_owned()),
        (LABEL_POOL.to_owned(), pool.name_any()),
        (MANAGED_BY_LABEL.to_owned(), MANAGED_BY.to_owned()),
    ]
    .into();
    Secret {
        metadata: ObjectMeta {
            name: Some(secret_name(&pool.name_any())),
            namespace: pool.namespace(),
            labels: Some(labels),
            owner_references: owner_reference(pool).map(|o| vec![o]),
            ..ObjectMeta::default()
        },
        type_: Some(CREDENTIALS_SECRET_TYPE.to_owned()),
        data: Some(
            [
                (
                    "username".to_owned(),
                    ByteString(c.username.clone().into_bytes()),
                ),
                (
                    "password".to_owned(),
                    ByteString(c.password.clone().into_bytes()),
                ),
            ]
            .into(),
        ),
        ..Secret::default()
    }
}

/// The owner reference every object the pool makes carries: the pool as its controller,
/// blocking the pool's foreground deletion until the object is gone.
pub(crate) fn owner_reference(pool: &ProxyPool) -> Option<OwnerReference> {
    let mut o = pool.controller_owner_ref(&())?;
    o.block_owner_deletion = Some(true);
    Some(o)
}

/// The pool's credentials: read from its Secret, or generated and stored in a new one when
/// there is none. `Ok(None)`: created by someone else between the read and the create (the
/// next round reads it).
pub(crate) async fn ensure(
    client: &Client,
    pool: &ProxyPool,
) -> Result<Option<PoolSecret>, SecretError> {
    let ns = pool.namespace().unwrap_or_default();
    let api: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let name = secret_name(&pool.name_any());
    // rbac: SECRETS get
    if let Some(s) = bounded(api.get_opt(&name)).await? {
        return Ok(Some(read(pool, &s)));
    }
    let mut err = None;
    let c = credentials::generate(&pool.name_any(), |buf| {
        if let Err(e) = getrandom::fill(buf) {
            err = Some(e.to_string());
        }
    });
    if let Some(e) = err {
        return Err(SecretError::Random(e));
    }
    // rbac: SECRETS create
    match bounded(api.create(&PostParams::default(), &secret_body(pool, &c))).await {
        Ok(_) => Ok(Some(PoolSecret::Present(c))),
        Err(SecretError::Kube(kube::Error::Api(e))) if e.code == 409 => Ok(None),
        Err(e) => Err(e),
    }
}

/// The uid a Secret read back names as its controlling owner (tests).
#[cfg(test)]
fn controller_uid(s: &Secret) -> Option<String> {
    s.owner_references()
        .iter()
        .find(|o| o.controller == Some(true))
        .map(|o| o.uid.clone())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn pool() -> ProxyPool {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "egress-proxies.dev/v1alpha1", "kind": "ProxyPool",
            "metadata": {"name": "web", "namespace": "ns", "uid": "u-1"},
            "spec": {"replicas": 2, "template": {"spec": {"provider": "home", "image": "tiny"}},
                     "credentials": {"generate": true}},
        }))
        .unwrap()
    }

    #[test]
    fn the_secret_is_owned_by_the_pool_labelled_and_read_back_only_when_it_is_the_pools() {
        let c = ProxyCredentials {
            username: "pool-web".into(),
            password: "p".repeat(32),
        };
        let s = secret_body(&pool(), &c);
        assert_eq!(controller_uid(&s).as_deref(), Some("u-1"));
        let o = &s.owner_references()[0];
        assert_eq!(
            (o.kind.as_str(), o.block_owner_deletion),
            ("ProxyPool", Some(true))
        );
        assert!(crate::driver::credentials::opted_in(&s));
        assert_eq!(read(&pool(), &s), PoolSecret::Present(c.clone()));
        let mut foreign = s.clone();
        foreign.metadata.labels.as_mut().unwrap().remove(LABEL_POOL);
        assert!(
            matches!(read(&pool(), &foreign), PoolSecret::Unusable(m) if m.contains("not made"))
        );
        let mut empty = s;
        empty.data.as_mut().unwrap().remove("password");
        assert!(matches!(read(&pool(), &empty), PoolSecret::Unusable(_)));
    }
}
