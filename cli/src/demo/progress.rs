//! The demo's progress display.

use std::io::IsTerminal;
use std::time::Duration;

/// The progress display: an indicatif bar on a terminal, plain lines (on stderr)
/// otherwise, so the summary on stdout stays clean.
pub(super) struct Progress {
    bar: Option<indicatif::ProgressBar>,
}

impl Progress {
    pub(super) fn new(total: u64, json: bool) -> Self {
        let tty = std::io::stderr().is_terminal() && std::io::stdout().is_terminal() && !json;
        if !tty {
            return Progress { bar: None };
        }
        let bar = indicatif::ProgressBar::new(total);
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:32.cyan/blue} {msg}",
        ) {
            bar.set_style(style.progress_chars("█▉▊▋▌▍▎▏ "));
        }
        bar.enable_steady_tick(Duration::from_millis(120));
        Progress { bar: Some(bar) }
    }

    pub(super) fn is_bar(&self) -> bool {
        self.bar.is_some()
    }

    pub(super) fn update(&self, done: u64, line: &str, _elapsed: Duration) {
        if let Some(b) = &self.bar {
            b.set_position(done);
            b.set_message(line.to_string());
        }
    }

    /// A line that stays (above the bar on a terminal).
    pub(super) fn note(&self, line: &str) {
        match &self.bar {
            Some(b) => b.println(line),
            None => eprintln!("{line}"),
        }
    }

    pub(super) fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish();
        }
    }
}
