// Hand-drawn SVG line charts for the dashboard: a few series over time, a y
// axis with round ticks, an x axis in seconds before now. Redrawn whole on
// each frame (a few hundred points): simpler than patching, and cheap.

const NS = 'http://www.w3.org/2000/svg';

function el(name, attrs, text) {
  const e = document.createElementNS(NS, name);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

// A "nice" step (1, 2 or 5 × 10^k) giving about `n` ticks up to `max`.
function niceStep(max, n) {
  const raw = max / n;
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  for (const m of [1, 2, 5, 10]) if (m * mag >= raw) return m * mag;
  return 10 * mag;
}

export class LineChart {
  // series: [{ key, cls }]: `key` picks the value out of a history point,
  // `cls` is the CSS class of its line. yMax: a fixed top (100 for %), or
  // null to fit the data. format: tick labels.
  constructor(svg, { series, yMax = null, format = (v) => String(v) }) {
    this.svg = svg;
    this.series = series;
    this.yMax = yMax;
    this.format = format;
  }

  // points: [{ t, ...values }], t in seconds, oldest first; values may be null.
  draw(points, now) {
    const svg = this.svg;
    const w = Math.max(200, svg.clientWidth || 400);
    const h = Math.max(100, svg.clientHeight || 180);
    svg.setAttribute('viewBox', `0 0 ${w} ${h}`);
    svg.replaceChildren();
    const left = 44, right = 10, top = 8, bottom = 20;
    const pw = w - left - right, ph = h - top - bottom;

    let dataMax = 0;
    for (const p of points) for (const s of this.series) {
      const v = p[s.key];
      if (v != null && v > dataMax) dataMax = v;
    }
    const span = Math.min(300, Math.max(60, points.length ? now - points[0].t : 60));
    let top_ = this.yMax ?? (dataMax > 0 ? dataMax * 1.15 : 1);
    const step = niceStep(top_, 4);
    top_ = Math.ceil(top_ / step) * step;
    const x = (t) => left + pw * (1 - (now - t) / span);
    const y = (v) => top + ph * (1 - Math.min(v, top_) / top_);

    for (let v = 0; v <= top_ + step / 2; v += step) {
      svg.append(el('line', { class: 'grid', x1: left, x2: w - right, y1: y(v), y2: y(v) }));
      svg.append(el('text', { class: 'axis-label', x: left - 6, y: y(v) + 4, 'text-anchor': 'end' }, this.format(v)));
    }
    const tStep = span > 120 ? 60 : 15;
    for (let a = 0; a <= span; a += tStep) {
      svg.append(el('text', { class: 'axis-label', x: x(now - a), y: h - 5, 'text-anchor': a === 0 ? 'end' : 'middle' },
        a === 0 ? 'now' : `-${a} s`));
    }
    let drawn = 0;
    for (const s of this.series) {
      // Gaps (null) break the line rather than draw a false zero.
      let d = '', pen = false;
      for (const p of points) {
        const v = p[s.key];
        if (v == null || now - p.t > span) { pen = false; continue; }
        d += `${pen ? 'L' : 'M'}${x(p.t).toFixed(1)},${y(v).toFixed(1)}`;
        pen = true;
        drawn++;
      }
      if (d) svg.append(el('path', { class: `series ${s.cls}`, d, 'data-series': s.key }));
    }
    if (!drawn) {
      svg.append(el('text', { class: 'empty', x: left + pw / 2, y: top + ph / 2, 'text-anchor': 'middle' },
        'no data yet: values appear once requests flow'));
    }
  }
}
