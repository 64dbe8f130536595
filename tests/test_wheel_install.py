"""The wheel is a working package on its own: built, installed (not editable) into a fresh virtual
environment, and used from a folder outside the repository.

Offline, in about a minute: the wheel is built from a copy of the source tree with this
environment's setuptools (no build isolation, nothing downloaded) and installed with
``pip install --no-index --no-deps``.  The new environment reaches the heavy dependencies
(torch, transformers, the model packages...) through a ``.pth`` file that names this
environment's site-packages.  A ``.pth`` line only appends a folder to ``sys.path``; the ``.pth``
files inside that folder (the editable install of the clone among them) are not executed, so
the only ``companion`` the new environment can import is the installed wheel -- the smoke script
checks that, runs with ``python -I`` (no current folder, no PYTHONPATH, no user site) from a
temporary folder outside the repository, with ``HOME`` in a temporary folder too.  The declared
dependency ranges are checked against the versions the new environment sees.

Run alone with ``make test-wheel``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest
import torch

import companion
from companion import experiments as xp
from companion.transformers import models
from companion._paths import DISTRIBUTION
from companion.corpus import corpus_sentences
from companion.transformers import readout

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
#: Never copied into the build tree: environments, build outputs, caches, locally computed Results.
_SKIP = {".git", ".venv", ".venv-lowest", "_build", "build", "dist", "__pycache__", ".pytest_cache",
         ".hypothesis", ".benchmarks", ".ipynb_checkpoints", "cache"}

SMOKE = textwrap.dedent('''
    import json, os, sys
    from dataclasses import dataclass
    from importlib.metadata import PackageNotFoundError, distribution, version
    from pathlib import Path

    import numpy as np
    import scipy.stats as st
    from packaging.requirements import Requirement

    spec = json.loads(sys.argv[1])
    out = {"sys_path": sys.path}

    # the declared ranges, checked against what this environment imports
    dist = distribution(spec["distribution"])
    out["dist_location"] = str(dist.locate_file(""))
    out["dist_version"] = dist.version
    problems = []
    for line in dist.requires or []:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        try:
            have = version(req.name)
        except PackageNotFoundError:
            problems.append(f"{req.name} is missing")
            continue
        if not req.specifier.contains(have, prereleases=True):
            problems.append(f"{req.name} {have} does not satisfy {req}")
    out["requirement_problems"] = problems

    import companion
    from companion import _paths
    out["companion_file"] = companion.__file__
    out["companion_version"] = companion.__version__
    out["checkout"] = None if _paths.source_checkout() is None else str(_paths.source_checkout())

    from companion.corpus import _corpus_dir, corpus_sentences
    sentences = corpus_sentences()
    out["corpus_dir"] = str(_corpus_dir())
    out["n_sentences"] = len(sentences)
    out["sentences_head"] = sentences[:3]

    from companion.theory.subgaussian import optimal_variance_proxy
    out["proxy_uniform"] = optimal_variance_proxy(st.uniform(0, 1))

    from companion.transformers import models, readout
    m = models.load("minilm-l6")
    out["minilm"] = {"n_layers": m.n_layers, "d_model": m.d_model, "source": m.source}
    out["embeddings"] = readout.sentence_embedding(m, sentences[:2]).tolist()

    from companion import experiments as xp
    from companion.experiments import framework_trained as xf
    out["stored_root"] = str(xp.stored_root())
    out["cache_root"] = str(xp.cache_root())
    real_run = xp.run

    def refuse(*args, **kwargs):
        raise AssertionError("run_cached recomputed a stored Result")

    xp.run = refuse
    stored = xp.run_cached(xp.make_config(spec["stored_name"], spec["stored_config"]))
    xp.run = real_run
    out["stored"] = {"path": str(stored.path), "hash": stored.config_hash,
                     "n_tokens": stored.scalars.get("n_tokens")}
    out["tiny_lms"] = len(xf.load_models())
    out["tiny_lms_path"] = str(xf._stored_models_path())

    @xp.register("wheel_smoke", schema=1)
    @dataclass(frozen=True)
    class WheelSmoke:
        """A Result computed by the user."""
        n: int = 3

        def compute(self, device, progress):
            return {"x": np.arange(self.n)}

    computed = xp.run_cached(WheelSmoke())
    out["computed_path"] = str(computed.path)
    print("SMOKE-JSON " + json.dumps(out))
''')


def _copy_source(dst: Path) -> None:
    def ignore(folder, names):
        return {n for n in names if n in _SKIP or n.endswith(".egg-info")}

    shutil.copytree(REPO, dst, ignore=ignore, symlinks=True)


def _run(cmd, **kwargs):
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600,
                          **kwargs)
    assert proc.returncode == 0, f"{cmd} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc


def _clean_env(home: Path) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("COMPANION_", "PYTHON", "VIRTUAL_ENV", "PIP_"))}
    env.update(HOME=str(home), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TQDM_DISABLE="1",
               PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    return env


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """Build the wheel, install it into a fresh venv, run the smoke script from outside."""
    base = tmp_path_factory.mktemp("wheel")
    assert REPO not in base.parents
    src, dist, venv, home, outside = (base / n for n in ("src", "dist", "venv", "home", "outside"))
    home.mkdir()
    outside.mkdir()
    env = _clean_env(home)
    _copy_source(src)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
          "--quiet", "-w", dist, src], env=env, cwd=outside)
    wheels = sorted(dist.glob("*.whl"))
    assert len(wheels) == 1, wheels
    _run([sys.executable, "-m", "venv", venv], env=env, cwd=outside)
    py = venv / "bin" / "python"
    site = Path(_run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     env=env, cwd=outside).stdout.strip())
    ours = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    (site / "_dependencies_of_the_test_environment.pth").write_text("\n".join(ours) + "\n")
    _run([py, "-m", "pip", "install", "--no-index", "--no-deps", "--ignore-installed", "--quiet",
          wheels[0]], env=env, cwd=outside)
    before = sorted(str(p.relative_to(site)) for p in (site / "companion").rglob("*")
                    if "__pycache__" not in p.parts)
    stored_json = sorted(xp.stored_root().glob("channel_statistics/*.json"))[0]
    meta = json.loads(stored_json.read_text())
    spec = {"distribution": DISTRIBUTION, "stored_name": meta["name"],
            "stored_config": meta["config"]}
    smoke = outside / "smoke.py"
    smoke.write_text(SMOKE)
    proc = _run([py, "-I", smoke, json.dumps(spec)], env=env, cwd=outside)
    line = [x for x in proc.stdout.splitlines() if x.startswith("SMOKE-JSON ")][-1]
    after = sorted(str(p.relative_to(site)) for p in (site / "companion").rglob("*")
                   if "__pycache__" not in p.parts)
    return dict(base=base, site=site, venv=venv, py=py, home=home, outside=outside, env=env,
                wheel=wheels[0], stored_json=stored_json, before=before, after=after,
                out=json.loads(line[len("SMOKE-JSON "):]))


def test_the_installed_wheel_is_what_runs(installed):
    out, site = installed["out"], installed["site"]
    assert Path(out["companion_file"]).parent == site / "companion"
    assert Path(out["dist_location"]) == site
    assert out["checkout"] is None                       # not a clone: no pyproject.toml beside it
    assert str(REPO) not in out["sys_path"] and "" not in out["sys_path"]
    assert out["requirement_problems"] == []
    assert out["dist_version"] == out["companion_version"] == companion.__version__


def test_the_wheel_carries_the_corpus(installed):
    out, site = installed["out"], installed["site"]
    assert Path(out["corpus_dir"]) == site / "companion" / "data" / "corpus"
    clone = corpus_sentences()                            # the same text, read from the clone
    assert out["n_sentences"] == len(clone) and out["sentences_head"] == clone[:3]


def test_the_wheel_computes_like_the_clone(installed):
    out = installed["out"]
    assert out["proxy_uniform"] == pytest.approx(1 / 12, rel=1e-9)
    m = models.load("minilm-l6")
    assert out["minilm"]["n_layers"] == m.n_layers and out["minilm"]["d_model"] == m.d_model
    mine = readout.sentence_embedding(m, corpus_sentences()[:2])
    theirs = torch.tensor(out["embeddings"])
    assert theirs.shape == mine.shape
    torch.testing.assert_close(theirs, mine.float(), atol=1e-5, rtol=1e-5)


def test_stored_results_are_read_from_site_packages(installed):
    out, site = installed["out"], installed["site"]
    stored = site / "companion" / "data" / "results"
    assert Path(out["stored_root"]) == stored
    name = installed["stored_json"].name
    assert Path(out["stored"]["path"]) == stored / "channel_statistics" / name
    assert out["stored"]["hash"] == installed["stored_json"].stem
    assert out["tiny_lms"] > 0 and Path(out["tiny_lms_path"]) == stored / "framework_tiny_lms.npz"


def test_computed_results_go_to_the_user_cache_not_site_packages(installed):
    out, home = installed["out"], installed["home"]
    cache = home / ".cache" / "companion" / "results" / "cache"
    assert Path(out["cache_root"]) == cache
    assert Path(out["computed_path"]).parent == cache / "wheel_smoke"
    assert Path(out["computed_path"]).exists()
    assert installed["after"] == installed["before"]     # nothing was written into the package


def test_the_command_line_works_from_the_wheel(installed):
    py, env, outside = installed["py"], installed["env"], installed["outside"]
    text = _run([py, "-I", "-m", "companion", "--help"], env=env, cwd=outside).stdout
    assert "companion/data/results" in text and "run" in text
    shown_version = _run([py, "-I", "-m", "companion", "--version"], env=env, cwd=outside).stdout
    assert shown_version.split() == ["companion", companion.__version__]
    stored = installed["site"] / "companion" / "data" / "results" / "channel_statistics"
    script = installed["venv"] / "bin" / "companion"              # the console script
    shown = _run([script, "show", stored / installed["stored_json"].name], env=env,
                 cwd=outside).stdout
    assert installed["stored_json"].stem in shown


def test_the_wheel_holds_only_the_package_and_its_data(installed):
    import zipfile

    names = zipfile.ZipFile(installed["wheel"]).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"companion", f"{DISTRIBUTION.replace('-', '_')}-{companion.__version__}.dist-info"}, tops
    data = sorted(n for n in names if n.startswith("companion/data/"))
    in_repo = sorted(str(p.relative_to(REPO)) for p in (REPO / "companion" / "data").rglob("*")
                     if p.is_file() and p.suffix in (".txt", ".md", ".json", ".npz", ".csv"))
    assert data == in_repo
