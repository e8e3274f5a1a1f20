#!/usr/bin/env python3
"""The service map (/ui/) in headless Chromium against two real agents on loopback.

  python3 tests/ui/browser.py ROSTER_BINARY [--screenshots DIR]

Starts agents a and b on free loopback ports (stopped by pid at the end), drives the page
on a with Selenium, and checks what issue 32 asks: the page lists what the CLI registered
on b; a new registration appears without a reload; a failing health check turns an
instance critical; maintenance switched on from the page is seen by `roster get --all`; a
restart of a shows "reconnecting" and then the same data; the console has no errors. With
--screenshots it saves the main views there (docs/guide/ui.md shows them).

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


def wait(driver, what, pred):
    try:
        return WebDriverWait(driver, DEADLINE_S, poll_frequency=0.02).until(lambda d: pred(d))
    except Exception:
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
        shot(driver, args, "members")
        driver.get(a.http + "/ui/#/changes")
        wait(driver, "the changes list db going critical", lambda d: "db" in text(d) and "critical" in text(d))
        shot(driver, args, "changes")

        errors = console_errors(driver)
        assert not errors, f"console errors: {errors}"

        driver.get(a.http + "/ui/#/service/web")
        wait(driver, "web lists three instances", lambda d: all(i in text(d) for i in ("web-1", "web-2", "web-a")))
        a.stop()
        wait(driver, "the page says it is reconnecting", lambda d: "reconnecting" in d.find_element(By.ID, "conn").text)
        a.start()
        wait(driver, "the page is live again", lambda d: d.find_element(By.ID, "conn").text == "live")
        wait(driver, "the same data after the restart",
             lambda d: all(i in text(d) for i in ("web-1", "web-2", "web-a")))
        check("an agent restart shows reconnecting, then the same data")

        # While a was down, the browser logged its refused connections: nothing else.
        errors = console_errors(driver, allowed=("ERR_CONNECTION_REFUSED", "ERR_EMPTY_RESPONSE"))
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
