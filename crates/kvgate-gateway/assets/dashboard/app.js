// The dashboard: reads frames from /dashboard/stream (server-sent events,
// one JSON frame per interval; fields in crates/kvgate-gateway/src/doors/dashboard/frame.rs),
// keeps their history here for the charts (the gateway keeps none), and
// updates the page in place so that nothing flickers.
import { LineChart } from '/dashboard/assets/chart.js';

const HISTORY_S = 300;
const history = [];
let frames = 0;

const $ = (id) => document.getElementById(id);

// ---- formatting: every number carries its unit ----
const pct = (v) => (v == null ? '–' : `${(100 * v).toFixed(1)} %`);
const num = (v) => (v == null ? '–' : Math.round(v).toLocaleString('en-US'));
const rate = (v, unit) => (v == null ? '–' : `${v < 10 ? v.toFixed(1) : Math.round(v).toLocaleString('en-US')} ${unit}`);
const secs = (v) => (v == null ? '–' : v < 1 ? `${Math.round(v * 1000)} ms` : `${v.toFixed(2)} s`);
const ago = (s) => (s < 60 ? `${s.toFixed(1)} s` : `${Math.floor(s / 60)} min`);
const duration = (s) => {
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60);
  return h ? `${h} h ${m} min` : m ? `${m} min ${Math.floor(s % 60)} s` : `${Math.floor(s)} s`;
};

// ---- charts ----
const charts = {
  hit: new LineChart($('hit-rate-chart').querySelector('svg'), {
    series: [{ key: 'predicted', cls: 'predicted' }, { key: 'engine', cls: 'engine' }],
    yMax: 100, format: (v) => `${v} %`,
  }),
  ttft: new LineChart($('ttft-chart').querySelector('svg'), {
    series: [{ key: 'p50', cls: 'p50' }, { key: 'p90', cls: 'p90' }],
    format: (v) => (v >= 1000 ? `${(v / 1000).toFixed(1)} s` : `${Math.round(v)}`),
  }),
  rps: new LineChart($('rps-chart').querySelector('svg'), {
    series: [{ key: 'rps', cls: 'rps' }],
    format: (v) => (v === 0 ? '0' : v < 10 ? v.toFixed(1) : String(Math.round(v))),
  }),
};

function drawCharts() {
  const now = history.length ? history[history.length - 1].t : 0;
  for (const c of Object.values(charts)) c.draw(history, now);
}

// ---- replica cards ----
function h(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

// One labelled value in a card, found later by its data-field.
function pair(dl, label, field) {
  const d = h('div', 'pair');
  d.append(h('dt', '', label));
  const dd = h('dd', '', '–');
  dd.dataset.field = field;
  d.append(dd);
  dl.append(d);
}

function tier(card, name, cls) {
  const t = h('div', `tier ${cls}`);
  const head = h('div', 'tier-head');
  head.append(h('span', '', `${name} KV`));
  const v = h('span', '', '–');
  v.dataset.field = `kv-${cls}`;
  head.append(v);
  const bar = h('div', 'bar');
  const fill = h('span');
  fill.dataset.field = `kv-${cls}-bar`;
  bar.append(fill);
  t.append(head, bar);
  card.append(t);
}

function newCard(name) {
  const card = h('article', 'card');
  card.dataset.replicaCard = '';
  card.dataset.replica = name;
  const head = h('header');
  head.append(h('h3', '', name));
  const badge = h('span', 'badge', '');
  badge.dataset.field = 'health';
  head.append(badge);
  card.append(head);
  const pool = h('div', 'pool-of');
  pool.dataset.field = 'pool';
  card.append(pool);
  const reason = h('div', 'reason');
  reason.dataset.field = 'reason';
  card.append(reason);
  tier(card, 'GPU', 'gpu');
  tier(card, 'CPU', 'cpu');
  const dl = h('dl', 'kv-grid');
  pair(dl, 'pending prefill', 'pending_prefill_tokens');
  pair(dl, 'requests/s', 'requests_per_s');
  pair(dl, 'in prefill', 'prefill_requests');
  pair(dl, 'decoding', 'decoding_requests');
  pair(dl, 'prefill rate', 'prefill_tokens_per_s');
  pair(dl, 'engine hit rate', 'engine_hit_rate');
  pair(dl, 'KV events/s', 'events_per_s');
  pair(dl, 'engine KV use', 'engine_kv_usage');
  pair(dl, 'gaps / replays', 'gaps');
  pair(dl, 'resets / bad', 'resets');
  card.append(dl);
  const problems = h('ul', 'problems');
  problems.dataset.field = 'problems';
  card.append(problems);
  return card;
}

function set(card, field, text, warn = false) {
  const e = card.querySelector(`[data-field="${field}"]`);
  if (e.textContent !== text) e.textContent = text;
  e.classList.toggle('warn-value', warn);
}

function setTier(card, cls, held, capacity) {
  const bar = card.querySelector(`[data-field="kv-${cls}-bar"]`);
  if (!capacity && !held) {
    set(card, `kv-${cls}`, cls === 'cpu' ? 'no CPU tier' : 'capacity unknown');
    bar.style.width = '0';
    return;
  }
  const share = capacity ? held / capacity : 0;
  set(card, `kv-${cls}`, `${num(held)} / ${capacity ? num(capacity) : '?'} blocks${capacity ? ` (${(100 * share).toFixed(1)} %)` : ''}`);
  bar.style.width = `${Math.min(100, 100 * share).toFixed(1)}%`;
}

// The model pools: a table row each, shown once there is more than one
// (a single-model kvgate is one pool, and its cards say all of it).
function renderPools(pools, replicas) {
  const box = $('pools');
  box.hidden = pools.length < 2;
  const body = box.querySelector('tbody');
  const rows = pools.map((p) => {
    const mine = replicas.filter((r) => r.pool === p.name);
    const up = mine.filter((r) => r.health === 'healthy' && !r.draining).length;
    const tr = h('tr');
    tr.dataset.pool = p.name;
    const cells = [
      p.name,
      p.model,
      `${up} / ${mine.length}`,
      num(p.in_flight),
      num(p.admission_waiting),
      `${num(p.decisions[0])} / ${num(p.decisions[1])} / ${num(p.decisions[2])}`,
      num(p.adapter_loads),
      `${num(p.adapter_runtime_loads[0])} / ${num(p.adapter_runtime_loads[1])}`,
    ];
    for (const c of cells) tr.append(h('td', '', c));
    return tr;
  });
  body.replaceChildren(...rows);
}

function renderReplicas(replicas, pools) {
  const box = $('replicas');
  const model = new Map(pools.map((p) => [p.name, p.model]));
  const seen = new Set();
  for (const r of replicas) {
    seen.add(r.name);
    let card = box.querySelector(`[data-replica-card][data-replica="${CSS.escape(r.name)}"]`);
    if (!card) { card = newCard(r.name); box.append(card); }
    const health = r.draining ? 'down' : r.health;
    card.dataset.health = health;
    const badge = card.querySelector('[data-field="health"]');
    badge.dataset.health = health;
    badge.textContent = r.draining ? 'draining' : r.health;
    set(card, 'reason', r.reason ?? '');
    set(card, 'pool', pools.length > 1 ? `pool ${r.pool} · ${model.get(r.pool) ?? '?'}` : '');
    setTier(card, 'gpu', r.index_blocks[0], r.capacity_blocks[0]);
    setTier(card, 'cpu', r.index_blocks[1], r.capacity_blocks[1]);
    set(card, 'pending_prefill_tokens', `${num(r.pending_prefill_tokens)} tok`);
    set(card, 'requests_per_s', rate(r.requests_per_s, 'req/s'));
    set(card, 'prefill_requests', num(r.prefill_requests));
    set(card, 'decoding_requests', num(r.decoding_requests));
    set(card, 'prefill_tokens_per_s', r.calibration_samples ? rate(r.prefill_tokens_per_s, 'tok/s') : 'not calibrated');
    set(card, 'engine_hit_rate', pct(r.engine_hit_rate));
    set(card, 'events_per_s', rate(r.events_per_s, 'ev/s'));
    set(card, 'engine_kv_usage', pct(r.engine_kv_usage));
    set(card, 'gaps', `${num(r.event_gaps)} / ${num(r.event_replayed_batches)}`, r.event_gaps > r.event_replayed_batches);
    set(card, 'resets', `${num(r.event_resets)} / ${num(r.event_decode_errors)}`, r.event_resets + r.event_decode_errors > 0);
    const problems = card.querySelector('[data-field="problems"]');
    const text = r.problems.join('\n');
    if (problems.dataset.text !== text) {
      problems.dataset.text = text;
      problems.replaceChildren(...r.problems.map((p) => h('li', '', p)));
    }
  }
  for (const card of box.querySelectorAll('[data-replica-card]')) {
    if (!seen.has(card.dataset.replica)) card.remove();
  }
}

// ---- decision stream ----
const REASONS = {
  lowest_cost: 'lowest predicted TTFT',
  near_tie: 'random among near-equal costs',
  softmax: 'softmax draw over costs',
  only: 'only routable replica',
  round_robin: 'round-robin turn',
  random: 'random draw',
  least_load: 'fewest pending prefill tokens',
  power_of_two: 'lighter of two random',
  affinity: 'session affinity',
  no_session_key: 'no session key: least load',
  approx_match: 'longest remembered prefix',
  approx_smallest_tree: 'short match: least remembered text',
  approx_imbalance: 'load imbalance: fewest requests',
  all_busy_wait: 'every replica busy: asked to wait',
  all_busy_reject: 'every replica busy: rejected',
  no_replica: 'no routable replica',
};

function why(d) {
  const r = d.reason;
  let text = REASONS[r.kind] ?? r.kind;
  if (r.kind === 'near_tie') text += ` (${r.among} within ε)`;
  if (r.kind === 'approx_match') text += ` (${pct(r.matched)})`;
  const ranked = d.candidates.filter((c) => c.health !== 'down').sort((a, b) => a.predicted_ttft_s - b.predicted_ttft_s);
  const win = d.candidates.find((c) => c.replica === d.chosen);
  const next = ranked.find((c) => c.replica !== d.chosen);
  if (win && next && r.kind !== 'all_busy_wait' && r.kind !== 'all_busy_reject') {
    text += `: ${secs(win.predicted_ttft_s)} vs ${secs(next.predicted_ttft_s)} on ${next.replica}`;
  }
  return text;
}

function candidate(c, chosen) {
  const cached = c.overlap_blocks.gpu + c.overlap_blocks.cpu;
  const cls = `cand${c.replica === chosen ? ' winner' : ''}${c.health === 'down' ? ' down' : ''}`;
  const e = h('span', cls, `${c.replica} · ${secs(c.predicted_ttft_s)} · ${cached} blk · ${num(c.pending_prefill_tokens)} tok`);
  e.title = `GPU ${c.overlap_blocks.gpu}, CPU ${c.overlap_blocks.cpu}, tentative ${c.tentative_blocks} blocks; ` +
    `${c.requests} requests, ${c.decoding} decoding; ${c.health}${c.busy ? ', busy' : ''}`;
  return e;
}

function renderDecisions(decisions) {
  const rows = decisions.map((d) => {
    const tr = h('tr');
    tr.dataset.decision = '';
    if (d.booking != null) tr.dataset.booking = d.booking;
    tr.append(h('td', 'num', ago(d.age_s)));
    tr.append(h('td', '', d.chosen ?? '—'));
    tr.append(h('td', '', why(d)));
    tr.append(h('td', 'num', `${num(d.prompt_tokens)} tok / ${d.prompt_blocks} blk`));
    const td = h('td');
    const cands = [...d.candidates].sort((a, b) => a.predicted_ttft_s - b.predicted_ttft_s);
    td.append(...cands.map((c) => candidate(c, d.chosen)));
    tr.append(td);
    return tr;
  });
  if (!rows.length) {
    const tr = h('tr');
    const td = h('td', '', 'no decisions yet: send a request to kvgate');
    td.colSpan = 5;
    tr.append(td);
    rows.push(tr);
  }
  $('decision-stream').querySelector('tbody').replaceChildren(...rows);
}

// ---- frames ----
function onFrame(f) {
  const fl = f.fleet;
  history.push({
    t: f.uptime_s,
    predicted: fl.predicted_hit_rate == null ? null : 100 * fl.predicted_hit_rate,
    engine: fl.engine_hit_rate == null ? null : 100 * fl.engine_hit_rate,
    p50: fl.ttft_p50_s == null ? null : 1000 * fl.ttft_p50_s,
    p90: fl.ttft_p90_s == null ? null : 1000 * fl.ttft_p90_s,
    rps: fl.requests_per_s,
  });
  while (history.length && f.uptime_s - history[0].t > HISTORY_S) history.shift();

  $('fleet-rps').textContent = rate(fl.requests_per_s, 'req/s');
  const byApi = Object.entries(fl.requests_per_s_by_route ?? {}).filter(([, v]) => v);
  $('fleet-by-api').textContent = byApi.length
    ? byApi.map(([api, v]) => `${api} ${v.toFixed(1)}`).join(' · ') : '–';
  $('fleet-predicted-hit').textContent = pct(fl.predicted_hit_rate);
  $('fleet-engine-hit').textContent = pct(fl.engine_hit_rate);
  $('fleet-ttft-p50').textContent = secs(fl.ttft_p50_s);
  $('fleet-ttft-p90').textContent = secs(fl.ttft_p90_s);
  $('fleet-in-flight').textContent = num(fl.in_flight);
  $('fleet-replicas').textContent = `${fl.healthy} / ${f.replicas.length}${fl.degraded ? ` (${fl.degraded} degraded)` : ''}`;
  $('fleet-refused').textContent = `${num(fl.decisions[1])} / ${num(fl.decisions[2])}`;
  $('meta').textContent = `up ${duration(f.uptime_s)} · rates over the last ${f.window_s.toFixed(0)} s · ` +
    `${fl.ttft_samples} first tokens in the window · a frame every ${f.interval_ms} ms`;

  const pools = f.pools ?? [];
  renderPools(pools, f.replicas);
  renderReplicas(f.replicas, pools);
  renderDecisions(f.decisions);
  drawCharts();
  frames += 1;
  document.body.dataset.frames = String(frames);
  document.body.dataset.seq = String(f.seq);
}

function connState(state, text) {
  const c = $('conn');
  c.dataset.state = state;
  c.textContent = text;
}

function connect() {
  const es = new EventSource('/dashboard/stream');
  es.addEventListener('open', () => connState('live', 'live'));
  es.addEventListener('frame', (e) => {
    try { onFrame(JSON.parse(e.data)); } catch (err) { console.error('bad frame', err); }
  });
  es.addEventListener('error', async () => {
    connState('error', 'disconnected, retrying…');
    if (es.readyState !== EventSource.CLOSED) return; // the browser retries itself
    // Closed for good (an HTTP error such as 401 after the login expired, or
    // kvgate restarting): ask the page again; a login form means log in again.
    try {
      const r = await fetch('/dashboard', { credentials: 'same-origin' });
      if (r.status === 401) { location.reload(); return; }
    } catch (_) { /* kvgate is down: keep trying */ }
    setTimeout(connect, 2000);
  });
}

$('logout').addEventListener('click', async () => {
  await fetch('/dashboard/logout', { method: 'POST', credentials: 'same-origin' });
  location.reload();
});
window.addEventListener('resize', drawCharts);
drawCharts();
connect();
