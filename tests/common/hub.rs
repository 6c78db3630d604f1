//! A small HTTP server on 127.0.0.1 that serves a model or dataset directory in the Hugging Face
//! Hub's URL layout (`/{owner}/{name}/resolve/{revision}/{file}`, `/datasets/{owner}/{name}/...`,
//! with the `etag`, `x-repo-commit` and `content-range` headers `hf-hub` reads, and the file list
//! at `/api/datasets/{owner}/{name}/revision/{revision}`), optionally requiring a bearer token like
//! a gated repository, and records every request.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// One request: its path and its `Range` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub path: String,
    pub range: Option<String>,
}

/// The running server; it stops when the test process ends.
pub struct HubServer {
    pub port: u16,
    pub requests: Arc<Mutex<Vec<Request>>>,
}

impl HubServer {
    /// Serves the files of `dir` as model repository `repo` at any revision, answering 401
    /// without `Authorization: Bearer <token>` when `token` is given.
    pub fn start(dir: &Path, repo: &str, token: Option<&str>) -> Self {
        Self::serve(dir, repo.to_string(), token)
    }

    /// Serves the files of `dir` as dataset repository `repo`, with its file list.
    pub fn start_dataset(dir: &Path, repo: &str) -> Self {
        Self::serve(dir, format!("datasets/{repo}"), None)
    }

    fn serve(dir: &Path, repo: String, token: Option<&str>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let dir = dir.to_path_buf();
        let token = token.map(str::to_string);
        let log = requests.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().map_while(Result::ok) {
                let (dir, repo, token, log) =
                    (dir.clone(), repo.clone(), token.clone(), log.clone());
                std::thread::spawn(move || {
                    let _ = answer(stream, &dir, &repo, token.as_deref(), &log);
                });
            }
        });
        Self { port, requests }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// How many full downloads (not the `bytes=0-0` probes) of `file` were served.
    pub fn downloads(&self, file: &str) -> usize {
        self.requests
            .lock()
            .unwrap()
            .iter()
            .filter(|r| {
                r.path.ends_with(&format!("/{file}")) && r.range.as_deref() != Some("bytes=0-0")
            })
            .count()
    }
}

fn answer(
    stream: TcpStream,
    dir: &Path,
    repo: &str,
    token: Option<&str>,
    log: &Mutex<Vec<Request>>,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
    let (mut range, mut auth) = (None, None);
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h.trim().is_empty() {
            break;
        }
        let (k, v) = h.split_once(':').unwrap_or((&h, ""));
        match k.trim().to_ascii_lowercase().as_str() {
            "range" => range = Some(v.trim().to_string()),
            "authorization" => auth = Some(v.trim().to_string()),
            _ => {}
        }
    }
    log.lock().unwrap().push(Request {
        path: path.clone(),
        range: range.clone(),
    });
    let mut out = stream;
    let reply = |out: &mut TcpStream, status: &str, headers: &[(String, String)], body: &[u8]| {
        let mut head = format!(
            "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n",
            body.len()
        );
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        out.write_all(head.as_bytes())?;
        out.write_all(body)
    };
    if let Some(t) = token {
        if auth.as_deref() != Some(&format!("Bearer {t}")) {
            return reply(&mut out, "401 Unauthorized", &[], b"gated");
        }
    }
    if let Some(rev) = path
        .strip_prefix(&format!("/api/{repo}/revision/"))
        .filter(|_| repo.starts_with("datasets/"))
    {
        return reply(&mut out, "200 OK", &[], listing(dir, rev).as_bytes());
    }
    let prefix = format!("/{repo}/resolve/");
    let file: Option<(String, PathBuf)> = path.strip_prefix(&prefix).and_then(|rest| {
        let (rev, name) = rest.split_once('/')?;
        Some((rev.to_string(), dir.join(name)))
    });
    let Some((rev, file)) = file.filter(|(_, f)| f.is_file()) else {
        return reply(&mut out, "404 Not Found", &[], b"not found");
    };
    let bytes = std::fs::read(&file)?;
    let start: usize = range
        .as_deref()
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.split('-').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let end = match range.as_deref() {
        Some("bytes=0-0") => 1.min(bytes.len()),
        _ => bytes.len(),
    };
    let mut h = std::collections::hash_map::DefaultHasher::new();
    std::hash::Hash::hash(&bytes, &mut h);
    let etag = format!("\"{:016x}\"", std::hash::Hasher::finish(&h));
    let headers = vec![
        ("etag".to_string(), etag),
        ("x-repo-commit".to_string(), commit(&rev)),
        (
            "content-range".to_string(),
            format!("bytes {start}-{}/{}", end.max(1) - 1, bytes.len()),
        ),
    ];
    let status = if range.is_some() {
        "206 Partial Content"
    } else {
        "200 OK"
    };
    reply(&mut out, status, &headers, &bytes[start.min(end)..end])
}

/// The Hub API's answer for a repository: its commit and every file under `dir`.
fn listing(dir: &Path, rev: &str) -> String {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().map_while(Result::ok) {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let rel = p
                    .strip_prefix(dir)
                    .unwrap()
                    .to_string_lossy()
                    .replace('\\', "/");
                files.push(serde_json::json!({ "rfilename": rel }));
            }
        }
    }
    serde_json::json!({ "sha": commit(rev), "siblings": files }).to_string()
}

/// The 40-hex-digit commit the server gives a revision.
fn commit(rev: &str) -> String {
    let hex = format!(
        "{:0>40}",
        rev.bytes().map(|b| format!("{b:02x}")).collect::<String>()
    );
    hex[hex.len() - 40..].to_string()
}
