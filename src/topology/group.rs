//! Groups of processes (rsmpi's `Group`, `UserGroup`, `SystemGroup`; `MPI_Group`): ordered
//! sets of processes, named by their world ranks, with the set operations of MPI chapter 6.
//! A group is local: making one never communicates.

use crate::topology::communicator::Rank;

/// How two groups relate (`MPI_Group_compare`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupRelation {
    /// The same processes in the same order.
    Identical,
    /// The same processes in another order.
    Similar,
    /// Other processes.
    Unequal,
}

/// What every group offers (rsmpi's `Group`).
pub trait Group {
    /// The world ranks of the group's processes, in the group's order.
    fn world_ranks(&self) -> &[usize];
    /// The calling process's world rank, if known.
    fn my_world_rank(&self) -> Option<usize>;

    /// Processes in the group.
    fn size(&self) -> Rank {
        self.world_ranks().len() as Rank
    }
    /// The calling process's rank in the group, if it is a member.
    fn rank(&self) -> Option<Rank> {
        let me = self.my_world_rank()?;
        self.world_ranks()
            .iter()
            .position(|&w| w == me)
            .map(|r| r as Rank)
    }
    /// How this group relates to `other`.
    fn compare(&self, other: &dyn Group) -> GroupRelation {
        let (a, b) = (self.world_ranks(), other.world_ranks());
        if a == b {
            return GroupRelation::Identical;
        }
        let (mut x, mut y) = (a.to_vec(), b.to_vec());
        x.sort_unstable();
        y.sort_unstable();
        if x == y {
            GroupRelation::Similar
        } else {
            GroupRelation::Unequal
        }
    }
    /// [`Group::compare`], for callers that want a `Result`.
    fn try_compare(&self, other: &dyn Group) -> crate::Result<GroupRelation> {
        Ok(self.compare(other))
    }
    /// This group's processes, then `other`'s that are not in it (`MPI_Group_union`).
    fn union(&self, other: &dyn Group) -> UserGroup {
        let mut w = self.world_ranks().to_vec();
        w.extend(
            other
                .world_ranks()
                .iter()
                .filter(|r| !self.world_ranks().contains(r)),
        );
        UserGroup::new(w, self.my_world_rank())
    }
    /// This group's processes that are in `other`, in this order
    /// (`MPI_Group_intersection`).
    fn intersection(&self, other: &dyn Group) -> UserGroup {
        let w = self
            .world_ranks()
            .iter()
            .copied()
            .filter(|r| other.world_ranks().contains(r))
            .collect();
        UserGroup::new(w, self.my_world_rank())
    }
    /// This group's processes that are not in `other` (`MPI_Group_difference`).
    fn difference(&self, other: &dyn Group) -> UserGroup {
        let w = self
            .world_ranks()
            .iter()
            .copied()
            .filter(|r| !other.world_ranks().contains(r))
            .collect();
        UserGroup::new(w, self.my_world_rank())
    }
    /// The processes at `ranks`, in that order (`MPI_Group_incl`). Panics on a rank
    /// outside the group.
    fn include(&self, ranks: &[Rank]) -> UserGroup {
        let w = ranks
            .iter()
            .map(|&r| self.world_ranks()[r as usize])
            .collect();
        UserGroup::new(w, self.my_world_rank())
    }
    /// The processes not at `ranks` (`MPI_Group_excl`).
    fn exclude(&self, ranks: &[Rank]) -> UserGroup {
        let w = self
            .world_ranks()
            .iter()
            .enumerate()
            .filter(|(i, _)| !ranks.contains(&(*i as Rank)))
            .map(|(_, &w)| w)
            .collect();
        UserGroup::new(w, self.my_world_rank())
    }
    /// The rank in `other` of the process at `rank` here (`MPI_Group_translate_ranks`).
    fn translate_rank(&self, rank: Rank, other: &dyn Group) -> Option<Rank> {
        let w = *self.world_ranks().get(usize::try_from(rank).ok()?)?;
        other
            .world_ranks()
            .iter()
            .position(|&o| o == w)
            .map(|r| r as Rank)
    }
    /// [`Group::translate_rank`] for many ranks.
    fn translate_ranks(&self, ranks: &[Rank], other: &dyn Group) -> Vec<Option<Rank>> {
        ranks
            .iter()
            .map(|&r| self.translate_rank(r, other))
            .collect()
    }
}

/// A group (rsmpi's `UserGroup`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserGroup {
    world: Vec<usize>,
    me: Option<usize>,
}

impl UserGroup {
    /// The group of `world` ranks; `me` is the caller's world rank.
    pub(crate) fn new(world: Vec<usize>, me: Option<usize>) -> UserGroup {
        UserGroup { world, me }
    }
}

impl Group for UserGroup {
    fn world_ranks(&self) -> &[usize] {
        &self.world
    }
    fn my_world_rank(&self) -> Option<usize> {
        self.me
    }
}

/// A predefined group (rsmpi's `SystemGroup`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SystemGroup;

impl SystemGroup {
    /// The empty group (`MPI_GROUP_EMPTY`).
    pub fn empty() -> UserGroup {
        UserGroup::new(Vec::new(), None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_operations_keep_order_and_membership() {
        let g = UserGroup::new(vec![0, 1, 2, 3], Some(2));
        assert_eq!(g.rank(), Some(2));
        let f = g.include(&[0, 1]);
        let s = g.exclude(&[0, 1]);
        assert_eq!(f.rank(), None);
        assert_eq!(s.rank(), Some(0));
        assert_eq!(f.union(&s).compare(&g), GroupRelation::Identical);
        assert_eq!(s.union(&f).compare(&g), GroupRelation::Similar);
        assert_eq!(g.difference(&f).compare(&s), GroupRelation::Identical);
        assert_eq!(
            f.intersection(&s).compare(&SystemGroup::empty()),
            GroupRelation::Identical
        );
        let rev = g.include(&[3, 2, 1, 0]);
        assert_eq!(rev.translate_rank(0, &g), Some(3));
        assert_eq!(f.compare(&s), GroupRelation::Unequal);
    }
}
