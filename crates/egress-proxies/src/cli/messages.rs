//! Error text as a one-shot command shows it: the provider's messages carry labels meant for
//! the controller and the logs of a long-running operator (the error class, `Transient:`,
//! and what the operator will do next, "the connection will be redialed"), which mean nothing
//! to someone who ran a command once. [`plain`] removes them and keeps the cause.
//!
//! [`plain_report`] does the same for a report that quotes such messages after its own words
//! (`gc`'s "kept (listing instances failed ...: Transient: ...)").
//!
//! Guarantees: only a class label (leading, or in a report right after `": "`) and the known
//! operator-only remarks are removed; the rest of the message (what failed, on which host,
//! why, what to fix) is kept as it is.

/// Leading labels of a provider error's `Display` (`{class}: {message}`).
const CLASS_LABELS: [&str; 4] = [
    "Transient: ",
    "Permanent: ",
    "NotFound: ",
    "QuotaExceeded: ",
];

/// Remarks about what the running operator does next; a one-shot command does not do them.
const OPERATOR_REMARKS: [&str; 1] = [" (the connection will be redialed)"];

/// `msg` without a leading error-class label and without operator-only remarks.
pub(crate) fn plain(msg: &str) -> String {
    let mut s = msg;
    for l in CLASS_LABELS {
        if let Some(rest) = s.strip_prefix(l) {
            s = rest;
            break;
        }
    }
    let mut out = s.to_owned();
    for r in OPERATOR_REMARKS {
        out = out.replace(r, "");
    }
    out
}

/// `report` with every quoted provider message made [`plain`]: a class label right after
/// `": "` and the operator-only remarks removed wherever they are.
pub(crate) fn plain_report(report: &str) -> String {
    let mut out = report.to_owned();
    for l in CLASS_LABELS {
        out = out.replace(&format!(": {l}"), ": ");
    }
    for r in OPERATOR_REMARKS {
        out = out.replace(r, "");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn class_labels_and_operator_remarks_are_removed_and_the_cause_kept() {
        assert_eq!(
            plain("Transient: connecting to host h1: refused (the connection will be redialed)"),
            "connecting to host h1: refused"
        );
        assert_eq!(plain("Permanent: bad key"), "bad key");
        assert_eq!(plain("no label: Transient: x"), "no label: Transient: x");
    }

    #[test]
    fn a_report_quoting_provider_messages_loses_their_labels_and_keeps_its_own_words() {
        assert_eq!(
            plain_report(
                "e * * entry: kept (listing failed: Transient: connecting to h1: refused \
                 (the connection will be redialed))\nTransient text stays"
            ),
            "e * * entry: kept (listing failed: connecting to h1: refused)\nTransient text stays"
        );
    }
}
