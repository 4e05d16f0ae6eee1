//! Wire definitions for the part of libvirt's remote protocol this project uses: program
//! numbers, procedure numbers, and the argument and return structures, written from
//! `remote_protocol.x` (libvirt 11.3) for exactly the procedures we call.
//!
//! Guarantees: every structure encodes and decodes field-for-field as the IDL declares it;
//! `char`, `unsigned char` and `unsigned short` fields travel as 4-byte XDR ints.

use crate::xdr::{Decoder, Encoder, Xdr, XdrError};
use crate::xdr_struct;

/// The remote program (`REMOTE_PROGRAM`).
pub const REMOTE_PROGRAM: u32 = 0x2000_8086;
/// `REMOTE_PROTOCOL_VERSION`.
pub const REMOTE_VERSION: u32 = 1;
/// The keepalive program (`KEEPALIVE_PROGRAM`, "keep").
pub const KEEPALIVE_PROGRAM: u32 = 0x6b65_6570;
/// `KEEPALIVE_PROTOCOL_VERSION`.
pub const KEEPALIVE_VERSION: u32 = 1;
/// `KEEPALIVE_PROC_PING`.
pub const KEEPALIVE_PING: i32 = 1;
/// `KEEPALIVE_PROC_PONG`.
pub const KEEPALIVE_PONG: i32 = 2;

/// `VIR_DRV_FEATURE_PROGRAM_KEEPALIVE`: asking about it makes the daemon start its keepalive.
pub const FEATURE_PROGRAM_KEEPALIVE: i32 = 10;

/// `REMOTE_AUTH_POLKIT` in `remote_auth_type`.
pub const AUTH_POLKIT: i32 = 2;

/// Remote procedure numbers (`remote_procedure`).
#[allow(missing_docs)]
pub mod procs {
    pub const CONNECT_OPEN: i32 = 1;
    pub const CONNECT_CLOSE: i32 = 2;
    pub const CONNECT_GET_VERSION: i32 = 4;
    pub const CONNECT_GET_CAPABILITIES: i32 = 7;
    pub const DOMAIN_CREATE: i32 = 9;
    pub const DOMAIN_GET_XML_DESC: i32 = 14;
    pub const DOMAIN_GET_INFO: i32 = 16;
    pub const DOMAIN_LOOKUP_BY_NAME: i32 = 23;
    pub const NETWORK_GET_XML_DESC: i32 = 43;
    pub const NETWORK_LOOKUP_BY_NAME: i32 = 46;
    pub const CONNECT_GET_HOSTNAME: i32 = 59;
    pub const CONNECT_SUPPORTS_FEATURE: i32 = 60;
    pub const AUTH_LIST: i32 = 66;
    pub const AUTH_POLKIT: i32 = 70;
    pub const STORAGE_POOL_REFRESH: i32 = 83;
    pub const STORAGE_POOL_LOOKUP_BY_NAME: i32 = 84;
    pub const STORAGE_POOL_GET_INFO: i32 = 87;
    pub const STORAGE_VOL_CREATE_XML: i32 = 93;
    pub const STORAGE_VOL_CREATE_XML_FROM: i32 = 125;
    pub const STORAGE_VOL_DELETE: i32 = 94;
    pub const STORAGE_VOL_LOOKUP_BY_NAME: i32 = 95;
    pub const STORAGE_VOL_GET_INFO: i32 = 98;
    pub const STORAGE_VOL_GET_XML_DESC: i32 = 99;
    pub const STORAGE_VOL_GET_PATH: i32 = 100;
    pub const CONNECT_GET_LIB_VERSION: i32 = 157;
    pub const NWFILTER_LOOKUP_BY_NAME: i32 = 175;
    pub const NWFILTER_GET_XML_DESC: i32 = 177;
    pub const NWFILTER_DEFINE_XML: i32 = 180;
    pub const NWFILTER_UNDEFINE: i32 = 181;
    pub const DOMAIN_CREATE_WITH_FLAGS: i32 = 196;
    pub const STORAGE_VOL_UPLOAD: i32 = 208;
    pub const DOMAIN_GET_STATE: i32 = 212;
    pub const DOMAIN_UNDEFINE_FLAGS: i32 = 231;
    pub const DOMAIN_DESTROY_FLAGS: i32 = 234;
    pub const DOMAIN_SET_METADATA: i32 = 264;
    pub const DOMAIN_GET_METADATA: i32 = 265;
    pub const CONNECT_LIST_ALL_DOMAINS: i32 = 273;
    pub const STORAGE_POOL_LIST_ALL_VOLUMES: i32 = 282;
    pub const CONNECT_DOMAIN_EVENT_CALLBACK_REGISTER_ANY: i32 = 316;
    pub const CONNECT_DOMAIN_EVENT_CALLBACK_DEREGISTER_ANY: i32 = 317;
    pub const DOMAIN_EVENT_CALLBACK_LIFECYCLE: i32 = 318;
    pub const NETWORK_GET_DHCP_LEASES: i32 = 341;
    pub const CONNECT_GET_DOMAIN_CAPABILITIES: i32 = 342;
    pub const DOMAIN_DEFINE_XML_FLAGS: i32 = 350;
    pub const DOMAIN_INTERFACE_ADDRESSES: i32 = 353;
}

/// A domain UUID (16 raw bytes).
pub type Uuid = [u8; 16];

/// Formats a UUID the way libvirt prints it (lowercase, hyphenated).
pub fn format_uuid(u: &Uuid) -> String {
    let mut s = String::with_capacity(36);
    for (i, b) in u.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            s.push('-');
        }
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// A small XDR int carried in a wider Rust type (`char`, `unsigned char`, `unsigned short`).
macro_rules! xdr_small_int {
    ($name:ident, $ty:ty) => {
        /// An XDR `int`-encoded small integer.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
        pub struct $name(pub $ty);
        impl Xdr for $name {
            fn encode(&self, enc: &mut Encoder) {
                enc.put_i32(i32::from(self.0));
            }
            fn decode(dec: &mut Decoder<'_>) -> Result<Self, XdrError> {
                let v = dec.get_i32()?;
                // NB: libvirt sign-extends `char`; keep the low bits as the C side would.
                Ok(Self(v as $ty))
            }
        }
    };
}
xdr_small_int!(XdrU8, u8);
xdr_small_int!(XdrI8, i8);
xdr_small_int!(XdrU16, u16);

xdr_struct! {
    /// `remote_nonnull_domain`.
    pub struct Domain {
        /// Name.
        pub name: String,
        /// UUID.
        pub uuid: Uuid,
        /// Running id, or -1 when inactive.
        pub id: i32,
    }
}

xdr_struct! {
    /// `remote_nonnull_network`.
    pub struct Network {
        /// Name.
        pub name: String,
        /// UUID.
        pub uuid: Uuid,
    }
}

xdr_struct! {
    /// `remote_nonnull_nwfilter`: a network filter.
    pub struct NwFilter {
        /// Name.
        pub name: String,
        /// UUID.
        pub uuid: Uuid,
    }
}

xdr_struct! {
    /// `remote_nonnull_storage_pool`.
    pub struct StoragePool {
        /// Name.
        pub name: String,
        /// UUID.
        pub uuid: Uuid,
    }
}

xdr_struct! {
    /// `remote_nonnull_storage_vol`.
    pub struct StorageVol {
        /// Pool name.
        pub pool: String,
        /// Volume name.
        pub name: String,
        /// Volume key (its path for `dir` pools).
        pub key: String,
    }
}

xdr_struct! {
    /// `remote_error`: the error a daemon returns.
    pub struct RemoteErrorWire {
        /// `virErrorNumber`.
        pub code: i32,
        /// `virErrorDomain`.
        pub domain: i32,
        /// Message.
        pub message: Option<String>,
        /// `virErrorLevel`.
        pub level: i32,
        /// Domain involved (unused by the daemon).
        pub dom: Option<Domain>,
        /// Extra string 1.
        pub str1: Option<String>,
        /// Extra string 2.
        pub str2: Option<String>,
        /// Extra string 3.
        pub str3: Option<String>,
        /// Extra int 1.
        pub int1: i32,
        /// Extra int 2.
        pub int2: i32,
        /// Network involved (unused by the daemon).
        pub net: Option<Network>,
    }
}

xdr_struct! {
    /// `remote_connect_open_args`.
    pub struct ConnectOpenArgs { pub name: Option<String>, pub flags: u32 }
}
xdr_struct! {
    /// `remote_auth_list_ret`.
    pub struct AuthListRet { pub types: Vec<i32> }
}
xdr_struct! {
    /// `remote_auth_polkit_ret`.
    pub struct AuthPolkitRet { pub complete: i32 }
}
xdr_struct! {
    /// `remote_connect_supports_feature_args`.
    pub struct SupportsFeatureArgs { pub feature: i32 }
}
xdr_struct! {
    /// `remote_connect_supports_feature_ret`.
    pub struct SupportsFeatureRet { pub supported: i32 }
}
xdr_struct! {
    /// A reply that is one non-null string (hostname, capabilities, XML, path, metadata).
    pub struct StringRet { pub value: String }
}
xdr_struct! {
    /// A reply that is one `unsigned hyper` (lib version, hypervisor version).
    pub struct U64Ret { pub value: u64 }
}
xdr_struct! {
    /// Arguments that are one non-null name (lookups by name).
    pub struct NameArgs { pub name: String }
}
xdr_struct! {
    /// Arguments that are one domain.
    pub struct DomainArgs { pub dom: Domain }
}
xdr_struct! {
    /// Arguments that are one domain and flags.
    pub struct DomainFlagsArgs { pub dom: Domain, pub flags: u32 }
}
xdr_struct! {
    /// A reply that is one domain.
    pub struct DomainRet { pub dom: Domain }
}
xdr_struct! {
    /// `remote_domain_get_state_ret`.
    pub struct DomainGetStateRet { pub state: i32, pub reason: i32 }
}
xdr_struct! {
    /// `remote_domain_get_info_ret`.
    pub struct DomainGetInfoRet {
        pub state: XdrU8,
        pub max_mem: u64,
        pub memory: u64,
        pub nr_virt_cpu: XdrU16,
        pub cpu_time: u64,
    }
}
xdr_struct! {
    /// `remote_domain_define_xml_flags_args`.
    pub struct DomainDefineXmlFlagsArgs { pub xml: String, pub flags: u32 }
}
xdr_struct! {
    /// `remote_domain_get_metadata_args`.
    pub struct DomainGetMetadataArgs {
        pub dom: Domain,
        pub kind: i32,
        pub uri: Option<String>,
        pub flags: u32,
    }
}
xdr_struct! {
    /// `remote_domain_set_metadata_args`.
    pub struct DomainSetMetadataArgs {
        pub dom: Domain,
        pub kind: i32,
        pub metadata: Option<String>,
        pub key: Option<String>,
        pub uri: Option<String>,
        pub flags: u32,
    }
}
xdr_struct! {
    /// `remote_connect_list_all_domains_args`.
    pub struct ListAllDomainsArgs { pub need_results: i32, pub flags: u32 }
}
xdr_struct! {
    /// `remote_connect_list_all_domains_ret`.
    pub struct ListAllDomainsRet { pub domains: Vec<Domain>, pub ret: u32 }
}
xdr_struct! {
    /// `remote_domain_interface_addresses_args`.
    pub struct DomainInterfaceAddressesArgs { pub dom: Domain, pub source: u32, pub flags: u32 }
}
xdr_struct! {
    /// `remote_domain_ip_addr`.
    pub struct DomainIpAddr { pub kind: i32, pub addr: String, pub prefix: u32 }
}
xdr_struct! {
    /// `remote_domain_interface`.
    pub struct DomainInterface {
        pub name: String,
        pub hwaddr: Option<String>,
        pub addrs: Vec<DomainIpAddr>,
    }
}
xdr_struct! {
    /// `remote_domain_interface_addresses_ret`.
    pub struct DomainInterfaceAddressesRet { pub ifaces: Vec<DomainInterface> }
}
xdr_struct! {
    /// `remote_connect_get_domain_capabilities_args`.
    pub struct GetDomainCapabilitiesArgs {
        pub emulatorbin: Option<String>,
        pub arch: Option<String>,
        pub machine: Option<String>,
        pub virttype: Option<String>,
        pub flags: u32,
    }
}
xdr_struct! {
    /// A reply that is one network.
    pub struct NetworkRet { pub net: Network }
}
xdr_struct! {
    /// Arguments that are one network and flags.
    pub struct NetworkFlagsArgs { pub net: Network, pub flags: u32 }
}
xdr_struct! {
    /// A reply that is one network filter (`remote_nwfilter_lookup_by_name_ret`,
    /// `remote_nwfilter_define_xml_ret`).
    pub struct NwFilterRet { pub filter: NwFilter }
}
xdr_struct! {
    /// Arguments that are one network filter (`remote_nwfilter_undefine_args`).
    pub struct NwFilterArgs { pub filter: NwFilter }
}
xdr_struct! {
    /// `remote_nwfilter_define_xml_args`.
    pub struct NwFilterDefineXmlArgs { pub xml: String }
}
xdr_struct! {
    /// `remote_nwfilter_get_xml_desc_args`.
    pub struct NwFilterGetXmlDescArgs { pub filter: NwFilter, pub flags: u32 }
}
xdr_struct! {
    /// `remote_network_get_dhcp_leases_args`.
    pub struct NetworkGetDhcpLeasesArgs {
        pub net: Network,
        pub mac: Option<String>,
        pub need_results: i32,
        pub flags: u32,
    }
}
xdr_struct! {
    /// `remote_network_dhcp_lease`.
    pub struct NetworkDhcpLease {
        pub iface: String,
        pub expirytime: i64,
        pub kind: i32,
        pub mac: Option<String>,
        pub iaid: Option<String>,
        pub ipaddr: String,
        pub prefix: u32,
        pub hostname: Option<String>,
        pub clientid: Option<String>,
    }
}
xdr_struct! {
    /// `remote_network_get_dhcp_leases_ret`.
    pub struct NetworkGetDhcpLeasesRet { pub leases: Vec<NetworkDhcpLease>, pub ret: u32 }
}
xdr_struct! {
    /// A reply that is one storage pool.
    pub struct StoragePoolRet { pub pool: StoragePool }
}
xdr_struct! {
    /// Arguments that are one storage pool.
    pub struct StoragePoolArgs { pub pool: StoragePool }
}
xdr_struct! {
    /// Arguments that are one storage pool and flags.
    pub struct StoragePoolFlagsArgs { pub pool: StoragePool, pub flags: u32 }
}
xdr_struct! {
    /// `remote_storage_pool_get_info_ret`.
    pub struct StoragePoolGetInfoRet {
        pub state: XdrU8,
        pub capacity: u64,
        pub allocation: u64,
        pub available: u64,
    }
}
xdr_struct! {
    /// `remote_storage_pool_list_all_volumes_args`.
    pub struct StoragePoolListAllVolumesArgs { pub pool: StoragePool, pub need_results: i32, pub flags: u32 }
}
xdr_struct! {
    /// `remote_storage_pool_list_all_volumes_ret`.
    pub struct StoragePoolListAllVolumesRet { pub vols: Vec<StorageVol>, pub ret: u32 }
}
xdr_struct! {
    /// `remote_storage_vol_create_xml_args`.
    pub struct StorageVolCreateXmlArgs { pub pool: StoragePool, pub xml: String, pub flags: u32 }
}
xdr_struct! {
    /// `remote_storage_vol_create_xml_from_args`: a new volume from `xml`, its content cloned
    /// from `clonevol`.
    pub struct StorageVolCreateXmlFromArgs { pub pool: StoragePool, pub xml: String, pub clonevol: StorageVol, pub flags: u32 }
}
xdr_struct! {
    /// `remote_storage_vol_lookup_by_name_args`.
    pub struct StorageVolLookupByNameArgs { pub pool: StoragePool, pub name: String }
}
xdr_struct! {
    /// A reply that is one storage volume.
    pub struct StorageVolRet { pub vol: StorageVol }
}
xdr_struct! {
    /// Arguments that are one storage volume.
    pub struct StorageVolArgs { pub vol: StorageVol }
}
xdr_struct! {
    /// Arguments that are one storage volume and flags.
    pub struct StorageVolFlagsArgs { pub vol: StorageVol, pub flags: u32 }
}
xdr_struct! {
    /// `remote_storage_vol_get_info_ret`.
    pub struct StorageVolGetInfoRet { pub kind: XdrI8, pub capacity: u64, pub allocation: u64 }
}
xdr_struct! {
    /// `remote_storage_vol_upload_args`.
    pub struct StorageVolUploadArgs { pub vol: StorageVol, pub offset: u64, pub length: u64, pub flags: u32 }
}
xdr_struct! {
    /// `remote_connect_domain_event_callback_register_any_args`.
    pub struct DomainEventCallbackRegisterAnyArgs { pub event_id: i32, pub dom: Option<Domain> }
}
xdr_struct! {
    /// `remote_connect_domain_event_callback_register_any_ret`.
    pub struct DomainEventCallbackRegisterAnyRet { pub callback_id: i32 }
}
xdr_struct! {
    /// `remote_connect_domain_event_callback_deregister_any_args`.
    pub struct DomainEventCallbackDeregisterAnyArgs { pub callback_id: i32 }
}
xdr_struct! {
    /// `remote_domain_event_lifecycle_msg`.
    pub struct DomainEventLifecycleMsg { pub dom: Domain, pub event: i32, pub detail: i32 }
}
xdr_struct! {
    /// `remote_domain_event_callback_lifecycle_msg`.
    pub struct DomainEventCallbackLifecycleMsg { pub callback_id: i32, pub msg: DomainEventLifecycleMsg }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xdr::{from_bytes, to_bytes};

    #[test]
    fn domain_encodes_name_uuid_id_in_order() {
        let d = Domain {
            name: "ab".into(),
            uuid: [7; 16],
            id: -1,
        };
        let b = to_bytes(&d);
        assert_eq!(b.len(), 4 + 4 + 16 + 4);
        assert_eq!(&b[..8], &[0, 0, 0, 2, b'a', b'b', 0, 0]);
        assert_eq!(&b[24..], &[0xff; 4]);
        assert_eq!(from_bytes::<Domain>(&b).unwrap(), d);
    }

    #[test]
    fn uuid_formats_like_libvirt() {
        let u = [
            0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab,
            0xcd, 0xef,
        ];
        assert_eq!(format_uuid(&u), "12345678-9abc-def0-0123-456789abcdef");
    }

    #[test]
    fn pool_info_small_ints_take_four_bytes() {
        let r = StoragePoolGetInfoRet {
            state: XdrU8(2),
            capacity: 1,
            allocation: 2,
            available: 3,
        };
        assert_eq!(to_bytes(&r).len(), 4 + 24);
    }
}
