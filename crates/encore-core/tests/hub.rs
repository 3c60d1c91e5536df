//! Models by Hub id from a Hugging Face cache laid out on disk (no network): ids parsed,
//! revisions by ref and by commit, safetensors snapshots checked whole, GGUF files picked
//! by quantization or name, and every miss an error naming what and where.

use std::path::Path;

use encore_core::model::hub::{HubCache, HubId};

mod common;

use common::temp_dir::TempDir;

const MAIN: &str = "0123456789abcdef0123456789abcdef01234567";
const V1: &str = "89abcdef0123456789abcdef0123456789abcdef";

/// Write `files` (relative paths) into snapshot `commit` of `repo` in the cache at `dir`,
/// with `refs` pointing at it.
fn snapshot(dir: &Path, repo: &str, commit: &str, refs: &[&str], files: &[(&str, &str)]) {
    let root = dir.join(format!("models--{}", repo.replace('/', "--")));
    let snap = root.join("snapshots").join(commit);
    for (name, body) in files {
        let p = snap.join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, body).unwrap();
    }
    std::fs::create_dir_all(root.join("refs")).unwrap();
    for r in refs {
        std::fs::write(root.join("refs").join(r), commit).unwrap();
    }
}

fn cache(dir: &TempDir) -> HubCache {
    HubCache {
        dir: dir.path().to_path_buf(),
        offline: true,
        endpoint: None,
    }
}

/// A cache at `dir` downloading from `endpoint`.
fn online(dir: &TempDir, endpoint: String) -> HubCache {
    HubCache {
        offline: false,
        endpoint: Some(endpoint),
        ..cache(dir)
    }
}

fn id(spec: &str) -> HubId {
    HubId::parse(spec).unwrap_or_else(|| panic!("{spec} is a Hub id"))
}

fn err(r: encore_core::Result<std::path::PathBuf>) -> String {
    r.expect_err("an error").to_string()
}

#[test]
fn hub_ids_parse_and_paths_are_not_ids() {
    assert_eq!(
        HubId::parse("Qwen/Qwen3-8B"),
        Some(HubId {
            repo: "Qwen/Qwen3-8B".into(),
            pick: None
        })
    );
    let q = HubId::parse("bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M").unwrap();
    assert_eq!(q.repo, "bartowski/Llama-3.2-1B-Instruct-GGUF");
    assert_eq!(q.pick.as_deref(), Some("Q4_K_M"));
    assert_eq!(q.to_string(), "bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M");
    for not in [
        "dummy:tiny",
        "/models/llama",
        "./org/name",
        "org/name/extra",
        "org/",
        "/x.gguf",
        "org/name:",
        "org/na me",
    ] {
        assert_eq!(HubId::parse(not), None, "{not}");
    }
    // A path that exists is a path.
    let d = TempDir::new("hub-path");
    std::fs::create_dir_all(d.path().join("org/name")).unwrap();
    let rel = d.path().join("org/name");
    assert_eq!(HubId::parse(rel.to_str().unwrap()), None);
}

#[test]
fn safetensors_snapshots_by_ref_and_commit() {
    let d = TempDir::new("hub-st");
    let full = [
        ("config.json", "{}"),
        ("tokenizer.json", "{}"),
        ("model.safetensors", ""),
    ];
    snapshot(d.path(), "acme/tiny", MAIN, &["main"], &full);
    snapshot(d.path(), "acme/tiny", V1, &["v1"], &full);
    let c = cache(&d);
    let root = d.path().join("models--acme--tiny/snapshots");
    assert_eq!(
        c.resolve(&id("acme/tiny"), "main").unwrap(),
        root.join(MAIN)
    );
    assert_eq!(c.resolve(&id("acme/tiny"), "v1").unwrap(), root.join(V1));
    // A commit is its own revision.
    assert_eq!(c.resolve(&id("acme/tiny"), V1).unwrap(), root.join(V1));

    let e = err(c.resolve(&id("acme/tiny"), "v9"));
    assert!(
        e.contains("revision `v9`") && e.contains(&d.path().display().to_string()),
        "{e}"
    );
    let e = err(c.resolve(&id("acme/other"), "main"));
    assert!(e.contains("no repository acme/other"), "{e}");
    assert!(e.contains(&d.path().display().to_string()), "{e}");
}

#[test]
fn an_incomplete_snapshot_names_what_it_lacks() {
    let d = TempDir::new("hub-missing");
    let index = r#"{"weight_map": {"a": "model-00001-of-00002.safetensors",
                                   "b": "model-00002-of-00002.safetensors"}}"#;
    snapshot(
        d.path(),
        "acme/sharded",
        MAIN,
        &["main"],
        &[
            ("config.json", "{}"),
            ("model.safetensors.index.json", index),
            ("model-00001-of-00002.safetensors", ""),
        ],
    );
    let e = err(cache(&d).resolve(&id("acme/sharded"), "main"));
    assert!(e.contains("tokenizer.json"), "{e}");
    assert!(e.contains("model-00002-of-00002.safetensors"), "{e}");
    assert!(!e.contains("model-00001"), "{e}");
    // A GGUF repository named without a file says how to name one.
    snapshot(
        d.path(),
        "acme/ggufs",
        MAIN,
        &["main"],
        &[("m-Q8_0.gguf", "")],
    );
    let e = err(cache(&d).resolve(&id("acme/ggufs"), "main"));
    assert!(
        e.contains("m-Q8_0.gguf") && e.contains("acme/ggufs:QUANT"),
        "{e}"
    );
}

#[test]
fn gguf_files_picked_by_quantization_or_name() {
    let d = TempDir::new("hub-gguf");
    snapshot(
        d.path(),
        "acme/tiny-GGUF",
        MAIN,
        &["main"],
        &[
            ("tiny-Q4_K_M.gguf", ""),
            ("tiny-Q4_K_M_L.gguf", ""),
            ("tiny.Q8_0.gguf", ""),
            ("big/big-Q6_K-00001-of-00002.gguf", ""),
            ("big/big-Q6_K-00002-of-00002.gguf", ""),
            ("README.md", ""),
        ],
    );
    let c = cache(&d);
    let snap = d
        .path()
        .join("models--acme--tiny-GGUF/snapshots")
        .join(MAIN);
    let pick = |p: &str| c.resolve(&id(&format!("acme/tiny-GGUF:{p}")), "main");
    assert_eq!(pick("Q4_K_M").unwrap(), snap.join("tiny-Q4_K_M.gguf"));
    assert_eq!(pick("q4_k_m").unwrap(), snap.join("tiny-Q4_K_M.gguf"));
    assert_eq!(pick("Q8_0").unwrap(), snap.join("tiny.Q8_0.gguf"));
    assert_eq!(
        pick("tiny-Q4_K_M_L.gguf").unwrap(),
        snap.join("tiny-Q4_K_M_L.gguf")
    );
    // A split file: its first part.
    assert_eq!(
        pick("Q6_K").unwrap(),
        snap.join("big/big-Q6_K-00001-of-00002.gguf")
    );
    let e = err(pick("Q2_K"));
    assert!(
        e.contains("quantization Q2_K") && e.contains("tiny.Q8_0.gguf"),
        "{e}"
    );
    let e = err(pick("nope.gguf"));
    assert!(e.contains("named nope.gguf"), "{e}");
}

/// `open_model_at` resolves a Hub id through the cache the environment names; with
/// `HF_HUB_OFFLINE` a missing model is an error at once, naming the cache.
#[test]
fn open_model_reads_the_cache_the_environment_names() {
    let d = TempDir::new("hub-env");
    let config = common::checkpoint::tiny_json("LlamaForCausalLM", 128, "");
    snapshot(
        d.path(),
        "acme/tiny",
        MAIN,
        &["main"],
        &[
            ("config.json", &config),
            ("tokenizer.json", "{}"),
            ("model.safetensors", ""),
        ],
    );
    std::env::set_var("HF_HUB_CACHE", d.path());
    std::env::set_var("HF_HUB_OFFLINE", "1");
    let m = encore_core::model::open_model_at("acme/tiny", "main").unwrap();
    assert_eq!(m.config.vocab_size, 96);
    let e = encore_core::model::open_model_at("acme/absent", "main")
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("no repository acme/absent"), "{e}");
    assert!(!e.contains("downloading"), "offline: {e}");
}

/// A Hub on loopback serving `files` of repository `repo` at commit `commit`, as the
/// Hub's API does for `hf-hub`: the revision's file list, and each file's metadata (etag,
/// commit, size, from a one-byte range) and bytes (from a range start); every path asked
/// for is logged.
fn fake_hub(
    repo: &'static str,
    commit: &'static str,
    files: Vec<(&'static str, Vec<u8>)>,
) -> (String, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = log.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let mut reader = BufReader::new(conn.try_clone().unwrap());
            let mut line = String::new();
            if reader.read_line(&mut line).is_err() {
                continue;
            }
            let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
            let mut from = 0usize;
            let mut one = false;
            loop {
                let mut h = String::new();
                if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                    break;
                }
                if let Some(r) = h.to_ascii_lowercase().strip_prefix("range: bytes=") {
                    let r = r.trim();
                    one = r == "0-0";
                    from = r
                        .trim_end_matches('-')
                        .split('-')
                        .next()
                        .unwrap()
                        .parse()
                        .unwrap_or(0);
                }
            }
            seen.lock().unwrap().push(path.clone());
            let info = format!("/api/models/{repo}/revision/main");
            let prefix = format!("/{repo}/resolve/main/");
            let (status, headers, body): (&str, String, Vec<u8>) = if path == info {
                let siblings: Vec<_> = files
                    .iter()
                    .map(|(n, _)| serde_json::json!({ "rfilename": n }))
                    .collect();
                let v = serde_json::json!({"sha": commit, "siblings": siblings});
                ("200 OK", String::new(), v.to_string().into_bytes())
            } else if let Some((i, (_, bytes))) = path
                .strip_prefix(&prefix)
                .and_then(|f| files.iter().enumerate().find(|(_, (n, _))| *n == f))
            {
                let end = if one { 1 } else { bytes.len() };
                let headers = format!(
                    "etag: \"{:040x}\"\r\nx-repo-commit: {commit}\r\ncontent-range: bytes {from}-{}/{}\r\n",
                    i + 1,
                    end - 1,
                    bytes.len()
                );
                ("206 Partial Content", headers, bytes[from..end].to_vec())
            } else {
                ("404 Not Found", String::new(), b"{}".to_vec())
            };
            let head = format!(
                "HTTP/1.1 {status}\r\n{headers}content-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            let _ = conn.write_all(head.as_bytes());
            let _ = conn.write_all(&body);
        }
    });
    (format!("http://{addr}"), log)
}

/// A model missing from the cache is downloaded into it from the Hub (here one on
/// loopback): its config, tokenizer, index and the shards the index names, not a second
/// copy of the weights nor other files; the cache then resolves it offline.
#[test]
fn a_missing_model_is_downloaded_into_the_cache() {
    let d = TempDir::new("hub-download");
    let config = common::checkpoint::tiny_json("LlamaForCausalLM", 128, "");
    let index = r#"{"weight_map": {"a": "model-00001-of-00002.safetensors",
                                   "b": "model-00002-of-00002.safetensors"}}"#;
    let files = vec![
        ("config.json", config.clone().into_bytes()),
        ("tokenizer.json", b"{\"model\": {}}".to_vec()),
        ("model.safetensors.index.json", index.as_bytes().to_vec()),
        ("model-00001-of-00002.safetensors", vec![1u8; 3000]),
        ("model-00002-of-00002.safetensors", vec![2u8; 5000]),
        ("consolidated.safetensors", vec![3u8; 100]),
        ("README.md", b"# tiny".to_vec()),
    ];
    let (endpoint, log) = fake_hub("acme/dl", MAIN, files);
    let c = online(&d, endpoint);
    let snap = c.resolve(&id("acme/dl"), "main").unwrap();
    assert_eq!(snap, d.path().join("models--acme--dl/snapshots").join(MAIN));
    assert_eq!(
        std::fs::read_to_string(snap.join("config.json")).unwrap(),
        config
    );
    assert_eq!(
        std::fs::read(snap.join("model-00002-of-00002.safetensors")).unwrap(),
        vec![2u8; 5000]
    );
    assert!(!snap.join("consolidated.safetensors").exists());
    assert!(!snap.join("README.md").exists());
    let asked = log.lock().unwrap().clone();
    assert!(
        !asked
            .iter()
            .any(|p| p.contains("consolidated") || p.contains("README")),
        "{asked:?}"
    );
    // Now in the cache: it resolves offline.
    let offline = HubCache { offline: true, ..c };
    assert_eq!(offline.resolve(&id("acme/dl"), "main").unwrap(), snap);
    // A file the Hub lacks is an error naming it.
    let e = err(offline.resolve(&id("acme/dl:Q4_0"), "main"));
    assert!(e.contains("quantization Q4_0"), "{e}");
}

/// A GGUF file named by quantization is the one file downloaded.
#[test]
fn a_gguf_file_is_downloaded_alone() {
    let d = TempDir::new("hub-download-gguf");
    let files = vec![
        ("m-Q4_0.gguf", vec![4u8; 700]),
        ("m-Q8_0.gguf", vec![8u8; 900]),
        ("README.md", b"# m".to_vec()),
    ];
    let (endpoint, log) = fake_hub("acme/m-GGUF", V1, files);
    let c = online(&d, endpoint);
    let path = c.resolve(&id("acme/m-GGUF:q8_0"), "main").unwrap();
    let snap = d.path().join("models--acme--m-GGUF/snapshots").join(V1);
    assert_eq!(path, snap.join("m-Q8_0.gguf"));
    assert_eq!(std::fs::read(&path).unwrap(), vec![8u8; 900]);
    assert!(!snap.join("m-Q4_0.gguf").exists());
    let asked = log.lock().unwrap().clone();
    assert!(
        asked
            .iter()
            .all(|p| !p.contains("Q4_0") && !p.contains("README")),
        "{asked:?}"
    );
    // Named without a file, a GGUF repository is refused naming how to name one.
    let e = err(c.resolve(&id("acme/m-GGUF"), "main"));
    assert!(
        e.contains("no config.json") && e.contains("acme/m-GGUF:QUANT"),
        "{e}"
    );
}
