#!/usr/bin/env bash
# Open built chapters in headless Chromium and check: MathJax (from _static) typeset the maths,
# every <img> loaded, theorem numbers and citations resolved. Run after `make book`.
set -euo pipefail
cd "$(dirname "$0")/../.."
html=_build/html
[ -d "$html" ] || { echo "no $html: run 'make book' first"; exit 1; }
if ! command -v chromium >/dev/null 2>&1; then
  echo "installing Debian's chromium (headless browser) ..."
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq chromium >/dev/null
fi
exec .venv/bin/python tests/render/check_render.py "$html" "$@"
