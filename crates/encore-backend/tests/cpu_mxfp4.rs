//! MXFP4 against transformers' own dequantizer: `tests/data/mxfp4_hf.json` holds random
//! `*_blocks` / `*_scales` bytes (every E8M0 edge among them) and the float32 values
//! `transformers.integrations.mxfp4.convert_moe_packed_tensors` (5.17) gives them
//! (`scripts/mxfp4_reference.py` writes it). Each row, repacked into the device layout by
//! `quant::mxfp4::hf_row`, must decode (`quant::dequantize_row`, the reference the CUDA
//! kernels are checked against) to exactly those values.

use encore_backend::quant::{dequantize_row, mxfp4, QuantFormat};
use serde_json::Value;

fn value(v: &Value) -> f32 {
    match v {
        Value::String(s) if s == "inf" => f32::INFINITY,
        Value::String(s) if s == "-inf" => f32::NEG_INFINITY,
        Value::String(s) if s == "nan" => f32::NAN,
        v => v.as_f64().expect("a number") as f32,
    }
}

#[test]
fn hf_blocks_decode_as_transformers_dequantizes_them() {
    let fixture: Value =
        serde_json::from_str(include_str!("data/mxfp4_hf.json")).expect("the fixture parses");
    let shape: Vec<usize> = fixture["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as usize)
        .collect();
    let bytes = |key: &str| -> Vec<u8> {
        fixture[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u8)
            .collect()
    };
    let (blocks, scales) = (bytes("blocks"), bytes("scales"));
    let want: Vec<f32> = fixture["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(value)
        .collect();
    let (rows, g) = (shape[0] * shape[1], shape[2]);
    let k = 32 * g;
    assert_eq!(
        (blocks.len(), scales.len(), want.len()),
        (rows * g * 16, rows * g, rows * k)
    );
    // The fixture's scales reach both ends of E8M0.
    for e in [0u8, 1, 254, 255] {
        assert!(scales.contains(&e), "scale {e} in the fixture");
    }
    let fmt = QuantFormat::Mxfp4;
    let mut row = vec![0u8; fmt.row_bytes(k).unwrap()];
    let mut got = vec![0f32; k];
    for r in 0..rows {
        mxfp4::hf_row(
            &blocks[r * g * 16..(r + 1) * g * 16],
            &scales[r * g..(r + 1) * g],
            &mut row,
        );
        dequantize_row(fmt, &row, &mut got);
        for (c, (&a, &b)) in got.iter().zip(&want[r * k..(r + 1) * k]).enumerate() {
            // Equal values (transformers' -0 for code 8 is llama.cpp's +0).
            assert!(
                a == b || (a.is_nan() && b.is_nan()),
                "row {r} value {c}: {a} vs {b}"
            );
        }
    }
}
