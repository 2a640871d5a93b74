//! A slow, cuttable link to a server on loopback: a TCP proxy that passes the server's
//! answers at a capped rate, for servers that cannot be slowed themselves (a real registry).
//! A download through it takes long enough to be interrupted on purpose, and dropping the
//! link cuts every connection through it at once, as a server that goes away does.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

/// The proxy; every connection through it ends when it is dropped.
pub struct SlowLink {
    /// Where clients connect instead of the server.
    pub addr: SocketAddr,
    accepting: tokio::task::JoinHandle<()>,
}

impl SlowLink {
    /// A link to `server` passing at most `bytes_per_second` of each answer.
    pub async fn start(server: SocketAddr, bytes_per_second: u64) -> std::io::Result<SlowLink> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let accepting = tokio::spawn(async move {
            // Owned here: aborting this task drops the set, which aborts every connection.
            let mut connections = JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                connections.spawn(pass(client, server, bytes_per_second.max(1)));
            }
        });
        Ok(SlowLink { addr, accepting })
    }

    /// `127.0.0.1:PORT`, as references and URLs name it.
    pub fn host(&self) -> String {
        self.addr.to_string()
    }
}

impl Drop for SlowLink {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

/// Requests pass as they come; answers in slices of a tenth of a second's worth.
async fn pass(client: TcpStream, server: SocketAddr, bytes_per_second: u64) {
    let Ok(upstream) = TcpStream::connect(server).await else {
        return;
    };
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = upstream.into_split();
    let requests = async {
        let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
        let _ = server_write.shutdown().await;
    };
    let answers = async {
        let slice = usize::try_from(bytes_per_second / 10)
            .unwrap_or(usize::MAX)
            .max(1);
        let mut buffer = vec![0u8; slice.min(1 << 20)];
        loop {
            let n = match server_read.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if client_write.write_all(&buffer[..n]).await.is_err() {
                break;
            }
            let pause = Duration::from_secs_f64(n as f64 / bytes_per_second as f64);
            tokio::time::sleep(pause).await;
        }
        let _ = client_write.shutdown().await;
    };
    tokio::join!(requests, answers);
}
