//! The process's stop signal: a token cancelled on the first SIGTERM or SIGINT, which every
//! command that runs until stopped (standalone, kubernetes, echo) hands to its background tasks; a
//! second signal ends the process at once.
//!
//! Guarantees: the token is cancelled exactly once, on the first of the two signals; a second
//! SIGTERM or SIGINT while the graceful shutdown runs exits the process immediately with
//! [`FORCED_EXIT_CODE`] (an operator who asks twice means it; work cut there is converged by
//! the next start, as after a crash); a signal whose handler cannot be installed is logged and
//! the other still works.

use tokio_util::sync::CancellationToken;

/// Exit code when a second signal forces the process out during the graceful shutdown: the
/// CLI's "something failed" code (the shutdown did not finish).
pub const FORCED_EXIT_CODE: i32 = 1;

/// A token cancelled on the first SIGTERM or SIGINT; a second signal exits the process with
/// [`FORCED_EXIT_CODE`]. Must be called inside a tokio runtime. If a signal handler cannot be
/// installed, that is logged and the other signal still works.
pub fn shutdown_on_signals() -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{Signal, SignalKind, signal};
            let listen = |kind: SignalKind, name: &str| match signal(kind) {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot listen for {name}");
                    None
                }
            };
            let mut term = listen(SignalKind::terminate(), "SIGTERM");
            let mut int = listen(SignalKind::interrupt(), "SIGINT");
            async fn next(s: &mut Option<Signal>) {
                match s {
                    Some(s) => {
                        s.recv().await;
                    }
                    // NB: the other signal must still work without this one's handler.
                    None => std::future::pending::<()>().await,
                }
            }
            let first = tokio::select! {
                () = next(&mut term) => "SIGTERM",
                () = next(&mut int) => "SIGINT",
            };
            tracing::info!("{first}: shutting down gracefully (send it again to exit at once)");
            t.cancel();
            let second = tokio::select! {
                () = next(&mut term) => "SIGTERM",
                () = next(&mut int) => "SIGINT",
            };
            tracing::warn!("second signal ({second}): exiting now, without finishing the shutdown");
            std::process::exit(FORCED_EXIT_CODE);
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            t.cancel();
            let _ = tokio::signal::ctrl_c().await;
            std::process::exit(FORCED_EXIT_CODE);
        }
    });
    token
}
