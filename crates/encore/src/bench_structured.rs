//! `encore bench structured`: the host cost of structured outputs for a model's tokenizer
//! (no weights are loaded): indexing the tokenizer once, compiling JSON schemas (p50/p99
//! over a set of schemas, each compiled `--repeats` times), and per generated token the
//! allowed-token mask and the advance by the token, along a random walk through each
//! schema's language (each step takes a uniformly drawn allowed token, seeded).

use std::time::Instant;

use anyhow::{anyhow, Result};
use clap::Args;
use encore_core::constraint::ConstraintCompiler;
use encore_core::request::Constraint;

use crate::out::outln;
use crate::parse;

#[derive(Args)]
pub struct BenchStructuredArgs {
    /// A Hugging Face model directory, a `.gguf` file, or `dummy:NAME` (its tokenizer and
    /// vocabulary only; no weights are read).
    #[arg(long, default_value = "dummy:tiny")]
    model: String,
    /// Compiles of each schema (the first is counted too).
    #[arg(long, default_value = "5", value_parser = parse::count::<1, 1000>, allow_negative_numbers = true)]
    repeats: usize,
    /// Most tokens of each schema's walk.
    #[arg(long, default_value = "200", value_parser = parse::count::<1, 100_000>, allow_negative_numbers = true)]
    tokens: usize,
    /// Seed of the walks.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// One JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

/// The schemas compiled and walked: flat and nested objects, arrays, enums, bounded
/// numbers, string formats and patterns, optional fields, `anyOf` and `$ref`.
const SCHEMAS: &[&str] = &[
    r#"{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"}},"required":["name","age"]}"#,
    r#"{"type":"object","properties":{"city":{"type":"string","maxLength":40},"country":{"type":"string","maxLength":40},"population":{"type":"integer","minimum":0}},"required":["city","country"],"additionalProperties":false}"#,
    r#"{"type":"object","properties":{"items":{"type":"array","items":{"type":"object","properties":{"sku":{"type":"string","pattern":"^[A-Z]{3}-[0-9]{4}$"},"qty":{"type":"integer","minimum":1,"maximum":99},"price":{"type":"number"}},"required":["sku","qty","price"]},"minItems":1,"maxItems":5},"currency":{"enum":["USD","EUR","GBP"]}},"required":["items","currency"]}"#,
    r#"{"type":"object","properties":{"event":{"type":"string"},"date":{"type":"string","format":"date"},"attendees":{"type":"array","items":{"type":"string","format":"email"},"maxItems":4},"online":{"type":"boolean"}},"required":["event","date","attendees","online"]}"#,
    r#"{"type":"object","properties":{"result":{"anyOf":[{"type":"object","properties":{"ok":{"const":true},"value":{"type":"number"}},"required":["ok","value"]},{"type":"object","properties":{"ok":{"const":false},"error":{"type":"string"}},"required":["ok","error"]}]}},"required":["result"]}"#,
    r##"{"$defs":{"node":{"type":"object","properties":{"label":{"type":"string","maxLength":12},"children":{"type":"array","items":{"$ref":"#/$defs/leaf"},"maxItems":3}},"required":["label","children"]},"leaf":{"type":"object","properties":{"id":{"type":"integer"},"tags":{"type":"array","items":{"type":"string"},"maxItems":3}},"required":["id"]}},"type":"object","properties":{"root":{"$ref":"#/$defs/node"}},"required":["root"]}"##,
    r#"{"type":"object","properties":{"title":{"type":"string"},"rating":{"type":"number","minimum":0,"maximum":5},"review":{"type":"string","maxLength":200},"tags":{"type":"array","items":{"enum":["food","service","price","ambience"]},"maxItems":4}},"required":["title","rating","review"]}"#,
    r#"{"type":"object","properties":{"user":{"type":"object","properties":{"id":{"type":"string","format":"uuid"},"roles":{"type":"array","items":{"enum":["admin","editor","viewer"]}},"settings":{"type":"object","additionalProperties":{"type":"boolean"}}},"required":["id","roles"]},"version":{"type":"integer"}},"required":["user","version"]}"#,
];

/// The `p`-th percentile (0..=100) of `v` (sorted here), nearest rank.
fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

pub fn run(a: BenchStructuredArgs) -> Result<()> {
    let files = encore_core::model::open_model(&a.model)?;
    let tok = files.tokenizer()?;
    let vocab = files.config.vocab_size;
    let eos = tok.eos_token_ids();
    let t = Instant::now();
    let compiler = ConstraintCompiler::new(&tok, vocab)
        .map_err(|e| anyhow!("indexing the tokenizer of {}: {e}", a.model))?;
    let index_ms = t.elapsed().as_secs_f64() * 1e3;

    let mut compile_ms = Vec::new();
    let (mut mask_us, mut commit_us) = (Vec::new(), Vec::new());
    let mut walked = 0usize;
    let mut state = a.seed;
    let mut words = vec![0u32; compiler.mask_words()];
    for (i, schema) in SCHEMAS.iter().enumerate() {
        let c = Constraint::JsonSchema((*schema).to_string());
        let mut live = None;
        for _ in 0..a.repeats {
            let t = Instant::now();
            let compiled = compiler
                .compile(&c)
                .map_err(|e| anyhow!("schema {i}: {e}"))?;
            compile_ms.push(t.elapsed().as_secs_f64() * 1e3);
            live = Some(compiled);
        }
        let mut live = live.expect("repeats >= 1");
        for _ in 0..a.tokens {
            let t = Instant::now();
            live.fill_mask(&mut words)
                .map_err(|e| anyhow!("schema {i}: {e}"))?;
            mask_us.push(t.elapsed().as_secs_f64() * 1e6);
            let allowed: Vec<u32> = (0..vocab as u32)
                .filter(|&t| (words[t as usize / 32] >> (t % 32)) & 1 == 1)
                .collect();
            if allowed.iter().all(|t| eos.contains(t)) {
                break; // the schema's text is complete
            }
            // Walk on text: an end token only when nothing else is allowed.
            let text: Vec<u32> = allowed
                .iter()
                .copied()
                .filter(|t| !eos.contains(t))
                .collect();
            state = encore_core::ops::splitmix64(state);
            let token = text[(encore_core::ops::mix64(state) % text.len() as u64) as usize];
            let t = Instant::now();
            live.commit(token).map_err(|e| anyhow!("schema {i}: {e}"))?;
            commit_us.push(t.elapsed().as_secs_f64() * 1e6);
            walked += 1;
        }
    }
    let row = serde_json::json!({
        "model": a.model,
        "vocab": vocab,
        "schemas": SCHEMAS.len(),
        "index_ms": index_ms,
        "compile_ms_p50": percentile(&mut compile_ms.clone(), 50.0),
        "compile_ms_p99": percentile(&mut compile_ms.clone(), 99.0),
        "compile_ms_max": percentile(&mut compile_ms.clone(), 100.0),
        "tokens": walked,
        "mask_us_p50": percentile(&mut mask_us.clone(), 50.0),
        "mask_us_p99": percentile(&mut mask_us.clone(), 99.0),
        "commit_us_p50": percentile(&mut commit_us.clone(), 50.0),
        "commit_us_p99": percentile(&mut commit_us.clone(), 99.0),
    });
    if a.json {
        outln!("{row}")?;
        return Ok(());
    }
    let f = |k: &str| row[k].as_f64().unwrap_or(f64::NAN);
    outln!(
        "{} (vocab {vocab}): tokenizer indexed in {:.1} ms",
        a.model,
        index_ms
    )?;
    outln!(
        "compile: {} schemas x {}: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        SCHEMAS.len(),
        a.repeats,
        f("compile_ms_p50"),
        f("compile_ms_p99"),
        f("compile_ms_max")
    )?;
    outln!(
        "per token ({walked} tokens walked): mask p50 {:.1} us, p99 {:.1} us; advance p50 {:.1} us, p99 {:.1} us",
        f("mask_us_p50"),
        f("mask_us_p99"),
        f("commit_us_p50"),
        f("commit_us_p99")
    )?;
    Ok(())
}
