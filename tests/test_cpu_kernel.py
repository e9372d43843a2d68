"""The C++ step kernel of LpMirrorDescent(compile=True) against the eager torch path and float64."""

import math

import pytest
import torch

from mdlib import cpu_kernel
from mdlib.mirror import _signed_power

pytestmark = pytest.mark.skipif(not cpu_kernel.available(), reason="no vector ISA for the C++ kernel")

LR = 1e-2
#: r = 1/(p-1): copy (p=2), integer (p=1.1, p=1.5), square root (p=3), cube root (p=1.75), exp/log (p=1.4)
EXPONENTS = [1.0, 10.0, 2.0, 0.5, 4 / 3, 2.5]


def eager(u, g, r):
    """The eager path's arithmetic: s = u - lr g (lr a float64 scalar tensor), w = sign(s)|s|^r."""
    s = u - g * torch.tensor(LR, dtype=torch.float64)
    return s, _signed_power(s, r)


def run(u, g, r, w_offset=0, s_offset=0):
    """The kernel on copies of u, g, writing w and s at the given element offsets into larger buffers
    (misaligned with each other and with u)."""
    n = u.numel()
    w = torch.empty(n + w_offset, dtype=u.dtype)[w_offset:]
    s = torch.empty(n + s_offset, dtype=u.dtype)[s_offset:]
    top = cpu_kernel.update(w, u, s, g, LR, r)
    return s, w, top


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("r", EXPONENTS)
def test_matches_the_eager_step(r, dtype, streaming, monkeypatch):
    if streaming:
        monkeypatch.setattr(cpu_kernel, "STREAM_BYTES", 0)
    gen = torch.Generator().manual_seed(0)
    for n in (1, 7, 16, 33, 70001):
        u = (torch.randn(n, generator=gen, dtype=torch.float64) * 2).to(dtype)
        g = torch.randn(n, generator=gen, dtype=torch.float64).to(dtype)
        s, w, top = run(u, g, r, w_offset=3, s_offset=5)
        s_ref, w_ref = eager(u, g, r)
        assert torch.equal(s, s_ref)  # the new dual is the eager one, bit for bit
        if r == 1.0 or r == round(r):
            assert torch.equal(w, w_ref)  # products in the eager order
        exact = _signed_power(s.double(), r)  # float64 reference from the same dual
        rtol = 1e-13 if dtype == torch.float64 else 1e-5 if r == 2.5 else 1e-6  # float32 exp/log: ~1e-5
        torch.testing.assert_close(w.double(), exact, rtol=rtol, atol=torch.finfo(dtype).tiny)  # atol: underflow
        assert top == w.abs().max().item()


def test_every_entry_is_computed_the_same_wherever_it_lies():
    """Head, vector body and tail, any alignment, one thread or two: the same bits (a restore or a
    resynchronization probe recomputes into other buffers and must reproduce the parameters)."""
    gen = torch.Generator().manual_seed(1)
    u, g = torch.randn(5003, generator=gen), torch.randn(5003, generator=gen)
    for r in (4 / 3, 2.5, 0.5):
        _, base, _ = run(u, g, r)
        for w_offset, s_offset in ((1, 0), (7, 3), (15, 15)):
            assert torch.equal(run(u, g, r, w_offset, s_offset)[1], base)
        threads = torch.get_num_threads()
        try:
            torch.set_num_threads(1)
            assert torch.equal(run(u, g, r)[1], base)
        finally:
            torch.set_num_threads(threads)
        shifted = run(u[1:].clone(), g[1:].clone(), r)[1]  # every entry moves to another lane
        assert torch.equal(shifted, base[1:])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("streaming", [False, True])
def test_a_single_bad_entry_anywhere_makes_the_maximum_non_finite(dtype, streaming, monkeypatch):
    if streaming:
        monkeypatch.setattr(cpu_kernel, "STREAM_BYTES", 0)
    n = 70001  # long enough for two threads
    u = torch.linspace(-1, 1, n, dtype=dtype)
    huge = torch.finfo(dtype).max
    for bad in (math.nan, math.inf, -math.inf, -huge):  # -huge: |u - lr g|^10 overflows
        for position in (0, 1, 17, n // 2, n - 2, n - 1):
            g = torch.zeros(n, dtype=dtype)
            g[position] = bad
            top = run(u, g, 10.0, w_offset=1)[2]
            assert not math.isfinite(top), (bad, position)
    assert math.isfinite(run(u, torch.zeros(n, dtype=dtype), 10.0)[2])


def test_cube_root_extremes():
    """float32 |s|^(4/3) and |s|^(5/3) over the whole range: 0, -0, subnormals (to 0), inf, NaN."""
    tiny = torch.finfo(torch.float32).tiny
    s = torch.tensor([0.0, -0.0, tiny / 8, tiny, 1e-30, 1e-3, 0.5, 1.0, 7.0, 1e20, -1e20, 1e28, math.inf, math.nan])
    for r in (4 / 3, 5 / 3):
        _, w, top = run(s, torch.zeros_like(s), r)
        exact = _signed_power(s.double(), r)
        finite = (exact.abs() < torch.finfo(torch.float32).max) & (s.abs() >= tiny)
        torch.testing.assert_close(w[finite].double(), exact[finite], rtol=1e-6, atol=tiny)
        assert torch.equal(w[:3], torch.tensor([0.0, -0.0, 0.0])) and math.copysign(1, w[1].item()) == -1
        assert math.isnan(top)


def test_refuses_mismatched_buffers():
    u = torch.zeros(8)
    with pytest.raises(ValueError, match="contiguous"):
        cpu_kernel.update(torch.empty(8), u, torch.empty(16)[::2], torch.zeros(8), LR, 2.0)
