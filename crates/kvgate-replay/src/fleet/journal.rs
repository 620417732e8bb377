//! The fleet's journal: what the event loop handed the fleet core, in
//! order, when asked to keep it ([`Fleet::keep_journal`]). It lets another
//! shell over the same core (the gateway's request path, in its tests)
//! take the same inputs at the same instants and be held to the same
//! decisions and bookings.

use std::time::Duration;

use kvgate_events::Batch;
use kvgate_fleet::EngineScrape;

use super::Fleet;

/// One input the loop handed the fleet core, at virtual time `at`.
#[derive(Clone, Debug)]
pub enum CoreInput {
    /// The core's upkeep ran (`kvgate_fleet::Fleet::tick`).
    Tick { at: Duration },
    /// Replica `replica` (position in the fleet) was scraped.
    Scrape { at: Duration, replica: usize, scrape: EngineScrape },
    /// A step's KV events from replica `replica` reached the core.
    Events { at: Duration, replica: usize, batch: Batch },
    /// Workload request `request` arrived and was routed (or refused).
    Arrival { at: Duration, request: usize },
    /// Its first token reached the router.
    FirstToken { at: Duration, request: usize },
    /// Its last token did: it finished.
    Finished { at: Duration, request: usize },
}

impl CoreInput {
    /// When it happened, in virtual time.
    pub fn at(&self) -> Duration {
        match *self {
            CoreInput::Tick { at }
            | CoreInput::Scrape { at, .. }
            | CoreInput::Events { at, .. }
            | CoreInput::Arrival { at, .. }
            | CoreInput::FirstToken { at, .. }
            | CoreInput::Finished { at, .. } => at,
        }
    }
}

impl Fleet {
    /// Keeps the journal from now on (off by default: it copies every
    /// event batch).
    pub fn keep_journal(&mut self) {
        self.journal.get_or_insert_with(Vec::new);
    }

    /// The inputs so far, oldest first; empty unless kept.
    pub fn journal(&self) -> &[CoreInput] {
        self.journal.as_deref().unwrap_or_default()
    }

    /// Records `input` when the journal is kept.
    pub(super) fn note(&mut self, input: impl FnOnce() -> CoreInput) {
        if let Some(j) = &mut self.journal {
            j.push(input());
        }
    }
}
