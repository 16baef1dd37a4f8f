//! `MPI_Sendrecv` and `MPI_Sendrecv_replace`: a send and a receive that cannot deadlock.

use std::borrow::Cow;

use super::source::Source;
use super::Destination;
use crate::backend::PointToPointBackend;
use crate::datatype::{packed, Buffer, BufferMut, Equivalence, Landing, UncommittedDatatype};
use crate::error::fatal;
use crate::request::{self, Pending};
use crate::status::Status;
use crate::topology::Tag;

/// Sends `msg` to `destination` and receives into `buf` from `source`, without deadlock
/// whatever the others do (`MPI_Sendrecv`); panics on error.
pub fn send_receive_into<M, D, B, S>(msg: &M, destination: &D, buf: &mut B, source: &S) -> Status
where
    M: Buffer + ?Sized,
    D: Destination,
    B: BufferMut + ?Sized,
    S: Source,
{
    send_receive_into_with_tags(msg, destination, 0, buf, source, None)
}

/// [`send_receive_into`] with a send tag and a receive tag (`None`: any).
pub fn send_receive_into_with_tags<M, D, B, S>(
    msg: &M,
    destination: &D,
    send_tag: Tag,
    buf: &mut B,
    source: &S,
    receive_tag: Option<Tag>,
) -> Status
where
    M: Buffer + ?Sized,
    D: Destination,
    B: BufferMut + ?Sized,
    S: Source,
{
    // Contiguous buffers on one communicator: one call of the backend, no requests.
    if std::ptr::eq(destination.destination_comm(), source.comm())
        && msg.as_datatype().type_map().is_contiguous()
    {
        if let Some(bytes) = Landing::new(buf).contiguous() {
            let (dest, src) = (fatal(destination.destination()), fatal(source.source()));
            let backend = destination.destination_comm().backend();
            return Status::new(fatal(backend.send_receive(
                dest,
                send_tag,
                &packed(msg),
                src,
                receive_tag,
                bytes,
            )));
        }
    }
    // The receive goes first, as MPICH's and Open MPI's MPI_Sendrecv post theirs: the
    // partner's message then finds it posted instead of arriving unexpected (and being
    // copied twice) while this rank is still sending.
    request::scope(|scope| {
        let received = fatal(source.try_immediate_receive_into_with_tag(scope, buf, receive_tag));
        let send = destination.immediate_send_with_tag(scope, msg, send_tag);
        let status = received.wait();
        send.wait();
        status
    })
}

/// Sends `msg` to `destination` and receives one value from `source` (`MPI_Sendrecv`).
pub fn send_receive<R, M, D, S>(msg: &M, destination: &D, source: &S) -> (R, Status)
where
    R: Equivalence,
    M: Buffer + ?Sized,
    D: Destination,
    S: Source,
{
    let future = source.immediate_receive::<R>();
    request::scope(|scope| {
        let send = destination.immediate_send(scope, msg);
        let received = future.get();
        send.wait();
        received
    })
}

/// Sends `buf` to `destination` and receives into it from `source`
/// (`MPI_Sendrecv_replace`).
pub fn send_receive_replace_into<B, D, S>(buf: &mut B, destination: &D, source: &S) -> Status
where
    B: Buffer + BufferMut + ?Sized,
    D: Destination,
    S: Source,
{
    let copy: Vec<u8> = packed(buf).into_owned();
    let dest = fatal(destination.destination());
    let backend = destination.destination_comm().backend();
    request::scope(|scope| {
        let received = fatal(source.try_immediate_receive_into_with_tag(scope, buf, None));
        let mut op = fatal(request::start_send(
            backend,
            dest,
            0,
            Cow::Owned(copy),
            false,
        ));
        let status = received.wait();
        fatal(op.wait());
        status
    })
}
