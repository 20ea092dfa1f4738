//! The accept loop: each connection served by hyper's HTTP/1 with half-closed connections kept (a
//! client that shuts its sending side after the request still gets its response: the default
//! closes on the first end of input and the request is aborted), `TCP_NODELAY` set (each streamed
//! chunk leaves at once, not after the peer's delayed acknowledgement), and a graceful end: once
//! `stop` resolves no connection is accepted and the open ones finish.

use std::future::Future;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;

/// Serves `app` on `listener` until `stop`; then waits for the open connections, at most `grace`.
/// `false` when some were still open at `grace`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    stop: impl Future<Output = ()>,
    grace: impl Future<Output = ()>,
) -> bool {
    let connections = GracefulShutdown::new();
    let mut stop = std::pin::pin!(stop);
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            () = &mut stop => break,
        };
        let Ok((tcp, _)) = accepted else {
            // A failed accept (too many open files, ...): wait a little rather than spin.
            tokio::time::sleep(ACCEPT_RETRY).await;
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone());
        let mut http = http1::Builder::new();
        http.half_close(true);
        let conn = http.serve_connection(TokioIo::new(tcp), service);
        let watched = connections.watch(conn);
        tokio::spawn(async move {
            let _ = watched.await;
        });
    }
    drop(listener);
    tokio::select! {
        () = connections.shutdown() => true,
        () = grace => false,
    }
}

/// How long a failed accept waits before the next.
const ACCEPT_RETRY: Duration = Duration::from_millis(50);
