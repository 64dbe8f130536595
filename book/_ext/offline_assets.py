"""Keep the rendered book free of CDN addresses.

Jupyter Book 1 always loads sphinx-thebe, which writes an inline script defining
``THEBE_JS_URL`` (a CDN address) into every page even when thebe is disabled; the book never
uses thebe, so that script is dropped.  MathJax itself is served from ``_static/mathjax``
(see ``mathjax_path`` in ``_config.yml``).
"""

CDN_MARKERS = ("unpkg.com", "cdn.jsdelivr.net", "cdnjs.cloudflare.com")


def _drop_cdn_scripts(app, pagename, templatename, context, doctree):
    scripts = context.get("script_files")
    if not scripts:
        return
    kept = []
    for js in scripts:
        text = " ".join(str(x) for x in (js, getattr(js, "attributes", {}).get("body", "")))
        if any(marker in text for marker in CDN_MARKERS):
            continue
        kept.append(js)
    context["script_files"] = kept


def setup(app):
    app.connect("html-page-context", _drop_cdn_scripts, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
