#!/usr/bin/env bash
# Installs what lrnn needs on a Debian machine, non-interactively; does nothing when all is there.
#   1. Debian packages (compilers, libraries, Python with numpy and matplotlib; clang with
#      libFuzzer and its OpenMP runtime for the fuzz targets; SentencePiece for C++ and Python;
#      cpp-httplib for `lrnn serve`)
#      via apt-get;
#   2. a Python virtual environment in .venv (Debian's python3 with its packages visible) with the
#      PyPI packages of tools/requirements.txt (the tools and their tests use it).
set -euo pipefail
cd "$(dirname "$0")/.."
pkgs=(build-essential cmake libcli11-dev libyaml-cpp-dev nlohmann-json3-dev libfmt-dev
      libopenblas-openmp-dev libgtest-dev libgmock-dev libbenchmark-dev python3 python3-venv
      python3-numpy python3-matplotlib clang-14 libclang-rt-14-dev libomp-14-dev
      libsentencepiece-dev python3-sentencepiece libcpp-httplib-dev pkg-config)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# The venv is rebuilt when tools/requirements.txt changes (its copy in .venv is the stamp).
if ! cmp -s tools/requirements.txt .venv/requirements.txt 2>/dev/null; then
  echo "setup: Python environment .venv (tools/requirements.txt)"
  rm -rf .venv
  /usr/bin/python3 -m venv --system-site-packages .venv
  # Lines marked '# no-deps' install without their declared dependencies (see the file).
  grep -v -- '# no-deps' tools/requirements.txt > .venv/requirements-deps.txt
  grep -- '# no-deps' tools/requirements.txt > .venv/requirements-nodeps.txt || true
  .venv/bin/pip install -q --disable-pip-version-check -r .venv/requirements-deps.txt
  .venv/bin/pip install -q --disable-pip-version-check --no-deps -r .venv/requirements-nodeps.txt
  cp tools/requirements.txt .venv/requirements.txt
fi
