//! `encore bench serve --dataset-shape trtllm|trtllm-gpt-oss-20b|trtllm-gpt-oss-120b`:
//! TensorRT-LLM's published throughput table for Llama-3.1-8B FP8 (or gpt-oss-20b, -120b)
//! on one H200 as a sequence of runs, one per row, and one table with TensorRT-LLM's figure
//! beside ours.
//!
//! The rows, their request counts and TensorRT-LLM's figures are those of its performance
//! overview ([`Table::source`]): `trtllm-bench throughput` over a synthetic data set of
//! `prepare_dataset.py token-norm-dist --num-requests=N --input-mean=ISL --output-mean=OSL
//! --input-stdev=0 --output-stdev=0` (every request exactly ISL prompt tokens, random ids,
//! and exactly OSL output tokens, end-of-sequence disabled), every request queued at once
//! (no concurrency limit), after `--warmup 2` requests (trtllm-bench's default) that are
//! left out of its figures. The metric is "Total Output Throughput (tokens/sec)", output
//! tokens over the whole run. Each row here does the same: `--warmup` requests of the
//! row's shape first (left out), then the row's requests at once, through one engine
//! (`--in-process`) or server (`--url`) for all rows, one row after the other.

use clap::ValueEnum;
use serde_json::{json, Map, Value};

use super::workload::WorkloadArgs;
use crate::out::outln;

/// `--dataset-shape`: a preset of runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DatasetShape {
    /// TensorRT-LLM's throughput table for Llama-3.1-8B FP8 on one H200 (trtllm-bench):
    /// ISL/OSL 128/128, 1000/1000, 500/2000 and 2048/128.
    Trtllm,
    /// TensorRT-LLM's table for gpt-oss-20b on one H200 (TP1): 1000/1000, 1024/1024,
    /// 1024/8192, 8192/1024 and 32768/1024.
    #[value(name = "trtllm-gpt-oss-20b")]
    TrtllmGptOss20b,
    /// TensorRT-LLM's table for gpt-oss-120b on one H200 (TP1), the same rows.
    #[value(name = "trtllm-gpt-oss-120b")]
    TrtllmGptOss120b,
}

impl DatasetShape {
    /// The published table the preset runs.
    pub fn table(self) -> &'static Table {
        match self {
            DatasetShape::Trtllm => &TRTLLM_LLAMA_8B,
            DatasetShape::TrtllmGptOss20b => &TRTLLM_GPT_OSS_20B,
            DatasetShape::TrtllmGptOss120b => &TRTLLM_GPT_OSS_120B,
        }
    }
}

/// A peer's published throughput table for one model on one GPU.
#[derive(Debug)]
pub struct Table {
    /// The preset's `--dataset-shape` value.
    pub name: &'static str,
    /// What the peer ran (model, weights, GPU).
    pub what: &'static str,
    /// Where the figures come from (a page at a commit).
    pub source: &'static str,
    pub rows: &'static [PeerRow],
}

/// One row of a peer's published table.
#[derive(Clone, Copy, Debug)]
pub struct PeerRow {
    /// Prompt tokens of every request.
    pub isl: usize,
    /// Output tokens of every request (end-of-sequence ignored).
    pub osl: usize,
    /// Requests in the peer's data set (`prepare_dataset.py --num-requests`).
    pub requests: usize,
    /// The peer's output tokens per second over the run.
    pub output_throughput: f64,
}

/// The peer's name in the table and the report.
pub const PEER: &str = "TensorRT-LLM";

const fn row(isl: usize, osl: usize, requests: usize, output_throughput: f64) -> PeerRow {
    PeerRow {
        isl,
        osl,
        requests,
        output_throughput,
    }
}

/// TensorRT-LLM's published throughput for Llama-3.1-8B FP8 (nvidia/Llama-3.1-8B-Instruct-FP8)
/// on one H200 SXM 141GB, TP1, `trtllm-bench throughput` with the PyTorch backend: its
/// performance overview as of its 1.0 docs (the page that still has the Llama 3.1 8B table;
/// later versions moved it to docs/source/developer-guide/perf-overview.md and dropped that
/// model), "Llama 3.1 8B", column "H200 TP1 (FP8)", output tokens/s, and the number of
/// requests of each row's data set (the same page's `$num_requests` table).
pub static TRTLLM_LLAMA_8B: Table = Table {
    name: "trtllm",
    what: "Llama-3.1-8B FP8, one H200, trtllm-bench throughput",
    source: "https://github.com/NVIDIA/TensorRT-LLM/blob/00f37686aa854010d68bcbd0f4ab000221541ca6/docs/source/performance/perf-overview.md",
    rows: &[
        row(128, 128, 30_000, 27_911.0),
        row(1000, 1000, 3000, 17_744.0),
        row(500, 2000, 3000, 20_770.0),
        row(2048, 128, 3000, 3538.0),
    ],
};

/// Where the gpt-oss tables come from: TensorRT-LLM's developer guide, "GPT-OSS 20B" and
/// "GPT-OSS 120B", column "H200 TP1" (MXFP4 experts; the page writes FP8: its KV cache and
/// attention), output tokens/s per GPU; request counts from the same page's table (1000/1000
/// as 1024/1024's: the page lists none for it).
const GPT_OSS_SOURCE: &str = "https://github.com/NVIDIA/TensorRT-LLM/blob/03e27c7d5ff0c6e89f8328838c0a8e64f1b34f9d/docs/source/developer-guide/perf-overview.md";

pub static TRTLLM_GPT_OSS_20B: Table = Table {
    name: "trtllm-gpt-oss-20b",
    what: "gpt-oss-20b, one H200, trtllm-bench throughput",
    source: GPT_OSS_SOURCE,
    rows: &[
        row(1000, 1000, 3000, 13_858.0),
        row(1024, 1024, 3000, 13_890.0),
        row(1024, 8192, 1500, 12_743.0),
        row(8192, 1024, 1500, 4015.0),
        row(32768, 1024, 1000, 915.0),
    ],
};

pub static TRTLLM_GPT_OSS_120B: Table = Table {
    name: "trtllm-gpt-oss-120b",
    what: "gpt-oss-120b, one H200, trtllm-bench throughput",
    source: GPT_OSS_SOURCE,
    rows: &[
        row(1000, 1000, 3000, 6868.0),
        row(1024, 1024, 3000, 6798.0),
        row(1024, 8192, 1500, 3543.0),
        row(8192, 1024, 1500, 1828.0),
        row(32768, 1024, 1000, 519.0),
    ],
};

/// Warm-up requests before each row without `--warmup`: trtllm-bench's default.
pub const DEFAULT_WARMUP: usize = 2;

/// One measured run of `bench serve`: the workload's flags, the warm-up's (sent first and
/// left out of the figures), and the peer's row it is compared with (a preset's).
pub struct Run {
    pub args: WorkloadArgs,
    pub warmup: Option<WorkloadArgs>,
    pub peer: Option<(&'static Table, &'static PeerRow)>,
}

impl Run {
    /// The longest sequence (prompt + output) a request of a preset's row asks for.
    pub fn max_seq_len(&self) -> usize {
        self.args.input_len.1 + self.args.output_len.1
    }
}

/// The runs the flags ask for: the preset's rows (those of `--rows`), or the one run of
/// the flags. A `--rows` entry that is no row of the preset is refused.
pub fn runs(a: &WorkloadArgs) -> anyhow::Result<Vec<Run>> {
    let Some(shape) = a.dataset_shape else {
        return Ok(vec![Run {
            args: a.clone(),
            warmup: None,
            peer: None,
        }]);
    };
    let table = shape.table();
    if let Some((i, o)) = a
        .rows
        .iter()
        .find(|r| !table.rows.iter().any(|p| (p.isl, p.osl) == **r))
    {
        let rows: Vec<String> = table
            .rows
            .iter()
            .map(|p| format!("{}/{}", p.isl, p.osl))
            .collect();
        anyhow::bail!(
            "--rows {i}/{o}: not a row of --dataset-shape {} ({})",
            table.name,
            rows.join(", ")
        );
    }
    // Every row and its warm-up its own prompts (another seed): none shares a cached
    // prefix with an earlier request by chance.
    let seed = |k: u64| a.seed ^ k.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let row = |p: &PeerRow, n: usize, seed: u64| WorkloadArgs {
        num_prompts: Some(n),
        input_len: (p.isl, p.isl),
        output_len: (p.osl, p.osl),
        shared_prefix_len: 0,
        trace: None,
        request_rate: None,
        arrival: None,
        seed,
        dataset_shape: None,
        warmup: None,
        rows: Vec::new(),
    };
    let warmup = a.warmup.unwrap_or(DEFAULT_WARMUP);
    Ok(table
        .rows
        .iter()
        .enumerate()
        .filter(|(_, p)| a.rows.is_empty() || a.rows.contains(&(p.isl, p.osl)))
        .map(|(k, p)| Run {
            args: row(p, a.num_prompts.unwrap_or(p.requests), seed(2 * k as u64)),
            warmup: (warmup > 0).then(|| row(p, warmup, seed(2 * k as u64 + 1))),
            peer: Some((table, p)),
        })
        .collect())
}

/// The flags that set the requests' lengths, for errors.
pub fn length_flags(a: &WorkloadArgs) -> String {
    match a.dataset_shape {
        Some(d) => format!("--dataset-shape {}", d.table().name),
        None => "--input-len / --output-len / --trace".into(),
    }
}

/// What starts each row on stderr.
pub fn announce(k: usize, run: &Run) -> String {
    let (t, p) = run.peer.expect("a preset's run");
    format!(
        "row {}/{}: ISL/OSL {}/{}, {} request(s) at once{}",
        k + 1,
        t.rows.len(),
        p.isl,
        p.osl,
        run.args.num_prompts.unwrap_or(0),
        match &run.warmup {
            Some(w) => format!(" after {} warm-up request(s)", w.num_prompts.unwrap_or(0)),
            None => String::new(),
        }
    )
}

/// A preset row's report with the peer's figures in front: `isl`, `osl`, the peer's
/// request count and output throughput, and ours over theirs.
pub fn with_peer(t: &Table, p: &PeerRow, report: Map<String, Value>) -> Map<String, Value> {
    let ours = report["output_throughput"].as_f64().unwrap_or(0.0);
    let mut m = Map::new();
    m.insert("dataset_shape".into(), json!(t.name));
    m.insert("isl".into(), json!(p.isl));
    m.insert("osl".into(), json!(p.osl));
    m.insert("peer".into(), json!(PEER));
    m.insert("peer_num_prompts".into(), json!(p.requests));
    m.insert("peer_output_throughput".into(), json!(p.output_throughput));
    m.insert(
        "output_throughput_ratio".into(),
        json!(ours / p.output_throughput),
    );
    m.insert("peer_ran".into(), json!(t.what));
    m.insert("peer_source".into(), json!(t.source));
    m.extend(report);
    m
}

/// The preset's rows (from [`with_peer`]): one JSON array with `json`, else a table.
pub fn print(rows: &[Map<String, Value>], json: bool) -> anyhow::Result<()> {
    if json {
        outln!(
            "{}",
            Value::Array(rows.iter().cloned().map(Value::Object).collect())
        )?;
        return Ok(());
    }
    let first = rows.first();
    let text = |k: &str| first.and_then(|r| r[k].as_str()).unwrap_or("?").to_string();
    outln!(
        "bench serve --dataset-shape {}: {} ({}) beside {PEER}'s published figures ({})",
        text("dataset_shape"),
        text("model"),
        text("mode"),
        text("peer_ran")
    )?;
    outln!(
        "{:<10} {:>8} {:>6} {:>13} {:>13} {:>9} {:>12} {:>13}",
        "ISL/OSL",
        "requests",
        "failed",
        "output tok/s",
        PEER,
        "ours/peer",
        "total tok/s",
        "mean TPOT ms"
    )?;
    let num = |r: &Map<String, Value>, k: &str| r[k].as_f64().unwrap_or(0.0);
    let mut overridden = false;
    for r in rows {
        overridden |= r["num_prompts"] != r["peer_num_prompts"];
        let tpot = match r["tpot_ms"]["mean"].as_f64() {
            Some(t) => format!("{t:.2}"),
            None => "-".into(),
        };
        outln!(
            "{:<10} {:>8} {:>6} {:>13.1} {:>13.0} {:>9.3} {:>12.1} {:>13}",
            format!("{}/{}", r["isl"], r["osl"]),
            r["num_prompts"].as_u64().unwrap_or(0),
            r["failed"].as_u64().unwrap_or(0),
            num(r, "output_throughput"),
            num(r, "peer_output_throughput"),
            num(r, "output_throughput_ratio"),
            num(r, "total_token_throughput"),
            tpot
        )?;
    }
    if overridden {
        let counts: Vec<String> = rows
            .iter()
            .map(|r| r["peer_num_prompts"].to_string())
            .collect();
        outln!(
            "note: --num-prompts replaced {PEER}'s request counts ({}): a short run may not \
             reach its steady state",
            counts.join(", ")
        )?;
    }
    outln!("{PEER}'s figures: {}", text("peer_source"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<WorkloadArgs, clap::Error> {
        <crate::Cli as clap::Parser>::try_parse_from(
            ["encore", "bench", "serve"].iter().chain(args),
        )
        .map(|c| match c.command {
            crate::Command::Bench(crate::BenchCommand::Serve(a)) => a.workload,
            _ => unreachable!("parsed bench serve"),
        })
    }

    #[test]
    fn rows_picks_rows_of_the_preset_and_refuses_others() {
        let a = parse(&["--dataset-shape", "trtllm", "--rows", "2048/128,1000/1000"]).unwrap();
        let shapes: Vec<_> = runs(&a)
            .unwrap()
            .iter()
            .map(|r| (r.args.input_len.0, r.args.output_len.0))
            .collect();
        assert_eq!(shapes, [(1000, 1000), (2048, 128)]);
        let a = parse(&["--dataset-shape", "trtllm", "--rows", "100/100"]).unwrap();
        let e = runs(&a).err().unwrap().to_string();
        assert!(e.contains("100/100") && e.contains("2048/128"), "{e}");
        assert!(parse(&["--dataset-shape", "trtllm", "--rows", "100"]).is_err());
        assert!(parse(&["--rows", "128/128"]).is_err());
    }

    #[test]
    fn the_preset_is_four_rows_of_exact_lengths_with_their_own_prompts() {
        let rows = runs(&parse(&["--dataset-shape", "trtllm"]).unwrap()).unwrap();
        let shapes: Vec<_> = rows
            .iter()
            .map(|r| {
                let a = &r.args;
                (a.input_len, a.output_len, a.num_prompts)
            })
            .collect();
        assert_eq!(
            shapes,
            [
                ((128, 128), (128, 128), Some(30_000)),
                ((1000, 1000), (1000, 1000), Some(3000)),
                ((500, 500), (2000, 2000), Some(3000)),
                ((2048, 2048), (128, 128), Some(3000)),
            ]
        );
        assert_eq!(rows.iter().map(Run::max_seq_len).max(), Some(2500));
        let mut seeds: Vec<u64> = rows.iter().map(|r| r.args.seed).collect();
        for r in &rows {
            let w = r.warmup.as_ref().unwrap();
            assert_eq!(w.num_prompts, Some(DEFAULT_WARMUP));
            assert_eq!(
                (w.input_len, w.output_len),
                (r.args.input_len, r.args.output_len)
            );
            assert!(r.args.request_rate.is_none() && w.request_rate.is_none());
            seeds.push(w.seed);
        }
        seeds.sort_unstable();
        seeds.dedup();
        assert_eq!(seeds.len(), 8, "every run its own seed");

        // --num-prompts and --warmup 0: a short run.
        let rows = runs(
            &parse(&[
                "--dataset-shape",
                "trtllm",
                "--num-prompts",
                "3",
                "--warmup",
                "0",
            ])
            .unwrap(),
        )
        .unwrap();
        assert!(rows
            .iter()
            .all(|r| r.args.num_prompts == Some(3) && r.warmup.is_none()));
        // Without the preset: the flags' one run, no peer.
        let one = runs(&parse(&["--input-len", "7"]).unwrap()).unwrap();
        assert_eq!(one.len(), 1);
        assert!(one[0].peer.is_none() && one[0].warmup.is_none());
    }

    #[test]
    fn the_ratio_is_ours_over_the_peers() {
        let mut report = Map::new();
        report.insert("output_throughput".into(), json!(13_955.5));
        let t = &TRTLLM_LLAMA_8B;
        let m = with_peer(t, &t.rows[0], report);
        assert_eq!(m["output_throughput_ratio"], json!(0.5));
        assert_eq!(m["peer_output_throughput"], json!(27_911.0));
        assert_eq!(m["isl"], 128);
        assert_eq!(m["dataset_shape"], "trtllm");
    }

    #[test]
    fn the_gpt_oss_presets_run_their_own_tables() {
        let rows = runs(&parse(&["--dataset-shape", "trtllm-gpt-oss-20b"]).unwrap()).unwrap();
        let shapes: Vec<_> = rows
            .iter()
            .map(|r| (r.args.input_len.0, r.args.output_len.0, r.args.num_prompts))
            .collect();
        assert_eq!(
            shapes,
            [
                (1000, 1000, Some(3000)),
                (1024, 1024, Some(3000)),
                (1024, 8192, Some(1500)),
                (8192, 1024, Some(1500)),
                (32768, 1024, Some(1000)),
            ]
        );
        let (t, p) = rows[0].peer.unwrap();
        assert_eq!(
            (t.name, p.output_throughput),
            ("trtllm-gpt-oss-20b", 13_858.0)
        );
        let a = parse(&[
            "--dataset-shape",
            "trtllm-gpt-oss-120b",
            "--rows",
            "1000/1000",
        ])
        .unwrap();
        let rows = runs(&a).unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].peer.unwrap().1.output_throughput, 6868.0);
        // A row of another preset is refused, naming this one's.
        let a = parse(&["--dataset-shape", "trtllm-gpt-oss-20b", "--rows", "128/128"]).unwrap();
        let e = runs(&a).err().unwrap().to_string();
        assert!(
            e.contains("trtllm-gpt-oss-20b") && e.contains("1024/8192"),
            "{e}"
        );
    }
}
