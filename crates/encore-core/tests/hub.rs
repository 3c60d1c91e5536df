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
