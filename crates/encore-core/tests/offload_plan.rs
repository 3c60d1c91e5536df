//! The weight-offload planner: floor, budget parsing, planned residency vs LRU, validator.

use encore_core::model::config::ModelConfig;
use encore_core::offload::{
    check_budget, lru_streamed_per_step, plan, validate, AccessOrder, Op, Plan, Weight,
    WeightBudget,
};
use encore_core::DType;

/// An order from (weight bytes) and (op reads) lists.
fn order(sizes: &[usize], reads: &[&[usize]]) -> AccessOrder {
    let weights = sizes
        .iter()
        .enumerate()
        .map(|(i, &bytes)| Weight {
            name: format!("w{i}"),
            bytes,
        })
        .collect();
    let ops = reads
        .iter()
        .enumerate()
        .map(|(i, r)| Op {
            name: format!("op{i}"),
            reads: r.to_vec(),
        })
        .collect();
    AccessOrder::new(weights, ops).unwrap()
}

fn llama(name: &str) -> AccessOrder {
    AccessOrder::llama(&ModelConfig::dummy(name).unwrap(), DType::BF16).unwrap()
}

#[test]
fn floor_on_hand_made_orders() {
    // All streamed: pair (1,2) 30+20 = 50, slot 30: 80. Keeping the 30 resident: pair
    // (2,3) 20+5 = 25, slot 20: 30 + 45 = 75, the least (keeping 30 and 20: 50 + 15 +
    // 10 = 75 too, not less).
    let o = order(
        &[10, 30, 20, 5, 5, 5, 5, 5, 5, 5],
        &[&[0], &[1], &[2], &[3], &[4], &[5], &[6], &[7], &[8], &[9]],
    );
    let f = o.floor();
    assert_eq!(
        (
            f.pair_bytes,
            f.pair_at,
            f.slot_bytes,
            f.resident_bytes,
            f.bytes
        ),
        (25, 2, 20, 30, 75)
    );
    // The wrap-around pair, last op (100) with the first (60), makes streaming them dear
    // (160 + 100 = 260): both resident, the ring is two 10s and one of headroom:
    // 160 + 20 + 10 = 190.
    let mut sizes = vec![60];
    sizes.extend([10; 15]);
    sizes.push(100);
    let reads: Vec<Vec<usize>> = (0..sizes.len()).map(|i| vec![i]).collect();
    let reads: Vec<&[usize]> = reads.iter().map(|r| r.as_slice()).collect();
    let f = order(&sizes, &reads).floor();
    assert_eq!(
        (f.pair_bytes, f.pair_at, f.resident_bytes, f.bytes),
        (20, 1, 160, 190)
    );
    // A weight read by the last and first op (tied embedding) counts once in a pair:
    // (5,6) 20 + 40 = 60, slot 40: 100, and keeping the 40 resident gives 40 + 40 + 20 =
    // 100 too, so nothing is kept.
    let o = order(
        &[40, 5, 7, 20, 20, 20],
        &[&[0], &[1], &[2], &[3], &[4], &[5], &[0]],
    );
    let f = o.floor();
    assert_eq!(
        (
            f.pair_bytes,
            f.pair_at,
            f.slot_bytes,
            f.resident_bytes,
            f.bytes
        ),
        (60, 5, 40, 0, 100)
    );
    // Ops reading several weights: streaming costs at least 14 + 6 = 20 and every mix
    // more than the 18 bytes of all weights, so the floor keeps everything resident.
    let f = order(&[3, 4, 5, 6], &[&[0, 1], &[2], &[3, 0]]).floor();
    assert_eq!(
        (f.pair_bytes, f.slot_bytes, f.resident_bytes, f.bytes),
        (0, 0, 18, 18)
    );
}

#[test]
fn orders_that_cannot_stream_are_refused() {
    let w = |n: usize| {
        (0..n)
            .map(|i| Weight {
                name: format!("w{i}"),
                bytes: 8,
            })
            .collect::<Vec<_>>()
    };
    let op = |name: &str, reads: Vec<usize>| Op {
        name: name.into(),
        reads,
    };
    let err = |r: encore_core::Result<AccessOrder>| r.unwrap_err().to_string();
    assert!(err(AccessOrder::new(w(1), vec![op("a", vec![0])])).contains("at least 2"));
    // w0 is read by c then a (cyclically consecutive), w1 by b then c: accepted.
    assert!(AccessOrder::new(
        w(2),
        vec![op("a", vec![0]), op("b", vec![1]), op("c", vec![0, 1])],
    )
    .is_ok());
    let e = err(AccessOrder::new(
        w(2),
        vec![
            op("a", vec![0]),
            op("b", vec![1]),
            op("c", vec![0]),
            op("d", vec![1]),
        ],
    ));
    assert!(e.contains("`w0`") && e.contains("not one run"), "{e}");
    let e = err(AccessOrder::new(
        w(2),
        vec![op("a", vec![0]), op("b", vec![0, 1])],
    ));
    assert!(e.contains("`w0` is read by every op"), "{e}");
    let e = err(AccessOrder::new(
        w(2),
        vec![op("a", vec![0]), op("b", vec![])],
    ));
    assert!(e.contains("`w1` is read by no op"), "{e}");
    let e = err(AccessOrder::new(
        w(1),
        vec![op("a", vec![0]), op("b", vec![3])],
    ));
    assert!(e.contains("op `b` reads weight #3"), "{e}");
}

#[test]
fn llama_order_matches_the_model() {
    for name in [
        "tiny",
        "tiny-qwen2",
        "tiny-qwen3",
        "tiny-stablelm",
        "llama-3.2-1b",
        "llama-3-8b",
    ] {
        let cfg = ModelConfig::dummy(name).unwrap();
        for dtype in [DType::BF16, DType::F32] {
            let o = AccessOrder::llama(&cfg, dtype).unwrap();
            assert_eq!(o.total_bytes(), cfg.weight_bytes(dtype), "{name} {dtype}");
            assert_eq!(o.ops().len(), 3 + 6 * cfg.num_layers, "{name}");
        }
    }
    // Tied: lm_head reads the embedding again; untied: its own weight.
    let o = llama("llama-3.2-1b");
    assert_eq!(o.ops().last().unwrap().reads, o.ops()[0].reads);
    let o = llama("llama-3-8b");
    let head = o.ops().last().unwrap().reads[0];
    assert_eq!(o.weights()[head].name, "lm_head");
    assert_eq!(o.weights()[head].bytes, 128_256 * 4096 * 2);
    assert_eq!(o.ops()[2].name, "layers.0.qkv");
    assert_eq!(
        o.weights()[o.ops()[2].reads[0]].bytes,
        (4096 + 2 * 1024) * 4096 * 2
    );
}

#[test]
fn budget_below_floor_fails_with_exact_minimum_and_at_floor_plans() {
    for o in [
        order(&[10, 30, 20], &[&[0], &[1], &[2]]),
        order(
            &[40, 5, 7, 20, 20, 20],
            &[&[0], &[1], &[2], &[3], &[4], &[5], &[0]],
        ),
        llama("tiny"),
        llama("llama-3.2-1b"),
        llama("llama-3-8b"),
    ] {
        let floor = o.floor().bytes;
        let e = plan(&o, floor - 1).unwrap_err().to_string();
        assert!(
            e.contains(&format!("minimum of {floor} bytes")) && e.contains("GiB"),
            "{e}"
        );
        assert!(e.contains(&format!("{:.3} GiB", floor as f64 / (1u64 << 30) as f64)));
        assert!(check_budget(&o, floor).is_ok());
        let p = plan(&o, floor).unwrap();
        validate(&o, &p).unwrap();
        assert!(p.resident_bytes + p.ring_bytes <= floor);
    }
}

#[test]
fn full_budget_streams_nothing() {
    for name in ["tiny", "llama-3.2-1b", "llama-3-8b"] {
        let o = llama(name);
        let p = plan(&o, o.total_bytes()).unwrap();
        validate(&o, &p).unwrap();
        assert_eq!(p.streamed_bytes_per_step(), 0, "{name}");
        assert_eq!(p.resident_bytes, o.total_bytes());
        assert_eq!(lru_streamed_per_step(&o, o.total_bytes(), 3).unwrap(), 0);
    }
}

/// Budgets from 100% of the weights down to the floor, in `n` steps.
fn sweep(o: &AccessOrder, n: usize) -> Vec<usize> {
    let (floor, total) = (o.floor().bytes, o.total_bytes());
    (0..=n).map(|i| total - (total - floor) * i / n).collect()
}

#[test]
fn planned_streams_no_more_than_lru_and_strictly_less_below_full() {
    for name in ["llama-3.2-1b", "llama-3-8b"] {
        let o = llama(name);
        let total = o.total_bytes();
        for budget in sweep(&o, 40) {
            let p = plan(&o, budget).unwrap();
            validate(&o, &p).unwrap();
            let planned = p.streamed_bytes_per_step();
            let lru = lru_streamed_per_step(&o, budget, 3).unwrap();
            assert_eq!(planned, total - p.resident_bytes);
            if budget < total {
                assert!(
                    planned < lru,
                    "{name} budget {budget}: planned {planned} lru {lru}"
                );
            } else {
                assert_eq!((planned, lru), (0, 0));
            }
        }
    }
    // Hand-made orders too (not necessarily strict there).
    for o in [
        order(&[10, 30, 20], &[&[0], &[1], &[2]]),
        order(&[40, 5, 7, 9, 12], &[&[0], &[1], &[2, 3], &[4], &[0]]),
        order(
            &[40, 5, 7, 20, 20, 20, 3, 30],
            &[&[0], &[1], &[2], &[3], &[4], &[5, 6], &[7], &[0]],
        ),
        llama("tiny"),
        llama("tiny-qwen3"),
    ] {
        for budget in sweep(&o, 25) {
            let p = plan(&o, budget).unwrap();
            validate(&o, &p).unwrap();
            let lru = lru_streamed_per_step(&o, budget, 3).unwrap();
            assert!(p.streamed_bytes_per_step() <= lru, "budget {budget}");
        }
    }
}

#[test]
fn planned_streaming_saves_against_lru_at_half_budget() {
    // LRU on a cyclic order larger than the cache misses every weight (it always evicts
    // the one needed soonest); the plan keeps about half resident.
    let o = llama("llama-3-8b");
    let budget = WeightBudget::parse("50%").unwrap().bytes(o.total_bytes());
    let p = plan(&o, budget).unwrap();
    let lru = lru_streamed_per_step(&o, budget, 3).unwrap();
    assert_eq!(lru, o.total_bytes());
    assert!(p.streamed_bytes_per_step() * 10 < o.total_bytes() * 6);
}

fn small_plan() -> (AccessOrder, Plan) {
    let o = order(&[30; 6], &[&[0], &[1], &[2], &[3], &[4], &[5]]);
    let p = plan(&o, o.floor().bytes).unwrap();
    validate(&o, &p).unwrap();
    assert!(p.streams.len() >= 3, "{p:?}");
    (o, p)
}

#[test]
fn validator_rejects_overlapping_slots_in_flight() {
    let (o, mut p) = small_plan();
    // Move the second stream onto the first one's bytes: they are consecutive (so in
    // flight together with just-in-time copies).
    let (a, b) = (p.streams[0].clone(), p.streams[1].clone());
    assert_eq!((a.consumer + 1) % o.ops().len(), b.consumer);
    p.ring_bytes = p.ring_bytes.max(a.offset + b.bytes);
    p.budget += p.ring_bytes;
    p.streams[1].offset = a.offset;
    p.streams[1].copy_start = a.consumer;
    let e = validate(&o, &p).unwrap_err().to_string();
    assert!(
        e.contains(&format!("`{}`", o.weights()[a.weight].name))
            && e.contains(&format!("`{}`", o.weights()[b.weight].name))
            && e.contains("share slot bytes"),
        "{e}"
    );
}

#[test]
fn validator_rejects_a_copy_starting_at_or_after_its_consumer() {
    let (o, p) = small_plan();
    for delta in [0, 1] {
        let mut bad = p.clone();
        let s = &mut bad.streams[2];
        s.copy_start = (s.consumer + delta) % o.ops().len();
        let name = &o.weights()[s.weight].name;
        let e = validate(&o, &bad).unwrap_err().to_string();
        // At the consumer: refused as such. One op after it: cyclically that is a copy
        // issued n - 1 ops ahead, so its slot is busy almost all step and collides.
        let expect = if delta == 0 {
            format!("copy of weight `{name}` starts")
        } else {
            format!("`{name}` (copied at")
        };
        assert!(e.contains(&expect), "{e}");
    }
}

#[test]
fn validator_rejects_missing_and_over_budget_plans() {
    let (o, p) = small_plan();
    let mut bad = p.clone();
    let gone = bad.streams.pop().unwrap();
    let e = validate(&o, &bad).unwrap_err().to_string();
    assert!(
        e.contains(&format!("`{}` is neither", o.weights()[gone.weight].name)),
        "{e}"
    );
    let mut bad = p.clone();
    bad.budget = bad.resident_bytes + bad.ring_bytes - 1;
    assert!(validate(&o, &bad)
        .unwrap_err()
        .to_string()
        .contains("exceed the budget"));
    let mut bad = p;
    bad.streams[0].offset = bad.ring_bytes;
    assert!(validate(&o, &bad)
        .unwrap_err()
        .to_string()
        .contains("outside"));
}

#[test]
fn budget_parsing() {
    use WeightBudget::*;
    assert_eq!(WeightBudget::parse("123").unwrap(), Bytes(123));
    assert_eq!(WeightBudget::parse("123B").unwrap(), Bytes(123));
    assert_eq!(WeightBudget::parse("4KiB").unwrap(), Bytes(4096));
    assert_eq!(WeightBudget::parse("3 MiB").unwrap(), Bytes(3 << 20));
    assert_eq!(WeightBudget::parse("6GiB").unwrap(), Bytes(6 << 30));
    assert_eq!(WeightBudget::parse("50%").unwrap(), Percent(50.0));
    assert_eq!(WeightBudget::parse("12.5%").unwrap(), Percent(12.5));
    assert_eq!(Percent(50.0).bytes(1001), 500);
    assert_eq!(Percent(100.0).bytes(1001), 1001);
    assert_eq!(Bytes(7).bytes(1001), 7);
    for bad in [
        "",
        "GiB",
        "0",
        "0%",
        "101%",
        "-5%",
        "abc%",
        "5GB",
        "5 gib",
        "1.5GiB",
        "-1",
        "99999999999999999999999",
        "17179869184GiB",
    ] {
        let e = WeightBudget::parse(bad).unwrap_err().to_string();
        assert!(
            e.contains(&format!("`{bad}`")) && e.contains("--weight-budget"),
            "{e}"
        );
    }
}
