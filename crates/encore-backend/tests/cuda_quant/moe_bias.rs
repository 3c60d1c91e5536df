//! Quantized experts with biases and gpt-oss's clamped SwiGLU (`qmoe_*` and the grouped GEMM
//! `gmoe_*` with `act_kind` and `bias`) against the CPU backend.

use super::moe::QuantMoe;
use super::*;

/// gpt-oss's experts on CUDA: MXFP4 (and two other formats) with gate/up and down biases and
/// `Activation::SwigluOai`, x in bf16 / f16 / f32, through the pair kernels (on the tensor
/// cores and in f32) and the grouped GEMM (64-row tiles at 300 tokens), eager and replayed from a graph captured on other
/// routing, against the CPU backend (which decodes the same bytes).
#[test]
#[ignore = "needs a CUDA device"]
fn quantized_experts_with_biases_match_cpu() {
    let _serial = serial();
    let paths = moe_paths();
    let cpu = CpuBackend::new();
    // (gate/up format, down format, x dtype, tokens, hidden, experts, expert width, top k,
    // activation)
    let mx = QuantFormat::Mxfp4;
    let cases = [
        (mx, mx, DType::BF16, 1, 256, 5, 96, 2, Activation::SwigluOai),
        (mx, mx, DType::F16, 3, 64, 7, 160, 3, Activation::SwigluOai),
        (mx, mx, DType::F32, 4, 128, 4, 64, 2, Activation::SwigluOai),
        (
            mx,
            mx,
            DType::BF16,
            40,
            256,
            5,
            96,
            2,
            Activation::SwigluOai,
        ),
        (
            mx,
            mx,
            DType::BF16,
            300,
            128,
            4,
            64,
            2,
            Activation::SwigluOai,
        ),
        (mx, mx, DType::F16, 17, 96, 3, 32, 1, Activation::Silu),
        (
            QuantFormat::Q4K,
            QuantFormat::Q6K,
            DType::BF16,
            24,
            256,
            4,
            256,
            2,
            Activation::SwigluOai,
        ),
        (
            QuantFormat::Q8_0,
            mx,
            DType::F16,
            2,
            64,
            6,
            64,
            3,
            Activation::SwigluOai,
        ),
    ];
    for (c, &(gf, df, dt, n, h, e, i, k, act)) in cases.iter().enumerate() {
        let seed = 5000 + 37 * c as u64;
        // x scaled up so the clamp (7) is reached by some gate and up values.
        let x: Vec<f32> = values(n * h, seed).iter().map(|v| 6.0 * v).collect();
        let logits: Vec<f32> = (0..n * e)
            .map(|j| ((j * 7919 + c) % e) as f32 * 0.23)
            .collect();
        let gu = weight_bytes(gf, 2 * e * i, h, seed + 1);
        let mut dn = weight_bytes(df, e * h, i, seed + 2);
        // (Not in f16: scales to 2^8 overflow its range.)
        if df == mx && dt != DType::F16 {
            spread_mxfp4_scales(&mut dn, e * h, i);
        }
        let gu_b = values(2 * e * i, seed + 3);
        let dn_b = values(e * h, seed + 4);
        let name = format!("case {c} ({gf}/{df}, {dt}, n={n} h={h} e={e} i={i} k={k}, {act:?})");
        QuantMoe {
            act,
            dt,
            shape: (n, h, e, i, k),
            x: &x,
            logits: &logits,
            gate_up: (gf, &gu),
            down: (df, &dn),
            bias: Some((&gu_b, &dn_b)),
        }
        .check(&name, &cpu, &paths);
    }
}

/// MXFP4 rows (`rows` of `k` values) with their block scales spread over 2^-7 ..= 2^8 (E8M0
/// 120..=135), so the bf16 decode's second product (scales above 2^1) runs too.
fn spread_mxfp4_scales(bytes: &mut [u8], rows: usize, k: usize) {
    let (row, nb) = (bytes.len() / rows, k / 32);
    for r in 0..rows {
        for b in 0..nb {
            bytes[r * row + 16 * nb + b] = 120 + ((7 * r + 3 * b) % 16) as u8;
        }
    }
}
