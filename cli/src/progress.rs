//! The live progress of a batch, as `agentq demo` and `agentq submit --wait` draw it: an
//! indicatif bar with a status line on a terminal; plain, timestamped lines on stderr now
//! and then otherwise (a log or a pipe gets no escape codes), so what goes to stdout stays
//! clean either way.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

/// The progress display (see the module docs).
pub(crate) struct Progress {
    bar: Option<indicatif::ProgressBar>,
    /// Without a bar: how often a plain line is printed, and when the last one was.
    plain_every: Duration,
    last_plain: std::sync::Mutex<Option<Instant>>,
}

impl Progress {
    /// A bar when stderr is a terminal and `bar` allows one; plain lines every
    /// `plain_every` otherwise.
    pub(crate) fn new(total: u64, bar: bool, plain_every: Duration) -> Self {
        let tty = bar && std::io::stderr().is_terminal();
        let bar = tty.then(|| {
            let bar = indicatif::ProgressBar::new(total);
            if let Ok(style) = indicatif::ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:32.cyan/blue} {msg}",
            ) {
                bar.set_style(style.progress_chars("█▉▊▋▌▍▎▏ "));
            }
            bar.enable_steady_tick(Duration::from_millis(120));
            bar
        });
        Progress {
            bar,
            plain_every,
            last_plain: std::sync::Mutex::new(None),
        }
    }

    /// Where things stand: `done` of the total, described by `line`. Without a bar a
    /// plain line is printed at most every `plain_every` (the first at once).
    pub(crate) fn update(&self, done: u64, line: &str, elapsed: Duration) {
        if let Some(b) = &self.bar {
            b.set_position(done);
            b.set_message(line.to_string());
            return;
        }
        let Ok(mut last) = self.last_plain.lock() else {
            return;
        };
        if last.is_some_and(|t| t.elapsed() < self.plain_every) {
            return;
        }
        *last = Some(Instant::now());
        eprintln!("[{:5.1}s] {line}", elapsed.as_secs_f64());
    }

    /// A line that stays (above the bar on a terminal).
    pub(crate) fn note(&self, line: &str) {
        match &self.bar {
            Some(b) => b.println(line),
            None => eprintln!("{line}"),
        }
    }

    pub(crate) fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish();
        }
    }
}
