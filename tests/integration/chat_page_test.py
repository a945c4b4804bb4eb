#!/usr/bin/python3
"""The chat page at / in headless Chromium: `litellama serve` (the embedded default model on the
CPU, an API key set), load the page, give the key it asks for, type, see text stream in with TTFT
and tokens/s, stop it (the request is aborted: nothing left running), keep the conversation for a
second turn. Saves a screenshot.

usage: chat_page_test.py BIN_DIR SCREENSHOT.png
"""
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

KEY = "sk-page-test"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url, key=None):
    req = urllib.request.Request(url)
    if key:
        req.add_header("Authorization", "Bearer " + key)
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError:
        return 0, ""


def metric(body, name):
    m = re.search(r"^" + re.escape(name) + r" (\S+)$", body, re.M)
    return float(m.group(1)) if m else -1.0


def main():
    bin_dir, screenshot = sys.argv[1], sys.argv[2]
    work = tempfile.mkdtemp(prefix="litellama-page-")
    port = free_port()
    base = "http://127.0.0.1:%d" % port
    serve = subprocess.Popen(
        [os.path.join(bin_dir, "litellama"), "serve", "--run-dir", os.path.join(work, "run"),
         "--metrics-port", "0", "--port", str(port), "--api-key", KEY, "--threads", "1"],
        stdout=open(os.path.join(work, "serve.log"), "w"), stderr=subprocess.STDOUT)
    driver = None
    try:
        deadline = time.time() + 60
        while get(base + "/ready", KEY)[0] != 200:
            assert serve.poll() is None, open(os.path.join(work, "serve.log")).read()
            assert time.time() < deadline, "the server was not ready in 60 s"
            time.sleep(0.2)

        options = webdriver.ChromeOptions()
        options.binary_location = "/usr/bin/chromium"
        for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                    "--window-size=1000,700"):
            options.add_argument(arg)
        driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
        wait = WebDriverWait(driver, 30)
        driver.get(base + "/")
        # The server has a key: the page asks for it.
        wait.until(EC.alert_is_present())
        alert = driver.switch_to.alert
        alert.send_keys(KEY)
        alert.accept()
        wait.until(lambda d: d.find_element(By.ID, "model").text == "default")

        def turn(text):
            box = driver.find_element(By.ID, "input")
            box.send_keys(text)
            box.send_keys(Keys.ENTER)
            # Text streams in: it grows while the request runs.
            answer = lambda: driver.find_elements(By.CSS_SELECTOR, ".assistant")[-1]
            wait.until(lambda d: len(answer().text) > 0)
            first = len(answer().text)
            wait.until(lambda d: len(answer().text) > first + 10)
            assert re.fullmatch(r"\d+", driver.find_element(By.ID, "ttft").text), "no TTFT shown"
            wait.until(lambda d: re.fullmatch(r"[\d.]+", d.find_element(By.ID, "tps").text))
            stop = driver.find_element(By.ID, "stop")
            assert stop.is_enabled()
            stop.click()
            wait.until(lambda d: answer().get_attribute("data-done") == "1")
            assert not stop.is_enabled()
            stopped = answer().text
            time.sleep(0.5)
            assert answer().text == stopped, "text kept coming after stop"
            # Stopping aborted the request on the server (its KV freed).
            deadline = time.time() + 2
            while True:
                body = get(base + "/metrics", KEY)[1]
                if metric(body, "litellama_scheduler_requests_running") == 0 and \
                        metric(body, "litellama_scheduler_kv_slots_used") == 0:
                    break
                assert time.time() < deadline, "the stopped request still runs:\n" + body
                time.sleep(0.05)

        turn("Hello there")
        turn("And a second question")
        # The conversation is kept: both turns on the page.
        assert len(driver.find_elements(By.CSS_SELECTOR, ".user")) == 2
        assert len(driver.find_elements(By.CSS_SELECTOR, ".assistant")) == 2
        driver.save_screenshot(screenshot)
        assert os.path.getsize(screenshot) > 0
        print("chat page test: ok; screenshot in", screenshot)
    finally:
        if driver is not None:
            driver.quit()
        serve.send_signal(signal.SIGTERM)
        try:
            serve.wait(20)
        except subprocess.TimeoutExpired:
            serve.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
