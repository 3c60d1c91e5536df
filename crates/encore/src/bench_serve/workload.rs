//! The workload of `encore bench serve`: its flags, the requests and arrival times they
//! ask for (drawn up front, so both modes send the same thing for the same flags), and
//! the JSONL trace reader.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use serde_json::{json, Value};

use super::preset::DatasetShape;
use crate::parse;

/// The workload flags.
#[derive(Args, Clone)]
pub struct WorkloadArgs {
    /// Requests to send (default 200; with --trace, the first N lines, default all).
    #[arg(long, value_parser = parse::count::<1, 10_000_000>, allow_negative_numbers = true)]
    pub num_prompts: Option<usize>,
    /// Prompt lengths in tokens: N, or LO:HI (uniform).
    #[arg(long, default_value = "128:1024", value_parser = range)]
    pub input_len: (usize, usize),
    /// Start every generated prompt with the same N random tokens (counted in its
    /// --input-len; a prompt shorter than N is all prefix): a shared system prompt, for
    /// measuring the prefix cache.
    #[arg(long, default_value = "0", value_parser = parse::count::<0, { 1 << 24 }>, allow_negative_numbers = true, conflicts_with = "trace")]
    pub shared_prefix_len: usize,
    /// Output lengths in tokens (end-of-sequence ignored): N, or LO:HI.
    #[arg(long, default_value = "64:512", value_parser = range)]
    pub output_len: (usize, usize),
    /// Requests from a JSONL file instead of the length ranges: one object per line with
    /// `prompt_len` (tokens, random ids) or `prompt` (token ids), `output_len`, and
    /// optionally `timestamp` (seconds from the start: the arrival times).
    #[arg(long, value_name = "FILE.jsonl")]
    pub trace: Option<PathBuf>,
    /// Requests per second; `inf` sends all at once (the default).
    #[arg(long, value_parser = rate)]
    pub request_rate: Option<f64>,
    /// How arrivals are spaced at --request-rate: poisson (exponential gaps) or fixed.
    #[arg(long, value_enum)]
    pub arrival: Option<Arrival>,
    /// Seed of the lengths, prompts and arrivals.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// A preset of runs instead of one: `trtllm` runs the rows of TensorRT-LLM's published
    /// throughput table for Llama-3.1-8B FP8 on one H200 (ISL/OSL 128/128, 1000/1000,
    /// 500/2000, 2048/128: exact lengths, every request at once, its request counts
    /// 30000/3000/3000/3000) one after the other and prints one table with its figures
    /// beside ours; `trtllm-gpt-oss-20b` and `trtllm-gpt-oss-120b` its tables for gpt-oss
    /// on one H200 (1000/1000, 1024/1024, 1024/8192, 8192/1024, 32768/1024). --num-prompts N
    /// runs N requests a row instead (a short run).
    #[arg(long, value_enum, conflicts_with_all = [
        "input_len", "output_len", "shared_prefix_len", "trace", "request_rate", "arrival",
        "max_concurrency",
    ])]
    pub dataset_shape: Option<DatasetShape>,
    /// Warm-up requests of each row's shape before the row, left out of its figures
    /// (--dataset-shape; default 2, trtllm-bench's).
    #[arg(long, requires = "dataset_shape", value_parser = parse::count::<0, 1_000_000>, allow_negative_numbers = true)]
    pub warmup: Option<usize>,
    /// Only these rows of the preset, as ISL/OSL (comma-separated, e.g. `2048/128,1000/1000`).
    #[arg(long, requires = "dataset_shape", value_delimiter = ',', value_parser = row)]
    pub rows: Vec<(usize, usize)>,
}

/// An `--rows` entry: `ISL/OSL`.
fn row(s: &str) -> Result<(usize, usize), String> {
    let (i, o) = s
        .split_once('/')
        .ok_or_else(|| format!("`{s}` is not ISL/OSL (e.g. 1000/1000)"))?;
    let n = |x: &str| {
        x.trim()
            .parse::<usize>()
            .map_err(|_| format!("`{x}` in `{s}` is not a whole number"))
    };
    Ok((n(i)?, n(o)?))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Arrival {
    /// Exponential gaps of mean 1 / rate.
    Poisson,
    /// Gaps of exactly 1 / rate.
    Fixed,
}

fn range(s: &str) -> Result<(usize, usize), String> {
    let p = |x: &str| {
        x.trim()
            .parse::<usize>()
            .ok()
            .filter(|&v| v >= 1)
            .ok_or_else(|| format!("`{x}` is not a whole number >= 1"))
    };
    match s.split_once(':') {
        None => p(s).map(|v| (v, v)),
        Some((a, b)) => {
            let (lo, hi) = (p(a)?, p(b)?);
            if lo > hi {
                return Err(format!("{lo}:{hi} is empty (LO must be <= HI)"));
            }
            Ok((lo, hi))
        }
    }
}

fn rate(s: &str) -> Result<f64, String> {
    if s.trim() == "inf" {
        return Ok(f64::INFINITY);
    }
    match s.trim().parse::<f64>() {
        Ok(r) if r.is_finite() && r > 0.0 => Ok(r),
        _ => Err("must be a number of requests per second > 0, or inf".into()),
    }
}

/// A deterministic generator (splitmix64).
pub(crate) struct Rng(pub u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn uniform(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn in_range(&mut self, (lo, hi): (usize, usize)) -> usize {
        lo + (self.next() % (hi - lo + 1) as u64) as usize
    }
    fn ids(&mut self, n: usize, vocab: usize) -> Vec<u32> {
        (0..n)
            .map(|_| (self.next() % vocab as u64) as u32)
            .collect()
    }
}

/// One request of the workload.
#[derive(Debug)]
pub struct WorkItem {
    pub prompt: Vec<u32>,
    pub output_len: usize,
}

/// The requests and their arrival times (seconds from the start, non-decreasing), drawn
/// up front so both modes send the same thing for the same flags.
#[derive(Debug)]
pub struct Workload {
    pub items: Vec<WorkItem>,
    pub arrivals: Vec<f64>,
    /// What the report says about the arrivals: `"inf"`, a rate, or `"trace"`.
    pub rate_label: Value,
}

impl Workload {
    /// The longest sequence a request asks for (prompt + output).
    pub fn max_seq_len(&self) -> usize {
        self.items
            .iter()
            .map(|w| w.prompt.len() + w.output_len)
            .max()
            .unwrap_or(0)
    }
}

/// The workload the flags ask for, prompt ids below `vocab`.
pub fn workload(a: &WorkloadArgs, vocab: usize) -> Result<Workload> {
    let mut rng = Rng(a.seed ^ 0x5eed);
    let (items, timestamps) = match &a.trace {
        None => {
            let n = a.num_prompts.unwrap_or(200);
            let prefix = rng.ids(a.shared_prefix_len, vocab);
            let items: Vec<WorkItem> = (0..n)
                .map(|_| {
                    let len = rng.in_range(a.input_len);
                    let shared = len.min(prefix.len());
                    let mut prompt = prefix[..shared].to_vec();
                    prompt.extend(rng.ids(len - shared, vocab));
                    WorkItem {
                        prompt,
                        output_len: rng.in_range(a.output_len),
                    }
                })
                .collect();
            (items, None)
        }
        Some(path) => read_trace(path, a.num_prompts, vocab, &mut rng)?,
    };
    let (arrivals, rate_label) = match timestamps {
        Some(t) => {
            if a.request_rate.is_some() || a.arrival.is_some() {
                bail!(
                    "--request-rate and --arrival do not apply: the lines of --trace {} have timestamps",
                    a.trace.as_deref().unwrap_or(Path::new("")).display()
                );
            }
            (t, json!("trace"))
        }
        None => {
            let r = a.request_rate.unwrap_or(f64::INFINITY);
            let fixed = a.arrival == Some(Arrival::Fixed);
            let mut t = 0.0f64;
            let arrivals = (0..items.len())
                .map(|i| {
                    if r.is_finite() && i > 0 {
                        t += if fixed {
                            1.0 / r
                        } else {
                            -(1.0 - rng.uniform()).ln() / r
                        };
                    }
                    t
                })
                .collect();
            (
                arrivals,
                if r.is_finite() {
                    json!(r)
                } else {
                    json!("inf")
                },
            )
        }
    };
    Ok(Workload {
        items,
        arrivals,
        rate_label,
    })
}

/// The requests of a JSONL trace (see `--trace`), the first `limit` of them, and their
/// timestamps when every line has one.
pub(crate) fn read_trace(
    path: &Path,
    limit: Option<usize>,
    vocab: usize,
    rng: &mut Rng,
) -> Result<(Vec<WorkItem>, Option<Vec<f64>>)> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("--trace {}", path.display()))?;
    let mut items = Vec::new();
    let mut stamps: Vec<Option<f64>> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        if limit.is_some_and(|l| items.len() == l) {
            break;
        }
        let at = format!("--trace {} line {}", path.display(), n + 1);
        let (item, stamp) = trace_line(line, &at, vocab, rng)?;
        items.push(item);
        stamps.push(stamp);
    }
    if items.is_empty() {
        bail!("--trace {} holds no requests", path.display());
    }
    if let Some(l) = limit.filter(|&l| l > items.len()) {
        bail!(
            "--num-prompts {l}: --trace {} holds {} requests",
            path.display(),
            items.len()
        );
    }
    Ok((items, timestamps(path, stamps)?))
}

/// One line of a trace (`at` names it in errors): its request and its timestamp.
fn trace_line(
    line: &str,
    at: &str,
    vocab: usize,
    rng: &mut Rng,
) -> Result<(WorkItem, Option<f64>)> {
    let v: Value = serde_json::from_str(line).with_context(|| at.to_string())?;
    let whole = |name: &str| -> Result<Option<usize>> {
        match v.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(x) => match x.as_u64().filter(|&x| x >= 1) {
                Some(x) => Ok(Some(x as usize)),
                None => bail!("{at}: `{name}` must be a whole number >= 1, not {x}"),
            },
        }
    };
    let prompt = match (v.get("prompt"), whole("prompt_len")?) {
        (Some(Value::Array(ids)), None) => {
            if ids.is_empty() {
                bail!("{at}: `prompt` is empty");
            }
            ids.iter()
                .map(|x| match x.as_u64() {
                    Some(id) if (id as usize) < vocab => Ok(id as u32),
                    _ => bail!(
                        "{at}: `prompt` holds {x}, not a token id below the vocabulary size {vocab}"
                    ),
                })
                .collect::<Result<Vec<u32>>>()?
        }
        (None, Some(len)) => rng.ids(len, vocab),
        (Some(Value::Array(_)), Some(_)) => {
            bail!("{at}: give `prompt` or `prompt_len`, not both")
        }
        (Some(x), _) => bail!("{at}: `prompt` must be an array of token ids, not {x}"),
        (None, None) => bail!("{at}: needs `prompt_len` (tokens) or `prompt` (token ids)"),
    };
    let Some(output_len) = whole("output_len")? else {
        bail!("{at}: needs `output_len`");
    };
    let stamp = match v.get("timestamp") {
        None | Some(Value::Null) => None,
        Some(x) => match x.as_f64().filter(|t| t.is_finite() && *t >= 0.0) {
            Some(t) => Some(t),
            None => bail!("{at}: `timestamp` must be seconds >= 0, not {x}"),
        },
    };
    Ok((WorkItem { prompt, output_len }, stamp))
}

/// The trace's arrival times: every line's timestamp (not decreasing), or none when no
/// line has one.
fn timestamps(path: &Path, stamps: Vec<Option<f64>>) -> Result<Option<Vec<f64>>> {
    Ok(match stamps.iter().filter(|s| s.is_some()).count() {
        0 => None,
        k if k == stamps.len() => {
            let t: Vec<f64> = stamps.into_iter().flatten().collect();
            if let Some(i) = t.windows(2).position(|w| w[1] < w[0]) {
                bail!(
                    "--trace {}: timestamps must not decrease (request {} at {} s follows {} s)",
                    path.display(),
                    i + 2,
                    t[i + 1],
                    t[i]
                );
            }
            Some(t)
        }
        _ => bail!(
            "--trace {}: some lines have a `timestamp` and some do not (all or none)",
            path.display()
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrivals_are_fixed_poisson_or_at_once() {
        let mut a = <crate::Cli as clap::Parser>::try_parse_from([
            "encore",
            "bench",
            "serve",
            "--num-prompts",
            "1000",
            "--input-len",
            "3",
            "--output-len",
            "2:4",
            "--request-rate",
            "10",
        ])
        .map(|c| match c.command {
            crate::Command::Bench(crate::BenchCommand::Serve(a)) => a.workload,
            _ => unreachable!("parsed bench serve"),
        })
        .unwrap();
        let w = workload(&a, 50).unwrap();
        assert!(w.items.iter().all(|i| i.prompt.len() == 3
            && i.prompt.iter().all(|&t| t < 50)
            && (2..=4).contains(&i.output_len)));
        let mean_gap = w.arrivals[999] / 999.0;
        assert!((mean_gap - 0.1).abs() < 0.01, "{mean_gap}");
        assert!(w.arrivals.windows(2).all(|p| p[1] >= p[0]));
        a.arrival = Some(Arrival::Fixed);
        let w = workload(&a, 50).unwrap();
        assert!(w
            .arrivals
            .iter()
            .enumerate()
            .all(|(i, &t)| (t - i as f64 * 0.1).abs() < 1e-9));
        a.request_rate = None;
        assert!(workload(&a, 50).unwrap().arrivals.iter().all(|&t| t == 0.0));
    }

    #[test]
    fn traces_are_read_and_checked_line_by_line() {
        let dir = std::env::temp_dir().join(format!("encore-trace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = |name: &str, text: &str| {
            let p = dir.join(name);
            std::fs::write(&p, text).unwrap();
            p
        };
        let mut rng = Rng(1);
        let ok = file(
            "ok.jsonl",
            "{\"prompt_len\": 5, \"output_len\": 2, \"timestamp\": 0}\n\n{\"prompt\": [1, 2, 3], \"output_len\": 7, \"timestamp\": 0.5}\n",
        );
        let (items, stamps) = read_trace(&ok, None, 10, &mut rng).unwrap();
        assert_eq!(items.len(), 2);
        assert_eq!(items[0].prompt.len(), 5);
        assert_eq!(items[1].prompt, vec![1, 2, 3]);
        assert_eq!(items[1].output_len, 7);
        assert_eq!(stamps, Some(vec![0.0, 0.5]));
        let (items, _) = read_trace(&ok, Some(1), 10, &mut rng).unwrap();
        assert_eq!(items.len(), 1);
        let err = read_trace(&ok, Some(3), 10, &mut rng).unwrap_err();
        assert!(format!("{err:#}").contains("holds 2 requests"), "{err:#}");
        for (text, want) in [
            ("{\"output_len\": 2}", "line 1: needs `prompt_len`"),
            ("{\"prompt_len\": 2}", "line 1: needs `output_len`"),
            ("{\"prompt_len\": 0, \"output_len\": 1}", "`prompt_len` must be"),
            ("{\"prompt\": [1, 99], \"output_len\": 1}", "below the vocabulary size 10"),
            ("{\"prompt\": \"hi\", \"output_len\": 1}", "array of token ids"),
            ("not json", "line 1"),
            (
                "{\"prompt_len\": 1, \"output_len\": 1, \"timestamp\": 1}\n{\"prompt_len\": 1, \"output_len\": 1}",
                "all or none",
            ),
            (
                "{\"prompt_len\": 1, \"output_len\": 1, \"timestamp\": 1}\n{\"prompt_len\": 1, \"output_len\": 1, \"timestamp\": 0.5}",
                "must not decrease",
            ),
            ("\n", "holds no requests"),
        ] {
            let p = file("bad.jsonl", text);
            let err = format!("{:#}", read_trace(&p, None, 10, &mut rng).unwrap_err());
            assert!(err.contains(want), "{text}: {err}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
