//! The two ranks of one job: a server holding an item store and a client requesting items
//! from its working set, as memcached and memaslap in Lesokhin17 §6.1.
//!
//! Every request and reply goes through pagewire's message layer. A GET is a 16-byte
//! eager message; a hit is answered by sending the item straight out of the store, so the
//! store's memory is what the NIC reads (a 20 KiB item is above the eager limit: the
//! client's NIC reads it from the server's store by rendezvous, zero-copy); a miss is
//! answered with 8 bytes and the client then stores the item (SET), which the server
//! receives straight into the slot its LRU gives it. With `odp` the store is never pinned:
//! a page the kernel took back is a network page fault when the NIC next touches it, and a
//! major fault when it has to come back from the file. With `pindown` the server announces
//! its whole store once at the start as one message, which the pin-down cache registers
//! (pins) whole; the client declines the bytes (a receive of 0 bytes, truncated), and
//! every later item inside the store is a hit of that one registration, as a memcached
//! whose slab memory is registered whole.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use pagewire::traits::*;

use super::report::Window;
use super::schedule::{JobKind, Schedule};
use crate::error::{Error, Result};
use pagewire_transport::sys::FileMapping;

/// What memory backs a server's item store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    /// Anonymous private memory (the pinned runs': it is pinned anyway).
    Anon,
    /// A shared mapping of a file on disk, whose page cache the memory cgroup can reclaim
    /// (the `odp` runs'; see [`FileMapping`]).
    File,
}

/// One job's settings, the same on both ranks.
#[derive(Clone, Debug)]
pub struct JobConfig {
    /// Which way its working set changes.
    pub job: JobKind,
    /// The store's memory.
    pub store: StoreKind,
    /// The store's file ([`StoreKind::File`]).
    pub store_path: PathBuf,
    /// Items the store holds at most.
    pub capacity_items: u64,
    /// Bytes per item.
    pub item_size: usize,
    /// The working sets over time.
    pub schedule: Schedule,
    /// The timed run's length.
    pub duration: Duration,
    /// Length of a reporting window.
    pub window: Duration,
    /// Where the client says it is ready (`ready-JOB`) and waits for the start (`go`).
    pub run_dir: PathBuf,
    /// Register the whole store at the start (the pinned runs).
    pub pin_store: bool,
}

const TAG_REQUEST: i32 = 1;
const TAG_HIT: i32 = 2;
const TAG_MISS: i32 = 3;
const TAG_ITEM: i32 = 4;
const TAG_PIN: i32 = 5;
const TAG_ACK: i32 = 6;

const OP_GET: u64 = 1;
const OP_SET: u64 = 2;
const OP_SYNC: u64 = 3;
const OP_STOP: u64 = 4;

/// The store's memory.
enum StoreMemory {
    Anon(pagewire::sys::AnonMapping),
    File(FileMapping),
}

impl StoreMemory {
    fn bytes(&self) -> &[u8] {
        match self {
            StoreMemory::Anon(m) => m.as_slice(),
            StoreMemory::File(m) => m.as_slice(),
        }
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            StoreMemory::Anon(m) => m.as_mut_slice(),
            StoreMemory::File(m) => m.as_mut_slice(),
        }
    }
    /// Makes a file store's pages clean (nothing to do for anonymous memory).
    fn sync(&self) -> std::io::Result<()> {
        match self {
            StoreMemory::Anon(_) => Ok(()),
            StoreMemory::File(m) => m.sync(),
        }
    }
}

/// The first and last words of item `key`'s bytes; the client fills every word of an item
/// from its key and checks these two on every hit.
fn item_word(key: u64, i: usize) -> u64 {
    key.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (i as u64).wrapping_mul(0xff51_afd7_ed55_8ccd)
}

fn fill_item(buf: &mut [u8], key: u64) {
    for (i, w) in buf.chunks_exact_mut(8).enumerate() {
        w.copy_from_slice(&item_word(key, i).to_le_bytes());
    }
}

fn item_is_intact(buf: &[u8], key: u64) -> bool {
    let words = buf.len() / 8;
    let word = |i: usize| u64::from_le_bytes(buf[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
    words == 0 || (word(0) == item_word(key, 0) && word(words - 1) == item_word(key, words - 1))
}

/// This process's minor and major page faults (`/proc/self/stat` fields 10 and 12).
fn page_faults() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|w| w.parse().unwrap_or(0))
        .collect();
    // rest starts at field 3 (state): field n is f[n - 3].
    (
        f.get(7).copied().unwrap_or(0),
        f.get(9).copied().unwrap_or(0),
    )
}

/// Runs this rank's part of the job: rank 0 serves, rank 1 requests.
pub fn run_rank(u: &pagewire::Universe, cfg: &JobConfig) -> Result<()> {
    let world = u.world();
    if world.size() != 2 {
        return Err(Error::Workset(format!(
            "a pw-workset job runs on 2 ranks (server and client), got {}",
            world.size()
        )));
    }
    if world.rank() == 0 {
        serve(u, cfg)
    } else {
        request(u, cfg)
    }
}

fn serve(u: &pagewire::Universe, cfg: &JobConfig) -> Result<()> {
    let world = u.world();
    let peer = world.process_at_rank(1);
    let bytes = cfg.capacity_items as usize * cfg.item_size;
    let io = |what: &str, e: std::io::Error| Error::Workset(format!("{what}: {e}"));
    let mut mem = match cfg.store {
        StoreKind::Anon => StoreMemory::Anon(
            pagewire::sys::AnonMapping::new(bytes).map_err(|e| io("mapping the store", e))?,
        ),
        StoreKind::File => StoreMemory::File(
            FileMapping::create(&cfg.store_path, bytes)
                .map_err(|e| io(&format!("mapping {}", cfg.store_path.display()), e))?,
        ),
    };
    if cfg.pin_store {
        peer.try_send_with_tag(&mem.bytes()[..bytes], TAG_PIN)?;
    }
    let mut store = super::store::ItemStore::new(cfg.capacity_items as usize);
    let size = cfg.item_size;
    let (mut gets, mut sets) = (0u64, 0u64);
    loop {
        let mut header = [0u64; 2];
        peer.try_receive_into_with_tag(&mut header[..], Some(TAG_REQUEST))?;
        let [op, key] = header;
        match op {
            OP_GET => {
                gets += 1;
                match store.get(key) {
                    Some(slot) => {
                        let at = slot * size;
                        peer.try_send_with_tag(&mem.bytes()[at..at + size], TAG_HIT)?;
                    }
                    None => peer.try_send_with_tag(&[key][..], TAG_MISS)?,
                }
            }
            OP_SET => {
                sets += 1;
                let at = store.insert(key) * size;
                peer.try_receive_into_with_tag(
                    &mut mem.bytes_mut()[at..at + size],
                    Some(TAG_ITEM),
                )?;
            }
            OP_SYNC => {
                mem.sync().map_err(|e| io("msync of the store", e))?;
                peer.try_send_with_tag(&[0u64][..], TAG_ACK)?;
            }
            OP_STOP => break,
            other => {
                return Err(Error::Workset(format!(
                    "the client sent an unknown request {other}"
                )))
            }
        }
    }
    let (minflt, majflt) = page_faults();
    // VmLck counts mlock'ed pages only: long-term pins do not show there.
    let (vm_locked, vm_rss) = pagewire::sys::vm_locked_and_resident().unwrap_or((0, 0));
    let (p2p, mode) = u
        .try_with_p2p(|p| (p.nic_counters(), p.mode_counters()))
        .map_err(Error::Pagewire)?;
    println!(
        "server job={} mode={} store={} capacity_items={} items={} evictions={} gets={} sets={} \
         minflt={} majflt={} npf_requester={} npf_responder={} npf_pages={} npf_failed={} \
         prefetch_pages={} rnr_retries={} invalidated_pages={} pinned_peak={} \
         registrations={} pindown_hits={} pindown_misses={} pindown_fallbacks={} \
         registered_peak={} vm_locked={vm_locked} vm_rss={vm_rss}",
        cfg.job.name(),
        u.mode_name(),
        match cfg.store {
            StoreKind::Anon => "anon",
            StoreKind::File => "file",
        },
        cfg.capacity_items,
        store.len(),
        store.evictions(),
        gets,
        sets,
        minflt,
        majflt,
        p2p.npf_requester,
        p2p.npf_responder,
        p2p.npf_pages,
        p2p.npf_failed,
        p2p.prefetch_pages,
        p2p.rnr_retries,
        p2p.invalidated_pages,
        p2p.pinned_peak,
        p2p.registrations,
        mode.hits,
        mode.misses,
        mode.fallbacks,
        mode.registered_peak,
    );
    Ok(())
}

/// xorshift64*: the client's key sequence, seeded per job.
struct KeyRng(u64);

impl KeyRng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let x = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d);
        ((x as u128 * n.max(1) as u128) >> 64) as u64
    }
}

fn request(u: &pagewire::Universe, cfg: &JobConfig) -> Result<()> {
    let world = u.world();
    let peer = world.process_at_rank(0);
    let mut item = vec![0u8; cfg.item_size];
    if cfg.pin_store {
        let mut nothing = [0u8; 0];
        match peer.try_receive_into_with_tag(&mut nothing[..], Some(TAG_PIN)) {
            Ok(_) | Err(pagewire::Error::Truncated { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let set = |item: &mut Vec<u8>, key: u64| -> Result<()> {
        fill_item(item, key);
        peer.try_send_with_tag(&[OP_SET, key][..], TAG_REQUEST)?;
        peer.try_send_with_tag(&item[..], TAG_ITEM)?;
        Ok(())
    };
    // Untimed warm-up: store the first working set, then have the server write a file
    // store back, so the timed run starts from clean, resident pages.
    for key in 0..cfg.schedule.items(cfg.job, Duration::ZERO) {
        set(&mut item, key)?;
    }
    peer.try_send_with_tag(&[OP_SYNC, 0][..], TAG_REQUEST)?;
    let mut ack = [0u64; 1];
    peer.try_receive_into_with_tag(&mut ack[..], Some(TAG_ACK))?;
    wait_for_start(cfg)?;

    let mut rng = KeyRng(match cfg.job {
        JobKind::Growing => 0x9e37_79b9_7f4a_7c15,
        JobKind::Shrinking => 0xd1b5_4a32_d192_ed03,
    });
    let start = Instant::now();
    let mut current = Window {
        job: cfg.job,
        t: 0,
        hits: 0,
        misses: 0,
    };
    let (mut requests, mut hits, mut misses, mut damaged) = (0u64, 0u64, 0u64, 0u64);
    let window_ns = cfg.window.as_nanos().max(1);
    loop {
        let elapsed = start.elapsed();
        if elapsed >= cfg.duration {
            break;
        }
        let t = (elapsed.as_nanos() / window_ns) as u64;
        if t != current.t {
            println!("{}", current.line());
            // Windows in which no reply arrived (a stall longer than a window) are printed
            // empty, so each window holds exactly the replies that arrived in it.
            for empty in current.t + 1..t {
                let idle = Window {
                    t: empty,
                    hits: 0,
                    misses: 0,
                    ..current
                };
                println!("{}", idle.line());
            }
            current = Window {
                t,
                hits: 0,
                misses: 0,
                ..current
            };
        }
        let key = rng.below(cfg.schedule.items(cfg.job, elapsed));
        peer.try_send_with_tag(&[OP_GET, key][..], TAG_REQUEST)?;
        let status = peer.try_receive_into_with_tag(&mut item[..], None)?;
        requests += 1;
        match status.tag() {
            TAG_HIT => {
                if !item_is_intact(&item, key) {
                    damaged += 1;
                }
                hits += 1;
                current.hits += 1;
            }
            TAG_MISS => {
                misses += 1;
                current.misses += 1;
                set(&mut item, key)?;
            }
            other => {
                return Err(Error::Workset(format!(
                    "the server answered with tag {other}"
                )))
            }
        }
    }
    // The last window, if it is whole.
    if (current.t + 1) as u128 * window_ns <= cfg.duration.as_nanos() {
        println!("{}", current.line());
    }
    peer.try_send_with_tag(&[OP_STOP, 0][..], TAG_REQUEST)?;
    let (minflt, majflt) = page_faults();
    println!(
        "client job={} requests={requests} hits={hits} misses={misses} damaged_items={damaged} \
         minflt={minflt} majflt={majflt}",
        cfg.job.name()
    );
    if damaged > 0 {
        return Err(Error::Workset(format!(
            "{damaged} items came back with the wrong bytes"
        )));
    }
    Ok(())
}

/// Says this job is ready (`RUN_DIR/ready-JOB`) and waits for the driver's `RUN_DIR/go`,
/// so both jobs start their timed runs together whatever their warm-ups took.
fn wait_for_start(cfg: &JobConfig) -> Result<()> {
    let ready = cfg.run_dir.join(format!("ready-{}", cfg.job.name()));
    std::fs::write(&ready, b"ready\n").map_err(|e| Error::Io {
        path: ready.clone(),
        source: e,
    })?;
    let go = cfg.run_dir.join("go");
    let deadline = Instant::now() + Duration::from_secs(600);
    while !go.exists() {
        if Instant::now() > deadline {
            return Err(Error::Workset(format!(
                "no start signal ({}) within 600 s",
                go.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_are_checked_by_their_first_and_last_words() {
        let mut b = vec![0u8; 20 << 10];
        fill_item(&mut b, 42);
        assert!(item_is_intact(&b, 42));
        assert!(!item_is_intact(&b, 43));
        b[(20 << 10) - 1] ^= 1;
        assert!(!item_is_intact(&b, 42));
    }

    #[test]
    fn keys_are_uniform_below_the_working_set() {
        let mut r = KeyRng(7);
        let mut counts = [0u32; 10];
        for _ in 0..100_000 {
            counts[r.below(10) as usize] += 1;
        }
        assert!(
            counts.iter().all(|&c| (9_000..11_000).contains(&c)),
            "{counts:?}"
        );
        assert_eq!(KeyRng(1).below(1), 0);
    }

    #[test]
    fn own_page_faults_are_read() {
        let (minflt, _) = page_faults();
        assert!(minflt > 0);
    }
}
