//! Which host a process runs on, as the ranks of a job compare it: what decides whether a
//! peer is reached through shared memory or over the network.

use std::os::unix::fs::MetadataExt;

/// What makes two ranks local to each other: the same kernel (boot id), the same `/dev/shm`
/// (device and inode: a mount namespace with its own tmpfs there has another) and the same
/// PID namespace (CMA names processes by pid). Network namespaces alone share all three, so
/// ranks in them stay local, as they are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostKey {
    boot_id: [u8; 36],
    shm_dev: u64,
    shm_ino: u64,
    pid_ns: u64,
}

/// Bytes of an encoded [`HostKey`].
pub const HOST_KEY_BYTES: usize = 36 + 24;

impl HostKey {
    /// This process's.
    pub fn here() -> HostKey {
        let mut boot_id = [0u8; 36];
        if let Ok(s) = std::fs::read_to_string("/proc/sys/kernel/random/boot_id") {
            let b = s.trim().as_bytes();
            let n = b.len().min(36);
            boot_id[..n].copy_from_slice(&b[..n]);
        }
        let (shm_dev, shm_ino) = std::fs::metadata("/dev/shm")
            .map(|m| (m.dev(), m.ino()))
            .unwrap_or((0, 0));
        let pid_ns = std::fs::metadata("/proc/self/ns/pid")
            .map(|m| m.ino())
            .unwrap_or(0);
        HostKey {
            boot_id,
            shm_dev,
            shm_ino,
            pid_ns,
        }
    }

    /// Its bytes ([`HOST_KEY_BYTES`]), to exchange with peers.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.boot_id);
        out.extend_from_slice(&self.shm_dev.to_le_bytes());
        out.extend_from_slice(&self.shm_ino.to_le_bytes());
        out.extend_from_slice(&self.pid_ns.to_le_bytes());
    }

    /// The key `encode` wrote.
    pub fn decode(b: &[u8]) -> HostKey {
        let word = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
        HostKey {
            boot_id: b[..36].try_into().expect("36 bytes"),
            shm_dev: word(36),
            shm_ino: word(44),
            pid_ns: word(52),
        }
    }
}
