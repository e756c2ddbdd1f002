//! Model oracle for `CowMap`: random inserts, removes, point reads and range reads (both
//! directions, every bound kind) must match `BTreeMap` step by step, and frozen clones taken
//! along the way must stay exactly as they were while the original keeps changing.
//!
//! Reproduce a failure with `SLUICE_COW_SEED=<seed> cargo test -p sluice-engine --test
//! cow_map_matches_btreemap`; `SLUICE_COW_STEPS` sets the steps per seed.

use std::collections::BTreeMap;
use std::ops::Bound;

use sluice_engine::cow::{CowMap, CowMapBuilder, CHUNK_MAX};
use sluice_fuzzkit::{env_u64, Rng};

const STEPS_DEFAULT: u64 = 20_000;

fn seeds() -> Vec<u64> {
    env_u64("SLUICE_COW_SEED").map_or_else(|| vec![1, 2, 3, 0xC0FFEE], |s| vec![s])
}

fn bound(rng: &mut Rng, space: i64) -> Bound<i64> {
    let k = rng.below(space as usize + 20) as i64 - 10;
    match rng.below(3) {
        0 => Bound::Unbounded,
        1 => Bound::Included(k),
        _ => Bound::Excluded(k),
    }
}

/// Whether `BTreeMap::range` accepts the bounds (it panics on inverted or empty-excluded).
fn btree_accepts(lo: &Bound<i64>, hi: &Bound<i64>) -> bool {
    match (lo, hi) {
        (Bound::Excluded(a), Bound::Excluded(b)) => a < b,
        (Bound::Included(a) | Bound::Excluded(a), Bound::Included(b) | Bound::Excluded(b)) => {
            a <= b
        }
        _ => true,
    }
}

type Frozen = (CowMap<i64, u64>, BTreeMap<i64, u64>, u64);

fn run(seed: u64, steps: u64) -> Result<(), String> {
    let mut rng = Rng::new(seed);
    let mut cow: CowMap<i64, u64> = CowMap::new();
    let mut model: BTreeMap<i64, u64> = BTreeMap::new();
    // (the frozen clone, the model's copy at that moment, the step it was taken at)
    let mut frozen: Vec<Frozen> = Vec::new();
    // The key space changes over the run so the map grows past many chunks and shrinks
    // back (merges), with dense and sparse phases.
    let mut space: i64 = 64;
    for step in 0..steps {
        if step % 2_000 == 0 {
            space = *rng.pick(&[16, 300, 2_000, 6_000, 20_000]);
        }
        let fail = |what: String| Err(format!("step {step}: {what}"));
        match rng.below(100) {
            0..=39 => {
                let k = rng.below(space as usize) as i64;
                let v = rng.next_u64();
                let (a, b) = (cow.insert(k, v), model.insert(k, v));
                if a != b {
                    return fail(format!("insert {k}: {a:?} != {b:?}"));
                }
            }
            40..=64 => {
                let k = rng.below(space as usize) as i64;
                let (a, b) = (cow.remove(&k), model.remove(&k));
                if a != b {
                    return fail(format!("remove {k}: {a:?} != {b:?}"));
                }
            }
            65..=74 => {
                let k = rng.below(space as usize + 4) as i64 - 2;
                if cow.get(&k) != model.get(&k) {
                    return fail(format!("get {k}"));
                }
                if let Some(v) = cow.get_mut(&k) {
                    *v = v.wrapping_add(1);
                    let m = model.get_mut(&k).unwrap();
                    *m = m.wrapping_add(1);
                }
            }
            75..=84 => {
                let (lo, hi) = (bound(&mut rng, space), bound(&mut rng, space));
                let got: Vec<(i64, u64)> = if rng.one_in(2) {
                    cow.range((lo, hi)).map(|(k, v)| (*k, *v)).collect()
                } else {
                    let mut r: Vec<_> = cow.range((lo, hi)).rev().map(|(k, v)| (*k, *v)).collect();
                    r.reverse();
                    r
                };
                let want: Vec<(i64, u64)> = if btree_accepts(&lo, &hi) {
                    model.range((lo, hi)).map(|(k, v)| (*k, *v)).collect()
                } else {
                    Vec::new()
                };
                if got != want {
                    return fail(format!("range {lo:?}..{hi:?}: {got:?} != {want:?}"));
                }
                // Mixed ends meet exactly once.
                let mut it = cow.range((lo, hi));
                let mut n = 0;
                loop {
                    let got = if n % 2 == 0 {
                        it.next()
                    } else {
                        it.next_back()
                    };
                    if got.is_none() {
                        break;
                    }
                    n += 1;
                }
                if n != want.len() {
                    return fail(format!("range {lo:?}..{hi:?} from both ends: {n}"));
                }
            }
            85..=89 if model.len() < 8 * CHUNK_MAX * 4 => {
                // A run of ascending (append) or descending inserts (while the map is small
                // enough for the checks to stay quick).
                let n = rng.below(3 * CHUNK_MAX) as i64;
                let descending = rng.one_in(2);
                let base = if descending {
                    model.first_key_value().map_or(0, |(k, _)| *k) - 1
                } else {
                    model.last_key_value().map_or(0, |(k, _)| *k) + 1
                };
                for i in 0..n {
                    let k = if descending { base - i } else { base + i };
                    cow.insert(k, i as u64);
                    model.insert(k, i as u64);
                }
            }
            85..=92 => {
                // Remove a contiguous run (merges).
                let from = rng.below(space as usize) as i64;
                let doomed: Vec<i64> = model
                    .range(from..)
                    .take(rng.below(2 * CHUNK_MAX))
                    .map(|(k, _)| *k)
                    .collect();
                for k in doomed {
                    cow.remove(&k);
                    model.remove(&k);
                }
            }
            93..=95 => {
                if frozen.len() >= 4 {
                    frozen.remove(rng.below(frozen.len()));
                }
                frozen.push((cow.clone(), model.clone(), step));
            }
            _ => {
                for (f, m, at) in &frozen {
                    f.check_invariants();
                    if !f
                        .iter()
                        .map(|(k, v)| (*k, *v))
                        .eq(m.iter().map(|(k, v)| (*k, *v)))
                    {
                        return fail(format!("the clone frozen at step {at} changed"));
                    }
                }
            }
        }
        if cow.len() != model.len() {
            return fail(format!("len {} != {}", cow.len(), model.len()));
        }
        if step % 500 == 0 {
            cow.check_invariants();
            if !cow
                .iter()
                .map(|(k, v)| (*k, *v))
                .eq(model.iter().map(|(k, v)| (*k, *v)))
            {
                return fail("contents differ".into());
            }
            if cow.first_key_value() != model.first_key_value()
                || cow.last_key_value() != model.last_key_value()
            {
                return fail("first or last differs".into());
            }
        }
    }
    for (f, m, at) in &frozen {
        if !f
            .iter()
            .map(|(k, v)| (*k, *v))
            .eq(m.iter().map(|(k, v)| (*k, *v)))
        {
            return Err(format!("end: the clone frozen at step {at} changed"));
        }
    }
    Ok(())
}

#[test]
fn cow_map_matches_btreemap_and_frozen_clones_never_change() {
    let steps = env_u64("SLUICE_COW_STEPS").unwrap_or(STEPS_DEFAULT);
    for seed in seeds() {
        if let Err(e) = run(seed, steps) {
            panic!(
                "seed={seed}: {e}\n  reproduce with: SLUICE_COW_SEED={seed} cargo test -p \
                 sluice-engine --test cow_map_matches_btreemap"
            );
        }
    }
}

#[test]
fn bulk_building_matches_collecting_and_takes_only_ascending_keys() {
    for n in [
        0usize,
        1,
        CHUNK_MAX - 1,
        CHUNK_MAX,
        CHUNK_MAX + 1,
        10 * CHUNK_MAX + 7,
    ] {
        let entries: Vec<(i64, u64)> = (0..n as i64).map(|k| (k * 3, k as u64)).collect();
        let built = CowMap::from_sorted(entries.clone());
        built.check_invariants();
        let model: BTreeMap<i64, u64> = entries.iter().copied().collect();
        assert!(
            built.iter().map(|(k, v)| (*k, *v)).eq(model.into_iter()),
            "n={n}"
        );
        let mut b = CowMapBuilder::new();
        for (k, v) in &entries {
            b.push(*k, *v);
        }
        assert_eq!(b.finish(), built, "n={n}");
    }
    // Unsorted input with repeats: the last value wins, like BTreeMap.
    let pairs = [(5, 1u64), (1, 2), (5, 3), (3, 4), (1, 5)];
    let collected: CowMap<i64, u64> = pairs.iter().copied().collect();
    let model: BTreeMap<i64, u64> = pairs.iter().copied().collect();
    assert!(collected
        .iter()
        .map(|(k, v)| (*k, *v))
        .eq(model.into_iter()));
    let refused = std::panic::catch_unwind(|| {
        let mut b = CowMapBuilder::new();
        b.push(2, 0u64);
        b.push(2, 0u64);
    });
    assert!(refused.is_err(), "a repeated key is refused");
}

#[test]
fn string_keys_are_found_by_str() {
    let mut m: CowMap<String, u32> = CowMap::new();
    for i in 0..1000u32 {
        m.insert(format!("k{i:04}"), i);
    }
    assert_eq!(m.get("k0500"), Some(&500));
    assert_eq!(m["k0999"], 999);
    assert!(m.remove("k0001").is_some());
    assert!(!m.contains_key("k0001"));
    let r: Vec<u32> = m
        .range::<str, _>((Bound::Included("k0100"), Bound::Excluded("k0103")))
        .map(|(_, v)| *v)
        .collect();
    assert_eq!(r, vec![100, 101, 102]);
}

#[test]
fn a_write_copies_only_the_chunk_it_touches() {
    let mut m: CowMap<i64, u64> = (0..100 * CHUNK_MAX as i64).map(|k| (k, 0)).collect();
    let frozen = m.clone();
    m.insert(5, 1);
    *m.get_mut(&(50 * CHUNK_MAX as i64)).unwrap() = 2;
    assert_eq!(frozen.get(&5), Some(&0));
    assert_eq!(m.get(&5), Some(&1));
    assert_eq!(frozen.shared_chunks_with(&m), frozen.chunk_count() - 2);
}

/// Point lookups guess a key's position by interpolation (`cow::Guess`); a guess only
/// steers the search, so keys spread any way at all — clustered, exponential, at the ends
/// of `i64` — and keys absent between them must read exactly as the model reads them.
#[test]
fn point_lookups_find_every_key_however_keys_are_spread() {
    let mut rng = Rng::new(7);
    let spreads: Vec<(&str, Vec<i64>)> = vec![
        ("dense", (0..20_000).collect()),
        ("exponential", (0..62).map(|i| 1i64 << i).collect()),
        (
            "two clusters",
            (0..5_000).chain(1_000_000_000..1_000_005_000).collect(),
        ),
        (
            "i64 ends",
            (0..3_000)
                .map(|i| i64::MIN + i)
                .chain((0..3_000).map(|i| i64::MAX - i))
                .chain([0, 1, -1])
                .collect(),
        ),
        (
            "random sparse",
            (0..20_000).map(|_| rng.next_u64() as i64).collect(),
        ),
    ];
    let empty: CowMap<i64, u64> = CowMap::new();
    empty.prefetch(&0);
    for (name, keys) in spreads {
        let mut cow: CowMap<i64, u64> = CowMap::new();
        let mut model: BTreeMap<i64, u64> = BTreeMap::new();
        // Insert in a shuffled order so chunks split at arbitrary places.
        let mut order = keys.clone();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i + 1));
        }
        for (n, k) in order.iter().enumerate() {
            assert_eq!(
                cow.insert(*k, n as u64),
                model.insert(*k, n as u64),
                "{name}"
            );
        }
        cow.check_invariants();
        for k in &keys {
            for probe in [k.wrapping_sub(1), *k, k.wrapping_add(1)] {
                // A prefetch takes any key (its guessed slot is always inside the chunk).
                cow.prefetch(&probe);
                assert_eq!(cow.get(&probe), model.get(&probe), "{name}: get {probe}");
            }
        }
        // Remove every other key, then every lookup again.
        for k in keys.iter().step_by(2) {
            assert_eq!(cow.remove(k), model.remove(k), "{name}: remove {k}");
        }
        cow.check_invariants();
        for k in &keys {
            cow.prefetch(k);
            assert_eq!(cow.get(k), model.get(k), "{name}: get {k} after removes");
        }
    }
}
