//! The send and receive buffers of one size's measurement, with IMB's `-off_cache`
//! rotation: where each repetition sends from and receives into.

use crate::bench::Benchmark;
use crate::settings::{OffCache, Rotation};

/// A benchmark's send and receive buffers, as floats so that reductions can view them as
/// such, with IMB's rotation of each.
pub struct Buffers {
    send: Vec<f32>,
    recv: Vec<f32>,
    /// Where repetition `i` sends from.
    pub send_rotation: Rotation,
    /// Where repetition `i` receives into.
    pub recv_rotation: Rotation,
}

impl Buffers {
    /// Buffers for `b` with messages of `size` on `np` processes and `n_sample`
    /// repetitions, rotated as IMB does with `off_cache`.
    pub fn new(
        b: Benchmark,
        size: usize,
        np: usize,
        n_sample: usize,
        off_cache: Option<OffCache>,
    ) -> Buffers {
        let (s_len, r_len) = b.buffer_lengths(size, np);
        let rotation = |len| match off_cache {
            Some(oc) if b.uses_off_cache() => oc.rotation(len, n_sample),
            _ => Rotation::NONE,
        };
        let (sr, rr) = (rotation(s_len), rotation(r_len));
        let floats = |bytes: usize| bytes.div_ceil(4);
        Buffers {
            send: vec![1.0f32; floats(sr.alloc(s_len))],
            // Written, not only allocated (a zeroed allocation maps its pages at the first
            // write, which would then fault inside the timed loop), as IMB initialises both.
            recv: vec![-1.0f32; floats(rr.alloc(r_len))],
            send_rotation: sr,
            recv_rotation: rr,
        }
    }

    /// The send bytes of repetition `i`, `len` long, and the receive bytes of repetition
    /// `i`, `rlen` long.
    pub(super) fn bytes(&mut self, i: usize, len: usize, rlen: usize) -> (&[u8], &mut [u8]) {
        let (so, ro) = (self.send_rotation.at(i), self.recv_rotation.at(i));
        let s: &[u8] = bytemuck::cast_slice(&self.send[..]);
        let r: &mut [u8] = bytemuck::cast_slice_mut(&mut self.recv[..]);
        (&s[so..so + len], &mut r[ro..ro + rlen])
    }

    /// The same as floats (`count` and `rcount` floats; offsets rounded down to a float).
    pub(super) fn floats(&mut self, i: usize, count: usize, rcount: usize) -> (&[f32], &mut [f32]) {
        let (so, ro) = (self.send_rotation.at(i) / 4, self.recv_rotation.at(i) / 4);
        (&self.send[so..so + count], &mut self.recv[ro..ro + rcount])
    }

    /// Start addresses of repetition `i`'s send and receive messages (for tests).
    pub fn addresses(&self, i: usize) -> (usize, usize) {
        (
            self.send.as_ptr() as usize + self.send_rotation.at(i),
            self.recv.as_ptr() as usize + self.recv_rotation.at(i),
        )
    }

    /// Bytes allocated for sending and receiving.
    pub fn allocated(&self) -> (usize, usize) {
        (self.send.len() * 4, self.recv.len() * 4)
    }
}
