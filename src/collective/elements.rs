//! The element types collectives run on: a buffer's bytes as elements of its primitive
//! (`with_unit!`, `elements`), landing buffers with gaps (`into_landing`), and reductions of
//! packed bytes typed by their primitive (`reduce_into_buffer`).

use super::operation::{self, with_element, Adapter, Operation};
use crate::backend::{CollectiveBackend, CommBackend, CommunicatorBackend};
use crate::datatype::{
    packed, Buffer, BufferMut, Count, DatatypeRef, Landing, Primitive, UncommittedDatatype,
};
use crate::error::{Error, Result};
use crate::ErrorClass;
use pagewire_collectives::{self as coll, Element};

/// Runs `f` on the bytes `landing` receives: its memory, or a scratch message (aligned for
/// any primitive) unpacked into it afterwards.
pub(crate) fn into_landing(
    landing: &mut Landing<'_>,
    f: impl FnOnce(&mut [u8]) -> Result<()>,
) -> Result<()> {
    if let Some(bytes) = landing.contiguous() {
        return f(bytes);
    }
    let len = landing.packed_len();
    let mut scratch = vec![0u64; len.div_ceil(8)];
    let bytes = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut scratch)[..len];
    f(bytes)?;
    landing.unpack(bytes);
    Ok(())
}

/// The element type data-moving collectives run on for a buffer of `map`: its primitive
/// when it is one gap-free run of a number type (so that errors count its elements and
/// name its type), else bytes. Every rank that passes the same datatype picks the same.
macro_rules! with_unit {
    ($map:expr, $t:ident => $body:expr) => {{
        let map: &crate::datatype::TypeMap = $map;
        let prim = if map.is_contiguous() {
            map.primitive()
        } else {
            None
        };
        match prim {
            Some(Primitive::I8) => {
                type $t = i8;
                $body
            }
            Some(Primitive::I16) => {
                type $t = i16;
                $body
            }
            Some(Primitive::I32) => {
                type $t = i32;
                $body
            }
            Some(Primitive::I64) => {
                type $t = i64;
                $body
            }
            Some(Primitive::U16) => {
                type $t = u16;
                $body
            }
            Some(Primitive::U32) => {
                type $t = u32;
                $body
            }
            Some(Primitive::U64) => {
                type $t = u64;
                $body
            }
            Some(Primitive::F32) => {
                type $t = f32;
                $body
            }
            Some(Primitive::F64) => {
                type $t = f64;
                $body
            }
            _ => {
                type $t = u8;
                $body
            }
        }
    }};
}
pub(crate) use with_unit;

/// `bytes` as elements of `T`.
pub(crate) fn elements<T: bytemuck::Pod>(bytes: &[u8]) -> Result<&[T]> {
    bytemuck::try_cast_slice(bytes).map_err(|_| unit_error::<T>(bytes.len()))
}

/// `bytes` as elements of `T`, to write.
pub(crate) fn elements_mut<T: bytemuck::Pod>(bytes: &mut [u8]) -> Result<&mut [T]> {
    let n = bytes.len();
    bytemuck::try_cast_slice_mut(bytes).map_err(|_| unit_error::<T>(n))
}

fn unit_error<T>(n: usize) -> Error {
    Error::invalid(
        ErrorClass::Type,
        format!(
            "a buffer of {n} bytes is not a whole number of {} (the datatypes of the ranks \
         or of the send and receive buffers differ)",
            std::any::type_name::<T>()
        ),
    )
}

/// Byte lengths as counts of elements of `T`.
pub(crate) fn counts_of<T>(lens: &[usize]) -> Result<Vec<Count>> {
    let unit = std::mem::size_of::<T>().max(1);
    lens.iter()
        .map(|&n| {
            if n % unit != 0 {
                return Err(unit_error::<T>(n));
            }
            Count::try_from(n / unit).map_err(|_| {
                Error::invalid(
                    ErrorClass::Count,
                    format!("a block of {n} bytes: too many elements"),
                )
            })
        })
        .collect()
}

/// A reduction collective, by what it computes.
#[derive(Clone, Copy, Debug)]
pub(crate) enum ReduceCall<'c> {
    AllReduce,
    Reduce { root: usize, at_root: bool },
    Scan,
    ReduceScatterBlock,
    ReduceScatter { counts: &'c [Count] },
}

/// Runs the reduction `call` of `send` into `recv` (where this rank gets a result) on
/// `backend`, typed.
fn run_reduction<T: Element>(
    backend: &CommBackend,
    call: ReduceCall<'_>,
    send: &[T],
    recv: Option<&mut [T]>,
    op: &Adapter<'_, T>,
) -> Result<()> {
    let none = || {
        Error::invalid(
            ErrorClass::Buffer,
            "a reduction result needs a receive buffer",
        )
    };
    match call {
        ReduceCall::AllReduce => backend.all_reduce(send, recv.ok_or_else(none)?, op),
        ReduceCall::Reduce { root, .. } => backend.reduce(root, send, recv, op),
        ReduceCall::Scan => backend.scan(send, recv.ok_or_else(none)?, op),
        ReduceCall::ReduceScatterBlock => {
            backend.reduce_scatter_block(send, recv.ok_or_else(none)?, op)
        }
        ReduceCall::ReduceScatter { counts } => {
            // Counts of the user's elements, as counts of `T`s.
            let per = Count::try_from(coll::Operation::<T>::granularity(op)).unwrap_or(1);
            let k: Vec<Count> = counts.iter().map(|&c| c.saturating_mul(per)).collect();
            backend.reduce_scatter(send, recv.ok_or_else(none)?, &k, op)
        }
    }
}

/// A reduction of `send` into `recv` (where this rank gets a result). The algorithms get
/// the buffers' packed bytes as elements of the type [`operation::unit_of`] picks (the
/// buffers themselves where they have no gaps), and cut them only between elements of the
/// send buffer's datatype; MPI describes both buffers by that datatype and its count.
pub(crate) fn reduce_into_buffer<S, R, O>(
    backend: &CommBackend,
    call: ReduceCall<'_>,
    send: &S,
    recv: Option<&mut R>,
    op: &O,
) -> Result<()>
where
    S: Buffer + ?Sized,
    R: BufferMut + ?Sized,
    O: Operation,
{
    let send_type = send.as_datatype();
    let map = send_type.type_map();
    let reduction = op.reduction();
    let bytes = packed(send);
    let mut landing = recv.map(Landing::new);
    // The result has the send buffer's length (a block of it for reduce-scatter), and what
    // of it fits the receive buffer is written there.
    let element = map.size().max(1);
    let recv_len = match call {
        ReduceCall::AllReduce | ReduceCall::Reduce { .. } | ReduceCall::Scan => bytes.len(),
        ReduceCall::ReduceScatterBlock => bytes.len() / element / backend.size().max(1) * element,
        ReduceCall::ReduceScatter { .. } => landing.as_ref().map_or(0, Landing::packed_len),
    };
    let at_root = !matches!(call, ReduceCall::Reduce { at_root: false, .. });
    with_element!(operation::unit_of(map, reduction)?, T => {
        let adapter = Adapter::<T>::new(reduction, DatatypeRef::of_map(map));
        let copied: Vec<T>;
        let s: &[T] = match bytemuck::try_cast_slice(&bytes) {
            Ok(s) => s,
            Err(_) => {
                copied = operation::elements_of(&bytes);
                &copied
            }
        };
        if !at_root {
            return run_reduction::<T>(backend, call, s, None, &adapter);
        }
        let Some(landing) = landing.as_mut() else {
            return Err(Error::invalid(ErrorClass::Buffer, "a reduction result needs a receive buffer"));
        };
        let direct = landing
            .contiguous()
            .filter(|b| b.len() == recv_len)
            .and_then(|b| bytemuck::try_cast_slice_mut::<u8, T>(b).ok());
        if let Some(r) = direct {
            return run_reduction::<T>(backend, call, s, Some(r), &adapter);
        }
        let mut r = vec![<T as bytemuck::Zeroable>::zeroed(); recv_len / std::mem::size_of::<T>()];
        run_reduction::<T>(backend, call, s, Some(&mut r), &adapter)?;
        landing.unpack(bytemuck::cast_slice(&r));
        Ok(())
    })
}
