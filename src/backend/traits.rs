//! The seam's contract: what every backend does on one communicator, in the groups rsmpi's
//! traits follow (communicators, point-to-point, collectives), and what its nonblocking
//! requests and matched messages do.
//!
//! Ranks here are the communicator's own (`0..size`), checked by the caller; a backend maps
//! them to whatever it addresses (pagewire's: world ranks; MPI's: the same numbers). A
//! [`Status`] names its source by its rank in the communicator too. Operations that the rsmpi
//! API panics on go through these as `Result`s: the facade's `fatal` is applied above.

use std::process::Command;

use bytemuck::Pod;
use pagewire_collectives::{Element, Operation};
use pagewire_transport::boot::Bootstrap;
use pagewire_transport::msg::raw::{Layout, UserBuf, UserBufMut};
use pagewire_transport::msg::{PointToPoint, Status};

use crate::config::TransportKind;
use crate::datatype::Count;
use crate::error::Result;

use super::{CommBackend, MatchedMessage, PendingRequest};

backend_trait! {
    CommBackend =>
    /// A communicator's own operations (`MPI_Comm_*`), and the universe it belongs to.
    pub(crate) trait CommunicatorBackend: Sized {
        /// This process's rank in the communicator.
        fn rank(&self) -> usize;
        /// Ranks in the communicator.
        fn size(&self) -> usize;
        /// A communicator of the same ranks whose traffic never matches this one's
        /// (`MPI_Comm_dup`; collective).
        fn duplicate(&self) -> Result<Self> => [.map(Into::into)];
        /// The ranks passing the same `color` form a communicator, ordered by `key`, then by
        /// their rank here (`MPI_Comm_split`; collective); `None` (`MPI_UNDEFINED`) joins none.
        fn split(&self, color: Option<i32>, key: i32) -> Result<Option<Self>>
            => [.map(|c| c.map(Into::into))];
        /// The group of members `members` (ranks here, in the new order) as a communicator
        /// (`MPI_Comm_create_group`): collective over the members only; `tag` separates
        /// concurrent calls.
        fn create_from_members(&self, members: &[usize], tag: i32) -> Result<Self>
            => [.map(Into::into)];
        /// Whether `other` is this very communicator (the same context of the same universe).
        fn same_context(&self, other: &Self) -> bool as {
            match (self, other) {
                (Self::Pagewire(a), Self::Pagewire(b)) => a.same_context(b),
                #[cfg(feature = "mpi")]
                (Self::HostMpi(a), Self::HostMpi(b)) => a.same_context(b),
                #[cfg(feature = "mpi")]
                _ => false,
            }
        };
        /// Makes progress on outstanding operations, where the backend needs to be driven.
        fn progress(&self) -> Result<()>;
        /// The world rank of each rank (`MPI_Comm_group` translated to `MPI_COMM_WORLD`).
        fn world_ranks(&self) -> Result<Vec<usize>>;
        /// The same ranks with a context of their own for the messages of nonblocking
        /// collectives, and the tag of the next one (every rank starts them in the same order,
        /// so the tags agree): no point-to-point receive nor blocking collective matches them.
        fn nonblocking_channel(&self) -> Result<(Self, i32)> => [.map(|(c, t)| (c.into(), t))];
        /// Ranks that point-to-point calls address: [`CommunicatorBackend::size`], or the other
        /// group's size on an intercommunicator (rsmpi's `target_size`).
        fn target_size(&self) -> usize;
        /// Starts `maxprocs[i]` processes of `commands[i]`, the commands taken from `root`, and
        /// returns the intercommunicator to them (`MPI_Comm_spawn(_multiple)`; collective).
        fn spawn(&self, root: usize, commands: &[Command], maxprocs: &[i32]) -> Result<Self>
            => [.map(Into::into)];
        /// The intercommunicator to the processes that spawned this one, if they did
        /// (`MPI_Comm_get_parent`).
        fn parent(&self) -> Result<Option<Self>> => [.map(|p| p.map(Into::into))];
        /// Both groups of an intercommunicator as one communicator, this group's ranks after
        /// the other's when `high` (`MPI_Intercomm_merge`; collective over both groups).
        fn merge(&self, high: bool) -> Result<Self> => [.map(Into::into)];

        /// What carries the calls.
        fn transport(&self) -> TransportKind;
        /// The buffer mode moving user buffers (`"mpi"` where the MPI library moves them).
        fn mode_name(&self) -> &'static str;
        /// Runs `f` on pagewire's message layer, or says why this backend has none.
        fn with_message_layer[R](&self, f: impl FnOnce(&mut PointToPoint) -> R) -> Result<R>;
        /// The message layer's context of this communicator's point-to-point messages (a
        /// window's target answers its own in it); `None` without a message layer.
        fn message_context(&self) -> Option<u32>;
        /// The bootstrap the universe started with, which finalises it.
        fn bootstrap(&self) -> &dyn Bootstrap;
    }
}

backend_trait! {
    CommBackend =>
    /// Point-to-point operations (`MPI_Send` … `MPI_Improbe`) on one communicator.
    pub(crate) trait PointToPointBackend {
        types {
            /// A nonblocking operation it started.
            type Request: RequestBackend = PendingRequest;
            /// A message one of its matched probes took out of matching.
            type Message: MessageBackend<Request = Self::Request> = MatchedMessage;
        }

        /// Sends `bytes` to `dest` and returns once they may be reused (`MPI_Send`), or once the
        /// receiver has matched the message (`MPI_Ssend`) when `sync`.
        fn send(&self, dest: usize, tag: i32, bytes: &[u8], sync: bool) -> Result<Status>;
        /// Receives into `bytes` from `source` (`None`: any) with `tag` (`None`: any)
        /// (`MPI_Recv`).
        fn receive(
            &self,
            source: Option<usize>,
            tag: Option<i32>,
            bytes: &mut [u8],
        ) -> Result<Status>;
        /// Sends `send` to `dest` and receives into `recv` from `source` (`None`: any) with
        /// `recv_tag` (`None`: any) at once, the receive posted first (`MPI_Sendrecv`); the
        /// receive's status.
        fn send_receive(
            &self,
            dest: usize,
            send_tag: i32,
            send: &[u8],
            source: Option<usize>,
            recv_tag: Option<i32>,
            recv: &mut [u8],
        ) -> Result<Status>;
        /// Whether a buffer with gaps laid out as `layout` goes to [`Self::immediate_send`] or
        /// [`Self::immediate_receive`] as it is rather than packed (pagewire's message layer:
        /// `PointToPoint::moves_in_place`; the host MPI library is given packed bytes).
        fn moves_in_place(&self, layout: &Layout) -> bool;
        /// Starts sending `buf` (`MPI_Isend`, `MPI_Issend` when `sync`); the caller keeps it
        /// alive and unwritten until the request completes or is dropped.
        fn immediate_send(
            &self,
            dest: usize,
            tag: i32,
            buf: UserBuf,
            sync: bool,
        ) -> Result<Self::Request> => [.map(Into::into)];
        /// Starts receiving into `buf` (`MPI_Irecv`); the caller keeps it alive and untouched
        /// until the request completes or is dropped.
        fn immediate_receive(
            &self,
            source: Option<usize>,
            tag: Option<i32>,
            buf: UserBufMut,
        ) -> Result<Self::Request> => [.map(Into::into)];
        /// Reports a matching message if one has arrived (`MPI_Iprobe`).
        fn immediate_probe(
            &self,
            source: Option<usize>,
            tag: Option<i32>,
        ) -> Result<Option<Status>>;
        /// Takes a matching message out of matching if one has arrived (`MPI_Improbe`).
        fn immediate_matched_probe(
            &self,
            source: Option<usize>,
            tag: Option<i32>,
        ) -> Result<Option<(Self::Message, Status)>>
            => [.map(|found| found.map(|(message, status)| (message.into(), status)))];
        /// Fails if no rank that could send to a probe on `source` (`None`: any) is alive: what a
        /// blocking probe asks while it waits, so that it ends instead of spinning on dead senders.
        fn check_senders(&self, source: Option<usize>) -> Result<()>;
    }
}

backend_trait! {
    CommBackend =>
    /// Collective operations on one communicator. Data movement takes any plain-old-data
    /// elements, reductions [`Element`]s and an [`Operation`]. Varcount (v-) variants take
    /// [`Count`]s per rank, blocks packed in rank order. A rooted call's root-only buffer is
    /// `Some` when the caller called the root's variant (on the root or not).
    pub(crate) trait CollectiveBackend {
        /// `MPI_Barrier`.
        fn barrier(&self) -> Result<()>;
        /// `MPI_Bcast` of `buf` from `root`.
        fn broadcast[T: Pod](&self, root: usize, buf: &mut [T]) -> Result<()>;
        /// `MPI_Reduce` of every rank's `send` into `recv` at `root`.
        fn reduce[T: Element, O: Operation<T>](
            &self,
            root: usize,
            send: &[T],
            recv: Option<&mut [T]>,
            op: &O,
        ) -> Result<()>;
        /// `MPI_Allreduce`.
        fn all_reduce[T: Element, O: Operation<T>](
            &self,
            send: &[T],
            recv: &mut [T],
            op: &O,
        ) -> Result<()>;
        /// `MPI_Allgather`: `recv` holds `size · send.len()` elements.
        fn all_gather[T: Pod](&self, send: &[T], recv: &mut [T]) -> Result<()>;
        /// `MPI_Allgatherv`: rank `j` contributes `counts[j]` elements.
        fn all_gather_varcount[T: Pod](
            &self,
            send: &[T],
            recv: &mut [T],
            counts: &[Count],
        ) -> Result<()>;
        /// `MPI_Alltoall`: block `j` of `send` to rank `j`, block `j` of `recv` from it.
        fn all_to_all[T: Pod](&self, send: &[T], recv: &mut [T]) -> Result<()>;
        /// `MPI_Alltoallv`: `send_counts[j]` elements to rank `j`, `recv_counts[j]` from it.
        fn all_to_all_varcount[T: Pod](
            &self,
            send: &[T],
            send_counts: &[Count],
            recv: &mut [T],
            recv_counts: &[Count],
        ) -> Result<()>;
        /// `MPI_Gather` to `root`.
        fn gather[T: Pod](&self, root: usize, send: &[T], recv: Option<&mut [T]>) -> Result<()>;
        /// `MPI_Gatherv` to `root`, which passes the counts of every rank.
        fn gather_varcount[T: Pod](
            &self,
            root: usize,
            send: &[T],
            recv: Option<(&mut [T], &[Count])>,
        ) -> Result<()>;
        /// `MPI_Scatter` from `root`.
        fn scatter[T: Pod](&self, root: usize, send: Option<&[T]>, recv: &mut [T]) -> Result<()>;
        /// `MPI_Scatterv` from `root`, which passes the counts of every rank.
        fn scatter_varcount[T: Pod](
            &self,
            root: usize,
            send: Option<(&[T], &[Count])>,
            recv: &mut [T],
        ) -> Result<()>;
        /// `MPI_Reduce_scatter_block`: `send` holds `size · recv.len()` elements.
        fn reduce_scatter_block[T: Element, O: Operation<T>](
            &self,
            send: &[T],
            recv: &mut [T],
            op: &O,
        ) -> Result<()>;
        /// `MPI_Reduce_scatter`: block `j` (`counts[j]` elements) of the reduction to rank `j`.
        fn reduce_scatter[T: Element, O: Operation<T>](
            &self,
            send: &[T],
            recv: &mut [T],
            counts: &[Count],
            op: &O,
        ) -> Result<()>;
        /// `MPI_Scan`: rank `r` gets the reduction of ranks `0..=r`.
        fn scan[T: Element, O: Operation<T>](
            &self,
            send: &[T],
            recv: &mut [T],
            op: &O,
        ) -> Result<()>;
    }
}

backend_trait! {
    PendingRequest =>
    /// A nonblocking operation a backend started (`MPI_Request`). Dropping one that has not
    /// completed ends it as nobody will complete it: a receive that has not matched is cancelled,
    /// anything else waited for, so its buffer is never used afterwards.
    pub(crate) trait RequestBackend {
        /// Waits for completion (`MPI_Wait`).
        fn wait(&mut self) -> Result<Status>;
        /// Completes the operation if it is done (`MPI_Test`): `Some` once complete. After
        /// `Some` or an error there is nothing left to complete.
        fn test(&mut self) -> Result<Option<Status>>;
        /// Whether the operation has finished, without completing it.
        fn is_done(&self) -> bool;
        /// Cancels a receive that has not matched (`MPI_Cancel`): true if it was, and its
        /// completion then reports [`Error::Cancelled`](crate::Error::Cancelled).
        fn cancel(&mut self) -> bool;
    }
}

backend_trait! {
    MatchedMessage =>
    /// A message that a matched probe took out of matching (`MPI_Message`). Dropping one that
    /// was not received receives it into a scratch buffer and discards it, so its sender is
    /// never left waiting.
    pub(crate) trait MessageBackend {
        types {
            /// The request of a nonblocking receive of the message.
            type Request: RequestBackend = PendingRequest;
        }
        /// Receives the message into `bytes` (`MPI_Mrecv`).
        fn receive(self, bytes: &mut [u8]) -> Result<Status>;
        /// As [`PointToPointBackend::moves_in_place`], for a receive of this message.
        fn moves_in_place(&self, layout: &Layout) -> bool;
        /// Starts receiving the message into `buf` (`MPI_Imrecv`); the caller keeps it alive and
        /// untouched until the request completes or is dropped.
        fn immediate_receive(self, buf: UserBufMut) -> Result<Self::Request> => [.map(Into::into)];
    }
}
