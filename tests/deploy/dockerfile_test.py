#!/usr/bin/env python3
"""deploy/Dockerfile and deploy/Dockerfile.cuda, checked by structure (no container engine runs
on the machines that check them; Debian 12 packages no Dockerfile linter): instructions known,
stages as intended (a build stage and a slim runtime stage on debian:12; NVIDIA's devel and
runtime images for CUDA), the runtime stage takes only the installed tree from the build stage,
the programs are installed with `cmake --install`, every script a RUN calls exists and is
executable, the root .dockerignore keeps build trees and generated files out, and the shell
scripts pass shellcheck. Then deploy/runtime-packages.sh runs on the built programs (as the build
stage runs it) and must name the Debian packages of their libraries.
Usage: dockerfile_test.py SOURCE_DIR BIN_DIR
"""
import os
import re
import subprocess
import sys

src, bindir = sys.argv[1], sys.argv[2]
failures = []
KNOWN = {"FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT", "VOLUME",
         "USER", "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL"}


def check(ok, what):
    if not ok:
        failures.append(what)


def instructions(path):
    """(keyword, arguments) per instruction, continuation lines joined, comments dropped."""
    out, current = [], ""
    with open(path) as f:
        for line in f:
            stripped = line.strip()
            if not current and (not stripped or stripped.startswith("#")):
                continue
            if current and stripped.startswith("#"):
                continue
            if stripped.endswith("\\"):
                current += stripped[:-1] + " "
                continue
            current += stripped
            keyword, _, args = current.partition(" ")
            out.append((keyword.upper(), args.strip()))
            current = ""
    check(not current, f"{path}: ends inside a continued line")
    return out


def stages(instrs, path):
    result = []  # [{"from": image, "name": name, "instrs": [...]}]
    for i, (kw, args) in enumerate(instrs):
        check(kw in KNOWN, f"{path}: unknown instruction {kw}")
        if kw == "FROM":
            m = re.match(r"(\S+)(?:\s+AS\s+(\S+))?$", args, re.IGNORECASE)
            check(m is not None, f"{path}: malformed FROM {args!r}")
            result.append({"from": m.group(1), "name": m.group(2), "instrs": []})
        elif not result:
            check(kw == "ARG", f"{path}: {kw} before the first FROM")
        else:
            result[-1]["instrs"].append((kw, args))
    return result


def check_common(path, build_image, runtime_image):
    st = stages(instructions(path), path)
    check(len(st) == 2, f"{path}: {len(st)} stages, expected a build and a runtime stage")
    if len(st) != 2:
        return
    build, runtime = st
    check(re.fullmatch(build_image, build["from"]) is not None,
          f"{path}: build stage on {build['from']}")
    check(re.fullmatch(runtime_image, runtime["from"]) is not None,
          f"{path}: runtime stage on {runtime['from']}")
    check(build["name"] == "build", f"{path}: the build stage is not named 'build'")
    build_run = " ".join(a for k, a in build["instrs"] if k == "RUN")
    check("cmake --install" in build_run, f"{path}: programs not installed with cmake --install")
    check(not re.search(r"\bcp\b[^&]*\bbin/", build_run), f"{path}: programs copied by hand")
    check("-DLITELLAMA_TESTS=OFF" in build_run, f"{path}: the image builds the tests")
    for script in re.findall(r"(?:^|\s)((?:scripts|deploy)/[\w./-]+\.sh)", build_run):
        p = os.path.join(src, script)
        check(os.path.isfile(p) and os.access(p, os.X_OK), f"{path}: {script} is not executable")
    copies = [a for k, a in runtime["instrs"] if k in ("COPY", "ADD")]
    check(len(copies) >= 1, f"{path}: the runtime stage takes nothing from the build stage")
    for a in copies:
        check(a.startswith("--from=build ") and "/opt/litellama" in a,
              f"{path}: the runtime stage copies {a!r}, not the installed tree of the build stage")
    run = " ".join(a for k, a in runtime["instrs"] if k == "RUN")
    check("runtime-packages.txt" in run, f"{path}: runtime libraries not from runtime-packages")
    check("rm -rf /var/lib/apt/lists" in run, f"{path}: apt lists left in the runtime image")
    check(not re.search(r"\b(g\+\+|cmake|ninja-build|-dev)\b", run),
          f"{path}: build tools in the runtime stage")
    check(any(k == "USER" and a != "root" for k, a in runtime["instrs"]),
          f"{path}: the runtime stage runs as root")
    check(any(k == "ENTRYPOINT" for k, _ in runtime["instrs"]), f"{path}: no ENTRYPOINT")


check_common(f"{src}/deploy/Dockerfile", r"debian:12", r"debian:12")
check_common(f"{src}/deploy/Dockerfile.cuda", r"nvidia/cuda:\$\{CUDA_VERSION\}-devel-\S+",
             r"nvidia/cuda:\$\{CUDA_VERSION\}-runtime-\S+")

with open(f"{src}/deploy/README.md") as f:
    readme = f.read()
check(re.search(r"Dockerfile\.cuda[^\n]*\n?[^\n]*not built", readme) is not None,
      "deploy/README.md does not say that Dockerfile.cuda is not built here")

ignore_path = f"{src}/.dockerignore"
check(os.path.isfile(ignore_path), "no .dockerignore at the repository root")
if os.path.isfile(ignore_path):
    with open(ignore_path) as f:
        ignored = {l.strip() for l in f if l.strip() and not l.startswith("#")}
    for needed in (".git", "build", "build-*", "assets/models", "**/CMakeCache.txt"):
        check(needed in ignored, f".dockerignore does not exclude {needed}")
    for kept in ("scripts", "deploy", "common", "services", "cli", "CMakeLists.txt"):
        check(kept not in ignored, f".dockerignore excludes {kept}, which the build needs")

for script in ("deploy/docker-entrypoint.sh", "deploy/runtime-packages.sh"):
    run = subprocess.run(["shellcheck", f"{src}/{script}"], capture_output=True, text=True)
    check(run.returncode == 0, f"shellcheck {script}:\n{run.stdout}{run.stderr}")

programs = [f"{bindir}/{p}" for p in
            ("litellama", "litellama-scheduler", "litellama-worker", "litellama-tokenizer",
             "litellama-vision")]
run = subprocess.run([f"{src}/deploy/runtime-packages.sh", "--skip", "/usr/local/cuda"] + programs,
                     capture_output=True, text=True)
check(run.returncode == 0, f"runtime-packages.sh failed: {run.stderr}")
packages = set(run.stdout.split())
for needed in ("libzmq5", "libprometheus-cpp-core1.0", "libmicrohttpd12", "libsystemd0", "libc6"):
    check(needed in packages, f"runtime-packages.sh does not name {needed}: {sorted(packages)}")

if failures:
    print("FAIL:\n  " + "\n  ".join(failures), file=sys.stderr)
    sys.exit(1)
print(f"Dockerfiles: ok; runtime packages: {' '.join(sorted(packages))}")
