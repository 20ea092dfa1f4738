//! A small HTTP/1.1 client for the server's tests: one request per connection, the response read
//! whole (chunked bodies decoded) or as server-sent events one at a time, over loopback only.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use serde_json::Value;

/// A response: status, headers (names lower-cased), body.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Response {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

fn connect(addr: SocketAddr) -> TcpStream {
    assert!(addr.ip().is_loopback(), "tests talk to loopback only");
    let s = TcpStream::connect(addr).expect("connect to the server");
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    s
}

fn send(s: &mut TcpStream, method: &str, path: &str, headers: &[(&str, &str)], body: Option<&str>) {
    let body = body.unwrap_or("");
    let mut extra = String::new();
    for (n, v) in headers {
        for part in [*n, ": ", *v, "\r\n"] {
            extra.push_str(part);
        }
    }
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{extra}Connection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).expect("send the request");
}

/// The status line and headers.
fn head(r: &mut impl BufRead) -> (u16, Vec<(String, String)>) {
    let mut line = String::new();
    r.read_line(&mut line).expect("status line");
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {line:?}"));
    let mut headers = Vec::new();
    loop {
        line.clear();
        r.read_line(&mut line).expect("header line");
        let l = line.trim_end();
        if l.is_empty() {
            return (status, headers);
        }
        if let Some((n, v)) = l.split_once(':') {
            headers.push((n.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
}

/// Sends one request and reads the whole response.
pub fn request(addr: SocketAddr, method: &str, path: &str, body: Option<&str>) -> Response {
    request_with(addr, method, path, &[], body)
}

/// Sends one request with extra `headers` and reads the whole response.
pub fn request_with(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> Response {
    let mut s = connect(addr);
    send(&mut s, method, path, headers, body);
    let mut r = BufReader::new(s);
    let (status, headers) = head(&mut r);
    let chunked = headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v.contains("chunked"));
    let mut body = Vec::new();
    if chunked {
        while let Some(chunk) = read_chunk(&mut r) {
            body.extend(chunk);
        }
    } else {
        r.read_to_end(&mut body).expect("the body");
    }
    Response {
        status,
        headers,
        body: String::from_utf8(body).expect("a UTF-8 body"),
    }
}

pub fn get(addr: SocketAddr, path: &str) -> Response {
    request(addr, "GET", path, None)
}

pub fn post(addr: SocketAddr, path: &str, body: &Value) -> Response {
    request(addr, "POST", path, Some(&body.to_string()))
}

/// One chunk of a chunked body; `None` at its end (or when the connection closed).
fn read_chunk(r: &mut impl BufRead) -> Option<Vec<u8>> {
    let mut line = String::new();
    if r.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let size = usize::from_str_radix(line.trim(), 16).ok()?;
    let mut data = vec![0; size + 2];
    r.read_exact(&mut data).ok()?;
    data.truncate(size);
    (size > 0).then_some(data)
}

/// A streamed response, read one server-sent event at a time.
pub struct Events {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    reader: BufReader<TcpStream>,
    pending: String,
}

impl Events {
    /// Posts `body` to `path` and reads the response head.
    pub fn open(addr: SocketAddr, path: &str, body: &Value) -> Self {
        let mut s = connect(addr);
        send(&mut s, "POST", path, &[], Some(&body.to_string()));
        let mut reader = BufReader::new(s);
        let (status, headers) = head(&mut reader);
        Self {
            status,
            headers,
            reader,
            pending: String::new(),
        }
    }

    /// The next event's data (`[DONE]` included); `None` when the stream ended.
    pub fn next_data(&mut self) -> Option<String> {
        loop {
            if let Some(i) = self.pending.find("\n\n") {
                let event: String = self.pending.drain(..i + 2).collect();
                let data = event
                    .lines()
                    .filter_map(|l| l.strip_prefix("data: "))
                    .collect::<Vec<_>>()
                    .join("\n");
                return Some(data);
            }
            let chunk = read_chunk(&mut self.reader)?;
            self.pending
                .push_str(&String::from_utf8(chunk).expect("UTF-8 events"));
        }
    }

    /// Every event until `[DONE]` (excluded), as JSON; panics if the stream ends without it.
    pub fn all(mut self) -> Vec<Value> {
        let mut out = Vec::new();
        loop {
            let data = self.next_data().expect("the stream ends with data: [DONE]");
            if data == "[DONE]" {
                assert!(self.next_data().is_none(), "nothing after [DONE]");
                return out;
            }
            out.push(serde_json::from_str(&data).expect("a JSON event"));
        }
    }
}

/// The text of a stream's events (completions' `text`, chat's `delta.content`), and the finish
/// reason of its last choice.
pub fn stream_text(events: &[Value]) -> (String, Option<String>) {
    let mut text = String::new();
    let mut reason = None;
    for e in events {
        for c in e["choices"].as_array().into_iter().flatten() {
            if let Some(t) = c["text"].as_str() {
                text.push_str(t);
            }
            if let Some(t) = c["delta"]["content"].as_str() {
                text.push_str(t);
            }
            if let Some(r) = c["finish_reason"].as_str() {
                reason = Some(r.to_string());
            }
        }
    }
    (text, reason)
}

/// A metric's value in a Prometheus text: the first sample of `name` whose labels contain `labels`.
pub fn metric(text: &str, name: &str, labels: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(labels))
        .find_map(|l| l.rsplit(' ').next().and_then(|v| v.parse().ok()))
        .unwrap_or_else(|| panic!("no sample of {name} with {labels:?} in:\n{text}"))
}
