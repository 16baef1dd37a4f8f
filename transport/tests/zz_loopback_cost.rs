// Temporary measurement (not committed): the NIC's software cost per inline SEND on a loopback QP.
mod util;
use pagewire_transport::nic::{Access, Nic, Opcode, RecvWr, SendWr, Sge};
use pagewire_transport::sys::AnonMapping;
use util::{ranks, Rank};

fn body(r: &Rank) {
    let qps = r.connect_all(true);
    let qp = qps[0].unwrap();
    let buf = AnonMapping::new(1 << 16).unwrap();
    let mr = r
        .nic
        .register(
            buf.addr(),
            1 << 16,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        )
        .unwrap();
    let src = [7u8; 72];
    let n = 2_000_000u64;
    let mut out = Vec::with_capacity(16);
    let t0 = std::time::Instant::now();
    for i in 0..n {
        unsafe {
            r.nic
                .post_recv(
                    qp,
                    &RecvWr {
                        wr_id: i,
                        sgl: &[Sge {
                            addr: buf.addr(),
                            len: 4096,
                            lkey: mr.lkey,
                        }],
                    },
                )
                .unwrap();
            r.nic
                .post_send(
                    qp,
                    &SendWr {
                        wr_id: i,
                        opcode: Opcode::Send,
                        sgl: &[Sge {
                            addr: src.as_ptr() as u64,
                            len: 72,
                            lkey: 0,
                        }],
                        inline: true,
                        signaled: true,
                    },
                )
                .unwrap();
        }
        let mut got = 0;
        while got < 2 {
            out.clear();
            got += r.nic.poll_cq(r.cq, &mut out, 16).unwrap();
        }
    }
    let dt = t0.elapsed();
    eprintln!(
        "LOOPBACK: {:.1} ns per message (post_recv + post_send + polls)",
        dt.as_nanos() as f64 / n as f64
    );
}

#[test]
fn loopback_cost() {
    ranks("loopback_cost", 1, &[], body);
}
