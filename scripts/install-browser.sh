#!/bin/sh
# Headless Chromium for the browser tests (tests/e2e/test_dashboard_browser.py): Debian's package.
# Needs root (or sudo); does nothing when /usr/bin/chromium is already there.
set -eu
if [ -x /usr/bin/chromium ]; then
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
$SUDO apt-get update -qq
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium
