//! The message layer's blocking calls on borrowed buffers: each starts an operation on a
//! buffer that the caller lends for the call, and waits for it before returning. Lending a
//! buffer to the message layer is `unsafe` (it keeps the address); these are the only
//! `unsafe` of pagewire's backend.
#![allow(unsafe_code)]

use std::cell::RefCell;

use pagewire_transport::msg::raw::{UserBuf, UserBufMut};
use pagewire_transport::msg::{MessageHandle, PointToPoint, Status};

use crate::error::{Error, Result};

/// Sends `bytes` to world rank `dest` in `context` and waits (`MPI_Send`, `MPI_Ssend` when
/// `sync`).
#[inline]
pub(super) fn send(
    p2p: &mut PointToPoint,
    dest: usize,
    tag: i32,
    context: u32,
    bytes: &[u8],
    sync: bool,
) -> Result<Status> {
    if !sync {
        return Ok(p2p.send(dest, tag, context, bytes)?);
    }
    // SAFETY: the request is waited for before this function returns, so `bytes` is
    // borrowed for the whole operation.
    let buf = unsafe { UserBuf::new(bytes.as_ptr(), bytes.len()) };
    let id = p2p.isend(dest, tag, context, buf, sync)?;
    Ok(p2p.wait(id)?)
}

/// Receives into `bytes` from world rank `source` (or any) in `context` and waits
/// (`MPI_Recv`).
#[inline]
pub(super) fn receive(
    p2p: &mut PointToPoint,
    source: Option<usize>,
    tag: Option<i32>,
    context: u32,
    bytes: &mut [u8],
) -> Result<Status> {
    // SAFETY: as for `send`; `bytes` is exclusively borrowed for the call.
    let buf = unsafe { UserBufMut::new(bytes.as_mut_ptr(), bytes.len()) };
    let id = p2p.irecv(source, tag, context, buf)?;
    Ok(p2p.wait(id)?)
}

/// Receives the message a matched probe parked under `handle` into `bytes` and waits
/// (`MPI_Mrecv`).
#[inline]
pub(super) fn matched_receive(
    p2p: &RefCell<PointToPoint>,
    handle: MessageHandle,
    bytes: &mut [u8],
) -> Result<Status> {
    // A message dropped while unwinding out of a call that holds the layer cannot be
    // received; say so instead of panicking again.
    let mut p2p = p2p.try_borrow_mut().map_err(|_| {
        Error::InvalidArgument("a matched message was received during another call".into())
    })?;
    // SAFETY: as for `send`; `bytes` is exclusively borrowed for the call.
    let buf = unsafe { UserBufMut::new(bytes.as_mut_ptr(), bytes.len()) };
    let id = p2p.imrecv(handle, buf)?;
    Ok(p2p.wait(id)?)
}
