//! TCPStore client: speaks PyTorch's protocol, so it works against the store that the real
//! torchrun agent hosts and against our [`super::StoreServer`].
//!
//! Mirrors `TCPStore.cpp` (client side): VALIDATE first on every connection, GET is WAIT+GET, a
//! timed-out WAIT is followed by CANCEL_WAIT (and a STOP_WAITING that raced it is drained).
//! Every request has a deadline: the socket's read/write timeouts are set from it.

use super::protocol::{self as p, Cmd};
use crate::error::{DdpError, Result};
use g4ft_wait::Schedule;
use std::io::{self, BufReader};
use std::net::{IpAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// How often a connection attempt that keeps failing says so.
const CONNECT_NOTE_EVERY: Duration = Duration::from_secs(5);

/// One connection to a TCPStore; keys get `prefix` prepended (PyTorch's `PrefixStore`).
#[derive(Debug)]
pub struct StoreClient {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    addr: String,
    prefix: String,
    timeout: Duration,
}

impl StoreClient {
    /// Connects to `host:port` (retrying until `timeout`: the server may still be starting),
    /// sends VALIDATE and checks the server with a PING. `prefix` is prepended to every key
    /// (e.g. `/worker/attempt_0/`); `timeout` bounds every later request.
    pub fn connect(host: &str, port: u16, prefix: &str, timeout: Duration) -> Result<Self> {
        let addr = format!("{host}:{port}");
        let start = Instant::now();
        let deadline = start + timeout;
        let mut notes = Schedule::new(CONNECT_NOTE_EVERY, CONNECT_NOTE_EVERY);
        let stream = loop {
            let attempt = (host, port)
                .to_socket_addrs()
                .and_then(|mut a| a.next().ok_or_else(|| io::Error::other("no address")))
                .and_then(|sa| TcpStream::connect_timeout(&sa, Duration::from_secs(1)));
            match attempt {
                Ok(s) => break s,
                Err(e) if Instant::now() >= deadline => {
                    return Err(DdpError::Store {
                        addr,
                        op: "connect",
                        key: String::new(),
                        reason: format!(
                            "{e} (retried for {timeout:?}; is the launcher or rank 0 up?)"
                        ),
                    })
                }
                Err(e) => {
                    if notes.due_now() {
                        // Nothing waits silently: say what, how long, and who should be there.
                        eprintln!(
                            "store {addr}: not reachable yet after {} s of {} s ({e}); waiting for rank 0 or the launcher to host it",
                            start.elapsed().as_secs(),
                            timeout.as_secs()
                        );
                    }
                    std::thread::sleep(Duration::from_millis(50))
                }
            }
        };
        let _ = stream.set_nodelay(true);
        let writer = stream
            .try_clone()
            .map_err(|e| store_io(&addr, "connect", "", e))?;
        let mut c = StoreClient {
            reader: BufReader::new(stream),
            writer,
            addr,
            prefix: prefix.to_string(),
            timeout,
        };
        let mut buf = vec![Cmd::Validate as u8];
        buf.extend_from_slice(&p::VALIDATION_MAGIC.to_ne_bytes());
        c.send("VALIDATE", "", &buf)?;
        c.ping()?;
        Ok(c)
    }

    /// `host:port` of the store.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// The key prefix in use.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The default request timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Local IP address of this connection: the interface through which peers can reach us
    /// (127.0.0.1 when the store is on loopback).
    pub fn local_ip(&self) -> Result<IpAddr> {
        self.writer
            .local_addr()
            .map(|a| a.ip())
            .map_err(|e| store_io(&self.addr, "local_addr", "", e))
    }

    /// SET `key` = `value` (no reply on the wire).
    pub fn set(&mut self, key: &str, value: &[u8]) -> Result<()> {
        let k = self.key(key);
        let mut buf = vec![Cmd::Set as u8];
        p::put_blob(&mut buf, k.as_bytes());
        p::put_blob(&mut buf, value);
        self.send("SET", &k, &buf)
    }

    /// GET `key`, waiting up to the client timeout for it to exist (WAIT first, as PyTorch does).
    pub fn get(&mut self, key: &str) -> Result<Vec<u8>> {
        self.wait(&[key], self.timeout)?;
        let k = self.key(key);
        let mut buf = vec![Cmd::Get as u8];
        p::put_blob(&mut buf, k.as_bytes());
        self.send("GET", &k, &buf)?;
        self.recv("GET", &k, self.timeout, p::read_blob)
    }

    /// ADD `delta` to the integer at `key` (created as 0); returns the new value.
    pub fn add(&mut self, key: &str, delta: i64) -> Result<i64> {
        let k = self.key(key);
        let mut buf = vec![Cmd::Add as u8];
        p::put_blob(&mut buf, k.as_bytes());
        buf.extend_from_slice(&delta.to_ne_bytes());
        self.send("ADD", &k, &buf)?;
        self.recv("ADD", &k, self.timeout, p::read_i64)
    }

    /// CHECK: whether all `keys` exist, without waiting.
    pub fn check(&mut self, keys: &[&str]) -> Result<bool> {
        let (buf, joined) = self.keys_request(Cmd::Check, keys);
        self.send("CHECK", &joined, &buf)?;
        let r = self.recv("CHECK", &joined, self.timeout, p::read_u8)?;
        Ok(r == p::READY)
    }

    /// WAIT until all `keys` exist. On timeout cancels the wait and returns
    /// [`DdpError::StoreTimeout`] listing the keys (without prefix) that are still missing.
    pub fn wait(&mut self, keys: &[&str], timeout: Duration) -> Result<()> {
        let (buf, joined) = self.keys_request(Cmd::Wait, keys);
        self.send("WAIT", &joined, &buf)?;
        match self.recv_raw(timeout, p::read_u8) {
            Ok(p::STOP_WAITING) => return Ok(()),
            Ok(other) => {
                return Err(self.proto("WAIT", &joined, format!("reply {other}, expected 0")))
            }
            Err(e) if is_timeout(&e) => {}
            Err(e) => return Err(store_io(&self.addr, "WAIT", &joined, e)),
        }
        self.send("CANCEL_WAIT", &joined, &[Cmd::CancelWait as u8])?;
        let mut r = self.recv("CANCEL_WAIT", &joined, self.timeout, p::read_u8)?;
        if r == p::STOP_WAITING {
            // The keys appeared just before the cancel arrived; the cancel reply follows.
            r = self.recv("CANCEL_WAIT", &joined, self.timeout, p::read_u8)?;
        }
        if r != p::WAIT_CANCELED {
            return Err(self.proto("CANCEL_WAIT", &joined, format!("reply {r}, expected 1")));
        }
        let mut missing = Vec::new();
        for k in keys {
            if !self.check(&[k])? {
                missing.push(k.to_string());
            }
        }
        Err(DdpError::StoreTimeout {
            addr: self.addr.clone(),
            keys: missing,
            timeout,
            hint: String::new(),
        })
    }

    /// DELETE_KEY; returns whether the key existed.
    pub fn delete(&mut self, key: &str) -> Result<bool> {
        let k = self.key(key);
        let mut buf = vec![Cmd::DeleteKey as u8];
        p::put_blob(&mut buf, k.as_bytes());
        self.send("DELETE_KEY", &k, &buf)?;
        Ok(self.recv("DELETE_KEY", &k, self.timeout, p::read_i64)? > 0)
    }

    /// GETNUMKEYS: number of keys in the whole store (all prefixes).
    pub fn num_keys(&mut self) -> Result<i64> {
        self.send("GETNUMKEYS", "", &[Cmd::GetNumKeys as u8])?;
        self.recv("GETNUMKEYS", "", self.timeout, p::read_i64)
    }

    /// MULTI_GET of keys that must already exist (WAITs for them first).
    pub fn multi_get(&mut self, keys: &[&str]) -> Result<Vec<Vec<u8>>> {
        self.wait(keys, self.timeout)?;
        let (buf, joined) = self.keys_request(Cmd::MultiGet, keys);
        self.send("MULTI_GET", &joined, &buf)?;
        let n = keys.len();
        self.recv("MULTI_GET", &joined, self.timeout, |r| {
            (0..n).map(|_| p::read_blob(r)).collect()
        })
    }

    /// COMPARE_SET: sets `desired` if the current value equals `expected` (or the key is missing
    /// and `expected` is empty); returns the value now stored.
    pub fn compare_set(&mut self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>> {
        let k = self.key(key);
        let mut buf = vec![Cmd::CompareSet as u8];
        p::put_blob(&mut buf, k.as_bytes());
        p::put_blob(&mut buf, expected);
        p::put_blob(&mut buf, desired);
        self.send("COMPARE_SET", &k, &buf)?;
        self.recv("COMPARE_SET", &k, self.timeout, p::read_blob)
    }

    /// APPEND `value` to the bytes at `key` (created if missing; no reply).
    pub fn append(&mut self, key: &str, value: &[u8]) -> Result<()> {
        let k = self.key(key);
        let mut buf = vec![Cmd::Append as u8];
        p::put_blob(&mut buf, k.as_bytes());
        p::put_blob(&mut buf, value);
        self.send("APPEND", &k, &buf)
    }

    /// PING with a nonce; errors if the echo differs (not a TCPStore, or a desynced stream).
    pub fn ping(&mut self) -> Result<()> {
        let nonce = std::process::id() ^ 0x5a5a_1234;
        let mut buf = vec![Cmd::Ping as u8];
        buf.extend_from_slice(&nonce.to_ne_bytes());
        self.send("PING", "", &buf)?;
        let echo = self.recv("PING", "", self.timeout, p::read_u32)?;
        if echo != nonce {
            return Err(self.proto("PING", "", format!("echo {echo:#x}, expected {nonce:#x}")));
        }
        Ok(())
    }

    fn key(&self, key: &str) -> String {
        format!("{}{}", self.prefix, key)
    }

    fn keys_request(&self, cmd: Cmd, keys: &[&str]) -> (Vec<u8>, String) {
        let mut buf = vec![cmd as u8];
        buf.extend_from_slice(&(keys.len() as u64).to_ne_bytes());
        for k in keys {
            p::put_blob(&mut buf, self.key(k).as_bytes());
        }
        let joined = keys
            .iter()
            .map(|k| self.key(k))
            .collect::<Vec<_>>()
            .join(",");
        (buf, joined)
    }

    fn send(&mut self, op: &'static str, key: &str, buf: &[u8]) -> Result<()> {
        let _ = self.writer.set_write_timeout(Some(self.timeout));
        p::send(&mut self.writer, buf).map_err(|e| store_io(&self.addr, op, key, e))
    }

    fn recv<T>(
        &mut self,
        op: &'static str,
        key: &str,
        timeout: Duration,
        f: impl FnOnce(&mut BufReader<TcpStream>) -> io::Result<T>,
    ) -> Result<T> {
        self.recv_raw(timeout, f)
            .map_err(|e| store_io(&self.addr, op, key, e))
    }

    fn recv_raw<T>(
        &mut self,
        timeout: Duration,
        f: impl FnOnce(&mut BufReader<TcpStream>) -> io::Result<T>,
    ) -> io::Result<T> {
        self.reader
            .get_ref()
            .set_read_timeout(Some(timeout.max(Duration::from_millis(1))))?;
        f(&mut self.reader)
    }

    fn proto(&self, op: &'static str, key: &str, reason: String) -> DdpError {
        DdpError::Store {
            addr: self.addr.clone(),
            op,
            key: key.into(),
            reason: format!("protocol error: {reason}"),
        }
    }
}

/// True for the errors a socket read timeout produces.
pub(crate) fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

fn store_io(addr: &str, op: &'static str, key: &str, e: io::Error) -> DdpError {
    let reason = match e.kind() {
        io::ErrorKind::UnexpectedEof => "server closed the connection".to_string(),
        _ if is_timeout(&e) => format!("no reply in time ({e})"),
        _ => e.to_string(),
    };
    DdpError::Store {
        addr: addr.into(),
        op,
        key: key.into(),
        reason,
    }
}
