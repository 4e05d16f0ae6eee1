//! Test support shared by integration-test targets (see the `ep-test-support` crate).
// NB: each test target uses a different subset.
#[allow(unused_imports)]
pub use ep_test_support::{relay, sshd};
