//! The fault layer the tests share: an HTTP-aware TCP proxy between
//! inferlog and one server (ClickHouse's HTTP interface, one replica of
//! the cluster), driven by the test while the code under test runs.
//!
//! In: the client's requests. Out: each forwarded to the server, or met
//! with the fault of the first rule that matches it:
//!
//! - [`Fault::Reset`]: the connection is closed before the server sees the
//!   request (a refused insert that never landed), after a delay so that a
//!   request running beside it can finish first;
//! - [`Fault::LoseAnswer`]: the request goes to the server, which answers;
//!   the answer is read and thrown away, and the client's connection closed
//!   (an insert stored whose acknowledgement was lost);
//! - [`Fault::Delay`]: the answer is held back (past a client's timeout);
//! - [`Fault::Blackhole`]: the request is read and never answered.
//!
//! A rule matches a request whose request line (percent-decoded: the
//! ClickHouse client sends its INSERT statement in the URL) contains its
//! pattern; it lets `skip` matching requests pass, then applies its fault to
//! the next `times`. Toxiproxy (a TCP-level proxy with an HTTP API) cannot
//! pick one request out of a connection, so the tests do not use it.
//!
//! Every request is forwarded with `Connection: close`, so each connection
//! carries exactly one request and each is seen here. What the proxy did is
//! kept ([`FaultProxy::fired`]), so a test can assert that its fault
//! happened while the code ran.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What happens to a matched request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Closed unanswered after `after`, never forwarded.
    Reset { after: Duration },
    /// Forwarded and answered by the server; the answer is dropped.
    LoseAnswer,
    /// Forwarded; the answer is held back this long.
    Delay(Duration),
    /// Read and never answered.
    Blackhole,
}

/// Which requests get a fault.
#[derive(Debug, Clone)]
pub struct Rule {
    /// A substring of the percent-decoded request line.
    pub pattern: String,
    /// Matching requests let through before the fault applies.
    pub skip: usize,
    /// Matching requests the fault applies to, after `skip`.
    pub times: usize,
    pub fault: Fault,
}

impl Rule {
    /// The `n`th (from 1) request matching `pattern` gets `fault`, once.
    pub fn nth(pattern: impl Into<String>, n: usize, fault: Fault) -> Rule {
        Rule { pattern: pattern.into(), skip: n.saturating_sub(1), times: 1, fault }
    }
}

#[derive(Debug, Default)]
struct State {
    rules: Vec<(Rule, usize)>,
    /// (request line, fault applied) of every request seen.
    seen: Vec<(String, Option<Fault>)>,
}

impl State {
    fn decide(&mut self, line: &str) -> Option<Fault> {
        let mut fault = None;
        for (rule, matched) in &mut self.rules {
            if !line.contains(&rule.pattern) {
                continue;
            }
            *matched += 1;
            if fault.is_none() && *matched > rule.skip && *matched <= rule.skip + rule.times {
                fault = Some(rule.fault);
            }
        }
        self.seen.push((line.to_owned(), fault));
        fault
    }
}

/// A proxy on a free loopback port in front of `upstream` (host:port).
/// Stops accepting when dropped.
#[derive(Debug)]
pub struct FaultProxy {
    addr: String,
    state: Arc<Mutex<State>>,
    stopped: Arc<AtomicBool>,
}

impl FaultProxy {
    pub fn start(upstream: &str) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the fault proxy");
        let addr = listener.local_addr().expect("its address").to_string();
        let state = Arc::new(Mutex::new(State::default()));
        let stopped = Arc::new(AtomicBool::new(false));
        let (upstream, shared, stop) = (upstream.to_owned(), state.clone(), stopped.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(client) = client else { continue };
                let (upstream, shared, stop) = (upstream.clone(), shared.clone(), stop.clone());
                std::thread::spawn(move || serve(client, &upstream, &shared, &stop));
            }
        });
        FaultProxy { addr, state, stopped }
    }

    /// In front of the local ClickHouse's HTTP interface.
    pub fn clickhouse() -> FaultProxy {
        let url = crate::clickhouse_url();
        FaultProxy::start(url.trim_start_matches("http://").trim_end_matches('/'))
    }

    /// `http://` and the proxy's address: the URL inferlog is given.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn add(&self, rule: Rule) {
        self.state.lock().expect("proxy state").rules.push((rule, 0));
    }

    /// Removes every rule: requests pass from now on.
    pub fn clear(&self) {
        self.state.lock().expect("proxy state").rules.clear();
    }

    /// The request lines that met a fault, with it.
    pub fn fired(&self) -> Vec<(String, Fault)> {
        self.state.lock().expect("proxy state").seen.iter().filter_map(|(line, f)| f.map(|f| (line.clone(), f))).collect()
    }

    /// How many requests seen so far contain `pattern`.
    pub fn seen(&self, pattern: &str) -> usize {
        self.state.lock().expect("proxy state").seen.iter().filter(|(line, _)| line.contains(pattern)).count()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stopped.store(true, Ordering::Relaxed);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(&self.addr);
    }
}

/// Percent-decoding of a request line (`+` is a space in a query string).
fn decode(line: &str) -> String {
    let bytes = line.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => match u8::from_str_radix(std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("zz"), 16) {
                Ok(b) => {
                    out.push(b);
                    i += 3;
                    continue;
                }
                Err(_) => out.push(b'%'),
            },
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Reads the request head (through the blank line); returns it and any
/// bytes of the body read with it.
fn read_head(client: &mut TcpStream) -> Option<(Vec<u8>, Vec<u8>)> {
    let mut buf = Vec::with_capacity(8192);
    let mut chunk = [0u8; 8192];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(end + 4);
            return Some((buf, rest));
        }
        let n = client.read(&mut chunk).ok()?;
        if n == 0 || buf.len() > 1 << 20 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// The head with `Connection: close` in place of any connection header.
fn one_request(head: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(head);
    let mut out = String::with_capacity(text.len() + 20);
    for line in text.trim_end_matches("\r\n").split("\r\n") {
        let name = line.split(':').next().unwrap_or("").trim().to_ascii_lowercase();
        if name == "connection" || name == "keep-alive" {
            continue;
        }
        out.push_str(line);
        out.push_str("\r\n");
    }
    out.push_str("Connection: close\r\n\r\n");
    out.into_bytes()
}

fn serve(mut client: TcpStream, upstream: &str, state: &Mutex<State>, stopped: &AtomicBool) {
    let Some((head, rest)) = read_head(&mut client) else { return };
    let line = decode(String::from_utf8_lossy(head.split(|b| *b == b'\r').next().unwrap_or_default()).as_ref());
    let fault = state.lock().map(|mut s| s.decide(&line)).unwrap_or(None);
    match fault {
        Some(Fault::Reset { after }) => {
            std::thread::sleep(after);
            // Unread request bytes make the kernel answer the close with a reset.
            let _ = client.shutdown(Shutdown::Both);
            return;
        }
        Some(Fault::Blackhole) => {
            let mut sink = [0u8; 8192];
            let _ = client.set_read_timeout(Some(Duration::from_millis(200)));
            while !stopped.load(Ordering::Relaxed) {
                match client.read(&mut sink) {
                    Ok(0) => return,
                    Ok(_) => {}
                    Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                    Err(_) => return,
                }
            }
            return;
        }
        _ => {}
    }
    let Ok(mut server) = TcpStream::connect(upstream) else {
        let _ = client.shutdown(Shutdown::Both);
        return;
    };
    if server.write_all(&one_request(&head)).is_err() || server.write_all(&rest).is_err() {
        return;
    }
    // The rest of the body, client to server, beside the answer.
    let (Ok(mut from_client), Ok(mut to_server)) = (client.try_clone(), server.try_clone()) else { return };
    let body = std::thread::spawn(move || {
        let _ = std::io::copy(&mut from_client, &mut to_server);
        let _ = to_server.shutdown(Shutdown::Write);
    });
    let mut answer = Vec::new();
    let _ = server.read_to_end(&mut answer);
    match fault {
        Some(Fault::LoseAnswer) => {}
        Some(Fault::Delay(d)) => {
            std::thread::sleep(d);
            let _ = client.write_all(&answer);
        }
        _ => {
            let _ = client.write_all(&answer);
        }
    }
    let _ = client.shutdown(Shutdown::Both);
    let _ = body.join();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_line_is_percent_decoded() {
        assert_eq!(decode("POST /?query=INSERT%20INTO%20db.t%20(a)+FORMAT HTTP/1.1"), "POST /?query=INSERT INTO db.t (a) FORMAT HTTP/1.1");
    }

    #[test]
    fn a_rule_skips_then_fires_its_number_of_times() {
        let mut state = State::default();
        state.rules.push((Rule { pattern: "INSERT".into(), skip: 1, times: 1, fault: Fault::LoseAnswer }, 0));
        let faults: Vec<Option<Fault>> = ["SELECT 1", "INSERT a", "INSERT b", "INSERT c"].iter().map(|l| state.decide(l)).collect();
        assert_eq!(faults, vec![None, None, Some(Fault::LoseAnswer), None]);
    }

    #[test]
    fn the_forwarded_head_asks_for_one_request_per_connection() {
        let head = b"POST / HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\n\r\n";
        assert_eq!(String::from_utf8(one_request(head)).expect("utf8"), "POST / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    }
}
