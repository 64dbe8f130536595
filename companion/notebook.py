"""One call that makes a chapter deterministic and quiet: :func:`setup_notebook`."""

from __future__ import annotations

import os
import random
import sys

#: Thread count used by every chapter.  CI machines have 2 cores; fixing the count keeps
#: floating-point reduction order (and hence printed digits) identical between runs.
NOTEBOOK_THREADS = 2


def setup_notebook(seed: int = 0, threads: int = NOTEBOOK_THREADS):
    """Prepare a chapter: CPU kernels, seeds, threads, determinism, printing, figures, quiet bars.

    Call it first, before importing torch or NumPy: it pins the AVX2 kernel set
    (:func:`companion.determinism.pin_cpu_kernels`), which those libraries read once at import.
    It also sets offline and quiet environment variables, deterministic torch algorithms, print
    precision 4, and the figure style (size, text of at least 9 pt, PNG at 2x resolution).

    Parameters
    ----------
    seed : int, default 0
        Seed for Python's ``random``, NumPy's global state and torch.
    threads : int, default 2
        Intra-op threads for torch (and BLAS, via the environment).

    Returns
    -------
    numpy.random.Generator
        ``np.random.default_rng(seed)``.

    Raises
    ------
    TypeError, ValueError
        If ``seed`` or ``threads`` is not an integer (TypeError), ``seed`` < 0 or ``threads`` < 1.

    Warns
    -----
    RuntimeWarning
        If torch was imported before this call and runs another kernel set than the pinned one.

    Examples
    --------
    >>> rng = setup_notebook(seed=0)
    >>> round(float(rng.standard_normal()), 4)
    0.1257
    """
    from companion.determinism import check_kernels, pin_cpu_kernels

    pin_cpu_kernels()  # before numpy and torch are imported: they read the variables once
    import numpy as np

    from companion._validation import check_int

    seed, threads = check_int(seed, "seed", 0), check_int(threads, "threads", 1)

    os.environ.update({
        "TQDM_DISABLE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_VERBOSITY": "error",
        "TOKENIZERS_PARALLELISM": "false", "PYTHONHASHSEED": str(seed), "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads), "CUBLAS_WORKSPACE_CONFIG": ":4096:8"})

    random.seed(seed)
    np.random.seed(seed)
    np.set_printoptions(precision=4, suppress=True, linewidth=100)

    try:
        import torch
    except ImportError:  # the pure-maths chapters do not need torch
        pass
    else:
        torch.manual_seed(seed)
        torch.set_num_threads(int(threads))
        torch.use_deterministic_algorithms(True)
        torch.set_printoptions(precision=4, sci_mode=False, linewidth=100)
        check_kernels()

    # transformers reads TRANSFORMERS_VERBOSITY when it is first imported; if a chapter imported it
    # already, quieten it here (importing it only for this would cost seconds in maths chapters).
    if "transformers" in sys.modules:
        transformers = sys.modules["transformers"]
        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()

    import matplotlib

    # The book's figure style: text of at least 9 pt (the check-render test measures it on the page).
    matplotlib.rcParams.update({"figure.figsize": (7.0, 4.0), "figure.dpi": 100, "savefig.dpi": 100,
                                "font.size": 10, "axes.titlesize": 10, "axes.labelsize": 10,
                                "legend.fontsize": 9, "xtick.labelsize": 9, "ytick.labelsize": 9,
                                "figure.titlesize": 10, "axes.grid": True, "grid.alpha": 0.3,
                                "svg.hashsalt": "companion"})
    try:  # inside IPython: PNG only (nbval ignores PNG bytes; SVG would not be stable)
        from IPython import get_ipython

        shell = get_ipython()
        if shell is not None:
            from matplotlib_inline.backend_inline import set_matplotlib_formats

            shell.run_line_magic("matplotlib", "inline")
            set_matplotlib_formats("retina")  # PNG at twice the resolution, shown at its 1x size
            _record_font_size(shell)
            # `%matplotlib inline` resets the size; an opaque white background suits the dark theme
            matplotlib.rcParams.update({"figure.figsize": (7.0, 4.0), "figure.dpi": 100,
                                        "figure.facecolor": "white", "savefig.facecolor": "white",
                                        "savefig.transparent": False})
    except ImportError:
        pass

    return np.random.default_rng(seed)


#: PNG text chunk in which a chapter figure records its smallest font size (pt); `make check-render`
#: reads it to compute the rendered text height instead of assuming the style's 9 pt.
FIGURE_FONT_KEY = "Companion-Min-Font-Pt"


def _min_font_pt(fig) -> float | None:
    """Smallest font size (pt) among the visible, non-empty texts of a matplotlib figure."""
    from matplotlib.text import Text

    sizes = [t.get_fontsize() for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
    return min(sizes) if sizes else None


def _record_font_size(shell) -> None:
    """Wrap the inline PNG formatter so that each figure's PNG carries its smallest font size."""
    from matplotlib.figure import Figure

    formatter = shell.display_formatter.formatters["image/png"]
    draw = formatter.lookup_by_type(Figure)

    def png_with_font(fig):
        size = _min_font_pt(fig)
        return draw(fig, metadata={FIGURE_FONT_KEY: f"{size:g}"}) if size else draw(fig)

    formatter.for_type(Figure, png_with_font)
