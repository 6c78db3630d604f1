//! Rendezvous key-value store: PyTorch's TCPStore protocol, client and server.
//!
//! The client lets our binaries run as workers under the real torchrun (whose agent hosts the
//! store); the server backs `ddprun` and rank 0 when no agent store exists.

mod client;
pub mod protocol;
mod server;

pub(crate) use client::is_timeout;
pub use client::StoreClient;
pub use server::StoreServer;

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn pair() -> (StoreServer, StoreClient, StoreClient) {
        let server = StoreServer::bind("127.0.0.1", 0).unwrap();
        let t = Duration::from_secs(5);
        let a = StoreClient::connect("127.0.0.1", server.port(), "/worker/attempt_0/", t).unwrap();
        let b = StoreClient::connect("127.0.0.1", server.port(), "/worker/attempt_0/", t).unwrap();
        (server, a, b)
    }

    #[test]
    fn set_get_add_check_delete() {
        let (_s, mut a, mut b) = pair();
        a.set("k", b"hello").unwrap();
        assert_eq!(b.get("k").unwrap(), b"hello");
        assert_eq!(a.add("n", 2).unwrap(), 2);
        assert_eq!(b.add("n", 3).unwrap(), 5);
        assert_eq!(a.get("n").unwrap(), b"5");
        assert!(a.check(&["k", "n"]).unwrap());
        assert!(!a.check(&["k", "missing"]).unwrap());
        assert!(a.delete("k").unwrap());
        assert!(!a.delete("k").unwrap());
        assert_eq!(a.compare_set("c", b"", b"x").unwrap(), b"x");
        assert_eq!(a.compare_set("c", b"y", b"z").unwrap(), b"x");
        assert_eq!(a.compare_set("c", b"x", b"z").unwrap(), b"z");
        a.append("c", b"!").unwrap();
        assert_eq!(
            a.multi_get(&["c", "n"]).unwrap(),
            vec![b"z!".to_vec(), b"5".to_vec()]
        );
        assert_eq!(a.num_keys().unwrap(), 2);
    }

    #[test]
    fn wait_blocks_until_set_from_other_connection() {
        let (_s, mut a, mut b) = pair();
        let h = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            b.set("late", b"1").unwrap();
        });
        a.wait(&["late"], Duration::from_secs(5)).unwrap();
        h.join().unwrap();
    }

    #[test]
    fn wait_timeout_names_missing_keys_and_connection_stays_usable() {
        let (_s, mut a, _b) = pair();
        a.set("here", b"1").unwrap();
        let t0 = Instant::now();
        let err = a
            .wait(&["here", "never"], Duration::from_millis(200))
            .unwrap_err();
        // Back after its 200 ms, not hung (with room for a loaded CI machine).
        assert!(t0.elapsed() < Duration::from_secs(10));
        let msg = err.to_string();
        assert!(msg.contains("never") && !msg.contains("\"here\""), "{msg}");
        assert_eq!(a.get("here").unwrap(), b"1");
    }

    #[test]
    fn server_rejects_connection_without_validate() {
        use std::io::{Read, Write};
        let s = StoreServer::bind("127.0.0.1", 0).unwrap();
        let mut c = std::net::TcpStream::connect(("127.0.0.1", s.port())).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        c.write_all(&[protocol::Cmd::Ping as u8, 1, 2, 3, 4])
            .unwrap();
        let mut b = [0u8; 4];
        assert!(matches!(c.read(&mut b), Ok(0) | Err(_)));
    }

    #[test]
    fn connect_to_nothing_times_out_with_store_error() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let err =
            StoreClient::connect("127.0.0.1", port, "", Duration::from_millis(200)).unwrap_err();
        assert!(err.to_string().contains("connect"), "{err}");
    }
}
