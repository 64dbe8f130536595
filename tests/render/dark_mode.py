"""Dark-mode part of the render check (called by check_render.py after `make book`).

Each chapter is opened in headless Chromium with the theme's dark mode switched on the way the
theme's own switcher does it (``localStorage`` ``mode`` and ``theme`` = ``dark``, which the page's
head script copies onto ``<html data-theme>``).  A probe page on the same origin loads the chapter
in an iframe and, after MathJax and the images are done, measures what a reader would see:

* every figure is drawn onto a canvas and its alpha channel read: a figure must be opaque (all
  alpha 255), since transparent pixels show the page behind them, which is dark in dark mode;
* every visible piece of text in the article (prose, tables, code cells, their outputs, maths) gets
  the WCAG contrast ratio between its computed colour and the background it actually sits on (the
  computed background colours of its ancestors, composited); text below ``MIN_CONTRAST`` (large
  text: ``MIN_CONTRAST_LARGE``) is unreadable and fails the check.

The legibility checks of legibility.py (figure text at least 11 CSS px, tables within the text
column, no row taller than a screen) run again on the dark page.

The chapter is then scrolled to its first figure (or table) and screenshotted into
``_build/render_dark/`` for a human look.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Callable

from legibility import MEASURE_JS, SCREEN, from_probe

MIN_CONTRAST = 4.5        # WCAG 2 level AA, normal text
MIN_CONTRAST_LARGE = 3.0  # WCAG 2 level AA, text >= 24 px or bold >= 18.66 px
WINDOW = SCREEN

DARK_PROBE = r"""<!doctype html><html><head><style>
body { margin: 0 }
#f { position: absolute; top: 0; left: 0; width: WIDTHpx; height: HEIGHTpx; border: 0 }
#result { position: absolute; top: HEIGHTpx }
</style></head><body><iframe id="f"></iframe><pre id="result">pending</pre>
<script>
localStorage.setItem('mode', 'dark'); localStorage.setItem('theme', 'dark');
const MIN = MIN_CONTRAST, MIN_LARGE = MIN_CONTRAST_LARGE;
const f = document.getElementById('f');
f.src = 'PAGE';
f.addEventListener('load', async () => {
  const w = f.contentWindow, d = f.contentDocument;
  try { if (w.MathJax && w.MathJax.startup) { await w.MathJax.startup.promise; } } catch (e) {}
  const article = d.querySelector('.bd-article') || d.body;
  const imgs = Array.from(article.querySelectorAll('img'));
  await Promise.all(imgs.map(i => i.complete ? 0
                              : new Promise(r => { i.onload = i.onerror = r; })));
  // Colours: computed styles come as rgb()/rgba(), or color(srgb r g b / a) with 0..1 channels.
  const parse = s => {
    let p = (s.match(/-?[\d.]+(?:e-?\d+)?/g) || []).map(Number);
    if (s.startsWith('color(srgb')) p = [p[0] * 255, p[1] * 255, p[2] * 255].concat(p.slice(3));
    else if (!s.startsWith('rgb')) return null;
    return p.length < 3 ? null : [p[0], p[1], p[2], p.length > 3 ? p[3] : 1];
  };
  const over = (t, b) => [0, 1, 2].map(i => t[i] * t[3] + b[i] * (1 - t[3])).concat([1]);
  const background = el => {
    const layers = [];
    for (let e = el; e; e = e.parentElement) {
      const c = parse(w.getComputedStyle(e).backgroundColor);
      if (c && c[3] > 0) { layers.push(c); if (c[3] >= 1) break; }
    }
    let acc = [255, 255, 255, 1];
    for (let i = layers.length - 1; i >= 0; i--) acc = over(layers[i], acc);
    return acc;
  };
  const lum = c => {
    const g = v => {
      v /= 255;
      return v <= 0.04045 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4);
    };
    return 0.2126 * g(c[0]) + 0.7152 * g(c[1]) + 0.0722 * g(c[2]);
  };
  const ratio = (a, b) => {
    const x = lum(a), y = lum(b);
    return (Math.max(x, y) + 0.05) / (Math.min(x, y) + 0.05);
  };
  const kind = e => e.closest('mjx-container') ? 'maths'
    : e.closest('table') ? 'table'
    : e.closest('.cell_output, .output') ? 'output'
    : e.closest('.cell_input, pre, code') ? 'code' : 'text';
  const rgb = c => c.slice(0, 3).map(Math.round);
  const describe = e => e.tagName.toLowerCase()
    + (typeof e.className === 'string' && e.className ? '.' + e.className.split(' ')[0] : '');

  const els = new Set();
  const walker = d.createTreeWalker(article, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    if (!n.textContent.trim()) continue;
    const e = n.parentElement;
    if (e.closest('mjx-assistive-mml, script, style, .visually-hidden, .sr-only')) continue;
    els.add(e);
  }
  article.querySelectorAll('mjx-container').forEach(m => els.add(m));
  const stats = {}, bad = {};
  let unparsed = 0;
  for (const e of els) {
    if (!e.checkVisibility({checkOpacity: true, checkVisibilityCSS: true})) continue;
    if (!e.getClientRects().length) continue;
    const cs = w.getComputedStyle(e);
    const fg0 = parse(cs.color);
    if (!fg0) { unparsed++; continue; }
    const bg = background(e), fg = over(fg0, bg), r = ratio(fg, bg);
    const size = parseFloat(cs.fontSize), bold = parseInt(cs.fontWeight, 10) >= 700;
    const need = (size >= 24 || (bold && size >= 18.66)) ? MIN_LARGE : MIN;
    const k = kind(e);
    stats[k] = stats[k] || {n: 0, min: 1e9};
    stats[k].n++;
    if (r < stats[k].min) {
      stats[k].min = r;
      stats[k].at = (e.textContent || '').trim().slice(0, 30);
    }
    if (r < need) {
      const key = k + ' ' + rgb(fg) + ' on ' + rgb(bg);
      bad[key] = bad[key] || {kind: k, ratio: r, need: need, count: 0, color: rgb(fg),
        background: rgb(bg), element: describe(e),
        example: (e.textContent || '').trim().slice(0, 60)};
      bad[key].count++;
    }
  }
  const figures = imgs.filter(i => i.naturalWidth > 0).map(i => {
    const c = d.createElement('canvas');
    c.width = i.naturalWidth; c.height = i.naturalHeight;
    const g = c.getContext('2d');
    g.drawImage(i, 0, 0);
    let data;
    try { data = g.getImageData(0, 0, c.width, c.height).data; }
    catch (err) { return {src: i.getAttribute('src'), error: String(err)}; }
    let transparent = 0;
    for (let k = 3; k < data.length; k += 4) if (data[k] < 255) transparent++;
    const behind = background(i);
    return {src: i.getAttribute('src'), pixels: c.width * c.height, transparent: transparent,
            behind: behind.slice(0, 3).map(Math.round), behind_luminance: lum(behind)};
  });
  const target = article.querySelector('.cell_output img, img, table');
  // Scroll this frame only (scrollIntoView would also scroll the probe page).
  if (target) w.scrollTo(0, target.getBoundingClientRect().top + w.scrollY - 80);
  document.getElementById('result').textContent = JSON.stringify({
    page: w.location.pathname,
    theme: d.documentElement.dataset.theme || null,
    page_background: background(d.body).slice(0, 3).map(Math.round),
    stats: stats, bad: Object.values(bad), unparsed: unparsed, figures: figures,
    shown: target ? target.tagName.toLowerCase() : 'top',
    legibility: MEASURE_JS(d, w),
  });
});
</script></body></html>"""


def probe_html(page: str) -> str:
    """The dark-mode probe for the chapter at server path ``page``."""
    return (DARK_PROBE.replace("WIDTH", str(WINDOW[0])).replace("HEIGHT", str(WINDOW[1]))
            .replace("MIN_CONTRAST_LARGE", str(MIN_CONTRAST_LARGE))
            .replace("MIN_CONTRAST", str(MIN_CONTRAST)).replace("PAGE", page)
            .replace("MEASURE_JS", MEASURE_JS))


def problems_of(res: dict) -> list[str]:
    """What makes the chapter unreadable in dark mode, from the probe's result."""
    problems = []
    if res.get("theme") != "dark":
        problems.append(f"dark mode not applied (data-theme={res.get('theme')!r})")
    for fig in res["figures"]:
        if "error" in fig:
            problems.append(f"figure {fig['src']} could not be read: {fig['error']}")
        elif fig["transparent"]:
            share = fig["transparent"] / fig["pixels"]
            problems.append(f"figure {fig['src']} is not opaque: {share:.1%} of its pixels are "
                            f"transparent and show the background rgb{tuple(fig['behind'])}")
    if res["unparsed"]:
        problems.append(f"{res['unparsed']} text element(s) with a colour the check cannot read")
    for bad in sorted(res["bad"], key=lambda b: b["ratio"]):
        problems.append(f"{bad['count']} {bad['kind']} element(s) with contrast "
                        f"{bad['ratio']:.2f} < {bad['need']} (rgb{tuple(bad['color'])} on "
                        f"rgb{tuple(bad['background'])}, {bad['element']}: {bad['example']!r})")
    return problems


def check_dark(root: Path, port: int, pages: list[str], chromium: Callable[[list[str], str], str],
               profile: str, shots: Path) -> list[str]:
    """Open every chapter in dark mode; return the failures and save one screenshot per chapter."""
    shots.mkdir(parents=True, exist_ok=True)
    failures = []
    probe = root / "_render_probe_dark.html"
    try:
        for i, page in enumerate(pages):
            # A new probe name per page, so that no cached probe measures an earlier page again.
            probe.unlink(missing_ok=True)
            probe = root / f"_render_probe_dark_{i}.html"
            probe.write_text(probe_html("/" + page))
            shot = shots / (Path(page).stem + ".png")
            dom = chromium(["--dump-dom", f"--screenshot={shot}",
                            f"--window-size={WINDOW[0]},{WINDOW[1]}",
                            f"http://127.0.0.1:{port}/{probe.name}"], profile)
            match = re.search(r'<pre id="result">(.*?)</pre>', dom, re.S)
            raw = match.group(1) if match else "no result"
            try:
                res = json.loads(html.unescape(raw))
            except json.JSONDecodeError:
                failures.append(f"{page} (dark): probe did not finish ({raw[:80]})")
                continue
            problems = problems_of(res)
            if res.get("page") != "/" + page:
                problems.append(f"the probe measured {res.get('page')} instead of /{page}")
            legible = from_probe(res["legibility"], root)
            problems += legible.problems()
            opaque = sum(1 for f in res["figures"] if f.get("transparent") == 0)
            contrast = ", ".join(f"{kind} {v['min']:.2f} ({v['n']})"
                                 for kind, v in sorted(res["stats"].items()))
            print(f"{'ok ' if not problems else 'BAD'} {page} (dark): "
                  f"{opaque}/{len(res['figures'])} figures opaque; lowest contrast per kind "
                  f"(elements): {contrast}; {legible.summary()}; screenshot at {res['shown']}"
                  + ("" if not problems else " -- " + "; ".join(problems)))
            failures += [f"{page} (dark): {p}" for p in problems]
    finally:
        probe.unlink(missing_ok=True)
    print(f"dark-mode screenshots: {shots}")
    return failures
