//! Which Rust types travel as messages (rsmpi's `Equivalence` and `Buffer` traits), and how
//! many of them ([`Count`]).
//!
//! The primitive integers and floats are equivalent to MPI datatypes; a buffer is one value,
//! a slice, an array or a `Vec` of them. Bytes are reinterpreted with `bytemuck`, so no
//! `unsafe` is needed here.

use bytemuck::Pod;

/// A count of elements, as rsmpi types it.
pub type Count = i32;

/// A type that can be sent as is (`MPI_Datatype` equivalence): plain old data.
pub trait Equivalence: Pod {
    /// The MPI datatype name, for messages.
    const NAME: &'static str;
}

macro_rules! equivalence {
    ($($t:ty => $n:literal),* $(,)?) => { $(impl Equivalence for $t { const NAME: &'static str = $n; })* };
}

equivalence!(
    u8 => "MPI_UINT8_T", i8 => "MPI_INT8_T", u16 => "MPI_UINT16_T", i16 => "MPI_INT16_T",
    u32 => "MPI_UINT32_T", i32 => "MPI_INT32_T", u64 => "MPI_UINT64_T", i64 => "MPI_INT64_T",
    usize => "MPI_UINT64_T", isize => "MPI_INT64_T", f32 => "MPI_FLOAT", f64 => "MPI_DOUBLE",
);

/// Something that can be sent: its bytes.
pub trait Buffer {
    /// The element type.
    type Item: Equivalence;
    /// The elements as a slice.
    fn as_items(&self) -> &[Self::Item];
    /// The bytes to send.
    fn as_bytes(&self) -> &[u8] {
        bytemuck::cast_slice(self.as_items())
    }
}

/// Something that can be received into.
pub trait BufferMut {
    /// The element type.
    type Item: Equivalence;
    /// The elements as a mutable slice.
    fn as_items_mut(&mut self) -> &mut [Self::Item];
    /// The bytes to receive into.
    fn as_bytes_mut(&mut self) -> &mut [u8] {
        bytemuck::cast_slice_mut(self.as_items_mut())
    }
}

impl<T: Equivalence> Buffer for T {
    type Item = T;
    fn as_items(&self) -> &[T] {
        std::slice::from_ref(self)
    }
}

impl<T: Equivalence> Buffer for [T] {
    type Item = T;
    fn as_items(&self) -> &[T] {
        self
    }
}

impl<T: Equivalence, const N: usize> Buffer for [T; N] {
    type Item = T;
    fn as_items(&self) -> &[T] {
        self
    }
}

impl<T: Equivalence> Buffer for Vec<T> {
    type Item = T;
    fn as_items(&self) -> &[T] {
        self
    }
}

impl<T: Equivalence> BufferMut for T {
    type Item = T;
    fn as_items_mut(&mut self) -> &mut [T] {
        std::slice::from_mut(self)
    }
}

impl<T: Equivalence> BufferMut for [T] {
    type Item = T;
    fn as_items_mut(&mut self) -> &mut [T] {
        self
    }
}

impl<T: Equivalence, const N: usize> BufferMut for [T; N] {
    type Item = T;
    fn as_items_mut(&mut self) -> &mut [T] {
        self
    }
}

impl<T: Equivalence> BufferMut for Vec<T> {
    type Item = T;
    fn as_items_mut(&mut self) -> &mut [T] {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_expose_their_bytes() {
        let x = 0x0102_0304u32;
        assert_eq!(x.as_bytes(), &x.to_ne_bytes());
        let v = vec![1.0f64, 2.0];
        assert_eq!(v.as_bytes().len(), 16);
        let mut a = [0u16; 3];
        a.as_bytes_mut()[0] = 7;
        assert_eq!(a[0].to_ne_bytes()[0], 7);
        assert_eq!(f32::NAME, "MPI_FLOAT");
    }
}
