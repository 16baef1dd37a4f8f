//! Cartesian topologies (rsmpi's `CartesianCommunicator`, MPI chapter 7): a communicator
//! whose ranks are the points of a grid, in row-major order, with neighbours along each
//! dimension (periodic or not).
//!
//! pagewire places ranks without looking at the machine (`reorder` keeps the order): a
//! grid's rank `r` is rank `r` of the communicator it was made from.

use crate::datatype::Count;
use crate::error::{fatal, Error, Result};
use crate::topology::communicator::{Attributes, Color, Communicator, SimpleCommunicator};
use crate::topology::Rank;

/// The shape of a grid and a process's place in it (rsmpi's `CartesianLayout`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CartesianLayout {
    /// Processes along each dimension.
    pub dims: Vec<Count>,
    /// Whether each dimension wraps around.
    pub periods: Vec<bool>,
    /// The calling process's coordinates.
    pub coords: Vec<Count>,
}

/// A communicator with a Cartesian topology (rsmpi's `CartesianCommunicator`).
#[derive(Debug)]
pub struct CartesianCommunicator {
    comm: SimpleCommunicator,
    dims: Vec<Count>,
    periods: Vec<bool>,
}

impl Communicator for CartesianCommunicator {
    fn as_simple(&self) -> &SimpleCommunicator {
        &self.comm
    }
    fn attributes_mut(&mut self) -> &mut Attributes {
        self.comm.attributes_mut()
    }
}

/// The grid of `dims` over the first ranks of `comm` (`MPI_Cart_create`): collective;
/// `None` for the ranks beyond the grid's size.
pub(crate) fn create(
    comm: &dyn Communicator,
    dims: &[Count],
    periods: &[bool],
) -> Result<Option<CartesianCommunicator>> {
    if dims.len() != periods.len() || dims.iter().any(|&d| d <= 0) {
        return Err(Error::InvalidArgument(format!(
            "a Cartesian grid needs one positive extent and one period per dimension, got \
             {dims:?} and {periods:?}"
        )));
    }
    let points: i64 = dims.iter().map(|&d| i64::from(d)).product();
    if points > i64::from(comm.size()) {
        return Err(Error::InvalidArgument(format!(
            "a grid of {points} points on {} ranks",
            comm.size()
        )));
    }
    let inside = i64::from(comm.rank()) < points;
    let color = if inside {
        Color::with_value(0)
    } else {
        Color::undefined()
    };
    let sub = comm.try_split_by_color_with_key(color, comm.rank())?;
    Ok(sub.map(|comm| CartesianCommunicator {
        comm,
        dims: dims.to_vec(),
        periods: periods.to_vec(),
    }))
}

/// The rank a process would have in a grid of `dims` (`MPI_Cart_map`): its own when it is
/// inside the grid, else `None`.
pub(crate) fn map(comm: &dyn Communicator, dims: &[Count]) -> Option<Rank> {
    let points: i64 = dims.iter().map(|&d| i64::from(d.max(0))).product();
    (i64::from(comm.rank()) < points).then(|| comm.rank())
}

impl CartesianCommunicator {
    /// Dimensions of the grid.
    pub fn num_dimensions(&self) -> Count {
        self.dims.len() as Count
    }

    /// The grid's shape and the caller's coordinates.
    pub fn get_layout(&self) -> CartesianLayout {
        CartesianLayout {
            dims: self.dims.clone(),
            periods: self.periods.clone(),
            coords: self.rank_to_coordinates(self.rank()),
        }
    }

    /// The coordinates of `rank` (`MPI_Cart_coords`), row-major.
    pub fn rank_to_coordinates(&self, rank: Rank) -> Vec<Count> {
        let mut rest = rank;
        let mut coords = vec![0; self.dims.len()];
        for (c, &d) in coords.iter_mut().zip(&self.dims).rev() {
            *c = rest % d;
            rest /= d;
        }
        coords
    }

    /// The rank at `coords` (`MPI_Cart_rank`); coordinates of periodic dimensions wrap.
    /// Panics on a coordinate outside a non-periodic dimension.
    pub fn coordinates_to_rank(&self, coords: &[Count]) -> Rank {
        fatal(self.try_coordinates_to_rank(coords))
    }

    fn try_coordinates_to_rank(&self, coords: &[Count]) -> Result<Rank> {
        let mut rank = 0;
        for ((&c, &d), &p) in coords.iter().zip(&self.dims).zip(&self.periods) {
            let c = match (p, c) {
                (true, c) => c.rem_euclid(d),
                (false, c) if (0..d).contains(&c) => c,
                _ => {
                    return Err(Error::InvalidArgument(format!(
                        "coordinate {c} outside a dimension of {d}"
                    )))
                }
            };
            rank = rank * d + c;
        }
        Ok(rank)
    }

    /// The ranks `displacement` steps back and forward along `dimension`
    /// (`MPI_Cart_shift`): source and destination; `None` off the edge of a non-periodic
    /// dimension.
    pub fn shift(&self, dimension: Count, displacement: Count) -> (Option<Rank>, Option<Rank>) {
        let me = self.rank_to_coordinates(self.rank());
        let at = |step: Count| {
            let mut c = me.clone();
            c[dimension as usize] += step;
            self.try_coordinates_to_rank(&c).ok()
        };
        (at(-displacement), at(displacement))
    }

    /// The sub-grids that keep the dimensions marked in `retain` (`MPI_Cart_sub`):
    /// collective; each process gets the one through its own coordinates.
    pub fn subgroup(&self, retain: &[bool]) -> CartesianCommunicator {
        let me = self.rank_to_coordinates(self.rank());
        // Processes that agree on the dropped coordinates share a sub-grid.
        let mut color = 0;
        for ((&c, &d), &keep) in me.iter().zip(&self.dims).zip(retain) {
            if !keep {
                color = color * d + c;
            }
        }
        let comm = fatal(
            self.comm
                .try_split_by_color_with_key(Color::with_value(color), self.rank()),
        )
        .expect("every process joins its sub-grid");
        let kept = |v: &[Count]| -> Vec<Count> {
            v.iter()
                .zip(retain)
                .filter(|(_, &k)| k)
                .map(|(&x, _)| x)
                .collect()
        };
        let periods = self
            .periods
            .iter()
            .zip(retain)
            .filter(|(_, &k)| k)
            .map(|(&p, _)| p)
            .collect();
        CartesianCommunicator {
            comm,
            dims: kept(&self.dims),
            periods,
        }
    }
}
