//! The seeded dummy weights: shapes, counts, determinism and scale.

use super::*;

#[test]
fn every_dummy_has_consistent_shapes_and_counts() {
    for &name in ModelConfig::dummy_names() {
        let cfg = ModelConfig::dummy(name).unwrap();
        // The loader's layout is the HF layout, and it adds up to num_params.
        let specs = weights::hf_tensors(&cfg);
        let layout = hf_layout(&cfg);
        assert_eq!(specs.len(), layout.len(), "{name}");
        for (s, (n, shape)) in specs.iter().zip(&layout) {
            assert_eq!((&s.name, &s.shape), (n, shape), "{name}");
        }
        let total: usize = specs.iter().map(|s| s.numel()).sum();
        assert_eq!(total, cfg.num_params(), "{name}");
        assert!((cfg.bos_token_id.unwrap() as usize) < cfg.vocab_size);
        if name.starts_with("tiny") {
            assert!(cfg.num_params() < 5_000_000, "{name}");
            assert_eq!(
                (cfg.bos_token_id, &cfg.eos_token_ids[..]),
                (Some(256), &[257][..])
            );
            let be = cpu();
            let w = weights::load(
                &be,
                &cfg,
                WeightSource::Dummy { seed: 1 },
                DType::BF16,
                &encore_core::progress::NoProgress,
            )
            .unwrap();
            check_shapes(&cfg, &w);
        }
    }
    // Published sizes (within 1%): Qwen2.5-0.5B 494M, Llama-3.2-1B 1.236B, Llama-3-8B 8.03B.
    for (name, n) in [
        ("qwen2.5-0.5b", 494e6),
        ("llama-3.2-1b", 1.236e9),
        ("llama-3-8b", 8.03e9),
        ("qwen3-30b-a3b", 30.53e9),
    ] {
        let p = ModelConfig::dummy(name).unwrap().num_params() as f64;
        assert!((p / n - 1.0).abs() < 0.01, "{name}: {p}");
    }
    let t3 = ModelConfig::dummy("tiny-llama3").unwrap();
    assert!(t3.rope.scaling.is_some());
    let q3 = ModelConfig::dummy("tiny-qwen3").unwrap();
    assert!(q3.qk_norm && q3.num_heads * q3.head_dim != q3.hidden_size);
    let q2 = ModelConfig::dummy("tiny-qwen2").unwrap();
    assert!(q2.qkv_bias && q2.tie_word_embeddings);
    // The MoE dummies mix a dense layer into the sparse ones (Qwen3-MoE) or are sparse
    // throughout (Mixtral).
    let m = ModelConfig::dummy("tiny-qwen3-moe").unwrap().moe.unwrap();
    assert_eq!(m.sparse, [false, true, true, true]);
    let m = ModelConfig::dummy("tiny-mixtral").unwrap().moe.unwrap();
    assert!(m.sparse.iter().all(|&s| s) && m.norm_topk_prob);
}

fn check_shapes(cfg: &ModelConfig, w: &ModelWeights) {
    assert_eq!(w.embed.shape(), &[cfg.vocab_size, cfg.hidden_size]);
    assert_eq!(w.lm_head.shape(), w.embed.shape());
    assert_eq!(w.lm_head.same_start(&w.embed), cfg.tie_word_embeddings);
    let qkv = (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim;
    for l in &w.layers {
        assert_eq!(l.qkv().shape(), &[qkv, cfg.hidden_size]);
        assert_eq!(
            l.qkv_bias().map(|b| b.shape().to_vec()),
            cfg.qkv_bias.then(|| vec![qkv])
        );
        assert_eq!(
            l.q_norm().map(|b| b.shape().to_vec()),
            cfg.qk_norm.then(|| match cfg.qk_norm_whole() {
                true => vec![cfg.num_heads * cfg.head_dim],
                false => vec![cfg.head_dim],
            })
        );
        assert_eq!(l.k_norm().is_some(), cfg.qk_norm);
        assert_eq!(
            l.o_proj().shape(),
            &[cfg.hidden_size, cfg.num_heads * cfg.head_dim]
        );
        let h = cfg.hidden_size;
        match (l.router(), &cfg.moe) {
            (Some(router), Some(m)) => {
                let (e, ei) = (m.num_experts, m.expert_intermediate);
                assert_eq!(router.shape(), &[e, h]);
                assert_eq!(l.gate_up().shape(), &[2 * e * ei, h]);
                assert_eq!(l.down().shape(), &[e * h, ei]);
                let s = m.shared_expert_intermediate;
                let gu = l.shared().map(|x| x.gate_up.shape().to_vec());
                assert_eq!(gu, s.map(|s| vec![2 * s, h]));
                if let (Some(x), Some(s)) = (l.shared(), s) {
                    assert_eq!(x.gate.shape(), &[1, h]);
                    assert_eq!(x.down.shape(), &[h, s]);
                }
            }
            _ => {
                assert_eq!(l.gate_up().shape(), &[2 * cfg.intermediate_size, h]);
                assert_eq!(l.down().shape(), &[h, cfg.intermediate_size]);
            }
        }
        // OLMo 2 has no norm before attention or the MLP.
        for norm in [l.input_norm(), l.post_norm()] {
            match norm {
                Some(n) => assert_eq!(n.shape(), &[cfg.hidden_size]),
                None => assert!(!cfg.pre_norms(), "{:?}", cfg.arch),
            }
        }
    }
    assert_eq!(w.norm.shape(), &[cfg.hidden_size]);
}

#[test]
fn dummy_weights_are_deterministic_per_seed_and_dtype_independent() {
    let cfg = ModelConfig::dummy("tiny-qwen3").unwrap();
    let be = cpu();
    let load = |seed, dtype| {
        weights::load(
            &be,
            &cfg,
            WeightSource::Dummy { seed },
            dtype,
            &encore_core::progress::NoProgress,
        )
        .unwrap()
    };
    let a = all_values(&load(7, DType::BF16));
    let b = all_values(&load(7, DType::BF16));
    let c = all_values(&load(8, DType::BF16));
    assert_eq!(a, b);
    for (x, y) in a.iter().zip(&c) {
        assert_ne!(x, y, "another seed gives other values");
    }
    // The f32 draw rounded to bf16 is the bf16 draw.
    let f = all_values(&load(7, DType::F32));
    for (x, y) in a.iter().zip(&f) {
        let rounded: Vec<f32> = y.iter().map(|&v| round_to(DType::BF16, v)).collect();
        assert_eq!(x, &rounded);
    }
    // Different tensors (and q vs k rows of one merged tensor) are not copies.
    let w = load(7, DType::F32);
    let qkv = download(w.layers[0].qkv());
    let q_rows = cfg.num_heads * cfg.head_dim * cfg.hidden_size;
    assert_ne!(qkv[..100], qkv[q_rows..q_rows + 100]);
    assert_ne!(download(w.layers[0].qkv()), download(w.layers[1].qkv()));
}

fn mean_std(v: &[f32]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n;
    let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n;
    (mean, var.sqrt())
}

#[test]
fn dummy_scales_keep_activations_near_unit_size() {
    let cfg = ModelConfig::dummy("tiny-qwen2").unwrap();
    let be = cpu();
    let w = weights::load(
        &be,
        &cfg,
        WeightSource::Dummy { seed: 3 },
        DType::F32,
        &encore_core::progress::NoProgress,
    )
    .unwrap();
    let h = cfg.hidden_size as f64;
    // Four standard errors of the mean and of the standard deviation.
    let check = |t: &Tensor, mean: f64, std: f64, what: &str| {
        let v = download(t);
        let n = v.len() as f64;
        let (m, s) = mean_std(&v);
        assert!((m - mean).abs() < 4.0 * std / n.sqrt(), "{what}: mean {m}");
        assert!(
            (s / std - 1.0).abs() < 4.0 / (2.0 * n).sqrt(),
            "{what}: std {s}, expected {std}"
        );
    };
    check(&w.embed, 0.0, 1.0 / h.sqrt(), "embed");
    let l = &w.layers[2];
    check(l.qkv(), 0.0, 1.0 / h.sqrt(), "qkv");
    check(
        l.o_proj(),
        0.0,
        1.0 / ((cfg.num_heads * cfg.head_dim) as f64).sqrt(),
        "o_proj",
    );
    check(l.gate_up(), 0.0, 1.0 / h.sqrt(), "gate_up");
    check(
        l.down(),
        0.0,
        1.0 / (cfg.intermediate_size as f64).sqrt(),
        "down",
    );
    check(l.input_norm().unwrap(), 1.0, 0.02, "input_norm");
    check(l.qkv_bias().unwrap(), 0.0, 0.02, "qkv_bias");
    let max = download(l.qkv()).iter().fold(0f32, |m, x| m.max(x.abs()));
    assert!(max <= 2.5 / (h as f32).sqrt(), "bounded draws: {max}");
}
