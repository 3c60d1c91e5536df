//! Real safetensors checkpoints: read in place in the run dtype, converted otherwise.

use super::*;

#[test]
fn a_checkpoint_in_the_run_dtype_is_read_in_place_and_a_converted_one_copied() {
    let cpu = slow_cpu();
    let json = cpu_json();
    let cfg = ModelConfig::from_json(&json, "test").unwrap();
    let f32_dir = model_dir("offload-f32", &json, &checkpoint(&cfg, Dtype::F32));
    let files = dir_files(f32_dir.path());
    let (want, resident) = run_files(&cpu, &files, &config(false, None)).unwrap();
    assert!(resident.offload.is_none());
    for graphs in [false, true] {
        let (got, boot) =
            run_files(&cpu, &files, &config(graphs, budget(50.0, Policy::Planned))).unwrap();
        assert_eq!(got, want, "f32 checkpoint in place, graphs {graphs}");
        let r = boot.offload.expect("a 50% budget offloads");
        assert!(r.registered_bytes > 0, "{r:?}");
        assert_eq!(r.copied_bytes, 0, "{r:?}");
        // Every streamed byte is read from the mapping.
        assert_eq!(
            r.registered_bytes,
            r.total_bytes - r.resident_bytes,
            "{r:?}"
        );
    }
    // Split over two files, every other tensor in each (q/k/v and gate/up parts of one
    // device weight in different files): each mapping is registered, the same tokens.
    let sharded = TempDir::new("offload-shards");
    std::fs::write(sharded.path().join("config.json"), &json).unwrap();
    let (even, odd): (Vec<_>, Vec<_>) = checkpoint(&cfg, Dtype::F32)
        .into_iter()
        .enumerate()
        .partition(|(i, _)| i % 2 == 0);
    for (name, part) in [("a", even), ("b", odd)] {
        let part: Vec<Ck> = part.into_iter().map(|(_, t)| t).collect();
        write_safetensors(&sharded.path().join(format!("{name}.safetensors")), &part);
    }
    let (got, boot) = run_files(
        &cpu,
        &dir_files(sharded.path()),
        &config(true, budget(30.0, Policy::Planned)),
    )
    .unwrap();
    assert_eq!(got, want, "two files in place");
    let r = boot.offload.unwrap();
    assert_eq!(
        r.registered_bytes,
        r.total_bytes - r.resident_bytes,
        "{r:?}"
    );

    // The same values stored in bf16 (exact there), run in f32: converted into a copy.
    let rounded: Vec<Ck> = checkpoint(&cfg, Dtype::F32)
        .into_iter()
        .map(|t| Ck {
            dtype: Dtype::BF16,
            values: t
                .values
                .iter()
                .map(|&x| bf16::from_f32(x).to_f32())
                .collect(),
            ..t
        })
        .collect();
    let bf16_dir = model_dir("offload-bf16", &json, &rounded);
    let files = dir_files(bf16_dir.path());
    let (want, _) = run_files(&cpu, &files, &config(false, None)).unwrap();
    let (got, boot) =
        run_files(&cpu, &files, &config(false, budget(50.0, Policy::Planned))).unwrap();
    assert_eq!(got, want, "bf16 checkpoint run in f32");
    let r = boot.offload.unwrap();
    assert!(r.copied_bytes > 0 && r.registered_bytes == 0, "{r:?}");
    let (got, _) = run_files(&cpu, &files, &config(false, budget(50.0, Policy::Lru))).unwrap();
    assert_eq!(got, want, "bf16 checkpoint run in f32, LRU");
}

/// `files` over `size` CPU ranks (1: alone) under `offload`: the greedy tokens and rank
/// 0's offload report.
fn over_ranks(
    files: &ModelFiles,
    size: usize,
    offload: Option<OffloadConfig>,
) -> (Vec<Vec<u32>>, Option<encore_core::offload::OffloadReport>) {
    let (leader, tp) = common::cpu_group(size);
    let cfg = EngineConfig {
        tp,
        ..config(true, offload)
    };
    let Engine { mut runner, report } =
        Engine::new(leader.as_ref(), files.clone(), &cfg, &NoProgress).unwrap();
    (greedy(&mut runner, &prompts()).unwrap(), report.offload)
}

#[test]
fn a_tensor_parallel_rank_reads_its_rows_in_place_and_copies_its_columns() {
    // A rank's block of whole rows (q/k/v, gate/up, the vocabulary shards, each expert's
    // gate/up) is one range of the mapping, from its first row; a block of columns (o,
    // down, each expert's down) is cut into a copy.
    let json = cpu_json();
    let dense = ModelConfig::from_json(&json, "test").unwrap();
    let dense_dir = model_dir("tp-in-place", &json, &checkpoint(&dense, Dtype::F32));
    let mut moe = ModelConfig::dummy("tiny-qwen3-moe").unwrap();
    moe.tie_word_embeddings = false;
    let moe_dir = TempDir::new("tp-in-place-moe");
    write_safetensors(
        &moe_dir.path().join("model.safetensors"),
        &checkpoint(&moe, Dtype::F32),
    );
    let moe_files = ModelFiles {
        config: moe,
        source: WeightSource::Dir(moe_dir.path().to_path_buf()),
    };
    let cases = [
        (dir_files(dense_dir.path()), budget(50.0, Policy::Planned)),
        (moe_files.clone(), budget(60.0, Policy::Planned)),
        (moe_files, budget(80.0, Policy::Experts)),
    ];
    for (files, offload) in cases {
        let (want, _) = over_ranks(&files, 1, None);
        let (got, report) = over_ranks(&files, 2, offload);
        assert_eq!(
            got, want,
            "{:?} over 2 ranks, {offload:?}",
            files.config.arch
        );
        let r = report.expect("a budget offloads");
        assert!(r.registered_bytes > 0 && r.copied_bytes > 0, "{r:?}");
    }
}
