//! `--model org/name:QUANT` end to end: the real SmolLM2 GGUF (`ENCORE_SMOLLM2_GGUF`, as
//! `.ci/run` sets it) laid out in a Hugging Face cache on disk, run offline by its Hub id
//! and quantization; a quantization the repository lacks is an error naming it and the
//! cache. Without the variable the test says so and passes, unless
//! `ENCORE_REQUIRE_SMOLLM2=1` (CI).

mod common;

use common::{command, failure, success, temp_dir};

const REPO: &str = "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF";
const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

#[test]
fn a_hub_id_with_a_quantization_runs_the_cached_gguf() {
    let Some(gguf) = common::smollm2_gguf() else {
        return;
    };
    let cache = temp_dir("hub-cache");
    let root = cache.join(format!("models--{}", REPO.replace('/', "--")));
    let snap = root.join("snapshots").join(COMMIT);
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::create_dir_all(root.join("refs")).unwrap();
    std::fs::write(root.join("refs/main"), COMMIT).unwrap();
    std::os::unix::fs::symlink(&gguf, snap.join("SmolLM2-135M-Instruct.Q4_1.gguf")).unwrap();
    let run = |model: &str| {
        command(&[
            "generate",
            "--device",
            "cpu",
            "--model",
            model,
            "--chat",
            "--prompt",
            "What is the capital of France?",
            "--max-tokens",
            "24",
        ])
        .env("HF_HUB_CACHE", &cache)
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap()
    };
    let answer = success(&run(&format!("{REPO}:Q4_1")));
    assert!(answer.contains("Paris"), "{answer}");
    let e = failure(&run(&format!("{REPO}:Q2_K")));
    assert!(e.contains("quantization Q2_K"), "{e}");
    assert!(e.contains(&cache.display().to_string()), "{e}");
    assert!(e.contains("SmolLM2-135M-Instruct.Q4_1.gguf"), "{e}");
    let e = failure(&run("HuggingFaceTB/absent"));
    assert!(e.contains("no repository HuggingFaceTB/absent"), "{e}");
    let _ = std::fs::remove_dir_all(&cache);
}
