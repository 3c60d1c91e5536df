//! The paged KV cache: the block manager against a simple model under seeded random
//! allocate / append / free sequences, and the cache's per-layer views on the CPU backend.

use std::collections::{BTreeMap, HashSet};

use encore_core::backend::cpu::CpuBackend;
use encore_core::kv::{BlockManager, KvCache, KvCacheConfig, SeqId, MIN_KV_BLOCKS, NULL_BLOCK};
use encore_core::{Backend, DType, Error, QkvRope};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Everything observable about a manager, to check that failing calls change nothing.
fn snapshot(bm: &BlockManager) -> (usize, BTreeMap<u64, (usize, Vec<u32>)>) {
    let seqs = bm
        .seqs()
        .map(|s| {
            let t = bm.num_tokens(s).unwrap();
            (s.0, (t, bm.block_table(s).unwrap().to_vec()))
        })
        .collect();
    (bm.num_free_blocks(), seqs)
}

/// The invariants of `BlockManager` against the model (live sequence -> tokens).
fn check_invariants(bm: &BlockManager, model: &BTreeMap<u64, usize>) {
    let bs = bm.block_size();
    assert_eq!(bm.num_seqs(), model.len());
    let mut owned = HashSet::new();
    let mut slots = HashSet::new();
    for (&id, &tokens) in model {
        let seq = SeqId(id);
        assert_eq!(bm.num_tokens(seq).unwrap(), tokens);
        let table = bm.block_table(seq).unwrap();
        assert_eq!(table.len(), tokens.div_ceil(bs), "{seq}: blocks vs tokens");
        for &b in table {
            assert_ne!(b, NULL_BLOCK, "{seq} owns the null block");
            assert!((b as usize) < bm.num_blocks());
            assert!(owned.insert(b), "block {b} owned twice");
        }
        let mut filled = vec![0i32; tokens];
        bm.fill_slots(seq, 0, &mut filled).unwrap();
        for (p, &f) in filled.iter().enumerate() {
            let slot = bm.slot(seq, p).unwrap();
            assert_eq!(slot, f);
            assert_eq!(slot as usize / bs, table[p / bs] as usize);
            assert_eq!(slot as usize % bs, p % bs);
            assert!(slots.insert(slot), "slot {slot} used twice");
        }
        assert_eq!(bm.slot(seq, tokens), None);
        assert!(bm.fill_slots(seq, tokens, &mut [0]).is_err());
    }
    assert_eq!(bm.num_used_blocks(), owned.len());
    assert_eq!(bm.num_free_blocks() + owned.len(), bm.num_blocks() - 1);
}

fn expect_out_of_blocks(err: Error, needed: usize, free: usize) {
    match err {
        Error::OutOfBlocks {
            needed: n, free: f, ..
        } => assert_eq!((n, f), (needed, free)),
        other => panic!("expected OutOfBlocks, got {other}"),
    }
}

fn run_random(seed: u64, num_blocks: usize, block_size: usize, steps: usize) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut bm = BlockManager::new(num_blocks, block_size).unwrap();
    let mut model: BTreeMap<u64, usize> = BTreeMap::new();
    let mut next_id = 0u64;
    let (mut allocs, mut ooms, mut appends, mut frees) = (0, 0, 0, 0);
    for _ in 0..steps {
        let before = snapshot(&bm);
        let live: Vec<u64> = model.keys().copied().collect();
        match rng.random_range(0..10) {
            0..=2 => {
                let tokens = rng.random_range(0..4 * block_size);
                let seq = SeqId(next_id);
                next_id += 1;
                let needed = tokens.div_ceil(block_size);
                let can = bm.can_allocate(tokens);
                assert_eq!(can, needed <= bm.num_free_blocks());
                match bm.allocate(seq, tokens) {
                    Ok(()) => {
                        assert!(can);
                        model.insert(seq.0, tokens);
                        allocs += 1;
                    }
                    Err(e) => {
                        assert!(!can);
                        expect_out_of_blocks(e, needed, before.0);
                        assert_eq!(snapshot(&bm), before);
                        ooms += 1;
                    }
                }
            }
            3..=6 if !live.is_empty() => {
                let id = live[rng.random_range(0..live.len())];
                let n = rng.random_range(0..2 * block_size + 1);
                let tokens = model[&id];
                let needed = (tokens + n).div_ceil(block_size) - tokens.div_ceil(block_size);
                let can = bm.can_append(SeqId(id), n);
                assert_eq!(can, needed <= bm.num_free_blocks());
                match bm.append(SeqId(id), n) {
                    Ok(()) => {
                        assert!(can);
                        *model.get_mut(&id).unwrap() += n;
                        // The blocks already owned stay where they were.
                        let old = &before.1[&id].1;
                        assert_eq!(&bm.block_table(SeqId(id)).unwrap()[..old.len()], old);
                        appends += 1;
                    }
                    Err(e) => {
                        assert!(!can);
                        expect_out_of_blocks(e, needed, before.0);
                        assert_eq!(snapshot(&bm), before);
                        ooms += 1;
                    }
                }
            }
            7..=8 if !live.is_empty() => {
                let id = live[rng.random_range(0..live.len())];
                let blocks = bm.block_table(SeqId(id)).unwrap().len();
                bm.free(SeqId(id)).unwrap();
                model.remove(&id);
                assert_eq!(bm.num_free_blocks(), before.0 + blocks);
                frees += 1;
            }
            _ => {
                // Misuse: unknown sequences and double allocation are errors that change
                // nothing.
                let unknown = SeqId(next_id + 1000);
                assert!(matches!(bm.free(unknown), Err(Error::Invalid { .. })));
                assert!(matches!(bm.append(unknown, 1), Err(Error::Invalid { .. })));
                assert!(matches!(bm.num_tokens(unknown), Err(Error::Invalid { .. })));
                assert!(matches!(
                    bm.block_table(unknown),
                    Err(Error::Invalid { .. })
                ));
                assert!(!bm.can_append(unknown, 0));
                assert_eq!(bm.slot(unknown, 0), None);
                if let Some(&id) = live.first() {
                    let e = bm.allocate(SeqId(id), 1).unwrap_err();
                    assert!(matches!(e, Error::Invalid { .. }), "{e}");
                }
                assert_eq!(snapshot(&bm), before);
            }
        }
        check_invariants(&bm, &model);
    }
    // Every kind of step happened, failures included.
    assert!(
        allocs > 10 && ooms > 10 && appends > 10 && frees > 10,
        "seed {seed}: {allocs} allocs, {ooms} out-of-blocks, {appends} appends, {frees} frees"
    );
    for id in model.keys() {
        bm.free(SeqId(*id)).unwrap();
    }
    assert_eq!(bm.num_free_blocks(), num_blocks - 1);
}

#[test]
fn random_allocate_append_free_keep_the_invariants() {
    for seed in 0..8 {
        run_random(seed, 24, 4, 3000);
    }
    run_random(100, 9, 1, 3000);
    run_random(101, 40, 16, 3000);
}

#[test]
fn fresh_manager_hands_out_blocks_in_order_and_reuses_freed_blocks_lifo() {
    let mut bm = BlockManager::new(10, 4).unwrap();
    assert_eq!(bm.num_free_blocks(), 9);
    bm.allocate(SeqId(1), 9).unwrap();
    assert_eq!(bm.block_table(SeqId(1)).unwrap(), &[1, 2, 3]);
    bm.allocate(SeqId(2), 4).unwrap();
    assert_eq!(bm.block_table(SeqId(2)).unwrap(), &[4]);
    // 4 -> 5 tokens crosses a boundary, 5 -> 8 does not.
    bm.append(SeqId(2), 1).unwrap();
    assert_eq!(bm.block_table(SeqId(2)).unwrap(), &[4, 5]);
    bm.append(SeqId(2), 3).unwrap();
    assert_eq!(bm.block_table(SeqId(2)).unwrap(), &[4, 5]);
    assert_eq!(bm.slot(SeqId(2), 7), Some(5 * 4 + 3));
    bm.free(SeqId(1)).unwrap();
    bm.allocate(SeqId(3), 12).unwrap();
    assert_eq!(bm.block_table(SeqId(3)).unwrap(), &[1, 2, 3]);
    bm.allocate(SeqId(4), 1).unwrap();
    assert_eq!(bm.block_table(SeqId(4)).unwrap(), &[6]);

    // Zero-token sequences own nothing and still have a padded row.
    bm.allocate(SeqId(5), 0).unwrap();
    assert_eq!(bm.block_table(SeqId(5)).unwrap(), &[] as &[u32]);
    let mut row = [7i32; 3];
    bm.fill_block_table_row(SeqId(5), &mut row, NULL_BLOCK as i32)
        .unwrap();
    assert_eq!(row, [0, 0, 0]);
    bm.fill_block_table_row(SeqId(3), &mut row, -1).unwrap();
    assert_eq!(row, [1, 2, 3]);
    let mut wide = [9i32; 5];
    bm.fill_block_table_row(SeqId(2), &mut wide, 0).unwrap();
    assert_eq!(wide, [4, 5, 0, 0, 0]);
    let e = bm
        .fill_block_table_row(SeqId(3), &mut [0i32; 2], 0)
        .unwrap_err();
    assert!(e.to_string().contains("owns 3 blocks"), "{e}");

    let mut slots = [0i32; 3];
    bm.fill_slots(SeqId(2), 3, &mut slots).unwrap();
    assert_eq!(slots, [4 * 4 + 3, 5 * 4, 5 * 4 + 1]);

    // Out of blocks: the message names what, needed and free.
    let e = bm.allocate(SeqId(6), 100).unwrap_err();
    assert_eq!(
        e.to_string(),
        "KV cache: allocating seq 6 (100 tokens) needs 25 blocks, 3 free"
    );
}

#[test]
fn bad_manager_sizes_are_errors() {
    assert!(BlockManager::new(1, 16).is_err());
    assert!(BlockManager::new(8, 0).is_err());
    assert!(BlockManager::new(1 << 28, 16).is_err());
    assert!(BlockManager::new(2, 1).is_ok());
}

fn cfg(dtype: DType) -> KvCacheConfig {
    KvCacheConfig {
        num_layers: 5,
        num_kv_heads: 2,
        head_dim: 3,
        block_size: 4,
        dtype,
    }
}

#[test]
fn layer_views_alias_only_their_own_region() {
    let be = CpuBackend::new();
    let be: &dyn Backend = &be;
    let c = cfg(DType::F32);
    let nb = 6;
    let cache = KvCache::new(be, c, nb).unwrap();
    assert_eq!(cache.tensor().shape(), &[5, 2, nb, 4, 2, 3]);
    assert_eq!(cache.k(3).shape(), &[nb, 4, 2, 3]);
    assert_eq!(cache.v(4).shape(), &[nb, 4, 2, 3]);
    assert_eq!(cache.bytes_per_block(), 5 * 2 * 4 * 2 * 3 * 4);
    assert_eq!(cache.size_bytes(), nb * cache.bytes_per_block());

    let full_len = cache.tensor().numel();
    // The null block starts zeroed in every layer's K and V.
    let start = be.download::<f32>(cache.tensor()).unwrap();
    let block = 4 * 2 * 3;
    for lk in 0..10 {
        let at = lk * nb * block;
        assert!(start[at..at + block].iter().all(|&x| x == 0.0));
    }

    let sentinel = -7.0f32;
    be.write(cache.tensor(), &vec![sentinel; full_len]).unwrap();
    // Three tokens, the middle one padding (slot -1).
    let slots = [2 * 4 + 1, -1, 5 * 4 + 3];
    let n = slots.len();
    let k: Vec<f32> = (0..n * 6).map(|i| 100.0 + i as f32).collect();
    let v: Vec<f32> = (0..n * 6).map(|i| 200.0 + i as f32).collect();
    // One q head then the token's k and v rows, written by the fused op; position -1
    // leaves k unrotated, so the cache holds exactly `k` and `v`.
    let qkv: Vec<f32> = (0..n)
        .flat_map(|i| {
            let q = [0.5f32; 3];
            [&q[..], &k[i * 6..(i + 1) * 6], &v[i * 6..(i + 1) * 6]].concat()
        })
        .collect();
    let qkv = be.upload(&qkv, &[n, 15]).unwrap();
    let positions = be.upload(&vec![-1i32; n], &[n]).unwrap();
    let cos_sin = be.upload(&[1.0f32, 0.0], &[1, 2]).unwrap();
    let st = be.upload(&slots, &[n]).unwrap();
    let q_out = be.alloc(DType::F32, &[n, 1, 3]).unwrap();
    be.qkv_rope_write(&QkvRope {
        qkv: &qkv,
        head_norm: None,
        eps: 1e-6,
        positions: &positions,
        cos_sin: &cos_sin,
        slot_mapping: &st,
        q_out: &q_out,
        k_cache: cache.k(3),
        v_cache: cache.v(3),
    })
    .unwrap();

    let full = be.download::<f32>(cache.tensor()).unwrap();
    let mut expected = vec![sentinel; full_len];
    for (i, &slot) in slots.iter().enumerate() {
        if slot < 0 {
            continue;
        }
        let (b, r) = (slot as usize / 4, slot as usize % 4);
        for (kv, src) in [(0, &k), (1, &v)] {
            for e in 0..6 {
                let at = (((3 * 2 + kv) * nb + b) * 4 + r) * 6 + e;
                expected[at] = src[i * 6 + e];
            }
        }
    }
    assert_eq!(full, expected);
}

#[test]
fn sizing_from_a_budget() {
    let c = cfg(DType::BF16);
    let bpb = c.bytes_per_block();
    assert_eq!(bpb, 5 * 2 * 4 * 2 * 3 * 2);
    assert_eq!(KvCache::num_blocks_for_budget(&c, 10 * bpb + bpb / 2), 10);
    assert_eq!(
        KvCache::size_from_free_memory(&c, 100 * bpb, 0.5, 10 * bpb).unwrap(),
        40
    );
    let e = KvCache::size_from_free_memory(&c, 4 * bpb, 0.9, 0).unwrap_err();
    match &e {
        Error::OutOfMemory { bytes, .. } => assert_eq!(*bytes, MIN_KV_BLOCKS * bpb),
        other => panic!("expected OutOfMemory, got {other}"),
    }
    assert!(e.to_string().contains(&format!("{}", MIN_KV_BLOCKS * bpb)));
    assert!(KvCache::size_from_free_memory(&c, 1 << 30, 0.0, 0).is_err());
    assert!(KvCache::size_from_free_memory(&c, 1 << 30, 1.5, 0).is_err());

    let be = CpuBackend::new();
    assert!(KvCache::new(&be, c, 1).is_err());
    let bad = KvCacheConfig {
        dtype: DType::I32,
        ..c
    };
    assert!(KvCache::new(&be, bad, 4).is_err());
    let zero = KvCacheConfig { head_dim: 0, ..c };
    assert!(KvCache::new(&be, zero, 4).is_err());
}
