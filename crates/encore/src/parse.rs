//! Value parsers for flags, so a bad value is rejected by clap with a message naming the
//! flag (`invalid value '-1' for '--temperature <T>': ...`) before any work starts.

use encore_core::device::DeviceSpec;
use encore_core::model::formats::Quantization;
use encore_core::DType;

/// `--temperature`: finite and >= 0 (0 = greedy).
pub fn temperature(s: &str) -> Result<f32, String> {
    let t = float(s)?;
    if t.is_finite() && t >= 0.0 {
        Ok(t)
    } else {
        Err("must be a finite number >= 0 (0 = greedy)".into())
    }
}

/// `--top-p`: in (0, 1] (1 = off).
pub fn top_p(s: &str) -> Result<f32, String> {
    let p = float(s)?;
    if p > 0.0 && p <= 1.0 {
        Ok(p)
    } else {
        Err("must be in (0, 1] (1 = off)".into())
    }
}

/// `--top-k`: >= 0 (0 = off).
pub fn top_k(s: &str) -> Result<i32, String> {
    match s.trim().parse::<i64>() {
        Ok(k) if k >= 0 => Ok(i32::try_from(k).unwrap_or(i32::MAX)),
        Ok(_) => Err("must be >= 0 (0 = off)".into()),
        Err(_) => Err("is not a whole number".into()),
    }
}

/// `--min-p`: in [0, 1] (0 = off).
pub fn min_p(s: &str) -> Result<f32, String> {
    let p = float(s)?;
    if (0.0..=1.0).contains(&p) {
        Ok(p)
    } else {
        Err("must be in [0, 1] (0 = off)".into())
    }
}

/// `--presence-penalty` / `--frequency-penalty`: in [-2, 2] (0 = off), OpenAI's range.
pub fn penalty(s: &str) -> Result<f32, String> {
    let p = float(s)?;
    if (-2.0..=2.0).contains(&p) {
        Ok(p)
    } else {
        Err("must be in [-2, 2] (0 = off)".into())
    }
}

/// `--repetition-penalty`: finite and > 0 (1 = off).
pub fn repetition_penalty(s: &str) -> Result<f32, String> {
    let r = float(s)?;
    if r.is_finite() && r > 0.0 {
        Ok(r)
    } else {
        Err("must be a finite number > 0 (1 = off)".into())
    }
}

/// `--stop`: a non-empty string.
pub fn stop(s: &str) -> Result<String, String> {
    if s.is_empty() {
        Err("must not be empty".into())
    } else {
        Ok(s.to_string())
    }
}

/// `--kv-fraction`: in (0, 1].
pub fn fraction(s: &str) -> Result<f64, String> {
    let f: f64 = s
        .trim()
        .parse()
        .map_err(|_| "is not a number".to_string())?;
    if f > 0.0 && f <= 1.0 {
        Ok(f)
    } else {
        Err("must be in (0, 1]".into())
    }
}

/// A whole number in `MIN..=MAX`.
pub fn count<const MIN: usize, const MAX: usize>(s: &str) -> Result<usize, String> {
    let range = || {
        if MAX == usize::MAX {
            format!("must be a whole number >= {MIN}")
        } else {
            format!("must be a whole number in {MIN}..={MAX}")
        }
    };
    match s.trim().parse::<i128>() {
        Ok(n) if n >= MIN as i128 && n <= MAX as i128 => Ok(n as usize),
        _ => Err(range()),
    }
}

/// `--router-skew`: a Zipf exponent in 0..=8 over each layer's experts (0: uniform).
pub fn router_skew(s: &str) -> Result<encore_core::model::routing::RouterSkew, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a number"))?;
    encore_core::model::routing::RouterSkew::new(v).map_err(|e| e.to_string())
}

/// `--dtype`: a float dtype name in any case (see [`DType::parse_float`]).
pub fn dtype(s: &str) -> Result<DType, String> {
    DType::parse_float(s).ok_or_else(|| format!("expected {}", DType::FLOAT_NAMES))
}

/// `--kv-cache-dtype`'s value: `None` for auto (the run dtype).
#[derive(Clone, Copy, Debug)]
pub struct KvCacheDtype(pub Option<DType>);

/// `--kv-cache-dtype`: auto, fp8 / fp8_e4m3, or a float dtype (which must be the run
/// dtype: [`crate::engine_arg::kv_cache_dtype`] checks). vLLM's `fp8_e5m2` is refused by
/// name.
pub fn kv_cache_dtype(s: &str) -> Result<KvCacheDtype, String> {
    match s.to_ascii_lowercase().as_str() {
        "auto" => Ok(KvCacheDtype(None)),
        "fp8" | "fp8_e4m3" | "f8e4m3" => Ok(KvCacheDtype(Some(DType::F8E4M3))),
        "fp8_e5m2" => Err("fp8_e5m2 is not supported: use fp8 (E4M3)".to_string()),
        other => DType::parse_float(other)
            .map(|d| KvCacheDtype(Some(d)))
            .ok_or_else(|| format!("expected auto, fp8 (fp8_e4m3) or {}", DType::FLOAT_NAMES)),
    }
}

/// `--quantization`: auto | none | a weight format.
pub fn quantization(s: &str) -> Result<Quantization, String> {
    Quantization::parse(s)
}

/// `--device`: auto | cpu | cuda | cuda:N.
pub fn device(s: &str) -> Result<DeviceSpec, String> {
    s.parse::<DeviceSpec>()
        .map_err(|_| "expected auto, cpu, cuda or cuda:N".to_string())
}

fn float(s: &str) -> Result<f32, String> {
    s.trim().parse().map_err(|_| "is not a number".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        assert_eq!(temperature("0"), Ok(0.0));
        assert_eq!(temperature("0.7"), Ok(0.7));
        for bad in ["-1", "-0.5", "nan", "inf", "x"] {
            assert!(temperature(bad).is_err(), "{bad}");
        }
        assert_eq!(top_p("1"), Ok(1.0));
        for bad in ["0", "-0.1", "1.5", "nan"] {
            assert!(top_p(bad).is_err(), "{bad}");
        }
        assert_eq!(min_p("0.05"), Ok(0.05));
        for bad in ["-0.1", "1.5", "nan"] {
            assert!(min_p(bad).is_err(), "{bad}");
        }
        assert_eq!(penalty("-2"), Ok(-2.0));
        for bad in ["2.5", "-3", "nan", "inf"] {
            assert!(penalty(bad).is_err(), "{bad}");
        }
        assert_eq!(repetition_penalty("1.2"), Ok(1.2));
        for bad in ["0", "-1", "inf", "nan"] {
            assert!(repetition_penalty(bad).is_err(), "{bad}");
        }
        assert_eq!(stop("###"), Ok("###".to_string()));
        assert!(stop("").is_err());
        assert_eq!(top_k("0"), Ok(0));
        assert_eq!(top_k("99999999999"), Ok(i32::MAX));
        assert!(top_k("-1").is_err());
        assert_eq!(count::<1, 8>("8"), Ok(8));
        for bad in ["0", "9", "-1", "1.5", ""] {
            assert!(count::<1, 8>(bad).is_err(), "{bad}");
        }
        assert_eq!(fraction("1"), Ok(1.0));
        assert!(fraction("0").is_err() && fraction("nan").is_err());
        assert_eq!(dtype("FP16"), Ok(DType::F16));
        assert!(dtype("int4").unwrap_err().contains("bf16"));
        assert_eq!(device("cuda:1"), Ok(DeviceSpec::Cuda(1)));
        assert!(device("tpu").is_err());
    }
}
