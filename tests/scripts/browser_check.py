#!/usr/bin/env python3
"""Loads an HTML file in a real headless Chromium over the DevTools protocol
and reports, as JSON on stdout, what a reader's browser would see:

- console errors, uncaught exceptions and browser log errors;
- every network request the page made (the page's own file:// load included);
- every figure (`[data-figure]`: its path, raw value and shown text);
- every chart (`svg[data-chart]`: its id, the marks declared and drawn);
- the screenshot: size, distinct colours, share of non-white pixels.

usage: browser_check.py PAGE.html SCREENSHOT.png [--width 1400] [--height 1800]
Needs Debian's `chromium` and the Python packages websocket-client and Pillow.
"""
import argparse
import base64
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

import websocket  # websocket-client
from PIL import Image

COLLECT = """JSON.stringify({
  title: document.title,
  figures: [...document.querySelectorAll('[data-figure]')].map(e => ({figure: e.dataset.figure, value: e.dataset.value, text: e.textContent})),
  charts: [...document.querySelectorAll('svg[data-chart]')].map(s => ({chart: s.dataset.chart, declared: Number(s.dataset.marks), drawn: s.querySelectorAll('.mark').length})),
  scripts: document.querySelectorAll('script:not([type="application/json"])').length,
  height: document.documentElement.scrollHeight,
})"""


def browser():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    sys.exit("browser_check: no chromium on PATH (Debian: apt-get install chromium)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("page")
    ap.add_argument("screenshot")
    ap.add_argument("--width", type=int, default=1400)
    ap.add_argument("--height", type=int, default=1800)
    ap.add_argument("--timeout", type=float, default=60.0)
    args = ap.parse_args()
    profile = tempfile.mkdtemp(prefix="inferlog-chromium-")
    proc = subprocess.Popen(
        [browser(), "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
         "--no-default-browser-check", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--hide-scrollbars", "--remote-debugging-port=0", f"--user-data-dir={profile}", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + args.timeout
        port_file = os.path.join(profile, "DevToolsActivePort")
        while not (os.path.exists(port_file) and open(port_file).read().strip()):
            if time.monotonic() > deadline or proc.poll() is not None:
                sys.exit(f"browser_check: chromium did not open its DevTools port (exit {proc.poll()})")
            time.sleep(0.1)
        port = int(open(port_file).read().split()[0])
        targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10))
        page = next(t for t in targets if t.get("type") == "page")
        ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=args.timeout, suppress_origin=True)
        state = {"id": 0, "events": []}

        def call(method, **params):
            state["id"] += 1
            ws.send(json.dumps({"id": state["id"], "method": method, "params": params}))
            while True:
                msg = json.loads(ws.recv())
                if msg.get("id") == state["id"]:
                    if "error" in msg:
                        sys.exit(f"browser_check: {method}: {msg['error']}")
                    return msg.get("result", {})
                state["events"].append(msg)

        for domain in ("Page", "Runtime", "Network", "Log"):
            call(f"{domain}.enable")
        call("Emulation.setDeviceMetricsOverride", width=args.width, height=args.height, deviceScaleFactor=1, mobile=False)
        call("Page.navigate", url="file://" + os.path.abspath(args.page))
        while not any(e.get("method") == "Page.loadEventFired" for e in state["events"]):
            if time.monotonic() > deadline:
                sys.exit("browser_check: the page did not finish loading")
            state["events"].append(json.loads(ws.recv()))
        collected = json.loads(call("Runtime.evaluate", expression=COLLECT, returnByValue=True)["result"]["value"])
        shot = call("Page.captureScreenshot", format="png")
        png = base64.b64decode(shot["data"])
        with open(args.screenshot, "wb") as f:
            f.write(png)
        image = Image.open(io.BytesIO(png)).convert("RGB")
        colours = image.getcolors(maxcolors=1 << 24) or []
        nonwhite = sum(n for n, c in colours if c != (255, 255, 255))
        events = state["events"]
        report = {
            "console_errors": [e["params"] for e in events if e.get("method") == "Runtime.consoleAPICalled" and e["params"].get("type") in ("error", "assert")],
            "exceptions": [e["params"] for e in events if e.get("method") == "Runtime.exceptionThrown"],
            "log_errors": [e["params"]["entry"] for e in events if e.get("method") == "Log.entryAdded" and e["params"]["entry"].get("level") == "error"],
            "requests": [e["params"]["request"]["url"] for e in events if e.get("method") == "Network.requestWillBeSent"],
            "screenshot": {"width": image.width, "height": image.height, "colours": len(colours), "nonwhite_share": nonwhite / (image.width * image.height)},
            **collected,
        }
        ws.close()
        json.dump(report, sys.stdout)
        print()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(profile, ignore_errors=True)


if __name__ == "__main__":
    main()
