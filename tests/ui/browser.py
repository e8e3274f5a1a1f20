#!/usr/bin/env python3
"""The service map (/ui/) in headless Chromium against two real agents on loopback.

  python3 tests/ui/browser.py ROSTER_BINARY [--screenshots DIR]

Starts agents a and b on free loopback ports (stopped by pid at the end), drives the page
on a with Selenium, and checks what issue 32 asks: the page lists what the CLI registered
on b; a new registration appears without a reload; a failing health check turns an
instance critical; maintenance switched on from the page is seen by `roster get --all`; a
restart of a shows "reconnecting" and then the same data; the console has no errors; the
members show their lease and when a synced with each; an instance's read answered late
does not hide a change; light and dark follow the system with readable contrast; every main
view fits a phone's width. With --screenshots it saves the main views there, at a phone's
width and dark too (docs/guide/ui.md shows them).

It asserts behaviour, never durations: every wait is a generous deadline for something to
appear. Exit 0 when every check passed; the first failure is printed and exits 1.
"""

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.common.exceptions import (NoSuchElementException, StaleElementReferenceException,
                                        TimeoutException)
from selenium.webdriver.support.ui import WebDriverWait

# Generous: a loaded CI machine must not fail a check that is only slow.
DEADLINE_S = 15


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Agent:
    """A `roster agent` on fixed loopback ports (so a restart keeps its URLs)."""

    def __init__(self, binary, root, name, join=None):
        self.binary, self.name = binary, name
        self.dir = os.path.join(root, name)
        self.port, self.http_port = free_port(), free_port()
        self.url = f"ws://127.0.0.1:{self.port}"
        self.http = f"http://127.0.0.1:{self.http_port}"
        self.join = join
        self.proc = None
        self.start()

    def start(self):
        args = [self.binary, "agent", "--listen", f"127.0.0.1:{self.port}",
                "--http-listen", f"127.0.0.1:{self.http_port}", "--node-name", self.name,
                "--gossip-interval", "100ms", "--lease-ttl", "3s", "--data-dir", self.dir]
        if self.join:
            args += ["--join", self.join]
        env = dict(os.environ, ROSTER_LOG="warn")
        env.pop("ROSTER_AGENT", None)
        log = open(self.dir + ".log", "ab")
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, env=env, text=True)
        for line in self.proc.stdout:
            if line.startswith("HTTP API on "):
                return
        raise SystemExit(f"agent {self.name} exited before it served HTTP; see {self.dir}.log")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=10)

    def roster(self, *args):
        out = subprocess.run([self.binary, *args, "--agent", self.url], capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit(f"roster {' '.join(args)} failed: {out.stderr.strip()}")
        return out.stdout


def browser():
    opts = webdriver.ChromeOptions()
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,900"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    chromium = "/usr/bin/chromium"
    if os.path.exists(chromium):
        opts.binary_location = chromium
    # Selenium 4.8 (Debian 12's) names it here; later versions also as webdriver.ChromeService.
    from selenium.webdriver.chrome.service import Service
    service = Service("/usr/bin/chromedriver") if os.path.exists("/usr/bin/chromedriver") else Service()
    return webdriver.Chrome(options=opts, service=service)


# What a check may meet while the page redraws: an element not there yet, or replaced
# between finding it and reading it. Not yet, not a failure: the check is asked again.
REDRAWN = (NoSuchElementException, StaleElementReferenceException)


def wait(driver, what, pred):
    """`pred(driver)` once it is true, asked every 20 ms. Fails only at the deadline: an
    element replaced under a check (the page redrew it) is asked again, not taken as the
    check's failure."""
    try:
        return WebDriverWait(driver, DEADLINE_S, poll_frequency=0.02,
                             ignored_exceptions=REDRAWN).until(lambda d: pred(d))
    except TimeoutException:
        try:
            page = driver.find_element(By.TAG_NAME, "body").text
        except Exception:
            page = "(unreadable)"
        raise SystemExit(f"FAILED: {what} (not within {DEADLINE_S} s); the page shows:\n{page}") from None


def text(driver):
    return driver.find_element(By.TAG_NAME, "main").text


def console_errors(driver, allowed=()):
    bad = []
    for e in driver.get_log("browser"):
        if e["level"] == "SEVERE" and not any(a in e["message"] for a in allowed):
            bad.append(e["message"])
    return bad


def confirm(driver):
    ok = wait(driver, "the confirmation dialog opens", lambda d: d.find_element(By.ID, "ask-ok"))
    wait(driver, "the dialog is shown", lambda d: ok.is_displayed())
    ok.click()


# Holds the answer to the page's read of one instance (GET .../instances/ID) until the test
# calls window.releaseRead(), and counts the event streams the page opens: the test makes
# the read's answer arrive late, after a change, as a loaded machine may.
HOLD_READ = """
    const plain = window.fetch.bind(window);
    window.streams = 0;
    window.fetch = async (url, opts = {}) => {
        const r = await plain(url, opts);
        if ((opts.headers || {}).Accept === 'text/event-stream') window.streams++;
        if (String(url).endsWith('/instances/' + %s) && !opts.method) {
            window.readHeld = true;
            await new Promise((done) => (window.releaseRead = done));
            const json = r.json.bind(r);
            r.json = async () => {
                const body = await json();
                setTimeout(() => (window.readShown = true), 0); // after the page drew it
                return body;
            };
        }
        return r;
    };"""


def late_read(driver, a):
    """The instance view's read answered after a change the stream brought must not draw
    the older state over it (a missed change: the page would show it until the next)."""
    a.roster("register", "late", "127.0.0.1:2", "--id", "late-1")
    script = driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument",
                                    {"source": HOLD_READ % '"late-1"'})
    try:
        driver.get("about:blank")
        driver.get(a.http + "/ui/#/instance/late/late-1")
        wait(driver, "the page read late-1", lambda d: d.execute_script("return window.readHeld === true"))
        a.roster("maint", "enable", "late", "late-1", "--reason", "late read")
        # A page that follows the stream while its read is out sees the change first.
        wait(driver, "the page shows the change, or waits for its read before the stream",
             lambda d: d.execute_script("return window.streams === 0")
             or d.find_element(By.ID, "status").text == "maintenance")
        driver.execute_script("window.releaseRead()")
        wait(driver, "the read's answer is drawn", lambda d: d.execute_script("return window.readShown === true"))
        wait(driver, "late-1 shows maintenance after the late read",
             lambda d: (e := d.find_elements(By.ID, "status")) and e[0].text == "maintenance")
    finally:
        driver.execute_cdp_cmd("Page.removeScriptToEvaluateOnNewDocument", script)
    driver.get("about:blank")
    check("a read answered late does not hide a change the stream brought")


def members_show_lease_and_synced(driver):
    """The members table as {name: {column: text}}: a's lease runs and it is not synced
    with itself; b's lease runs and a has synced with it; both are in the default zone."""
    rows = driver.execute_script("""
        const t = document.querySelector('main table');
        if (!t) return {};
        const cols = [...t.querySelectorAll('thead th')].map((th) => th.textContent);
        const out = {};
        for (const tr of t.querySelectorAll('tbody tr')) {
            const cells = [...tr.children].map((td) => td.textContent);
            out[cells[0]] = Object.fromEntries(cols.map((c, i) => [c, cells[i]]));
        }
        return out;""")
    a, b = rows.get("a"), rows.get("b")
    return bool(a and b and a["Lease"].startswith("in ") and a["Synced"] == "\u2014"
                and b["Lease"].startswith("in ") and b["Synced"].endswith(" ago")
                and a["Zone"] == b["Zone"] == "default")


def fail_on_error(driver):
    """Stops the wait with the page's own error, when it shows one."""
    shown = [e.text for e in driver.find_elements(By.CSS_SELECTOR, ".error") if e.text]
    if shown:
        raise SystemExit(f"FAILED: the page says: {shown[0]}")
    return False


def shot(driver, args, name):
    if args.screenshots:
        time.sleep(0.3)  # let the last frame paint
        driver.save_screenshot(os.path.join(args.screenshots, f"{name}.png"))


def check(name):
    print(f"ok: {name}", flush=True)


# The relative luminance of the computed colour `rgb(r, g, b)` (WCAG 2), and the contrast
# ratio of two of them.
LUMINANCE = """
    const lum = (c) => {
        const [r, g, b] = c.match(/[\\d.]+/g).slice(0, 3).map((v) => {
            const s = v / 255;
            return s <= 0.04045 ? s / 12.92 : ((s + 0.055) / 1.055) ** 2.4;
        });
        return 0.2126 * r + 0.7152 * g + 0.0722 * b;
    };
    const ratio = (a, b) => (Math.max(lum(a), lum(b)) + 0.05) / (Math.min(lum(a), lum(b)) + 0.05);
"""


def colours(driver):
    """The body's background luminance, and the contrast of each kind of text on it."""
    return driver.execute_script(LUMINANCE + """
        const bg = getComputedStyle(document.body).backgroundColor;
        const out = { background: lum(bg), text: {} };
        const probe = document.createElement('span');
        document.querySelector('main').append(probe);
        for (const cls of ['', 'muted', 'passing', 'warning', 'critical', 'maintenance', 'error']) {
            probe.className = cls;
            out.text[cls || 'body'] = ratio(getComputedStyle(probe).color, bg);
        }
        const link = document.querySelector('nav a');
        out.text.link = ratio(getComputedStyle(link).color, bg);
        probe.remove();
        return out;""")


def check_contrast(driver, scheme):
    c = colours(driver)
    low = {k: round(v, 2) for k, v in c["text"].items() if v < 4.5}
    assert not low, f"{scheme}: text with a contrast under 4.5 on the background: {low}"
    return c


def fits(driver, view):
    """Nothing on the page is wider than the viewport (no sideways scroll)."""
    w = driver.execute_script("return [document.documentElement.scrollWidth, innerWidth]")
    assert w[0] <= w[1], f"{view} at a phone's width: the page is {w[0]} px wide in a {w[1]} px viewport"


def visible(driver, css):
    """Whether the first element matching `css` is shown, inside the viewport's width."""
    return driver.execute_script("""
        const e = document.querySelector(arguments[0]);
        if (!e) return false;
        const r = e.getBoundingClientRect();
        return r.width > 0 && r.height > 0 && r.left >= 0 && r.right <= innerWidth;""", css)


def phone_and_dark(driver, a, args):
    """At a phone's viewport every main view fits its width and its controls are in view;
    light and dark follow the system's setting, each with readable text."""
    driver.get(a.http + "/ui/#/service/web")
    wait(driver, "web lists web-1", lambda d: "web-1" in text(d))
    light = check_contrast(driver, "light")
    driver.execute_cdp_cmd("Emulation.setEmulatedMedia",
                           {"features": [{"name": "prefers-color-scheme", "value": "dark"}]})
    try:
        dark = wait(driver, "the page turns dark", lambda d: (c := colours(d))["background"] < 0.05 and c)
        check_contrast(driver, "dark")
        assert light["background"] > 0.9, f"the light background is not light: {light['background']:.2f}"
        check("light and dark follow the system, with readable text")
        shot(driver, args, "dark")
    finally:
        driver.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})
    assert dark
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": 390, "height": 844, "deviceScaleFactor": 1, "mobile": True})
    try:
        views = [
            ("services", "#/services", lambda d: "web" in text(d), ["nav a[href='#/members']", "main input"]),
            ("a service", "#/service/web", lambda d: "web-1" in text(d), [".grid .row span", "main input"]),
            ("an instance", "#/instance/web/web-1", lambda d: "acknowledged_by" in text(d), ["#status", "#deregister"]),
            ("members", "#/members", lambda d: "This agent: a" in text(d), ["main table td"]),
            ("changes", "#/changes", lambda d: "db" in text(d), ["ol.changes li"]),
        ]
        for name, route, shown, controls in views:
            driver.get(a.http + "/ui/" + route)
            wait(driver, f"{name} shows at a phone's width", shown)
            fits(driver, name)
            for css in controls:
                assert visible(driver, css), f"{name} at a phone's width: {css} is not in view"
            if name == "a service":
                shot(driver, args, "phone")
        check("every main view fits a phone's width, its controls in view")
    finally:
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


def run(args, root):
    a = Agent(args.roster, root, "a")
    b = Agent(args.roster, root, "b", join=a.url)
    agents = [a, b]
    driver = None
    try:
        b.roster("register", "web", "10.0.0.1:8080", "--id", "web-1", "--meta", "zone=eu-1")
        a.roster("register", "web", "10.0.0.2:8080", "--id", "web-a", "--meta", "zone=eu-2")
        driver = browser()
        driver.get(a.http + "/")
        wait(driver, "/ redirects to /ui/", lambda d: d.current_url.endswith("/ui/"))
        wait(driver, "the page lists web, registered on b", lambda d: "web" in text(d) and "2" in text(d))
        check("the page lists what the CLI registered on another agent")
        shot(driver, args, "services")

        driver.get(a.http + "/ui/#/service/web")
        wait(driver, "web-1 is listed", lambda d: "web-1" in text(d))
        driver.execute_script("window.notReloaded = true")
        b.roster("register", "web", "10.0.0.3:8080", "--id", "web-2")
        wait(driver, "web-2 appears", lambda d: "web-2" in text(d))
        assert driver.execute_script("return window.notReloaded === true"), "the page reloaded"
        check("a new registration appears without a reload")

        a.roster("register", "db", "127.0.0.1:1", "--id", "db-1", "--check-tcp", f"127.0.0.1:{free_port()}",
                 "--check-interval", "1s", "--check-timeout", "500ms", "--check-failures", "1")
        driver.get(a.http + "/ui/#/service/db")
        wait(driver, "db-1 turns critical", lambda d: "critical" in text(d) and "db-1" in text(d))
        check("a failing health check turns the instance critical")
        shot(driver, args, "service")

        driver.get(a.http + "/ui/#/instance/web/web-a")
        wait(driver, "the provenance shows", lambda d: "acknowledged_by" in text(d))
        wait(driver, "the instance shows", lambda d: d.find_element(By.ID, "status").text == "passing")
        shot(driver, args, "instance")
        driver.find_element(By.ID, "maintenance").click()
        confirm(driver)
        wait(driver, "the page shows maintenance",
             lambda d: d.find_element(By.ID, "status").text == "maintenance" or fail_on_error(d))
        got = a.roster("get", "web", "--all", "--json")
        assert '"maintenance"' in got and "web-a" in got, f"roster get --all: {got}"
        check("maintenance switched on from the page is seen by roster get --all")

        driver.get(a.http + "/ui/#/members")
        wait(driver, "the members list a and b", lambda d: "This agent: a" in text(d) and "alive" in text(d))
        wait(driver, "each member shows its lease and when a last synced with it", members_show_lease_and_synced)
        check("the members show their lease and when this agent synced with each")
        shot(driver, args, "members")
        driver.get(a.http + "/ui/#/changes")
        wait(driver, "the changes list db going critical", lambda d: "db" in text(d) and "critical" in text(d))
        shot(driver, args, "changes")
        phone_and_dark(driver, a, args)

        errors = console_errors(driver)
        assert not errors, f"console errors: {errors}"
        late_read(driver, a)

        driver.get(a.http + "/ui/#/service/web")
        wait(driver, "web lists three instances", lambda d: all(i in text(d) for i in ("web-1", "web-2", "web-a")))
        a.stop()
        wait(driver, "the page says it is reconnecting", lambda d: "reconnecting" in d.find_element(By.ID, "conn").text)
        a.start()
        wait(driver, "the page is live again", lambda d: d.find_element(By.ID, "conn").text == "live")
        wait(driver, "the same data after the restart",
             lambda d: all(i in text(d) for i in ("web-1", "web-2", "web-a")))
        check("an agent restart shows reconnecting, then the same data")

        # While a was down, the browser logged the connections a refused or dropped: the
        # blocking read open when a stopped ends as an empty response or, if the socket was
        # gone first, as not connected. Nothing else.
        errors = console_errors(driver, allowed=("ERR_CONNECTION_REFUSED", "ERR_EMPTY_RESPONSE",
                                                 "ERR_SOCKET_NOT_CONNECTED"))
        assert not errors, f"console errors: {errors}"
        check("no errors in the browser console")
    finally:
        if driver:
            driver.quit()
        for ag in agents:
            ag.stop()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("roster", help="the roster binary")
    p.add_argument("--screenshots", help="a directory for the views' screenshots")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="roster-ui-") as root:
        try:
            run(args, root)
        except AssertionError as e:
            print(f"FAILED: {e}", file=sys.stderr)
            return 1
        except SystemExit as e:
            print(e, file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
