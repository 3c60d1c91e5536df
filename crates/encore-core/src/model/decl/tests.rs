use super::*;

#[test]
fn op_ids_index_the_declared_ops_and_every_tensor_has_its_reader() {
    for (i, r) in Role::ALL.iter().enumerate() {
        assert_eq!(*r as usize, i, "Role::ALL is in declaration order");
    }
    for (i, op) in LayerOp::ALL.iter().enumerate() {
        assert_eq!(*op as usize, i, "LayerOp::ALL is in declaration order");
    }
    for name in ModelConfig::dummy_names() {
        for tied in [false, true] {
            let mut cfg = ModelConfig::dummy(name).unwrap();
            cfg.tie_word_embeddings = tied;
            let d = cfg.decl();
            for (i, o) in d.ops().iter().enumerate() {
                assert_eq!(o.op.index(cfg.num_layers), i, "{name} {:?}", o.op);
                for &w in &o.reads {
                    let t = &d.tensors()[w];
                    assert!(t.op.index(cfg.num_layers) <= i, "{name} {}", t.name());
                }
            }
            for (w, t) in d.tensors().iter().enumerate() {
                assert!(d.ops()[t.op.index(cfg.num_layers)].reads.contains(&w));
                let rows: usize = t.parts.iter().map(|p| p.local_shape()[0]).sum();
                assert_eq!(rows, t.shape[0], "{name} {}", t.name());
                // (Experts have no GGUF names yet: those files are refused.)
                for p in t.parts.iter().filter(|_| !t.role.sources().is_empty()) {
                    assert!(gguf_name(&p.name).is_some(), "{}", p.name);
                }
            }
            let lm_reads = &d.ops().last().unwrap().reads;
            assert_eq!(
                lm_reads == &[0],
                tied,
                "{name}: a tied LM head reads the table"
            );
        }
    }
}

#[test]
fn gguf_names_follow_the_declaration() {
    let cases = [
        ("model.embed_tokens.weight", Some("token_embd.weight")),
        ("model.norm.weight", Some("output_norm.weight")),
        ("lm_head.weight", Some("output.weight")),
        (
            "model.layers.3.self_attn.k_proj.bias",
            Some("blk.3.attn_k.bias"),
        ),
        (
            "model.layers.0.mlp.up_proj.weight",
            Some("blk.0.ffn_up.weight"),
        ),
        (
            "model.layers.12.self_attn.q_norm.weight",
            Some("blk.12.attn_q_norm.weight"),
        ),
        (
            "model.layers.2.mlp.experts.17.down_proj.weight",
            Some("blk.2.ffn_down_exps.weight"),
        ),
        (
            "model.layers.0.block_sparse_moe.experts.7.w3.weight",
            Some("blk.0.ffn_up_exps.weight"),
        ),
        (
            "model.layers.1.block_sparse_moe.gate.weight",
            Some("blk.1.ffn_gate_inp.weight"),
        ),
        (
            "model.layers.4.mlp.shared_expert_gate.weight",
            Some("blk.4.ffn_gate_inp_shexp.weight"),
        ),
        ("model.layers.0.mlp.experts.x.up_proj.weight", None),
        ("model.layers.x.mlp.up_proj.weight", None),
        ("model.rotary_emb.inv_freq", None),
    ];
    for (hf, want) in cases {
        assert_eq!(gguf_name(hf).as_deref(), want, "{hf}");
    }
    assert_eq!(
        gguf_source("model.layers.2.mlp.experts.17.gate_proj.weight"),
        Some(("blk.2.ffn_gate_exps.weight".to_string(), Some(17)))
    );
    assert_eq!(
        gguf_source("model.layers.2.mlp.gate_proj.weight"),
        Some(("blk.2.ffn_gate.weight".to_string(), None))
    );
}
