//! Bucket policies: which sizes get a captured graph (batch sizes for decode, token counts
//! for prefill and mixed steps). A step of actual size `n` runs the graph of the smallest
//! bucket `>= n` (rows beyond `n` are padding); above the largest bucket it runs eagerly.

use crate::error::{Error, Result};

/// How the captured sizes are chosen, up to `max` (the largest batch the engine runs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BucketPolicy {
    /// Exactly these sizes (sorted and deduplicated; `max` is not added).
    Explicit(Vec<usize>),
    /// 1, 2, 4, ... up to `max`, plus `max` itself.
    PowersOfTwo { max: usize },
    /// vLLM's default: `[1, 2, 4] + range(8, 256, 8) + range(256, max + 1, 16)`, capped at
    /// `max`, plus `max` itself so every size up to `max` has a bucket.
    VllmLike { max: usize },
    /// Token-count buckets like SGLang's piecewise-graph defaults: steps of 4 up to 32, 16
    /// up to 256, 32 up to 512, 64 up to 1024, 256 up to 4096, then 512; capped at `max`,
    /// plus `max` itself.
    SglangLike { max: usize },
    /// No buckets: every step runs eagerly.
    None,
}

impl BucketPolicy {
    /// Parse a policy given by `what` (named in errors, e.g. a flag): `vllm`, `sglang`,
    /// `pow2`, `none`, or a comma-separated list of sizes; the named policies stop at
    /// `max` (at least 1). An empty string is `default`.
    pub fn parse(what: &'static str, s: &str, max: usize, default: BucketPolicy) -> Result<Self> {
        if max == 0 {
            return Err(Error::invalid(
                what,
                "the largest bucket must be at least 1",
            ));
        }
        match s.trim() {
            "" | "default" => Ok(default),
            "vllm" => Ok(BucketPolicy::VllmLike { max }),
            "sglang" => Ok(BucketPolicy::SglangLike { max }),
            "pow2" | "powers-of-two" => Ok(BucketPolicy::PowersOfTwo { max }),
            "none" | "off" => Ok(BucketPolicy::None),
            list => {
                let sizes = list
                    .split(',')
                    .map(|x| {
                        x.trim()
                            .parse::<usize>()
                            .ok()
                            .filter(|&v| v > 0)
                            .ok_or_else(|| {
                                Error::invalid(
                                    what,
                                    format!("`{x}` is not a positive integer (in `{list}`)"),
                                )
                            })
                    })
                    .collect::<Result<Vec<_>>>()?;
                Ok(BucketPolicy::Explicit(sizes))
            }
        }
    }

    /// The bucket sizes, ascending, without duplicates.
    pub fn buckets(&self) -> Vec<usize> {
        let mut v: Vec<usize> = match self {
            BucketPolicy::Explicit(sizes) => sizes.clone(),
            BucketPolicy::PowersOfTwo { max } => {
                let mut v: Vec<usize> = std::iter::successors(Some(1usize), |&x| x.checked_mul(2))
                    .take_while(|&x| x <= *max)
                    .collect();
                v.push(*max);
                v
            }
            BucketPolicy::VllmLike { max } => {
                let mut v: Vec<usize> = [1, 2, 4]
                    .into_iter()
                    .chain((8..256).step_by(8))
                    .chain((256..=*max).step_by(16))
                    .filter(|&x| x <= *max)
                    .collect();
                v.push(*max);
                v
            }
            BucketPolicy::SglangLike { max } => {
                let mut v: Vec<usize> = (4..=32)
                    .step_by(4)
                    .chain((48..=256).step_by(16))
                    .chain((288..=512).step_by(32))
                    .chain((576..=1024).step_by(64))
                    .chain((1280..=4096).step_by(256))
                    .chain((4608..=*max).step_by(512))
                    .filter(|&x| x <= *max)
                    .collect();
                v.push(*max);
                v
            }
            BucketPolicy::None => Vec::new(),
        };
        v.retain(|&x| x > 0);
        v.sort_unstable();
        v.dedup();
        v
    }

    /// The bucket a step of `n` rows runs in, or `None` (eager) above the largest.
    pub fn bucket_for(&self, n: usize) -> Option<usize> {
        self.buckets().into_iter().find(|&b| b >= n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vllm_like_matches_the_documented_list() {
        let b = BucketPolicy::VllmLike { max: 512 }.buckets();
        assert_eq!(&b[..5], &[1, 2, 4, 8, 16]);
        assert!(b.contains(&248) && b.contains(&256) && b.contains(&272) && b.contains(&512));
        assert!(!b.contains(&264) && !b.contains(&3));
        assert_eq!(b.len(), 3 + 31 + 17);
        // A max that is not on the grid is still a bucket.
        let b = BucketPolicy::VllmLike { max: 100 }.buckets();
        assert_eq!(b.last(), Some(&100));
        assert_eq!(b[b.len() - 2], 96);
    }

    #[test]
    fn bucket_for_picks_the_smallest_fitting_size() {
        let p = BucketPolicy::PowersOfTwo { max: 48 };
        assert_eq!(p.buckets(), vec![1, 2, 4, 8, 16, 32, 48]);
        assert_eq!(p.bucket_for(1), Some(1));
        assert_eq!(p.bucket_for(3), Some(4));
        assert_eq!(p.bucket_for(33), Some(48));
        assert_eq!(p.bucket_for(49), None);
        for n in 1..=48 {
            let b = p.bucket_for(n).unwrap();
            assert!(b >= n && p.buckets().iter().all(|&x| x < n || x >= b));
        }
    }

    #[test]
    fn sglang_like_token_buckets() {
        let b = BucketPolicy::SglangLike { max: 2048 }.buckets();
        assert_eq!(&b[..9], &[4, 8, 12, 16, 20, 24, 28, 32, 48]);
        assert!(b.contains(&256) && b.contains(&288) && b.contains(&1024) && b.contains(&1280));
        assert!(!b.contains(&40) && !b.contains(&1088));
        assert_eq!(b.last(), Some(&2048));
        assert_eq!(b.len(), 8 + 14 + 8 + 8 + 4);
        let b = BucketPolicy::SglangLike { max: 6000 }.buckets();
        assert_eq!(&b[b.len() - 4..], &[4608, 5120, 5632, 6000]);
        assert_eq!(BucketPolicy::SglangLike { max: 3 }.buckets(), vec![3]);
        assert_eq!(BucketPolicy::None.bucket_for(1), None);
    }

    #[test]
    fn parse_policies_and_reject_bad_lists() {
        let parse = |s: &str, max| BucketPolicy::parse("--buckets", s, max, BucketPolicy::None);
        assert_eq!(parse("vllm", 8).unwrap(), BucketPolicy::VllmLike { max: 8 });
        assert_eq!(
            parse("pow2", 8).unwrap(),
            BucketPolicy::PowersOfTwo { max: 8 }
        );
        assert_eq!(
            parse("sglang", 8).unwrap(),
            BucketPolicy::SglangLike { max: 8 }
        );
        assert_eq!(parse("", 8).unwrap(), BucketPolicy::None);
        assert_eq!(parse("none", 8).unwrap(), BucketPolicy::None);
        let p = parse("8, 1,4,4", 8).unwrap();
        assert_eq!(p.buckets(), vec![1, 4, 8]);
        assert_eq!(p.bucket_for(5), Some(8));
        let e = parse("1,x,3", 8).unwrap_err().to_string();
        assert!(e.contains("`x`") && e.contains("--buckets"), "{e}");
        assert!(parse("0", 8).is_err());
        assert!(parse("vllm", 0).is_err());
    }
}
