//! Label sets shared by the operator's families and the health engine's, so both label a
//! host the same way.

use prometheus_client::encoding::EncodeLabelSet;

/// `entry`/`host` labels: one provider entry's host.
#[derive(Debug, Clone, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub(crate) struct HostLabel {
    pub(crate) entry: String,
    pub(crate) host: String,
}
