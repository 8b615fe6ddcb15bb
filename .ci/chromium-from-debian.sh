#!/usr/bin/env bash
# Installs the browser that tests/test_site.py (the documentation site) and tests/test_view.py
# (the view of runs) drive: Debian's own `chromium` and `chromium-driver` (the WebDriver server
# Selenium talks to), once.
#
#   .ci/chromium-from-debian.sh
#
# Why Debian's: apt and PyPI are what these machines (a developer's, CI's) fetch from, and
# Debian's chromium-driver always matches its chromium, so nothing downloads a driver at test
# time (Selenium is given both paths). Safe to rerun: with both installed it does nothing. It
# needs root to install (CI runs as root); without root, or where apt cannot install them, it
# says so and succeeds, and the browser's tests skip, saying what is missing.
set -euo pipefail

if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
    exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
    echo "chromium-from-debian: not root, so Chromium is not installed: the browser tests will skip" >&2
    exit 0
fi
# The lock may be held by another apt run (an unattended upgrade): wait for it, not fail.
apt_get=(apt-get -o DPkg::Lock::Timeout=600 -q)
if ! { "${apt_get[@]}" update >/dev/null &&
    DEBIAN_FRONTEND=noninteractive "${apt_get[@]}" install -y --no-install-recommends \
        chromium chromium-driver >/dev/null; }; then
    echo "chromium-from-debian: apt-get could not install chromium: the browser tests will skip" >&2
fi
