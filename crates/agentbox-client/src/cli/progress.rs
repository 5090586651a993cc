//! Progress on stderr for `cp` and `snapshot --wait`, drawn only when stderr is a terminal:
//! piped or redirected, the output is exactly what scripts parse, with nothing added.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A spinner line with a message and, for transfers, the bytes so far. [`Progress::done`]
/// leaves its final state on the terminal (what was copied); dropped without it (an error
/// path) the line is cleared, so the error line stands alone.
pub(super) struct Progress(ProgressBar);

impl Progress {
    /// Drawn on stderr if it is a terminal, else hidden.
    pub fn on_stderr(message: impl Into<String>, bytes: bool) -> Self {
        Self::new(std::io::stderr().is_terminal(), message, bytes)
    }

    /// A progress line that is drawn only if `visible`; with `bytes`, it counts bytes (see
    /// [`Self::counter`]).
    pub fn new(visible: bool, message: impl Into<String>, bytes: bool) -> Self {
        if !visible {
            return Progress(ProgressBar::hidden());
        }
        let template = if bytes {
            "{spinner} {msg} {bytes} ({bytes_per_sec}, {elapsed})"
        } else {
            "{spinner} {msg} ({elapsed})"
        };
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr())
            .with_message(message.into());
        if let Ok(style) = ProgressStyle::with_template(template) {
            bar.set_style(style);
        }
        bar.enable_steady_tick(Duration::from_millis(120));
        Progress(bar)
    }

    /// Whether anything is drawn.
    pub fn is_visible(&self) -> bool {
        !self.0.is_hidden()
    }

    /// A callback that adds the bytes it is given to the count shown.
    pub fn counter(&self) -> impl Fn(u64) + Send + 'static {
        let bar = self.0.clone();
        move |n| bar.inc(n)
    }

    /// A callback that replaces the message, for a task that outlives this borrow.
    pub fn messenger(&self) -> impl Fn(String) + Send + 'static {
        let bar = self.0.clone();
        move |m| bar.set_message(m)
    }

    /// Ends a task that succeeded: the line is drawn once more with its final count and kept
    /// (a redraw is otherwise at most every tick, so a fast copy could end showing 0 B).
    pub fn done(self) {
        if !self.0.is_hidden() {
            self.0.finish();
        }
    }

    /// The bytes counted so far.
    #[cfg(test)]
    fn position(&self) -> u64 {
        self.0.position()
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        // Finished by `done`: keep the final line.
        if !self.0.is_finished() {
            self.0.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hidden_unless_visible_and_counting_either_way() {
        let hidden = Progress::new(false, "copying", true);
        assert!(!hidden.is_visible());
        let count = hidden.counter();
        count(3);
        count(4);
        assert_eq!(hidden.position(), 7, "a hidden bar still counts");
        // Drawn exactly when stderr is a terminal (under `cargo test` it usually is not).
        assert_eq!(
            Progress::on_stderr("x", false).is_visible(),
            std::io::stderr().is_terminal()
        );
    }
}
