//! Seeded values and safetensors checkpoints written to a temp dir, shared by the loader,
//! GGUF, offload and real-model tests; the error helpers their failure tables use.

use std::path::Path;

use encore_core::backend::cpu::CpuBackend;
use encore_core::model::weights::ModelWeights;
use encore_core::{Backend, Error, Tensor};
use half::{bf16, f16};
use safetensors::tensor::{Dtype, TensorView};

use super::temp_dir::TempDir;

/// splitmix64 values in [-1, 1).
pub fn values(seed: u64, n: usize) -> Vec<f32> {
    (0..n as u64)
        .map(|i| {
            let mut z = seed
                .wrapping_mul(0x2545_F491_4F6C_DD1D)
                .wrapping_add(i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            (z >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// One checkpoint tensor; `values` are written in `dtype` (truncated for integer dtypes).
#[derive(Clone)]
pub struct Ck {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub values: Vec<f32>,
}

impl Ck {
    /// An f32 tensor.
    pub fn f32(name: &str, shape: &[usize], values: &[f32]) -> Ck {
        Ck {
            name: name.to_string(),
            dtype: Dtype::F32,
            shape: shape.to_vec(),
            values: values.to_vec(),
        }
    }
}

/// A tensor both a quantized checkpoint and its twin store as is: norms about 1, the
/// rest small.
pub fn plain(name: &str, shape: &[usize], v: &[f32]) -> Ck {
    let mut t = Ck::f32(name, shape, v);
    if name.ends_with("norm.weight") {
        t.values.iter_mut().for_each(|x| *x = 1.0 + 0.1 * *x);
    } else {
        t.values.iter_mut().for_each(|x| *x *= 0.2);
    }
    t
}

/// `(name, shape, values)` triples as f32 checkpoint tensors.
pub fn f32_tensors(ts: &[(String, Vec<usize>, Vec<f32>)]) -> Vec<Ck> {
    ts.iter().map(|(n, s, v)| Ck::f32(n, s, v)).collect()
}

/// The little-endian bytes of `t` in its dtype.
pub fn bytes_of(t: &Ck) -> Vec<u8> {
    match t.dtype {
        Dtype::F32 => t.values.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Dtype::BF16 => t
            .values
            .iter()
            .flat_map(|&x| bf16::from_f32(x).to_le_bytes())
            .collect(),
        Dtype::F16 => t
            .values
            .iter()
            .flat_map(|&x| f16::from_f32(x).to_le_bytes())
            .collect(),
        Dtype::I32 => t
            .values
            .iter()
            .flat_map(|&x| (x as i32).to_le_bytes())
            .collect(),
        // Packed 32-bit words carried as the f32 of the same bits (GPTQ's qweight).
        Dtype::U32 => t
            .values
            .iter()
            .flat_map(|&x| x.to_bits().to_le_bytes())
            .collect(),
        // Bytes carried as their values (MXFP4's `*_blocks` / `*_scales`).
        Dtype::U8 => t.values.iter().map(|&x| x as u8).collect(),
        // Values exact in E4M3 (the test draws them as codes times nothing).
        Dtype::F8_E4M3 => t
            .values
            .iter()
            .map(|&x| encore_core::quant::f32_to_e4m3(x))
            .collect(),
        other => panic!("test writes no {other:?}"),
    }
}

/// `tensors` as one safetensors file at `path`.
pub fn write_safetensors(path: &Path, tensors: &[Ck]) {
    let bytes: Vec<Vec<u8>> = tensors.iter().map(bytes_of).collect();
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .zip(&bytes)
        .map(|(t, b)| {
            (
                t.name.clone(),
                TensorView::new(t.dtype, t.shape.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

/// Write `config.json` and `tensors` as one `model.safetensors` into a fresh dir.
pub fn model_dir(tag: &str, config: &str, tensors: &[Ck]) -> TempDir {
    let dir = TempDir::new(tag);
    std::fs::write(dir.path().join("config.json"), config).unwrap();
    write_safetensors(&dir.path().join("model.safetensors"), tensors);
    dir
}

/// A small config.json of `arch` (vocab 96, hidden 64, 2 layers of 4 heads over 2 KV
/// heads) with `intermediate_size` `inter`; `extra` is spliced in.
pub fn tiny_json(arch: &str, inter: usize, extra: &str) -> String {
    format!(
        r#"{{
  "architectures": ["{arch}"],
  "vocab_size": 96, "hidden_size": 64, "intermediate_size": {inter},
  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
  "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 256,
  "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16"{extra}
}}"#
    )
}

/// The error of `r` and its message; panics on success.
pub fn err_text<T>(r: encore_core::Result<T>) -> (Error, String) {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => {
            let s = e.to_string();
            (e, s)
        }
    }
}

/// `msg` contains each of `parts`.
pub fn assert_mentions(msg: &str, parts: &[&str]) {
    for p in parts {
        assert!(msg.contains(p), "`{msg}` does not mention `{p}`");
    }
}

/// A CPU tensor's values as f32.
pub fn download(t: &Tensor) -> Vec<f32> {
    let be = CpuBackend::new();
    let be: &dyn Backend = &be;
    be.download_f32(t).unwrap()
}

/// All weights of a model as f32, in order.
pub fn all_values(w: &ModelWeights) -> Vec<Vec<f32>> {
    let mut ts = vec![&w.embed];
    for l in &w.layers {
        ts.extend([l.qkv(), l.o_proj(), l.gate_up(), l.down()]);
        ts.extend(l.input_norm().into_iter().chain(l.post_norm()));
        ts.extend(l.qkv_bias().into_iter().chain(l.q_norm()).chain(l.k_norm()));
        ts.extend(l.attn_out_norm().into_iter().chain(l.mlp_out_norm()));
    }
    ts.extend([&w.norm, &w.lm_head]);
    ts.into_iter().map(download).collect()
}
