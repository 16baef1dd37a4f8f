//! Communicators ([`Communicator`], [`SimpleCommunicator`]), the processes in them
//! ([`Process`], [`AnyProcess`]: rsmpi keeps them in `topology` too) and the colors and keys
//! of a split.

use std::any::{Any, TypeId};
use std::collections::HashMap;

use crate::backend::{CommBackend, CommunicatorBackend};
use crate::datatype::{packed, Buffer, BufferMut, Count, Landing};
use crate::error::{fatal, Error, ErrorClass, Result};
use crate::topology::cartesian::{self, CartesianCommunicator};
use crate::topology::group::{Group, GroupRelation, UserGroup};
use crate::topology::intercommunicator::InterCommunicator;

/// A rank, as rsmpi types it.
pub type Rank = i32;
/// A message tag, as rsmpi types it.
pub type Tag = i32;
/// The key that orders the ranks of a split (`MPI_Comm_split`'s `key`), as rsmpi types it.
pub type Key = i32;

/// Which new communicator a rank joins in [`Communicator::split_by_color`] (rsmpi's
/// `Color`): ranks that pass the same color join the same one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Color(i32);

impl Color {
    /// The value standing for `MPI_UNDEFINED` (MPICH's).
    const UNDEFINED: i32 = -32766;

    /// `MPI_UNDEFINED`: the rank takes part in the split but joins no communicator, and
    /// gets `None`.
    pub fn undefined() -> Color {
        Color(Self::UNDEFINED)
    }

    /// A color; panics if `value` is negative (MPI requires colors to be non-negative;
    /// rsmpi panics the same way).
    pub fn with_value(value: i32) -> Color {
        assert!(value >= 0, "Value of color must be non-negative.");
        Color(value)
    }

    /// Whether this is [`Color::undefined`].
    pub fn is_undefined(&self) -> bool {
        self.0 < 0
    }
}

/// How two communicators relate (`MPI_Comm_compare`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommunicatorRelation {
    /// The same communicator.
    Identical,
    /// The same ranks in the same order, another context.
    Congruent,
    /// The same ranks in another order.
    Similar,
    /// Other ranks.
    Unequal,
}

/// A value kept on a communicator (rsmpi's `CommAttribute`, MPI's attribute caching),
/// found by its type.
pub trait CommAttribute: 'static + Sized + Clone {
    /// Whether [`Communicator::duplicate`] copies it (a clone) to the new communicator.
    const CLONE_ON_DUP: bool = false;
}

/// The attributes of one communicator, by type.
#[derive(Default)]
pub struct Attributes {
    values: HashMap<TypeId, Attribute>,
}

/// How an attribute that goes to duplicates is cloned.
type CloneAttribute = fn(&dyn Any) -> Box<dyn Any>;

/// An attribute and, if it goes to duplicates, how to clone it.
struct Attribute {
    value: Box<dyn Any>,
    clone_on_dup: Option<CloneAttribute>,
}

impl Attributes {
    /// The attributes a duplicate gets.
    fn for_duplicate(&self) -> Attributes {
        let values = self
            .values
            .iter()
            .filter_map(|(id, a)| {
                let clone = a.clone_on_dup?;
                let value = clone(&*a.value);
                Some((
                    *id,
                    Attribute {
                        value,
                        clone_on_dup: a.clone_on_dup,
                    },
                ))
            })
            .collect();
        Attributes { values }
    }
}

impl std::fmt::Debug for Attributes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attributes")
            .field("count", &self.values.len())
            .finish()
    }
}

/// What every communicator offers (rsmpi's `Communicator`). Usable as `dyn Communicator`.
pub trait Communicator {
    /// The communicator this is.
    fn as_simple(&self) -> &SimpleCommunicator;
    /// Its attributes, to change.
    fn attributes_mut(&mut self) -> &mut Attributes;

    /// This process's rank in the communicator.
    fn rank(&self) -> Rank {
        self.as_simple().backend().rank() as Rank
    }
    /// Number of ranks.
    fn size(&self) -> Rank {
        self.as_simple().backend().size() as Rank
    }
    /// The process at `rank`, to send to or receive from.
    fn process_at_rank(&self, rank: Rank) -> Process<'_> {
        Process {
            comm: self.as_simple(),
            rank,
        }
    }
    /// Any process, to receive from (`MPI_ANY_SOURCE`).
    fn any_process(&self) -> AnyProcess<'_> {
        AnyProcess {
            comm: self.as_simple(),
        }
    }
    /// This process, to send to itself.
    fn this_process(&self) -> Process<'_> {
        self.process_at_rank(self.rank())
    }

    /// How this communicator relates to `other` (`MPI_Comm_compare`).
    fn compare(&self, other: &dyn Communicator) -> CommunicatorRelation {
        let (a, b) = (self.as_simple(), other.as_simple());
        if std::ptr::eq(a, b) || a.backend().same_context(b.backend()) {
            return CommunicatorRelation::Identical;
        }
        match fatal(a.group().try_compare(&b.group())) {
            GroupRelation::Identical => CommunicatorRelation::Congruent,
            GroupRelation::Similar => CommunicatorRelation::Similar,
            GroupRelation::Unequal => CommunicatorRelation::Unequal,
        }
    }

    /// A new communicator with the same ranks and a context of its own (`MPI_Comm_dup`):
    /// its messages never match this one's, and it gets the attributes that ask for it.
    /// Collective: every rank calls it. Panics on error.
    fn duplicate(&self) -> SimpleCommunicator {
        fatal(self.try_duplicate())
    }
    /// [`Communicator::split_by_color_with_key`] with key 0: the ranks keep their order.
    fn split_by_color(&self, color: Color) -> Option<SimpleCommunicator> {
        fatal(self.try_split_by_color_with_key(color, 0))
    }
    /// Splits the communicator (`MPI_Comm_split`): the ranks that pass the same `color`
    /// form a new communicator, ranked by `key`, then by their rank here. Collective:
    /// every rank calls it; a rank passing [`Color::undefined`] joins none and gets
    /// `None`. Panics on error.
    fn split_by_color_with_key(&self, color: Color, key: Key) -> Option<SimpleCommunicator> {
        fatal(self.try_split_by_color_with_key(color, key))
    }
    /// Ends the whole job with exit status `errorcode` (`MPI_Abort`): every rank of it is
    /// stopped, not only this communicator's (as MPI implementations do). Under `pwrun` the
    /// launcher stops the others when this rank exits; under `srun` and `mpirun` the rank
    /// asks the process manager to (PMI's or PMIx's abort, or `MPI_Abort`).
    fn abort(&self, errorcode: i32) -> ! {
        let me = self.as_simple();
        let boot = me.backend().bootstrap();
        eprintln!(
            "pagewire: rank {} called abort({errorcode}); the job is stopped",
            boot.rank()
        );
        crate::backend::clean_up_after_panic(boot);
        // The process manager ends the others (PMI's and PMIx's abort, MPI_Abort); pwrun
        // does when this rank exits with the code.
        boot.abort(
            errorcode,
            &format!("rank {} called abort({errorcode})", boot.rank()),
        );
        std::process::exit(errorcode)
    }
    /// Splits the communicator into one per host (`MPI_Comm_split_type` with
    /// `MPI_COMM_TYPE_SHARED`): the ranks that can share memory (the same kernel, `/dev/shm`
    /// and PID namespace) form one, ranked by `key`, then by their rank here; what
    /// `Window::allocate_shared` needs. Collective. Panics on error.
    fn split_shared(&self, key: Key) -> SimpleCommunicator {
        fatal(self.try_split_shared(key))
    }
    /// The communicator of the ranks of `group`, in its order (`MPI_Comm_create`):
    /// collective over this communicator; ranks may pass disjoint groups, and each gets
    /// the communicator of its own, or `None` if it is not in the group it passed.
    fn split_by_subgroup_collective(&self, group: &dyn Group) -> Option<SimpleCommunicator> {
        fatal(self.try_split_by_subgroup_collective(group))
    }
    /// The communicator of the ranks of `group` (`MPI_Comm_create_group`): collective over
    /// the group's members only; `None` for a rank outside it.
    fn split_by_subgroup(&self, group: &dyn Group) -> Option<SimpleCommunicator> {
        fatal(self.try_split_by_subgroup(group))
    }
    /// The ranks of this communicator as a group (`MPI_Comm_group`).
    fn group(&self) -> UserGroup {
        fatal(self.try_group())
    }
    /// The grid of `dims` (periodic where `periods` says) over the first ranks
    /// (`MPI_Cart_create`): collective; `None` for ranks beyond the grid. `reorder` is
    /// accepted; pagewire keeps the order. Panics on error.
    fn create_cartesian_communicator(
        &self,
        dims: &[Count],
        periods: &[bool],
        reorder: bool,
    ) -> Option<CartesianCommunicator>
    where
        Self: Sized,
    {
        let _ = reorder;
        fatal(cartesian::create(self, dims, periods))
    }
    /// The rank the caller would have in a grid of `dims` (`MPI_Cart_map`); `None` if it
    /// would be outside.
    fn cartesian_map(&self, dims: &[Count], periods: &[bool]) -> Option<Rank>
    where
        Self: Sized,
    {
        assert_eq!(
            dims.len(),
            periods.len(),
            "pagewire: one period per dimension"
        );
        cartesian::map(self, dims)
    }
    /// The communicator to the processes that spawned this one (`MPI_Comm_get_parent`), if
    /// they did (see [`InterCommunicator`]).
    fn parent(&self) -> Option<InterCommunicator> {
        fatal(self.as_simple().backend().parent()).map(InterCommunicator::new)
    }
    /// The communicator's name (`MPI_Comm_get_name`).
    fn get_name(&self) -> String {
        self.as_simple().name.borrow().clone()
    }
    /// Names the communicator (`MPI_Comm_set_name`); the name is this process's own.
    fn set_name(&self, name: &str) {
        *self.as_simple().name.borrow_mut() = name.to_string();
    }
    /// `buf` packed into bytes (`MPI_Pack`): its blocks one after another.
    fn pack<B: Buffer + ?Sized>(&self, buf: &B) -> Vec<u8>
    where
        Self: Sized,
    {
        packed(buf).into_owned()
    }
    /// Unpacks `packed` from byte `position` into `buf` (`MPI_Unpack`); returns the
    /// position after what it used.
    ///
    /// # Safety
    ///
    /// The bytes must be valid for `buf`'s elements (as rsmpi's).
    #[allow(unsafe_code)]
    unsafe fn unpack_into<B: BufferMut + ?Sized>(
        &self,
        packed: &[u8],
        buf: &mut B,
        position: Count,
    ) -> Count
    where
        Self: Sized,
    {
        let start = usize::try_from(position).expect("pagewire: a negative position");
        let packed = &packed[start.min(packed.len())..];
        let mut landing = Landing::new(buf);
        let n = landing.packed_len().min(packed.len());
        landing.unpack(&packed[..n]);
        position + n as Count
    }

    /// [`Communicator::duplicate`], returning errors.
    fn try_duplicate(&self) -> Result<SimpleCommunicator> {
        let me = self.as_simple();
        let mut dup = SimpleCommunicator::new(me.backend().duplicate()?);
        dup.attributes = me.attributes.for_duplicate();
        Ok(dup)
    }
    /// [`Communicator::split_by_color_with_key`], returning errors.
    fn try_split_by_color_with_key(
        &self,
        color: Color,
        key: Key,
    ) -> Result<Option<SimpleCommunicator>> {
        let color = (!color.is_undefined()).then_some(color.0);
        let sub = self.as_simple().backend().split(color, key)?;
        Ok(sub.map(SimpleCommunicator::new))
    }
    /// [`Communicator::split_shared`], returning errors.
    fn try_split_shared(&self, key: Key) -> Result<SimpleCommunicator> {
        use crate::collective::CommunicatorCollectives;
        use pagewire_transport::sys::{HostKey, HOST_KEY_BYTES};
        let mut mine = Vec::with_capacity(HOST_KEY_BYTES);
        HostKey::here().encode(&mut mine);
        let mut all = vec![0u8; HOST_KEY_BYTES * self.size() as usize];
        self.try_all_gather_into(&mine[..], &mut all[..])?;
        // The color: the first rank of this host.
        let first = all
            .chunks_exact(HOST_KEY_BYTES)
            .position(|k| k == &mine[..])
            .expect("this rank's own key is among them");
        let sub = self.try_split_by_color_with_key(Color::with_value(first as i32), key)?;
        Ok(sub.expect("a defined color always gives a communicator"))
    }
    /// [`Communicator::split_by_subgroup_collective`], returning errors.
    fn try_split_by_subgroup_collective(
        &self,
        group: &dyn Group,
    ) -> Result<Option<SimpleCommunicator>> {
        // A split: the color names the group by its first world rank (disjoint groups get
        // different colors), the key orders by position in it.
        let world = group.world_ranks();
        let me = fatal(self.as_simple().backend().world_ranks())[self.rank() as usize];
        let (color, key) = match world.iter().position(|&w| w == me) {
            Some(at) => (Color::with_value(world[0] as i32), at as Key),
            None => (Color::undefined(), 0),
        };
        self.try_split_by_color_with_key(color, key)
    }
    /// [`Communicator::split_by_subgroup`], returning errors.
    fn try_split_by_subgroup(&self, group: &dyn Group) -> Result<Option<SimpleCommunicator>> {
        let backend = self.as_simple().backend();
        let mine = backend.world_ranks()?;
        let members: Vec<usize> = group
            .world_ranks()
            .iter()
            .map(|w| {
                mine.iter().position(|m| m == w).ok_or_else(|| {
                    Error::invalid(
                        ErrorClass::Group,
                        format!("world rank {w} of the group is not in the communicator"),
                    )
                })
            })
            .collect::<Result<_>>()?;
        if !members.contains(&(self.rank() as usize)) {
            return Ok(None);
        }
        let sub = backend.create_from_members(&members, 0)?;
        Ok(Some(SimpleCommunicator::new(sub)))
    }
    /// [`Communicator::group`], returning errors.
    fn try_group(&self) -> Result<UserGroup> {
        let backend = self.as_simple().backend();
        let world = backend.world_ranks()?;
        let me = world[backend.rank()];
        Ok(UserGroup::new(world, Some(me)))
    }
}

/// Attributes of any communicator (rsmpi's `AnyCommunicator`).
pub trait AnyCommunicator: Communicator {
    /// The attribute of type `A`, if set.
    fn get_attr<A: CommAttribute>(&self) -> Option<&A> {
        let a = self.as_simple().attributes.values.get(&TypeId::of::<A>())?;
        a.value.downcast_ref()
    }
    /// Sets the attribute of type `A` (replacing one set before).
    fn set_attr<A: CommAttribute>(&mut self, value: A) {
        let clone_on_dup: Option<CloneAttribute> = if A::CLONE_ON_DUP {
            Some(|v| {
                Box::new(
                    v.downcast_ref::<A>()
                        .expect("an attribute of its type")
                        .clone(),
                )
            })
        } else {
            None
        };
        let attribute = Attribute {
            value: Box::new(value),
            clone_on_dup,
        };
        self.attributes_mut()
            .values
            .insert(TypeId::of::<A>(), attribute);
    }
}

impl<C: Communicator + ?Sized> AnyCommunicator for C {}

/// A communicator (`MPI_Comm`): ranks and a context that separates its traffic.
pub struct SimpleCommunicator {
    backend: CommBackend,
    name: std::cell::RefCell<String>,
    attributes: Attributes,
}

impl std::fmt::Debug for SimpleCommunicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimpleCommunicator")
            .field("rank", &self.backend.rank())
            .field("size", &self.backend.size())
            .field("backend", &self.backend)
            .finish()
    }
}

impl SimpleCommunicator {
    /// The communicator on `backend`.
    pub(crate) fn new(backend: CommBackend) -> SimpleCommunicator {
        SimpleCommunicator {
            backend,
            name: std::cell::RefCell::new(String::new()),
            attributes: Attributes::default(),
        }
    }

    /// The world communicator on `backend`, named as MPI names it.
    pub(crate) fn world(backend: CommBackend) -> SimpleCommunicator {
        let world = SimpleCommunicator::new(backend);
        *world.name.borrow_mut() = "MPI_COMM_WORLD".into();
        world
    }

    /// What carries this communicator's calls.
    pub(crate) fn backend(&self) -> &CommBackend {
        &self.backend
    }

    /// Makes progress on every outstanding operation (for polling loops). On the mpi
    /// transport, MPI progresses inside its own calls, and this does nothing.
    pub fn progress(&self) -> Result<()> {
        self.backend.progress()
    }
}

impl Communicator for SimpleCommunicator {
    fn as_simple(&self) -> &SimpleCommunicator {
        self
    }
    fn attributes_mut(&mut self) -> &mut Attributes {
        &mut self.attributes
    }
}

/// A process of a communicator, to send to or receive from.
#[derive(Clone, Copy, Debug)]
pub struct Process<'c> {
    pub(crate) comm: &'c SimpleCommunicator,
    pub(crate) rank: Rank,
}

impl Process<'_> {
    /// The process's rank in its communicator.
    pub fn rank(&self) -> Rank {
        self.rank
    }
    /// Whether this is the calling process.
    pub fn is_self(&self) -> bool {
        self.rank == self.comm.rank()
    }
}

/// Any process of a communicator, to receive from.
#[derive(Clone, Copy, Debug)]
pub struct AnyProcess<'c> {
    pub(crate) comm: &'c SimpleCommunicator,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colors() {
        assert!(Color::undefined().is_undefined());
        assert!(!Color::with_value(0).is_undefined());
        assert!(std::panic::catch_unwind(|| Color::with_value(-1)).is_err());
    }
}
