//! The verbs provider from the outside.
//!
//! The first two tests are the no-device path and run everywhere: on a machine without
//! RDMA hardware (where pagewire is developed) start-up must fail with one line that names
//! the soft provider. They do not depend on *how* libibverbs reports "no device" (a NULL
//! list with `ENOSYS`, an empty list, a device that cannot be opened): only on the message.
//! Where a device is present they say so and pass without checking anything.
//!
//! The rest need an RDMA device and are ignored by default; they have **never been run**
//! (no hardware was available). On a machine with a device, run them with
//! `cargo test -p pagewire-verbs --features rdma-core --test verbs -- --ignored`
//! (`PAGEWIRE_DEVICE`, `PAGEWIRE_PORT`, `PAGEWIRE_GID_INDEX` choose the device); see
//! docs/verbs.md for the whole hardware test plan.
#![cfg(feature = "rdma-core")]

use std::time::{Duration, Instant};

use pagewire_boot::SingletonBootstrap;
use pagewire_nic::{
    Access, Advice, Completion, Nic, Opcode, QpCaps, RecvWr, RegionInfo, SendWr, Sge, WcOpcode,
    WcStatus,
};
use pagewire_test_support::nic::assert_one_line_naming_the_soft_provider;
use pagewire_test_support::{require, Prerequisite};
use pagewire_verbs::{VerbsConfig, VerbsNic};

#[test]
fn with_no_device_open_fails_naming_the_soft_provider() {
    let no_device = match VerbsNic::open(&SingletonBootstrap::new(), VerbsConfig::default()) {
        Ok(nic) => Err(format!(
            "an RDMA device is present ({:?}): the no-device path is not exercised here",
            nic.port()
        )),
        Err(e) => Ok(e),
    };
    if let Some(e) = require(Prerequisite::NoRdmaDevice, no_device) {
        assert_one_line_naming_the_soft_provider(&e.to_string());
    }
}

#[test]
fn a_device_name_that_does_not_exist_names_the_soft_provider_too() {
    let config = VerbsConfig {
        device: Some("pagewire-no-such-device".into()),
        ..VerbsConfig::default()
    };
    let e = VerbsNic::open(&SingletonBootstrap::new(), config)
        .expect_err("no RDMA device has that name");
    assert_one_line_naming_the_soft_provider(&e.to_string());
}

// ---- Hardware tests: ignored, never run here. ----

fn device() -> VerbsNic {
    let config = VerbsConfig::from_env().expect("PAGEWIRE_DEVICE/PORT/GID_INDEX");
    VerbsNic::open(&SingletonBootstrap::new(), config)
        .unwrap_or_else(|e| panic!("these tests need an RDMA device: {e}"))
}

/// Entries a completion queue needs for `n` queue pairs of `QpCaps::default()`: what each
/// can have outstanding, sends and receives (`create_qp` refuses less).
fn cq_depth_for(n: u32) -> u32 {
    let caps = QpCaps::default();
    n * (caps.max_send_wr + caps.max_recv_wr)
}

/// Two RC queue pairs of one NIC connected to each other (loopback through the port), on
/// one completion queue.
fn loopback(nic: &VerbsNic) -> (u32, u32, u32) {
    let cq = nic.create_cq(cq_depth_for(2)).unwrap();
    let a = nic.create_qp(0, cq, cq, QpCaps::default()).unwrap();
    let b = nic.create_qp(0, cq, cq, QpCaps::default()).unwrap();
    nic.connect(a, &nic.endpoint(b).unwrap()).unwrap();
    nic.connect(b, &nic.endpoint(a).unwrap()).unwrap();
    (cq, a, b)
}

fn poll(nic: &VerbsNic, cq: u32, n: usize) -> Vec<Completion> {
    let mut out = Vec::new();
    let t0 = Instant::now();
    while out.len() < n {
        let want = n - out.len();
        nic.poll_cq(cq, &mut out, want).unwrap();
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "only {} of {n} completions after 10 s: {out:?}",
            out.len()
        );
    }
    out
}

fn sge(buf: &[u8], r: &RegionInfo) -> Sge {
    Sge {
        addr: buf.as_ptr() as u64,
        len: buf.len() as u32,
        lkey: r.lkey,
    }
}

/// Local write plus remote read and write.
fn rw() -> Access {
    Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ
}

#[test]
#[ignore = "requires an RDMA device"]
fn pinned_write_then_read_back() {
    let nic = device();
    let (cq, a, _b) = loopback(&nic);
    let src: Vec<u8> = (0..65536u32).map(|i| (i * 7) as u8).collect();
    let dst = vec![0u8; 65536];
    let back = vec![0u8; 65536];
    let rs = nic
        .register(src.as_ptr() as u64, 65536, Access::LOCAL_WRITE)
        .unwrap();
    let rd = nic.register(dst.as_ptr() as u64, 65536, rw()).unwrap();
    let rb = nic
        .register(back.as_ptr() as u64, 65536, Access::LOCAL_WRITE)
        .unwrap();
    // Page-rounded per region: each 64 KiB buffer spans 16 or 17 pages.
    let pinned = nic.counters().pinned_now;
    assert!(
        (3 * 65536..=3 * (65536 + 4096)).contains(&pinned),
        "{pinned}"
    );
    let write = SendWr {
        wr_id: 1,
        opcode: Opcode::RdmaWrite {
            remote_addr: rd.addr,
            rkey: rd.rkey,
        },
        sgl: &[sge(&src, &rs)],
        inline: false,
        signaled: true,
    };
    // SAFETY: `src` is not touched until the completion is polled below.
    unsafe { nic.post_send(a, &write).unwrap() };
    let c = poll(&nic, cq, 1);
    assert_eq!(
        (c[0].wr_id, c[0].status, c[0].opcode),
        (1, WcStatus::Success, WcOpcode::RdmaWrite)
    );
    assert_eq!(dst, src);
    let read = SendWr {
        wr_id: 2,
        opcode: Opcode::RdmaRead {
            remote_addr: rd.addr,
            rkey: rd.rkey,
        },
        sgl: &[sge(&back, &rb)],
        inline: false,
        signaled: true,
    };
    // SAFETY: `back` is not touched until the completion is polled below.
    unsafe { nic.post_send(a, &read).unwrap() };
    let c = poll(&nic, cq, 1);
    assert_eq!(
        (c[0].wr_id, c[0].status, c[0].opcode),
        (2, WcStatus::Success, WcOpcode::RdmaRead)
    );
    assert_eq!(back, src);
    for r in [rs, rd, rb] {
        nic.deregister(r.lkey).unwrap();
    }
    assert_eq!(nic.counters().pinned_now, 0);
}

#[test]
#[ignore = "requires an RDMA device"]
fn send_with_immediate_into_an_odp_receive() {
    let nic = device();
    if require(Prerequisite::RdmaOdp, nic.capabilities().require_rc_odp()).is_none() {
        return;
    }
    let (cq, a, b) = loopback(&nic);
    let src = vec![0x5au8; 8192];
    let dst = vec![0u8; 8192];
    let odp = Access::ON_DEMAND | Access::LOCAL_WRITE;
    let rs = nic.register(src.as_ptr() as u64, 8192, odp).unwrap();
    let rd = nic.register(dst.as_ptr() as u64, 8192, odp).unwrap();
    assert_eq!(nic.counters().pinned_now, 0, "ODP pins nothing");
    let recv = RecvWr {
        wr_id: 10,
        sgl: &[sge(&dst, &rd)],
    };
    // SAFETY: `dst` is not touched until the receive completes.
    unsafe { nic.post_recv(b, &recv).unwrap() };
    let send = SendWr {
        wr_id: 11,
        opcode: Opcode::SendWithImm(0xfeed_f00d),
        sgl: &[sge(&src, &rs)],
        inline: false,
        signaled: true,
    };
    // SAFETY: `src` is not touched until the send completes.
    unsafe { nic.post_send(a, &send).unwrap() };
    let mut c = poll(&nic, cq, 2);
    c.sort_by_key(|c| c.wr_id);
    assert_eq!(
        (c[0].wr_id, c[0].status, c[0].opcode),
        (10, WcStatus::Success, WcOpcode::Recv)
    );
    assert_eq!((c[0].byte_len, c[0].imm), (8192, Some(0xfeed_f00d)));
    assert_eq!((c[1].wr_id, c[1].status), (11, WcStatus::Success));
    // The sender's own completion carries neither the immediate nor a length (mlx5 sets
    // IBV_WC_WITH_IMM on it but writes neither field).
    assert_eq!(
        (c[1].opcode, c[1].byte_len, c[1].imm),
        (WcOpcode::Send, 0, None)
    );
    assert_eq!(dst, src);
}

#[test]
#[ignore = "requires an RDMA device"]
fn implicit_odp_write_after_prefetch() {
    let nic = device();
    if require(
        Prerequisite::RdmaOdp,
        nic.capabilities().require_implicit_odp(),
    )
    .is_none()
    {
        return;
    }
    let (cq, a, _b) = loopback(&nic);
    let all = nic.register_implicit_odp(rw()).unwrap();
    assert_eq!((all.addr, all.len), (0, u64::MAX));
    let src = vec![3u8; 1 << 20];
    let dst = vec![0u8; 1 << 20];
    nic.advise(all.lkey, src.as_ptr() as u64, 1 << 20, Advice::Prefetch)
        .unwrap();
    nic.advise(
        all.lkey,
        dst.as_ptr() as u64,
        1 << 20,
        Advice::PrefetchWrite,
    )
    .unwrap();
    assert!(nic.counters().prefetch_pages >= 2 * 256);
    let write = SendWr {
        wr_id: 20,
        opcode: Opcode::RdmaWrite {
            remote_addr: dst.as_ptr() as u64,
            rkey: all.rkey,
        },
        sgl: &[sge(&src, &all)],
        inline: false,
        signaled: true,
    };
    // SAFETY: `src` is not touched until the completion is polled below.
    unsafe { nic.post_send(a, &write).unwrap() };
    let c = poll(&nic, cq, 1);
    assert_eq!(c[0].status, WcStatus::Success);
    assert_eq!(dst, src);
    assert_eq!(nic.counters().pinned_now, 0);
}

#[test]
#[ignore = "requires an RDMA device"]
fn a_bad_rkey_fails_then_flushes() {
    let nic = device();
    let (cq, a, _b) = loopback(&nic);
    let src = vec![1u8; 4096];
    let dst = vec![0u8; 4096];
    let rs = nic
        .register(src.as_ptr() as u64, 4096, Access::LOCAL_WRITE)
        .unwrap();
    let rd = nic.register(dst.as_ptr() as u64, 4096, rw()).unwrap();
    for (wr_id, rkey) in [(30, rd.rkey ^ 0x00ff_ff00), (31, rd.rkey)] {
        let w = SendWr {
            wr_id,
            opcode: Opcode::RdmaWrite {
                remote_addr: rd.addr,
                rkey,
            },
            sgl: &[sge(&src, &rs)],
            inline: false,
            signaled: false,
        };
        // SAFETY: `src` is not touched until both completions are polled below.
        unsafe { nic.post_send(a, &w).unwrap() };
    }
    // Unsignaled, but errors always complete; the second is flushed.
    let c = poll(&nic, cq, 2);
    assert_eq!((c[0].wr_id, c[0].status), (30, WcStatus::RemoteAccessError));
    assert_eq!(
        c[0].opcode,
        WcOpcode::RdmaWrite,
        "from the provider's own record"
    );
    assert_eq!((c[1].wr_id, c[1].status), (31, WcStatus::WrFlushError));
    assert!(dst.iter().all(|b| *b == 0), "target untouched");
    assert!(nic.counters().error_completions >= 2);
    assert_eq!(nic.recent_errors()[0].wr_id, 30);
}

#[test]
#[ignore = "requires an RDMA device"]
fn inline_sends_need_no_key() {
    let nic = device();
    let (cq, a, b) = loopback(&nic);
    let dst = vec![0u8; 64];
    let rd = nic
        .register(dst.as_ptr() as u64, 64, Access::LOCAL_WRITE)
        .unwrap();
    let recv = RecvWr {
        wr_id: 40,
        sgl: &[sge(&dst, &rd)],
    };
    // SAFETY: `dst` is not touched until the receive completes.
    unsafe { nic.post_recv(b, &recv).unwrap() };
    let msg = *b"inline, no key needed";
    let send = SendWr {
        wr_id: 41,
        opcode: Opcode::Send,
        sgl: &[Sge {
            addr: msg.as_ptr() as u64,
            len: msg.len() as u32,
            lkey: 0,
        }],
        inline: true,
        signaled: true,
    };
    // SAFETY: inline: the payload is copied at post time.
    unsafe { nic.post_send(a, &send).unwrap() };
    let mut c = poll(&nic, cq, 2);
    c.sort_by_key(|c| c.wr_id);
    assert_eq!(
        (c[0].status, c[0].byte_len),
        (WcStatus::Success, msg.len() as u32)
    );
    assert_eq!(&dst[..msg.len()], &msg);
    assert_eq!(nic.counters().bytes_inline, msg.len() as u64);
}

#[test]
#[ignore = "requires an RDMA device"]
fn a_send_before_connect_is_refused_not_reported_as_a_full_queue() {
    let nic = device();
    let cq = nic.create_cq(cq_depth_for(1)).unwrap();
    let a = nic.create_qp(0, cq, cq, QpCaps::default()).unwrap();
    let msg = *b"too early";
    let send = SendWr {
        wr_id: 50,
        opcode: Opcode::Send,
        sgl: &[Sge {
            addr: msg.as_ptr() as u64,
            len: msg.len() as u32,
            lkey: 0,
        }],
        inline: true,
        signaled: true,
    };
    // SAFETY: inline, and refused before anything is posted.
    let e = unsafe { nic.post_send(a, &send) }.unwrap_err();
    assert!(e.to_string().contains("not connected"), "{e}");
}

#[test]
#[ignore = "requires an RDMA device"]
fn a_completion_queue_too_small_for_its_queue_pairs_is_refused() {
    let nic = device();
    // The device may round the size up (mlx5 to a power of two, minus one): ask for exactly
    // one queue pair's worth of a power of two and fill what it granted.
    let caps = QpCaps {
        max_send_wr: 512,
        max_recv_wr: 512,
        ..QpCaps::default()
    };
    let cq = nic.create_cq(1024).unwrap();
    let mut made = 0;
    let e = loop {
        match nic.create_qp(0, cq, cq, caps) {
            Ok(_) => made += 1,
            Err(e) => break e,
        }
        assert!(
            made < 1024,
            "a 1024-entry completion queue took {made} queue pairs"
        );
    };
    assert!(
        made >= 1,
        "one queue pair of 1024 requests fits 1024 entries"
    );
    let m = e.to_string();
    assert!(
        m.contains("completion queue") && m.contains("IBV_EVENT_CQ_ERR"),
        "{m}"
    );
    assert!(
        nic.recent_async_events().is_empty(),
        "{:?}",
        nic.recent_async_events()
    );
}
