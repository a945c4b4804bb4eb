#!/usr/bin/env python3
"""deploy/docker-compose.yml as Debian 12's docker-compose (1.29) reads it.

`docker-compose config` must accept the file (no engine needed); in its normalised output the
three services run one image built from deploy/Dockerfile, each healthcheck probes /ready,
restarts are bounded (on-failure with a count), depends_on is acyclic and waits for readiness
where a service uses the server. Usage: compose_test.py SOURCE_DIR
"""
import subprocess
import sys

import yaml

src = sys.argv[1]
compose = f"{src}/deploy/docker-compose.yml"
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)


def config(*profiles):
    args = ["docker-compose", "-f", compose]
    for p in profiles:
        args += ["--profile", p]
    run = subprocess.run(args + ["config"], capture_output=True, text=True)
    if run.returncode != 0:
        print(f"docker-compose config failed:\n{run.stderr}", file=sys.stderr)
        sys.exit(1)
    return yaml.safe_load(run.stdout)


with open(compose) as f:
    raw = yaml.safe_load(f)
check("name" not in raw, "top-level 'name:' (docker-compose 1.29 refuses it)")

doc = config("smoke", "observability")
services = doc["services"]
core = ["scheduler", "worker", "tokenizer"]
for name in core:
    check(name in services, f"service {name} missing")
if failures:
    print("\n".join(failures), file=sys.stderr)
    sys.exit(1)

images = {services[n].get("image") for n in core + ["smoke"]}
check(len(images) == 1 and None not in images, f"services run different images: {images}")
builders = [n for n, s in services.items() if "build" in s]
check(len(builders) == 1, f"one image definition expected, built by {builders}")
for n in builders:
    check(services[n]["build"].get("dockerfile") == "deploy/Dockerfile",
          f"{n} builds {services[n]['build'].get('dockerfile')}")
    check(not services[n].get("depends_on"),
          f"{n} builds the image, so it must come first in start order")

for name in core:
    s = services[name]
    test = " ".join(s.get("healthcheck", {}).get("test", []))
    check("/ready" in test, f"{name}: healthcheck does not probe /ready ({test!r})")
for name, s in services.items():
    restart = str(s.get("restart", ""))
    if name == "smoke":
        check(restart == "no", f"smoke restarts ({restart})")
        continue
    check(restart.startswith("on-failure:") and restart.split(":")[1].isdigit(),
          f"{name}: restart '{restart}' is not on-failure with a count")

# depends_on: acyclic, and readiness (service_healthy) only on a service with a healthcheck.
deps = {n: s.get("depends_on", {}) for n, s in services.items()}
for n, d in deps.items():
    for target, cond in d.items():
        check(target in services, f"{n} depends on unknown {target}")
        if cond.get("condition") == "service_healthy":
            check("healthcheck" in services[target] and
                  not services[target]["healthcheck"].get("disable"),
                  f"{n} waits for {target} to be healthy, which has no healthcheck")
seen, stack = set(), set()


def visit(n):
    if n in stack:
        failures.append(f"depends_on cycle through {n}")
        return
    if n in seen:
        return
    stack.add(n)
    for t in deps.get(n, {}):
        visit(t)
    stack.discard(n)
    seen.add(n)


for n in services:
    visit(n)
check(deps["smoke"].get("scheduler", {}).get("condition") == "service_healthy",
      "the client does not wait for the scheduler to be ready")
# Among the three, waiting for readiness would deadlock: each one's /ready needs the others.
for n in core:
    for t, cond in deps[n].items():
        check(cond.get("condition") != "service_healthy" or t not in core,
              f"{n} waits for {t}'s /ready, which needs {n} itself")
check(services["worker"].get("ipc") == "shareable", "worker does not share its IPC namespace")
check(services["scheduler"].get("ipc") == "service:worker", "scheduler does not join the worker's")

# The default profile starts the three services only.
default = config()
check(set(default["services"]) >= set(core), "default profile lacks a core service")

if failures:
    print("FAIL:\n  " + "\n  ".join(failures), file=sys.stderr)
    sys.exit(1)
print(f"compose: ok ({', '.join(sorted(services))})")
