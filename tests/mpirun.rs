//! Tests under a real MPI launcher (feature `mpi`). Each test, started by `cargo test`,
//! starts its own binary under `mpirun -np N` for N in `PAGEWIRE_MPI_NP` (default `2,3`),
//! where the ranks find themselves started by MPI and run the test's body:
//!
//! - `host_mpi_*`: the host-MPI backend ([`HostMpi`]) on MPI's own bootstrap: point-to-point
//!   (blocking, immediate, wildcards, probe, truncation, cancellation) and every collective
//!   against a sequential reference, for several types and operations, on the world and on
//!   a split communicator;
//! - `pagewire_bootstrapped_by_mpi`: pagewire's own transport (the soft NIC) with ranks and
//!   addresses from MPI, through the facade;
//! - `a_rank_failing_inside_a_collective_takes_the_job_down`: on the mpi transport and on
//!   pagewire's, a rank that panics inside an allreduce makes mpirun end the job with an
//!   error, not hang.
//!
//! The facade's own suites run under mpirun from their own binaries (the `under_mpirun`
//! modules of `tests/collectives.rs`, `tests/point_to_point.rs` and
//! `tests/communicators.rs`), the examples in `tests/mpirun_examples.rs`.
//!
//! `PAGEWIRE_MPIRUN` names the launcher command (default `mpirun`; e.g.
//! `mpirun -launcher fork`). Without one on the PATH the tests say so and pass, or fail
//! under `PAGEWIRE_REQUIRE=mpirun` (pagewire-test-support's `mpirun` and `require`).
#![cfg(feature = "mpi")]

use std::time::Duration;

use pagewire::boot::{Bootstrap, Launcher, MpiBootstrap};
use pagewire::host_mpi::HostMpi;
use pagewire::msg::raw::{UserBuf, UserBufMut};
use pagewire::traits::*;
use pagewire::{Error, ErrorClass};
use pagewire_collectives::{Element, Op, Operation};
use pagewire_test_support::mpirun;

fn under_mpi() -> bool {
    matches!(Launcher::detect(), Launcher::Mpi(_))
}

/// Runs test `name` of this binary under the launcher on each rank count.
fn under_mpirun(name: &str) {
    mpirun::expect_pass(name, name, &[], None);
}

#[test]
fn host_mpi_under_mpirun() {
    if under_mpi() {
        host_mpi_body();
    } else {
        under_mpirun("host_mpi_under_mpirun");
    }
}

#[test]
fn pagewire_bootstrapped_by_mpi() {
    if under_mpi() {
        pagewire_body();
    } else {
        under_mpirun("pagewire_bootstrapped_by_mpi");
    }
}

#[test]
fn a_rank_failing_inside_a_collective_takes_the_job_down() {
    const NAME: &str = "a_rank_failing_inside_a_collective_takes_the_job_down";
    if under_mpi() {
        failing_rank_body();
        return;
    }
    let transports: [(&str, &[(&str, &str)]); 2] = [
        ("mpi transport", &[("PAGEWIRE_TRANSPORT", "mpi")]),
        ("pagewire bootstrapped by MPI", &[]),
    ];
    for (label, env) in transports {
        let Some(job) = mpirun::run(NAME, 3, env, Duration::from_secs(120)) else {
            return;
        };
        assert!(
            job.code.is_some(),
            "{label}: the job hung until killed after {:.0} s:\n{}\n{}",
            job.seconds,
            job.stdout,
            job.stderr
        );
        assert!(
            !job.success(),
            "{label}: the job succeeded:\n{}",
            job.stderr
        );
        // The failing rank's own message must reach the user. Pagewire's "aborting the MPI
        // job" line comes right before MPI_Abort, and hydra may drop output written that
        // close to an abort (MPICH's own "Abort(1) ..." line is lost the same way), so its
        // absence is reported, not failed.
        assert!(
            job.stderr.contains("rank 1 fails inside the allreduce"),
            "{label}: the failing rank's message is missing:\n{}\n{}",
            job.stdout,
            job.stderr
        );
        if !job.stderr.contains("aborting the MPI job") {
            eprintln!("{label}: hydra dropped the \"aborting the MPI job\" line this time");
        }
        eprintln!(
            "{label}: mpirun ended the job with status {:?} after {:.1} s",
            job.code, job.seconds
        );
    }
}

/// Rank 1's reduction panics inside an allreduce; the others go on to a barrier that only
/// the launcher ends.
fn failing_rank_body() {
    let universe = pagewire::initialize().expect("first initialisation");
    let world = universe.world();
    let me = world.rank();
    let add = pagewire::UserOperation::commutative(move |a, b| {
        assert!(me != 1, "rank 1 fails inside the allreduce");
        let a: &[i64] = a.downcast().expect("i64 elements");
        let b: &mut [i64] = b.downcast().expect("i64 elements");
        for (y, x) in b.iter_mut().zip(a) {
            *y += x;
        }
    });
    let mut out = [0i64; 4];
    world.all_reduce_into(&[1i64; 4][..], &mut out[..], &add);
    world.barrier();
    unreachable!("rank {me} passed a barrier that rank 1 never reached");
}

// ---- pagewire's transport, bootstrapped by MPI ---------------------------------------------

fn pagewire_body() {
    let universe = pagewire::try_initialize()
        .expect("pagewire starts under mpirun")
        .expect("first initialisation");
    let world = universe.world();
    let (rank, size) = (world.rank(), world.size());
    // The ranks are MPI's (hydra's PMI_RANK, when that is the launcher).
    if let Ok(r) = std::env::var("PMI_RANK") {
        assert_eq!(r.parse::<i32>().unwrap(), rank);
    }
    // A ring over pagewire's own transport: eager and rendezvous sizes.
    for len in [8usize, 100_000] {
        let next = (rank + 1) % size;
        let prev = (rank + size - 1) % size;
        let mine: Vec<u8> = (0..len).map(|i| (i as i32 * 7 + rank) as u8).collect();
        let mut got = vec![0u8; len];
        pagewire::request::scope(|scope| {
            let r = world
                .process_at_rank(prev)
                .immediate_receive_into(scope, &mut got[..]);
            world.process_at_rank(next).send(&mine[..]);
            r.wait();
        });
        let want: Vec<u8> = (0..len).map(|i| (i as i32 * 7 + prev) as u8).collect();
        assert!(got == want, "rank {rank}: ring of {len} bytes");
    }
    let mut sum = 0i64;
    world.all_reduce_into(
        &(rank as i64 + 1),
        &mut sum,
        pagewire::SystemOperation::sum(),
    );
    let n = size as i64;
    assert_eq!(sum, n * (n + 1) / 2);
    println!("rank {rank}/{size}: pagewire over the MPI bootstrap ok");
}

// ---- the host-MPI backend ---------------------------------------------------------------------

fn host_mpi_body() {
    let boot = MpiBootstrap::init().expect("MPI bootstrap");
    let (rank, size) = (boot.rank(), boot.size());
    bootstrap_checks(&boot);
    {
        let h = HostMpi::new(&boot).expect("host-MPI backend");
        assert_eq!((h.rank(), h.size()), (rank, size));
        point_to_point(&h);
        collectives(&h);
        argument_errors(&h);
        // Even ranks and odd ranks, each numbered backwards.
        let sub = h
            .split(Some((rank % 2) as i32), -(rank as i32))
            .unwrap()
            .expect("a color joins");
        let members: Vec<usize> = (0..size).filter(|r| r % 2 == rank % 2).collect();
        assert_eq!(sub.size(), members.len());
        assert_eq!(sub.rank(), members.len() - 1 - rank / 2);
        collectives(&sub);
        assert!(h.split(None, 0).unwrap().is_none());
        h.barrier().unwrap();
    }
    println!(
        "rank {rank}/{size}: host MPI ok ({}, {:?})",
        boot.library_version(),
        boot.threading()
    );
}

fn bootstrap_checks(boot: &MpiBootstrap) {
    let (rank, size) = (boot.rank(), boot.size());
    let blob = vec![rank as u8; rank * 3];
    let all = boot.allgather(&blob).unwrap();
    assert_eq!(all.len(), size);
    for (r, b) in all.iter().enumerate() {
        assert_eq!(b, &vec![r as u8; r * 3]);
    }
    let ids = boot.allgather(boot.job_id().as_bytes()).unwrap();
    assert!(
        ids.iter().all(|id| id == boot.job_id().as_bytes()),
        "one job id"
    );
    boot.barrier().unwrap();
    // MPI_THREAD_FUNNELED: another thread is refused, not let through.
    std::thread::scope(|s| {
        s.spawn(|| {
            let e = boot.barrier().unwrap_err().to_string();
            assert!(e.contains("MPI_THREAD_FUNNELED"), "{e}");
        });
    });
}

fn pattern(rank: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 13 + rank * 101) as u8).collect()
}

fn point_to_point(h: &HostMpi) {
    let (rank, size) = (h.rank(), h.size());
    let next = (rank + 1) % size;
    let prev = (rank + size - 1) % size;

    // A ring with immediate sends, eager and rendezvous sizes.
    for len in [0usize, 1, 4096, 1 << 20] {
        let mine = pattern(rank, len);
        // SAFETY: `mine` outlives the request and is not written before `wait` returns.
        let send = unsafe { UserBuf::new(mine.as_ptr(), mine.len()) };
        let mut sreq = h.isend(next, 3, send, false).unwrap();
        let mut got = vec![0u8; len];
        let st = h.recv(Some(prev), Some(3), &mut got).unwrap();
        assert_eq!((st.source, st.tag, st.count), (prev, 3, len));
        assert!(got == pattern(prev, len), "ring of {len} bytes");
        let sst = sreq.wait().unwrap();
        assert_eq!((sst.source, sst.count), (next, len));
        assert!(sreq.is_complete());
    }

    // Wildcards: everyone sends to rank 0 with its own tag; rank 0 takes them in any order.
    if rank == 0 {
        let mut seen = vec![false; size];
        for _ in 1..size {
            let st = h.probe(None, None).unwrap();
            let mut buf = vec![0u8; st.count];
            let got = h.recv(Some(st.source), Some(st.tag), &mut buf).unwrap();
            assert_eq!(got, st);
            assert_eq!(st.tag as usize, 100 + st.source);
            assert_eq!(buf, pattern(st.source, 10 + st.source));
            seen[st.source] = true;
        }
        assert!(seen[1..].iter().all(|&s| s));
    } else {
        h.send(
            0,
            100 + rank as i32,
            &pattern(rank, 10 + rank),
            rank % 2 == 0,
        )
        .unwrap();
    }
    h.barrier().unwrap();
    assert_eq!(h.iprobe(None, None).unwrap(), None, "nothing left over");
    h.barrier().unwrap();

    // Truncation is an error, not an abort, and writes nothing past the buffer.
    if rank == 0 {
        h.send(1, 9, &[7u8; 100], false).unwrap();
    } else if rank == 1 {
        let mut buf = [0u8; 12];
        let e = h.recv(Some(0), Some(9), &mut buf[..10]).unwrap_err();
        match e {
            Error::Mpi { call, message, .. } => {
                assert_eq!(call, "MPI_Recv");
                assert!(message.contains("truncated: rank 0"), "{message}");
                assert!(message.contains("10-byte"), "{message}");
            }
            other => panic!("expected a truncation, got {other}"),
        }
        assert_eq!(&buf[10..], &[0, 0], "nothing written past the buffer");
    }

    // An immediate receive that never matches is cancelled when dropped.
    {
        let mut never = [0u8; 4];
        // SAFETY: `never` outlives the request, which is dropped (cancelled) in this block.
        let buf = unsafe { UserBufMut::new(never.as_mut_ptr(), never.len()) };
        let mut r = h.irecv(None, Some(12345), buf).unwrap();
        assert_eq!(r.test().unwrap(), None);
    }
    // Sends to a rank or with a tag MPI refuses are errors.
    assert!(matches!(
        h.send(size, 0, &[], false),
        Err(Error::NoSuchRank { .. })
    ));
    let e = h.send(next, -5, &[1], false).unwrap_err().to_string();
    assert!(e.contains("MPI_Send"), "{e}");
    h.barrier().unwrap();
}

/// Rank `r`'s element `i` of test vectors.
fn val<T: Element + From<u8>>(r: usize, i: usize) -> T {
    T::from(((r * 3 + i * 5) % 11 + 1) as u8)
}

fn fold<T: Element>(op: Op, a: T, b: T) -> T {
    let mut out = [b];
    op.apply(&[a], &mut out);
    out[0]
}

fn collectives(h: &HostMpi) {
    typed_collectives::<i32>(h, &Op::ALL);
    typed_collectives::<u64>(h, &[Op::Sum, Op::Max, Op::BitXor, Op::LogicalOr]);
    typed_collectives::<u8>(h, &[Op::Min, Op::BitAnd]);
    typed_collectives::<f64>(h, &[Op::Sum, Op::Product, Op::Min, Op::Max]);
    typed_collectives::<f32>(h, &[Op::Sum]);
}

fn typed_collectives<T: Element + From<u8>>(h: &HostMpi, ops: &[Op]) {
    let (rank, size) = (h.rank(), h.size());
    let n = 5usize;
    let mine: Vec<T> = (0..n).map(|i| val(rank, i)).collect();
    let of = |r: usize| -> Vec<T> { (0..n).map(|i| val(r, i)).collect() };

    for &op in ops {
        let reduced = |ranks: std::ops::RangeInclusive<usize>| -> Vec<T> {
            let mut acc = of(*ranks.start());
            for r in ranks.skip(1) {
                for (a, b) in acc.iter_mut().zip(of(r)) {
                    *a = fold(op, *a, b);
                }
            }
            acc
        };
        let all = reduced(0..=size - 1);
        let mut out = vec![T::zeroed(); n];
        h.all_reduce(&mine, &mut out, op).unwrap();
        assert_eq!(out, all, "allreduce {op:?}");

        let root = size - 1;
        if rank == root {
            let mut out = vec![T::zeroed(); n];
            h.reduce(root, &mine, Some(&mut out), op).unwrap();
            assert_eq!(out, all, "reduce {op:?}");
        } else {
            h.reduce(root, &mine, None, op).unwrap();
        }

        let mut out = vec![T::zeroed(); n];
        h.scan(&mine, &mut out, op).unwrap();
        assert_eq!(out, reduced(0..=rank), "scan {op:?}");

        // Reduce-scatter of size·2 elements, 2 each; and varcount with rank+1 each.
        let long = |r: usize, len: usize| -> Vec<T> { (0..len).map(|i| val(r + i, i)).collect() };
        let reduce_long = |len: usize| -> Vec<T> {
            let mut acc = long(0, len);
            for r in 1..size {
                for (a, b) in acc.iter_mut().zip(long(r, len)) {
                    *a = fold(op, *a, b);
                }
            }
            acc
        };
        let mut out = vec![T::zeroed(); 2];
        h.reduce_scatter_block(&long(rank, 2 * size), &mut out, op)
            .unwrap();
        assert_eq!(out, reduce_long(2 * size)[2 * rank..2 * rank + 2]);
        let counts: Vec<i32> = (0..size as i32).map(|r| r + 1).collect();
        let total: usize = counts.iter().map(|&c| c as usize).sum();
        let at: usize = (0..rank).map(|r| r + 1).sum();
        let mut out = vec![T::zeroed(); rank + 1];
        h.reduce_scatter(&long(rank, total), &mut out, &counts, op)
            .unwrap();
        assert_eq!(
            out,
            reduce_long(total)[at..at + rank + 1],
            "reduce_scatter {op:?}"
        );
    }

    // Data movement.
    let root = size / 2;
    let mut b = if rank == root {
        of(root)
    } else {
        vec![T::zeroed(); n]
    };
    h.broadcast(root, &mut b).unwrap();
    assert_eq!(b, of(root));

    let mut all = vec![T::zeroed(); n * size];
    h.all_gather(&mine, &mut all).unwrap();
    assert_eq!(all, (0..size).flat_map(of).collect::<Vec<_>>());

    let counts: Vec<i32> = (0..size as i32).map(|r| r % 3).collect();
    let cnt = |r: usize| counts[r] as usize;
    let part = |r: usize| -> Vec<T> { of(r)[..cnt(r)].to_vec() };
    let packed: Vec<T> = (0..size).flat_map(part).collect();
    let mut allv = vec![T::zeroed(); packed.len()];
    h.all_gather_varcount(&part(rank), &mut allv, &counts)
        .unwrap();
    assert_eq!(allv, packed);

    if rank == root {
        let mut g = vec![T::zeroed(); n * size];
        h.gather(root, &mine, Some(&mut g)).unwrap();
        assert_eq!(g, (0..size).flat_map(of).collect::<Vec<_>>());
        let mut gv = vec![T::zeroed(); packed.len()];
        h.gather_varcount(root, &part(rank), Some((&mut gv, &counts)))
            .unwrap();
        assert_eq!(gv, packed);
    } else {
        h.gather(root, &mine, None).unwrap();
        h.gather_varcount(root, &part(rank), None).unwrap();
    }

    // Scatter: block j of the root's (size·n) vector to rank j.
    let whole: Vec<T> = (0..size).flat_map(of).collect();
    let mut s = vec![T::zeroed(); n];
    let mut sv = vec![T::zeroed(); cnt(rank)];
    if rank == root {
        h.scatter(root, Some(&whole), &mut s).unwrap();
        h.scatter_varcount(root, Some((&packed, &counts)), &mut sv)
            .unwrap();
    } else {
        h.scatter(root, None, &mut s).unwrap();
        h.scatter_varcount(root, None, &mut sv).unwrap();
    }
    assert_eq!(s, of(rank));
    assert_eq!(sv, part(rank));

    // All-to-all: element (j, i) from rank r is val(r + j, i).
    let block = |r: usize, j: usize| -> Vec<T> { (0..2).map(|i| val(r + j, i)).collect() };
    let send: Vec<T> = (0..size).flat_map(|j| block(rank, j)).collect();
    let mut recv = vec![T::zeroed(); 2 * size];
    h.all_to_all(&send, &mut recv).unwrap();
    assert_eq!(
        recv,
        (0..size).flat_map(|r| block(r, rank)).collect::<Vec<_>>()
    );

    // All-to-all-v: rank r sends (r + j) % 3 elements to rank j.
    let c = |r: usize, j: usize| (r + j) % 3;
    let vblock =
        |r: usize, j: usize| -> Vec<T> { (0..c(r, j)).map(|i| val(r * 7 + j, i)).collect() };
    let send: Vec<T> = (0..size).flat_map(|j| vblock(rank, j)).collect();
    let scounts: Vec<i32> = (0..size).map(|j| c(rank, j) as i32).collect();
    let rcounts: Vec<i32> = (0..size).map(|r| c(r, rank) as i32).collect();
    let want: Vec<T> = (0..size).flat_map(|r| vblock(r, rank)).collect();
    let mut recv = vec![T::zeroed(); want.len()];
    h.all_to_all_varcount(&send, &scounts, &mut recv, &rcounts)
        .unwrap();
    assert_eq!(recv, want);
    h.barrier().unwrap();
}

/// Errors found on the calling rank, before MPI is called (so every rank returns).
fn argument_errors(h: &HostMpi) {
    let size = h.size();
    let e = h
        .all_reduce(&[1.0f64], &mut [0.0], Op::LogicalAnd)
        .unwrap_err()
        .to_string();
    assert!(e.contains("integers only"), "{e}");
    let e = h
        .all_reduce(&[1u128], &mut [0], Op::Sum)
        .unwrap_err()
        .to_string();
    assert!(e.contains("no datatype"), "{e}");
    let e = h
        .all_gather(&[1i32, 2], &mut [0i32; 3])
        .unwrap_err()
        .to_string();
    assert!(e.contains("expected"), "{e}");
    let e = h
        .all_gather_varcount(&[1i32], &mut [0i32; 1], &vec![1; size + 1])
        .unwrap_err()
        .to_string();
    assert!(e.contains("counts for"), "{e}");
    // The root without its buffer (MPI_ERR_BUFFER), the others passing it (MPI_ERR_ARG).
    let mut buf = vec![0i32; size];
    let root = 0;
    let r = if h.rank() == root {
        h.gather(root, &[1i32], None)
    } else {
        h.gather(root, &[1i32], Some(&mut buf))
    };
    if h.rank() == root {
        assert!(
            matches!(&r, Err(e) if e.class() == ErrorClass::Buffer),
            "{r:?}"
        );
    } else {
        assert!(matches!(r, Err(Error::InvalidArgument(_))), "{r:?}");
    }
    // Merge is for intercommunicators (MPI_ERR_COMM).
    let r = h.merge(false);
    assert!(
        matches!(&r, Err(e) if e.class() == ErrorClass::Comm),
        "{:?}",
        r.as_ref().err()
    );
}
