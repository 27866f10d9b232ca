"""What scrolls sideways on the built docs site at 1280x800, measured in a real browser (headless Chromium).

    mkdocs build --strict -d /tmp/site
    python tools/site_width.py /tmp/site [PAGE.html ...]

Each page (or each one named, relative to the site) is copied with a script that, once it loaded, lists every
code block (`pre > code`), table and table wrapper of the page's content whose `scrollWidth` exceeds its
`clientWidth`: what a reader at 1280 px has to scroll sideways to see. Prints one line per page with any, and
exits 1 if there is one. Needs Debian's `chromium` (`apt-get install chromium`); not part of the test suite,
which checks the code blocks' width without a browser (tests/test_docs.py).
"""

import argparse
import concurrent.futures
import glob
import html
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

WIDTH, HEIGHT = 1280, 800
MEASURE = """<script>
window.addEventListener('load', () => setTimeout(() => {
  const wide = [];
  for (const el of document.querySelectorAll(
      '.md-content pre > code, .md-content .md-typeset__scrollwrap, .md-content table')) {
    if (el.scrollWidth > el.clientWidth + 1) {
      const lines = el.innerText.split('\\n');
      wide.push({element: el.tagName.toLowerCase(), pixels: el.scrollWidth - el.clientWidth,
                 widest: lines.reduce((a, b) => b.length > a.length ? b : a, '').slice(0, 90)});
    }
  }
  const out = document.createElement('pre');
  out.id = 'site-width';
  out.textContent = JSON.stringify(wide);
  document.body.appendChild(out);
}, 500));
</script></body>"""


def measure(path: str) -> list:
    """What scrolls sideways on the page at `path` (a copy with MEASURE in it)."""
    done = subprocess.run(["chromium", "--headless=new", "--no-sandbox", "--disable-gpu",
                           f"--window-size={WIDTH},{HEIGHT}", "--virtual-time-budget=5000", "--dump-dom",
                           "file://" + path], capture_output=True, text=True, timeout=120)
    found = re.search(r'<pre id="site-width">(.*?)</pre>', done.stdout, re.S)
    if not found:
        raise RuntimeError(f"{path}: no measurement; chromium said: {done.stderr[-500:]}")
    return json.loads(html.unescape(found.group(1)))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("site", help="the built site (mkdocs build -d SITE)")
    parser.add_argument("pages", nargs="*", help="pages to measure, relative to the site (default: all)")
    args = parser.parse_args(argv)
    copy = tempfile.mkdtemp(prefix="site-width-")
    try:
        shutil.copytree(args.site, copy, dirs_exist_ok=True)
        pages = sorted(os.path.relpath(p, copy) for p in glob.glob(os.path.join(copy, "**", "*.html"),
                                                                   recursive=True))
        pages = [p for p in pages if not p.startswith(("search/", "assets/")) and (not args.pages or p in args.pages)]
        for page in pages:
            path = os.path.join(copy, page)
            with open(path) as f:
                text = f.read()
            with open(path, "w") as f:
                f.write(text.replace("</body>", MEASURE, 1))
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            results = dict(zip(pages, pool.map(lambda page: measure(os.path.join(copy, page)), pages)))
    finally:
        shutil.rmtree(copy, ignore_errors=True)
    for page, wide in results.items():
        for item in wide:
            print(f"{page}: a {item['element']} {item['pixels']} px too wide: {item['widest']}")
    print(f"{len(pages)} pages measured at {WIDTH}x{HEIGHT}; {sum(map(bool, results.values()))} scroll sideways",
          file=sys.stderr)
    return 1 if any(results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
