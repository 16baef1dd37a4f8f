//! The 18 benchmarks of IMB-MPI1 and the 17 of IMB-RMA, each suite in IMB's order, with
//! what IMB's tables need to know about each: its type (which sets the columns and who takes
//! part), time and bandwidth factors, buffer lengths, and for IMB-RMA its aggregation
//! modes.

use serde::{Deserialize, Serialize};

use crate::settings::ASSIGN_SIZE;

/// An IMB-MPI1 or IMB-RMA benchmark.
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
    /// IMB-RMA: rank 0 puts into rank 1's window under a shared lock.
    #[serde(rename = "Unidir_put")]
    UnidirPut,
    /// IMB-RMA: ranks 0 and 1 put into each other's window at once.
    #[serde(rename = "Bidir_put")]
    BidirPut,
    /// IMB-RMA: rank 0 gets from rank 1's window.
    #[serde(rename = "Unidir_get")]
    UnidirGet,
    /// IMB-RMA: ranks 0 and 1 get from each other's window at once.
    #[serde(rename = "Bidir_get")]
    BidirGet,
    /// IMB-RMA: Unidir_put completed locally only (`MPI_Win_flush_local`).
    #[serde(rename = "Put_local")]
    PutLocal,
    /// IMB-RMA: rank 0 puts to every other rank, local completion once at the end.
    #[serde(rename = "Put_all_local")]
    PutAllLocal,
    /// IMB-RMA: rank 0 puts to every other rank, `MPI_Win_flush_all` at the end.
    #[serde(rename = "One_put_all")]
    OnePutAll,
    /// IMB-RMA: every rank puts to every other rank.
    #[serde(rename = "All_put_all")]
    AllPutAll,
    /// IMB-RMA: rank 0 gets from every other rank.
    #[serde(rename = "One_get_all")]
    OneGetAll,
    /// IMB-RMA: every rank gets from every other rank.
    #[serde(rename = "All_get_all")]
    AllGetAll,
    /// IMB-RMA: each rank puts to both ring neighbours, flushing each repetition.
    #[serde(rename = "Exchange_put")]
    ExchangePut,
    /// IMB-RMA: each rank gets from both ring neighbours.
    #[serde(rename = "Exchange_get")]
    ExchangeGet,
    /// IMB-RMA: `MPI_Accumulate` of floats, `MPI_SUM`, rank 0 into rank 1.
    Accumulate,
    /// IMB-RMA: `MPI_Get_accumulate` of floats, `MPI_SUM`.
    #[serde(rename = "Get_accumulate")]
    GetAccumulate,
    /// IMB-RMA: `MPI_Fetch_and_op` of one float, `MPI_SUM`.
    #[serde(rename = "Fetch_and_op")]
    FetchAndOp,
    /// IMB-RMA: `MPI_Compare_and_swap` of one int.
    #[serde(rename = "Compare_and_swap")]
    CompareAndSwap,
    /// IMB-RMA: a put while the target waits in a barrier (`t_pure`) and while it computes
    /// (`t_ovrl`): whether puts progress without the target.
    #[serde(rename = "Truly_passive_put")]
    TrulyPassivePut,
}

/// IMB-RMA's aggregation modes (a table for each, non-aggregate first).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Aggregation {
    /// A flush after every operation (IMB's `MODE: NON-AGGREGATE`).
    NonAggregate,
    /// All repetitions' operations, then one flush (IMB's `MODE: AGGREGATE`).
    Aggregate,
}

impl Aggregation {
    /// IMB's name of the mode.
    pub fn name(self) -> &'static str {
        match self {
            Aggregation::NonAggregate => "NON-AGGREGATE",
            Aggregation::Aggregate => "AGGREGATE",
        }
    }
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
    /// IMB-RMA's single transfers between ranks 0 and 1 (and its single-element atomics):
    /// `t[usec]` (the slower origin's) and `Mbytes/sec`.
    RmaPair,
    /// IMB-RMA's one origin (rank 0) to every other rank: `t[usec]` and `Mbytes/sec`.
    RmaOneToAll,
    /// IMB-RMA's every rank an origin: `t_min/t_max/t_avg`, no bandwidth.
    RmaAllToAll,
    /// IMB-RMA's Truly_passive_put: `t_pure` and `t_ovrl`.
    RmaOverlap,
}

impl Kind {
    /// Whether the benchmark runs on ranks 0 and 1 only.
    pub fn is_pair(self) -> bool {
        matches!(
            self,
            Kind::SingleTransfer | Kind::RmaPair | Kind::RmaOverlap
        )
    }

    /// Whether it is one of IMB-RMA's.
    pub fn is_rma(self) -> bool {
        matches!(
            self,
            Kind::RmaPair | Kind::RmaOneToAll | Kind::RmaAllToAll | Kind::RmaOverlap
        )
    }
}

impl Benchmark {
    /// IMB-RMA's 17 benchmarks in the order IMB-RMA 2021 runs them (its C++ driver's; not
    /// the order its documentation lists).
    pub const RMA: [Benchmark; 17] = [
        Benchmark::UnidirPut,
        Benchmark::BidirPut,
        Benchmark::UnidirGet,
        Benchmark::BidirGet,
        Benchmark::PutLocal,
        Benchmark::PutAllLocal,
        Benchmark::OnePutAll,
        Benchmark::AllPutAll,
        Benchmark::OneGetAll,
        Benchmark::AllGetAll,
        Benchmark::ExchangePut,
        Benchmark::ExchangeGet,
        Benchmark::Accumulate,
        Benchmark::GetAccumulate,
        Benchmark::FetchAndOp,
        Benchmark::CompareAndSwap,
        Benchmark::TrulyPassivePut,
    ];

    /// IMB-MPI1's 18 benchmarks, in IMB's order (the default selection).
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
            Benchmark::UnidirPut => "Unidir_put",
            Benchmark::BidirPut => "Bidir_put",
            Benchmark::UnidirGet => "Unidir_get",
            Benchmark::BidirGet => "Bidir_get",
            Benchmark::PutLocal => "Put_local",
            Benchmark::PutAllLocal => "Put_all_local",
            Benchmark::OnePutAll => "One_put_all",
            Benchmark::AllPutAll => "All_put_all",
            Benchmark::OneGetAll => "One_get_all",
            Benchmark::AllGetAll => "All_get_all",
            Benchmark::ExchangePut => "Exchange_put",
            Benchmark::ExchangeGet => "Exchange_get",
            Benchmark::Accumulate => "Accumulate",
            Benchmark::GetAccumulate => "Get_accumulate",
            Benchmark::FetchAndOp => "Fetch_and_op",
            Benchmark::CompareAndSwap => "Compare_and_swap",
            Benchmark::TrulyPassivePut => "Truly_passive_put",
        }
    }

    /// The benchmark named `name`, case-insensitive (as IMB).
    pub fn from_name(name: &str) -> Option<Benchmark> {
        Benchmark::ALL
            .into_iter()
            .chain(Benchmark::RMA)
            .find(|b| b.name().eq_ignore_ascii_case(name))
    }

    /// IMB's type of the benchmark.
    pub fn kind(self) -> Kind {
        match self {
            Benchmark::PingPong | Benchmark::PingPing => Kind::SingleTransfer,
            Benchmark::Sendrecv | Benchmark::Exchange => Kind::ParallelTransfer,
            Benchmark::Barrier => Kind::Sync,
            Benchmark::UnidirPut
            | Benchmark::BidirPut
            | Benchmark::UnidirGet
            | Benchmark::BidirGet
            | Benchmark::PutLocal
            | Benchmark::Accumulate
            | Benchmark::GetAccumulate
            | Benchmark::FetchAndOp
            | Benchmark::CompareAndSwap => Kind::RmaPair,
            Benchmark::PutAllLocal | Benchmark::OnePutAll | Benchmark::OneGetAll => {
                Kind::RmaOneToAll
            }
            Benchmark::AllPutAll
            | Benchmark::AllGetAll
            | Benchmark::ExchangePut
            | Benchmark::ExchangeGet => Kind::RmaAllToAll,
            Benchmark::TrulyPassivePut => Kind::RmaOverlap,
            _ => Kind::Collective,
        }
    }

    /// IMB-RMA's aggregation modes of the benchmark, in the order its tables come (`None`:
    /// one table without a mode line).
    pub fn aggregations(self) -> &'static [Option<Aggregation>] {
        match self.kind() {
            Kind::RmaPair => &[
                Some(Aggregation::NonAggregate),
                Some(Aggregation::Aggregate),
            ],
            _ => &[None],
        }
    }

    /// The one size IMB runs a single-element benchmark with (`Fetch_and_op`,
    /// `Compare_and_swap`: one 4-byte element), if it is one.
    pub fn single_element(self) -> Option<usize> {
        matches!(self, Benchmark::FetchAndOp | Benchmark::CompareAndSwap).then_some(4)
    }

    /// Reductions work on floats: sizes below one float are left out (size 0 is kept).
    pub fn is_reduction(self) -> bool {
        matches!(
            self,
            Benchmark::Allreduce
                | Benchmark::Reduce
                | Benchmark::ReduceScatter
                | Benchmark::ReduceScatterBlock
                | Benchmark::Accumulate
                | Benchmark::GetAccumulate
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
            // IMB-RMA 2021 prints size / t for these, also for One_put_all and the like
            // (its multiplier by the number of targets is set before the process count is
            // known, and stays 1).
            b if matches!(b.kind(), Kind::RmaPair | Kind::RmaOneToAll) => Some(1.0),
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
            Benchmark::ExchangePut | Benchmark::ExchangeGet => (2 * init, 2 * init),
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
