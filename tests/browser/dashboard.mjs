// Browser test of kvgate's dashboard (issue 10), run by scripts/browser-test.sh.
//
// Starts `kvgate serve` with its embedded simulated replicas and an admin
// key, sends chat traffic with shared prefixes, checks that the page and its
// stream refuse every request without the key, logs in through the form in
// headless Chromium, and checks that the replica cards, the charts and the
// decision stream show live values that change. Saves screenshots.
//
//   node dashboard.mjs --bin PATH [--out DIR] [--docs DIR]
//
// --docs also writes the screenshots docs/operators.md shows (after a
// longer run, so that the charts have history).

import { spawn } from 'node:child_process';
import { createInterface } from 'node:readline';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { chromium } from 'playwright-core';

const args = Object.fromEntries(
  process.argv.slice(2).reduce((acc, a, i, all) => (a.startsWith('--') ? [...acc, [a.slice(2), all[i + 1]]] : acc), []),
);
const BIN = args.bin;
const OUT = args.out ?? '.cache/artifacts';
const DOCS = args.docs;
const KEY = 'dashboard-test-admin-key';
const CHROMIUM = process.env.CHROMIUM ?? '/usr/bin/chromium';
if (!BIN) throw new Error('--bin PATH_TO_KVGATE is required');

const t0 = Date.now();
const log = (m) => console.log(`[${((Date.now() - t0) / 1000).toFixed(1)}s] ${m}`);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
let failures = 0;
function check(ok, what) {
  if (ok) {
    log(`ok   ${what}`);
  } else {
    failures += 1;
    log(`FAIL ${what}`);
  }
}

// ---- kvgate serve ----
async function startKvgate() {
  const proc = spawn(BIN, [
    'serve', '--listen', '127.0.0.1:0', '--admin-listen', '127.0.0.1:0', '--admin-key', KEY,
    '--log', 'warn', '--set', 'dashboard.interval_ms=500',
  ], { stdio: ['ignore', 'pipe', 'inherit'], env: { ...process.env, RUST_LOG: 'warn' } });
  const first = await new Promise((resolve, reject) => {
    const rl = createInterface({ input: proc.stdout });
    rl.once('line', resolve);
    proc.once('exit', (c) => reject(new Error(`kvgate exited with ${c} before serving`)));
  });
  // "kvgate serving on http://A (admin: http://B) with N replicas"
  const m = /serving on (\S+) \(admin: (\S+)\)/.exec(first);
  if (!m) throw new Error(`unexpected first line from kvgate: ${first}`);
  const [, base, admin] = m;
  for (let i = 0; ; i++) {
    const ok = await fetch(`${base}/ready`).then((r) => r.ok, () => false);
    if (ok) break;
    if (i > 300) throw new Error('kvgate never became ready');
    await sleep(100);
  }
  return { proc, base, admin };
}

// ---- traffic: conversations that share a long system prompt and grow ----
function words(seed, n) {
  const vocab = ['cache', 'block', 'prefix', 'replica', 'token', 'route', 'engine', 'tier', 'event',
    'latency', 'queue', 'batch', 'decode', 'prefill', 'memory', 'fleet', 'window', 'stream'];
  let x = seed >>> 0 || 1;
  const out = [];
  for (let i = 0; i < n; i++) {
    x ^= x << 13; x ^= x >>> 17; x ^= x << 5; x >>>= 0;
    out.push(vocab[x % vocab.length]);
  }
  return out.join(' ');
}

const traffic = { ok: 0, failed: 0, stop: false };
async function conversationWorker(base, id) {
  const system = { role: 'system', content: `You are assistant ${id % 3}. ${words(1000 + (id % 3), 700)}` };
  for (let conv = 0; !traffic.stop; conv++) {
    const messages = [system];
    for (let turn = 0; turn < 5 && !traffic.stop; turn++) {
      messages.push({ role: 'user', content: words(id * 7919 + conv * 31 + turn, 60) });
      try {
        const r = await fetch(`${base}/v1/chat/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          // Streamed: the gateway times first tokens (the TTFT chart) on streams.
          body: JSON.stringify({ model: 'Qwen/Qwen3-0.6B', messages, max_tokens: 12, stream: true }),
        });
        const body = await r.text();
        if (!r.ok || !body.includes('[DONE]')) throw new Error(`HTTP ${r.status}`);
        traffic.ok += 1;
        messages.push({ role: 'assistant', content: words(turn, 10) });
      } catch (e) {
        traffic.failed += 1;
        await sleep(200);
      }
    }
  }
}

// ---- the key is enforced on the page and its stream ----
async function status(url, init = {}) {
  const ctl = new AbortController();
  const r = await fetch(url, { ...init, signal: ctl.signal, redirect: 'manual' });
  const text = url.endsWith('/stream') && r.ok ? '' : await r.text();
  ctl.abort();
  return { status: r.status, text, cookie: r.headers.get('set-cookie') };
}

async function negativeChecks(admin) {
  const page = `${admin}/dashboard`;
  const stream = `${admin}/dashboard/stream`;
  let r = await status(page);
  check(r.status === 401 && r.text.includes('login-form') && !r.text.includes('decision-stream'),
    `GET /dashboard without the key: 401 with the login form and no dashboard (got ${r.status})`);
  r = await status(stream);
  check(r.status === 401, `GET /dashboard/stream without the key: 401 (got ${r.status})`);
  for (const [what, headers] of [
    ['a wrong x-kvgate-admin-key', { 'x-kvgate-admin-key': 'not-the-admin-key' }],
    ['a wrong bearer key', { authorization: 'Bearer not-the-admin-key' }],
    ['a forged cookie', { cookie: 'kvgate_dashboard=1700000000.' + '0'.repeat(64) }],
    ['the key as a cookie value', { cookie: `kvgate_dashboard=${KEY}` }],
  ]) {
    for (const url of [page, stream]) {
      r = await status(url, { headers });
      check(r.status === 401, `${url.replace(admin, '')} with ${what}: 401 (got ${r.status})`);
    }
  }
  r = await status(`${page}?key=${KEY}`);
  check(r.status === 401, `the key in the URL is not accepted (got ${r.status})`);
  r = await status(`${admin}/dashboard/login`, { method: 'POST', headers: { 'x-kvgate-admin-key': 'wrong-key-123' } });
  check(r.status === 401 && !r.cookie, `POST /dashboard/login with a wrong key: 401, no cookie (got ${r.status})`);
  r = await status(`${admin}/dashboard/login`, { method: 'POST', headers: { 'x-kvgate-admin-key': KEY } });
  const cookie = (r.cookie ?? '').split(';')[0];
  check(r.status === 204 && /HttpOnly/i.test(r.cookie ?? '') && /SameSite=Strict/i.test(r.cookie ?? ''),
    `POST /dashboard/login with the key: 204 and an HttpOnly, SameSite=Strict cookie (got ${r.status} ${r.cookie})`);
  check(!cookie.includes(KEY), 'the cookie does not hold the key');
  r = await status(stream, { headers: { cookie } });
  check(r.status === 200, `the login cookie opens the stream (got ${r.status})`);
  r = await status(`${admin}/admin/replicas`, { headers: { cookie } });
  check(r.status === 401, `the login cookie does not open /admin/* (got ${r.status})`);
  r = await status(page, { headers: { 'x-kvgate-admin-key': KEY } });
  check(r.status === 200 && r.text.includes('decision-stream'), `GET /dashboard with the key header: 200 (got ${r.status})`);
}

// ---- what the page shows ----
async function pageState(page) {
  return page.evaluate(() => {
    const q = (s) => document.querySelector(s);
    const cards = [...document.querySelectorAll('[data-replica-card]')];
    const rows = [...document.querySelectorAll('#decision-stream tbody tr[data-decision]')];
    return {
      frames: Number(document.body.dataset.frames),
      cards: cards.map((c) => ({
        name: c.dataset.replica,
        health: c.dataset.health,
        gpu: c.querySelector('[data-field="kv-gpu"]').textContent,
        pending: c.querySelector('[data-field="pending_prefill_tokens"]').textContent,
        rps: c.querySelector('[data-field="requests_per_s"]').textContent,
      })),
      hitPaths: [...document.querySelectorAll('#hit-rate-chart path')].map((p) => [p.dataset.series, p.getAttribute('d')]),
      ttftPaths: [...document.querySelectorAll('#ttft-chart path')].map((p) => p.dataset.series),
      rpsText: q('#fleet-rps').textContent,
      predicted: q('#fleet-predicted-hit').textContent,
      poolsHidden: q('#pools').hidden,
      poolLabels: cards.map((c) => c.querySelector('[data-field="pool"]').textContent),
      decisions: rows.map((r) => ({ booking: r.dataset.booking, text: r.textContent })),
    };
  });
}

async function browserChecks(admin) {
  const browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: ['--no-sandbox', '--disable-dev-shm-usage'],
  });
  try {
    const context = await browser.newContext({ viewport: { width: 1440, height: 900 } });
    const page = await context.newPage();
    const first = await page.goto(`${admin}/dashboard`);
    check(first.status() === 401 && (await page.locator('#login-form').count()) === 1,
      'the browser gets the login form first');
    if (DOCS) await page.screenshot({ path: join(DOCS, 'dashboard-login.png') });
    await page.fill('#admin-key', 'not-the-admin-key');
    await page.click('#login-form button');
    await page.locator('#login-error').waitFor({ state: 'visible', timeout: 5000 });
    check(/wrong/i.test(await page.textContent('#login-error')), 'a wrong key is refused in the form');
    await page.fill('#admin-key', KEY);
    await page.click('#login-form button');
    await page.locator('[data-replica-card]').first().waitFor({ timeout: 15000 });
    check(true, 'logging in with the key shows the dashboard');
    const cookies = await context.cookies();
    check(cookies.some((c) => c.name === 'kvgate_dashboard' && c.httpOnly && c.sameSite === 'Strict'),
      'the browser holds an HttpOnly, SameSite=Strict login cookie');
    check(!page.url().includes(KEY), 'the key never appears in the URL');
    // From here on the page must run clean (before, the 401s of the login
    // form and of the wrong key are logged by the browser, as they should be).
    const errors = [];
    page.on('pageerror', (e) => errors.push(e.message));
    page.on('console', (m) => { if (m.type() === 'error') errors.push(m.text()); });

    // Let the charts gather a few points, then compare two moments.
    await page.waitForFunction(() => Number(document.body.dataset.frames) >= 6, null, { timeout: 20000 });
    const a = await pageState(page);
    await sleep(DOCS ? 3000 : 4000);
    const b = await pageState(page);
    log(`page: ${b.frames} frames, ${b.cards.length} cards, ${b.decisions.length} decisions, ${b.rpsText}, predicted hit ${b.predicted}`);
    check(b.cards.length === 4, `four replica cards (got ${b.cards.length})`);
    check(b.cards.every((c) => c.health === 'healthy'), 'every replica healthy');
    check(b.poolsHidden && b.poolLabels.every((t) => t === ''), 'one model: no pool table, no pool labels');
    check(b.cards.some((c) => /^[1-9][\d,]* \/ [\d,]+ blocks/.test(c.gpu)), `GPU KV occupancy shown (${b.cards[0]?.gpu})`);
    check(b.frames > a.frames, `frames keep arriving (${a.frames} → ${b.frames})`);
    check(/req\/s$/.test(b.rpsText) && !/^0(\.0)? /.test(b.rpsText), `requests/s is live (${b.rpsText})`);
    check(b.hitPaths.some(([s]) => s === 'predicted'), 'the hit-rate chart draws the predicted series');
    check(JSON.stringify(a.hitPaths) !== JSON.stringify(b.hitPaths), 'the hit-rate chart changes over time');
    check(b.ttftPaths.includes('p50') && b.ttftPaths.includes('p90'), 'the TTFT chart draws p50 and p90');
    check(b.decisions.length > 0 && b.decisions[0].booking !== undefined, 'the decision stream lists decisions');
    check(a.decisions[0]?.booking !== b.decisions[0]?.booking, `new decisions arrive (${a.decisions[0]?.booking} → ${b.decisions[0]?.booking})`);
    check(/lowest predicted TTFT|near-equal|softmax/.test(b.decisions[0]?.text ?? ''), 'each decision says why the winner won');
    check(JSON.stringify(a.cards) !== JSON.stringify(b.cards), 'replica cards change over time');
    check(errors.length === 0, `no script errors on the page ${errors.length ? JSON.stringify(errors) : ''}`);

    mkdirSync(OUT, { recursive: true });
    await page.screenshot({ path: join(OUT, 'dashboard.png'), fullPage: true });
    log(`screenshot: ${join(OUT, 'dashboard.png')}`);
    if (DOCS) {
      // Longer history for the documentation's pictures.
      await sleep(20000);
      // What a laptop screen shows at once, and the parts up close (the
      // decision table cut to its first rows, to keep the files small).
      await page.screenshot({ path: join(DOCS, 'dashboard.png') });
      await page.locator('.charts').screenshot({ path: join(DOCS, 'dashboard-charts.png') });
      await page.locator('[data-replica-card]').first().screenshot({ path: join(DOCS, 'dashboard-replica.png') });
      const table = await page.locator('#decision-stream').boundingBox();
      await page.screenshot({
        path: join(DOCS, 'dashboard-decisions.png'),
        fullPage: true,
        clip: { x: table.x, y: table.y, width: table.width, height: Math.min(table.height, 330) },
      });
      log(`documentation screenshots in ${DOCS}`);
    }
    // Logging out ends the session in this browser.
    await page.click('#logout');
    await page.locator('#login-form').waitFor({ timeout: 10000 });
    check(true, 'logging out returns to the login form');
  } finally {
    await browser.close();
  }
}

const kv = await startKvgate();
let workers = [];
try {
  log(`kvgate on ${kv.base}, admin ${kv.admin}`);
  await negativeChecks(kv.admin);
  workers = Array.from({ length: 6 }, (_, i) => conversationWorker(kv.base, i));
  await browserChecks(kv.admin);
  log(`traffic: ${traffic.ok} requests answered, ${traffic.failed} failed`);
  check(traffic.ok > 0 && traffic.failed === 0, 'the traffic was served');
} catch (e) {
  failures += 1;
  log(`FAIL ${e.stack ?? e}`);
} finally {
  traffic.stop = true;
  kv.proc.kill('SIGKILL');
  await Promise.race([Promise.allSettled(workers), sleep(2000)]);
}
log(failures ? `${failures} check(s) failed` : 'all dashboard checks passed');
process.exit(failures ? 1 : 0);
