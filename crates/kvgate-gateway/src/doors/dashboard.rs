//! `/dashboard`: a live page of the fleet's KV caches and kvgate's
//! decisions, served with the admin API (on the admin listener when there
//! is one) and behind the admin key.
//!
//! - `GET /dashboard` — the page; without credentials, a login form (401).
//! - `GET /dashboard/stream` — server-sent events, one JSON frame per
//!   `dashboard.interval_ms` (see `frame.rs` for its fields).
//! - `POST /dashboard/login` — the admin key as a header in, a cookie out.
//! - `POST /dashboard/logout` — clears the cookie.
//! - `GET /dashboard/assets/{file}` — the page's script and style sheet:
//!   public, since they are in every copy of the binary and hold no data.
//!
//! The page, its script and its charts (hand-drawn SVG) are embedded in the
//! binary: no CDN, so the page works on machines without internet access.
//! The cookie proves a login (see `session.rs`); it opens the page and the
//! stream, never `/admin/*`, so a forged cross-site request carrying it
//! cannot change the fleet.

mod frame;
mod hub;
mod session;
mod window;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::SystemTime;

use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use futures_util::Stream;
use kvgate_openai::ErrorResponse;

use tokio::sync::watch;

use crate::config::settings::DashboardTiming;
use crate::config::DashboardConfig;
use crate::doors::auth;
use crate::doors::throttle::{self, ClientAddr, KeyKind, KeyThrottle, KeyVerdict};
use crate::observe::metrics::Metrics;
use crate::replicas::fleet_view::FleetView;
use crate::request::request_error::Reason;
use crate::request::response::error_response;
use hub::{FrameText, Hub, Sampler};
use session::{Sessions, COOKIE};

/// What the dashboard needs from the gateway (the wiring builds it).
#[derive(Debug)]
pub(crate) struct DashboardContext {
    pub(crate) config: DashboardConfig,
    /// `config`'s durations (`settings.rs`).
    pub(crate) timing: DashboardTiming,
    /// `auth.admin_key`: as a header it opens the dashboard, and a login
    /// trades it for a cookie.
    pub(crate) admin_key: Option<String>,
    /// Wrong admin keys count here, as on the admin API.
    pub(crate) throttle: Arc<KeyThrottle>,
    pub(crate) metrics: Arc<Metrics>,
    /// What each frame shows.
    pub(crate) view: Arc<FleetView>,
    /// Set on shutdown: streams end.
    pub(crate) closing: watch::Receiver<bool>,
}

/// What the dashboard's handlers share.
#[derive(Debug)]
struct Dashboard {
    admin_key: Option<String>,
    throttle: Arc<KeyThrottle>,
    metrics: Arc<Metrics>,
    closing: watch::Receiver<bool>,
    sampler: Arc<Sampler>,
    hub: Arc<Hub>,
    sessions: Sessions,
}

type D = State<Arc<Dashboard>>;

const INDEX_HTML: &str = include_str!("../../assets/dashboard/index.html");
const LOGIN_HTML: &str = include_str!("../../assets/dashboard/login.html");

/// The embedded files under `/dashboard/assets/`, with their content types.
const ASSETS: [(&str, &str, &str); 4] = [
    ("app.js", "text/javascript; charset=utf-8", include_str!("../../assets/dashboard/app.js")),
    ("chart.js", "text/javascript; charset=utf-8", include_str!("../../assets/dashboard/chart.js")),
    ("login.js", "text/javascript; charset=utf-8", include_str!("../../assets/dashboard/login.js")),
    ("style.css", "text/css; charset=utf-8", include_str!("../../assets/dashboard/style.css")),
];

/// Only our own scripts, styles and stream: no inline script, no framing.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                   img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// The dashboard's routes, for the admin router. Empty when
/// `dashboard.enabled` is off.
pub(crate) fn routes(ctx: DashboardContext) -> Router {
    let DashboardContext { config, timing, admin_key, throttle, metrics, view, closing } = ctx;
    if !config.enabled {
        return Router::new();
    }
    let sessions = Sessions::new(timing.session);
    let sampler = Arc::new(Sampler {
        config,
        timing,
        view,
        metrics: Arc::clone(&metrics),
        closing: closing.clone(),
    });
    let dash = Arc::new(Dashboard {
        admin_key,
        throttle,
        metrics,
        closing,
        sampler,
        hub: Arc::new(Hub::new()),
        sessions,
    });
    let guarded = Router::new()
        .route("/dashboard", get(page))
        .route("/dashboard/stream", get(stream))
        .layer(middleware::from_fn_with_state(Arc::clone(&dash), require_login));
    Router::new()
        .merge(guarded)
        .route("/dashboard/login", post(login))
        .route("/dashboard/logout", post(logout))
        .route("/dashboard/assets/{file}", get(asset))
        .with_state(dash)
}

impl Dashboard {
    /// The admin key as a header, or a valid login cookie. Open when no
    /// admin key is configured, like the rest of the admin API.
    fn allowed(&self, headers: &HeaderMap) -> bool {
        auth::admin_allowed(self.admin_key.as_ref(), headers)
            || auth::cookie(headers, COOKIE)
                .is_some_and(|t| self.sessions.valid(t, SystemTime::now()))
    }

    /// An admin-key check through the wrong-key throttle.
    fn key_verdict(&self, addr: Option<&ClientAddr>, presented: bool, ok: bool) -> KeyVerdict {
        throttle::verdict(&self.throttle, &self.metrics, addr, KeyKind::Admin, presented, ok)
    }
}

/// Headers every dashboard response carries: no caching (frames and the
/// page are per-login), no framing, no sniffing, no referrer.
fn harden(mut r: Response) -> Response {
    let h = r.headers_mut();
    for (name, value) in [
        (header::CACHE_CONTROL, "no-store"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::CONTENT_SECURITY_POLICY, CSP),
    ] {
        h.insert(name, HeaderValue::from_static(value));
    }
    r
}

fn html(status: StatusCode, body: &'static str) -> Response {
    harden((status, [(header::CONTENT_TYPE, "text/html; charset=utf-8")], body).into_response())
}

async fn require_login(State(d): D, req: Request, next: Next) -> Response {
    let ok = d.allowed(req.headers());
    let presented = auth::admin_key_presented(req.headers());
    match d.key_verdict(req.extensions().get(), presented, ok) {
        KeyVerdict::Allowed => return harden(next.run(req).await),
        KeyVerdict::Throttled(r) => return harden(r),
        KeyVerdict::Denied => {}
    }
    d.metrics.count(Reason::Unauthorized);
    if req.uri().path() == "/dashboard" {
        // The page without data: a form that logs in and reloads.
        html(StatusCode::UNAUTHORIZED, LOGIN_HTML)
    } else {
        harden(error_response(&ErrorResponse::authentication("invalid or missing admin key")))
    }
}

async fn page() -> Response {
    html(StatusCode::OK, INDEX_HTML)
}

/// The `Set-Cookie` value: HttpOnly (scripts cannot read it),
/// SameSite=Strict (other sites' requests do not carry it), scoped to the
/// dashboard's paths.
fn set_cookie(value: &str, max_age_s: u64) -> Option<HeaderValue> {
    let c = format!(
        "{COOKIE}={value}; Path=/dashboard; Max-Age={max_age_s}; HttpOnly; SameSite=Strict"
    );
    HeaderValue::from_str(&c).ok()
}

async fn login(State(d): D, req: Request) -> Response {
    if d.admin_key.is_none() {
        // Nothing to log in to: the admin API is open (on loopback).
        return StatusCode::NO_CONTENT.into_response();
    }
    let headers = req.headers();
    let ok = auth::admin_allowed(d.admin_key.as_ref(), headers);
    let presented = auth::admin_key_presented(headers);
    match d.key_verdict(req.extensions().get(), presented, ok) {
        KeyVerdict::Allowed => {}
        KeyVerdict::Throttled(r) => return harden(r),
        KeyVerdict::Denied => {
            d.metrics.count(Reason::Unauthorized);
            return harden(error_response(&ErrorResponse::authentication("wrong admin key")));
        }
    }
    let lifetime = d.sessions.lifetime().as_secs();
    match d.sessions.mint(SystemTime::now()).and_then(|t| set_cookie(&t, lifetime)) {
        Some(cookie) => {
            harden((StatusCode::NO_CONTENT, [(header::SET_COOKIE, cookie)]).into_response())
        }
        None => harden(error_response(&ErrorResponse::with_status(
            503,
            "cookie login is unavailable; send the admin key as a header",
        ))),
    }
}

async fn logout() -> Response {
    let mut r = StatusCode::NO_CONTENT.into_response();
    if let Some(c) = set_cookie("", 0) {
        r.headers_mut().insert(header::SET_COOKIE, c);
    }
    harden(r)
}

async fn asset(Path(file): Path<String>) -> Response {
    match ASSETS.iter().find(|(name, _, _)| *name == file) {
        Some((_, content_type, body)) => {
            let r = ([(header::CONTENT_TYPE, *content_type)], *body).into_response();
            harden(r)
        }
        None => error_response(&ErrorResponse::not_found("no such dashboard asset")),
    }
}

/// Frames from `rx` until the sampler's channel closes or kvgate shuts down.
fn frames(
    rx: tokio::sync::watch::Receiver<FrameText>,
    closing: tokio::sync::watch::Receiver<bool>,
) -> impl Stream<Item = Result<Event, Infallible>> {
    futures_util::stream::unfold((rx, closing), |(mut rx, mut closing)| async move {
        loop {
            tokio::select! {
                changed = rx.changed() => changed.ok()?,
                _ = closing.wait_for(|c| *c) => return None,
            }
            let text = rx.borrow_and_update().clone();
            if let Some(text) = text {
                let event = Event::default().event("frame").data(&*text);
                return Some((Ok(event), (rx, closing)));
            }
        }
    })
}

async fn stream(State(d): D) -> Response {
    let rx = d.hub.subscribe(&d.sampler);
    let closing = d.closing.clone();
    Sse::new(frames(rx, closing)).keep_alive(KeepAlive::default()).into_response()
}
