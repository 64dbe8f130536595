"""nbval settings for the chapters (pytest loads this file when it collects book/*.ipynb).

stderr (warnings, progress bars) and text/html (pandas tables) vary across library versions and
machines, so only stdout text and text/plain results are compared; PNG bytes are never compared.
"""


def pytest_collectstart(collector):
    if collector.fspath and collector.fspath.ext == ".ipynb":
        collector.skip_compare += ("text/html", "application/javascript", "stderr")
