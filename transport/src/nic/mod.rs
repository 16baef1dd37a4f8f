//! The NIC boundary ([`pagewire_nic`]: the provider trait, regions, counters) with its
//! providers: the soft NIC ([`soft`], the `pagewire-soft` crate, the default) and, with the
//! `verbs` feature, rdma-core (`verbs`, the `pagewire-verbs` crate); [`open`] brings up the one `PAGEWIRE_TRANSPORT`
//! names.

pub use pagewire_nic::*;
pub use pagewire_soft as soft;
#[cfg(feature = "verbs")]
pub use pagewire_verbs as verbs;

use crate::error::Result;

/// Brings up the NIC named by `PAGEWIRE_TRANSPORT` for this rank (collective over `boot`).
pub fn open(boot: &dyn crate::boot::Bootstrap) -> Result<Box<dyn Nic>> {
    match ProviderKind::from_env()? {
        ProviderKind::Soft => Ok(Box::new(soft::SoftNic::new(
            boot,
            soft::SoftConfig::from_env()?,
        )?)),
        ProviderKind::Verbs => open_verbs(boot),
    }
}

#[cfg(feature = "verbs")]
fn open_verbs(boot: &dyn crate::boot::Bootstrap) -> Result<Box<dyn Nic>> {
    Ok(Box::new(verbs::VerbsNic::open(
        boot,
        verbs::VerbsConfig::from_env()?,
    )?))
}

#[cfg(not(feature = "verbs"))]
fn open_verbs(_boot: &dyn crate::boot::Bootstrap) -> Result<Box<dyn Nic>> {
    Err(crate::sys::Error::NotSupported(
        "PAGEWIRE_TRANSPORT=verbs, but pagewire was built without the `verbs` feature; \
         rebuild with `--features verbs`, or use the soft provider (PAGEWIRE_TRANSPORT=soft)"
            .into(),
    )
    .into())
}
