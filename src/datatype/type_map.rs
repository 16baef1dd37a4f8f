//! The type maps behind every datatype: the primitives, the byte blocks one element covers
//! and the element's bounds, and how the maps of vectors, indexed blocks and structs are laid
//! out from the maps of their parts.

use std::borrow::Cow;

/// The primitive a datatype is made of, when all its blocks hold the same one: what
/// reductions combine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Primitive {
    /// `bool` (`MPI_C_BOOL`).
    Bool,
    /// `i8`.
    I8,
    /// `i16`.
    I16,
    /// `i32`.
    I32,
    /// `i64`.
    I64,
    /// `u8`.
    U8,
    /// `u16`.
    U16,
    /// `u32`.
    U32,
    /// `u64`.
    U64,
    /// `f32`.
    F32,
    /// `f64`.
    F64,
    /// A complex number of two `f32`.
    Complex32,
    /// A complex number of two `f64`.
    Complex64,
}

/// A run of bytes of one element: `len` bytes at `offset` from the element's address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block {
    /// Bytes from the element's address (may be negative).
    pub offset: isize,
    /// Bytes in the run.
    pub len: usize,
}

/// What a datatype describes: the blocks of one element, in the order their bytes travel,
/// and the element's bounds (`MPI_Type_get_extent`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TypeMap {
    blocks: Cow<'static, [Block]>,
    /// The lower bound, in bytes from the element's address.
    pub(super) lb: isize,
    /// The distance between consecutive elements.
    pub(super) extent: usize,
    /// The strictest alignment of the primitives inside (rounds up a struct's extent).
    pub(super) align: usize,
    primitive: Option<Primitive>,
}

macro_rules! system_type_maps {
    ($($name:ident: $t:ty => $p:ident),* $(,)?) => {
        $(
            static $name: TypeMap = TypeMap {
                blocks: Cow::Borrowed(&[Block { offset: 0, len: std::mem::size_of::<$t>() }]),
                lb: 0,
                extent: std::mem::size_of::<$t>(),
                align: std::mem::align_of::<$t>(),
                primitive: Some(Primitive::$p),
            };
        )*
    };
}

system_type_maps!(
    BOOL: bool => Bool, I8: i8 => I8, I16: i16 => I16, I32: i32 => I32, I64: i64 => I64,
    U8: u8 => U8, U16: u16 => U16, U32: u32 => U32, U64: u64 => U64, F32: f32 => F32,
    F64: f64 => F64, C32: [f32; 2] => Complex32, C64: [f64; 2] => Complex64,
);

impl TypeMap {
    /// The map of a primitive.
    pub fn of_primitive(p: Primitive) -> &'static TypeMap {
        match p {
            Primitive::Bool => &BOOL,
            Primitive::I8 => &I8,
            Primitive::I16 => &I16,
            Primitive::I32 => &I32,
            Primitive::I64 => &I64,
            Primitive::U8 => &U8,
            Primitive::U16 => &U16,
            Primitive::U32 => &U32,
            Primitive::U64 => &U64,
            Primitive::F32 => &F32,
            Primitive::F64 => &F64,
            Primitive::Complex32 => &C32,
            Primitive::Complex64 => &C64,
        }
    }

    /// The blocks of one element, in the order their bytes travel.
    pub fn blocks(&self) -> &[Block] {
        &self.blocks
    }
    /// The lower bound in bytes.
    pub fn lower_bound(&self) -> isize {
        self.lb
    }
    /// The distance between consecutive elements in bytes.
    pub fn extent(&self) -> usize {
        self.extent
    }
    /// The bytes of one element that travel (`MPI_Type_size`).
    pub fn size(&self) -> usize {
        self.blocks.iter().map(|b| b.len).sum()
    }
    /// The primitive all blocks hold, if they hold one kind only.
    pub fn primitive(&self) -> Option<Primitive> {
        self.primitive
    }
    /// Whether `count` elements are one gap-free run starting at the buffer's address.
    pub fn is_contiguous(&self) -> bool {
        match &self.blocks[..] {
            [] => self.extent == 0,
            [b] => b.offset == 0 && b.len == self.extent,
            _ => false,
        }
    }

    /// The map of `count` copies of `old` laid out `stride` bytes apart, each a run of
    /// `blocklength` elements of `old`; bounds from the first to the end of the last run.
    pub(super) fn strided(
        count: usize,
        blocklength: usize,
        stride: isize,
        old: &TypeMap,
    ) -> TypeMap {
        let starts = (0..count).map(|i| i as isize * stride);
        Self::runs(starts.map(|s| (s, blocklength)).collect(), old)
    }

    /// Runs of `old` elements: (byte displacement, elements) each.
    pub(super) fn runs(runs: Vec<(isize, usize)>, old: &TypeMap) -> TypeMap {
        let ext = old.extent as isize;
        let mut blocks = Vec::new();
        let (mut lo, mut hi) = (isize::MAX, isize::MIN);
        for &(disp, n) in &runs {
            if old.is_contiguous() {
                // `n` gap-free elements are one block: no need to list them one by one (a
                // vector of a million bytes is one block per run, made in O(runs)).
                blocks.push(Block {
                    offset: disp,
                    len: n * old.extent,
                });
            } else {
                for j in 0..n as isize {
                    let base = disp + j * ext;
                    blocks.extend(old.blocks.iter().map(|b| Block {
                        offset: base + b.offset,
                        len: b.len,
                    }));
                }
            }
            lo = lo.min(disp + old.lb);
            hi = hi.max(disp + old.lb + n as isize * ext);
        }
        if lo > hi {
            (lo, hi) = (0, 0);
        }
        TypeMap {
            blocks: Cow::Owned(coalesce(blocks)),
            lb: lo,
            extent: (hi - lo) as usize,
            align: old.align,
            primitive: old.primitive,
        }
    }

    /// `MPI_Type_create_struct`: `blocklengths[i]` elements of `types[i]` at byte
    /// `displacements[i]`; the extent is rounded up to the strictest alignment inside.
    pub(super) fn structured(
        blocklengths: &[usize],
        displacements: &[isize],
        types: &[&TypeMap],
    ) -> TypeMap {
        let mut blocks = Vec::new();
        let (mut lo, mut hi) = (isize::MAX, isize::MIN);
        let mut align = 1;
        let mut primitive = types.first().and_then(|t| t.primitive);
        for ((&n, &disp), t) in blocklengths.iter().zip(displacements).zip(types) {
            let ext = t.extent as isize;
            for j in 0..n as isize {
                let base = disp + j * ext;
                blocks.extend(t.blocks.iter().map(|b| Block {
                    offset: base + b.offset,
                    len: b.len,
                }));
            }
            lo = lo.min(disp + t.lb);
            hi = hi.max(disp + t.lb + n as isize * ext);
            align = align.max(t.align);
            if t.primitive != primitive {
                primitive = None;
            }
        }
        if lo > hi {
            (lo, hi) = (0, 0);
        }
        let extent = ((hi - lo) as usize).div_ceil(align) * align;
        TypeMap {
            blocks: Cow::Owned(coalesce(blocks)),
            lb: lo,
            extent,
            align,
            primitive,
        }
    }
}

/// Merges blocks that continue one another, keeping their order.
fn coalesce(blocks: Vec<Block>) -> Vec<Block> {
    let mut out: Vec<Block> = Vec::with_capacity(blocks.len());
    for b in blocks.into_iter().filter(|b| b.len > 0) {
        match out.last_mut() {
            Some(last) if last.offset + last.len as isize == b.offset => last.len += b.len,
            _ => out.push(b),
        }
    }
    out
}
