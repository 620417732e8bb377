//! Progress of long replays: a bar on a terminal, and a plain line every
//! half minute when stderr is a file or a pipe (CI logs, `nohup`), where
//! indicatif draws nothing and a long run would otherwise say nothing until
//! it ends.

use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How often the plain line is written.
const LINE_EVERY: Duration = Duration::from_secs(30);

/// A progress counter of requests replayed.
pub(crate) struct Progress {
    bar: ProgressBar,
    /// `Some` when stderr is not a terminal: when the last line was written.
    lines: Option<Mutex<Instant>>,
    started: Instant,
}

impl Progress {
    /// `len` requests to go (0 when not known yet), described by `what`.
    pub(crate) fn new(len: u64, what: &str) -> Progress {
        let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
        if let Ok(style) = ProgressStyle::with_template(
            "{msg} [{bar:40}] {pos}/{len} requests ({elapsed}, eta {eta})",
        ) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_message(what.to_owned());
        let now = Instant::now();
        let lines = (!std::io::stderr().is_terminal()).then(|| Mutex::new(now));
        Progress { bar, lines, started: now }
    }

    pub(crate) fn inc(&self, k: u64) {
        self.bar.inc(k);
        self.line(false);
    }

    pub(crate) fn inc_length(&self, k: u64) {
        self.bar.inc_length(k);
    }

    pub(crate) fn set_length(&self, len: u64) {
        self.bar.set_length(len);
    }

    pub(crate) fn position(&self) -> u64 {
        self.bar.position()
    }

    pub(crate) fn set_position(&self, pos: u64) {
        self.bar.set_position(pos);
        self.line(false);
    }

    /// Done: the bar goes; the plain form says how long it took.
    pub(crate) fn finish_and_clear(&self) {
        self.bar.finish_and_clear();
        self.line(true);
    }

    fn line(&self, last: bool) {
        let Some(lines) = &self.lines else { return };
        let Ok(mut at) = lines.lock() else { return };
        let now = Instant::now();
        if !last && now.duration_since(*at) < LINE_EVERY {
            return;
        }
        *at = now;
        let len = self.bar.length().unwrap_or(0);
        let pos = self.bar.position();
        let pct = if len > 0 { 100.0 * pos as f64 / len as f64 } else { 0.0 };
        eprintln!(
            "kvgate replay: {}: {pos}/{len} requests ({pct:.0} %), {:.0} s{}",
            self.bar.message(),
            now.duration_since(self.started).as_secs_f64(),
            if last { ", done" } else { "" }
        );
    }
}
