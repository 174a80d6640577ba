"""Check the built site in a real headless browser: ``make docs-check`` runs this after ``make docs``.

Serves site/ on 127.0.0.1 and drives Debian's chromium through its chromedriver with selenium (the standard
WebDriver client: it finds no driver of its own here, it is handed the system one, and its CDP passthrough reads which
fonts chromium really drew a title with). For every page in the site's nav it checks:

- the page answers HTTP 200 and the browser console logs no error (a failed script, stylesheet or image load);
- every <img> is loaded (naturalWidth > 0) and not blank: drawn on a canvas in the page, its pixels vary (std > 2.5
  on 0-255), so a chart that came out empty fails; an executed notebook page with no image at all fails too;
- every link to the site itself resolves (HTTP 200, and a #fragment names an id on the target page);
- no code in a table's first column (the config reference's field names) breaks across lines, and no table or
  printed output sticks out past the content column (they scroll inside their blocks);
- on each notebook page, the Chinese in the title is drawn with real glyphs, not empty boxes ("tofu"): the system has
  a CJK font (fc-list), chromium reports a CJK font among the fonts it drew the title with, and each distinct Chinese
  character of the title draws different pixels (missing glyphs all draw the same box). What it cannot see: whether
  a glyph is the right one, or looks right to a reader.

Writes screenshots (home, a notebook with a chart, the config reference, the top of every notebook page) and
summary.json into docs/measurements/site/, and prints each failure as one line naming the page and what failed; exits 1 if any.

    python -m scripts.docs.check [--site site] [--out docs/measurements/site]
"""
from __future__ import annotations

import argparse
import functools
import http.server
import io
import json
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urldefrag, urljoin, urlparse

from scripts.docs.executed import ROOT

BLANK_STD = 2.5
IMAGES_JS = """
return [...document.querySelectorAll('.md-content img')].map(img => {
  const r = {src: img.currentSrc.slice(0, 60), complete: img.complete, width: img.naturalWidth, std: null, error: null};
  if (!img.complete || img.naturalWidth === 0) return r;
  try {
    const c = document.createElement('canvas');
    c.width = Math.min(img.naturalWidth, 400);
    c.height = Math.max(1, Math.round(img.naturalHeight * c.width / img.naturalWidth));
    const g = c.getContext('2d');
    g.fillStyle = '#fff'; g.fillRect(0, 0, c.width, c.height);
    g.drawImage(img, 0, 0, c.width, c.height);
    const d = g.getImageData(0, 0, c.width, c.height).data;
    let s = 0, s2 = 0, n = 0;
    for (let i = 0; i < d.length; i += 4) { const v = (d[i] + d[i + 1] + d[i + 2]) / 3; s += v; s2 += v * v; n++; }
    r.std = Math.sqrt(Math.max(0, s2 / n - (s / n) ** 2));
  } catch (e) { r.error = String(e); }
  return r;
});
"""
# Each distinct CJK character of the title, drawn alone in the title's font: its ink and a hash of its pixels.
TITLE_JS = """
const h = document.querySelector('.md-content h1');
if (!h) return null;
const family = getComputedStyle(h).fontFamily, rect = h.getBoundingClientRect();
const chars = [...new Set([...h.textContent].filter(ch => /[\\u3400-\\u9fff]/.test(ch)))].slice(0, 8);
const glyphs = chars.map(ch => {
  const c = document.createElement('canvas'); c.width = 64; c.height = 64;
  const g = c.getContext('2d'); g.font = '48px ' + family; g.textBaseline = 'top'; g.fillText(ch, 4, 4);
  const d = g.getImageData(0, 0, 64, 64).data; let ink = 0, hash = 0;
  for (let i = 3; i < d.length; i += 4) { if (d[i] > 0) ink++; hash = (hash * 31 + d[i]) | 0; }
  return {ch, ink, hash};
});
return {text: h.textContent.trim(), width: rect.width, height: rect.height, family, glyphs};
"""


def serve(site: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):   # one line per request would bury the failures
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver):
        raise SystemExit("docs-check: chromium and chromedriver are needed (Debian: apt-get install chromium "
                         "chromium-driver; scripts/install_docs_deps.sh --browser does it as root)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    # --no-sandbox: chromium refuses to start its sandbox as root, which is how CI and the containers run.
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,900",
                "--lang=en-US"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=options, service=Service(executable_path=driver))


def status_of(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, ""


def platform_fonts(driver, selector: str) -> list[dict]:
    """The fonts chromium drew a node's text with (CDP CSS.getPlatformFontsForNode)."""
    driver.execute_cdp_cmd("DOM.enable", {})
    driver.execute_cdp_cmd("CSS.enable", {})
    root = driver.execute_cdp_cmd("DOM.getDocument", {})["root"]["nodeId"]
    node = driver.execute_cdp_cmd("DOM.querySelector", {"nodeId": root, "selector": selector})["nodeId"]
    return driver.execute_cdp_cmd("CSS.getPlatformFontsForNode", {"nodeId": node})["fonts"] if node else []


def check_title(driver, page: str) -> tuple[dict, list[str]]:
    title = driver.execute_script(TITLE_JS)
    if not title or not title["glyphs"]:
        return {"title": title}, [f"{page}: no Chinese in the page's <h1> to check"]
    fails = []
    fonts = platform_fonts(driver, ".md-content h1")
    if title["width"] <= 0 or title["height"] <= 0:
        fails.append(f"{page}: the title has no size ({title['width']}x{title['height']})")
    if not any("CJK" in f["familyName"] or "CJK" in f.get("postScriptName", "") for f in fonts):
        fails.append(f"{page}: the title was drawn without a CJK font: {[f['familyName'] for f in fonts]}")
    glyphs = title["glyphs"]
    if any(g["ink"] == 0 for g in glyphs) or len({g["hash"] for g in glyphs}) < len(glyphs):
        fails.append(f"{page}: Chinese characters {''.join(g['ch'] for g in glyphs)} draw as identical or empty boxes")
    return {"title": title["text"], "width": round(title["width"]), "fonts": fonts,
            "distinct_glyphs": len({g["hash"] for g in glyphs}), "chars": len(glyphs)}, fails


def screenshot(driver, path: Path, scroll_to: str | None = None, scale: float = 0.75, colors: int = 64) -> None:
    """A small PNG: the viewport, scrolled to ``scroll_to`` if given, scaled, reduced to a palette of ``colors``."""
    from PIL import Image

    if scroll_to:
        driver.execute_script("const e = document.querySelector(arguments[0]); if (e) e.scrollIntoView({block: 'center'});",
                              scroll_to)
        time.sleep(0.3)
    image = Image.open(io.BytesIO(driver.get_screenshot_as_png())).convert("RGB")
    image = image.resize((int(image.width * scale), int(image.height * scale)), Image.LANCZOS)
    image.quantize(colors=colors).save(path, optimize=True)


# Code in a table's first column drawn on more than one line (a field name broken in two), and blocks whose content
# sticks out past the page's content column instead of scrolling inside the block.
LAYOUT_JS = """
const broken = [...document.querySelectorAll('.md-typeset table td:first-child code')]
  .filter(c => c.getClientRects().length > 1).map(c => c.textContent);
const column = document.querySelector('.md-content').getBoundingClientRect().right;
// A wide table scrolls inside the theme's wrapper, so the wrapper is what must stay inside the column.
const blocks = [...document.querySelectorAll('.md-typeset table')].map(t => t.closest('.md-typeset__scrollwrap') || t)
  .concat([...document.querySelectorAll('.jp-OutputArea-output pre, .md-typeset pre')]);
const sticking = blocks.filter(e => e.getBoundingClientRect().right > column + 1)
  .map(e => e.tagName + ' ' + (e.textContent || '').slice(0, 40));
return {broken: broken, sticking: sticking};
"""


def check_layout(driver, page: str) -> list[str]:
    """Field names drawn whole, wide tables and printed output scrolling inside their blocks."""
    found = driver.execute_script(LAYOUT_JS)
    fails = [f"{page}: a table's first-column name breaks across lines: {found['broken'][:3]}"] if found["broken"] else []
    if found["sticking"]:
        fails.append(f"{page}: {len(found['sticking'])} tables or printed outputs stick out past the content column, "
                     f"e.g. {found['sticking'][0]!r}")
    return fails


def run_checks(driver, base: str, out: Path) -> dict:
    driver.get(base)
    nav = driver.execute_script("return [...document.querySelectorAll('nav.md-nav--primary a.md-nav__link[href]')]"
                                ".map(a => a.href)")
    # A folder's URL is its index.html (the nav links the home page both ways): each page is checked once.
    urls = [base] + [urldefrag(u)[0] for u in nav if u.startswith(base)]
    pages = list(dict.fromkeys(u + "index.html" if u.endswith("/") else u for u in urls))
    failures, results, targets = [], [], {}
    for url in pages:
        page = "/" + url.removeprefix(base)
        code, _ = status_of(url)
        driver.get_log("browser")               # drop what the previous page left
        driver.get(url)
        errors = [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        images = driver.execute_script(IMAGES_JS)
        hrefs = driver.execute_script("return [...document.querySelectorAll('a[href]')].map(a => a.href)")
        is_notebook = re.match(r"/notebooks/\d\d", page) is not None
        executed = is_notebook and "Not executed" not in driver.find_element("css selector", ".md-content").text
        result = {"page": page, "http": code, "console_errors": errors, "images": len(images),
                  "blank_images": sum(1 for i in images if i["std"] is not None and i["std"] <= BLANK_STD)}
        if code != 200:
            failures.append(f"{page}: HTTP {code}")
        failures += [f"{page}: console error: {m[:200]}" for m in errors]
        for i, img in enumerate(images):
            if not img["complete"] or img["width"] == 0:
                failures.append(f"{page}: image {i + 1} did not load ({img['src']})")
            elif img["error"] or img["std"] is None or img["std"] <= BLANK_STD:
                failures.append(f"{page}: image {i + 1} is blank (pixel std {img['std']}, {img['error'] or 'drawn'})")
        layout = check_layout(driver, page)
        result["layout_ok"] = not layout
        failures += layout
        if executed and not images:
            failures.append(f"{page}: an executed notebook with no chart on its page")
        if is_notebook:
            title, title_fails = check_title(driver, page)
            result.update(notebook="executed" if executed else "not executed", title=title)
            failures += title_fails
        for href in hrefs:
            if href.startswith(base):
                targets.setdefault(href, set()).add(page)
        results.append(result)
    link_failures = check_links(targets)
    return {"pages": results, "links_checked": len(targets), "failures": failures + link_failures}


def check_links(targets: dict[str, set[str]]) -> list[str]:
    """Every internal link answers 200, and its #fragment is an id on the page it leads to."""
    failures, bodies = [], {}
    for href, sources in sorted(targets.items()):
        url, fragment = urldefrag(href)
        if url not in bodies:
            bodies[url] = status_of(url)
        code, body = bodies[url]
        where = ", ".join(sorted(sources)[:3]) + (f" (+{len(sources) - 3} more)" if len(sources) > 3 else "")
        path = urlparse(href).path
        if code != 200:
            failures.append(f"{where}: link to {path} answers HTTP {code}")
        elif fragment and body and not re.search(rf'\bid="{re.escape(fragment)}"', body):
            failures.append(f"{where}: link to {path}#{fragment}: no such anchor on that page")
    return failures


def report(summary: dict) -> str:
    """The results as a page of the site (docs/measurements/site/README.md), written by each run."""
    pages = summary["pages"]
    notebooks = [r for r in pages if "notebook" in r]
    lines = [
        "# The documentation site in a headless browser",
        "",
        f"Checked {summary['checked_at']} by `{summary['command']}` (scripts/docs/check.py) in {summary['browser']}, "
        f"{summary['seconds']} s. Written by that command; `summary.json` beside this page has every page's numbers.",
        "",
        "| what | checked |",
        "| --- | --- |",
        f"| pages of the nav (HTTP 200, no console error) | {len(pages)} |",
        f"| images loaded and not blank | {sum(r['images'] for r in pages)}, on "
        f"{sum(1 for r in pages if r['images'])} pages |",
        f"| notebook pages (executed / not) | {sum(r['notebook'] == 'executed' for r in notebooks)} / "
        f"{sum(r['notebook'] != 'executed' for r in notebooks)} |",
        f"| notebook titles drawn with a CJK font, distinct glyphs | "
        f"{sum(1 for r in notebooks if r['title'].get('distinct_glyphs') == r['title'].get('chars'))} of {len(notebooks)} |",
        f"| names in tables unbroken, tables and printed output inside the content column | "
        f"{sum(1 for r in pages if r.get('layout_ok'))} of {len(pages)} pages |",
        f"| internal links (and #anchors) resolved | {summary['links_checked']} |",
        f"| failures | {len(summary['failures'])} |",
        "",
        *[f"- {f}" for f in summary["failures"]],
        "",
        *[f"![{name}]({name})\n" for name in summary["screenshots"] if "/" not in name],
        "Every notebook page, as a reader first sees it (its heading and the guide's box):",
        "",
        *[f"- [{name.split('/')[-1][:-4]}]({name})" for name in summary["screenshots"] if "/" in name],
    ]
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--site", type=Path, default=ROOT / "site")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "measurements" / "site")
    args = parser.parse_args(argv)
    if not (args.site / "index.html").is_file():
        print(f"docs-check: {args.site}/index.html not found: build the site first (make docs)", file=sys.stderr)
        return 2
    cjk = subprocess.run(["fc-list", ":lang=zh", "family"], capture_output=True, text=True).stdout.split("\n")
    start = time.perf_counter()
    server, base = serve(args.site)
    driver = browser()
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        summary = run_checks(driver, base, args.out)
        notebook = next((r["page"] for r in summary["pages"] if r.get("notebook") == "executed" and r["images"]), None)
        shots = {"home.png": (base, None), "config-reference.png": (urljoin(base, "docs/config.html"), None)}
        if notebook:
            shots["notebook-chart.png"] = (urljoin(base, notebook.lstrip("/")), ".md-content img")
        # Every notebook page as a reader first sees it: its full heading and the guide's box under it.
        for page in (r["page"] for r in summary["pages"] if r.get("notebook")):
            shots[f"notebooks/{Path(page).stem}.png"] = (urljoin(base, page.lstrip("/")), None)
        (args.out / "notebooks").mkdir(exist_ok=True)
        for name, (url, anchor) in shots.items():
            driver.get(url)
            # The notebook pages smaller (19 of them, in the repository): the heading and the box stay legible.
            screenshot(driver, args.out / name, anchor, *((0.6, 32) if name.startswith("notebooks/") else ()))
        version = driver.capabilities.get("browserVersion", "?")
    finally:
        driver.quit()
        server.shutdown()
    if not [f for f in cjk if f.strip()]:
        summary["failures"].insert(0, "system: no CJK font (fc-list :lang=zh is empty; apt-get install fonts-noto-cjk)")
    summary.update(checked_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), browser=f"chromium {version}",
                   seconds=round(time.perf_counter() - start, 1), cjk_fonts=sorted({f.strip() for f in cjk if f.strip()})[:4],
                   screenshots=sorted(shots), command="make docs-check")
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    (args.out / "README.md").write_text(report(summary), encoding="utf-8")
    pages, images = len(summary["pages"]), sum(r["images"] for r in summary["pages"])
    print(f"docs-check: {pages} pages, {images} images, {summary['links_checked']} internal links, "
          f"{summary['seconds']} s in chromium {version}; {len(summary['failures'])} failures")
    for failure in summary["failures"]:
        print(f"FAIL {failure}")
    return 1 if summary["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
