//! The process's stop signal: a token cancelled on the first SIGTERM or SIGINT, which every
//! command that runs until stopped (standalone, kubernetes, echo) hands to its workers.
//!
//! Guarantees: the token is cancelled exactly once, on the first of the two signals; a signal
//! whose handler cannot be installed is logged and the other still works.

use tokio_util::sync::CancellationToken;

/// A token cancelled on the first SIGTERM or SIGINT. Must be called inside a tokio runtime.
/// If a signal handler cannot be installed, that is logged and the other signal still works.
pub fn shutdown_on_signals() -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let term = signal(SignalKind::terminate());
            if let Err(e) = &term {
                tracing::warn!(error = %e, "cannot listen for SIGTERM");
            }
            let term_wait = async {
                match term {
                    Ok(mut s) => {
                        s.recv().await;
                    }
                    Err(_) => std::future::pending::<()>().await,
                }
            };
            tokio::pin!(term_wait);
            tokio::select! {
                r = tokio::signal::ctrl_c() => match r {
                    Ok(()) => tracing::info!("SIGINT: shutting down"),
                    Err(e) => {
                        // NB: SIGTERM must still work without a SIGINT handler.
                        tracing::warn!(error = %e, "cannot listen for SIGINT");
                        term_wait.await;
                        tracing::info!("SIGTERM: shutting down");
                    }
                },
                () = &mut term_wait => tracing::info!("SIGTERM: shutting down"),
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
        t.cancel();
    });
    token
}
