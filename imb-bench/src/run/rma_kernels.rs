//! IMB-RMA's kernels on `pagewire::window`: the window of one size's measurement, and one
//! timed run of a benchmark's repetitions, as IMB-RMA 2021 runs them (the origin takes its
//! lock outside the timed loop; non-aggregate flushes after every operation, aggregate once
//! after the loop, inside the timed region; processes that are no origin report -1).

use pagewire::traits::*;
use pagewire::window::Window;
use pagewire::{SimpleCommunicator, SystemOperation};

use super::Buffers;
use crate::bench::{Aggregation, Benchmark};
use crate::settings::{WindowKind, N_BARRIERS};

/// The window of one size's measurement, of the element type the benchmark moves (IMB
/// creates one per size with `MPI_Win_create`).
pub(crate) enum RmaWindow {
    Bytes(Window<u8>),
    Floats(Window<f32>),
    Ints(Window<i32>),
}

impl RmaWindow {
    /// A window of `kind` for `b` with messages of `size` on `comm` (collective over it).
    pub(crate) fn new(
        b: Benchmark,
        comm: &SimpleCommunicator,
        size: usize,
        kind: WindowKind,
    ) -> RmaWindow {
        fn window<T: pagewire::datatype::Equivalence + Default + Clone + Send + Sync>(
            len: usize,
            comm: &SimpleCommunicator,
            kind: WindowKind,
        ) -> Window<T> {
            match kind {
                WindowKind::Create => Window::from_vec(vec![T::default(); len], comm),
                WindowKind::Allocate => Window::allocate(len, comm),
            }
        }
        let np = comm.size() as usize;
        let (s_len, r_len) = b.buffer_lengths(size, np);
        let bytes = s_len.max(r_len);
        match b {
            Benchmark::Accumulate | Benchmark::GetAccumulate | Benchmark::FetchAndOp => {
                RmaWindow::Floats(window(bytes.div_ceil(4), comm, kind))
            }
            Benchmark::CompareAndSwap => RmaWindow::Ints(window(3, comm, kind)),
            _ => RmaWindow::Bytes(window(bytes, comm, kind)),
        }
    }

    fn bytes(&self) -> &Window<u8> {
        match self {
            RmaWindow::Bytes(w) => w,
            _ => unreachable!("a byte window"),
        }
    }

    fn floats(&self) -> &Window<f32> {
        match self {
            RmaWindow::Floats(w) => w,
            _ => unreachable!("a float window"),
        }
    }
}

/// Runs `n` repetitions of `b` in `mode` and returns this process's seconds per repetition
/// (`[t, -1]`; Truly_passive_put: `[t_pure, t_ovrl]`), -1 for a process that is no
/// origin. Two barriers first, one after (not timed).
pub(crate) fn rma_kernel(
    b: Benchmark,
    comm: &SimpleCommunicator,
    win: &RmaWindow,
    bufs: &mut Buffers,
    size: usize,
    n: usize,
    mode: Option<Aggregation>,
) -> [f64; 2] {
    let np = comm.size();
    let me = comm.rank();
    let n = n.max(1);
    if b == Benchmark::TrulyPassivePut {
        return truly_passive_put(comm, win.bytes(), bufs, size, n);
    }
    for _ in 0..N_BARRIERS {
        comm.barrier();
    }
    let each = mode != Some(Aggregation::Aggregate);
    let t = match b {
        Benchmark::UnidirPut | Benchmark::UnidirGet | Benchmark::PutLocal if me != 0 => -1.0,
        Benchmark::UnidirPut
        | Benchmark::BidirPut
        | Benchmark::UnidirGet
        | Benchmark::BidirGet
        | Benchmark::PutLocal => {
            let w = win.bytes();
            let target = np - 1 - me;
            let put = !matches!(b, Benchmark::UnidirGet | Benchmark::BidirGet);
            w.lock_shared(target);
            let t0 = pagewire::time();
            for i in 0..n {
                let (s, r) = bufs.bytes(i, size, size);
                if put {
                    w.put(target, 0, s);
                } else {
                    w.get(target, 0, r);
                }
                if each {
                    flush(w, b, target);
                }
            }
            if !each {
                flush(w, b, target);
            }
            let t = (pagewire::time() - t0) / n as f64;
            w.unlock(target);
            t
        }
        Benchmark::PutAllLocal | Benchmark::OnePutAll | Benchmark::OneGetAll if me != 0 => -1.0,
        Benchmark::PutAllLocal
        | Benchmark::OnePutAll
        | Benchmark::OneGetAll
        | Benchmark::AllPutAll
        | Benchmark::AllGetAll => {
            let w = win.bytes();
            let put = !matches!(b, Benchmark::OneGetAll | Benchmark::AllGetAll);
            w.lock_all();
            let t0 = pagewire::time();
            for i in 0..n {
                for peer in 0..np {
                    let target = (peer + me) % np;
                    if target == me {
                        continue;
                    }
                    let (s, r) = bufs.bytes(i, size, size);
                    if put {
                        w.put(target, 0, s);
                    } else {
                        w.get(target, 0, r);
                    }
                }
            }
            if b == Benchmark::PutAllLocal {
                w.flush_local_all();
            } else {
                w.flush_all();
            }
            let t = (pagewire::time() - t0) / n as f64;
            w.unlock_all();
            t
        }
        Benchmark::ExchangePut | Benchmark::ExchangeGet => {
            let w = win.bytes();
            let (left, right) = ((me + np - 1) % np, (me + 1) % np);
            w.lock_shared(left);
            if right != left {
                w.lock_shared(right);
            }
            let t0 = pagewire::time();
            for i in 0..n {
                let (s, r) = bufs.bytes(i, 2 * size, 2 * size);
                if b == Benchmark::ExchangePut {
                    w.put(left, 0, &s[..size]);
                    w.put(right, size, &s[size..]);
                } else {
                    let (r0, r1) = r.split_at_mut(size);
                    w.get(right, 0, r0);
                    w.get(left, size, r1);
                }
                w.flush(left);
                if right != left {
                    w.flush(right);
                }
            }
            let t = (pagewire::time() - t0) / n as f64;
            w.unlock(left);
            if right != left {
                w.unlock(right);
            }
            t
        }
        _ if me != 0 => -1.0,
        Benchmark::Accumulate | Benchmark::GetAccumulate | Benchmark::FetchAndOp => {
            let w = win.floats();
            let count = size / 4;
            let sum = SystemOperation::sum();
            w.lock_shared(1);
            let t0 = pagewire::time();
            for i in 0..n {
                let (s, r) = bufs.floats(i, count.max(1), count.max(1));
                match b {
                    Benchmark::Accumulate => w.accumulate(1, 0, &s[..count], sum),
                    Benchmark::GetAccumulate => {
                        w.get_accumulate(1, 0, &s[..count], &mut r[..count], sum)
                    }
                    _ => r[0] = w.fetch_and_op(1, 0, &s[0], sum),
                }
                if each {
                    w.flush(1);
                }
            }
            if !each {
                w.flush(1);
            }
            let t = (pagewire::time() - t0) / n as f64;
            w.unlock(1);
            t
        }
        Benchmark::CompareAndSwap => {
            let RmaWindow::Ints(w) = win else {
                unreachable!("an int window")
            };
            w.lock_shared(1);
            let t0 = pagewire::time();
            let mut result = 0;
            for _ in 0..n {
                // IMB's origin, compare and result values, all zero.
                result += w.compare_and_swap(1, 0, 0, 0);
                if each {
                    w.flush(1);
                }
            }
            if !each {
                w.flush(1);
            }
            let t = (pagewire::time() - t0) / n as f64;
            std::hint::black_box(result);
            w.unlock(1);
            t
        }
        _ => unreachable!("{b} is not an IMB-RMA benchmark"),
    };
    comm.barrier();
    [t, -1.0]
}

/// The completion each repetition (non-aggregate) or the loop (aggregate) waits for.
fn flush(w: &Window<u8>, b: Benchmark, target: i32) {
    if b == Benchmark::PutLocal {
        w.flush_local(target);
    } else {
        w.flush(target);
    }
}

/// IMB-RMA's Truly_passive_put: rank 0 puts into rank 1's window with a barrier after each
/// put, first while rank 1 only waits in the barriers (`t_pure`), then while rank 1
/// computes for about `t_pure` before each barrier without calling pagewire (`t_ovrl`).
/// `t_ovrl` near `t_pure` means the put completed without the target's CPU.
fn truly_passive_put(
    comm: &SimpleCommunicator,
    w: &Window<u8>,
    bufs: &mut Buffers,
    size: usize,
    n: usize,
) -> [f64; 2] {
    const TAG: i32 = 1;
    let me = comm.rank();
    comm.barrier();
    match me {
        0 => {
            w.lock_shared(1);
            let phase = |bufs: &mut Buffers| {
                let t0 = pagewire::time();
                for i in 0..n {
                    let (s, _) = bufs.bytes(i, size, size);
                    w.put(1, 0, s);
                    w.flush(1);
                    comm.barrier();
                }
                (pagewire::time() - t0) / n as f64
            };
            let t_pure = phase(bufs);
            comm.process_at_rank(1).send_with_tag(&t_pure, TAG);
            comm.barrier();
            let t_ovrl = phase(bufs);
            w.unlock(1);
            [t_pure, t_ovrl]
        }
        1 => {
            for _ in 0..n {
                comm.barrier();
            }
            let (t_pure, _) = comm.process_at_rank(0).receive_with_tag::<f64>(TAG);
            comm.barrier();
            for _ in 0..n {
                compute_for(t_pure);
                comm.barrier();
            }
            [0.0, 0.0]
        }
        _ => [-1.0, -1.0],
    }
}

/// Computes for `seconds` without calling pagewire (IMB's `IMB_cpu_exploit`: a small
/// matrix-vector loop calibrated to that time).
fn compute_for(seconds: f64) {
    let t0 = std::time::Instant::now();
    let mut v = [1.0f32; 10];
    while t0.elapsed().as_secs_f64() < seconds {
        for _ in 0..10 {
            let s: f32 = v.iter().sum();
            for x in v.iter_mut() {
                *x = *x * 0.5 + s * 0.01;
            }
        }
    }
    std::hint::black_box(v);
}
