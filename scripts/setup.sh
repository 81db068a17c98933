#!/usr/bin/env bash
# Set-up behind `make reproduce` and `make test`: idempotent, seconds when all is in place.
#  1. a virtual environment (.venv, or $FEDTSP_VENV) with the package and its dev extras,
#     reinstalled only when pyproject.toml changed;
#  2. the system data (WordNet 3.0, Fashion-MNIST) and Chromium for the notebook browser
#     test: installed from Debian's packages where
#     apt-get is usable (root, or sudo without a password; FEDTSP_NO_APT=1 skips it),
#     otherwise one sentence per missing item naming what to install.
set -euo pipefail
cd "$(dirname "$0")/.."

venv="${FEDTSP_VENV:-.venv}"
python="${PYTHON:-python3}"
stamp="$venv/.fedtsp-installed"
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"

if [ ! -x "$venv/bin/python" ]; then
  echo "setup: creating the virtual environment $venv"
  "$python" -m venv "$venv"
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing fedtsp and its dependencies into $venv (a few minutes the first time)"
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  "$venv/bin/python" -m pip install --quiet -e ".[dev]"
  echo "$want" > "$stamp"
fi

packages="$("$venv/bin/python" -m fedtsp.paper.system --debian)"
if [ -n "$packages" ]; then
  apt=()
  if [ "${FEDTSP_NO_APT:-0}" != 1 ] && command -v apt-get > /dev/null; then
    if [ "$(id -u)" = 0 ]; then
      apt=(apt-get)
    elif command -v sudo > /dev/null && sudo -n true 2> /dev/null; then
      apt=(sudo apt-get)
    fi
  fi
  if [ ${#apt[@]} -gt 0 ]; then
    echo "setup: installing Debian packages: $packages"
    # A fresh machine may have no package lists yet: update once and retry.
    # shellcheck disable=SC2086
    "${apt[@]}" install -y -qq --no-install-recommends $packages > /dev/null 2>&1 \
      || { "${apt[@]}" update -qq > /dev/null 2>&1 \
        && "${apt[@]}" install -y -qq --no-install-recommends $packages > /dev/null; } \
      || echo "setup: apt-get could not install $packages" >&2
  fi
  # Whatever is still missing is named, with the way to get it; the run then reports the
  # notebooks that lack it as partial.
  if [ -n "$("$venv/bin/python" -m fedtsp.paper.system --debian)" ]; then
    "$venv/bin/python" -m fedtsp.paper.system | grep -v ': ok$' | sed 's/^/setup: /' >&2 || true
  fi
fi
echo "setup: ready ($venv)"
