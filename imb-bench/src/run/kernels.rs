//! IMB's kernels: one repetition of each benchmark (point-to-point and collective) and the
//! timed loop around them.

use pagewire::datatype::{Partition, PartitionMut};
use pagewire::traits::*;
use pagewire::{request, SimpleCommunicator, SystemOperation};

use super::Buffers;
use crate::bench::{reduce_scatter_counts, Benchmark, Kind};
use crate::settings::N_BARRIERS;

fn barriers(comm: &SimpleCommunicator, n: usize) {
    for _ in 0..n {
        comm.barrier();
    }
}

/// Runs `n` repetitions of `b` and returns this process's seconds per repetition, timed as
/// IMB times it: point-to-point benchmarks and Barrier around the whole loop, collectives
/// around each call with a barrier between calls (IMB's `-sync 1`). Two barriers first.
pub(super) fn kernel(
    b: Benchmark,
    comm: &SimpleCommunicator,
    bufs: &mut Buffers,
    size: usize,
    n: usize,
) -> f64 {
    let np = comm.size() as usize;
    let me = comm.rank() as usize;
    let n = n.max(1);
    barriers(comm, N_BARRIERS);
    match b.kind() {
        Kind::SingleTransfer | Kind::ParallelTransfer | Kind::Sync => {
            let t0 = pagewire::time();
            for i in 0..n {
                point_to_point_once(b, comm, bufs, size, i, np, me);
            }
            (pagewire::time() - t0) / n as f64
        }
        Kind::Collective => {
            let mut total = 0.0;
            for i in 0..n {
                let t0 = pagewire::time();
                collective_once(b, comm, bufs, size, i, np, me);
                total += pagewire::time() - t0;
                comm.barrier();
            }
            total / n as f64
        }
        k => unreachable!("{b} is an IMB-RMA benchmark ({k:?}): rma_kernels.rs runs it"),
    }
}

fn point_to_point_once(
    b: Benchmark,
    comm: &SimpleCommunicator,
    bufs: &mut Buffers,
    size: usize,
    i: usize,
    np: usize,
    me: usize,
) {
    let right = comm.process_at_rank(((me + 1) % np) as i32);
    let left = comm.process_at_rank(((me + np - 1) % np) as i32);
    match b {
        Benchmark::PingPong => {
            let (s, r) = bufs.bytes(i, size, size);
            let peer = comm.process_at_rank(1 - me as i32);
            if me == 0 {
                peer.send(s);
                peer.receive_into(r);
            } else {
                peer.receive_into(r);
                peer.send(s);
            }
        }
        Benchmark::PingPing => {
            let (s, r) = bufs.bytes(i, size, size);
            let peer = comm.process_at_rank(1 - me as i32);
            request::scope(|scope| {
                let sent = peer.immediate_send(scope, s);
                peer.receive_into(r);
                sent.wait();
            });
        }
        Benchmark::Sendrecv => {
            // IMB calls MPI_Sendrecv, receiving with MPI_ANY_TAG.
            let (s, r) = bufs.bytes(i, size, size);
            pagewire::point_to_point::send_receive_into_with_tags(s, &right, 0, r, &left, None);
        }
        Benchmark::Exchange => {
            let (s, r) = bufs.bytes(i, 2 * size, size);
            let (to_right, to_left) = s.split_at(size);
            request::scope(|scope| {
                let a = right.immediate_send(scope, to_right);
                let c = left.immediate_send(scope, to_left);
                left.receive_into(&mut *r);
                right.receive_into(&mut *r);
                request::wait_all(vec![a, c]);
            });
        }
        Benchmark::Barrier => comm.barrier(),
        _ => unreachable!("{b} is a collective"),
    }
}

fn collective_once(
    b: Benchmark,
    comm: &SimpleCommunicator,
    bufs: &mut Buffers,
    size: usize,
    i: usize,
    np: usize,
    me: usize,
) {
    let root = comm.process_at_rank(0);
    let is_root = me == 0;
    let count = size / 4;
    let sum = SystemOperation::sum();
    let equal = |bytes: usize| vec![bytes as pagewire::collective::Count; np];
    let packed = |bytes: usize| {
        (0..np)
            .map(|j| (j * bytes) as pagewire::collective::Count)
            .collect::<Vec<_>>()
    };
    match b {
        Benchmark::Allreduce => {
            let (s, r) = bufs.floats(i, count, count);
            comm.all_reduce_into(s, r, sum);
        }
        Benchmark::Reduce => {
            let (s, r) = bufs.floats(i, count, count);
            if is_root {
                root.reduce_into_root(s, r, sum);
            } else {
                root.reduce_into(s, sum);
            }
        }
        Benchmark::ReduceScatter => {
            let counts = reduce_scatter_counts(count, np);
            let (s, r) = bufs.floats(i, count, counts[me]);
            let counts: Vec<_> = counts
                .iter()
                .map(|&c| c as pagewire::collective::Count)
                .collect();
            comm.reduce_scatter_varcount_into(s, r, &counts, sum);
        }
        Benchmark::ReduceScatterBlock => {
            let (s, r) = bufs.floats(i, np * count, count);
            comm.reduce_scatter_block_into(s, r, sum);
        }
        Benchmark::Allgather => {
            let (s, r) = bufs.bytes(i, size, np * size);
            comm.all_gather_into(s, r);
        }
        Benchmark::Allgatherv => {
            let (s, r) = bufs.bytes(i, size, np * size);
            let mut r = PartitionMut::new(r, equal(size), packed(size));
            comm.all_gather_varcount_into(s, &mut r);
        }
        Benchmark::Gather => {
            let (s, r) = bufs.bytes(i, size, np * size);
            if is_root {
                root.gather_into_root(s, r);
            } else {
                root.gather_into(s);
            }
        }
        Benchmark::Gatherv => {
            let (s, r) = bufs.bytes(i, size, np * size);
            if is_root {
                let mut r = PartitionMut::new(r, equal(size), packed(size));
                root.gather_varcount_into_root(s, &mut r);
            } else {
                root.gather_varcount_into(s);
            }
        }
        Benchmark::Scatter => {
            let (s, r) = bufs.bytes(i, np * size, size);
            if is_root {
                root.scatter_into_root(s, r);
            } else {
                root.scatter_into(r);
            }
        }
        Benchmark::Scatterv => {
            let (s, r) = bufs.bytes(i, np * size, size);
            if is_root {
                let s = Partition::new(s, equal(size), packed(size));
                root.scatter_varcount_into_root(&s, r);
            } else {
                root.scatter_varcount_into(r);
            }
        }
        Benchmark::Alltoall => {
            let (s, r) = bufs.bytes(i, np * size, np * size);
            comm.all_to_all_into(s, r);
        }
        Benchmark::Alltoallv => {
            let (s, r) = bufs.bytes(i, np * size, np * size);
            let s = Partition::new(s, equal(size), packed(size));
            let mut r = PartitionMut::new(r, equal(size), packed(size));
            comm.all_to_all_varcount_into(&s, &mut r);
        }
        Benchmark::Bcast => {
            // IMB broadcasts from the root's send buffer into the others' receive buffers;
            // the facade's broadcast takes one mutable buffer, so the root's is its receive
            // buffer, filled from its send buffer once (untimed content, same rotation).
            let (_, r) = bufs.bytes(i, 0, size);
            root.broadcast_into(r);
        }
        _ => unreachable!("{b} is not a collective"),
    }
}
