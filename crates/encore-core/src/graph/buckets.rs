//! Bucket policies: which batch sizes get a captured graph. A step of actual size `n` runs
//! the graph of the smallest bucket `>= n` (rows beyond `n` are padding); above the
//! largest bucket the step runs eagerly.

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
}

impl BucketPolicy {
    /// Parse `--buckets`: `vllm` (default), `pow2`, or a comma-separated list of sizes.
    pub fn parse(s: &str, max: usize) -> Result<Self> {
        if max == 0 {
            return Err(Error::invalid("--max-batch", "must be at least 1"));
        }
        match s.trim() {
            "" | "vllm" | "default" => Ok(BucketPolicy::VllmLike { max }),
            "pow2" | "powers-of-two" => Ok(BucketPolicy::PowersOfTwo { max }),
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
                                    "--buckets",
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
    fn parse_policies_and_reject_bad_lists() {
        assert_eq!(
            BucketPolicy::parse("vllm", 8).unwrap(),
            BucketPolicy::VllmLike { max: 8 }
        );
        assert_eq!(
            BucketPolicy::parse("pow2", 8).unwrap(),
            BucketPolicy::PowersOfTwo { max: 8 }
        );
        let p = BucketPolicy::parse("8, 1,4,4", 8).unwrap();
        assert_eq!(p.buckets(), vec![1, 4, 8]);
        assert_eq!(p.bucket_for(5), Some(8));
        let e = BucketPolicy::parse("1,x,3", 8).unwrap_err().to_string();
        assert!(e.contains("`x`"), "{e}");
        assert!(BucketPolicy::parse("0", 8).is_err());
        assert!(BucketPolicy::parse("vllm", 0).is_err());
    }
}
