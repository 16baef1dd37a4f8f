//! Requests: the handles of nonblocking operations, kept in a slab with generation-checked
//! ids so a stale handle is an error, never another request.

/// Identifies a nonblocking operation of one [`super::PointToPoint`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RequestId(pub(crate) u64);

impl RequestId {
    fn new(index: usize, generation: u32) -> RequestId {
        RequestId(index as u64 | (generation as u64) << 32)
    }
    fn index(self) -> usize {
        (self.0 & 0xffff_ffff) as usize
    }
    fn generation(self) -> u32 {
        (self.0 >> 32) as u32
    }
}

/// What a completed receive (or probe) reports (`MPI_Status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Status {
    /// Sending rank.
    pub source: usize,
    /// The message's tag.
    pub tag: i32,
    /// Bytes received (for a probe: bytes in the message).
    pub count: usize,
}

/// A slab of values addressed by generation-checked [`RequestId`]s.
#[derive(Debug)]
pub(crate) struct Slab<T> {
    entries: Vec<(u32, Option<T>)>,
    free: Vec<usize>,
    live: usize,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab {
            entries: Vec::new(),
            free: Vec::new(),
            live: 0,
        }
    }
}

impl<T> Slab<T> {
    pub(crate) fn insert(&mut self, v: T) -> RequestId {
        self.live += 1;
        match self.free.pop() {
            Some(i) => {
                let e = &mut self.entries[i];
                e.0 = e.0.wrapping_add(1);
                e.1 = Some(v);
                RequestId::new(i, e.0)
            }
            None => {
                self.entries.push((0, Some(v)));
                RequestId::new(self.entries.len() - 1, 0)
            }
        }
    }

    pub(crate) fn get(&self, id: RequestId) -> Option<&T> {
        self.entries
            .get(id.index())
            .filter(|e| e.0 == id.generation())
            .and_then(|e| e.1.as_ref())
    }

    pub(crate) fn get_mut(&mut self, id: RequestId) -> Option<&mut T> {
        self.entries
            .get_mut(id.index())
            .filter(|e| e.0 == id.generation())
            .and_then(|e| e.1.as_mut())
    }

    pub(crate) fn remove(&mut self, id: RequestId) -> Option<T> {
        let e = self
            .entries
            .get_mut(id.index())
            .filter(|e| e.0 == id.generation())?;
        let v = e.1.take()?;
        self.free.push(id.index());
        self.live -= 1;
        Some(v)
    }

    pub(crate) fn len(&self) -> usize {
        self.live
    }

    pub(crate) fn ids(&self) -> Vec<RequestId> {
        self.entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.1.is_some())
            .map(|(i, e)| RequestId::new(i, e.0))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_ids_do_not_reach_new_entries() {
        let mut s = Slab::default();
        let a = s.insert("a");
        assert_eq!(s.remove(a), Some("a"));
        let b = s.insert("b");
        assert_eq!(a.index(), b.index(), "the slot is reused");
        assert_eq!(s.get(a), None, "but the old id is stale");
        assert_eq!(s.get(b), Some(&"b"));
        assert_eq!(s.remove(a), None);
        assert_eq!(s.len(), 1);
        assert_eq!(s.ids(), vec![b]);
    }
}
