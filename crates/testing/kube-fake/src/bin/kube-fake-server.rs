//! `kube-fake-server`: the fake Kubernetes API server ([`kube_fake::FakeApiServer`]) as its own
//! process, over HTTPS with a CA it generates and bearer-token authentication
//! ([`kube_fake::https`]), so tests can run real clients (the `egress-proxies` binary,
//! kubectl, the Python client) against it exactly as against a cluster.
//!
//! ```text
//! kube-fake-server --dir DIR --token TOKEN [--listen 127.0.0.1:0] [--san NAME]...
//!                  [--namespace NS] [--watch-history N]
//! ```
//!
//! Writes into DIR (created if missing): `ca.crt` (the CA to trust), `tls.crt` / `tls.key`
//! (the server's), `kubeconfig` (server, CA file and token: `KUBECONFIG=DIR/kubeconfig`), and
//! `serviceaccount/{token,ca.crt,namespace}` (the in-cluster files of a pod, `namespace` from
//! `--namespace`, default `default`). The certificate is valid for `localhost`, `127.0.0.1`,
//! `::1` and every `--san`. Then prints one line `ready https://ADDR` on stdout (ADDR the bound
//! address: `--listen` with port 0 picks a free one) and serves until SIGTERM or SIGINT (exit
//! 0). Any setup failure is one `error: ...` line on stderr and exit 1; a bad command line is
//! exit 2. `--watch-history N` keeps only the newest N writes for watches to replay (a watch
//! from an older resourceVersion gets a 410 `Expired`, as after a real server's compaction).

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Parser;

/// The fake Kubernetes API server over HTTPS with bearer-token authentication.
#[derive(Debug, Parser)]
#[command(name = "kube-fake-server")]
struct Args {
    /// Directory for ca.crt, tls.crt, tls.key, kubeconfig and serviceaccount/.
    #[arg(long, value_name = "DIR")]
    dir: PathBuf,
    /// The bearer token every request must carry (401 otherwise).
    #[arg(long, value_name = "TOKEN")]
    token: String,
    /// Address to listen on (port 0: any free port).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Extra DNS name or IP address for the server certificate (repeatable).
    #[arg(long, value_name = "NAME")]
    san: Vec<String>,
    /// The namespace written to serviceaccount/namespace and the kubeconfig's context.
    #[arg(long, value_name = "NS", default_value = "default")]
    namespace: String,
    /// Keep only the newest N writes for watches to replay (default: all).
    #[arg(long, value_name = "N")]
    watch_history: Option<usize>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.token.trim().is_empty() || args.token.contains(char::is_whitespace) {
        eprintln!("error: --token must be non-empty and without whitespace");
        return ExitCode::from(2);
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match rt.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}

async fn run(args: Args) -> Result<(), String> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).map_err(|e| format!("SIGTERM handler: {e}"))?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| format!("SIGINT handler: {e}"))?;

    let mut names = vec![
        "localhost".to_owned(),
        "127.0.0.1".to_owned(),
        "::1".to_owned(),
    ];
    names.extend(args.san.iter().cloned());
    let pki = kube_fake::https::Pki::generate(&names).map_err(|e| e.to_string())?;
    let tls = pki.server_config().map_err(|e| e.to_string())?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    let addr = listener
        .local_addr()
        .map_err(|e| format!("no local address: {e}"))?;
    write_files(&args, &pki, addr)
        .map_err(|e| format!("cannot write to {}: {e}", args.dir.display()))?;

    let api = kube_fake::FakeApiServer::new();
    if let Some(n) = args.watch_history {
        api.set_watch_history_limit(n);
    }
    let shutdown = async move {
        tokio::select! {
            _ = term.recv() => {},
            _ = int.recv() => {},
        }
    };
    {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "ready https://{addr}");
        let _ = out.flush();
    }
    kube_fake::https::serve(listener, api, tls, args.token, shutdown).await;
    Ok(())
}

fn write_files(args: &Args, pki: &kube_fake::https::Pki, addr: SocketAddr) -> std::io::Result<()> {
    let dir = &args.dir;
    let sa = dir.join("serviceaccount");
    std::fs::create_dir_all(&sa)?;
    let ca = dir.join("ca.crt");
    write(&ca, &pki.ca_pem)?;
    write(&dir.join("tls.crt"), &pki.cert_pem)?;
    write(&dir.join("tls.key"), &pki.key_pem)?;
    write(&sa.join("ca.crt"), &pki.ca_pem)?;
    write(&sa.join("token"), &args.token)?;
    write(&sa.join("namespace"), &args.namespace)?;
    let server = format!("https://{addr}");
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: kube-fake\n  cluster:\n    server: {server}\n    \
         certificate-authority: {ca}\nusers:\n- name: kube-fake\n  user:\n    token: {token}\n\
         contexts:\n- name: kube-fake\n  context:\n    cluster: kube-fake\n    user: kube-fake\n    \
         namespace: {ns}\ncurrent-context: kube-fake\n",
        ca = ca.display(),
        token = args.token,
        ns = args.namespace,
    );
    write(&dir.join("kubeconfig"), &kubeconfig)
}

/// Writes a file in one rename, so a reader never sees half of it.
fn write(path: &Path, content: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp~");
    std::fs::write(&tmp, content)?;
    std::fs::rename(tmp, path)
}
