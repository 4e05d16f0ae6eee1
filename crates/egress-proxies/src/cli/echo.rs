//! `egress-proxies echo [--listen ADDR]`: the health check target. Answers every `GET` with
//! the caller's IP on one line ([`egress_web::echo`]), so the health engine learns the
//! egress IP each proxy's traffic leaves from. Run it anywhere the proxies can reach and pass
//! `--health-target http://ADDR/` to `standalone`.
//!
//! Guarantees: it only listens (no outgoing connection); it prints the address it bound on
//! stdout (`listening on ADDR`, or under `-o json|yaml` one document `listening: ADDR`), and
//! keeps serving when nobody reads stdout any more; it stops on SIGTERM/SIGINT (exit 0); an
//! address it cannot bind is exit 1.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};

use super::{EXIT_FAILED, EXIT_OK};
use egress_core::background::signals::shutdown_on_signals;
use egress_web::echo;

/// Default listen address of the echo.
// NB: 9465 sits next to the status endpoint's 9464; all interfaces, since the callers are
// proxies on other machines (the echo reveals nothing but the caller's own address).
pub const DEFAULT_ECHO_LISTEN: SocketAddr =
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 9465));

/// Arguments of `echo`.
#[derive(Debug, clap::Args)]
pub struct EchoArgs {
    /// Address to listen on.
    #[arg(long, value_name = "ADDR", default_value_t = DEFAULT_ECHO_LISTEN)]
    listen: SocketAddr,
}

/// What `echo -o json|yaml` prints once it listens.
#[derive(Debug, serde::Serialize)]
struct Listening {
    /// The address bound (the port chosen when `--listen` asked for port 0).
    listening: SocketAddr,
}

/// Runs the echo until a signal.
pub async fn run(a: EchoArgs) -> anyhow::Result<u8> {
    let listener = match tokio::net::TcpListener::bind(a.listen).await {
        Ok(l) => l,
        Err(e) => {
            let msg = format!("cannot listen on {}: {e}", a.listen);
            super::output::print_error(&msg, EXIT_FAILED);
            return Ok(EXIT_FAILED);
        }
    };
    let addr = listener.local_addr().unwrap_or(a.listen);
    tracing::info!(%addr, "egress-proxies echo listening");
    // The address on stdout, so scripts started with `--listen 127.0.0.1:0` learn the port:
    // a line, or under -o json|yaml one document `{"listening": ADDR}`.
    let said =
        match super::output::document(&Listening { listening: addr }, super::output::format(false))
        {
            Ok(Some(doc)) => doc.trim_end().to_owned(),
            _ => format!("listening on {addr}"),
        };
    // NB: written, not println!: a reader that has gone (a script that read the address and
    // closed the pipe) makes the write fail, which must not stop the echo.
    {
        use std::io::Write as _;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{said}").and_then(|()| out.flush());
    }
    let shutdown = shutdown_on_signals();
    echo::serve(listener, shutdown).await;
    Ok(EXIT_OK)
}
