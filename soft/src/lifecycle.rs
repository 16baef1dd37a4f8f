//! A [`SoftNic`]'s life: bringing it up (this rank's shared memory, the address exchange,
//! every peer mapped or reached by TCP, the CMA check, the capabilities, the driver thread)
//! and taking it down when dropped (the driver thread stopped, goodbye said on the TCP
//! links, every region deregistered).

use std::fs::File;
use std::sync::atomic::Ordering::Release;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};
use std::sync::Arc;

use parking_lot::Mutex;

use pagewire_boot::Bootstrap;
use pagewire_nic::{Capabilities, Counters, Nic};
use pagewire_sys::error::{Error, Result};
use pagewire_sys::{self as sys, ProcessHandle};

use crate::bound::BoundWatch;
use crate::engine::Engine;
use crate::layout::{RankMemory, MAGIC, MAX_QPS, ODP_MONITORED};
use crate::odp_watch::PresentWatch;
use crate::pin::PinAccount;
use crate::regions::RegionBook;
use crate::tpt::{ADDRESS_SPACE_END, MAX_MRS};
use crate::{tcp, tpt_cache, DmaMode, Inner, Peer, ReceiveFaultSettings, SoftConfig, SoftNic};

impl SoftNic {
    /// Brings the NIC up: creates this rank's shared memory, exchanges addresses through
    /// `boot`, maps every peer's, detects per peer whether CMA is permitted, and starts the
    /// driver thread. Collective: every rank of the job must call it.
    pub fn new(boot: &dyn Bootstrap, config: SoftConfig) -> Result<SoftNic> {
        let (rank, size, job) = (boot.rank(), boot.size(), boot.job_id().to_string());
        // Local DMA faults become error completions from here on (see `sys::guarded_copy`).
        sys::install_fault_guard();
        let own = Arc::new(RankMemory::create(&job, rank, size)?);
        let watch = PresentWatch::new(own.clone(), config.odp_check)?;
        own.seg.words(ODP_MONITORED, 1)[0].store(watch.uses_monitor() as u64, Release);
        // Peers read it after the barrier below, before their first access.
        own.tpt_cache().configure(config.tpt_cache);
        // Should the kernel refuse, the probe below finds CMA forbidden and the peers stage
        // payloads through the rings instead.
        sys::admit_cma_from_siblings(size);
        let probe = own.seg.addr_of(0);
        let wire_start = tcp::WireStart::new(&config.wire, rank, size)?;
        let mut mine = Vec::with_capacity(12 + tcp::WIRE_ADDRESS_BYTES);
        mine.extend_from_slice(&std::process::id().to_le_bytes());
        mine.extend_from_slice(&probe.to_le_bytes());
        wire_start.address.encode(&mut mine);
        let all = boot.allgather(&mine)?;
        let mut addresses = Vec::with_capacity(size);
        for (r, blob) in all.iter().enumerate() {
            let wire = (blob.len() == 12 + tcp::WIRE_ADDRESS_BYTES)
                .then(|| tcp::WireAddress::decode(&blob[12..]))
                .flatten()
                .ok_or_else(|| {
                    Error::Bootstrap(format!("rank {r} sent a malformed NIC address"))
                })?;
            let pid = u32::from_le_bytes(blob[0..4].try_into().expect("4 bytes"));
            let probe = u64::from_le_bytes(blob[4..12].try_into().expect("8 bytes"));
            addresses.push((pid, probe, wire));
        }
        let secret = addresses[0].2.secret;
        let mut tcp_peers = Vec::new();
        for (r, (_, _, wire)) in addresses.iter().enumerate() {
            if wire_start.uses_tcp(config.wire.mode, rank, r, wire)? {
                tcp_peers.push((r, wire.addr));
            }
        }
        let mut streams = wire_start.connect_all(rank, &tcp_peers, &secret)?;
        let mut peers = Vec::with_capacity(size);
        let mut links = Vec::new();
        for (r, &(pid, probe, _)) in addresses.iter().enumerate() {
            if let Some(at) = streams.iter().position(|(p, _)| *p == r) {
                let (_, stream) = streams.swap_remove(at);
                let link =
                    Arc::new(tcp::TcpLink::new(rank, r, stream).map_err(|e| {
                        Error::os(format!("setting up the TCP wire to rank {r}"), e)
                    })?);
                links.push(link.clone());
                peers.push(Peer {
                    rank: r,
                    pid: 0,
                    mem: Arc::new(RankMemory::local_image(r, size)?),
                    cma: false,
                    process: None,
                    pagemap: None,
                    link: Some(link),
                });
                continue;
            }
            let mem = if r == rank {
                own.clone()
            } else {
                Arc::new(RankMemory::open(&job, r)?)
            };
            let cma = match config.dma {
                DmaMode::Staged => false,
                DmaMode::Auto | DmaMode::Cma => {
                    let ok = sys::cma_read_word(pid, probe) == Some(MAGIC);
                    if !ok && config.dma == DmaMode::Cma {
                        return Err(Error::invalid_setting(
                            "PAGEWIRE_SOFT_DMA",
                            "cma",
                            format!(
                                "the kernel forbids process_vm_readv from rank {rank} to rank \
                                 {r} (pid {pid}); check kernel.yama.ptrace_scope or use \
                                 PAGEWIRE_SOFT_DMA=auto"
                            ),
                        ));
                    }
                    ok
                }
            };
            peers.push(Peer {
                rank: r,
                pid,
                mem,
                cma,
                process: (r != rank).then(|| ProcessHandle::open(pid).ok()).flatten(),
                pagemap: File::open(format!("/proc/{pid}/pagemap")).ok(),
                link: None,
            });
        }
        let wire = if links.is_empty() {
            None
        } else {
            Some(tcp::TcpWire {
                links,
                wakeup: sys::Wakeup::new()
                    .map_err(|e| Error::os("creating the TCP wire's wakeup eventfd", e))?,
            })
        };
        // Nobody may remove its segment before everyone has mapped it.
        boot.barrier()?;
        // Everyone has: the names can go now (the mappings keep the objects alive), so that
        // nothing is left in /dev/shm however the job ends, even if the launcher is killed.
        // No name of this job is opened after this point.
        own.seg.unlink_name();
        own.present.unlink_name();
        let caps = Capabilities {
            provider: "soft",
            max_mr_size: ADDRESS_SPACE_END,
            max_mr: MAX_MRS as u32,
            max_qp: MAX_QPS as u32,
            max_sge: 16,
            max_inline: 1024,
            max_qp_wr: 16384,
            device: "soft".into(),
            odp_rc: true,
            odp_rc_send: true,
            odp_rc_recv: true,
            odp_rc_write: true,
            odp_rc_read: true,
            implicit_odp: true,
            prefetch: true,
            // Run by the target's engine with locked instructions (`engine/responder/atomic.rs`).
            atomics: true,
            atomics_global: true,
        };
        let pins = PinAccount::with_method(config.memlock, config.pin)?;
        let inner = Arc::new(Inner {
            rank,
            caps,
            profile: config.profile,
            receive_fault: config.receive_fault,
            counters: Counters::default(),
            own,
            watch,
            peers,
            wire,
            qp_peers: (0..MAX_QPS).map(|_| AtomicU32::new(u32::MAX)).collect(),
            bound: BoundWatch::new(pins.long_term())?,
            regions: Mutex::new(RegionBook {
                regions: vec![None; MAX_MRS],
                held: (0..MAX_MRS).map(|_| None).collect(),
                pins,
            }),
            engine: Mutex::new(Engine::new(size)),
            faults_served: AtomicU64::new(0),
            serving_faults: Mutex::new(()),
            misses_served: AtomicU64::new(0),
            serving_misses: Mutex::new(()),
            shutdown: AtomicBool::new(false),
        });
        if rank == 0 && config.tpt_cache > 0 {
            eprintln!(
                "pagewire: soft NIC profile {} + {}",
                config.profile.name(),
                tpt_cache::describe(config.tpt_cache)
            );
        }
        if rank == 0 && config.receive_fault != ReceiveFaultSettings::default() {
            eprintln!("pagewire: soft NIC {}", config.receive_fault.describe());
        }
        let d = inner.clone();
        let driver = std::thread::Builder::new()
            .name(format!("pagewire-nic-driver-{rank}"))
            .spawn(move || d.driver_loop())
            .map_err(|e| Error::os("spawning the NIC driver thread", e))?;
        Ok(SoftNic {
            inner,
            driver: Some(driver),
        })
    }
}

impl Drop for SoftNic {
    fn drop(&mut self) {
        let entries = self.tpt_cache_entries();
        if entries > 0 {
            // A what-if run says what its cache did (summed over ranks by the benchmarks'
            // scripts, tools/bench/tpt_cache.sh).
            let c = self.counters().tpt_cache;
            let line = format!(
                "pagewire: rank {}: tpt-cache {entries} entries: {} hits, {} misses, {} fills \
                 (wait {} ns real, processing {} ns modelled), stall {} ns\n",
                self.inner.rank,
                c.hits,
                c.misses,
                c.fills,
                c.fill_wait_ns,
                c.fill_model_ns,
                c.stall_ns
            );
            // One write, so that the ranks' lines do not interleave.
            let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
        }
        self.inner.shutdown.store(true, Release);
        self.inner.own.ring_doorbell();
        if let Some(w) = &self.inner.wire {
            w.wakeup.signal();
        }
        if let Some(d) = self.driver.take() {
            let _ = d.join();
        }
        if let Some(w) = &self.inner.wire {
            for l in &w.links {
                l.say_bye(&self.inner.peers[l.peer].mem.ring_from(self.inner.rank));
            }
        }
        let keys: Vec<u32> = self
            .inner
            .regions
            .lock()
            .regions
            .iter()
            .flatten()
            .map(|r| r.lkey)
            .collect();
        for k in keys {
            let _ = self.inner.deregister(k);
        }
        // The shared memory's names went when the NIC came up (a NIC brought up again in
        // this process finds them free); the objects go with the last mapping.
    }
}
