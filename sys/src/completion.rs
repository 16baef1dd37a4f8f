//! The status a work request completes with, after `ibv_wc_status`: what the NIC reports
//! for each work request, and what the errors of the layers above carry when communication
//! with a peer fails.

/// Status of a completion, after `ibv_wc_status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WcStatus {
    /// The work request completed.
    Success,
    /// An incoming send was longer than the posted receive (`IBV_WC_LOC_LEN_ERR`);
    /// nothing past the receive buffer was written.
    LocalLengthError,
    /// A local scatter-gather entry is not covered by a live region with the needed right,
    /// or its memory is not mapped (`IBV_WC_LOC_PROT_ERR`).
    LocalProtectionError,
    /// The work request was flushed because the queue pair is in the error state
    /// (`IBV_WC_WR_FLUSH_ERR`).
    WrFlushError,
    /// The peer rejected the request: it was too long for its receive
    /// (`IBV_WC_REM_INV_REQ_ERR`).
    RemoteInvalidRequest,
    /// The peer's key is unknown or stale, the range is out of bounds, the region lacks the
    /// right, or the target memory is not mapped (`IBV_WC_REM_ACCESS_ERR`). Target memory is
    /// untouched.
    RemoteAccessError,
    /// The peer could not complete a request that was valid on the wire: its receive buffer
    /// failed its own checks, or its queue pair is in the error state (`IBV_WC_REM_OP_ERR`).
    RemoteOperationError,
    /// The peer did not answer: its process is gone (`IBV_WC_RETRY_EXC_ERR`).
    RetryExceeded,
    /// The peer kept answering receiver-not-ready past the retry count
    /// (`IBV_WC_RNR_RETRY_EXC_ERR`).
    RnrRetryExceeded,
}

impl WcStatus {
    /// The status `ibv_wc_status_str` would print.
    #[inline]
    pub fn as_str(self) -> &'static str {
        match self {
            WcStatus::Success => "success",
            WcStatus::LocalLengthError => "local length error",
            WcStatus::LocalProtectionError => "local protection error",
            WcStatus::WrFlushError => "Work Request Flushed Error",
            WcStatus::RemoteInvalidRequest => "remote invalid request error",
            WcStatus::RemoteAccessError => "remote access error",
            WcStatus::RemoteOperationError => "remote operation error",
            WcStatus::RetryExceeded => "transport retry counter exceeded",
            WcStatus::RnrRetryExceeded => "RNR retry counter exceeded",
        }
    }
}

impl WcStatus {
    /// Wire code of the status (for acknowledgements).
    #[inline]
    pub fn code(self) -> u16 {
        match self {
            WcStatus::Success => 0,
            WcStatus::LocalLengthError => 1,
            WcStatus::LocalProtectionError => 2,
            WcStatus::WrFlushError => 3,
            WcStatus::RemoteInvalidRequest => 4,
            WcStatus::RemoteAccessError => 5,
            WcStatus::RemoteOperationError => 6,
            WcStatus::RetryExceeded => 7,
            WcStatus::RnrRetryExceeded => 8,
        }
    }

    /// The status of a wire code (unknown codes read as a remote operation error).
    #[inline]
    pub fn from_code(code: u16) -> WcStatus {
        match code {
            0 => WcStatus::Success,
            1 => WcStatus::LocalLengthError,
            2 => WcStatus::LocalProtectionError,
            3 => WcStatus::WrFlushError,
            4 => WcStatus::RemoteInvalidRequest,
            5 => WcStatus::RemoteAccessError,
            7 => WcStatus::RetryExceeded,
            8 => WcStatus::RnrRetryExceeded,
            _ => WcStatus::RemoteOperationError,
        }
    }
}

impl std::fmt::Display for WcStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
