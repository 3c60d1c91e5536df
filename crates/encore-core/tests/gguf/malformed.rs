//! Malformed files: truncations, broken headers and corruptions are errors naming what is
//! wrong, never panics; every value type round-trips through the writer.

use super::*;

fn put_u64(bytes: &mut [u8], at: usize, v: u64) {
    bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// Open `bytes` as a file; the error text, which must name the path.
fn open_err(dir: &TempDir, bytes: &[u8]) -> String {
    let path = dir.file("bad.gguf");
    std::fs::write(&path, bytes).unwrap();
    let (e, msg) = err_text(GgufFile::open(&path));
    assert!(
        matches!(e, Error::WeightsFile { .. } | Error::Weights { .. }),
        "{msg}"
    );
    assert_mentions(&msg, &["bad.gguf"]);
    msg
}

fn small_file() -> GgufWriter {
    let cfg = ModelConfig::from_json(
        &tiny_json("LlamaForCausalLM", "")
            .replace(r#""vocab_size": 96"#, r#""vocab_size": 8"#)
            .replace(r#""num_hidden_layers": 2"#, r#""num_hidden_layers": 1"#)
            .replace(r#""hidden_size": 64"#, r#""hidden_size": 32"#)
            .replace(r#""intermediate_size": 96"#, r#""intermediate_size": 32"#),
        "test",
    )
    .unwrap();
    let ts = hf_checkpoint(&cfg, Store::Q8_0, 5);
    gguf_twin(&cfg, &ts, Store::Q8_0)
}

#[test]
fn every_truncation_is_an_error_never_a_panic() {
    let dir = TempDir::new("trunc");
    let bytes = small_file().to_bytes();
    let path = dir.file("whole.gguf");
    std::fs::write(&path, &bytes).unwrap();
    let whole = GgufFile::open(&path).unwrap();
    let data_end = whole
        .tensors()
        .iter()
        .map(|t| t.start + t.len)
        .max()
        .unwrap();
    let header_end = whole.tensors().iter().map(|t| t.start).min().unwrap();
    let cuts = (0..header_end)
        .step_by(3)
        .chain((header_end..bytes.len()).step_by(61));
    let cut_path = dir.file("cut.gguf");
    for cut in cuts {
        std::fs::write(&cut_path, &bytes[..cut]).unwrap();
        match GgufFile::open(&cut_path) {
            Ok(f) => {
                assert!(
                    cut >= data_end,
                    "a file cut at {cut} of {} opened",
                    bytes.len()
                );
                config_from_gguf(&f).unwrap();
            }
            Err(e) => {
                let msg = e.to_string();
                assert!(cut < data_end, "cut at {cut}: {msg}");
                assert_mentions(&msg, &["cut.gguf"]);
                if cut >= header_end {
                    assert_mentions(&msg, &["extend past the end"]);
                } else if cut > 24 {
                    assert!(
                        msg.contains("truncated") || msg.contains("can hold"),
                        "{msg}"
                    );
                }
            }
        }
    }
}

#[test]
fn malformed_headers_name_what_is_wrong() {
    let dir = TempDir::new("hdr");
    let good = small_file().to_bytes();

    let mut b = good.clone();
    b[..4].copy_from_slice(b"GGML");
    assert_mentions(&open_err(&dir, &b), &["not a GGUF file"]);
    for (v, hint) in [
        (1u32, "v1"),
        (4, "versions 2 and 3"),
        (3u32.swap_bytes(), "big-endian"),
    ] {
        let mut b = good.clone();
        b[4..8].copy_from_slice(&v.to_le_bytes());
        assert_mentions(&open_err(&dir, &b), &["unsupported GGUF version", hint]);
    }
    let mut b = good.clone();
    put_u64(&mut b, 8, u64::MAX);
    assert_mentions(
        &open_err(&dir, &b),
        &["tensor count", "18446744073709551615"],
    );
    let mut b = good.clone();
    put_u64(&mut b, 16, 1 << 40);
    assert_mentions(&open_err(&dir, &b), &["metadata count"]);
    let mut b = good.clone();
    put_u64(&mut b, 24, u64::MAX / 2);
    assert_mentions(
        &open_err(&dir, &b),
        &["length of the key of metadata entry 0"],
    );
    assert_mentions(&open_err(&dir, b"GGUF"), &["truncated", "version"]);
    assert_mentions(&open_err(&dir, b""), &["truncated", "magic"]);
}

/// A writer edit that breaks the file, and what its error must mention.
type Breakage = (fn(&mut GgufWriter), &'static [&'static str]);

#[test]
fn malformed_metadata_and_tensor_infos_name_what_is_wrong() {
    let dir = TempDir::new("hdr-writer");
    let cases: &[Breakage] = &[
        // Metadata values.
        (
            |w| {
                w.kv(
                    "x.deep",
                    (0..12).fold(Value::U8(1), |v, _| Value::Array(9, vec![v])),
                );
            },
            &["x.deep", "nests arrays"],
        ),
        (
            |w| {
                w.kv("x.arr", Value::Array(13, vec![]));
            },
            &["x.arr", "unknown value type 13"],
        ),
        (
            |w| {
                w.kv("general.alignment", Value::U32(24));
            },
            &["general.alignment", "power of two"],
        ),
        (
            |w| {
                w.metadata
                    .push(("general.name".into(), Value::String("again".into())));
            },
            &["general.name", "twice"],
        ),
        // Tensor infos.
        (
            |w| {
                w.tensors
                    .push(("t5".into(), vec![1; 5], GgmlType::F32, vec![0; 4]));
            },
            &["t5", "5 dimensions"],
        ),
        (
            |w| {
                w.tensors
                    .push(("huge".into(), vec![1 << 40, 1 << 40], GgmlType::F32, vec![]));
            },
            &["huge", "too large"],
        ),
        (
            |w| {
                w.tensors
                    .push(("odd".into(), vec![33], GgmlType::Q8_0, vec![0; 34]));
            },
            &["odd", "not a multiple of the Q8_0 block"],
        ),
        (
            |w| {
                w.tensors
                    .push(("alien".into(), vec![32], GgmlType(77), vec![]));
            },
            &["alien", "type id 77"],
        ),
        (
            |w| {
                w.tensors
                    .push(("t".into(), vec![4], GgmlType::F32, vec![0; 16]));
                w.tensors
                    .push(("t".into(), vec![4], GgmlType::F32, vec![0; 16]));
            },
            &["`t`", "twice"],
        ),
        // Data past the end (a tensor claiming more bytes than were written).
        (
            |w| {
                w.tensors
                    .push(("big".into(), vec![1 << 20], GgmlType::F32, vec![0; 16]));
            },
            &["big", "extend past the end"],
        ),
    ];
    for (edit, parts) in cases {
        let mut w = small_file();
        edit(&mut w);
        assert_mentions(&open_err(&dir, &w.to_bytes()), parts);
    }
}

#[test]
fn a_bad_bool_and_a_misaligned_offset_are_named() {
    let dir = TempDir::new("bool");
    let mut w = GgufWriter::new();
    w.kv("x.flag", Value::Bool(true));
    let mut b = w.to_bytes();
    // magic, version, counts, key (8 + 6), type (4): then the bool byte.
    let at = 4 + 4 + 8 + 8 + 8 + 6 + 4;
    assert_eq!(b[at], 1);
    b[at] = 7;
    assert_mentions(&open_err(&dir, &b), &["x.flag", "bool of value 7"]);

    let mut w = GgufWriter::new();
    w.tensor_f32("a", &[4], &[1.0; 4]);
    let mut b = w.to_bytes();
    // The offset is the last 8 bytes of the tensor info, right before the padding.
    let info_end = 4 + 4 + 8 + 8 + (8 + 1) + 4 + 8 + 4 + 8;
    put_u64(&mut b, info_end - 8, 4);
    assert_mentions(&open_err(&dir, &b), &["`a`", "offset 4", "alignment 32"]);
}

#[test]
fn every_value_type_round_trips_through_the_writer() {
    let dir = TempDir::new("values");
    let values = vec![
        Value::U8(200),
        Value::I8(-5),
        Value::U16(60000),
        Value::I16(-30000),
        Value::U32(4_000_000_000),
        Value::I32(-2_000_000_000),
        Value::F32(1.5),
        Value::Bool(true),
        Value::String("héllo".into()),
        Value::U64(u64::MAX),
        Value::I64(i64::MIN),
        Value::F64(-0.25),
        Value::Array(
            8,
            vec![Value::String("a".into()), Value::String(String::new())],
        ),
        Value::Array(
            9,
            vec![
                Value::Array(4, vec![Value::U32(1), Value::U32(2)]),
                Value::Array(4, vec![]),
            ],
        ),
    ];
    for version in [2, 3] {
        let mut w = GgufWriter::new();
        w.version = version;
        w.alignment = 64;
        for (i, v) in values.iter().enumerate() {
            w.kv(&format!("k.{i}"), v.clone());
        }
        w.tensor("q", &[2, 32], GgmlType::Q8_0, vec![0; 68]);
        w.tensor_f32("f", &[3], &[1.0, 2.0, 3.0]);
        let path = dir.file("values.gguf");
        w.write(&path).unwrap();
        let f = GgufFile::open(&path).unwrap();
        assert_eq!((f.version, f.alignment), (version, 64));
        for (i, v) in values.iter().enumerate() {
            assert_eq!(f.get(&format!("k.{i}")), Some(v), "k.{i}");
        }
        assert_eq!(f.get("general.alignment"), Some(&Value::U32(64)));
        assert_eq!(f.tensor("q").unwrap().shape(), vec![2, 32]);
        assert_eq!(f.tensor("q").unwrap().dims, vec![32, 2]);
        assert_eq!(f.tensor("f").unwrap().start % 64, 0);
        assert_eq!(f.tensor_f32("f").unwrap(), vec![1.0, 2.0, 3.0]);
    }
}

/// Random byte changes in the header and metadata: every outcome is an error or a file
/// that loads (or fails to load) cleanly, never a panic.
#[test]
fn corrupted_headers_never_panic() {
    let dir = TempDir::new("corrupt");
    let good = small_file().to_bytes();
    let path = dir.file("whole.gguf");
    std::fs::write(&path, &good).unwrap();
    let header_end = GgufFile::open(&path).unwrap().tensors()[0].start;
    let cut = dir.file("corrupt.gguf");
    let mut opened = 0;
    for i in 0..1500u64 {
        let r = values(i + 100, 3);
        let mut b = good.clone();
        let at = ((r[0] + 1.0) / 2.0 * header_end as f32) as usize % header_end;
        let byte = ((r[1] + 1.0) * 128.0) as u8;
        b[at] = if r[2] > 0.0 {
            byte
        } else {
            b[at] ^ (1 << (byte % 8))
        };
        std::fs::write(&cut, &b).unwrap();
        let Ok(f) = GgufFile::open(&cut) else {
            continue;
        };
        opened += 1;
        let _ = vocab_from_gguf(&f);
        if let Ok(cfg) = config_from_gguf(&f) {
            let _ = load(&cfg, WeightSource::Gguf(PathBuf::from(&cut)));
        }
    }
    assert!(
        opened > 0,
        "some corruptions (e.g. inside strings) still parse"
    );
}
