"""companion.transformers.hooks: hooks attach for a with block and are always removed."""

import pytest
import torch

from companion.transformers.hooks import hooks


def _n_hooks(mod):
    return len(mod._forward_hooks) + len(mod._forward_pre_hooks)


def test_forward_and_pre_hooks_run_and_are_removed():
    lin = torch.nn.Linear(2, 2)
    x = torch.ones(1, 2)
    y0 = lin(x)
    with hooks(pre={lin: lambda mod, args: (args[0] * 2,)},
               forward={lin: lambda mod, args, out: out + 1}) as handles:
        assert len(handles) == 2 and _n_hooks(lin) == 2
        y = lin(x)
    assert torch.allclose(y, lin(2 * x) + 1)
    assert _n_hooks(lin) == 0
    assert torch.equal(lin(x), y0)


def test_hooks_are_removed_on_exception():
    lin = torch.nn.Linear(2, 2)
    with pytest.raises(RuntimeError, match="boom"):
        with hooks(forward=[(lin, lambda *a: None), (lin, lambda *a: None)]):
            assert _n_hooks(lin) == 2
            raise RuntimeError("boom")
    assert _n_hooks(lin) == 0


def test_with_kwargs_pre_hook_sees_kwargs():
    class M(torch.nn.Module):
        def forward(self, x, scale=1.0):
            return x * scale

    m, seen = M(), []
    with hooks(pre={m: lambda mod, args, kwargs: seen.append(kwargs)}, pre_with_kwargs=True):
        m(torch.ones(1), scale=3.0)
    assert seen == [{"scale": 3.0}]


def test_bad_specs_raise_and_leave_nothing_attached():
    lin = torch.nn.Linear(2, 2)
    with pytest.raises(TypeError, match="torch.nn.Module"):
        with hooks(forward={"lin": lambda *a: None}):
            pass
    with pytest.raises(TypeError, match="not callable"):
        with hooks(pre=[(lin, 3)]):
            pass
    with pytest.raises(TypeError, match="pairs"):
        with hooks(pre=[lin]):
            pass
    assert _n_hooks(lin) == 0
