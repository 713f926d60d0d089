//! A plain HTTP/1.0 GET against a replica's admin port (no client dependency).

/// (status code, body) of `GET path`; (0, "") when nothing answers.
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut s) = tokio::net::TcpStream::connect(addr).await else { return (0, String::new()) };
    if s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes()).await.is_err() {
        return (0, String::new());
    }
    let mut buf = String::new();
    let _ = s.read_to_string(&mut buf).await;
    let code = buf.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (code, buf.split_once("\r\n\r\n").map_or(String::new(), |(_, b)| b.to_string()))
}

/// The value of the first sample of `metric` (a name with labels, as rendered) in an exposition.
pub fn sample(exposition: &str, metric: &str) -> Option<f64> {
    exposition
        .lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(metric).and_then(|rest| rest.trim().parse().ok()))
}
