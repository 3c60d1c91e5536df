//! The loader's slicing of a rank's block out of a tensor's bytes.

use super::*;
use encore_backend::quant::{quantize_rows, quantize_rows_by_block, QuantFormat};

fn spec(shape: &[usize]) -> TensorSpec {
    TensorSpec {
        name: "w".into(),
        shape: shape.to_vec(),
        slice: None,
    }
}

#[test]
fn a_rank_s_block_of_a_quantized_tensor_is_the_block_quantized_alone() {
    // Blocks quantize independently (FP8 by block here: `quantize_rows` gives it one
    // scale a row), so cutting whole blocks out of the device rows must give the device
    // rows of the cut values.
    let (rows, k) = (3, 512);
    let values: Vec<f32> = (0..rows * k)
        .map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0)
        .collect();
    let cut = Slice {
        row: 1,
        rows: 2,
        col: 256,
        cols: 256,
        pad: 0,
    };
    for fmt in QuantFormat::ALL {
        let mut whole = vec![0u8; fmt.bytes(rows, k).unwrap()];
        quantize_rows_by_block(fmt, &values, k, &mut whole);
        let part: Vec<f32> = (cut.row..cut.row + cut.rows)
            .flat_map(|r| values[r * k + cut.col..r * k + cut.col + cut.cols].to_vec())
            .collect();
        let mut want = vec![0u8; fmt.bytes(cut.rows, cut.cols).unwrap()];
        quantize_rows_by_block(fmt, &part, cut.cols, &mut want);
        let got = slice_part(&spec(&[rows, k]), cut, DType::Q(fmt), &whole).unwrap();
        assert_eq!(got, want, "{fmt}");
    }
    // A rank's cut of FP8 rows quantized with one scale a row keeps the whole row's
    // scale (the loader quantizes the whole tensor, then cuts), so it stays row-scaled.
    let fp8 = QuantFormat::F8E4M3;
    let mut whole = vec![0u8; fp8.bytes(rows, k).unwrap()];
    quantize_rows(fp8, &values, k, &mut whole);
    assert!(encore_backend::quant::rows_share_one_scale(fp8, k, &whole));
    let got = slice_part(&spec(&[rows, k]), cut, DType::Q(fp8), &whole).unwrap();
    assert!(encore_backend::quant::rows_share_one_scale(
        fp8, cut.cols, &got
    ));
    // A cut that is not whole blocks is refused, naming the tensor.
    let bad = Slice { col: 16, ..cut };
    let q = DType::Q(QuantFormat::Q4K);
    let whole = vec![0u8; QuantFormat::Q4K.bytes(rows, k).unwrap()];
    let e = slice_part(&spec(&[rows, k]), bad, q, &whole)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("`w`") && e.contains("not whole q4_k blocks of 256"),
        "{e}"
    );
}

#[test]
fn a_rank_s_block_of_a_dense_tensor_is_its_rows_and_columns() {
    let values: Vec<f32> = (0..4 * 6).map(|i| i as f32).collect();
    let bytes: Vec<u8> = bytemuck::cast_slice(&values).to_vec();
    let cut = Slice {
        row: 1,
        rows: 2,
        col: 2,
        cols: 3,
        pad: 0,
    };
    let got = slice_part(&spec(&[4, 6]), cut, DType::F32, &bytes).unwrap();
    let got: &[f32] = bytemuck::cast_slice(&got);
    assert_eq!(got, &[8.0, 9.0, 10.0, 14.0, 15.0, 16.0]);
    // A 1-D tensor (a bias) cut by rows.
    let rows = Slice {
        row: 2,
        rows: 2,
        col: 0,
        cols: 1,
        pad: 0,
    };
    let got = slice_part(&spec(&[6]), rows, DType::F32, &bytes[..24]).unwrap();
    assert_eq!(bytemuck::cast_slice::<u8, f32>(&got), &[2.0, 3.0]);
}

/// A rank's dummy block drawn alone is the block of the whole dummy tensor.
#[test]
fn a_dummy_block_drawn_alone_is_the_whole_tensors_block() {
    for dtype in [DType::F32, DType::BF16] {
        for (shape, cut) in [
            (
                vec![6, 10],
                Slice {
                    row: 2,
                    rows: 3,
                    col: 4,
                    cols: 5,
                    pad: 0,
                },
            ),
            (
                vec![9],
                Slice {
                    row: 3,
                    rows: 4,
                    col: 0,
                    cols: 1,
                    pad: 0,
                },
            ),
        ] {
            let sp = spec(&shape);
            let mut staging = Staging::default();
            let whole = staging.dummy(7, "w", sp.numel(), 0.1, 0.5, dtype).to_vec();
            let want = slice_part(&sp, cut, dtype, &whole).unwrap();
            let got = staging.dummy_block(7, "w", row_len(&sp), cut, 0.1, 0.5, dtype);
            assert_eq!(got, &want[..], "{dtype} {shape:?}");
        }
    }
}
