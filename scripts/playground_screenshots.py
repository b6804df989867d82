"""Screenshots of the playground's three parts for the docs (docs/img/playground-*.png).

    python scripts/playground_screenshots.py [--url http://127.0.0.1:8000] [--out docs/img]

Without --url it starts `verispec serve --model default` on port 8799 and stops it after.
It drives Debian's chromium through Playwright (scripts/install.sh installs both).
"""
from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@contextlib.contextmanager
def default_server(port: int = 8799, wait_s: float = 600.0):
    """`verispec serve` for the default model in a child process, until the page answers."""
    import subprocess
    import sys
    import time
    import urllib.request

    url = f"http://127.0.0.1:{port}"
    child = subprocess.Popen([sys.executable, "-m", "verispec.cli", "serve", "--model", "default",
                              "--port", str(port), "--log-level", "warning"])
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                urllib.request.urlopen(url + "/health", timeout=5).read()
                break
            except OSError:
                if child.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("verispec serve did not come up") from None
                time.sleep(2)
        yield url
    finally:
        child.terminate()
        child.wait(timeout=60)


def shoot(url: str, out: Path, chromium: str) -> None:
    from playwright.sync_api import sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.set_default_timeout(300_000)
        page.goto(url + "/playground#live")
        page.wait_for_function("document.querySelectorAll('#proposer option').length > 0")
        page.select_option("#proposer", "ngram")
        page.eval_on_selector("#k", "e => { e.value = 8; e.dispatchEvent(new Event('input')); }")
        page.click("#live-run")
        page.wait_for_selector("#live-out[data-done=true]")
        page.hover("#live-out .tok.recovered >> nth=1")
        page.screenshot(path=str(out / "playground-live.png"), full_page=True)
        page.click("a[data-tab=race]")
        page.click("#race-run")
        page.wait_for_selector("#race-verdict[data-same]")
        page.screenshot(path=str(out / "playground-race.png"), full_page=True)
        page.click("a[data-tab=economics]")
        page.click("button[data-preset=slow]")
        page.wait_for_function("Number(document.getElementById('ro-speedup').dataset.value) < 1")
        page.screenshot(path=str(out / "playground-economics.png"), full_page=True)
        browser.close()
    print(f"wrote {out}/playground-{{live,race,economics}}.png")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a running `verispec serve` (default: serve the default model here)")
    parser.add_argument("--out", default="docs/img", type=Path)
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    args = parser.parse_args()
    if args.url:
        shoot(args.url.rstrip("/"), args.out, args.chromium)
    else:
        with default_server() as url:
            shoot(url, args.out, args.chromium)


if __name__ == "__main__":
    main()
