//! b_eff's communication patterns, built for every rank at once (b_eff 3.6, "initialization
//! of all communication patterns"):
//!
//! - six **ring** patterns: the processes are split into rings of about 2, 4, 8,
//!   max(16, n/4), max(32, n/2) and n processes; in each ring every process exchanges a
//!   message with both neighbours;
//! - **random** patterns: one ring through all processes in a random order (b_eff builds a
//!   communicator whose rank order is a random permutation, here the permutation maps the
//!   ring directly onto world ranks);
//! - the **one ping-pong pair** of ranks 0 and 1 (Sendrecv method only), which gives the
//!   ping-pong latency and bandwidth but is not part of b_eff.
//!
//! Each rank's part of a pattern is a list of exchanges (b_eff's "sendrecv calls"): a
//! *ping* to the next process, receiving from the previous, then a *pong* the other way.
//! When the pong would go to the same process as the ping (a ring of two, or of one), it is
//! dropped, because one `MPI_Alltoallv` can carry only one message between two processes.
//!
//! The random permutations come from `drand48` seeded with `srand48(seed)`, drawn the way
//! b_eff draws them, so a seed gives the same patterns as b_eff 3.6 given the same seed
//! (b_eff seeds with the time of day and does not print it; this implementation prints it).

/// What kind of pattern, and so which average it enters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PatternKind {
    /// A ring pattern: enters the ring average of b_eff.
    Ring,
    /// A random cyclic pattern: enters the random average of b_eff.
    Random,
    /// Ranks 0 and 1 only, Sendrecv only: the ping-pong latency and bandwidth, not b_eff.
    PingPongPair,
}

/// One "sendrecv call" of a rank: send to `send_to` and receive from `recv_from` (either may
/// be absent, as `MPI_PROC_NULL` in b_eff). The call's index is the message tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Exchange {
    /// Destination world rank.
    pub send_to: Option<usize>,
    /// Source world rank.
    pub recv_from: Option<usize>,
}

/// A pattern for all ranks.
#[derive(Clone, Debug, PartialEq)]
pub struct Pattern {
    /// Which average the pattern enters.
    pub kind: PatternKind,
    /// b_eff's name: `ring-R*Sfix` (R rings of S), `ring-R*S&+1` (some rings one larger),
    /// `ring-R*S&-1`, `random-cyc-1dim`, `one PingPong Pair`.
    pub description: String,
    /// Every world rank's exchanges, in order; empty for a rank that does not take part.
    pub exchanges: Vec<Vec<Exchange>>,
    /// Factor from the slowest process's bandwidth to the accumulated bandwidth of the
    /// pattern: b_eff's `all_msg_cnt / sr_count` of rank 0, i.e. `n` for rings and random
    /// patterns (every process sends as much as rank 0) and 1 for the ping-pong pair.
    pub accumulation: f64,
}

impl Pattern {
    /// Whether only the Sendrecv method measures this pattern (b_eff's ping-pong pair).
    pub fn sendrecv_only(&self) -> bool {
        self.kind == PatternKind::PingPongPair
    }

    /// Ping to `next` and pong to `prev` for every rank, with the pong dropped where it
    /// would go where the ping goes.
    fn cyclic(
        kind: PatternKind,
        description: String,
        neighbours: impl Iterator<Item = (usize, usize)>,
        n: usize,
    ) -> Pattern {
        let exchanges = neighbours
            .map(|(prev, next)| {
                let ping = Exchange {
                    send_to: Some(next),
                    recv_from: Some(prev),
                };
                let pong = Exchange {
                    send_to: Some(prev),
                    recv_from: Some(next),
                };
                if ping.send_to == pong.send_to {
                    vec![ping]
                } else {
                    vec![ping, pong]
                }
            })
            .collect();
        Pattern {
            kind,
            description,
            exchanges,
            accumulation: n as f64,
        }
    }
}

/// The ring sizes b_eff aims at for `n` processes: 2, 4, 8, max(16, n/4), max(32, n/2) and
/// n, each at most n.
pub fn ring_sizes(n: usize) -> [usize; 6] {
    [2, 4, 8, (n / 4).max(16), (n / 2).max(32), n].map(|s| s.min(n))
}

/// The ring pattern of `n` processes aiming at rings of `wanted` processes.
///
/// As b_eff splits them: `max(1, min(trunc(n / wanted + 0.4), n / 2))` rings of `n / rings`
/// processes, the `n mod rings` left over making that many rings one larger. Odd-sized
/// rings come first when the smaller size is odd; consecutive ranks form a ring.
pub fn ring_pattern(n: usize, wanted: usize) -> Pattern {
    assert!(n >= 1 && wanted >= 1, "a ring needs a process");
    let wanted = wanted.min(n);
    let rings = ((n as f64 / wanted as f64 + 0.4) as usize)
        .min(n / 2)
        .max(1);
    let low = n / rings;
    let high_count = n - low * rings;
    let low_count = rings - high_count;
    let (first_size, second_size, first_count, second_count) = if low % 2 == 1 && high_count > 0 {
        (low + 1, low, high_count, low_count)
    } else {
        (low, low + 1, low_count, high_count)
    };
    let suffix = match (second_count, second_size > first_size) {
        (0, _) => "fix",
        (_, true) => "&+1",
        (_, false) => "&-1",
    };
    let description = format!("ring-{rings}*{first_size}{suffix}");
    let first_span = first_count * first_size;
    let neighbours = (0..n).map(|r| {
        let (size, base) = if r < first_span {
            (first_size, r / first_size * first_size)
        } else {
            (
                second_size,
                (r - first_span) / second_size * second_size + first_span,
            )
        };
        let next = (r - base + 1) % size + base;
        let prev = (r - base + size - 1) % size + base;
        (prev, next)
    });
    Pattern::cyclic(PatternKind::Ring, description, neighbours, n)
}

/// The random cyclic pattern of `order`, where `order[k]` is the world rank at position `k`
/// of the ring (b_eff's `ranks` array: rank `k` of the random communicator).
pub fn random_pattern(order: &[usize]) -> Pattern {
    let n = order.len();
    let mut position = vec![usize::MAX; n];
    for (k, &r) in order.iter().enumerate() {
        position[r] = k;
    }
    let neighbours = position
        .into_iter()
        .map(|k| (order[(k + n - 1) % n], order[(k + 1) % n]));
    Pattern::cyclic(PatternKind::Random, "random-cyc-1dim".into(), neighbours, n)
}

/// Ranks 0 and 1 in ping-pong (0 sends, then receives), the others idle; `None` for one
/// process.
pub fn ping_pong_pair(n: usize) -> Option<Pattern> {
    if n < 2 {
        return None;
    }
    let mut exchanges = vec![Vec::new(); n];
    exchanges[0] = vec![
        Exchange {
            send_to: Some(1),
            recv_from: None,
        },
        Exchange {
            send_to: None,
            recv_from: Some(1),
        },
    ];
    exchanges[1] = vec![
        Exchange {
            send_to: None,
            recv_from: Some(0),
        },
        Exchange {
            send_to: Some(0),
            recv_from: None,
        },
    ];
    Some(Pattern {
        kind: PatternKind::PingPongPair,
        description: "one PingPong Pair".into(),
        exchanges,
        accumulation: 1.0,
    })
}

/// The random number generator of POSIX `drand48`/`srand48`: a 48-bit linear congruential
/// generator `x ← (0x5DEECE66D·x + 0xB) mod 2^48`, returning `x / 2^48`.
#[derive(Clone, Debug)]
pub struct Drand48 {
    state: u64,
}

impl Drand48 {
    const A: u64 = 0x5_DEEC_E66D;
    const C: u64 = 0xB;
    const MASK: u64 = (1 << 48) - 1;

    /// `srand48(seed)`: the low 32 bits of `seed` become the high 32 bits of the state, the
    /// low 16 bits are 0x330E.
    pub fn new(seed: i64) -> Drand48 {
        Drand48 {
            state: (((seed as u64) & 0xFFFF_FFFF) << 16) | 0x330E,
        }
    }

    /// The next number in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        self.state = (Self::A.wrapping_mul(self.state).wrapping_add(Self::C)) & Self::MASK;
        self.state as f64 / (1u64 << 48) as f64
    }
}

/// A random order of `n` ranks as b_eff draws it: rank `i` in turn takes position
/// `trunc(drand48() · n)`, or the next free one after it.
pub fn random_order(rng: &mut Drand48, n: usize) -> Vec<usize> {
    let mut order = vec![usize::MAX; n];
    for i in 0..n {
        let mut j = ((rng.next_f64() * n as f64) as usize).min(n - 1);
        while order[j] != usize::MAX {
            j = (j + 1) % n;
        }
        order[j] = i;
    }
    order
}

/// All patterns of a run on `n` processes: the six rings, `randoms` random patterns from
/// `seed`, and the ping-pong pair (with two or more processes), in b_eff's order.
pub fn all_patterns(n: usize, randoms: usize, seed: i64) -> Vec<Pattern> {
    let mut patterns: Vec<Pattern> = ring_sizes(n).iter().map(|&s| ring_pattern(n, s)).collect();
    let mut rng = Drand48::new(seed);
    patterns.extend((0..randoms).map(|_| random_pattern(&random_order(&mut rng, n))));
    patterns.extend(ping_pong_pair(n));
    patterns
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every message sent is received by its destination with the same tag, and the other
    /// way round.
    fn assert_consistent(p: &Pattern) {
        let n = p.exchanges.len();
        for (r, ex) in p.exchanges.iter().enumerate() {
            for (tag, e) in ex.iter().enumerate() {
                if let Some(d) = e.send_to {
                    assert!(d < n, "{}: rank {r} sends to {d}", p.description);
                    assert_eq!(
                        p.exchanges[d].get(tag).and_then(|x| x.recv_from),
                        Some(r),
                        "{}: rank {r} tag {tag} to {d} has no matching receive",
                        p.description
                    );
                }
                if let Some(s) = e.recv_from {
                    assert_eq!(
                        p.exchanges[s].get(tag).and_then(|x| x.send_to),
                        Some(r),
                        "{}: rank {r} tag {tag} from {s} has no matching send",
                        p.description
                    );
                }
            }
        }
    }

    /// The rings of a ring pattern: the cycles of `next`, as sorted sizes.
    fn ring_cycle_sizes(p: &Pattern) -> Vec<usize> {
        let n = p.exchanges.len();
        let mut seen = vec![false; n];
        let mut sizes = Vec::new();
        for start in 0..n {
            if seen[start] {
                continue;
            }
            let mut r = start;
            let mut len = 0;
            while !seen[r] {
                seen[r] = true;
                len += 1;
                r = p.exchanges[r][0].send_to.unwrap();
            }
            sizes.push(len);
        }
        sizes.sort();
        sizes
    }

    #[test]
    fn ring_sizes_and_names_for_1_to_8_processes() {
        // By hand from b_eff's rule: rings = max(1, min(trunc(n/s + 0.4), n/2)); e.g. n = 7,
        // s = 4: 2 rings of 3 with one left over, and since 3 is odd the larger ring comes
        // first: "ring-2*4&-1".
        let expected: [(usize, [&str; 6]); 8] = [
            (1, ["ring-1*1fix"; 6]),
            (2, ["ring-1*2fix"; 6]),
            (
                3,
                [
                    "ring-1*3fix",
                    "ring-1*3fix",
                    "ring-1*3fix",
                    "ring-1*3fix",
                    "ring-1*3fix",
                    "ring-1*3fix",
                ],
            ),
            (
                4,
                [
                    "ring-2*2fix",
                    "ring-1*4fix",
                    "ring-1*4fix",
                    "ring-1*4fix",
                    "ring-1*4fix",
                    "ring-1*4fix",
                ],
            ),
            (
                5,
                [
                    "ring-2*2&+1",
                    "ring-1*5fix",
                    "ring-1*5fix",
                    "ring-1*5fix",
                    "ring-1*5fix",
                    "ring-1*5fix",
                ],
            ),
            (
                6,
                [
                    "ring-3*2fix",
                    "ring-1*6fix",
                    "ring-1*6fix",
                    "ring-1*6fix",
                    "ring-1*6fix",
                    "ring-1*6fix",
                ],
            ),
            (
                7,
                [
                    "ring-3*2&+1",
                    "ring-2*4&-1",
                    "ring-1*7fix",
                    "ring-1*7fix",
                    "ring-1*7fix",
                    "ring-1*7fix",
                ],
            ),
            (
                8,
                [
                    "ring-4*2fix",
                    "ring-2*4fix",
                    "ring-1*8fix",
                    "ring-1*8fix",
                    "ring-1*8fix",
                    "ring-1*8fix",
                ],
            ),
        ];
        for (n, names) in expected {
            let got: Vec<String> = ring_sizes(n)
                .iter()
                .map(|&s| ring_pattern(n, s).description)
                .collect();
            assert_eq!(got, names, "n = {n}");
        }
        // The cycles themselves: n = 7, size 2 -> rings of 2, 2 and 3; size 4 -> 3 and 4.
        assert_eq!(ring_cycle_sizes(&ring_pattern(7, 2)), vec![2, 2, 3]);
        assert_eq!(ring_cycle_sizes(&ring_pattern(7, 4)), vec![3, 4]);
        assert_eq!(ring_cycle_sizes(&ring_pattern(5, 2)), vec![2, 3]);
        assert_eq!(ring_cycle_sizes(&ring_pattern(8, 2)), vec![2, 2, 2, 2]);
        // Larger n: 100 processes aim at 25 and 50 (n/4 and n/2 below 16 and 32 only for
        // small n).
        assert_eq!(ring_sizes(100), [2, 4, 8, 25, 50, 100]);
        assert_eq!(ring_sizes(40), [2, 4, 8, 16, 32, 40]);
        assert_eq!(ring_pattern(100, 25).description, "ring-4*25fix");
    }

    #[test]
    fn rings_are_consistent_and_drop_the_duplicate_pong() {
        for n in 1..=8 {
            for s in ring_sizes(n) {
                let p = ring_pattern(n, s);
                assert_consistent(&p);
                assert_eq!(p.accumulation, n as f64);
                for ex in &p.exchanges {
                    let next = ex[0].send_to.unwrap();
                    let prev = ex[0].recv_from.unwrap();
                    assert_eq!(ex.len(), if next == prev { 1 } else { 2 }, "{n} {s}");
                }
            }
        }
        // Two processes: one exchange each, with the other.
        let p = ring_pattern(2, 2);
        assert_eq!(
            p.exchanges[0],
            vec![Exchange {
                send_to: Some(1),
                recv_from: Some(1)
            }]
        );
        // One process: with itself.
        assert_eq!(ring_pattern(1, 1).exchanges[0][0].send_to, Some(0));
    }

    #[test]
    fn drand48_matches_the_c_library() {
        // glibc's srand48(0) then drand48() three times, and srand48(1) then drand48().
        let mut r = Drand48::new(0);
        let got: Vec<f64> = (0..3).map(|_| r.next_f64()).collect();
        let want = [0.170828036106, 0.749901980485, 0.096371655624];
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-11, "{got:?}");
        }
        let mut r = Drand48::new(1);
        assert!((r.next_f64() - 0.041630344772).abs() < 1e-11);
    }

    #[test]
    fn random_orders_are_seeded_permutations() {
        for n in 1..=8 {
            for seed in [0, 1, 1_700_000_000] {
                let mut a = Drand48::new(seed);
                let mut b = Drand48::new(seed);
                for _ in 0..30 {
                    let order = random_order(&mut a, n);
                    assert_eq!(order, random_order(&mut b, n), "same seed, same order");
                    let mut sorted = order.clone();
                    sorted.sort();
                    assert_eq!(sorted, (0..n).collect::<Vec<_>>(), "a permutation");
                    let p = random_pattern(&order);
                    assert_consistent(&p);
                    // One ring through everybody, in the order drawn.
                    for k in 0..n {
                        assert_eq!(p.exchanges[order[k]][0].send_to, Some(order[(k + 1) % n]));
                    }
                }
            }
        }
        // Different seeds give different orders (8! orders, 30 draws).
        let draw = |seed| {
            let mut r = Drand48::new(seed);
            (0..30).map(|_| random_order(&mut r, 8)).collect::<Vec<_>>()
        };
        assert_ne!(draw(1), draw(2));
        // By hand with srand48(0) and n = 4: drand48 gives 0.1708, 0.7499, 0.0964, 0.8705,
        // so ranks 0, 1, 2, 3 take positions 0, 2, then 0 taken -> 1, then 3.
        assert_eq!(random_order(&mut Drand48::new(0), 4), vec![0, 2, 1, 3]);
    }

    #[test]
    fn all_patterns_in_b_eff_order() {
        let p = all_patterns(4, 3, 7);
        let kinds: Vec<PatternKind> = p.iter().map(|p| p.kind).collect();
        assert_eq!(
            kinds,
            [
                [PatternKind::Ring; 6].as_slice(),
                &[PatternKind::Random; 3],
                &[PatternKind::PingPongPair]
            ]
            .concat()
        );
        let pair = p.last().unwrap();
        assert_consistent(pair);
        assert!(pair.sendrecv_only());
        assert_eq!(pair.accumulation, 1.0);
        assert!(pair.exchanges[2].is_empty() && pair.exchanges[3].is_empty());
        assert_eq!(all_patterns(1, 2, 7).len(), 8, "no pair on one process");
    }
}
