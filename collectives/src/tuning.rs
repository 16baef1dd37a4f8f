//! Algorithm selection: every threshold in one place ([`Tuning`]), with defaults chosen by
//! measurement (the module docs below, and `pw-collbench`) and overrides from the
//! environment ([`Tuning::from_env`]):
//!
//! | variable | values |
//! |---|---|
//! | `PAGEWIRE_ALLREDUCE_ALGO` | `auto`, `recursive_doubling`, `rabenseifner`, `ring` |
//! | `PAGEWIRE_BCAST_ALGO` | `auto`, `binomial`, `scatter_allgather` |
//! | `PAGEWIRE_ALLGATHER_ALGO` | `auto`, `recursive_doubling`, `bruck`, `ring` |
//! | `PAGEWIRE_REDUCE_SCATTER_ALGO` | `auto`, `recursive_halving`, `ring` |
//! | `PAGEWIRE_ALLREDUCE_SHORT` | bytes: recursive doubling below (default 1M) |
//! | `PAGEWIRE_ALLREDUCE_SHORT_LOCAL` | the same among ranks that all share a host, on powers of two (default 16K) |
//! | `PAGEWIRE_ALLREDUCE_RING` | bytes: the ring from here (default 2M); Rabenseifner in between, on powers of two only |
//! | `PAGEWIRE_BCAST_LONG` | bytes: scatter+allgather from here (default 4M) … |
//! | `PAGEWIRE_BCAST_LONG_RANKS` | … on at least this many ranks (default 5) |
//! | `PAGEWIRE_ALLGATHER_SHORT` | bytes gathered in total: recursive doubling or Bruck below, ring from here (default 1M) |
//! | `PAGEWIRE_REDUCE_SCATTER_RING` | bytes in total: ring from here, recursive halving below (default 2M) |
//!
//! Byte values take `K`, `M` and `G` suffixes. Every rank must see the same settings:
//! the ranks choose independently, and different choices are reported as a mismatch.
//!
//! # How the defaults were chosen
//!
//! With `pw-collbench` (`f32` sums; the best of 3 runs of IMB's repetition count), copy
//! mode, on the 2-core development machine, 2 ranks on their own cores and 3, 4 and 8 ranks
//! oversubscribed (so those figures carry scheduling noise of up to 2x):
//!
//! - Allreduce: recursive doubling was fastest up to 1 MiB on 2 and 4 ranks (2 ranks,
//!   1 MiB: 293 µs against 299 Rabenseifner and 313 ring; 4 ranks: 3340 / 3382 / 4086 µs).
//!   From 2 MiB the ring won (2 ranks, 4 MiB: 1706 µs ring, 1852 Rabenseifner, 1993
//!   recursive doubling; 4 ranks, 2 MiB: 5083 / 5940 / 8918 and 3453 / 4808 in a second
//!   series). Rabenseifner keeps the band in between on powers of two; elsewhere its fold
//!   moves the whole vector twice more, so the ring takes over at once. Those runs were on
//!   the soft NIC; among ranks that share a host the local path moves a large message by
//!   one CMA copy, and there Rabenseifner won from 32 KiB (`imb-bench Allreduce` under
//!   `pwrun -n 2`, `PAGEWIRE_ALLREDUCE_ALGO` forced, two runs: 32 KiB 7.7 µs against 12.1
//!   recursive doubling, 64 KiB 17.0-17.9 against 20.7-20.9, 256 KiB 42-46 against 58-60,
//!   1 MiB 195-204 against 262-274; 16 KiB 4.1-4.2 against 3.7; 4 ranks on 2 cores: 32 KiB
//!   24 against 31, 1 MiB 559 against 797), hence `allreduce_short_local`. With the local
//!   eager limit at 8 KiB, Rabenseifner's halves of a 16 KiB vector go eagerly, and it won
//!   there too with `-off_cache -1` (four alternating runs: 6.8-7.8 µs against 9.3-10.0;
//!   MPICH 7.6-8.3), though not warm (4.0-4.4 against 3.3-3.6; MPICH 5.0-5.8): the default
//!   is 16 KiB, where both are below MPICH's time.
//! - Broadcast: the binomial tree won at every size on 2, 3 and 4 ranks (4 ranks, 4 MiB:
//!   5527 µs against 6082); on 8 ranks scatter+allgather won at 4 MiB (32.9 ms against
//!   37.5) but not at 1 MiB (14.7 against 8.6).
//! - Allgather: on 4 ranks recursive doubling won up to 1 MiB gathered (2181 µs against
//!   2708 ring at 256 KiB per rank) and the ring above (4617 against 6441 at 1 MiB per
//!   rank); on 3 ranks Bruck's algorithm has as many steps as the ring plus a copy and the
//!   ring won, so Bruck runs from 5 ranks on.
//! - Reduce-scatter: recursive halving won up to 1 MiB on 4 ranks (1476 µs against 2357),
//!   the ring at 4 MiB (13.7 ms against 19.6).
//!
//! These thresholds are much higher than MPICH's (tens of KiB): here a message costs a
//! system call and a rendezvous several round trips of the soft NIC, so fewer, larger
//! messages win longer. On an RDMA network, lower them with the variables above.
//!
//! A forced algorithm is honoured when it is correct: a non-commutative operation always
//! gets an order-preserving algorithm, and recursive doubling for allgather needs a power of
//! two (Bruck runs otherwise).

use pagewire_transport::env;

use crate::{Error, Result};

/// Allreduce algorithms.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AllreduceAlgo {
    /// Choose by size and rank count.
    Auto,
    /// Recursive doubling (small messages; order-preserving).
    RecursiveDoubling,
    /// Rabenseifner's reduce-scatter (recursive halving) + allgather (recursive doubling).
    Rabenseifner,
    /// Ring reduce-scatter + ring allgather.
    Ring,
}

/// Broadcast algorithms.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BcastAlgo {
    /// Choose by size and rank count.
    Auto,
    /// Binomial tree.
    Binomial,
    /// Binomial scatter + ring allgather (van de Geijn).
    ScatterAllgather,
}

/// Allgather algorithms.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AllgatherAlgo {
    /// Choose by size and rank count.
    Auto,
    /// Recursive doubling (powers of two; Bruck otherwise).
    RecursiveDoubling,
    /// Bruck's algorithm (any rank count).
    Bruck,
    /// Ring.
    Ring,
}

/// Reduce-scatter algorithms (commutative operations; non-commutative ones reduce to rank 0
/// in rank order and scatter).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceScatterAlgo {
    /// Choose by size.
    Auto,
    /// Recursive halving (with the power-of-two fold).
    RecursiveHalving,
    /// Ring (pairwise) reduce-scatter.
    Ring,
}

/// Thresholds and forced choices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tuning {
    /// `PAGEWIRE_ALLREDUCE_ALGO`.
    pub allreduce: AllreduceAlgo,
    /// `PAGEWIRE_BCAST_ALGO`.
    pub bcast: BcastAlgo,
    /// `PAGEWIRE_ALLGATHER_ALGO`.
    pub allgather: AllgatherAlgo,
    /// `PAGEWIRE_REDUCE_SCATTER_ALGO`.
    pub reduce_scatter: ReduceScatterAlgo,
    /// Allreduce messages shorter than this (bytes) use recursive doubling.
    pub allreduce_short: usize,
    /// The same among ranks that all share a host, on a power of two of them: there a
    /// large message is one copy by the receiver (CMA), and halving what each rank copies
    /// and reduces pays from a few times the eager limit.
    pub allreduce_short_local: usize,
    /// Allreduce messages at least this long (bytes) use the ring; so do all of at least
    /// `allreduce_short` bytes when the rank count is not a power of two (Rabenseifner's
    /// fold would move the whole vector twice more).
    pub allreduce_ring: usize,
    /// Broadcasts at least this long (bytes) use scatter+allgather on at least
    /// `bcast_long_ranks` ranks.
    pub bcast_long: usize,
    /// See `bcast_long`.
    pub bcast_long_ranks: usize,
    /// Allgathers whose result is shorter than this (bytes) use recursive doubling (powers
    /// of two) or Bruck; longer ones the ring.
    pub allgather_short: usize,
    /// Reduce-scatters of at least this many bytes in total use the ring.
    pub reduce_scatter_ring: usize,
}

impl Default for Tuning {
    /// The measured defaults (how they were chosen: the module docs above).
    fn default() -> Self {
        Tuning {
            allreduce: AllreduceAlgo::Auto,
            bcast: BcastAlgo::Auto,
            allgather: AllgatherAlgo::Auto,
            reduce_scatter: ReduceScatterAlgo::Auto,
            allreduce_short: 1 << 20,
            allreduce_short_local: 16 << 10,
            allreduce_ring: 2 << 20,
            bcast_long: 4 << 20,
            bcast_long_ranks: 5,
            allgather_short: 1 << 20,
            reduce_scatter_ring: 2 << 20,
        }
    }
}

fn env_choice<T: Copy>(name: &str, choices: &[(&str, T)], default: T) -> Result<T> {
    match std::env::var(name) {
        Err(_) => Ok(default),
        Ok(v) if v.is_empty() => Ok(default),
        Ok(v) => choices
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(v.trim()))
            .map(|&(_, t)| t)
            .ok_or_else(|| {
                let names: Vec<&str> = choices.iter().map(|(n, _)| *n).collect();
                Error::invalid_setting(name, &v, format!("expected {}", names.join(", ")))
            }),
    }
}

/// A byte count from variable `name`, `default` when unset.
fn env_bytes(name: &str, default: usize) -> Result<usize> {
    Ok(env::bytes(name)?.unwrap_or(default))
}

impl Tuning {
    /// The defaults overridden by the `PAGEWIRE_*` variables in the module documentation.
    pub fn from_env() -> Result<Tuning> {
        let d = Tuning::default();
        Ok(Tuning {
            allreduce: env_choice(
                "PAGEWIRE_ALLREDUCE_ALGO",
                &[
                    ("auto", AllreduceAlgo::Auto),
                    ("recursive_doubling", AllreduceAlgo::RecursiveDoubling),
                    ("rabenseifner", AllreduceAlgo::Rabenseifner),
                    ("ring", AllreduceAlgo::Ring),
                ],
                d.allreduce,
            )?,
            bcast: env_choice(
                "PAGEWIRE_BCAST_ALGO",
                &[
                    ("auto", BcastAlgo::Auto),
                    ("binomial", BcastAlgo::Binomial),
                    ("scatter_allgather", BcastAlgo::ScatterAllgather),
                ],
                d.bcast,
            )?,
            allgather: env_choice(
                "PAGEWIRE_ALLGATHER_ALGO",
                &[
                    ("auto", AllgatherAlgo::Auto),
                    ("recursive_doubling", AllgatherAlgo::RecursiveDoubling),
                    ("bruck", AllgatherAlgo::Bruck),
                    ("ring", AllgatherAlgo::Ring),
                ],
                d.allgather,
            )?,
            reduce_scatter: env_choice(
                "PAGEWIRE_REDUCE_SCATTER_ALGO",
                &[
                    ("auto", ReduceScatterAlgo::Auto),
                    ("recursive_halving", ReduceScatterAlgo::RecursiveHalving),
                    ("ring", ReduceScatterAlgo::Ring),
                ],
                d.reduce_scatter,
            )?,
            allreduce_short: env_bytes("PAGEWIRE_ALLREDUCE_SHORT", d.allreduce_short)?,
            allreduce_short_local: env_bytes(
                "PAGEWIRE_ALLREDUCE_SHORT_LOCAL",
                d.allreduce_short_local,
            )?,
            allreduce_ring: env_bytes("PAGEWIRE_ALLREDUCE_RING", d.allreduce_ring)?,
            bcast_long: env_bytes("PAGEWIRE_BCAST_LONG", d.bcast_long)?,
            bcast_long_ranks: match std::env::var("PAGEWIRE_BCAST_LONG_RANKS") {
                Err(_) => d.bcast_long_ranks,
                Ok(v) => v.trim().parse().map_err(|_| {
                    Error::invalid_setting(
                        "PAGEWIRE_BCAST_LONG_RANKS",
                        &v,
                        "expected a number of ranks",
                    )
                })?,
            },
            allgather_short: env_bytes("PAGEWIRE_ALLGATHER_SHORT", d.allgather_short)?,
            reduce_scatter_ring: env_bytes("PAGEWIRE_REDUCE_SCATTER_RING", d.reduce_scatter_ring)?,
        })
    }

    /// The allreduce algorithm for `bytes` on `p` ranks.
    pub fn allreduce_algo(
        &self,
        bytes: usize,
        p: usize,
        commutative: bool,
        local: bool,
    ) -> AllreduceAlgo {
        if !commutative {
            return AllreduceAlgo::RecursiveDoubling;
        }
        let short = if local && p.is_power_of_two() {
            self.allreduce_short_local
        } else {
            self.allreduce_short
        };
        match self.allreduce {
            AllreduceAlgo::Auto => {
                if bytes < short {
                    AllreduceAlgo::RecursiveDoubling
                } else if !p.is_power_of_two() || bytes >= self.allreduce_ring {
                    AllreduceAlgo::Ring
                } else {
                    AllreduceAlgo::Rabenseifner
                }
            }
            forced => forced,
        }
    }

    /// The broadcast algorithm for `bytes` on `p` ranks.
    pub fn bcast_algo(&self, bytes: usize, p: usize) -> BcastAlgo {
        match self.bcast {
            BcastAlgo::Auto => {
                if p >= self.bcast_long_ranks.max(2) && bytes >= self.bcast_long {
                    BcastAlgo::ScatterAllgather
                } else {
                    BcastAlgo::Binomial
                }
            }
            forced => forced,
        }
    }

    /// The allgather algorithm for a result of `total_bytes` on `p` ranks.
    pub fn allgather_algo(&self, total_bytes: usize, p: usize) -> AllgatherAlgo {
        match self.allgather {
            AllgatherAlgo::Auto => {
                if total_bytes >= self.allgather_short {
                    AllgatherAlgo::Ring
                } else if p.is_power_of_two() {
                    AllgatherAlgo::RecursiveDoubling
                } else if p >= 5 {
                    // ⌈log₂ p⌉ steps against the ring's p - 1: fewer from 5 ranks on.
                    AllgatherAlgo::Bruck
                } else {
                    AllgatherAlgo::Ring
                }
            }
            AllgatherAlgo::RecursiveDoubling if !p.is_power_of_two() => AllgatherAlgo::Bruck,
            forced => forced,
        }
    }

    /// The reduce-scatter algorithm for `total_bytes` (commutative operations).
    pub fn reduce_scatter_algo(&self, total_bytes: usize) -> ReduceScatterAlgo {
        match self.reduce_scatter {
            ReduceScatterAlgo::Auto => {
                if total_bytes >= self.reduce_scatter_ring {
                    ReduceScatterAlgo::Ring
                } else {
                    ReduceScatterAlgo::RecursiveHalving
                }
            }
            forced => forced,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selection_follows_the_thresholds() {
        let t = Tuning::default();
        use AllreduceAlgo as A;
        let ar = |bytes, p| t.allreduce_algo(bytes, p, true, false);
        assert_eq!(ar(8, 4), A::RecursiveDoubling);
        assert_eq!(ar(t.allreduce_short - 1, 6), A::RecursiveDoubling);
        assert_eq!(ar(t.allreduce_short, 4), A::Rabenseifner);
        assert_eq!(ar(t.allreduce_short, 2), A::Rabenseifner);
        assert_eq!(ar(t.allreduce_ring - 1, 8), A::Rabenseifner);
        assert_eq!(ar(t.allreduce_short, 6), A::Ring);
        assert_eq!(ar(t.allreduce_ring, 8), A::Ring);
        assert_eq!(ar(64 << 20, 2), A::Ring);
        assert_eq!(
            t.allreduce_algo(64 << 20, 6, false, false),
            A::RecursiveDoubling
        );
        // Ranks of one host: Rabenseifner from allreduce_short_local on powers of two.
        let local = |bytes, p| t.allreduce_algo(bytes, p, true, true);
        assert_eq!(local(t.allreduce_short_local - 1, 2), A::RecursiveDoubling);
        assert_eq!(local(t.allreduce_short_local, 2), A::Rabenseifner);
        assert_eq!(local(t.allreduce_short_local, 4), A::Rabenseifner);
        assert_eq!(local(t.allreduce_short_local, 6), A::RecursiveDoubling);
        assert_eq!(local(t.allreduce_ring, 2), A::Ring);
        let forced = Tuning {
            allreduce: A::Ring,
            ..t
        };
        assert_eq!(forced.allreduce_algo(8, 4, true, false), A::Ring);
        assert_eq!(
            forced.allreduce_algo(8, 4, false, false),
            A::RecursiveDoubling
        );

        use BcastAlgo as B;
        assert_eq!(t.bcast_algo(t.bcast_long, 2), B::Binomial);
        assert_eq!(t.bcast_algo(t.bcast_long, 4), B::Binomial);
        assert_eq!(t.bcast_algo(t.bcast_long - 1, 5), B::Binomial);
        assert_eq!(t.bcast_algo(t.bcast_long, 5), B::ScatterAllgather);
        let few = Tuning {
            bcast_long_ranks: 0,
            ..t
        };
        assert_eq!(few.bcast_algo(few.bcast_long, 2), B::ScatterAllgather);

        use AllgatherAlgo as G;
        assert_eq!(t.allgather_algo(100, 8), G::RecursiveDoubling);
        assert_eq!(t.allgather_algo(100, 7), G::Bruck);
        assert_eq!(t.allgather_algo(100, 3), G::Ring);
        assert_eq!(t.allgather_algo(t.allgather_short, 7), G::Ring);
        assert_eq!(t.allgather_algo(t.allgather_short, 8), G::Ring);
        let forced = Tuning {
            allgather: G::RecursiveDoubling,
            ..t
        };
        assert_eq!(forced.allgather_algo(1 << 30, 6), G::Bruck);
        assert_eq!(forced.allgather_algo(1 << 30, 4), G::RecursiveDoubling);

        use ReduceScatterAlgo as R;
        assert_eq!(
            t.reduce_scatter_algo(t.reduce_scatter_ring - 1),
            R::RecursiveHalving
        );
        assert_eq!(t.reduce_scatter_algo(t.reduce_scatter_ring), R::Ring);
    }

    #[test]
    fn environment_overrides_and_rejects_nonsense() {
        // One test touches the environment, so no other test races with it.
        std::env::set_var("PAGEWIRE_ALLREDUCE_ALGO", "ring");
        std::env::set_var("PAGEWIRE_BCAST_LONG", "64K");
        let t = Tuning::from_env().unwrap();
        assert_eq!(t.allreduce, AllreduceAlgo::Ring);
        assert_eq!(t.bcast_long, 64 << 10);
        std::env::set_var("PAGEWIRE_ALLREDUCE_ALGO", "fastest");
        let e = Tuning::from_env().unwrap_err().to_string();
        assert!(e.contains("PAGEWIRE_ALLREDUCE_ALGO=fastest") && e.contains("rabenseifner"));
        std::env::remove_var("PAGEWIRE_ALLREDUCE_ALGO");
        std::env::set_var("PAGEWIRE_BCAST_LONG", "lots");
        assert!(matches!(
            Tuning::from_env(),
            Err(Error::System(pagewire_transport::sys::Error::InvalidSetting { variable, .. })) if variable == "PAGEWIRE_BCAST_LONG"
        ));
        std::env::remove_var("PAGEWIRE_BCAST_LONG");
        std::env::set_var("PAGEWIRE_BCAST_LONG_RANKS", "3");
        assert_eq!(Tuning::from_env().unwrap().bcast_long_ranks, 3);
        std::env::remove_var("PAGEWIRE_BCAST_LONG_RANKS");
        assert_eq!(Tuning::from_env().unwrap(), Tuning::default());
    }
}
