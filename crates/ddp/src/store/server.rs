//! TCPStore server: PyTorch's protocol served from a thread per connection.
//!
//! Used by `ddprun` (the agent store) and by rank 0 when `TORCHELASTIC_USE_AGENT_STORE` is not
//! `True`. Semantics follow `TCPStoreBackend.cpp`: a connection must VALIDATE first, ADD stores
//! ASCII decimal, COMPARE_SET on a missing key sets only when `expected` is empty, a blocked WAIT
//! can be cancelled with CANCEL_WAIT. Dropping the server closes every connection.

use super::protocol::{self as p, Cmd};
use crate::error::{DdpError, Result};
use std::collections::HashMap;
use std::io::{self, BufReader, Read};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

#[derive(Default)]
struct State {
    map: Mutex<HashMap<String, Vec<u8>>>,
    changed: Condvar,
}

/// A running TCPStore server; stops and disconnects everyone on drop.
pub struct StoreServer {
    port: u16,
    stop: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
    /// Connections whose serving thread is still running (validated or not).
    live: Arc<AtomicUsize>,
    accept: Option<JoinHandle<()>>,
}

impl StoreServer {
    /// Binds `host:port` (port 0 picks a free one) and starts serving in background threads.
    pub fn bind(host: &str, port: u16) -> Result<Self> {
        let listener = TcpListener::bind((host, port))
            .map_err(|e| DdpError::io(format!("store server: bind {host}:{port}"), e))?;
        let port = listener
            .local_addr()
            .map_err(|e| DdpError::io("store server: local_addr", e))?
            .port();
        let stop = Arc::new(AtomicBool::new(false));
        let conns = Arc::new(Mutex::new(Vec::new()));
        let state = Arc::new(State::default());
        let live = Arc::new(AtomicUsize::new(0));
        let (stop2, conns2, live2) = (stop.clone(), conns.clone(), live.clone());
        let accept = std::thread::Builder::new()
            .name("tcpstore-accept".into())
            .spawn(move || accept_loop(listener, state, stop2, conns2, live2))
            .map_err(|e| DdpError::io("store server: spawn accept thread", e))?;
        Ok(StoreServer {
            port,
            stop,
            conns,
            live,
            accept: Some(accept),
        })
    }

    /// The port actually bound.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Number of client connections being served now.
    pub fn clients(&self) -> usize {
        self.live.load(Ordering::SeqCst)
    }

    /// Blocks until no client is connected or `max` has passed; true when none is left. Lets a
    /// failing rank 0 keep the store up until its peers have read why it failed and left.
    pub fn wait_until_idle(&self, max: Duration) -> bool {
        let deadline = Instant::now() + max;
        while self.clients() > 0 {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        true
    }
}

impl Drop for StoreServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the blocking accept() with a throwaway connection.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        for c in self.conns.lock().expect("store conns lock poisoned").iter() {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

fn accept_loop(
    listener: TcpListener,
    state: Arc<State>,
    stop: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
    live: Arc<AtomicUsize>,
) {
    for conn in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(conn) = conn else { continue };
        let _ = conn.set_nodelay(true);
        if let Ok(c) = conn.try_clone() {
            let mut all = conns.lock().expect("store conns lock poisoned");
            all.retain(|s| s.peer_addr().is_ok());
            all.push(c);
        }
        let (state, served) = (state.clone(), live.clone());
        live.fetch_add(1, Ordering::SeqCst);
        let spawned = std::thread::Builder::new()
            .name("tcpstore-conn".into())
            .spawn(move || {
                // A failing connection (client gone, bad request) only ends its own thread.
                let _ = serve(conn, &state);
                served.fetch_sub(1, Ordering::SeqCst);
            });
        if spawned.is_err() {
            live.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

fn serve(conn: TcpStream, st: &State) -> io::Result<()> {
    let mut w = conn.try_clone()?;
    let mut r = BufReader::new(conn);
    if p::read_u8(&mut r)? != Cmd::Validate as u8 || p::read_u32(&mut r)? != p::VALIDATION_MAGIC {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "connection did not VALIDATE",
        ));
    }
    loop {
        let b = p::read_u8(&mut r)?;
        let cmd = Cmd::from_u8(b)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("command {b}")))?;
        let mut out = Vec::new();
        match cmd {
            Cmd::Validate => {
                p::read_u32(&mut r)?;
            }
            Cmd::Set => {
                let (k, v) = (p::read_string(&mut r)?, p::read_blob(&mut r)?);
                st.update(|m| {
                    m.insert(k, v);
                });
            }
            Cmd::CompareSet => {
                let k = p::read_string(&mut r)?;
                let (expected, desired) = (p::read_blob(&mut r)?, p::read_blob(&mut r)?);
                let now = st.update(|m| match m.get_mut(&k) {
                    None if expected.is_empty() => {
                        m.insert(k, desired.clone());
                        desired
                    }
                    None => expected,
                    Some(cur) => {
                        if *cur == expected {
                            *cur = desired;
                        }
                        cur.clone()
                    }
                });
                p::put_blob(&mut out, &now);
            }
            Cmd::Get => {
                let k = p::read_string(&mut r)?;
                let v = st.lock().get(&k).cloned().unwrap_or_default();
                p::put_blob(&mut out, &v);
            }
            Cmd::Add => {
                let k = p::read_string(&mut r)?;
                let delta = p::read_i64(&mut r)?;
                let new = st.update(|m| {
                    let cur = m
                        .get(&k)
                        .and_then(|v| std::str::from_utf8(v).ok()?.trim().parse::<i64>().ok())
                        .unwrap_or(0);
                    m.insert(k, (cur + delta).to_string().into_bytes());
                    cur + delta
                });
                out.extend_from_slice(&new.to_ne_bytes());
            }
            Cmd::Check => {
                let keys = read_keys(&mut r)?;
                let ready = st.has_all(&keys);
                out.push(if ready { p::READY } else { p::NOT_READY });
            }
            Cmd::Wait => {
                let keys = read_keys(&mut r)?;
                out.push(wait_or_cancel(&mut r, st, &keys)?);
            }
            Cmd::GetNumKeys => out.extend_from_slice(&(st.lock().len() as i64).to_ne_bytes()),
            Cmd::DeleteKey => {
                let k = p::read_string(&mut r)?;
                let n = i64::from(st.lock().remove(&k).is_some());
                out.extend_from_slice(&n.to_ne_bytes());
            }
            Cmd::Append => {
                let (k, v) = (p::read_string(&mut r)?, p::read_blob(&mut r)?);
                st.update(|m| m.entry(k).or_default().extend_from_slice(&v));
            }
            Cmd::MultiGet => {
                let keys = read_keys(&mut r)?;
                let m = st.lock();
                for k in &keys {
                    p::put_blob(&mut out, m.get(k).map_or(&[][..], |v| v));
                }
            }
            Cmd::MultiSet => {
                let n = p::read_u64(&mut r)?;
                let mut pairs = Vec::new();
                for _ in 0..n {
                    pairs.push((p::read_string(&mut r)?, p::read_blob(&mut r)?));
                }
                st.update(|m| m.extend(pairs));
            }
            Cmd::CancelWait => out.push(p::WAIT_CANCELED),
            Cmd::Ping => out.extend_from_slice(&p::read_u32(&mut r)?.to_ne_bytes()),
        }
        if !out.is_empty() {
            p::send(&mut w, &out)?;
        }
    }
}

/// Blocks until `keys` exist (reply STOP_WAITING) or the client sends CANCEL_WAIT (reply
/// WAIT_CANCELED). Polls the socket every 20 ms because this thread also owns the connection.
fn wait_or_cancel(r: &mut BufReader<TcpStream>, st: &State, keys: &[String]) -> io::Result<u8> {
    loop {
        {
            let m = st.lock();
            if keys.iter().all(|k| m.contains_key(k)) {
                return Ok(p::STOP_WAITING);
            }
            let _ = st
                .changed
                .wait_timeout(m, Duration::from_millis(20))
                .expect("store map lock poisoned");
        }
        if st.has_all(keys) {
            return Ok(p::STOP_WAITING);
        }
        if r.buffer().is_empty() {
            let sock = r.get_ref();
            sock.set_nonblocking(true)?;
            let mut b = [0u8; 1];
            let peeked = sock.peek(&mut b);
            sock.set_nonblocking(false)?;
            match peeked {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        }
        let mut b = [0u8; 1];
        r.read_exact(&mut b)?;
        if b[0] != Cmd::CancelWait as u8 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("command {} during WAIT, expected CANCEL_WAIT", b[0]),
            ));
        }
        return Ok(p::WAIT_CANCELED);
    }
}

fn read_keys(r: &mut impl Read) -> io::Result<Vec<String>> {
    let n = p::read_u64(r)?;
    if n > 1 << 20 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{n} keys"),
        ));
    }
    (0..n).map(|_| p::read_string(r)).collect()
}

impl State {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<u8>>> {
        self.map.lock().expect("store map lock poisoned")
    }

    fn update<T>(&self, f: impl FnOnce(&mut HashMap<String, Vec<u8>>) -> T) -> T {
        let out = f(&mut self.lock());
        self.changed.notify_all();
        out
    }

    fn has_all(&self, keys: &[String]) -> bool {
        let m = self.lock();
        keys.iter().all(|k| m.contains_key(k))
    }
}
