//! The soft NIC's TCP wire, for peers on other hosts, the design of Open MPI's
//! tcp BTL, UCX's tcp transport and libfabric's tcp provider: one connection per pair of
//! ranks, the same RC packets as the shared-memory rings, the target's checks before any
//! byte lands.
//!
//! - **Which wire.** `PAGEWIRE_SOFT_WIRE=auto` (the default) uses shared memory and CMA for
//!   a peer on the same host — the same kernel, the same `/dev/shm` and the same PID
//!   namespace, compared through [`HostKey`]s exchanged in the bootstrap — and TCP for the
//!   others. `shm` refuses to start a job that spans hosts; `tcp` uses TCP for every other
//!   rank, also on one host (to test and measure the wire there).
//! - **Addresses.** Each rank listens on one interface (`PAGEWIRE_SOFT_IFACE`, else the
//!   first non-loopback interface that is up, else loopback), on a port the kernel picks;
//!   address and port travel in the bootstrap's allgather with the host key.
//! - **Authentication.** Rank 0 draws a 32-byte secret from the OS and sends it to the job
//!   in the bootstrap. A connection's first bytes are a hello with the secret, the sender's
//!   rank and the rank it meant to reach (`frame::Hello`); a hello that is wrong in any way
//!   closes the connection, with a line on stderr, and the rank waits for the right one.
//! - **Connecting.** Rank *j* connects to every TCP peer below it and accepts one from every
//!   TCP peer above it, all at start-up (no cycle: rank 0 only accepts). A peer that does
//!   not connect in [`CONNECT_TIMEOUT`] fails the start-up with its rank named.

pub(crate) mod frame;
pub(crate) mod link;
mod pass;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use frame::{Hello, HELLO_BYTES, SECRET_BYTES};
pub(crate) use link::TcpLink;
use pagewire_sys::error::{Error, Result};
use pagewire_sys::{self as sys, HostKey, PollFor, Wakeup, HOST_KEY_BYTES};

/// How long start-up waits for every TCP peer to connect and say hello.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the driver thread sleeps, at most, before it looks again at whether the
/// application still polls and at its doorbell, while the NIC has TCP links: a socket's
/// data wakes it only while it watches the sockets, and it watches them only while the
/// application does not poll.
pub(crate) const WIRE_WATCH: Duration = Duration::from_millis(1);

/// Which wire carries packets to a peer (`PAGEWIRE_SOFT_WIRE`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WireMode {
    /// Shared memory and CMA for peers on this host, TCP for the others.
    #[default]
    Auto,
    /// Shared memory only: a job that spans hosts fails at start-up.
    Shm,
    /// TCP for every other rank, on this host too.
    Tcp,
}

/// The wire's settings (`PAGEWIRE_SOFT_WIRE`, `PAGEWIRE_SOFT_IFACE`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WireSettings {
    /// Which wire carries packets to a peer.
    pub mode: WireMode,
    /// The interface to listen on, by name (`None`: the first non-loopback one up).
    pub iface: Option<String>,
}

impl WireSettings {
    /// Reads `PAGEWIRE_SOFT_WIRE` (`auto`, `shm`, `tcp`) and `PAGEWIRE_SOFT_IFACE` (an
    /// interface name such as `eth0` or `lo`).
    pub fn from_env() -> Result<WireSettings> {
        Self::parse(
            std::env::var("PAGEWIRE_SOFT_WIRE").ok().as_deref(),
            std::env::var("PAGEWIRE_SOFT_IFACE").ok().as_deref(),
        )
    }

    fn parse(wire: Option<&str>, iface: Option<&str>) -> Result<WireSettings> {
        let mode = match wire {
            None | Some("") | Some("auto") => WireMode::Auto,
            Some("shm") => WireMode::Shm,
            Some("tcp") => WireMode::Tcp,
            Some(other) => {
                return Err(Error::invalid_setting(
                    "PAGEWIRE_SOFT_WIRE",
                    other,
                    "expected auto, shm or tcp",
                ))
            }
        };
        let iface = iface.filter(|s| !s.is_empty()).map(str::to_string);
        Ok(WireSettings { mode, iface })
    }

    /// The IPv4 address to listen on.
    fn listen_address(&self) -> Result<Ipv4Addr> {
        let all = sys::ipv4_interfaces().map_err(|e| Error::os("listing network interfaces", e))?;
        match &self.iface {
            Some(name) => all
                .iter()
                .find(|(n, ..)| n == name)
                .map(|(_, a, _)| *a)
                .ok_or_else(|| {
                    let have: Vec<&str> = all.iter().map(|(n, ..)| n.as_str()).collect();
                    Error::invalid_setting(
                        "PAGEWIRE_SOFT_IFACE",
                        name,
                        format!(
                            "an interface that is up with an IPv4 address; this host has {}",
                            have.join(", ")
                        ),
                    )
                }),
            None => Ok(all
                .iter()
                .find(|(_, _, lo)| !lo)
                .or_else(|| all.first())
                .map(|(_, a, _)| *a)
                .unwrap_or(Ipv4Addr::LOCALHOST)),
        }
    }
}

/// What one rank tells the others about its wire in the bootstrap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct WireAddress {
    pub host: HostKey,
    /// Where it listens; port 0 when it does not (`PAGEWIRE_SOFT_WIRE=shm`).
    pub addr: SocketAddrV4,
    /// The job's secret (rank 0's is the job's; the others send zeros).
    pub secret: [u8; SECRET_BYTES],
}

/// Bytes of an encoded [`WireAddress`].
pub(crate) const WIRE_ADDRESS_BYTES: usize = HOST_KEY_BYTES + 6 + SECRET_BYTES;

impl WireAddress {
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        self.host.encode(out);
        out.extend_from_slice(&self.addr.ip().octets());
        out.extend_from_slice(&self.addr.port().to_le_bytes());
        out.extend_from_slice(&self.secret);
    }

    pub(crate) fn decode(b: &[u8]) -> Option<WireAddress> {
        if b.len() != WIRE_ADDRESS_BYTES {
            return None;
        }
        let at = HOST_KEY_BYTES;
        let ip = Ipv4Addr::new(b[at], b[at + 1], b[at + 2], b[at + 3]);
        let port = u16::from_le_bytes([b[at + 4], b[at + 5]]);
        Some(WireAddress {
            host: HostKey::decode(&b[..HOST_KEY_BYTES]),
            addr: SocketAddrV4::new(ip, port),
            secret: b[at + 6..].try_into().expect("32 bytes"),
        })
    }
}

/// This rank's side of the wire before the exchange: its listener (when it may need one)
/// and what it tells the others.
pub(crate) struct WireStart {
    listener: Option<TcpListener>,
    pub address: WireAddress,
}

impl WireStart {
    /// Listens (unless `shm`), and for rank 0 draws the job's secret.
    pub(crate) fn new(settings: &WireSettings, rank: usize, ranks: usize) -> Result<WireStart> {
        let listener = if settings.mode == WireMode::Shm || ranks < 2 {
            None
        } else {
            let ip = settings.listen_address()?;
            Some(
                TcpListener::bind(SocketAddrV4::new(ip, 0))
                    .map_err(|e| Error::os(format!("listening on {ip} for the TCP wire"), e))?,
            )
        };
        let addr = match &listener {
            Some(l) => match l.local_addr() {
                Ok(std::net::SocketAddr::V4(a)) => a,
                _ => SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0),
            },
            None => SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0),
        };
        let mut secret = [0u8; SECRET_BYTES];
        if rank == 0 {
            use rand::RngCore;
            rand::rngs::OsRng.fill_bytes(&mut secret);
        }
        Ok(WireStart {
            listener,
            address: WireAddress {
                host: HostKey::here(),
                addr,
                secret,
            },
        })
    }

    /// Whether `peer` (its address as exchanged) is reached by TCP from this rank under
    /// `mode`, or the error that stops start-up.
    pub(crate) fn uses_tcp(
        &self,
        mode: WireMode,
        rank: usize,
        peer_rank: usize,
        peer: &WireAddress,
    ) -> Result<bool> {
        if peer_rank == rank {
            return Ok(false);
        }
        let remote = peer.host != self.address.host;
        match mode {
            WireMode::Shm if remote => Err(Error::invalid_setting(
                "PAGEWIRE_SOFT_WIRE",
                "shm",
                format!(
                    "rank {peer_rank} runs on another host (another kernel, /dev/shm or PID \
                     namespace); use PAGEWIRE_SOFT_WIRE=auto"
                ),
            )),
            WireMode::Shm => Ok(false),
            WireMode::Auto if !remote => Ok(false),
            WireMode::Auto | WireMode::Tcp => {
                if peer.addr.port() == 0 {
                    Err(Error::Bootstrap(format!(
                        "rank {peer_rank} is on another host but does not listen for the TCP \
                         wire (it runs with PAGEWIRE_SOFT_WIRE=shm?)"
                    )))
                } else {
                    Ok(true)
                }
            }
        }
    }

    /// Connects to every rank in `tcp_peers` below `rank` and accepts one connection from
    /// every one above, each authenticated by `secret`: the streams, by peer rank.
    pub(crate) fn connect_all(
        self,
        rank: usize,
        tcp_peers: &[(usize, SocketAddrV4)],
        secret: &[u8; SECRET_BYTES],
    ) -> Result<Vec<(usize, TcpStream)>> {
        let deadline = Instant::now() + CONNECT_TIMEOUT;
        let mut out = Vec::with_capacity(tcp_peers.len());
        for &(peer, addr) in tcp_peers.iter().filter(|(p, _)| *p < rank) {
            out.push((peer, connect_to(rank, peer, addr, secret, deadline)?));
        }
        let mut waiting: Vec<usize> = tcp_peers
            .iter()
            .map(|(p, _)| *p)
            .filter(|p| *p > rank)
            .collect();
        if waiting.is_empty() {
            return Ok(out);
        }
        let listener = self.listener.ok_or_else(|| {
            Error::Bootstrap("the TCP wire has no listener (PAGEWIRE_SOFT_WIRE=shm)".into())
        })?;
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::os("setting the TCP wire's listener non-blocking", e))?;
        while !waiting.is_empty() {
            let (mut s, from) = match listener.accept() {
                Ok(x) => x,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() > deadline {
                        return Err(Error::Bootstrap(format!(
                            "rank {rank}: no TCP wire connection from rank(s) {waiting:?} \
                             within {} s",
                            CONNECT_TIMEOUT.as_secs()
                        )));
                    }
                    let _ = sys::poll(
                        &[PollFor {
                            fd: std::os::fd::AsRawFd::as_raw_fd(&listener),
                            read: true,
                            write: false,
                        }],
                        Duration::from_millis(100),
                    );
                    continue;
                }
                Err(e) => return Err(Error::os("accepting a TCP wire connection", e)),
            };
            let hello = s
                .set_nonblocking(false)
                .and_then(|()| s.set_read_timeout(Some(Duration::from_secs(10))))
                .and_then(|()| read_hello(&mut s));
            let refusal = match &hello {
                Err(e) => Some(format!("no hello ({e})")),
                Ok(Err(why)) => Some(why.to_string()),
                Ok(Ok(h)) if !h.has_secret(secret) => Some("a wrong job secret".into()),
                Ok(Ok(h)) if h.to as usize != rank => {
                    Some(format!("a hello meant for rank {}", h.to))
                }
                Ok(Ok(h)) if !waiting.contains(&(h.from as usize)) => Some(format!(
                    "a hello from rank {}, which was not expected",
                    h.from
                )),
                Ok(Ok(_)) => None,
            };
            if let Some(why) = refusal {
                eprintln!(
                    "pagewire: rank {rank}: refused a TCP wire connection from {from}: {why}"
                );
                continue;
            }
            let h = hello.expect("checked").expect("checked");
            let reply = Hello {
                secret: *secret,
                from: rank as u32,
                to: h.from,
            };
            s.write_all(&reply.encode())
                .map_err(|e| Error::os(format!("answering rank {}'s hello", h.from), e))?;
            waiting.retain(|p| *p != h.from as usize);
            out.push((h.from as usize, s));
        }
        Ok(out)
    }
}

fn read_hello(s: &mut TcpStream) -> std::io::Result<std::result::Result<Hello, &'static str>> {
    let mut b = [0u8; HELLO_BYTES];
    s.read_exact(&mut b)?;
    Ok(Hello::decode(&b))
}

fn connect_to(
    rank: usize,
    peer: usize,
    addr: SocketAddrV4,
    secret: &[u8; SECRET_BYTES],
    deadline: Instant,
) -> Result<TcpStream> {
    let fail = |what: String| {
        Error::Bootstrap(format!(
            "rank {rank} could not open the TCP wire to rank {peer} at {addr}: {what}"
        ))
    };
    let mut s = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match TcpStream::connect_timeout(&addr.into(), left.max(Duration::from_millis(1))) {
            Ok(s) => break s,
            Err(e)
                if Instant::now() < deadline
                    && e.kind() == std::io::ErrorKind::ConnectionRefused =>
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(fail(e.to_string())),
        }
    };
    s.set_read_timeout(Some(
        deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1)),
    ))
    .map_err(|e| fail(e.to_string()))?;
    let hello = Hello {
        secret: *secret,
        from: rank as u32,
        to: peer as u32,
    };
    s.write_all(&hello.encode())
        .map_err(|e| fail(format!("sending the hello: {e}")))?;
    let reply = read_hello(&mut s).map_err(|e| fail(format!("no answer to the hello: {e}")))?;
    match reply {
        Ok(h) if h.has_secret(secret) && h.from as usize == peer && h.to as usize == rank => Ok(s),
        Ok(_) => Err(fail("its answer has a wrong secret or ranks".into())),
        Err(why) => Err(fail(why.into())),
    }
}

/// The NIC's TCP links and how its driver thread waits on them.
pub(crate) struct TcpWire {
    pub links: Vec<Arc<TcpLink>>,
    /// Ends the driver's wait early (shutdown).
    pub wakeup: Wakeup,
}

impl TcpWire {
    /// The driver thread's sleep of at most `wait` while the NIC has TCP links: with
    /// `watch` (the application is not polling), until a link has data to read or room for
    /// what waits to go out (`output[i]`), or the wakeup; else on the doorbell futex as
    /// without links. Both at most [`WIRE_WATCH`], so that the driver notices soon when the
    /// application stops polling or a local peer rings.
    pub(crate) fn sleep(
        &self,
        bell: &std::sync::atomic::AtomicU32,
        seen: u32,
        wait: Duration,
        watch: bool,
        output: &[bool],
    ) {
        let wait = wait.min(WIRE_WATCH);
        if !watch {
            sys::futex_wait(bell, seen, wait);
            return;
        }
        let mut fds = Vec::with_capacity(self.links.len() + 1);
        fds.push(PollFor {
            fd: self.wakeup.fd(),
            read: true,
            write: false,
        });
        for (l, &out) in self.links.iter().zip(output) {
            if !l.is_closed() {
                fds.push(PollFor {
                    fd: l.fd(),
                    read: true,
                    write: out,
                });
            }
        }
        if sys::poll(&fds, wait).unwrap_or(0) > 0 {
            self.wakeup.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_settings_parse_and_bad_values_are_named() {
        assert_eq!(
            WireSettings::parse(None, None).unwrap(),
            WireSettings::default()
        );
        let t = WireSettings::parse(Some("tcp"), Some("lo")).unwrap();
        assert_eq!((t.mode, t.iface.as_deref()), (WireMode::Tcp, Some("lo")));
        assert_eq!(
            WireSettings::parse(Some("shm"), Some("")).unwrap().mode,
            WireMode::Shm
        );
        let e = WireSettings::parse(Some("udp"), None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("PAGEWIRE_SOFT_WIRE") && e.contains("auto, shm or tcp"),
            "{e}"
        );
        let e = WireSettings::parse(Some("tcp"), Some("no-such-if0"))
            .unwrap()
            .listen_address()
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("PAGEWIRE_SOFT_IFACE") && e.contains("no-such-if0"),
            "{e}"
        );
        assert!(WireSettings::parse(None, Some("lo"))
            .unwrap()
            .listen_address()
            .unwrap()
            .is_loopback());
    }

    #[test]
    fn addresses_round_trip_and_hosts_compare() {
        let here = HostKey::here();
        assert_eq!(here, HostKey::here());
        let a = WireAddress {
            host: here,
            addr: SocketAddrV4::new(Ipv4Addr::new(10, 1, 2, 3), 4567),
            secret: [9; 32],
        };
        let mut v = Vec::new();
        a.encode(&mut v);
        assert_eq!(v.len(), WIRE_ADDRESS_BYTES);
        assert_eq!(WireAddress::decode(&v), Some(a));
        assert_eq!(WireAddress::decode(&v[1..]), None);
        let start = WireStart {
            listener: None,
            address: a,
        };
        // Another host: the same key with its boot id changed.
        let mut key = Vec::new();
        a.host.encode(&mut key);
        key[0] ^= 1;
        let mut other = a;
        other.host = pagewire_sys::HostKey::decode(&key);
        assert!(!start.uses_tcp(WireMode::Auto, 0, 1, &a).unwrap());
        assert!(start.uses_tcp(WireMode::Auto, 0, 1, &other).unwrap());
        assert!(start.uses_tcp(WireMode::Tcp, 0, 1, &a).unwrap());
        assert!(!start.uses_tcp(WireMode::Tcp, 0, 0, &a).unwrap());
        assert!(start.uses_tcp(WireMode::Shm, 0, 1, &other).is_err());
        other.addr.set_port(0);
        assert!(start.uses_tcp(WireMode::Auto, 0, 1, &other).is_err());
    }

    #[test]
    fn connections_need_the_secret() {
        let settings = WireSettings::parse(Some("tcp"), Some("lo")).unwrap();
        let a = WireStart::new(&settings, 0, 2).unwrap();
        let addr = a.address.addr;
        let secret = [5u8; 32];
        let acceptor = std::thread::spawn(move || a.connect_all(0, &[(1, addr)], &secret));
        // A stranger with a wrong secret is refused; the right rank then gets in.
        let mut bad = TcpStream::connect(addr).unwrap();
        bad.write_all(
            &Hello {
                secret: [6; 32],
                from: 1,
                to: 0,
            }
            .encode(),
        )
        .unwrap();
        let mut buf = [0u8; 1];
        assert_eq!(
            bad.read(&mut buf).unwrap_or(0),
            0,
            "closed without an answer"
        );
        let ok = connect_to(
            1,
            0,
            addr,
            &secret,
            Instant::now() + Duration::from_secs(10),
        )
        .unwrap();
        let got = acceptor.join().unwrap().unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0, 1);
        drop(ok);
    }
}
