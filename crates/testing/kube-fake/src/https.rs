//! The fake API server over real HTTPS, as a real client reaches a real API server: a CA and a
//! server certificate generated at start ([`Pki`]), TLS 1.2/1.3 with ALPN `h2` and `http/1.1`,
//! and bearer-token authentication ([`serve`]). The `kube-fake-server` binary runs it as its own
//! process (src/bin/kube-fake-server.rs).
//!
//! Guarantees:
//! - every request without `Authorization: Bearer <token>` naming the configured token is
//!   answered `401 Unauthorized` with a `Status` body, as kube-apiserver does, and never reaches
//!   the store (not even as a recorded request);
//! - a CustomResourceDefinition created, replaced, patched or applied through the API gets its
//!   declared status subresource (`spec.versions[].subresources.status`) enabled on the store,
//!   as a real server serves `/status` for such a CRD;
//! - a TLS handshake that fails, or a connection that breaks, ends that connection only;
//! - [`serve`] returns once `shutdown` resolves: it stops accepting, and open connections
//!   (watches included) are dropped.

use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::json;
use tokio::net::TcpListener;
use tower_service::Service as _;

use crate::{Body, FakeApiServer};

/// Longest a client may take to finish the TLS handshake.
// NB: a loopback handshake takes about a millisecond; 10 s only bounds a client that connects
// and never speaks, so it cannot pin a task forever.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the HTTPS front could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum HttpsError {
    /// Generating a key or a certificate failed.
    #[error("cannot generate the certificates: {0}")]
    Certificate(#[from] rcgen::Error),
    /// The certificate and key were refused by rustls.
    #[error("cannot build the TLS configuration: {0}")]
    Tls(#[from] rustls::Error),
}

/// A fresh CA and a server certificate signed by it, valid for the given names and addresses.
pub struct Pki {
    /// The CA certificate, PEM (what clients trust: `ca.crt`, `certificate-authority`).
    pub ca_pem: String,
    /// The server certificate, PEM.
    pub cert_pem: String,
    /// The server's private key, PKCS#8 PEM.
    pub key_pem: String,
    cert_der: rustls::pki_types::CertificateDer<'static>,
    key_der: Vec<u8>,
}

impl std::fmt::Debug for Pki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pki").finish_non_exhaustive()
    }
}

impl Pki {
    /// Generates a CA ("kube-fake CA") and a server certificate for `names` (DNS names or IP
    /// addresses, each put in the subjectAltName as what it is).
    pub fn generate(names: &[String]) -> Result<Self, HttpsError> {
        let ca_key = KeyPair::generate()?;
        let mut ca = CertificateParams::new(Vec::<String>::new())?;
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "kube-fake CA");
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca.self_signed(&ca_key)?;
        let issuer = Issuer::new(ca, ca_key);

        let key = KeyPair::generate()?;
        let mut leaf = CertificateParams::new(Vec::<String>::new())?;
        for n in names {
            leaf.subject_alt_names.push(match n.parse::<IpAddr>() {
                Ok(ip) => SanType::IpAddress(ip),
                Err(_) => SanType::DnsName(n.clone().try_into()?),
            });
        }
        leaf.distinguished_name
            .push(DnType::CommonName, "kube-fake API server");
        leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let cert = leaf.signed_by(&key, &issuer)?;
        Ok(Self {
            ca_pem: ca_cert.pem(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            cert_der: cert.der().clone(),
            key_der: key.serialize_der(),
        })
    }

    /// The server side TLS configuration (aws-lc-rs, the workspace's one provider; ALPN `h2`
    /// then `http/1.1`).
    pub fn server_config(&self) -> Result<Arc<rustls::ServerConfig>, HttpsError> {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(
                vec![self.cert_der.clone()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key_der.clone())),
            )?;
        cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(cfg))
    }
}

/// Serves `api` on `listener` over TLS with `tls`, answering 401 to any request that does not
/// carry `Authorization: Bearer {token}`, until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    api: FakeApiServer,
    tls: Arc<rustls::ServerConfig>,
    token: String,
    shutdown: impl Future<Output = ()>,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let token: Arc<str> = Arc::from(token);
    let mut conns = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let (tcp, _) = tokio::select! {
            () = &mut shutdown => break,
            r = listener.accept() => match r {
                Ok(c) => c,
                // NB: EMFILE and friends: a short pause instead of a busy loop.
                Err(_) => { tokio::time::sleep(Duration::from_millis(50)).await; continue; }
            },
        };
        // Reap finished connections so the set does not grow without bound.
        while conns.try_join_next().is_some() {}
        let acceptor = acceptor.clone();
        let api = api.clone();
        let token = token.clone();
        conns.spawn(async move {
            let Ok(Ok(tls)) = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await
            else {
                return;
            };
            let svc = hyper::service::service_fn(move |req| {
                let api = api.clone();
                let token = token.clone();
                async move { Ok::<_, std::convert::Infallible>(handle(api, &token, req).await) }
            });
            let _ =
                hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new())
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), svc)
                    .await;
        });
    }
    conns.shutdown().await;
}

async fn handle(
    mut api: FakeApiServer,
    token: &str,
    req: Request<hyper::body::Incoming>,
) -> Response<Body> {
    let authorized = req
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|t| t.trim() == token);
    if !authorized {
        return unauthorized();
    }
    let (parts, body) = req.into_parts();
    let bytes = match body.collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => return status(StatusCode::BAD_REQUEST, "BadRequest", "unreadable body"),
    };
    let writes_crd = parts.uri.path().starts_with("/apis/apiextensions.k8s.io/")
        && parts.method != http::Method::GET;
    let req = Request::from_parts(parts, kube::client::Body::from(bytes));
    let Ok(resp) = api.call(req).await;
    if writes_crd {
        enable_declared_status_subresources(&api);
    }
    resp
}

/// Enables the status subresource of every stored CRD version that declares one.
fn enable_declared_status_subresources(api: &FakeApiServer) {
    for crd in api.objects("apiextensions.k8s.io", "customresourcedefinitions") {
        let at = |p: &str| crd.pointer(p).cloned().unwrap_or_default();
        let (Some(group), Some(plural)) = (
            at("/spec/group").as_str().map(str::to_owned),
            at("/spec/names/plural").as_str().map(str::to_owned),
        ) else {
            continue;
        };
        let declares = at("/spec/versions").as_array().is_some_and(|vs| {
            vs.iter().any(|v| {
                v.pointer("/subresources/status")
                    .is_some_and(|s| s.is_object())
            })
        });
        if declares {
            api.enable_status_subresource(&group, &plural);
        }
    }
}

fn unauthorized() -> Response<Body> {
    status(StatusCode::UNAUTHORIZED, "Unauthorized", "Unauthorized")
}

fn status(code: StatusCode, reason: &str, message: &str) -> Response<Body> {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code.as_u16(),
    });
    let bytes = Bytes::from(body.to_string());
    let mut resp = Response::new(
        http_body_util::Full::new(bytes)
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    *resp.status_mut() = code;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    resp
}
