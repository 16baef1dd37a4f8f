//! Point-to-point on pagewire's stack: the message layer's calls in the communicator's
//! context, ranks translated to and from world ranks; its requests ([`PagewireRequest`]) and
//! matched messages ([`PagewireMessage`]).

use std::rc::Rc;
use std::time::{Duration, Instant};

use pagewire_transport::msg::raw::{Layout, UserBuf, UserBufMut};
use pagewire_transport::msg::{MessageHandle, PointToPoint, RequestId, Status};

use super::{blocking, in_group, PagewireComm, PagewireUniverse, RankMap};
use crate::backend::traits::{
    CommunicatorBackend, MessageBackend, PointToPointBackend, RequestBackend,
};
use crate::error::Result;

impl PointToPointBackend for PagewireComm {
    type Request = PagewireRequest;
    type Message = PagewireMessage;

    fn send(&self, dest: usize, tag: i32, bytes: &[u8], sync: bool) -> Result<Status> {
        let mut p2p = self.universe.p2p.borrow_mut();
        let dest = self.world_rank(dest);
        blocking::send(&mut p2p, dest, tag, self.context, bytes, sync)
            .map(|s| in_group(self.ranks.as_deref(), s))
    }

    fn receive(&self, source: Option<usize>, tag: Option<i32>, bytes: &mut [u8]) -> Result<Status> {
        let mut p2p = self.universe.p2p.borrow_mut();
        let source = source.map(|r| self.world_rank(r));
        blocking::receive(&mut p2p, source, tag, self.context, bytes)
            .map(|s| in_group(self.ranks.as_deref(), s))
    }

    fn send_receive(
        &self,
        dest: usize,
        send_tag: i32,
        send: &[u8],
        source: Option<usize>,
        recv_tag: Option<i32>,
        recv: &mut [u8],
    ) -> Result<Status> {
        let mut p2p = self.universe.p2p.borrow_mut();
        let (dest, source) = (self.world_rank(dest), source.map(|r| self.world_rank(r)));
        let s = p2p.sendrecv(dest, send_tag, send, source, recv_tag, recv, self.context)?;
        Ok(in_group(self.ranks.as_deref(), s))
    }

    fn moves_in_place(&self, layout: &Layout) -> bool {
        self.universe.p2p.borrow().moves_in_place(layout)
    }

    fn immediate_send(
        &self,
        dest: usize,
        tag: i32,
        buf: UserBuf,
        sync: bool,
    ) -> Result<PagewireRequest> {
        let id = self.universe.p2p.borrow_mut().isend(
            self.world_rank(dest),
            tag,
            self.context,
            buf,
            sync,
        )?;
        Ok(self.request(id))
    }

    fn immediate_receive(
        &self,
        source: Option<usize>,
        tag: Option<i32>,
        buf: UserBufMut,
    ) -> Result<PagewireRequest> {
        let id = self.universe.p2p.borrow_mut().irecv(
            source.map(|r| self.world_rank(r)),
            tag,
            self.context,
            buf,
        )?;
        Ok(self.request(id))
    }

    fn immediate_probe(&self, source: Option<usize>, tag: Option<i32>) -> Result<Option<Status>> {
        let source = source.map(|r| self.world_rank(r));
        let found = self
            .universe
            .p2p
            .borrow_mut()
            .iprobe(source, tag, self.context)?;
        Ok(found.map(|s| in_group(self.ranks.as_deref(), s)))
    }

    fn immediate_matched_probe(
        &self,
        source: Option<usize>,
        tag: Option<i32>,
    ) -> Result<Option<(PagewireMessage, Status)>> {
        let source = source.map(|r| self.world_rank(r));
        let found = self
            .universe
            .p2p
            .borrow_mut()
            .improbe(source, tag, self.context)?;
        Ok(found.map(|(handle, status)| {
            let status = in_group(self.ranks.as_deref(), status);
            let message = PagewireMessage {
                universe: self.universe.clone(),
                ranks: self.ranks.clone(),
                handle: Some(handle),
                len: status.count,
            };
            (message, status)
        }))
    }

    fn check_senders(&self, source: Option<usize>) -> Result<()> {
        let senders: Vec<usize> = match source {
            Some(r) => vec![self.world_rank(r)],
            None => (0..self.target_size())
                .map(|r| self.world_rank(r))
                .collect(),
        };
        Ok(self
            .universe
            .p2p
            .borrow_mut()
            .check_probe_senders(&senders)?)
    }
}

impl PagewireComm {
    /// The request of operation `id`, started on this communicator.
    fn request(&self, id: RequestId) -> PagewireRequest {
        PagewireRequest {
            universe: self.universe.clone(),
            ranks: self.ranks.clone(),
            id: Some(id),
        }
    }
}

/// An operation of the message layer that nobody has completed yet.
pub(crate) struct PagewireRequest {
    universe: Rc<PagewireUniverse>,
    /// The communicator's group, to report the source as its rank.
    ranks: Option<Rc<RankMap>>,
    /// `None` once completed.
    id: Option<RequestId>,
}

impl std::fmt::Debug for PagewireRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PagewireRequest")
            .field("id", &self.id)
            .finish()
    }
}

impl RequestBackend for PagewireRequest {
    #[inline]
    fn wait(&mut self) -> Result<Status> {
        let id = self.id.take().expect("a request not completed yet");
        let r = self.universe.p2p.borrow_mut().wait(id);
        Ok(in_group(self.ranks.as_deref(), r?))
    }

    #[inline]
    fn test(&mut self) -> Result<Option<Status>> {
        let id = self.id.expect("a request not completed yet");
        let r = self.universe.p2p.borrow_mut().test(id)?;
        match r {
            None => Ok(None),
            Some(result) => {
                self.id = None;
                Ok(Some(in_group(self.ranks.as_deref(), result?)))
            }
        }
    }

    fn is_done(&self) -> bool {
        let Some(id) = self.id else {
            return true;
        };
        let mut p2p = self.universe.p2p.borrow_mut();
        let _ = p2p.progress();
        p2p.is_done(id)
    }

    fn cancel(&mut self) -> bool {
        match self.id {
            Some(id) => self.universe.p2p.borrow_mut().cancel(id),
            None => false,
        }
    }
}

impl Drop for PagewireRequest {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            finish_abandoned(&mut self.universe.p2p.borrow_mut(), id);
        }
    }
}

/// How long a rank unwinding from a panic lets an abandoned operation finish before it
/// ends the process.
const PANIC_GRACE: Duration = Duration::from_secs(1);

/// Ends an operation nobody will complete: cancel if it has not matched, else wait.
///
/// A rank unwinding from a panic cannot wait for ever: its peer may never match the
/// operation (it may be waiting for this rank elsewhere), and the launcher sees the failure
/// only once the process ends. Nor may it return while the NIC or the peer can still use
/// the buffer, which the unwinding frees. So it gives the operation [`PANIC_GRACE`] and then
/// ends the process with the panic's exit status, as MPI does on a fatal error
/// (the panic message is already printed).
fn finish_abandoned(p2p: &mut PointToPoint, id: RequestId) {
    if p2p.cancel(id) {
        let _ = p2p.test(id);
        return;
    }
    if !std::thread::panicking() {
        let _ = p2p.wait(id);
        return;
    }
    let deadline = Instant::now() + PANIC_GRACE;
    while Instant::now() < deadline {
        if !matches!(p2p.test(id), Ok(None)) {
            return;
        }
    }
    eprintln!(
        "pagewire: rank {} panicked with a nonblocking operation still in flight; \
         ending the process so that the job ends",
        p2p.rank()
    );
    std::process::exit(PANIC_EXIT_STATUS);
}

/// The exit status of a Rust program that panicked.
const PANIC_EXIT_STATUS: i32 = 101;

/// A message a matched probe parked in the message layer.
pub(crate) struct PagewireMessage {
    universe: Rc<PagewireUniverse>,
    ranks: Option<Rc<RankMap>>,
    /// `None` once received.
    handle: Option<MessageHandle>,
    /// The message's size in bytes.
    len: usize,
}

impl std::fmt::Debug for PagewireMessage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PagewireMessage")
            .field("handle", &self.handle)
            .field("len", &self.len)
            .finish()
    }
}

impl MessageBackend for PagewireMessage {
    type Request = PagewireRequest;

    fn receive(mut self, bytes: &mut [u8]) -> Result<Status> {
        let handle = self.handle.take().expect("an unreceived message");
        blocking::matched_receive(&self.universe.p2p, handle, bytes)
            .map(|s| in_group(self.ranks.as_deref(), s))
    }

    fn moves_in_place(&self, layout: &Layout) -> bool {
        self.universe.p2p.borrow().moves_in_place(layout)
    }

    fn immediate_receive(mut self, buf: UserBufMut) -> Result<PagewireRequest> {
        let handle = self.handle.take().expect("an unreceived message");
        let id = self.universe.p2p.borrow_mut().imrecv(handle, buf)?;
        Ok(PagewireRequest {
            universe: self.universe.clone(),
            ranks: self.ranks.clone(),
            id: Some(id),
        })
    }
}

impl Drop for PagewireMessage {
    fn drop(&mut self) {
        if let Some(handle) = self.handle.take() {
            let mut scratch = vec![0u8; self.len];
            // A failure (the sender died, or the layer is busy in an unwinding caller) leaves
            // nothing more to do with a message nobody wants.
            let _ = blocking::matched_receive(&self.universe.p2p, handle, &mut scratch);
        }
    }
}
