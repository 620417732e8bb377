//! kvgate's own `/metrics`: request-path counters and histograms recorded as
//! requests flow, plus the fleet snapshot encoded at scrape time.
//!
//! Everything goes through `prometheus-client`'s OpenMetrics text encoder. The
//! request-path metrics live in a long-lived [`Registry`]; the snapshot-derived
//! series (absolute counters and gauges kept elsewhere: index, ledger, event
//! feeds, engine reports) are written by a [`Collector`] with
//! [`ConstCounter`]/[`ConstGauge`], registered in a throw-away registry for
//! each scrape so that the exposition always reflects the snapshot passed to
//! [`Metrics::render`].
//!
//! Naming: counters are registered under their base name and the encoder
//! appends `_total` (0.26 `debug_assert!`s that a counter name does not already
//! end in `_total`); metrics with a unit are registered with [`Unit::Seconds`],
//! which appends `_seconds` and adds a `# UNIT` line. All names get the
//! `kvgate_` prefix from the registry.

use std::fmt;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeCounterValue, EncodeGaugeValue, EncodeLabelSet, EncodeMetric,
};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

use kvgate_tenants::RejectReason;

use crate::observe::snapshot::{FleetSnapshot, ReplicaSnapshot, TenantSnapshot};
use crate::observe::ttft_ring::RecentTtft;
use crate::request::request_error::{Family as ReasonFamily, Reason};
use crate::request::route::Route;

/// The `Content-Type` of what [`Metrics::render`] produces: the OpenMetrics
/// text format 1.0.0 written by `prometheus_client::encoding::text`. (The crate
/// only exports a constant for its *Prometheus* 0.0.4 text encoder, so this
/// one is spelled out here.)
pub(crate) const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Prefix of every metric name.
const PREFIX: &str = "kvgate";

/// The empty label set (`NoLabelSet` is an uninhabited enum in 0.26).
const NO_LABELS: [(&str, &str); 0] = [];

/// Index / capacity tiers, in the order of the snapshot arrays.
const TIERS: [&str; 3] = ["gpu", "cpu", "storage"];
/// Replica health states.
const HEALTH_STATES: [&str; 3] = ["healthy", "degraded", "down"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    route: &'static str,
    status: u16,
    replica: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    route: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TaskLabels {
    task: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PlanLabels {
    plan: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TenantLabels {
    pool: String,
    tenant: String,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// Time to first token: 5 ms to 2 min.
fn ttft_histogram() -> Histogram {
    Histogram::new([
        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
    ])
}

/// Whole request: 10 ms to 10 min.
fn e2e_histogram() -> Histogram {
    Histogram::new([
        0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
    ])
}

/// Tokenization: 10 µs to 1 s.
fn tokenize_histogram() -> Histogram {
    Histogram::new([
        1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25,
        0.5, 1.0,
    ])
}

/// Routing decision: 1 µs to 10 ms.
fn decide_histogram() -> Histogram {
    Histogram::new([
        1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01,
    ])
}

/// A wait in the tenant queue: 1 ms to 10 min (a band's TTL).
fn queue_wait_histogram() -> Histogram {
    Histogram::new([
        0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
        300.0, 600.0,
    ])
}

/// The endpoint picker's pick: 50 µs to 10 s.
fn pick_histogram() -> Histogram {
    Histogram::new([
        5e-5, 1e-4, 1.5e-4, 2e-4, 3e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5,
        1.0, 2.5, 10.0,
    ])
}

/// A peer's batch from its flush to its arrival: 100 µs to 2.5 s.
fn peer_lag_histogram() -> Histogram {
    Histogram::new([
        1e-4, 2.5e-4, 5e-4, 1e-3, 2e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    ])
}

/// Durations that can go into a histogram: finite, not negative. A NaN would
/// poison the sum for the life of the process.
fn duration(seconds: f64) -> Option<f64> {
    if seconds.is_finite() {
        Some(seconds.max(0.0))
    } else {
        None
    }
}

/// kvgate's metrics. Recording is cheap: atomics, plus the family maps'
/// read locks (a write lock only the first time a label set is seen).
#[derive(Debug)]
pub(crate) struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    ttft: HistogramFamily<RouteLabels>,
    e2e: HistogramFamily<RouteLabels>,
    tokenize: Histogram,
    decide: Histogram,
    epp_pick: Histogram,
    peer_batch_lag: Histogram,
    prompt_tokens: Counter,
    predicted_cached_tokens: Counter,
    unmatched: Family<ReasonLabels, Counter>,
    retries: Family<ReasonLabels, Counter>,
    stream_errors: Family<ReasonLabels, Counter>,
    rejected: Family<ReasonLabels, Counter>,
    task_restarts: Family<TaskLabels, Counter>,
    /// Disaggregated pools' plans (`pd_forward.rs`), by outcome.
    disagg_plans: Family<PlanLabels, Counter>,
    /// Time dispatched requests waited in a tenant queue, per tenant.
    tenant_wait: HistogramFamily<TenantLabels>,
    open_connections: Gauge,
    connections_refused: Counter,
    /// The last TTFTs with their times, for the dashboard's percentiles.
    recent_ttft: RecentTtft,
    /// `kvgate_requests_total` summed per route, for the dashboard.
    by_route: [std::sync::atomic::AtomicU64; Route::COUNT],
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub(crate) fn new() -> Metrics {
        let requests = Family::<RequestLabels, Counter>::default();
        let ttft = HistogramFamily::new_with_constructor(ttft_histogram as fn() -> Histogram);
        let e2e = HistogramFamily::new_with_constructor(e2e_histogram as fn() -> Histogram);
        let tokenize = tokenize_histogram();
        let decide = decide_histogram();
        let epp_pick = pick_histogram();
        let peer_batch_lag = peer_lag_histogram();
        let prompt_tokens = Counter::default();
        let predicted_cached_tokens = Counter::default();
        let unmatched = Family::<ReasonLabels, Counter>::default();
        let retries = Family::<ReasonLabels, Counter>::default();
        let stream_errors = Family::<ReasonLabels, Counter>::default();
        let rejected = Family::<ReasonLabels, Counter>::default();
        let task_restarts = Family::<TaskLabels, Counter>::default();
        let disagg_plans = Family::<PlanLabels, Counter>::default();
        let tenant_wait =
            HistogramFamily::new_with_constructor(queue_wait_histogram as fn() -> Histogram);
        for task in ["feed", "monitor"] {
            drop(task_restarts.get_or_create(&TaskLabels { task }));
        }
        let open_connections = Gauge::default();
        let connections_refused = Counter::default();
        // Known reasons are exported from the start (as 0), so that `rate()`
        // and alerts see the series before the first occurrence. (An empty
        // family is left out of the exposition altogether.)
        for reason in Reason::ALL {
            let family = match reason.family() {
                ReasonFamily::Retry => &retries,
                ReasonFamily::StreamError => &stream_errors,
                ReasonFamily::Rejected => &rejected,
            };
            drop(family.get_or_create(&ReasonLabels { reason: reason.label() }));
        }

        let mut registry = Registry::with_prefix(PREFIX);
        registry.register(
            "open_connections",
            "Client connections open on kvgate's listeners",
            open_connections.clone(),
        );
        registry.register(
            "connections_refused",
            "Client connections closed at once because limits.max_connections were open",
            connections_refused.clone(),
        );
        registry.register(
            "requests",
            "Requests answered, by route, HTTP status and replica (empty when none)",
            requests.clone(),
        );
        registry.register_with_unit(
            "time_to_first_token",
            "Time to first token as observed by the gateway",
            Unit::Seconds,
            ttft.clone(),
        );
        registry.register_with_unit(
            "request_duration",
            "Request duration, end to end, as observed by the gateway",
            Unit::Seconds,
            e2e.clone(),
        );
        registry.register_with_unit(
            "tokenize",
            "Time spent tokenizing a prompt",
            Unit::Seconds,
            tokenize.clone(),
        );
        registry.register_with_unit(
            "decide",
            "Time spent deciding where to route a request",
            Unit::Seconds,
            decide.clone(),
        );
        registry.register_with_unit(
            "epp_pick",
            "Endpoint picker: from the ext_proc stream opening to the headers response naming \
             the endpoint (the whole body read, prepared and placed)",
            Unit::Seconds,
            epp_pick.clone(),
        );
        registry.register_with_unit(
            "peer_batch_lag",
            "Peers' batches from their flush to their arrival here (wall clocks; over the \
             HTTP mesh or NATS)",
            Unit::Seconds,
            peer_batch_lag.clone(),
        );
        registry.register(
            "disagg_plans",
            "Requests of disaggregated pools, by plan: split (prefill hop, then decode hop), \
             bypass (served whole on a decode replica), on_prefill (served whole on a \
             prefill replica), prefill_fallback (every prefill \
             attempt failed: served whole), decode_fallback (the decode hop failed before \
             its first byte: served whole elsewhere)",
            disagg_plans.clone(),
        );
        registry.register_with_unit(
            "tenant_queue_wait",
            "Time requests waited in their pool's tenant queue before dispatch, per tenant",
            Unit::Seconds,
            tenant_wait.clone(),
        );
        registry.register(
            "prompt_tokens",
            "Prompt tokens of routed requests",
            prompt_tokens.clone(),
        );
        registry.register(
            "predicted_cached_tokens",
            "Prompt tokens predicted to be cached on the chosen replica \
             (predicted hit rate = this / kvgate_prompt_tokens_total)",
            predicted_cached_tokens.clone(),
        );
        registry.register(
            "unmatched_requests",
            "Requests routed by load alone, with no reuse claimed, because kvgate cannot \
             key their blocks as the engine does: content it does not render (images, \
             audio) or prompt embeddings",
            unmatched.clone(),
        );
        registry.register(
            "retries",
            "Requests retried on another replica, by reason",
            retries.clone(),
        );
        registry.register(
            "stream_errors",
            "Response streams that ended early, by reason",
            stream_errors.clone(),
        );
        registry.register("rejected", "Requests refused, by reason", rejected.clone());
        registry.register(
            "replica_task_restarts",
            "Replica background tasks (event feed, monitor) that ended unexpectedly and were restarted",
            task_restarts.clone(),
        );

        Metrics {
            registry,
            requests,
            ttft,
            e2e,
            tokenize,
            decide,
            epp_pick,
            peer_batch_lag,
            prompt_tokens,
            predicted_cached_tokens,
            unmatched,
            retries,
            stream_errors,
            rejected,
            task_restarts,
            disagg_plans,
            tenant_wait,
            open_connections,
            connections_refused,
            recent_ttft: RecentTtft::default(),
            by_route: Default::default(),
        }
    }

    /// The connection gauge and refusal counter, for the accept loops
    /// (handles share the registered series).
    pub(crate) fn connection_metrics(&self) -> (Gauge, Counter) {
        (self.open_connections.clone(), self.connections_refused.clone())
    }

    /// A request answered on `route` with `status`, served by `replica` (""
    /// when none was chosen).
    pub(crate) fn request(&self, route: &'static str, status: u16, replica: &str) {
        let labels = RequestLabels { route, status, replica: replica.to_owned() };
        self.requests.get_or_create(&labels).inc();
        if let Some(r) = Route::ALL.iter().find(|r| r.label() == route) {
            self.by_route[r.index()].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Requests answered per generation route (`Route::ALL` order) since
    /// start: the dashboard's requests/s by API.
    pub(crate) fn requests_by_route(&self) -> [u64; Route::COUNT] {
        self.by_route.each_ref().map(|c| c.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Time to first token on `route`, seconds.
    pub(crate) fn ttft(&self, route: &'static str, seconds: f64) {
        if let Some(s) = duration(seconds) {
            self.ttft.get_or_create(&RouteLabels { route }).observe(s);
            self.recent_ttft.record(s, std::time::Instant::now());
        }
    }

    /// The recent TTFTs (the dashboard's p50/p90).
    pub(crate) fn recent_ttft(&self) -> &RecentTtft {
        &self.recent_ttft
    }

    /// Routed prompt tokens and those predicted cached, since start (the
    /// dashboard's predicted hit rate).
    pub(crate) fn prompt_token_totals(&self) -> (u64, u64) {
        (self.prompt_tokens.get(), self.predicted_cached_tokens.get())
    }

    /// Whole-request duration on `route`, seconds.
    pub(crate) fn e2e(&self, route: &'static str, seconds: f64) {
        if let Some(s) = duration(seconds) {
            self.e2e.get_or_create(&RouteLabels { route }).observe(s);
        }
    }

    /// Time spent tokenizing, seconds.
    pub(crate) fn tokenize_time(&self, seconds: f64) {
        if let Some(s) = duration(seconds) {
            self.tokenize.observe(s);
        }
    }

    /// Time spent deciding, seconds.
    pub(crate) fn decide_time(&self, seconds: f64) {
        if let Some(s) = duration(seconds) {
            self.decide.observe(s);
        }
    }

    /// The endpoint picker's pick took `seconds` from the stream opening.
    pub(crate) fn epp_pick(&self, seconds: f64) {
        if let Some(s) = duration(seconds) {
            self.epp_pick.observe(s);
        }
    }

    /// A peer's batch arrived `seconds` after its flush.
    pub(crate) fn peer_batch_lag(&self, seconds: f64) {
        if let Some(s) = duration(seconds) {
            self.peer_batch_lag.observe(s);
        }
    }

    /// A routed prompt of `total` tokens, `predicted_cached` of them predicted
    /// to hit the chosen replica's prefix cache.
    pub(crate) fn prompt_tokens(&self, total: u64, predicted_cached: u64) {
        self.prompt_tokens.inc_by(total);
        self.predicted_cached_tokens.inc_by(predicted_cached);
    }

    /// A request kvgate cannot key: `"unrendered_content"`,
    /// `"prompt_embeds"`, or `"previous_response"` (a Responses API turn
    /// whose history only its replica holds).
    pub(crate) fn unmatched(&self, reason: &'static str) {
        self.unmatched.get_or_create(&ReasonLabels { reason }).inc();
    }

    /// One refusal, retry or broken stream, in its family's counter
    /// (`kvgate_rejected_total`, `kvgate_retries_total`,
    /// `kvgate_stream_errors_total`), labelled by its reason.
    pub(crate) fn count(&self, reason: Reason) {
        let family = match reason.family() {
            ReasonFamily::Retry => &self.retries,
            ReasonFamily::StreamError => &self.stream_errors,
            ReasonFamily::Rejected => &self.rejected,
        };
        family.get_or_create(&ReasonLabels { reason: reason.label() }).inc();
    }

    /// One disaggregated pool's plan: `split`, `bypass`, `on_prefill`,
    /// `prefill_fallback` or `decode_fallback`.
    pub(crate) fn disagg_plan(&self, plan: &'static str) {
        self.disagg_plans.get_or_create(&PlanLabels { plan }).inc();
    }

    /// A request of `tenant` left `pool`'s tenant queue for an engine after
    /// waiting `seconds`.
    pub(crate) fn tenant_wait(&self, pool: &str, tenant: &str, seconds: f64) {
        let Some(seconds) = duration(seconds) else { return };
        let labels = TenantLabels { pool: pool.to_owned(), tenant: tenant.to_owned() };
        self.tenant_wait.get_or_create(&labels).observe(seconds);
    }

    pub(crate) fn task_restarted(&self, task: &'static str) {
        self.task_restarts.get_or_create(&TaskLabels { task }).inc();
    }

    /// The OpenMetrics text exposition ([`CONTENT_TYPE`]): the recorded
    /// metrics, then the series derived from `snap`, then `# EOF`.
    pub(crate) fn render(&self, snap: &FleetSnapshot) -> String {
        let mut scrape = Registry::with_prefix(PREFIX);
        scrape.register_collector(Box::new(SnapshotCollector(snap.clone())));
        let mut out = String::with_capacity(16 * 1024);
        let encoded = encode_registry(&mut out, &self.registry)
            .and_then(|()| encode_registry(&mut out, &scrape));
        if encoded.is_err() {
            // Writing to a `String` cannot fail, nor can anything the
            // collector encodes; should it happen, a valid empty exposition
            // beats a truncated one.
            out.clear();
        }
        // Cannot fail either: it writes a constant to a `String`.
        let _ = encode_eof(&mut out);
        out
    }
}

/// Encodes a [`FleetSnapshot`] at scrape time.
#[derive(Debug)]
struct SnapshotCollector(FleetSnapshot);

/// One metric family: a descriptor and its series; nothing when there are no
/// series.
fn family<L, M>(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    metric_type: MetricType,
    series: impl IntoIterator<Item = (L, M)>,
) -> fmt::Result
where
    L: EncodeLabelSet,
    M: EncodeMetric,
{
    let mut series = series.into_iter().peekable();
    if series.peek().is_none() {
        return Ok(());
    }
    // The registry ends the help of what is registered with it with a period;
    // so does this, for one style throughout.
    let help = format!("{help}.");
    let mut metric = enc.encode_descriptor(name, &help, unit, metric_type)?;
    for (labels, m) in series {
        m.encode(metric.encode_family(&labels)?)?;
    }
    Ok(())
}

/// A counter family; the encoder appends `_total` to `name`.
fn counters<L: EncodeLabelSet, N: EncodeCounterValue>(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    series: impl IntoIterator<Item = (L, N)>,
) -> fmt::Result {
    let series = series.into_iter().map(|(l, v)| (l, ConstCounter::new(v)));
    family(enc, name, help, None, MetricType::Counter, series)
}

/// A gauge family.
fn gauges<L: EncodeLabelSet, N: EncodeGaugeValue>(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    series: impl IntoIterator<Item = (L, N)>,
) -> fmt::Result {
    let series = series.into_iter().map(|(l, v)| (l, ConstGauge::new(v)));
    family(enc, name, help, unit, MetricType::Gauge, series)
}

/// `{replica="<name>"}`.
fn by_replica(r: &ReplicaSnapshot) -> [(&'static str, &str); 1] {
    [("replica", r.name.as_str())]
}

impl SnapshotCollector {
    /// A counter per replica.
    fn replica_counter(
        &self,
        enc: &mut DescriptorEncoder<'_>,
        name: &str,
        help: &str,
        value: impl Fn(&ReplicaSnapshot) -> u64,
    ) -> fmt::Result {
        counters(enc, name, help, self.0.replicas.iter().map(|r| (by_replica(r), value(r))))
    }

    /// A gauge per replica, left out where `value` gives `None`.
    fn replica_gauge<N: EncodeGaugeValue>(
        &self,
        enc: &mut DescriptorEncoder<'_>,
        name: &str,
        help: &str,
        unit: Option<&Unit>,
        value: impl Fn(&ReplicaSnapshot) -> Option<N>,
    ) -> fmt::Result {
        let series = self.0.replicas.iter().filter_map(|r| Some((by_replica(r), value(r)?)));
        gauges(enc, name, help, unit, series)
    }

    /// A gauge per replica and tier.
    fn tier_gauge(
        &self,
        enc: &mut DescriptorEncoder<'_>,
        name: &str,
        help: &str,
        value: impl Fn(&ReplicaSnapshot) -> [u64; 3],
    ) -> fmt::Result {
        let series = self.0.replicas.iter().flat_map(|r| {
            TIERS
                .iter()
                .zip(value(r))
                .map(|(&tier, v)| ([("replica", r.name.as_str()), ("tier", tier)], v))
        });
        gauges(enc, name, help, None, series)
    }

    /// Peer load sharing: what each peer sent us, what we sent each target.
    fn encode_peers(&self, enc: &mut DescriptorEncoder<'_>) -> fmt::Result {
        let s = &self.0;
        let none = |v| [(NO_LABELS, v)];
        let by_peer = |v: fn(&crate::observe::snapshot::PeerSnapshot) -> u64| {
            s.peers.iter().map(move |p| ([("peer", p.instance.as_str())], v(p)))
        };
        gauges(
            enc,
            "peers",
            "Peer instances heard from recently",
            None,
            none(s.peers.len() as u64),
        )?;
        counters(
            enc,
            "peer_changes_received",
            "Ledger changes received from a peer",
            by_peer(|p| p.changes_received),
        )?;
        counters(
            enc,
            "peer_unknown_replica",
            "Peer bookings for replicas this instance does not know",
            by_peer(|p| p.unknown_replica),
        )?;
        let lag = s.peers.iter().map(|p| ([("peer", p.instance.as_str())], p.lag_s));
        gauges(
            enc,
            "peer_lag",
            "Age of a peer's last batch on arrival",
            Some(&Unit::Seconds),
            lag,
        )?;
        let by_target = |v: fn(&crate::observe::snapshot::PeerTargetSnapshot) -> u64| {
            s.peer_targets.iter().map(move |t| ([("target", t.url.as_str())], v(t)))
        };
        counters(
            enc,
            "peer_batches_sent",
            "Batches a peer accepted",
            by_target(|t| t.batches_sent),
        )?;
        counters(
            enc,
            "peer_send_failures",
            "Batches to a peer that failed (lost)",
            by_target(|t| t.failures),
        )?;
        counters(
            enc,
            "peer_batches_dropped",
            "Batches dropped because a peer's queue was full",
            by_target(|t| t.dropped),
        )?;
        counters(
            enc,
            "peer_outbox_dropped",
            "Local ledger changes dropped before peers got them",
            none(s.peer_outbox_dropped),
        )?;
        counters(
            enc,
            "peers_forgotten",
            "Peers forgotten after going silent (their bookings aged out)",
            none(s.peers_forgotten),
        )?;
        let Some(bus) = &s.peer_bus else { return Ok(()) };
        gauges(
            enc,
            "peer_bus_connected",
            "Whether the NATS connection peers share over is up (1) or lost (0)",
            None,
            none(u64::from(bus.connected)),
        )?;
        counters(
            enc,
            "peer_bus_disconnects",
            "NATS connections lost (the client reconnects by itself)",
            none(bus.disconnects),
        )?;
        counters(
            enc,
            "peer_bus_undecodable",
            "Messages on the peers' NATS subject that were not a batch (dropped)",
            none(bus.undecodable),
        )
    }

    /// Per model pool: its decisions, load and adapter loads, and which
    /// pool each replica serves (join the replica families on it).
    fn encode_pools(&self, enc: &mut DescriptorEncoder<'_>) -> fmt::Result {
        let pools = &self.0.pools;
        let decisions = pools.iter().flat_map(|p| {
            ["routed", "wait", "rejected"]
                .into_iter()
                .zip(p.decisions)
                .map(|(outcome, v)| ([("pool", p.name.as_str()), ("outcome", outcome)], v))
        });
        counters(enc, "pool_decisions", "Routing decisions per model pool, by outcome", decisions)?;
        let by_pool = |v: fn(&crate::observe::snapshot::PoolSnapshot) -> u64| {
            pools.iter().map(move |p| ([("pool", p.name.as_str())], v(p)))
        };
        gauges(
            enc,
            "pool_in_flight",
            "Bookings in flight per pool",
            None,
            by_pool(|p| p.in_flight),
        )?;
        gauges(
            enc,
            "pool_admission_waiting",
            "Requests waiting for a busy pool's replicas",
            None,
            by_pool(|p| p.admission_waiting),
        )?;
        counters(
            enc,
            "pool_adapter_loads",
            "Requests routed to a replica whose GPU slots were not believed to hold their LoRA \
             adapter",
            by_pool(|p| p.adapter_loads),
        )?;
        let runtime = pools.iter().flat_map(|p| {
            ["loaded", "failed"]
                .into_iter()
                .zip(p.adapter_runtime_loads)
                .map(|(outcome, v)| ([("pool", p.name.as_str()), ("outcome", outcome)], v))
        });
        counters(
            enc,
            "pool_adapter_runtime_loads",
            "LoRA adapters loaded onto an engine through its runtime API, by outcome",
            runtime,
        )?;
        let tokens = pools.iter().flat_map(|p| {
            let pool = p.name.as_str();
            [("routed", p.prompt_tokens[0]), ("predicted_cached", p.prompt_tokens[1])]
                .map(|(kind, v)| ([("pool", pool), ("kind", kind)], v))
        });
        counters(
            enc,
            "pool_prompt_tokens",
            "Prompt tokens routed per pool (kind=routed), and those predicted cached where they \
             went (kind=predicted_cached): the pool's predicted hit rate",
            tokens,
        )?;
        let reasons = pools.iter().flat_map(|p| {
            let pool = p.name.as_str();
            kvgate_router::Reason::LABELS
                .iter()
                .zip(&p.routed_by_reason)
                .map(move |(reason, &v)| ([("pool", pool), ("reason", *reason)], v))
        });
        counters(
            enc,
            "pool_decision_reasons",
            "Routed requests per pool, by why the winner won (counted when the decision log \
             is on, router.explain_last > 0, the default)",
            reasons,
        )?;
        let transfer = pools
            .iter()
            .filter_map(|p| Some(([("pool", p.name.as_str())], p.transfer_s_per_token?)));
        gauges(
            enc,
            "pool_kv_transfer_per_token",
            "A disaggregated pool's KV transfer time per token, as calibrated from its decode \
             replicas' NIXL metrics (the configured bandwidth until they report)",
            Some(&Unit::Seconds),
            transfer,
        )?;
        let info =
            pools.iter().map(|p| ([("pool", p.name.as_str()), ("model", p.model.as_str())], 1u64));
        gauges(enc, "pool_info", "1 per model pool, with the model it serves", None, info)?;
        let replicas = self.0.replicas.iter();
        let members =
            replicas.map(|r| ([("replica", r.name.as_str()), ("pool", r.pool.as_str())], 1u64));
        gauges(enc, "replica_pool", "1 per replica, labelled with its model pool", None, members)?;
        self.encode_tenants(enc)
    }

    /// Per tenant of each pool's tenant queue (`[tenants]`): depth, in
    /// flight, outcomes, tokens served, refusals by reason.
    fn encode_tenants(&self, enc: &mut DescriptorEncoder<'_>) -> fmt::Result {
        let rows = || {
            self.0.pools.iter().flat_map(|p| p.tenants.iter().map(move |t| (p.name.as_str(), t)))
        };
        let by_tenant = |v: fn(&TenantSnapshot) -> u64| {
            rows().map(move |(pool, t)| ([("pool", pool), ("tenant", t.tenant.as_str())], v(t)))
        };
        gauges(
            enc,
            "tenant_queue_depth",
            "Requests waiting in the tenant queue, per tenant",
            None,
            by_tenant(|t| t.queue_depth),
        )?;
        gauges(
            enc,
            "tenant_in_flight",
            "Requests dispatched from the tenant queue and not finished, per tenant",
            None,
            by_tenant(|t| t.in_flight),
        )?;
        let outcomes = rows().flat_map(|(pool, t)| {
            [
                ("arrived", t.arrived),
                ("dispatched", t.dispatched),
                ("finished", t.finished),
                ("cancelled", t.cancelled),
            ]
            .map(|(outcome, v)| {
                ([("pool", pool), ("tenant", t.tenant.as_str()), ("outcome", outcome)], v)
            })
        });
        counters(
            enc,
            "tenant_requests",
            "Requests per tenant by outcome: arrived (offered to the queue), dispatched (sent \
             to an engine), finished (dispatched and ended), cancelled (left the queue: client \
             gone, or the router refused); refusals are kvgate_tenant_rejected_total",
            outcomes,
        )?;
        let rejected = rows().flat_map(|(pool, t)| {
            RejectReason::ALL.iter().zip(t.rejected).map(move |(reason, v)| {
                ([("pool", pool), ("tenant", t.tenant.as_str()), ("reason", reason.as_str())], v)
            })
        });
        counters(
            enc,
            "tenant_rejected",
            "Requests refused per tenant, by reason: queue_full, in_flight_limit, token_rate \
             (429 with Retry-After), expired (waited the band's queue TTL, 503)",
            rejected,
        )?;
        let tokens = rows().flat_map(|(pool, t)| {
            [("input", t.input_tokens), ("output", t.output_tokens)].map(|(kind, v)| {
                ([("pool", pool), ("tenant", t.tenant.as_str()), ("kind", kind)], v)
            })
        });
        counters(
            enc,
            "tenant_tokens",
            "Tokens served per tenant: input (prompt) and output, settled with the engine's \
             usage where it reported one",
            tokens,
        )
    }

    fn encode_replicas(&self, enc: &mut DescriptorEncoder<'_>) -> fmt::Result {
        let replicas = &self.0.replicas;
        let health = replicas.iter().flat_map(|r| {
            HEALTH_STATES.iter().map(|&state| {
                ([("replica", r.name.as_str()), ("state", state)], u64::from(r.health == state))
            })
        });
        gauges(enc, "replica_health", "1 for the replica's current health state", None, health)?;
        self.replica_gauge(
            enc,
            "replica_draining",
            "1 while the replica is draining",
            None,
            |r| Some(u64::from(r.draining)),
        )?;
        self.replica_gauge(
            enc,
            "replica_problems",
            "Problems found with the replica",
            None,
            |r| Some(r.problems.len() as u64),
        )?;

        self.tier_gauge(
            enc,
            "index_blocks",
            "Blocks the index holds for the replica, by tier",
            |r| r.index_blocks,
        )?;
        self.tier_gauge(
            enc,
            "replica_capacity_blocks",
            "KV capacity reported by the engine, blocks, by tier (0 unknown)",
            |r| r.capacity_blocks,
        )?;

        let anomalies = self.0.replicas.iter().flat_map(|r| {
            r.index_anomalies
                .iter()
                .map(|(&kind, &n)| ([("replica", r.name.as_str()), ("kind", kind)], n))
        });
        counters(
            enc,
            "index_anomalies",
            "Events the index refused or repaired (malformed, over capacity, unknown parent, ...)",
            anomalies,
        )?;
        self.replica_counter(enc, "events", "KV events applied", |r| r.events)?;
        self.replica_counter(enc, "event_batches", "KV event batches applied", |r| {
            r.event_batches
        })?;
        self.replica_counter(enc, "event_gaps", "Gaps detected in the event stream", |r| {
            r.event_gaps
        })?;
        self.replica_counter(
            enc,
            "event_replayed_batches",
            "Event batches recovered through replay",
            |r| r.event_replayed_batches,
        )?;
        self.replica_counter(enc, "event_resets", "Resets of the replica's index view", |r| {
            r.event_resets
        })?;
        self.replica_counter(enc, "event_decode_errors", "Undecodable event payloads", |r| {
            r.event_decode_errors
        })?;
        self.replica_counter(enc, "event_reconnects", "Event subscriber reconnects", |r| {
            r.event_reconnects
        })?;
        self.replica_counter(
            enc,
            "event_wrong_topic",
            "Event messages on another topic than the configured one, dropped",
            |r| r.event_wrong_topic,
        )?;

        self.replica_gauge(
            enc,
            "ledger_pending_prefill_tokens",
            "Prefill tokens booked and not yet started",
            None,
            |r| Some(r.pending_prefill_tokens),
        )?;
        let stages = replicas.iter().flat_map(|r| {
            [("prefill", r.prefill_requests), ("decoding", r.decoding_requests)]
                .map(|(stage, n)| ([("replica", r.name.as_str()), ("stage", stage)], n))
        });
        gauges(enc, "ledger_requests", "Requests booked, by stage", None, stages)?;
        self.replica_gauge(
            enc,
            "ledger_drift",
            "Ledger requests minus engine-reported requests at the last report",
            None,
            |r| Some(r.ledger_drift),
        )?;
        self.replica_gauge(
            enc,
            "calibrated_prefill_tokens_per_second",
            "Calibrated prefill speed",
            None,
            |r| Some(r.prefill_tokens_per_s),
        )?;
        self.replica_gauge(
            enc,
            "calibrated_overhead",
            "Calibrated fixed per-request overhead",
            Some(&Unit::Seconds),
            |r| Some(r.overhead_s),
        )?;
        self.replica_gauge(
            enc,
            "calibrated_decode_step",
            "The engine's measured decode step (mean inter-token latency), once measured",
            Some(&Unit::Seconds),
            |r| r.decode_step_s,
        )?;

        self.replica_gauge(enc, "engine_running", "Engine-reported running requests", None, |r| {
            r.engine_running
        })?;
        self.replica_gauge(enc, "engine_waiting", "Engine-reported waiting requests", None, |r| {
            r.engine_waiting
        })?;
        self.replica_gauge(
            enc,
            "engine_kv_usage",
            "Engine-reported KV cache usage, 0 to 1",
            None,
            |r| r.engine_kv_usage,
        )?;
        let queries =
            replicas.iter().filter_map(|r| Some((by_replica(r), r.engine_prefix_queries?)));
        counters(
            enc,
            "engine_prefix_cache_queries_tokens",
            "Engine-reported prefix cache queries, tokens",
            queries,
        )?;
        let hits = replicas.iter().filter_map(|r| Some((by_replica(r), r.engine_prefix_hits?)));
        counters(
            enc,
            "engine_prefix_cache_hits_tokens",
            "Engine-reported prefix cache hits, tokens",
            hits,
        )?;
        self.replica_gauge(
            enc,
            "engine_prefix_cache_hit_ratio",
            "Engine-reported prefix cache hits / queries, lifetime",
            None,
            |r| match (r.engine_prefix_hits, r.engine_prefix_queries) {
                (Some(h), Some(q)) if q > 0 => Some(h as f64 / q as f64),
                _ => None,
            },
        )?;

        self.replica_counter(enc, "routed", "Requests routed to the replica by this ingress", |r| {
            r.routed
        })
    }

    fn encode_fleet(&self, enc: &mut DescriptorEncoder<'_>) -> fmt::Result {
        let s = &self.0;
        let none = |v| [(NO_LABELS, v)];
        gauges(enc, "index_bytes", "Index memory estimate, bytes", None, none(s.index_bytes))?;
        gauges(
            enc,
            "index_distinct_keys",
            "Distinct block keys in the index",
            None,
            none(s.index_distinct_keys),
        )?;

        let l = &s.ledger;
        counters(enc, "ledger_bookings", "Ledger bookings made", none(l.booked))?;
        let releases = [
            ("finished", l.finished),
            ("cancelled", l.cancelled),
            ("errored", l.errored),
            ("dropped", l.dropped),
            ("expired", l.expired),
            ("reconciled", l.reconciled),
            ("replica_removed", l.replica_removed),
            ("peer_gone", l.peer_gone),
        ]
        .map(|(reason, v)| ([("reason", reason)], v));
        counters(enc, "ledger_releases", "Ledger releases, by reason", releases)?;
        counters(
            enc,
            "ledger_late_updates",
            "Updates for bookings no longer in the ledger",
            none(l.late_updates),
        )?;
        gauges(enc, "ledger_in_flight", "Bookings in flight", None, none(s.in_flight))?;
        gauges(
            enc,
            "admission_waiting",
            "Requests waiting for a replica to stop being busy",
            None,
            none(s.admission_waiting),
        )?;
        self.encode_peers(enc)?;

        let decisions = ["routed", "wait", "rejected"]
            .into_iter()
            .zip(s.decisions)
            .map(|(outcome, v)| ([("outcome", outcome)], v));
        counters(enc, "decisions", "Routing decisions, by outcome", decisions)?;
        self.encode_pools(enc)?;

        let t = &s.tentative;
        let tentative = [
            ("added", t.added),
            ("confirmed", t.confirmed),
            ("expired_unconfirmed", t.expired_unconfirmed),
            ("overflow", t.overflow),
        ]
        .map(|(outcome, v)| ([("outcome", outcome)], v));
        counters(enc, "tentative_blocks", "Tentative blocks, by outcome", tentative)?;
        gauges(enc, "tentative_blocks_live", "Tentative blocks live now", None, none(t.live))?;

        gauges(
            enc,
            "process_resident_memory",
            "Resident memory of this process",
            Some(&Unit::Bytes),
            [(NO_LABELS, s.rss_bytes)],
        )?;
        let cpu = [(NO_LABELS, ConstCounter::new(s.cpu_seconds))];
        family(
            enc,
            "process_cpu",
            "CPU time used by this process, user + system",
            Some(&Unit::Seconds),
            MetricType::Counter,
            cpu,
        )?;
        counters(
            enc,
            "trace_spans_dropped",
            "Spans the trace exporter's queue had no room for (OTEL_BSP_MAX_QUEUE_SIZE)",
            none(crate::request::trace_context::dropped_spans()),
        )?;
        gauges(enc, "uptime", "Time since start", Some(&Unit::Seconds), [(NO_LABELS, s.uptime_s)])
    }
}

impl Collector for SnapshotCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> fmt::Result {
        self.encode_replicas(&mut encoder)?;
        self.encode_fleet(&mut encoder)
    }
}

/// Resident memory of this process, in bytes; 0 where it cannot be read
/// (`VmRSS` of `/proc/self/status`, in kB there; off Linux the file does not
/// exist).
pub(crate) fn process_rss_bytes() -> u64 {
    debug_assert!(!crate::locks::under_fleet_lock(), "a /proc read under the fleet lock");
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else { return 0 };
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// CPU time used by this process so far, user + system, in seconds; 0.0 where
/// it cannot be read.
///
/// Reads fields 14 (`utime`) and 15 (`stime`) of `/proc/self/stat`, which count
/// clock ticks. The tick is assumed to be 100 Hz: `sysconf(_SC_CLK_TCK)` is 100
/// on every Linux architecture the kernel's user ABI exposes (`USER_HZ`), and
/// reading it would take `libc` and `unsafe`. Off Linux the file does not exist
/// and this returns 0.0.
pub(crate) fn process_cpu_seconds() -> f64 {
    debug_assert!(!crate::locks::under_fleet_lock(), "a /proc read under the fleet lock");
    const CLOCK_TICKS_PER_SECOND: f64 = 100.0;
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else { return 0.0 };
    // `pid (comm) state ppid …`: `comm` may contain spaces and parentheses,
    // so fields are counted from the last `)`. After it, `state` is field 3.
    let Some((_, rest)) = stat.rsplit_once(')') else { return 0.0 };
    let mut fields = rest.split_ascii_whitespace().skip(14 - 3);
    let ticks = |f: Option<&str>| f.and_then(|v| v.parse::<u64>().ok());
    match (ticks(fields.next()), ticks(fields.next())) {
        (Some(utime), Some(stime)) => (utime + stime) as f64 / CLOCK_TICKS_PER_SECOND,
        _ => 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every reason is exported from the start (at 0), in its family, so
    /// alerts see the series before the first occurrence.
    #[test]
    fn every_reason_is_exported_from_the_start() {
        let text = Metrics::new().render(&FleetSnapshot::default());
        for reason in Reason::ALL {
            let family = match reason.family() {
                ReasonFamily::Retry => "retries",
                ReasonFamily::StreamError => "stream_errors",
                ReasonFamily::Rejected => "rejected",
            };
            let line = format!("kvgate_{family}_total{{reason=\"{}\"}} 0", reason.label());
            assert!(text.contains(&line), "{line} missing");
        }
    }

    use kvgate_router::{LedgerTotals, TentativeStats};

    fn replica(name: &str) -> ReplicaSnapshot {
        ReplicaSnapshot {
            name: name.into(),
            url: format!("http://{name}:8000"),
            ..Default::default()
        }
    }

    fn snapshot() -> FleetSnapshot {
        let a = ReplicaSnapshot {
            health: "healthy",
            index_blocks: [12, 3, 0],
            capacity_blocks: [1000, 4000, 0],
            index_anomalies: [("malformed", 2)].into_iter().collect(),
            problems: vec!["block size mismatch".into(), "no events".into()],
            events: 40,
            event_batches: 7,
            event_gaps: 1,
            event_replayed_batches: 2,
            event_resets: 3,
            event_decode_errors: 4,
            event_reconnects: 5,
            event_wrong_topic: 6,
            view_synced: true,
            view_complete: true,
            pending_prefill_tokens: 512,
            prefill_requests: 2,
            decoding_requests: 6,
            ledger_drift: -3,
            prefill_tokens_per_s: 8000.5,
            overhead_s: 0.025,
            engine_running: Some(6),
            engine_waiting: Some(1),
            engine_kv_usage: Some(0.5),
            engine_prefix_queries: Some(200),
            engine_prefix_hits: Some(50),
            routed: 9,
            ..replica("a")
        };
        let b = ReplicaSnapshot { health: "down", draining: true, ..replica("b") };
        let a = ReplicaSnapshot { pool: "default".into(), ..a };
        FleetSnapshot {
            replicas: vec![a, b],
            index_bytes: 4096,
            index_distinct_keys: 15,
            ledger: LedgerTotals {
                booked: 11,
                finished: 5,
                cancelled: 1,
                errored: 2,
                peer_gone: 3,
                late_updates: 4,
                ..Default::default()
            },
            in_flight: 8,
            admission_waiting: 3,
            decisions: [10, 2, 1],
            tentative: TentativeStats {
                added: 30,
                confirmed: 20,
                expired_unconfirmed: 5,
                overflow: 1,
                live: 4,
            },
            cpu_seconds: 1.5,
            rss_bytes: 131_072_000,
            uptime_s: 60.0,
            peers: vec![crate::observe::snapshot::PeerSnapshot {
                instance: "p1".into(),
                changes_received: 12,
                unknown_replica: 1,
                lag_s: 0.004,
                silent_s: 0.1,
            }],
            peer_targets: vec![crate::observe::snapshot::PeerTargetSnapshot {
                url: "http://10.0.0.7:9000".into(),
                batches_sent: 6,
                failures: 2,
                dropped: 0,
            }],
            peer_outbox_dropped: 0,
            peers_forgotten: 1,
            peer_bus: Some(crate::observe::snapshot::PeerBusSnapshot {
                connected: true,
                disconnects: 2,
                undecodable: 1,
            }),
            pools: vec![crate::observe::snapshot::PoolSnapshot {
                name: "default".into(),
                model: "m".into(),
                in_flight: 8,
                admission_waiting: 3,
                decisions: [10, 2, 1],
                adapter_loads: 4,
                adapter_runtime_loads: [1, 0],
                prompt_tokens: [4096, 3072],
                routed_by_reason: {
                    let mut v = vec![0; kvgate_router::Reason::LABELS.len()];
                    v[kvgate_router::Reason::LowestCost.index()] = 9;
                    v[kvgate_router::Reason::Only.index()] = 1;
                    v
                },
                transfer_s_per_token: Some(4.0e-6),
                tenants: vec![TenantSnapshot {
                    tenant: "acme".into(),
                    arrived: 9,
                    queue_depth: 2,
                    in_flight: 1,
                    dispatched: 5,
                    finished: 4,
                    cancelled: 1,
                    rejected: [0, 1, 0, 0],
                    input_tokens: 640,
                    output_tokens: 80,
                }],
            }],
        }
    }

    fn lines(text: &str) -> Vec<&str> {
        text.lines().collect()
    }

    fn assert_has(text: &str, expected: &[&str]) {
        let got = lines(text);
        for line in expected {
            assert!(got.contains(line), "missing line {line:?} in:\n{text}");
        }
    }

    #[test]
    fn snapshot_series() {
        let text = Metrics::new().render(&snapshot());
        assert_has(
            &text,
            &[
                "# TYPE kvgate_replica_health gauge",
                r#"kvgate_replica_health{replica="a",state="healthy"} 1"#,
                r#"kvgate_replica_health{replica="a",state="degraded"} 0"#,
                r#"kvgate_replica_health{replica="b",state="down"} 1"#,
                r#"kvgate_replica_health{replica="b",state="healthy"} 0"#,
                r#"kvgate_replica_draining{replica="a"} 0"#,
                r#"kvgate_replica_draining{replica="b"} 1"#,
                r#"kvgate_replica_problems{replica="a"} 2"#,
                r#"kvgate_index_blocks{replica="a",tier="gpu"} 12"#,
                r#"kvgate_index_blocks{replica="a",tier="cpu"} 3"#,
                r#"kvgate_index_blocks{replica="b",tier="storage"} 0"#,
                r#"kvgate_replica_capacity_blocks{replica="a",tier="cpu"} 4000"#,
                "kvgate_index_bytes 4096",
                "kvgate_index_distinct_keys 15",
                "# TYPE kvgate_events counter",
                r#"kvgate_index_anomalies_total{replica="a",kind="malformed"} 2"#,
                r#"kvgate_events_total{replica="a"} 40"#,
                r#"kvgate_event_batches_total{replica="a"} 7"#,
                r#"kvgate_event_gaps_total{replica="a"} 1"#,
                r#"kvgate_event_replayed_batches_total{replica="a"} 2"#,
                r#"kvgate_event_resets_total{replica="a"} 3"#,
                r#"kvgate_event_decode_errors_total{replica="a"} 4"#,
                r#"kvgate_event_reconnects_total{replica="a"} 5"#,
                r#"kvgate_event_reconnects_total{replica="b"} 0"#,
                r#"kvgate_event_wrong_topic_total{replica="a"} 6"#,
                r#"kvgate_ledger_pending_prefill_tokens{replica="a"} 512"#,
                r#"kvgate_ledger_requests{replica="a",stage="prefill"} 2"#,
                r#"kvgate_ledger_requests{replica="a",stage="decoding"} 6"#,
                r#"kvgate_ledger_drift{replica="a"} -3"#,
                r#"kvgate_calibrated_prefill_tokens_per_second{replica="a"} 8000.5"#,
                "# UNIT kvgate_calibrated_overhead_seconds seconds",
                r#"kvgate_calibrated_overhead_seconds{replica="a"} 0.025"#,
                r#"kvgate_engine_running{replica="a"} 6"#,
                r#"kvgate_engine_waiting{replica="a"} 1"#,
                r#"kvgate_engine_kv_usage{replica="a"} 0.5"#,
                r#"kvgate_engine_prefix_cache_queries_tokens_total{replica="a"} 200"#,
                r#"kvgate_engine_prefix_cache_hits_tokens_total{replica="a"} 50"#,
                r#"kvgate_engine_prefix_cache_hit_ratio{replica="a"} 0.25"#,
                r#"kvgate_routed_total{replica="a"} 9"#,
                "kvgate_ledger_bookings_total 11",
                r#"kvgate_ledger_releases_total{reason="finished"} 5"#,
                r#"kvgate_ledger_releases_total{reason="peer_gone"} 3"#,
                "kvgate_peers 1",
                r#"kvgate_peer_changes_received_total{peer="p1"} 12"#,
                r#"kvgate_peer_unknown_replica_total{peer="p1"} 1"#,
                r#"kvgate_peer_lag_seconds{peer="p1"} 0.004"#,
                r#"kvgate_peer_batches_sent_total{target="http://10.0.0.7:9000"} 6"#,
                r#"kvgate_peer_send_failures_total{target="http://10.0.0.7:9000"} 2"#,
                "kvgate_peers_forgotten_total 1",
                "kvgate_peer_bus_connected 1",
                "kvgate_peer_bus_disconnects_total 2",
                "kvgate_peer_bus_undecodable_total 1",
                r#"kvgate_ledger_releases_total{reason="replica_removed"} 0"#,
                "kvgate_ledger_late_updates_total 4",
                "kvgate_ledger_in_flight 8",
                "kvgate_admission_waiting 3",
                "kvgate_pool_decisions_total{pool=\"default\",outcome=\"wait\"} 2",
                "kvgate_pool_in_flight{pool=\"default\"} 8",
                "kvgate_pool_adapter_loads_total{pool=\"default\"} 4",
                "kvgate_pool_adapter_runtime_loads_total{pool=\"default\",outcome=\"loaded\"} 1",
                "kvgate_pool_info{pool=\"default\",model=\"m\"} 1",
                r#"kvgate_pool_prompt_tokens_total{pool="default",kind="routed"} 4096"#,
                r#"kvgate_pool_prompt_tokens_total{pool="default",kind="predicted_cached"} 3072"#,
                r#"kvgate_pool_decision_reasons_total{pool="default",reason="lowest_cost"} 9"#,
                r#"kvgate_pool_decision_reasons_total{pool="default",reason="only"} 1"#,
                r#"kvgate_tenant_queue_depth{pool="default",tenant="acme"} 2"#,
                r#"kvgate_tenant_in_flight{pool="default",tenant="acme"} 1"#,
                r#"kvgate_tenant_requests_total{pool="default",tenant="acme",outcome="cancelled"} 1"#,
                r#"kvgate_tenant_rejected_total{pool="default",tenant="acme",reason="in_flight_limit"} 1"#,
                r#"kvgate_tenant_rejected_total{pool="default",tenant="acme",reason="expired"} 0"#,
                r#"kvgate_tenant_tokens_total{pool="default",tenant="acme",kind="output"} 80"#,
                r#"kvgate_pool_decision_reasons_total{pool="default",reason="softmax"} 0"#,
                "# UNIT kvgate_pool_kv_transfer_per_token_seconds seconds",
                "kvgate_pool_kv_transfer_per_token_seconds{pool=\"default\"} 0.000004",
                "kvgate_replica_pool{replica=\"a\",pool=\"default\"} 1",
                r#"kvgate_decisions_total{outcome="routed"} 10"#,
                r#"kvgate_decisions_total{outcome="wait"} 2"#,
                r#"kvgate_decisions_total{outcome="rejected"} 1"#,
                r#"kvgate_tentative_blocks_total{outcome="added"} 30"#,
                r#"kvgate_tentative_blocks_total{outcome="expired_unconfirmed"} 5"#,
                r#"kvgate_tentative_blocks_total{outcome="overflow"} 1"#,
                "kvgate_tentative_blocks_live 4",
                "# TYPE kvgate_process_cpu_seconds counter",
                "# UNIT kvgate_process_resident_memory_bytes bytes",
                "kvgate_process_resident_memory_bytes 131072000",
                "kvgate_process_cpu_seconds_total 1.5",
                "kvgate_uptime_seconds 60.0",
            ],
        );
        // Engine figures of a replica that reported none are left out.
        for absent in [
            r#"kvgate_engine_running{replica="b"}"#,
            r#"kvgate_engine_kv_usage{replica="b"}"#,
            r#"kvgate_engine_prefix_cache_queries_tokens_total{replica="b"}"#,
            r#"kvgate_engine_prefix_cache_hit_ratio{replica="b"}"#,
        ] {
            assert!(!text.contains(absent), "unexpected {absent:?} in:\n{text}");
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
        assert_eq!(text.matches("# EOF").count(), 1);
    }

    #[test]
    fn no_replicas_no_engine_families() {
        let text = Metrics::new().render(&FleetSnapshot::default());
        assert!(!text.contains("kvgate_replica_health"), "{text}");
        assert!(!text.contains("kvgate_engine_prefix_cache_hit_ratio"), "{text}");
        assert_has(&text, &["kvgate_index_bytes 0", "kvgate_ledger_in_flight 0", "# EOF"]);
    }

    #[test]
    fn recording_shows_up() {
        let m = Metrics::new();
        m.request("chat", 200, "a");
        m.request("chat", 200, "a");
        m.request("completions", 503, "");
        m.ttft("chat", 0.2);
        m.ttft("chat", f64::NAN);
        m.e2e("chat", 3.0);
        m.tokenize_time(0.000_03);
        m.decide_time(0.000_002);
        m.decide_time(-1.0);
        m.prompt_tokens(1000, 750);
        m.prompt_tokens(24, 0);
        m.count(Reason::Connect);
        m.count(Reason::ClientDisconnect);
        m.count(Reason::AllBusy);
        m.count(Reason::AllBusy);
        m.unmatched("prompt_embeds");
        let text = m.render(&snapshot());
        assert_has(
            &text,
            &[
                "# TYPE kvgate_requests counter",
                r#"kvgate_requests_total{route="chat",status="200",replica="a"} 2"#,
                r#"kvgate_requests_total{route="completions",status="503",replica=""} 1"#,
                "# TYPE kvgate_time_to_first_token_seconds histogram",
                "# UNIT kvgate_time_to_first_token_seconds seconds",
                r#"kvgate_time_to_first_token_seconds_bucket{le="0.1",route="chat"} 0"#,
                r#"kvgate_time_to_first_token_seconds_bucket{le="0.25",route="chat"} 1"#,
                r#"kvgate_time_to_first_token_seconds_bucket{le="+Inf",route="chat"} 1"#,
                r#"kvgate_time_to_first_token_seconds_count{route="chat"} 1"#,
                r#"kvgate_time_to_first_token_seconds_sum{route="chat"} 0.2"#,
                r#"kvgate_request_duration_seconds_bucket{le="5.0",route="chat"} 1"#,
                r#"kvgate_request_duration_seconds_count{route="chat"} 1"#,
                "# TYPE kvgate_tokenize_seconds histogram",
                r#"kvgate_tokenize_seconds_bucket{le="0.00001"} 0"#,
                r#"kvgate_tokenize_seconds_bucket{le="0.00005"} 1"#,
                r#"kvgate_tokenize_seconds_bucket{le="1.0"} 1"#,
                "kvgate_tokenize_seconds_count 1",
                "# TYPE kvgate_decide_seconds histogram",
                r#"kvgate_decide_seconds_bucket{le="0.000001"} 1"#,
                r#"kvgate_decide_seconds_bucket{le="0.0000025"} 2"#,
                r#"kvgate_decide_seconds_bucket{le="0.01"} 2"#,
                "kvgate_decide_seconds_count 2",
                "kvgate_decide_seconds_sum 0.000002",
                "kvgate_prompt_tokens_total 1024",
                "kvgate_predicted_cached_tokens_total 750",
                r#"kvgate_unmatched_requests_total{reason="prompt_embeds"} 1"#,
                r#"kvgate_retries_total{reason="connect"} 1"#,
                r#"kvgate_retries_total{reason="timeout"} 0"#,
                r#"kvgate_stream_errors_total{reason="client_disconnect"} 1"#,
                r#"kvgate_stream_errors_total{reason="upstream"} 0"#,
                r#"kvgate_rejected_total{reason="all_busy"} 2"#,
                r#"kvgate_rejected_total{reason="invalid"} 0"#,
                // The snapshot's series follow in the same exposition.
                r#"kvgate_index_blocks{replica="a",tier="gpu"} 12"#,
            ],
        );
        assert!(text.ends_with("# EOF\n"), "{text}");
        // Every family is described once.
        let types: Vec<&str> = text.lines().filter(|l| l.starts_with("# TYPE ")).collect();
        let mut unique = types.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(types.len(), unique.len(), "{text}");
    }

    #[test]
    fn label_values_are_escaped() {
        let snap = FleetSnapshot { replicas: vec![replica("we\"ird\\name")], ..Default::default() };
        let text = Metrics::new().render(&snap);
        assert!(text.contains(r#"kvgate_routed_total{replica="we\"ird\\name"} 0"#), "{text}");
    }

    #[test]
    fn content_type_is_openmetrics() {
        assert!(CONTENT_TYPE.starts_with("application/openmetrics-text; version=1.0.0"));
    }

    #[test]
    fn cpu_seconds_grow_with_work() {
        let start = std::time::Instant::now();
        let mut x = 0u64;
        while start.elapsed() < std::time::Duration::from_millis(150) {
            for i in 0..10_000u64 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
            }
        }
        std::hint::black_box(x);
        let cpu = process_cpu_seconds();
        if cfg!(target_os = "linux") {
            assert!(cpu > 0.0, "{cpu}");
        }
        assert!(cpu.is_finite() && cpu >= 0.0);
    }

    #[test]
    fn resident_memory_counts_a_touched_allocation() {
        if !cfg!(target_os = "linux") {
            return;
        }
        // 64 MiB written byte by byte is resident while it lives, whatever
        // the other tests allocate or free meanwhile.
        let block = std::hint::black_box(vec![1u8; 64 << 20]);
        let rss = process_rss_bytes();
        assert!(rss >= 64 << 20, "{rss}");
        drop(block);
    }
}
