"""The converted-model cache (issue 30): a file the conversion did not write is damage too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from companion.transformers import sources
from test_store_faults import fake_conversion  # noqa: F401 - the fixture (a tiny Llama conversion)


@pytest.mark.parametrize("name", ["model.safetensors.index.json", "adapter_model.safetensors", "sub"])
def test_an_unlisted_file_in_the_cache_is_damage(fake_conversion, name):  # noqa: F811
    # old: only the files the marker lists were checked, so a shard index, an adapter or a folder
    # dropped next to them (which transformers reads) loaded silently
    _, _, source = fake_conversion.load()
    folder = Path(source)
    if name == "sub":
        (folder / name).mkdir()
    else:
        (folder / name).write_text(json.dumps({"weight_map": {}}))
    assert "which the conversion did not write" in sources._cache_problem(folder)
    with pytest.warns(sources.CorruptCacheWarning, match="(?s)damaged.*did not write"):
        fake_conversion.load()
    assert fake_conversion.calls["n"] == 2 and sources._cache_problem(folder) is None
    assert not (folder / name).exists()
