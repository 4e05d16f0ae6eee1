//! Credentials Secrets: reading the one a Proxy names (`get` only) and the leader-only poller
//! that re-reconciles when one changed.
//!
//! Guarantees: no cluster-wide list or watch of Secrets; each read is bounded by
//! [`super::API_SLACK`]; a Proxy never reconciled yet triggers nothing (its first reconcile
//! reads the Secret anyway).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use egress_core::background::sleep_or_stop;
use egress_core::controller::ProxyCredentials;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::runtime::reflector::Store;
use kube::{Client, Resource, ResourceExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{API_SLACK, Ctx, ReconcileError, key_of, lock, uid_of};
use crate::api::{CREDENTIALS_LABEL, CREDENTIALS_SECRET_TYPE, Proxy};
use egress_core::model::is_dns_subdomain;

/// Whether `secret` opted in to being read as credentials: labelled
/// [`CREDENTIALS_LABEL`]` = "true"` or of type [`CREDENTIALS_SECRET_TYPE`].
pub fn opted_in(secret: &Secret) -> bool {
    secret.type_.as_deref() == Some(CREDENTIALS_SECRET_TYPE)
        || secret
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(CREDENTIALS_LABEL))
            .is_some_and(|v| v == "true")
}

/// The credentials a Proxy's `credentialsRef` names: keys `username` and `password` of the
/// Secret in the Proxy's namespace. A missing Secret or key is `None` (the core reports it),
/// and so is a Secret the operator may not read (a namespace not granted Secret access);
/// so is a name that is not a DNS subdomain (never put into an API path, so it cannot reach
/// another namespace or resource) and a Secret that did not opt in ([`opted_in`]).
pub(crate) async fn credentials(
    client: &Client,
    ns: &str,
    name: Option<&str>,
) -> Result<Option<ProxyCredentials>, ReconcileError> {
    let Some(name) = name else {
        return Ok(None);
    };
    if !is_dns_subdomain(name) {
        tracing::warn!(namespace = %ns, credentials_ref = %name, "credentialsRef is not a Secret name (a DNS subdomain); not read");
        return Ok(None);
    }
    let api: Api<Secret> = Api::namespaced(client.clone(), ns);
    // rbac: SECRETS get
    let secret = match api.get_opt(name).await {
        Ok(Some(s)) => s,
        Ok(None) => return Ok(None),
        // Secrets are granted per namespace (the chart's `secretNamespaces`), never
        // cluster-wide: elsewhere the read is forbidden, which is not an error to retry.
        Err(kube::Error::Api(e)) if e.code == 403 => {
            tracing::warn!(namespace = %ns, secret = %name, "the operator may not read Secrets in this namespace (grant it with the chart's secretNamespaces); credentials not read");
            return Ok(None);
        }
        Err(e) => return Err(ReconcileError::Kube(e)),
    };
    if !opted_in(&secret) {
        tracing::warn!(namespace = %ns, secret = %name, "Secret is not marked for egress-proxies (label {CREDENTIALS_LABEL}=true or type {CREDENTIALS_SECRET_TYPE}); not used as credentials");
        return Ok(None);
    }
    let data = secret.data.unwrap_or_default();
    let field = |k: &str| {
        data.get(k)
            .and_then(|v| String::from_utf8(v.0.clone()).ok())
            .filter(|s| !s.is_empty())
    };
    Ok(match (field("username"), field("password")) {
        (Some(username), Some(password)) => Some(ProxyCredentials { username, password }),
        _ => None,
    })
}

/// Leader-only: every `interval`, re-reads each credentials Secret a Proxy names (one `get`
/// per distinct Secret) and, when a Proxy's credentials differ from what its last reconcile
/// read (a Secret created late, rotated or removed), re-reconciles every Proxy.
// NB: per-object triggers (`Controller::reconcile_on`) are behind an unstable kube-runtime
// feature; a re-reconcile of everything is bounded by the controller's concurrency and
// credentials change rarely.
pub(super) async fn credentials_loop(
    ctx: Arc<Ctx>,
    store: Store<Proxy>,
    trigger: mpsc::Sender<()>,
    interval: Duration,
    stop: CancellationToken,
) {
    while sleep_or_stop(interval, &stop).await {
        let mut by_secret: HashMap<(String, String), Vec<Arc<Proxy>>> = HashMap::new();
        for p in store.state() {
            if p.meta().deletion_timestamp.is_some() {
                continue;
            }
            if let Some(s) = p.spec.proxy.credentials_ref.clone() {
                by_secret
                    .entry((p.namespace().unwrap_or_default(), s))
                    .or_default()
                    .push(p);
            }
        }
        for ((ns, secret), ps) in by_secret {
            let read = tokio::select! {
                () = stop.cancelled() => return,
                r = tokio::time::timeout(API_SLACK, credentials(&ctx.client, &ns, Some(&secret))) => r,
            };
            let now = match read {
                Ok(Ok(c)) => c,
                Ok(Err(e)) => {
                    tracing::warn!(namespace = %ns, secret = %secret, error = %e, "cannot read a credentials Secret");
                    continue;
                }
                Err(_) => continue,
            };
            for p in ps {
                let Some(uid) = uid_of(&p) else { continue };
                let seen = lock(&ctx.creds).get(&uid).cloned();
                // Never reconciled yet: its first reconcile reads the Secret anyway.
                if seen.is_some_and(|s| s != now) {
                    tracing::info!(proxy = %key_of(&p), "credentials Secret changed: reconciling");
                    // NB: a full channel means a re-reconcile of everything is already pending.
                    let _ = trigger.try_send(());
                }
            }
        }
    }
}
