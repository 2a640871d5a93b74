//! A simulated node's download, when the fleet downloads real bytes
//! ([`super::SimConfig::download_from`]): one plain HTTP/1.1 GET per node and attempt, its
//! body read to the end and dropped, as many at once as the rollout lets nodes stage. Each
//! node is its own machine, so each download has its own connection.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Downloads `url` (`http://HOST:PORT/PATH`) until a whole `200` body has arrived, again
/// after a second when an attempt fails (a refused connection, an error status, a short
/// body), as an agent retries; returns how long it took and how many attempts failed.
pub(super) async fn download(url: &str) -> (Duration, usize) {
    let started = Instant::now();
    let mut failed = 0;
    while let Err(e) = get(url).await {
        tracing::debug!("simulated download of {url}: {e}");
        failed += 1;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    (started.elapsed(), failed)
}

async fn get(url: &str) -> std::io::Result<()> {
    let invalid =
        |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidInput, what.to_owned());
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| invalid("only http:// URLs"))?;
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let mut stream = TcpStream::connect(host).await?;
    let request = format!("GET /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut buf = vec![0u8; 64 << 10];
    let mut head = Vec::new();
    let (length, mut body) = loop {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            return Err(invalid("the connection ended in the answer's head"));
        }
        head.extend_from_slice(&buf[..n]);
        if let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            let text = String::from_utf8_lossy(&head[..end]).to_ascii_lowercase();
            if !text.starts_with("http/1.1 200") {
                return Err(invalid(text.lines().next().unwrap_or("no status")));
            }
            let length = text
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .ok_or_else(|| invalid("no Content-Length"))?;
            break (length, (head.len() - end - 4) as u64);
        }
    };
    while body < length {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            return Err(invalid("the body ended early"));
        }
        body += n as u64;
    }
    Ok(())
}
