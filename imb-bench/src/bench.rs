//! The 18 benchmarks of IMB-MPI1, in IMB's order, with what IMB's tables need to know about
//! each: its type (which sets the columns), time and bandwidth factors, and buffer lengths.

use serde::{Deserialize, Serialize};

use crate::settings::ASSIGN_SIZE;

/// An IMB-MPI1 benchmark.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Benchmark {
    /// `MPI_Send` + `MPI_Recv` back and forth between two processes; half the round trip.
    PingPong,
    /// Both processes `MPI_Isend` + `MPI_Recv` + `MPI_Wait` at the same time.
    PingPing,
    /// Ring: each process sends to the right and receives from the left.
    Sendrecv,
    /// Each process sends to and receives from both neighbours of a ring.
    Exchange,
    /// `MPI_Allreduce` of floats, `MPI_SUM`.
    Allreduce,
    /// `MPI_Reduce` to rank 0.
    Reduce,
    /// `MPI_Reduce_scatter`: the vector split among the processes.
    #[serde(rename = "Reduce_scatter")]
    ReduceScatter,
    /// `MPI_Reduce_scatter_block`: a block of the message size per process.
    #[serde(rename = "Reduce_scatter_block")]
    ReduceScatterBlock,
    /// `MPI_Allgather`.
    Allgather,
    /// `MPI_Allgatherv` (equal counts).
    Allgatherv,
    /// `MPI_Gather` to rank 0.
    Gather,
    /// `MPI_Gatherv` to rank 0 (equal counts).
    Gatherv,
    /// `MPI_Scatter` from rank 0.
    Scatter,
    /// `MPI_Scatterv` from rank 0 (equal counts).
    Scatterv,
    /// `MPI_Alltoall`.
    Alltoall,
    /// `MPI_Alltoallv` (equal counts).
    Alltoallv,
    /// `MPI_Bcast` from rank 0.
    Bcast,
    /// `MPI_Barrier`.
    Barrier,
}

/// IMB's benchmark types, which decide the table's columns and who takes part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Two processes (PingPong, PingPing): `t[usec]` (the slower one's) and `Mbytes/sec`.
    SingleTransfer,
    /// All processes pairwise (Sendrecv, Exchange): `t_min/t_max/t_avg` and `Mbytes/sec`.
    ParallelTransfer,
    /// Collectives: `t_min/t_max/t_avg`.
    Collective,
    /// Barrier: no size column.
    Sync,
}

impl Benchmark {
    /// Every benchmark, in IMB's order (the default selection).
    pub const ALL: [Benchmark; 18] = [
        Benchmark::PingPong,
        Benchmark::PingPing,
        Benchmark::Sendrecv,
        Benchmark::Exchange,
        Benchmark::Allreduce,
        Benchmark::Reduce,
        Benchmark::ReduceScatter,
        Benchmark::ReduceScatterBlock,
        Benchmark::Allgather,
        Benchmark::Allgatherv,
        Benchmark::Gather,
        Benchmark::Gatherv,
        Benchmark::Scatter,
        Benchmark::Scatterv,
        Benchmark::Alltoall,
        Benchmark::Alltoallv,
        Benchmark::Bcast,
        Benchmark::Barrier,
    ];

    /// IMB's name.
    pub fn name(self) -> &'static str {
        match self {
            Benchmark::PingPong => "PingPong",
            Benchmark::PingPing => "PingPing",
            Benchmark::Sendrecv => "Sendrecv",
            Benchmark::Exchange => "Exchange",
            Benchmark::Allreduce => "Allreduce",
            Benchmark::Reduce => "Reduce",
            Benchmark::ReduceScatter => "Reduce_scatter",
            Benchmark::ReduceScatterBlock => "Reduce_scatter_block",
            Benchmark::Allgather => "Allgather",
            Benchmark::Allgatherv => "Allgatherv",
            Benchmark::Gather => "Gather",
            Benchmark::Gatherv => "Gatherv",
            Benchmark::Scatter => "Scatter",
            Benchmark::Scatterv => "Scatterv",
            Benchmark::Alltoall => "Alltoall",
            Benchmark::Alltoallv => "Alltoallv",
            Benchmark::Bcast => "Bcast",
            Benchmark::Barrier => "Barrier",
        }
    }

    /// The benchmark named `name`, case-insensitive (as IMB).
    pub fn from_name(name: &str) -> Option<Benchmark> {
        Benchmark::ALL
            .into_iter()
            .find(|b| b.name().eq_ignore_ascii_case(name))
    }

    /// IMB's type of the benchmark.
    pub fn kind(self) -> Kind {
        match self {
            Benchmark::PingPong | Benchmark::PingPing => Kind::SingleTransfer,
            Benchmark::Sendrecv | Benchmark::Exchange => Kind::ParallelTransfer,
            Benchmark::Barrier => Kind::Sync,
            _ => Kind::Collective,
        }
    }

    /// Reductions work on floats: sizes below one float are left out (size 0 is kept).
    pub fn is_reduction(self) -> bool {
        matches!(
            self,
            Benchmark::Allreduce
                | Benchmark::Reduce
                | Benchmark::ReduceScatter
                | Benchmark::ReduceScatterBlock
        )
    }

    /// Whether this benchmark runs messages of `size` bytes.
    pub fn runs_size(self, size: usize) -> bool {
        !self.is_reduction() || size == 0 || size >= ASSIGN_SIZE
    }

    /// IMB's time factor: PingPong reports half the round trip.
    pub fn time_scale(self) -> f64 {
        match self {
            Benchmark::PingPong => 0.5,
            _ => 1.0,
        }
    }

    /// IMB's bandwidth factor (bytes moved per process and repetition, in message sizes):
    /// 2 for Sendrecv, 4 for Exchange, 1 for PingPong and PingPing; `None` where IMB's
    /// table has no bandwidth column.
    pub fn bandwidth_scale(self) -> Option<f64> {
        match self {
            Benchmark::PingPong | Benchmark::PingPing => Some(1.0),
            Benchmark::Sendrecv => Some(2.0),
            Benchmark::Exchange => Some(4.0),
            _ => None,
        }
    }

    /// Whether `-off_cache` rotates this benchmark's buffers (all but Barrier, as IMB).
    pub fn uses_off_cache(self) -> bool {
        self.kind() != Kind::Sync
    }

    /// Send and receive buffer lengths for messages of `size` bytes on `np` processes, as
    /// IMB allocates them (`size` rounded up to at least one float first).
    pub fn buffer_lengths(self, size: usize, np: usize) -> (usize, usize) {
        let init = size.max(ASSIGN_SIZE);
        match self {
            Benchmark::Alltoall | Benchmark::Alltoallv => (np * init, np * init),
            Benchmark::Allgather
            | Benchmark::Allgatherv
            | Benchmark::Gather
            | Benchmark::Gatherv => (init, np * init),
            Benchmark::Exchange => (2 * init, init),
            Benchmark::Scatter | Benchmark::Scatterv | Benchmark::ReduceScatterBlock => {
                (np * init, init)
            }
            Benchmark::Barrier => (0, 0),
            _ => (init, init),
        }
    }
}

impl std::fmt::Display for Benchmark {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The floats each of `np` processes gets of a `count`-float vector in Reduce_scatter:
/// equal shares, the first `count % np` processes one more.
pub fn reduce_scatter_counts(count: usize, np: usize) -> Vec<usize> {
    (0..np)
        .map(|i| count / np + usize::from(i < count % np))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_imbs_and_case_insensitive() {
        assert_eq!(Benchmark::ALL.len(), 18);
        assert_eq!(Benchmark::from_name("pingpong"), Some(Benchmark::PingPong));
        assert_eq!(
            Benchmark::from_name("REDUCE_SCATTER_BLOCK"),
            Some(Benchmark::ReduceScatterBlock)
        );
        assert_eq!(Benchmark::from_name("Uniband"), None);
        for b in Benchmark::ALL {
            assert_eq!(Benchmark::from_name(b.name()), Some(b));
        }
        assert_eq!(
            serde_json::to_string(&Benchmark::ReduceScatter).unwrap(),
            "\"Reduce_scatter\""
        );
    }

    #[test]
    fn factors_and_lengths() {
        assert_eq!(Benchmark::PingPong.time_scale(), 0.5);
        assert_eq!(Benchmark::Exchange.bandwidth_scale(), Some(4.0));
        assert_eq!(Benchmark::Sendrecv.bandwidth_scale(), Some(2.0));
        assert_eq!(Benchmark::Bcast.bandwidth_scale(), None);
        assert!(!Benchmark::Allreduce.runs_size(2));
        assert!(Benchmark::Allreduce.runs_size(0));
        assert!(Benchmark::Bcast.runs_size(1));
        assert_eq!(Benchmark::Gather.buffer_lengths(0, 4), (4, 16));
        assert_eq!(Benchmark::Exchange.buffer_lengths(1024, 2), (2048, 1024));
        assert_eq!(reduce_scatter_counts(10, 4), [3, 3, 2, 2]);
        assert_eq!(reduce_scatter_counts(0, 3), [0, 0, 0]);
    }
}
