//! libvirt's `(state, reason)` of a domain, mapped to the provider's [`InstanceState`].
//!
//! Guarantees (findings M1, L6): paused and pmsuspended domains are [`InstanceState::Paused`]
//! with libvirt's reason in words (an I/O-error pause says the host's storage may be full) and
//! are never Stopped, so nothing destroys them; only shut off and crashed are
//! [`InstanceState::Stopped`]; a running domain is Running only with a known address of our
//! NIC, Provisioning otherwise; a state this table does not know is Paused (non-destructive)
//! with its number. Pure: no I/O. A vanished domain never reaches this table: the callers
//! turn libvirt's "no domain" into NotFound.

use libvirt_remote::client::domain_state as ds;

use crate::model::InstanceState;

/// Whether a domain in `state` may have a guest address worth reading: running, blocked on a
/// resource (still running), or shutting down (still up until it is shut off).
pub fn wants_address(state: i32) -> bool {
    matches!(state, ds::RUNNING | ds::BLOCKED | ds::SHUTDOWN)
}

/// Maps `(state, reason)` as `DOMAIN_GET_STATE` returns them; `address_known` says whether an
/// address of our NIC was found.
pub fn map(state: i32, reason: i32, address_known: bool) -> InstanceState {
    let up = || {
        if address_known {
            InstanceState::Running
        } else {
            InstanceState::Provisioning
        }
    };
    match state {
        // NB: NOSTATE is what libvirt reports while a domain is being set up; it is not gone.
        ds::NOSTATE => InstanceState::Provisioning,
        ds::RUNNING | ds::BLOCKED | ds::SHUTDOWN => up(),
        ds::PAUSED => InstanceState::Paused {
            reason: paused_reason(reason),
        },
        ds::PMSUSPENDED => InstanceState::Paused {
            reason: pmsuspended_reason(reason),
        },
        ds::SHUTOFF => InstanceState::Stopped {
            reason: shutoff_reason(reason),
        },
        ds::CRASHED => InstanceState::Stopped {
            reason: crashed_reason(reason),
        },
        other => InstanceState::Paused {
            reason: format!("unknown libvirt domain state {other} (reason {reason})"),
        },
    }
}

/// `virDomainPausedReason` in words.
pub fn paused_reason(reason: i32) -> String {
    let r = match reason {
        0 => "paused for an unknown reason",
        1 => "paused by the user (virsh suspend or the API)",
        2 => "paused for migration",
        3 => "paused for a save",
        4 => "paused for a core dump",
        5 => "paused after an I/O error (the host's storage pool may be full)",
        6 => "paused by the watchdog",
        7 => "paused after restoring from a snapshot",
        8 => "paused while shutting down",
        9 => "paused while a snapshot is taken",
        10 => "paused after a guest crash",
        11 => "paused while starting up",
        12 => "paused for post-copy migration",
        13 => "paused after a failed post-copy migration",
        14 => "paused after a failed API call (check the host's libvirt log)",
        other => return format!("paused (libvirt reason {other})"),
    };
    r.to_owned()
}

/// `virDomainPMSuspendedReason` in words (libvirt defines only "unknown").
pub fn pmsuspended_reason(reason: i32) -> String {
    match reason {
        0 => "suspended by guest power management".to_owned(),
        other => format!("suspended by guest power management (libvirt reason {other})"),
    }
}

/// `virDomainShutoffReason` in words.
pub fn shutoff_reason(reason: i32) -> String {
    let r = match reason {
        0 => "shut off for an unknown reason",
        1 => "shut off: the guest shut down",
        2 => "shut off: destroyed",
        3 => "shut off: the guest crashed",
        4 => "shut off: migrated away",
        5 => "shut off: saved to a file",
        6 => "shut off: the domain failed to start",
        7 => "shut off: restored from a snapshot of a shut-off domain",
        8 => "shut off: the daemon stopped it",
        other => return format!("shut off (libvirt reason {other})"),
    };
    r.to_owned()
}

/// `virDomainCrashedReason` in words.
pub fn crashed_reason(reason: i32) -> String {
    match reason {
        0 => "crashed for an unknown reason".to_owned(),
        1 => "crashed: the guest kernel panicked".to_owned(),
        other => format!("crashed (libvirt reason {other})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paused_domains_are_never_stopped_whatever_the_reason() {
        // finding: M1
        for reason in 0..20 {
            assert!(
                matches!(map(ds::PAUSED, reason, true), InstanceState::Paused { .. }),
                "paused reason {reason}"
            );
            assert!(matches!(
                map(ds::PMSUSPENDED, reason, false),
                InstanceState::Paused { .. }
            ));
        }
        let InstanceState::Paused { reason } = map(ds::PAUSED, 5, false) else {
            panic!("I/O error pause must be Paused");
        };
        assert!(reason.contains("I/O error"), "{reason}");
    }

    #[test]
    fn only_shut_off_and_crashed_are_stopped() {
        for s in 0..10 {
            let stopped = matches!(map(s, 0, true), InstanceState::Stopped { .. });
            assert_eq!(stopped, s == ds::SHUTOFF || s == ds::CRASHED, "state {s}");
        }
        assert_eq!(
            map(ds::CRASHED, 1, false),
            InstanceState::Stopped {
                reason: "crashed: the guest kernel panicked".into()
            }
        );
    }

    #[test]
    fn running_is_running_only_with_an_address() {
        assert_eq!(map(ds::RUNNING, 1, true), InstanceState::Running);
        assert_eq!(map(ds::RUNNING, 1, false), InstanceState::Provisioning);
        assert_eq!(map(ds::BLOCKED, 0, true), InstanceState::Running);
        assert_eq!(map(ds::SHUTDOWN, 1, false), InstanceState::Provisioning);
        assert_eq!(map(ds::NOSTATE, 0, true), InstanceState::Provisioning);
        assert!(wants_address(ds::RUNNING) && !wants_address(ds::PAUSED));
    }
}
