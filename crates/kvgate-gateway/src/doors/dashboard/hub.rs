//! One sampler for every viewer. The first stream to connect starts a task
//! that builds a frame every `dashboard.interval_ms` and publishes it on a
//! watch channel; each viewer's stream forwards what it finds there. The
//! task ends at the first tick after the last viewer left (or on shutdown),
//! so a dashboard nobody watches costs nothing, and ten viewers cost what
//! one does.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::watch;

use super::frame::Frame;
use super::window::{Sample, Window};
use crate::config::settings::DashboardTiming;
use crate::config::DashboardConfig;
use crate::locks::lock;
use crate::observe::decision_json::recent_decisions_json;
use crate::observe::metrics::Metrics;
use crate::replicas::fleet_view::FleetView;

/// The latest frame, as JSON text.
pub(crate) type FrameText = Option<Arc<str>>;

/// What the sampler reads each tick: its settings, the fleet's snapshot and
/// decisions, the metrics' token totals and recent TTFTs, and whether
/// kvgate is shutting down.
#[derive(Debug)]
pub(crate) struct Sampler {
    pub(crate) config: DashboardConfig,
    /// `config`'s durations (`settings.rs`).
    pub(crate) timing: DashboardTiming,
    pub(crate) view: Arc<FleetView>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) closing: watch::Receiver<bool>,
}

/// The sampler's channel and whether the sampler runs.
#[derive(Debug)]
pub(crate) struct Hub {
    frames: watch::Sender<FrameText>,
    /// Guards starting and stopping the sampler, so that a viewer arriving
    /// while it decides to stop either keeps it running or starts a new one.
    sampling: Mutex<bool>,
}

impl Hub {
    pub(crate) fn new() -> Hub {
        Hub { frames: watch::Sender::new(None), sampling: Mutex::new(false) }
    }

    /// A receiver for the frames to come; starts the sampler if none runs.
    pub(crate) fn subscribe(
        self: &Arc<Self>,
        sampler: &Arc<Sampler>,
    ) -> watch::Receiver<FrameText> {
        let mut sampling = lock(&self.sampling);
        // It waits for the next frame: one left from earlier viewers is stale.
        let rx = self.frames.subscribe();
        if !*sampling {
            *sampling = true;
            tokio::spawn(sample(Arc::clone(self), Arc::clone(sampler)));
        }
        rx
    }
}

async fn sample(hub: Arc<Hub>, s: Arc<Sampler>) {
    let c = &s.config;
    let window_span = s.timing.window;
    let mut window = Window::new(window_span);
    let mut tick = tokio::time::interval(s.timing.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut seq = 0u64;
    loop {
        tick.tick().await;
        {
            let mut sampling = lock(&hub.sampling);
            if hub.frames.receiver_count() == 0 || *s.closing.borrow() {
                *sampling = false;
                return;
            }
        }
        let now = Instant::now();
        let snap = s.view.snapshot(now);
        let by_route = s.metrics.requests_by_route();
        window.push(Sample::of(&snap, s.metrics.prompt_token_totals(), by_route, now));
        let ttft = s.metrics.recent_ttft().summary(window_span, now);
        let recent = recent_decisions_json(&s.view, c.decisions, now);
        seq += 1;
        let frame = Frame::build(seq, c.interval_ms, snap, window.rates(), ttft, recent);
        match serde_json::to_string(&frame) {
            Ok(text) => {
                hub.frames.send_replace(Some(Arc::from(text)));
            }
            // Cannot happen for these types (no maps with non-string keys);
            // should it, viewers keep the previous frame.
            Err(e) => tracing::warn!(error = %e, "dashboard frame not serialisable"),
        }
    }
}
