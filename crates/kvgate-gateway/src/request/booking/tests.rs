//! `HeldBooking` against a real fleet core: every way a request ends reaches
//! the ledger once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kvgate_router::{Decision, Outcome, RouteRequest, Router, RouterConfig};

use super::HeldBooking;
use crate::config::settings::HealthRules;
use crate::replicas::fleet_handle::FleetHandle;
use crate::replicas::scrape::EngineScrape;
use kvgate_fleet::Fleet;

fn handle() -> Arc<FleetHandle> {
    let rules = HealthRules {
        unhealthy_after: 3,
        purge_after: Duration::from_secs(10),
        rebuild: Duration::from_secs(2),
        index_bound: 1_000,
    };
    let mut f =
        Fleet::new(vec![Router::new(RouterConfig::default(), Default::default()).unwrap()], rules);
    let id = f.add("a", 0, 16, true, 0).unwrap();
    let scrape =
        EngineScrape { block_size: Some(16), num_gpu_blocks: Some(100), ..EngineScrape::default() };
    f.probe_succeeded(id, Ok(scrape), Instant::now());
    Arc::new(FleetHandle::new(f))
}

fn held(fleet: &Arc<FleetHandle>) -> HeldBooking {
    let req = RouteRequest { prompt_tokens: 64, ..RouteRequest::default() };
    let Decision::Routed(r) = fleet.route(0, &req, Instant::now()) else { panic!("not routed") };
    HeldBooking::new(Arc::clone(fleet), r.booking)
}

/// Every way a request ends reaches the ledger once: a finish, and a
/// guard dropped without one (a cancelled request future) as `dropped`.
#[test]
fn a_held_booking_is_released_once_however_the_request_ends() {
    // (Test code reads the ledger through the lock; the request path never does.)
    let shell = handle();
    let a = held(&shell);
    let b = held(&shell);
    assert_eq!(shell.with(|f| f.router().in_flight()), 2);
    let t = Instant::now();
    assert!(a.first_token(t).is_some(), "the first token is measured");
    assert_eq!(a.first_token(t), None, "once");
    a.finish(Outcome::Finished);
    drop(b);
    let totals = shell.with(|f| f.router().ledger_totals());
    assert_eq!((totals.finished, totals.dropped, totals.late_updates), (1, 1, 0));
    assert_eq!(shell.with(|f| f.router().in_flight()), 0);
}
