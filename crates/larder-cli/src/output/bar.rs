//! The progress bar of `backup`, `restore` and `check`.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use larder_engine::{Progress, Warning};

use super::Output;

/// A progress bar on stderr when it is a terminal and text is shown; silent otherwise.
/// Warnings are printed above it, as [`Output::path_warning`] prints them.
pub struct Bar {
    bar: ProgressBar,
    out: Output,
}

impl Bar {
    pub fn bytes(out: &Output) -> Self {
        let bar = if out.shows_progress() && std::io::stderr().is_terminal() {
            let b = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
            b.set_style(
                ProgressStyle::with_template(
                    "{bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            b
        } else {
            ProgressBar::hidden()
        };
        Self { bar, out: *out }
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

impl Progress for Bar {
    fn set_total(&self, bytes: u64) {
        self.bar.set_length(bytes);
    }

    fn advance(&self, bytes: u64) {
        self.bar.inc(bytes);
    }

    fn warn(&self, w: &Warning) {
        self.bar.suspend(|| self.out.path_warning(w));
    }
}
