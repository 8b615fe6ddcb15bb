#!/usr/bin/env bash
# Debian's headless Chromium and its WebDriver, for the browser tests of the view
# (tests/test_view.py): installed when missing, a no-op when both are there, so `make test`
# runs it every time. Needs root (apt-get), as on CI and the developers' machines; where it
# cannot install them it says so and exits non-zero, and the browser tests skip, saying why.
set -euo pipefail

if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "chromium-from-debian: chromium or chromedriver is missing, and installing them needs root" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
command -v chromium >/dev/null && command -v chromedriver >/dev/null
