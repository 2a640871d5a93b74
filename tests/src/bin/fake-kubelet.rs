//! A stand-in kubelet for the test beds: `--version` prints `Kubernetes vX.Y.Z`; run without
//! arguments it serves `GET /healthz` and `GET /version` on 127.0.0.1, behaving as its
//! behaviour file (default `/usr/lib/fake-kubelet/config`, see
//! `inplace_tests::fake_kubelet`) says: crash after start, fail or hang health checks.
//! `fake-kubelet get URL` is a tiny HTTP client for probing from inside a node
//! (prints the body, exits 0 only on 200).
//! Options: `--config PATH`.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::ExitCode;
use std::time::Duration;

use inplace_tests::fake_kubelet::{CONFIG_PATH, FakeKubeletConfig, Healthz};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut config_path = CONFIG_PATH.to_owned();
    let mut rest = Vec::new();
    let mut it = args.into_iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--config" => match it.next() {
                Some(p) => config_path = p,
                None => return fail("--config needs a path"),
            },
            _ => rest.push(arg),
        }
    }
    if rest.first().map(String::as_str) == Some("get") {
        return match rest.get(1) {
            Some(url) => get(url),
            None => fail("get needs a URL"),
        };
    }
    let config = match std::fs::read_to_string(&config_path)
        .map_err(|e| format!("reading {config_path}: {e}"))
        .and_then(|t| FakeKubeletConfig::parse(&t).map_err(|e| format!("{config_path}: {e}")))
    {
        Ok(c) => c,
        Err(e) => return fail(&e),
    };
    if rest.iter().any(|a| a == "--version") {
        println!("Kubernetes {}", config.version);
        return ExitCode::SUCCESS;
    }
    if let Some(other) = rest.first() {
        return fail(&format!("unknown argument {other:?}"));
    }
    serve(&config)
}

fn fail(message: &str) -> ExitCode {
    eprintln!("fake-kubelet: {message}");
    ExitCode::FAILURE
}

fn serve(config: &FakeKubeletConfig) -> ExitCode {
    let listener = match TcpListener::bind(("127.0.0.1", config.port)) {
        Ok(l) => l,
        Err(e) => return fail(&format!("binding 127.0.0.1:{}: {e}", config.port)),
    };
    eprintln!(
        "fake-kubelet {} listening on 127.0.0.1:{} (crash={}, healthz={:?})",
        config.version, config.port, config.crash, config.healthz
    );
    if config.crash {
        let after = Duration::from_millis(config.crash_after_ms);
        std::thread::spawn(move || {
            std::thread::sleep(after);
            eprintln!("fake-kubelet: crashing as built to");
            std::process::exit(1);
        });
    }
    for stream in listener.incoming() {
        match stream {
            Ok(stream) => {
                let config = config.clone();
                std::thread::spawn(move || handle(stream, &config));
            }
            Err(e) => eprintln!("fake-kubelet: accept: {e}"),
        }
    }
    ExitCode::SUCCESS
}

fn handle(mut stream: TcpStream, config: &FakeKubeletConfig) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 16384 {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let head = String::from_utf8_lossy(&buf);
    let path = head.split_whitespace().nth(1).unwrap_or("/");
    let (status, body) = match path {
        "/healthz" => match config.healthz {
            Healthz::Ok => ("200 OK", "ok".to_owned()),
            Healthz::Fail => ("500 Internal Server Error", "unhealthy".to_owned()),
            Healthz::Hang => {
                std::thread::sleep(Duration::from_secs(3600));
                return;
            }
        },
        "/version" => (
            "200 OK",
            format!("{{\"gitVersion\":\"{}\"}}", config.version),
        ),
        _ => ("404 Not Found", "not found".to_owned()),
    };
    let _ = write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

fn get(url: &str) -> ExitCode {
    let Some(rest) = url.strip_prefix("http://") else {
        return fail("get: only http:// URLs");
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let mut stream = match TcpStream::connect(authority) {
        Ok(s) => s,
        Err(e) => return fail(&format!("get: connecting to {authority}: {e}")),
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    if let Err(e) = write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n"
    ) {
        return fail(&format!("get: {e}"));
    }
    let mut response = Vec::new();
    if let Err(e) = stream.read_to_end(&mut response) {
        return fail(&format!("get: reading: {e}"));
    }
    let text = String::from_utf8_lossy(&response);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    print!("{body}");
    let ok = head.split_whitespace().nth(1) == Some("200");
    if ok {
        ExitCode::SUCCESS
    } else {
        eprintln!("fake-kubelet get: {}", head.lines().next().unwrap_or(""));
        ExitCode::FAILURE
    }
}
