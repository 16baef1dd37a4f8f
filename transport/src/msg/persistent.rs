//! The buffers of persistent operations (`MPI_Send_init`, `MPI_Recv_init`, persistent
//! collectives): what the buffer mode would do for each message on the buffer, done once
//! when the operation is made and held until it is freed (MPI-4 §3.9: the point of a
//! persistent request is to do such set-up once).
//!
//! In `pindown` that is the buffer's registration: held, it is never evicted, and every
//! start finds it in the cache; in `odp` the buffer's pages are prefetched for the NIC;
//! `copy` holds nothing.

use super::PointToPoint;
use crate::buffer_mode::{Direction, Transfer};
use crate::error::Result;

/// A user buffer prepared for a persistent operation: the buffer mode's hold on it.
#[derive(Debug)]
pub struct PreparedBuffer {
    t: Transfer,
}

impl PointToPoint {
    /// Prepares the `len`-byte buffer at `addr` for a persistent operation that moves it in
    /// direction `dir` (read by sends, written by receives): the mode's hold on it, taken
    /// now and kept until [`Self::release_buffer`]. `None` for no bytes.
    pub fn prepare_buffer(
        &mut self,
        addr: u64,
        len: usize,
        dir: Direction,
    ) -> Result<Option<PreparedBuffer>> {
        if len == 0 {
            return Ok(None);
        }
        let nic = self.nic.clone();
        let t = self.mode.begin(&*nic, addr, len, dir)?;
        self.mode.about_to_move(&*nic, &t, addr, 0, len);
        Ok(Some(PreparedBuffer { t }))
    }

    /// Gives back the hold [`Self::prepare_buffer`] took.
    pub fn release_buffer(&mut self, prepared: PreparedBuffer) {
        let nic = self.nic.clone();
        self.mode.end(&*nic, prepared.t);
    }
}
