//! Progress bars for long transfers: an [`indicatif`] bar fed by the provider's
//! [`Progress`] trait (bytes done/total).
//!
//! Guarantees: bars draw on stderr only when it is a terminal (indicatif hides them
//! otherwise), so piped output and tests see only the summary lines; updates are cheap and
//! never block (indicatif rate-limits redraws).

use egress_provider::Progress;
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};

/// Template of a bar whose total is known.
const KNOWN: &str = "{prefix:>24} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}";
/// Template of a bar whose total is not known (yet).
const UNKNOWN: &str = "{prefix:>24} {spinner} {bytes} {bytes_per_sec} {msg}";

/// One bar, updated through [`Progress`].
#[derive(Debug, Clone)]
pub struct Bar {
    bar: ProgressBar,
}

impl Bar {
    /// A new bar labelled `label` under `multi`.
    pub fn new(multi: &MultiProgress, label: &str) -> Self {
        let bar = multi.add(ProgressBar::no_length());
        if let Ok(style) = ProgressStyle::with_template(UNKNOWN) {
            bar.set_style(style);
        }
        bar.set_prefix(label.to_owned());
        bar.set_message("waiting");
        Self { bar }
    }

    /// Whether any byte was reported (false: the base was already cached).
    pub fn moved(&self) -> bool {
        self.bar.position() > 0
    }

    /// Bytes reported so far.
    pub fn done(&self) -> u64 {
        self.bar.position()
    }

    /// Removes the bar from the display.
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

impl Progress for Bar {
    fn update(&self, done: u64, total: Option<u64>) {
        if let Some(t) = total
            && self.bar.length() != Some(t)
        {
            self.bar.set_length(t);
            if let Ok(style) = ProgressStyle::with_template(KNOWN) {
                self.bar.set_style(style.progress_chars("=> "));
            }
        }
        self.bar.set_position(done);
    }
}
