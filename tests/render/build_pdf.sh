#!/usr/bin/env bash
# Build the PDF of the whole book through Jupyter Book's LaTeX route (XeLaTeX, offline; the stored,
# executed chapters are rendered, nothing is re-executed) and check it with check_pdf.py.
# Run by `make pdf`. The TeX engine, fonts and poppler come from Debian packages, installed here
# when missing (needs root or sudo); on another system install their equivalents yourself.
set -euo pipefail
cd "$(dirname "$0")/../.."
# xelatex (+ ucharclasses) | Sphinx's LaTeX packages | Zapf Dingbats for hyperref |
# xeCJK (+ ctexhook) | Chinese glyphs | Sphinx's default XeLaTeX fonts | the driver |
# Sphinx's index for XeLaTeX | pdftoppm, pdftotext, pdffonts, pdfimages
PACKAGES=(texlive-xetex texlive-latex-extra texlive-fonts-recommended texlive-lang-chinese
          fonts-noto-cjk fonts-freefont-otf latexmk xindy poppler-utils)
if command -v dpkg-query >/dev/null 2>&1; then
  missing=()
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' \
      || missing+=("$p")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    echo "installing Debian packages for the PDF: ${missing[*]} ..."
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
      "${missing[@]}" >/dev/null
  fi
else
  for c in xelatex latexmk xindy pdftoppm; do
    command -v "$c" >/dev/null 2>&1 \
      || { echo "$c is missing: install TeX Live (xelatex, xeCJK), Noto CJK, poppler"; exit 1; }
  done
fi
rm -rf _build/latex    # latexmk remembers a failed run and would not retry it
mkdir -p _build
start=$(date +%s)
.venv/bin/jupyter-book build . --builder pdflatex -W -n --keep-going > _build/pdf_build.log 2>&1 \
  || { tail -40 _build/pdf_build.log
       echo "PDF build failed: see _build/pdf_build.log and _build/latex/book.log"; exit 1; }
echo "PDF built in $(( $(date +%s) - start )) s: _build/latex/book.pdf (log: _build/pdf_build.log)"
exec .venv/bin/python tests/render/check_pdf.py --pdf _build/latex/book.pdf --out _build/pdf_check
