//! Property test of DistributedSampler over many (size, world, drop_last, seed, epoch):
//! equal counts, shards disjoint except wrap-padding duplicates, coverage of the dataset.

use g4ft_data::DistributedSampler;

#[test]
fn shards_are_equal_disjoint_and_cover() {
    let mut checked = 0;
    for n in 1..70usize {
        for world in 1..10usize {
            for drop_last in [false, true] {
                for (seed, epoch) in [(0u64, 0u64), (42, 3), (n as u64 * 7919, world as u64)] {
                    let shards: Vec<Vec<usize>> = (0..world)
                        .map(|rank| {
                            let mut s = DistributedSampler::new(n, world, rank)
                                .unwrap()
                                .with_seed(seed)
                                .with_drop_last(drop_last);
                            s.set_epoch(epoch);
                            s.indices()
                        })
                        .collect();
                    let per_rank = shards[0].len();
                    let ctx = format!(
                        "n={n} world={world} drop_last={drop_last} seed={seed} epoch={epoch}"
                    );
                    assert!(
                        shards.iter().all(|s| s.len() == per_rank),
                        "unequal counts: {ctx}"
                    );
                    let mut count = vec![0usize; n];
                    for &i in shards.iter().flatten() {
                        count[i] += 1;
                    }
                    if drop_last {
                        assert_eq!(per_rank, n / world, "{ctx}");
                        assert!(
                            count.iter().all(|&c| c <= 1),
                            "duplicates with drop_last: {ctx}"
                        );
                        assert_eq!(
                            count.iter().filter(|&&c| c == 1).count(),
                            per_rank * world,
                            "{ctx}"
                        );
                    } else {
                        assert_eq!(per_rank, n.div_ceil(world), "{ctx}");
                        assert!(count.iter().all(|&c| c >= 1), "an index is missing: {ctx}");
                        // wrap padding repeats the order from its start: at most ceil(W/n) extra copies
                        let extra: usize = count.iter().map(|&c| c - 1).sum();
                        assert_eq!(extra, per_rank * world - n, "{ctx}");
                        assert!(count.iter().all(|&c| c <= 1 + world.div_ceil(n)), "{ctx}");
                    }
                    checked += 1;
                }
            }
        }
    }
    assert!(checked > 3000);
}

#[test]
fn epochs_reshuffle_and_ranks_agree() {
    let mut s = DistributedSampler::new(100, 4, 0).unwrap().with_seed(5);
    let e0 = s.global_order();
    s.set_epoch(1);
    let e1 = s.global_order();
    assert_ne!(e0, e1, "set_epoch changes the permutation");
    let mut r3 = DistributedSampler::new(100, 4, 3).unwrap().with_seed(5);
    r3.set_epoch(1);
    assert_eq!(
        r3.global_order(),
        e1,
        "every rank computes the same global order"
    );
    let unshuffled = DistributedSampler::new(10, 3, 1)
        .unwrap()
        .with_shuffle(false);
    assert_eq!(unshuffled.indices(), vec![1, 4, 7, 0]);
}
