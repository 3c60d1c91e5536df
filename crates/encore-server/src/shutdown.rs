//! Serving with a graceful shutdown: stop accepting, let the requests in flight finish
//! for a grace period, then cut the rest off (each handler watches [`cut_off`]).

use std::future::{Future, IntoFuture};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::serve::ListenerExt;
use tokio::sync::{oneshot, watch};

use crate::App;

/// How long requests cut off at the end of the grace period get to end before their
/// connections are dropped.
const CUT_WAIT: Duration = Duration::from_secs(5);

/// Serve `app` on `listener` until `shutdown` resolves; then stop accepting connections
/// (and answer 503 to a request that still arrives), let the requests in flight finish
/// for up to `grace`, and end the rest: a stream with an error event and `[DONE]`, a
/// whole response with a 503; the engine aborts them. Returns once every connection has
/// closed.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: App,
    shutdown: impl Future<Output = ()> + Send + 'static,
    grace: Duration,
) -> std::io::Result<()> {
    let App { router, state } = app;
    let (draining_tx, draining_rx) = oneshot::channel::<()>();
    let st = Arc::clone(&state);
    let signal = async move {
        shutdown.await;
        st.draining.store(true, Ordering::SeqCst);
        let _ = draining_tx.send(());
    };
    // Every SSE chunk is a small write: without TCP_NODELAY, Nagle's algorithm holds it
    // until the client's delayed ACK (40 ms on Linux), which a first token would pay.
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::warn!("cannot set TCP_NODELAY on a connection: {e}");
        }
    });
    // The client's address, for the log of refused requests.
    let router = router.into_make_service_with_connect_info::<SocketAddr>();
    let server = axum::serve(listener, router)
        .with_graceful_shutdown(signal)
        .into_future();
    tokio::pin!(server);
    tokio::select! {
        r = &mut server => return r,
        Ok(()) = draining_rx => {}
    }
    tokio::select! {
        r = &mut server => return r,
        _ = tokio::time::sleep(grace) => {}
    }
    tracing::warn!(
        "shutdown: requests still in flight after {:.1} s are cut off",
        grace.as_secs_f64()
    );
    state.cut.send_replace(true);
    match tokio::time::timeout(CUT_WAIT, server).await {
        Ok(r) => r,
        Err(_) => Ok(()), // connections that did not close are dropped
    }
}

/// Resolves once the requests in flight must end (never, unless the server shuts down).
pub(crate) async fn cut_off(mut cut: watch::Receiver<bool>) {
    while !*cut.borrow_and_update() {
        if cut.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}
