//! Fuzzes XDR decoding: every input is decoded as every structure in
//! `libvirt_remote::proto` (replies, arguments the fake decodes, events, `remote_error`) and
//! as the generic shapes they are built from.
//!
//! Checks:
//! - `xdr::from_bytes` never panics and never allocates beyond the input (a huge count or
//!   string length is refused before anything is reserved; libFuzzer's malloc limit and
//!   ASan catch a violation);
//! - a decoded value re-encodes to the same number of bytes, that encoding decodes back to
//!   the same value, and re-encoding is a fixed point.
//!
//! NB: the encoding is *not* compared byte for byte with the input. The decoder accepts
//! non-zero XDR padding and out-of-range high bits in `char`/`unsigned char`/`unsigned short`
//! fields, exactly as libvirt's own decoder (tirpc's `xdr_opaque`, `xdr_u_char`, ...) does;
//! re-encoding writes canonical zeros there. Those bytes carry no data, so accepting them is
//! harmless, and refusing them would make us stricter than the daemon we talk to.

#![no_main]

use std::fmt::Debug;

use libfuzzer_sys::fuzz_target;
use libvirt_remote::proto::*;
use libvirt_remote::xdr::{self, Xdr};

fn check<T: Xdr + PartialEq + Debug>(data: &[u8]) {
    let Ok(v) = xdr::from_bytes::<T>(data) else {
        return;
    };
    let enc = xdr::to_bytes(&v);
    assert_eq!(
        enc.len(),
        data.len(),
        "{} re-encodes to a different length",
        std::any::type_name::<T>()
    );
    let back = xdr::from_bytes::<T>(&enc).expect("a canonical encoding decodes");
    assert_eq!(
        back,
        v,
        "{} does not round-trip",
        std::any::type_name::<T>()
    );
    assert_eq!(
        xdr::to_bytes(&back),
        enc,
        "re-encoding is not a fixed point"
    );
}

fuzz_target!(|data: &[u8]| {
    // Generic shapes.
    check::<()>(data);
    check::<u32>(data);
    check::<i64>(data);
    check::<bool>(data);
    check::<String>(data);
    check::<Option<String>>(data);
    check::<Uuid>(data);
    check::<Vec<i32>>(data);
    check::<Vec<String>>(data);
    check::<Vec<Domain>>(data);
    check::<Option<Domain>>(data);
    check::<Vec<Option<String>>>(data);
    check::<XdrU8>(data);
    check::<XdrI8>(data);
    check::<XdrU16>(data);
    // Handles and the error.
    check::<Domain>(data);
    check::<Network>(data);
    check::<StoragePool>(data);
    check::<StorageVol>(data);
    check::<RemoteErrorWire>(data);
    // Replies.
    check::<AuthListRet>(data);
    check::<AuthPolkitRet>(data);
    check::<SupportsFeatureRet>(data);
    check::<StringRet>(data);
    check::<U64Ret>(data);
    check::<DomainRet>(data);
    check::<DomainGetStateRet>(data);
    check::<DomainGetInfoRet>(data);
    check::<ListAllDomainsRet>(data);
    check::<DomainIpAddr>(data);
    check::<DomainInterface>(data);
    check::<DomainInterfaceAddressesRet>(data);
    check::<NetworkRet>(data);
    check::<NetworkDhcpLease>(data);
    check::<NetworkGetDhcpLeasesRet>(data);
    check::<StoragePoolRet>(data);
    check::<StoragePoolGetInfoRet>(data);
    check::<StoragePoolListAllVolumesRet>(data);
    check::<StorageVolRet>(data);
    check::<StorageVolGetInfoRet>(data);
    check::<DomainEventCallbackRegisterAnyRet>(data);
    // Events.
    check::<DomainEventLifecycleMsg>(data);
    check::<DomainEventCallbackLifecycleMsg>(data);
    // Arguments (the fake daemon decodes these from the client).
    check::<ConnectOpenArgs>(data);
    check::<SupportsFeatureArgs>(data);
    check::<NameArgs>(data);
    check::<DomainArgs>(data);
    check::<DomainFlagsArgs>(data);
    check::<DomainDefineXmlFlagsArgs>(data);
    check::<DomainGetMetadataArgs>(data);
    check::<DomainSetMetadataArgs>(data);
    check::<ListAllDomainsArgs>(data);
    check::<DomainInterfaceAddressesArgs>(data);
    check::<GetDomainCapabilitiesArgs>(data);
    check::<NetworkFlagsArgs>(data);
    check::<NetworkGetDhcpLeasesArgs>(data);
    check::<StoragePoolArgs>(data);
    check::<StoragePoolFlagsArgs>(data);
    check::<StoragePoolListAllVolumesArgs>(data);
    check::<StorageVolCreateXmlArgs>(data);
    check::<StorageVolLookupByNameArgs>(data);
    check::<StorageVolArgs>(data);
    check::<StorageVolFlagsArgs>(data);
    check::<StorageVolUploadArgs>(data);
    check::<DomainEventCallbackRegisterAnyArgs>(data);
    check::<DomainEventCallbackDeregisterAnyArgs>(data);
});
