//! The Kubernetes client of the commands that talk to a cluster themselves (`gateway`,
//! `hosts fence|unfence --kubernetes`): from `--kubeconfig` when given, else the usual
//! discovery (`KUBECONFIG`, `~/.kube/config`, or the in-cluster service account).
//!
//! Guarantees: an unreadable or invalid kubeconfig is an error naming its path; nothing is
//! sent to the cluster here.

use std::path::Path;

use anyhow::Context as _;

/// A client for `kubeconfig`, or for the environment's configuration when `None`.
pub async fn client(kubeconfig: Option<&Path>) -> anyhow::Result<kube::Client> {
    match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("cannot read the kubeconfig {}", path.display()))?;
            let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .with_context(|| format!("kubeconfig {}", path.display()))?;
            kube::Client::try_from(cfg).context("cannot build the Kubernetes client")
        }
        None => kube::Client::try_default()
            .await
            .context("cannot connect to Kubernetes (kubeconfig or in-cluster)"),
    }
}
