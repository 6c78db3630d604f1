//! Hub downloads against a server of our own on 127.0.0.1 that serves the tiny model in the Hub's
//! URL layout: every file a run needs, once per cache however many processes ask, the token of a
//! gated repository, `--revision`, the cache afterwards; paths with typos are not Hub ids.

mod common;

use std::path::Path;

use common::hub::HubServer;
use common::*;
use g4ft::gemma4::{Hub, ModelFiles};

const REPO: &str = "g4ft-test/tiny";

fn hub(server: &HubServer, cache: &Path, token: Option<&str>) -> Hub {
    Hub {
        endpoint: Some(server.endpoint()),
        token: token.map(str::to_string),
        revision: None,
        cache_dir: Some(cache.to_path_buf()),
        offline: false,
    }
}

fn tiny() -> std::path::PathBuf {
    Path::new(ROOT).join("assets/tiny")
}

#[test]
fn a_hub_id_downloads_every_file_once_and_then_reads_the_cache() {
    let server = HubServer::start(&tiny(), REPO, Some("secret"));
    let cache = tmp("hub-cache");
    let h = hub(&server, &cache, Some("secret"));
    // Four processes' worth of concurrent lookups: one download of each file.
    let found: Vec<ModelFiles> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| s.spawn(|| ModelFiles::resolve_with(REPO, &h).unwrap()))
            .collect();
        handles.into_iter().map(|t| t.join().unwrap()).collect()
    });
    for f in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        "special_tokens_map.json",
    ] {
        assert_eq!(
            server.downloads(f),
            1,
            "{f}: {:?}",
            server.requests.lock().unwrap()
        );
    }
    let dir = found[0].config.parent().unwrap();
    assert!(dir.join("tokenizer.json").is_file() && dir.join("chat_template.jinja").is_file());
    assert!(found.iter().all(|f| f.config == found[0].config));
    // Offline afterwards: the cache alone.
    let n = server.requests.lock().unwrap().len();
    let offline = Hub {
        offline: true,
        ..h.clone()
    };
    let again = ModelFiles::resolve_with(REPO, &offline).unwrap();
    assert_eq!(again.weights, found[0].weights);
    assert_eq!(
        server.requests.lock().unwrap().len(),
        n,
        "no request when cached"
    );
    // A cache holding the weights but not the tokenizer (an older download) gets the missing
    // files only.
    std::fs::remove_file(dir.join("tokenizer.json")).unwrap();
    ModelFiles::resolve_with(REPO, &h).unwrap();
    assert!(dir.join("tokenizer.json").is_file());
    assert_eq!(server.downloads("tokenizer.json"), 2);
    assert_eq!(
        server.downloads("model.safetensors"),
        1,
        "the weights are not fetched again"
    );
}

#[test]
fn a_gated_repository_needs_the_token_and_the_error_says_so() {
    let server = HubServer::start(&tiny(), REPO, Some("secret"));
    let cache = tmp("hub-gated");
    let msg = ModelFiles::resolve_with(REPO, &hub(&server, &cache, None))
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("config.json") && msg.contains("401") && msg.contains("HF_TOKEN"),
        "{msg}"
    );
    let msg = ModelFiles::resolve_with(REPO, &hub(&server, &cache, Some("wrong")))
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("check that the token may read this repository"),
        "{msg}"
    );
}

#[test]
fn revision_selects_the_url_and_the_cache_entry() {
    let server = HubServer::start(&tiny(), REPO, None);
    let cache = tmp("hub-rev");
    let h = Hub {
        revision: Some("v2".into()),
        ..hub(&server, &cache, None)
    };
    ModelFiles::resolve_with(REPO, &h).unwrap();
    let reqs = server.requests.lock().unwrap().clone();
    assert!(
        !reqs.is_empty() && reqs.iter().all(|r| r.path.contains("/resolve/v2/")),
        "{reqs:?}"
    );
    let main = Hub {
        revision: None,
        offline: true,
        ..h
    };
    assert!(
        ModelFiles::resolve_with(REPO, &main).is_err(),
        "main is not cached"
    );
}

#[test]
fn a_missing_path_is_not_taken_for_a_hub_id() {
    let server = HubServer::start(&tiny(), REPO, None);
    let cache = tmp("hub-typo");
    for (model, says) in [
        ("assets/tinyy", "`assets` is a local directory"),
        ("./tiny", "starts like a path"),
        ("models/gemma/tiny", "exactly one `/`"),
    ] {
        let msg = ModelFiles::resolve_with(model, &hub(&server, &cache, None))
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("no such directory") && msg.contains(says),
            "{model}: {msg}"
        );
    }
    assert!(
        server.requests.lock().unwrap().is_empty(),
        "nothing was looked up"
    );
}

/// A one-step run of the tiny model given as the Hub id.
fn hub_args(out: &Path) -> Vec<String> {
    let mut args = args_with(
        out,
        &["--max-steps", "1", "--micro-batch", "1", "--accum", "2"],
    );
    let i = args.iter().position(|a| a == "--model").unwrap();
    args[i + 1] = REPO.into();
    args
}

#[test]
fn train_ddp_on_two_ranks_downloads_once_with_hf_token() {
    let server = HubServer::start(&tiny(), REPO, Some("secret"));
    let home = tmp("hub-home");
    let out = tmp("hub-train");
    let args = hub_args(&out);
    let endpoint = server.endpoint();
    let env = [
        ("HF_ENDPOINT", endpoint.as_str()),
        ("HF_HOME", home.to_str().unwrap()),
        ("HF_TOKEN", "secret"),
    ];
    let log = run_ok(2, &args, &env);
    assert!(log.contains("adapter identical on all 2 ranks"), "{log}");
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        assert_eq!(server.downloads(f), 1, "{f}");
    }
    // HUGGING_FACE_HUB_TOKEN works too; a second run finds everything in the cache.
    let n = server.requests.lock().unwrap().len();
    let env = [
        ("HF_ENDPOINT", endpoint.as_str()),
        ("HF_HOME", home.to_str().unwrap()),
        ("HUGGING_FACE_HUB_TOKEN", "secret"),
    ];
    run_ok(1, &hub_args(&tmp("hub-train-2")), &env);
    assert_eq!(server.requests.lock().unwrap().len(), n);
}
