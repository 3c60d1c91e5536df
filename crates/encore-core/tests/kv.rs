//! The paged KV cache: the block manager against a simple model under seeded random
//! allocate / append / free sequences, and the cache's per-layer views on the CPU backend.

use std::collections::{BTreeMap, HashSet};

use encore_core::backend::cpu::CpuBackend;
use encore_core::kv::{BlockManager, KvCache, KvCacheConfig, SeqId, MIN_KV_BLOCKS, NULL_BLOCK};
use encore_core::{Backend, DType, Error, KvScale, QkvRope};
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
    let (mut allocs, mut ooms, mut appends, mut frees, mut cuts) = (0, 0, 0, 0, 0);
    for _ in 0..steps {
        let before = snapshot(&bm);
        let live: Vec<u64> = model.keys().copied().collect();
        match rng.random_range(0..11) {
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
            9 if !live.is_empty() => {
                // Rejected drafts: back to fewer tokens (never more).
                let id = live[rng.random_range(0..live.len())];
                let tokens = model[&id];
                let to = rng.random_range(0..tokens + 1);
                bm.truncate(SeqId(id), to).unwrap();
                model.insert(id, to);
                let old = &before.1[&id].1;
                let kept = to.div_ceil(block_size);
                assert_eq!(bm.block_table(SeqId(id)).unwrap(), &old[..kept]);
                assert_eq!(bm.num_free_blocks(), before.0 + old.len() - kept);
                let e = bm.truncate(SeqId(id), to + 1).unwrap_err();
                assert!(matches!(e, Error::Invalid { .. }), "{e}");
                cuts += 1;
            }
            _ => {
                // Misuse: unknown sequences and double allocation are errors that change
                // nothing.
                let unknown = SeqId(next_id + 1000);
                assert!(matches!(bm.free(unknown), Err(Error::Invalid { .. })));
                assert!(matches!(bm.append(unknown, 1), Err(Error::Invalid { .. })));
                assert!(matches!(
                    bm.truncate(unknown, 0),
                    Err(Error::Invalid { .. })
                ));
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
        allocs > 10 && ooms > 10 && appends > 10 && frees > 10 && cuts > 10,
        "seed {seed}: {allocs} allocs, {ooms} out-of-blocks, {appends} appends, {frees} frees, \
         {cuts} truncations"
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
        kv_scale: KvScale::ONE,
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

// ---- Prefix caching ----

fn table(bm: &BlockManager, seq: u64) -> Vec<u32> {
    bm.block_table(SeqId(seq)).unwrap().to_vec()
}

#[test]
fn committed_blocks_are_cached_shared_by_reference_and_evicted_lru_tail_first() {
    // 7 usable blocks of 2 tokens.
    let mut bm = BlockManager::new(8, 2).unwrap();
    let a = [1, 2, 3, 4, 5, 6, 7];
    bm.allocate(SeqId(1), 7).unwrap();
    assert_eq!(table(&bm, 1), [1, 2, 3, 4]);
    // Nothing is cached before its KV is reported computed.
    assert_eq!(bm.lookup(&a).num_tokens(), 0);
    bm.commit(SeqId(1), &a, 5).unwrap();
    assert_eq!(bm.num_cached_blocks(), 2, "only full computed blocks");
    bm.commit(SeqId(1), &a, 7).unwrap();
    assert_eq!(
        bm.num_cached_blocks(),
        3,
        "the partial last block stays uncached"
    );
    assert!(bm.is_cached(3) && !bm.is_cached(4));
    // Live blocks are found too, and count as used.
    assert_eq!(bm.lookup(&a).blocks().collect::<Vec<_>>(), [1, 2, 3]);
    assert_eq!(bm.num_used_blocks(), 4);

    // Freed: the cached blocks stay (evictable, tail first), the partial one is free.
    bm.free(SeqId(1)).unwrap();
    assert_eq!(bm.num_free_blocks(), 7);
    assert_eq!(bm.num_used_blocks(), 0);
    assert_eq!(bm.num_evictable_blocks(), 3);
    assert_eq!(bm.eviction_order().collect::<Vec<_>>(), [3, 2, 1]);
    bm.check_consistency().unwrap();

    // The hit leaves the last token to compute: 7 tokens -> 3 blocks, 6 -> 2, 1 -> 0.
    assert_eq!(bm.lookup(&a).num_tokens(), 6);
    assert_eq!(bm.lookup(&a[..6]).num_tokens(), 4);
    assert_eq!(bm.lookup(&a[..3]).num_tokens(), 2);
    assert_eq!(bm.lookup(&a[..1]).num_tokens(), 0);
    assert_eq!(bm.lookup(&[]).num_tokens(), 0);
    // A chain: a block matches only after the same blocks before it.
    assert_eq!(bm.lookup(&[1, 2, 9, 9, 5, 6, 7]).num_tokens(), 2);
    assert_eq!(bm.lookup(&[9, 9, 3, 4, 5, 6, 7]).num_tokens(), 0);
    assert_eq!(bm.lookup(&[3, 4, 5]).num_tokens(), 0);

    // B shares A's first two blocks and takes one new block for its fifth token.
    let hit = bm.lookup(&[1, 2, 3, 4, 8]);
    assert_eq!(hit.blocks().collect::<Vec<_>>(), [1, 2]);
    assert!(bm.can_allocate_with_prefix(&hit, 5));
    bm.allocate_with_prefix(SeqId(2), &hit, 5).unwrap();
    assert_eq!(table(&bm, 2), [1, 2, 4]);
    assert_eq!(
        (bm.ref_count(1), bm.ref_count(2), bm.ref_count(4)),
        (1, 1, 1)
    );
    assert_eq!(bm.eviction_order().collect::<Vec<_>>(), [3]);
    assert_eq!(bm.num_free_blocks(), 4);
    // C shares the same two: each counted twice, owned once in `used`.
    let hit = bm.lookup(&[1, 2, 3, 4, 5, 9]);
    assert_eq!(hit.num_tokens(), 4, "block 3 holds [5, 6], not [5, 9]");
    bm.allocate_with_prefix(SeqId(3), &hit, 6).unwrap();
    assert_eq!(table(&bm, 3), [1, 2, 5]);
    assert_eq!((bm.ref_count(1), bm.ref_count(2)), (2, 2));
    assert_eq!(bm.num_used_blocks(), 4);
    bm.check_consistency().unwrap();

    // D takes the two free blocks, then evicts the only evictable one (3).
    assert_eq!(bm.num_evictions(), 0);
    bm.allocate(SeqId(4), 5).unwrap();
    assert_eq!(table(&bm, 4), [6, 7, 3]);
    assert_eq!(bm.num_evictions(), 1);
    assert!(!bm.is_cached(3));
    assert_eq!(bm.lookup(&a).num_tokens(), 4, "A's third block is gone");
    bm.append(SeqId(4), 1).unwrap();
    assert_eq!(bm.num_free_blocks(), 0);
    // Out of blocks: an error that changes nothing.
    let before = snapshot(&bm);
    expect_out_of_blocks(bm.append(SeqId(4), 1).unwrap_err(), 1, 0);
    assert!(!bm.can_allocate(1));
    assert_eq!(snapshot(&bm), before);
    bm.check_consistency().unwrap();

    // LRU across sequences: C's blocks (freed first) go before D's; each tail first.
    bm.free(SeqId(2)).unwrap();
    assert_eq!(bm.num_evictable_blocks(), 0, "C still holds 1 and 2");
    bm.free(SeqId(3)).unwrap();
    bm.commit(SeqId(4), &[9, 9, 8, 8, 7, 7], 6).unwrap();
    bm.free(SeqId(4)).unwrap();
    assert_eq!(bm.eviction_order().collect::<Vec<_>>(), [2, 1, 3, 7, 6]);
    // Free blocks (B's 4, C's 5) first, then the least recently used.
    bm.allocate(SeqId(5), 8).unwrap();
    assert_eq!(table(&bm, 5), [5, 4, 2, 1]);
    assert_eq!(bm.num_evictions(), 3);
    assert_eq!(bm.lookup(&a).num_tokens(), 0);
    assert_eq!(bm.lookup(&[9, 9, 8, 8, 7, 7, 1]).num_tokens(), 6);
    bm.check_consistency().unwrap();
}

#[test]
fn equal_blocks_computed_twice_are_cached_once_and_chains_continue() {
    let mut bm = BlockManager::new(10, 2).unwrap();
    let t = [1, 2, 3, 4, 5, 6, 7];
    bm.allocate(SeqId(1), 4).unwrap();
    bm.allocate(SeqId(2), 4).unwrap();
    assert_eq!((table(&bm, 1), table(&bm, 2)), (vec![1, 2], vec![3, 4]));
    bm.commit(SeqId(1), &t, 4).unwrap();
    bm.commit(SeqId(2), &t, 4).unwrap();
    assert_eq!(bm.num_cached_blocks(), 2);
    assert!(
        !bm.is_cached(3) && !bm.is_cached(4),
        "the second copy stays uncached"
    );
    // Sequence 2's next block chains onto sequence 1's cached ones.
    bm.append(SeqId(2), 2).unwrap();
    bm.commit(SeqId(2), &t, 6).unwrap();
    assert_eq!(bm.lookup(&t).blocks().collect::<Vec<_>>(), [1, 2, 5]);
    bm.free(SeqId(1)).unwrap();
    bm.free(SeqId(2)).unwrap();
    assert_eq!(bm.num_evictable_blocks(), 3);
    assert_eq!(bm.num_free_blocks(), 9);
    bm.check_consistency().unwrap();
}

#[test]
fn stale_or_oversized_hits_and_bad_commits_are_errors_that_change_nothing() {
    let mut bm = BlockManager::new(10, 2).unwrap();
    let t = [1, 2, 3, 4, 5, 6, 7];
    bm.allocate(SeqId(1), 7).unwrap();
    let before = snapshot(&bm);
    for (tokens, computed) in [(&t[..], 8), (&t[..5], 6)] {
        let e = bm.commit(SeqId(1), tokens, computed).unwrap_err();
        assert!(matches!(e, Error::Invalid { .. }), "{e}");
        assert!(e.to_string().contains("seq 1"), "{e}");
    }
    assert!(matches!(
        bm.commit(SeqId(9), &t, 1),
        Err(Error::Invalid { .. })
    ));
    assert_eq!(snapshot(&bm), before);
    assert_eq!(bm.num_cached_blocks(), 0);
    bm.commit(SeqId(1), &t, 7).unwrap();
    bm.free(SeqId(1)).unwrap();

    let hit = bm.lookup(&t);
    assert_eq!(hit.num_tokens(), 6);
    // A hit longer than the sequence.
    let before = (snapshot(&bm), bm.eviction_order().collect::<Vec<_>>());
    assert!(!bm.can_allocate_with_prefix(&hit, 5));
    let e = bm.allocate_with_prefix(SeqId(2), &hit, 5).unwrap_err();
    assert!(
        e.to_string().contains("6 tokens for a sequence of 5"),
        "{e}"
    );
    assert_eq!(
        (snapshot(&bm), bm.eviction_order().collect::<Vec<_>>()),
        before
    );
    // Evict everything: the hit is stale.
    bm.allocate(SeqId(3), 18).unwrap();
    assert_eq!(bm.num_cached_blocks(), 0);
    bm.free(SeqId(3)).unwrap();
    let before = snapshot(&bm);
    assert!(!bm.can_allocate_with_prefix(&hit, 7));
    let e = bm.allocate_with_prefix(SeqId(2), &hit, 7).unwrap_err();
    assert!(e.to_string().contains("stale"), "{e}");
    assert_eq!(snapshot(&bm), before);
    bm.check_consistency().unwrap();
}

/// One simulated sequence: the tokens it will hold, how many it holds (allocated), and
/// how many of those have their KV written.
struct Sim {
    tokens: Vec<u32>,
    held: usize,
    computed: usize,
}

/// Everything observable about a caching manager (for "a failing call changes nothing").
fn full_snapshot(bm: &BlockManager) -> impl PartialEq + std::fmt::Debug {
    (
        snapshot(bm),
        bm.num_cached_blocks(),
        bm.num_evictions(),
        bm.eviction_order().collect::<Vec<_>>(),
    )
}

/// Seeded random allocate (with and without a cached prefix) / append / compute+commit /
/// free, against a model that records what each block's KV was computed from: every hit
/// must hold exactly the KV a cold run computes, no shared or cached block is ever
/// written, and the reference counts, the free / evictable / owned partition and "a
/// failing call changes nothing" hold after every call.
fn run_random_prefix(seed: u64, num_blocks: usize, bs: usize, steps: usize) {
    let mut r = PrefixRun::new(seed, num_blocks, bs);
    for _ in 0..steps {
        let live: Vec<u64> = r.sims.keys().copied().collect();
        match r.rng.random_range(0..10) {
            0..=2 => r.admit(),
            3..=4 if !live.is_empty() => r.append(&live),
            5..=7 if !live.is_empty() => r.compute(&live),
            8 if !live.is_empty() => r.free(&live),
            _ => r.misuse(&live),
        }
        r.check(num_blocks);
    }
    let PrefixRun {
        hits,
        shared,
        ooms,
        commits,
        mut bm,
        ..
    } = r;
    assert!(
        hits > 10 && shared > 10 && ooms > 10 && commits > 10 && bm.num_evictions() > 10,
        "seed {seed}: {hits} hits, {shared} shared, {ooms} out-of-blocks, {commits} commits, {} evictions",
        bm.num_evictions()
    );
    for id in r.sims.keys() {
        bm.free(SeqId(*id)).unwrap();
    }
    assert_eq!(bm.num_free_blocks(), num_blocks - 1);
    assert_eq!(bm.num_used_blocks(), 0);
}

/// The state of [`run_random_prefix`]: the manager, the sequences it should hold, what
/// each block's KV was computed from, and counts of what happened.
struct PrefixRun {
    seed: u64,
    bs: usize,
    rng: StdRng,
    bm: BlockManager,
    /// A few shared prefixes, so lookups hit.
    bases: Vec<Vec<u32>>,
    sims: BTreeMap<u64, Sim>,
    /// Block -> the tokens its last written row's KV depends on (the sequence's tokens up
    /// to and including that row).
    content: BTreeMap<u32, Vec<u32>>,
    next_id: u64,
    hits: usize,
    shared: usize,
    ooms: usize,
    commits: usize,
}

impl PrefixRun {
    fn new(seed: u64, num_blocks: usize, bs: usize) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let bm = BlockManager::new(num_blocks, bs).unwrap();
        let bases: Vec<Vec<u32>> = (0..3)
            .map(|_| (0..6 * bs).map(|_| rng.random_range(0..4)).collect())
            .collect();
        PrefixRun {
            seed,
            bs,
            rng,
            bm,
            bases,
            sims: BTreeMap::new(),
            content: BTreeMap::new(),
            next_id: 0,
            hits: 0,
            shared: 0,
            ooms: 0,
            commits: 0,
        }
    }

    /// A new sequence, usually from a prefix lookup: its hit blocks hold its prefix's KV,
    /// and the allocation succeeds exactly when it can.
    fn admit(&mut self) {
        let (seed, bs) = (self.seed, self.bs);
        let before = full_snapshot(&self.bm);
        let rng = &mut self.rng;
        let bm = &mut self.bm;
        let len = rng.random_range(1..=5 * bs);
        let split = rng.random_range(0..=len);
        let mut tokens = self.bases[rng.random_range(0..self.bases.len())][..split].to_vec();
        tokens.extend((split..len).map(|_| rng.random_range(0..4u32)));
        let hit = if rng.random_bool(0.8) {
            bm.lookup(&tokens)
        } else {
            encore_core::kv::PrefixHit::none()
        };
        let hb: Vec<u32> = hit.blocks().collect();
        assert_eq!(hit.num_tokens(), hb.len() * bs);
        assert!(hb.len() <= (len - 1) / bs, "the hit leaves the last token");
        for (i, &b) in hb.iter().enumerate() {
            assert!(bm.is_cached(b));
            assert_eq!(
                self.content.get(&b).map(Vec::as_slice),
                Some(&tokens[..(i + 1) * bs]),
                "seed {seed}: block {b} (position {i}) holds other KV"
            );
        }
        let n = rng.random_range(hit.num_tokens()..=len);
        let seq = SeqId(self.next_id);
        self.next_id += 1;
        let needed = n.div_ceil(bs) - hb.len();
        let unowned = hb.iter().filter(|&&b| bm.ref_count(b) == 0).count();
        let available = bm.num_free_blocks() - unowned;
        let can = bm.can_allocate_with_prefix(&hit, n);
        assert_eq!(can, needed <= available);
        match bm.allocate_with_prefix(seq, &hit, n) {
            Ok(()) => {
                assert!(can);
                assert_eq!(&bm.block_table(seq).unwrap()[..hb.len()], &hb[..]);
                self.hits += usize::from(!hb.is_empty());
                let computed = hit.num_tokens();
                let sim = Sim {
                    tokens,
                    held: n,
                    computed,
                };
                self.sims.insert(seq.0, sim);
            }
            Err(e) => {
                assert!(!can);
                expect_out_of_blocks(e, needed, available);
                assert_eq!(full_snapshot(bm), before);
                self.ooms += 1;
            }
        }
    }

    /// Room for more of a live sequence's tokens (decode-produced tokens extend it).
    fn append(&mut self, live: &[u64]) {
        let before = full_snapshot(&self.bm);
        let id = live[self.rng.random_range(0..live.len())];
        let s = self.sims.get_mut(&id).unwrap();
        if s.held == s.tokens.len() || self.rng.random_bool(0.3) {
            s.tokens.push(self.rng.random_range(0..4));
        }
        let n = self.rng.random_range(0..=s.tokens.len() - s.held);
        let needed = (s.held + n).div_ceil(self.bs) - s.held.div_ceil(self.bs);
        let can = self.bm.can_append(SeqId(id), n);
        assert_eq!(can, needed <= self.bm.num_free_blocks());
        match self.bm.append(SeqId(id), n) {
            Ok(()) => s.held += n,
            Err(e) => {
                assert!(!can);
                expect_out_of_blocks(e, needed, self.bm.num_free_blocks());
                assert_eq!(full_snapshot(&self.bm), before);
                self.ooms += 1;
            }
        }
    }

    /// A step computes some of a sequence's held tokens, then commits.
    fn compute(&mut self, live: &[u64]) {
        let (seed, bs) = (self.seed, self.bs);
        let id = live[self.rng.random_range(0..live.len())];
        let s = self.sims.get_mut(&id).unwrap();
        let to = self.rng.random_range(s.computed..=s.held);
        let tbl = self.bm.block_table(SeqId(id)).unwrap();
        for p in s.computed..to {
            let b = tbl[p / bs];
            assert_eq!(
                self.bm.ref_count(b),
                1,
                "seed {seed}: writing shared block {b}"
            );
            assert!(
                !self.bm.is_cached(b),
                "seed {seed}: writing cached block {b}"
            );
            self.content.insert(b, s.tokens[..=p].to_vec());
        }
        s.computed = to;
        self.bm.commit(SeqId(id), &s.tokens, to).unwrap();
        self.commits += 1;
        // Committing more than is held is refused.
        let e = self
            .bm
            .commit(SeqId(id), &s.tokens, s.held + 1)
            .unwrap_err();
        assert!(matches!(e, Error::Invalid { .. }), "{e}");
    }

    /// A live sequence ends: exactly its blocks nobody else holds come free.
    fn free(&mut self, live: &[u64]) {
        let id = live[self.rng.random_range(0..live.len())];
        let bm = &mut self.bm;
        let tbl = bm.block_table(SeqId(id)).unwrap().to_vec();
        let released = tbl.iter().filter(|&&b| bm.ref_count(b) == 1).count();
        let free = bm.num_free_blocks();
        bm.free(SeqId(id)).unwrap();
        self.sims.remove(&id);
        assert_eq!(bm.num_free_blocks(), free + released);
    }

    /// Calls that must fail (unknown sequences, an allocation for a live one) change
    /// nothing.
    fn misuse(&mut self, live: &[u64]) {
        let before = full_snapshot(&self.bm);
        let bm = &mut self.bm;
        let unknown = SeqId(self.next_id + 1000);
        assert!(matches!(bm.free(unknown), Err(Error::Invalid { .. })));
        assert!(matches!(
            bm.commit(unknown, &[], 0),
            Err(Error::Invalid { .. })
        ));
        if let Some(&id) = live.first() {
            let hit = bm.lookup(&self.sims[&id].tokens);
            let e = bm
                .allocate_with_prefix(SeqId(id), &hit, 1 << 20)
                .unwrap_err();
            assert!(matches!(e, Error::Invalid { .. }), "{e}");
        }
        assert_eq!(full_snapshot(bm), before);
    }

    /// The manager's own checks; reference counts against the tables; a shared block is
    /// cached and sits at the same position in every table holding it.
    fn check(&mut self, num_blocks: usize) {
        let (seed, bm) = (self.seed, &self.bm);
        bm.check_consistency().unwrap();
        let mut owners: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
        for (&id, s) in &self.sims {
            let tbl = bm.block_table(SeqId(id)).unwrap();
            assert_eq!(bm.num_tokens(SeqId(id)).unwrap(), s.held);
            assert_eq!(tbl.len(), s.held.div_ceil(self.bs));
            for (i, &b) in tbl.iter().enumerate() {
                assert_ne!(b, NULL_BLOCK);
                owners.entry(b).or_default().push(i);
            }
        }
        for (&b, at) in &owners {
            assert_eq!(bm.ref_count(b), at.len());
            if at.len() > 1 {
                self.shared += 1;
                assert!(bm.is_cached(b), "seed {seed}: uncached block {b} shared");
                assert!(at.iter().all(|&i| i == at[0]));
            }
        }
        assert_eq!(bm.num_used_blocks(), owners.len());
        assert_eq!(bm.num_free_blocks() + owners.len(), num_blocks - 1);
    }
}

#[test]
fn random_prefix_caching_keeps_the_invariants_and_hits_hold_the_right_kv() {
    for seed in 0..8 {
        run_random_prefix(seed, 24, 4, 3000);
    }
    run_random_prefix(100, 12, 1, 3000);
    run_random_prefix(101, 40, 16, 3000);
}

/// Truncation (the KV of rejected drafts) never cuts into committed blocks, which other
/// sequences may share: down to their end it gives back only the tail, and the shared
/// blocks keep their owners.
#[test]
fn truncation_stops_at_the_committed_blocks() {
    let mut bm = BlockManager::new(16, 4).unwrap();
    let tokens: Vec<u32> = (0..14).collect();
    bm.allocate(SeqId(1), 14).unwrap();
    bm.commit(SeqId(1), &tokens, 9).unwrap(); // blocks 0 and 1 cached
    let before = snapshot(&bm);
    let e = bm.truncate(SeqId(1), 7).unwrap_err().to_string();
    assert!(e.contains("the first 8 committed"), "{e}");
    assert_eq!(snapshot(&bm), before, "a failing truncate changes nothing");
    // A second sequence shares the two cached blocks.
    let hit = bm.lookup(&tokens);
    assert_eq!(hit.num_tokens(), 8);
    bm.allocate_with_prefix(SeqId(2), &hit, 10).unwrap();
    let shared = table(&bm, 1)[..2].to_vec();
    assert_eq!(table(&bm, 2)[..2], shared[..]);
    let free = bm.num_free_blocks();
    bm.truncate(SeqId(1), 8).unwrap();
    assert_eq!(table(&bm, 1), shared);
    assert_eq!(
        bm.num_free_blocks(),
        free + 2,
        "its two uncached tail blocks"
    );
    for &b in &shared {
        assert_eq!(bm.ref_count(b), 2);
        assert!(bm.is_cached(b));
    }
    // And it grows again from there.
    bm.append(SeqId(1), 5).unwrap();
    assert_eq!(bm.num_tokens(SeqId(1)).unwrap(), 13);
    bm.check_consistency().unwrap();
}
