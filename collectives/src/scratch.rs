//! Scratch buffers reused across calls, so a long collective does not allocate and zero
//! (page-fault in, the first time) a fresh temporary of the message's size every call.
//!
//! Up to [`POOL_LEN`] buffers of at most [`KEEP_MAX`] bytes each are kept per thread (the
//! message layer is per thread too); larger ones are freed when the call ends. A buffer's
//! contents are whatever its last user left: every user writes before it reads.

use std::cell::RefCell;

use bytemuck::Pod;

/// Largest buffer kept for reuse (bytes).
pub const KEEP_MAX: usize = 16 << 20;
/// Buffers kept per thread.
pub const POOL_LEN: usize = 4;

thread_local! {
    static POOL: RefCell<Vec<Vec<u128>>> = const { RefCell::new(Vec::new()) };
}

/// A buffer from the pool; it goes back when dropped.
pub(crate) struct Scratch {
    buf: Vec<u128>,
}

impl Scratch {
    /// A buffer of at least `bytes` bytes: the smallest pooled one that is large enough,
    /// else the largest grown to size, else a new one.
    pub(crate) fn new(bytes: usize) -> Scratch {
        let words = bytes.div_ceil(16);
        let mut buf = POOL.with(|p| {
            let mut p = p.borrow_mut();
            let fit = (0..p.len())
                .filter(|&i| p[i].len() >= words)
                .min_by_key(|&i| p[i].len())
                .or_else(|| (0..p.len()).max_by_key(|&i| p[i].len()));
            fit.map(|i| p.swap_remove(i)).unwrap_or_default()
        });
        if buf.len() < words {
            buf.resize(words, 0);
        }
        Scratch { buf }
    }

    /// The first `n` elements of type `T` (16-byte aligned, so any primitive fits).
    pub(crate) fn slice<T: Pod>(&mut self, n: usize) -> &mut [T] {
        &mut bytemuck::cast_slice_mut::<u128, T>(&mut self.buf)[..n]
    }

    /// A scratch copy of `src`.
    pub(crate) fn copy_of<T: Pod>(src: &[T]) -> Scratch {
        let mut s = Scratch::new(std::mem::size_of_val(src));
        s.slice(src.len()).copy_from_slice(src);
        s
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        if buf.is_empty() || buf.len() * 16 > KEEP_MAX {
            return;
        }
        POOL.with(|p| {
            let mut p = p.borrow_mut();
            p.push(buf);
            if p.len() > POOL_LEN {
                if let Some(i) = (0..p.len()).min_by_key(|&i| p[i].len()) {
                    p.swap_remove(i);
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_reused_and_typed() {
        let addr = {
            let mut a = Scratch::new(1000);
            let s = a.slice::<f64>(125);
            s.fill(1.5);
            s.as_ptr() as usize
        };
        let mut b = Scratch::new(800);
        assert_eq!(
            b.slice::<u8>(800).as_ptr() as usize,
            addr,
            "the pooled buffer came back"
        );
        assert_eq!(b.slice::<f64>(100)[99], 1.5);
        let c = Scratch::copy_of(&[1u16, 2, 3]);
        let mut c = c;
        assert_eq!(c.slice::<u16>(3), &[1, 2, 3]);
        assert_eq!(Scratch::new(0).slice::<u32>(0).len(), 0);
        let mut big = Scratch::new(17);
        assert_eq!(big.slice::<u8>(17).len(), 17);
    }
}
