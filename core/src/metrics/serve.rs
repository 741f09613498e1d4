//! `GET /metrics` (and `/healthz`) for processes without the HTTP API: a tiny HTTP/1.1
//! responder, so the worker needs no web framework.

use std::time::Duration;

/// Serve `GET /metrics` on `addr` until `stop` fires. A tiny HTTP/1.1 responder so that
/// the worker (which has no HTTP API) needs no web framework.
pub async fn serve_metrics(
    listener: tokio::net::TcpListener,
    render: std::sync::Arc<dyn Fn() -> String + Send + Sync>,
    stop: tokio_util::sync::CancellationToken,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    loop {
        let (mut sock, _) = tokio::select! {
            a = listener.accept() => match a { Ok(a) => a, Err(_) => continue },
            _ = stop.cancelled() => return,
        };
        let render = render.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            let n = match tokio::time::timeout(Duration::from_secs(5), sock.read(&mut buf)).await {
                Ok(Ok(n)) => n,
                _ => return,
            };
            let head = String::from_utf8_lossy(&buf[..n]);
            let path = head.split_whitespace().nth(1).unwrap_or("/");
            let (status, ctype, body) = match path {
                "/metrics" => (
                    "200 OK",
                    "text/plain; version=0.0.4; charset=utf-8",
                    render(),
                ),
                "/healthz" => ("200 OK", "text/plain", "ok".to_string()),
                _ => ("404 Not Found", "text/plain", "not found".to_string()),
            };
            let resp = format!(
                "HTTP/1.1 {status}\r\ncontent-type: {ctype}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = sock.write_all(resp.as_bytes()).await;
            let _ = sock.shutdown().await;
        });
    }
}
