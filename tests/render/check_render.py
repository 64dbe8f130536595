"""Check rendered chapters in headless Chromium (run through check_render.sh after `make book`).

For each chapter page, a small probe page served from the same local origin loads the chapter in an
iframe, waits for MathJax to finish, and reports: how many formulas MathJax typeset, how many math
elements are left untypeset, images that failed to load, whether MathJax came from _static, raw TeX
left in the text outside maths and code, code cells or outputs that scroll sideways,
unresolved references ("??"), link texts that lead to two different places (links.py), and the
legibility of figures and tables in a 1400x1000 window (legibility.py): a figure's text must render
at least 11 CSS px tall, a table must fit the text column and no table row may be taller than one
screen.  A screenshot of the first chapter is saved for a human look.  Then every chapter is opened
again in the theme's dark mode (dark_mode.py): figures must be opaque, text must keep its contrast,
and the legibility checks run again; one dark screenshot per chapter goes to _build/render_dark/.
At the end, a table per chapter: figures, smallest rendered figure text, tables, screens.
"""

from __future__ import annotations

import functools
import html
import http.server
import json
import re
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from dark_mode import check_dark
from legibility import MEASURE_JS, MIN_TEXT_PX, SCREEN, from_probe
from links import link_collisions

PROBE = """<!doctype html><html><body><pre id="result">pending</pre>
<iframe id="f" style="width:1400px;height:1000px;border:0"></iframe>
<script>
localStorage.setItem('mode', 'light'); localStorage.setItem('theme', 'light');
const f = document.getElementById('f');
f.src = 'PAGE';
f.addEventListener('load', async () => {
  const w = f.contentWindow, d = f.contentDocument;
  try { if (w.MathJax && w.MathJax.startup) { await w.MathJax.startup.promise; } } catch (e) {}
  const imgs = Array.from(d.querySelectorAll('img'));
  await Promise.all(imgs.map(i => i.complete ? 0 : new Promise(r => { i.onload = i.onerror = r; })));
  const math = Array.from(d.querySelectorAll('.math'));
  const scripts = Array.from(d.querySelectorAll('script[src]')).map(s => s.getAttribute('src'));
  const result = {
    page: w.location.pathname,
    mathjax_loaded: !!(w.MathJax && w.MathJax.version),
    mathjax_version: (w.MathJax && w.MathJax.version) || null,
    mathjax_src: scripts.filter(s => s.includes('mathjax')),
    math_elements: math.length,
    typeset: d.querySelectorAll('mjx-container').length,
    untypeset: math.filter(m => !m.querySelector('mjx-container')).length,
    images: imgs.length,
    broken_images: imgs.filter(i => !(i.naturalWidth > 0)).map(i => i.getAttribute('src')),
    unresolved: (d.body.innerText.match(/\\?\\?/g) || []).length,
    theorems: d.querySelectorAll('.proof, .theorem, div[class*="theorem"]').length,
    raw_tex: RAW_TEX_JS(d),
    // code cells and printed outputs wider than their box (a reader would have to scroll sideways)
    scrolling_code: Array.from(d.querySelectorAll('.bd-article pre'))
      .filter(p => p.scrollWidth > p.clientWidth + 2)
      .map(p => (p.textContent.split('\\n').find(l => l.length > 0) || '').slice(0, 60)),
    legibility: MEASURE_JS(d, w),
  };
  document.getElementById('result').textContent = JSON.stringify(result);
});
</script></body></html>"""

# Text a reader sees outside maths and code that still looks like TeX: a `$`, a control word.
RAW_TEX_FN = r"""function(d) {
  const skip = 'pre, code, script, style, textarea, .math, mjx-container, .highlight, .cell_output';
  const walker = d.createTreeWalker(d.querySelector('.bd-article') || d.body, NodeFilter.SHOW_TEXT);
  const found = [];
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    if (n.parentElement.closest(skip)) continue;
    const m = n.textContent.match(/\$|\\[A-Za-z]{2,}/);
    if (m) found.push(n.textContent.trim().slice(0, 80));
  }
  return found;
}"""
PROBE = PROBE.replace("RAW_TEX_JS", "(" + RAW_TEX_FN + ")").replace("MEASURE_JS", MEASURE_JS)

CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--virtual-time-budget=30000", "--run-all-compositor-stages-before-draw",
]


def serve(root: Path) -> tuple[http.server.ThreadingHTTPServer, int]:
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(Quiet, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


def chromium(args: list[str], profile: str) -> str:
    cmd = ["chromium", *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180).stdout


def main(html_dir: str, only: list[str] | None = None) -> int:
    """Check every chapter page under ``html_dir``/book, or those whose name contains one of
    ``only``."""
    root = Path(html_dir).resolve()
    pages = sorted(p.relative_to(root).as_posix() for p in (root / "book").glob("*.html"))
    pages = [p for p in pages if not only or any(o in p for o in only)]
    if not pages:
        print(f"no chapter pages under {root}/book")
        return 1
    cdn = [p for p in root.rglob("*.html") if re.search(r"cdn\.jsdelivr|cdnjs|unpkg\.com", p.read_text())]
    server, port = serve(root)
    failures, summaries = [], {}
    with tempfile.TemporaryDirectory() as profile:
        for i, page in enumerate(pages):
            # One probe file per page: a browser that cached an earlier probe would measure the
            # earlier page again (seen once: the bibliography measured in place of a chapter).
            probe = root / f"_render_probe_{i}.html"
            probe.write_text(PROBE.replace("PAGE", "/" + page))
            dom = chromium(["--dump-dom", f"http://127.0.0.1:{port}/{probe.name}"], profile)
            probe.unlink()
            match = re.search(r'<pre id="result">(.*?)</pre>', dom, re.S)
            raw = match.group(1) if match else "no result"
            try:
                res = json.loads(html.unescape(raw))
            except json.JSONDecodeError:
                failures.append(f"{page}: probe did not finish ({raw[:80]})")
                continue
            problems = []
            if res.get("page") != "/" + page:
                problems.append(f"the probe measured {res.get('page')} instead of /{page}")
            if res["math_elements"] and not res["mathjax_loaded"]:
                problems.append("MathJax did not load")
            if res["math_elements"] and (not res["mathjax_src"] or not all("_static/mathjax" in s for s in res["mathjax_src"])):
                problems.append(f"MathJax not served from _static: {res['mathjax_src']}")
            if res["untypeset"]:
                problems.append(f"{res['untypeset']} math elements not typeset")
            if res["broken_images"]:
                problems.append(f"broken images {res['broken_images']}")
            if res["raw_tex"]:
                problems.append(f"{len(res['raw_tex'])} pieces of raw TeX in the text: "
                                f"{res['raw_tex'][:3]}")
            if res["scrolling_code"]:
                problems.append(f"{len(res['scrolling_code'])} horizontally scrolling code blocks: "
                                f"{res['scrolling_code'][:3]}")
            if res["unresolved"]:
                problems.append(f"{res['unresolved']} unresolved '??' references")
            problems += link_collisions((root / page).read_text(), page)
            legible = from_probe(res["legibility"], root)
            problems += legible.problems()
            summaries[page] = legible.summary()
            status = "ok " if not problems else "BAD"
            print(f"{status} {page}: {res['typeset']} formulas typeset (MathJax {res['mathjax_version']}), "
                  f"{res['images']} images, {res['theorems']} theorem/proof boxes; {legible.summary()}"
                  + ("" if not problems else " -- " + "; ".join(problems)))
            failures += [f"{page}: {p}" for p in problems]
        probe.unlink(missing_ok=True)
        shot = root.parent / "render_check.png"
        chromium(["--window-size=1200,1600", f"--screenshot={shot}",
                  f"http://127.0.0.1:{port}/{pages[0]}"], profile)
        print(f"screenshot of {pages[0]}: {shot}")
    # A profile of its own: the dark mode is kept in the profile's localStorage.
    with tempfile.TemporaryDirectory() as profile:
        failures += check_dark(root, port, pages, chromium, profile, root.parent / "render_dark")
    server.shutdown()
    print(f"legibility at {SCREEN[0]}x{SCREEN[1]} (light): figures, smallest rendered figure text "
          f"(fails below {MIN_TEXT_PX:g} px), tables, screens")
    for page, summary in summaries.items():
        print(f"  {Path(page).stem:28s} {summary}")
    if cdn:
        failures.append(f"pages referring to a CDN: {[str(p) for p in cdn[:5]]}")
    print("render check:", "FAILED" if failures else "passed", f"({len(pages)} pages)")
    for f in failures:
        print("  -", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "_build/html", sys.argv[2:]))
