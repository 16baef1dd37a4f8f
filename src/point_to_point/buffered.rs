//! Buffered sends (`MPI_Bsend`): the attached buffer (`MPI_Buffer_attach`) and the sends
//! that hold copies in it.

use std::borrow::Cow;
use std::cell::RefCell;

use crate::backend::CommBackend;
use crate::error::{fatal, Error, Result};
use crate::request::{self, Pending};
use crate::topology::Tag;

/// The buffer attached for buffered sends (`MPI_Buffer_attach`) and the sends in it.
#[derive(Default)]
struct Attached {
    capacity: usize,
    /// Each send's operation and bytes (the operation owns its copy).
    sends: Vec<(request::Operation<'static>, usize)>,
}

thread_local! {
    static ATTACHED: RefCell<Attached> = RefCell::new(Attached::default());
}

/// Forgets the sends of the attached buffer that have left.
fn reap_buffered(a: &mut Attached) -> Result<()> {
    let mut kept = Vec::with_capacity(a.sends.len());
    for (mut op, n) in a.sends.drain(..) {
        if op.test()?.is_none() {
            kept.push((op, n));
        }
    }
    a.sends = kept;
    Ok(())
}

/// Starts a buffered send of `copy`, counted against the attached buffer.
pub(super) fn buffered_send(
    backend: &CommBackend,
    dest: usize,
    tag: Tag,
    copy: Vec<u8>,
) -> Result<()> {
    ATTACHED.with(|a| {
        let mut a = a.borrow_mut();
        reap_buffered(&mut a)?;
        let used: usize = a.sends.iter().map(|(_, n)| n).sum();
        if used + copy.len() > a.capacity {
            return Err(Error::InvalidArgument(format!(
                "buffered send of {} bytes: the attached buffer has {} of {} bytes free \
                 (Universe::set_buffer_size)",
                copy.len(),
                a.capacity - used.min(a.capacity),
                a.capacity
            )));
        }
        let n = copy.len();
        let op = request::start_send(backend, dest, tag, Cow::Owned(copy), false)?;
        a.sends.push((op, n));
        Ok(())
    })
}

/// Attaches a buffer of `size` bytes for buffered sends, after detaching the one before.
pub(crate) fn attach_buffer(size: usize) {
    fatal(detach_buffer());
    ATTACHED.with(|a| a.borrow_mut().capacity = size);
}

/// The attached buffer's size.
pub(crate) fn attached_buffer_size() -> usize {
    ATTACHED.with(|a| a.borrow().capacity)
}

/// Waits for every buffered send, then detaches the buffer.
pub(crate) fn detach_buffer() -> Result<()> {
    let sends = ATTACHED.with(|a| {
        let mut a = a.borrow_mut();
        a.capacity = 0;
        std::mem::take(&mut a.sends)
    });
    for (mut op, _) in sends {
        op.wait()?;
    }
    Ok(())
}
