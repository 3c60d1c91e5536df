//! Write a GGUF file with seeded random weights in the shape of a built-in dummy model,
//! quantized like a downloaded file: the input for GGUF load-time benchmarks on machines
//! that hold no real model (scripts/gpu-check.sh).
//!
//!   cargo run --release --example dummy_gguf -- llama-3.2-1b q8_0 /tmp/llama-1b.q8_0.gguf
//!
//! Types: f16, any block type encore runs (q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k,
//! q6_k), and the mixes llama.cpp's `llama-quantize` writes for `q4_k_m` and `q5_k_m`
//! (attn_v and ffn_down in Q6_K in the first and last eighth of the layers and every third
//! layer between, output in Q6_K, the rest in the base type); norms and routers are always
//! f32. A mixture of experts' experts are stacked per layer (`ffn_{gate,up,down}_exps`). The
//! file carries a byte-level placeholder vocabulary, so `encore bench decode` and
//! llama.cpp's `llama-bench` load it; its text is noise.

use std::path::Path;

use encore_core::model::config::ModelConfig;
use encore_core::model::gguf::{gguf_source_of, quantize, GgmlType, GgufWriter, Value};
use encore_core::model::weights::hf_tensors;
use encore_core::ops::splitmix64;
use half::f16;
use rayon::prelude::*;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [name, ty, out] = &args[..] else {
        return Err("usage: dummy_gguf DUMMY_NAME f16|q8_0|q4_k|q4_k_m|... OUT.gguf".into());
    };
    let cfg = ModelConfig::dummy(name)?;
    let t = std::time::Instant::now();
    let mut w = GgufWriter::new();
    w.model_metadata(&cfg);
    let tokens = (0..cfg.vocab_size)
        .map(|i| Value::String(format!("t{i}")))
        .collect();
    w.kv("tokenizer.ggml.model", Value::String("gpt2".into()));
    w.kv("tokenizer.ggml.tokens", Value::Array(8, tokens));
    w.kv("tokenizer.ggml.merges", Value::Array(8, Vec::new()));
    // Experts of the stack being gathered: (GGUF name, one expert's shape, values so far).
    let mut stack: Option<(String, Vec<usize>, Vec<f32>)> = None;
    let specs = hf_tensors(&cfg);
    // Gemma's post norms and gpt-oss's MLP input norm are llama.cpp's
    // `post_attention_norm`.
    let post = cfg.post_norms || cfg.arch.family().sinks;
    let gguf_source = |n: &str| gguf_source_of(n, post);
    for (i, spec) in specs.iter().enumerate() {
        let (gname, expert) = gguf_source(&spec.name).ok_or("no GGUF name")?;
        let norm = spec.name.ends_with("norm.weight");
        let std = 1.0 / (*spec.shape.last().unwrap_or(&1) as f32).sqrt();
        let seed = splitmix64(i as u64 + 1);
        // A uniform value of the given std (Box-Muller is not needed for timing).
        let values: Vec<f32> = (0..spec.numel())
            .into_par_iter()
            .map(|j| {
                let u = (splitmix64(seed ^ j as u64) >> 40) as f32 / (1u64 << 24) as f32;
                if norm {
                    1.0
                } else {
                    (u - 0.5) * std * 3.46
                }
            })
            .collect();
        let (shape, values) = match expert {
            None => (spec.shape.clone(), values),
            Some(x) => {
                let (_, _, all) =
                    stack.get_or_insert_with(|| (gname.clone(), spec.shape.clone(), Vec::new()));
                all.extend(values);
                let last = specs
                    .get(i + 1)
                    .and_then(|n| gguf_source(&n.name))
                    .is_none_or(|(n, _)| n != gname);
                if !last {
                    continue;
                }
                let (_, shape, all) = stack.take().expect("gathered above");
                ([vec![x + 1], shape].concat(), all)
            }
        };
        // llama.cpp stores Qwen2-MoE's [1, hidden] shared-expert gate as a vector.
        let shape = if gname.ends_with("ffn_gate_inp_shexp.weight") {
            shape[1..].to_vec()
        } else {
            shape
        };
        let router = gname.contains("ffn_gate_inp");
        // gpt-oss's stacked expert biases are 2-D: F32 like every bias.
        if norm || router || shape.len() == 1 || gname.ends_with(".bias") {
            w.tensor_f32(&gname, &shape, &values);
            continue;
        }
        if ty == "f16" {
            let bytes = values
                .iter()
                .flat_map(|&x| f16::from_f32(x).to_le_bytes())
                .collect();
            w.tensor(&gname, &shape, GgmlType::F16, bytes);
            continue;
        }
        let t = block_type(ty, &gname, cfg.num_layers)?;
        // Whole blocks per task, quantized in parallel (a 30B model's experts are billions
        // of values).
        let fmt = t.quant_format().ok_or("not a block type")?;
        let bytes: Vec<u8> = values
            .par_chunks(fmt.block_elems() * 4096)
            .map(|c| quantize(t, c))
            .collect::<Vec<_>>()
            .concat();
        w.tensor(&gname, &shape, t, bytes);
    }
    w.write(Path::new(out))?;
    eprintln!(
        "wrote {out} ({} tensors, {ty}) in {:.1} s",
        w.tensors.len(),
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The block type of tensor `gname` in a file of type `ty` (see the module docs).
fn block_type(ty: &str, gname: &str, layers: usize) -> Result<GgmlType, String> {
    let parse = |t: &str| {
        GgmlType::SUPPORTED
            .into_iter()
            .find(|g| g.name().eq_ignore_ascii_case(t) && g.quant_format().is_some())
            .ok_or_else(|| format!("unknown type `{t}`"))
    };
    let Some(base) = ty.strip_suffix("_m") else {
        return parse(ty);
    };
    let base = parse(base)?;
    // llama.cpp's use_more_bits: the first and last eighth, and every third layer between.
    let more_bits = |l: usize| l < layers / 8 || l >= 7 * layers / 8 || (l - layers / 8) % 3 == 2;
    let layer = gname
        .strip_prefix("blk.")
        .and_then(|r| r.split('.').next())
        .and_then(|l| l.parse::<usize>().ok());
    let wide = match layer {
        Some(l) => (gname.contains("attn_v") || gname.contains("ffn_down")) && more_bits(l),
        None => gname == "output.weight",
    };
    Ok(if wide { GgmlType::Q6_K } else { base })
}
