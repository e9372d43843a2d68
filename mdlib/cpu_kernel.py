r"""The compiled CPU step of ``LpMirrorDescent``: one vectorized C++ pass per tensor.

For a contiguous float32 or float64 tensor it computes, in one loop over memory,

    s <- u - lr g,    w <- sign(s) |s|^r,    and max |w|   (NaN if any w is NaN)

with u and g read once and s and w written once. Large tensors are written with non-temporal
(streaming) stores, which skip the read a cache normally makes before overwriting a line: 4 array
transfers per entry against fused Adam's 7 (Adam reads and rewrites its two moments and the
parameter). torch.compile's kernel for the same update cannot stream its stores (6 transfers).

The powers are of the kind :func:`mdlib.mirror._power_kind` chooses, as on the torch paths: r = 1
copies; an integer r (p = 1 + 1/r, e.g. 1.1) multiplies |s|^(r-1), a product of repeated squares in
the eager path's order (so the results agree bit for bit), by s; r = 1/2 (p = 3) is a square root;
float32 r = n/3 (p = 1.75) is the bit-seeded Newton cube root of
:func:`mdlib.mirror._fused_signed_power` (same seed constant, same steps); other r use exp(r log|s|)
(SLEEF, as torch's own vectorized exp/log).
``u - lr g`` is rounded as eager torch rounds it (no fused multiply-add), so the new dual is the eager
path's bit for bit.

Built on first use with inductor's C++ toolchain (the vector ISA torch.compile would pick, OpenMP,
cached on disk like inductor's own kernels); entries are independent, so a restore that reruns the
kernel on the same tensors reproduces every entry exactly.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from mdlib.mirror import _CUBE_ROOT_SEED, _POWER_KINDS, _power_kind

__all__ = ["available", "supports", "update"]

#: Tensors of at least this many bytes are written with streaming stores (smaller ones stay cached).
STREAM_BYTES = 1 << 20

_SOURCE = r"""
#include <torch/csrc/inductor/cpp_prefix.h>
#include <omp.h>
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
#include <immintrin.h>
#endif

using at::vec::Vectorized;

template <typename T> static inline void stream(T* ptr, const Vectorized<T>& v) {
#if defined(CPU_CAPABILITY_AVX512)
    if constexpr (std::is_same_v<T, float>) _mm512_stream_ps(ptr, v); else _mm512_stream_pd(ptr, v);
#elif defined(CPU_CAPABILITY_AVX2)
    if constexpr (std::is_same_v<T, float>) _mm256_stream_ps(ptr, v); else _mm256_stream_pd(ptr, v);
#else
    v.store(ptr);
#endif
}

static inline void fence() {
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
    _mm_sfence();
#endif
}

// sign(x) |x|^r; KIND: the index in mirror._POWER_KINDS (copy, integer, sqrt, cube, general), and k
// its integer from mirror._power_kind (the integer r, or n of r = n/3).
template <typename T, int KIND> static inline Vectorized<T> power(const Vectorized<T>& x, int64_t k, T r) {
    const Vectorized<T> sign(T(-0.0));
    if constexpr (KIND == 0) {
        return x;
    } else if constexpr (KIND == 1) {  // |x|^(k-1) by binary powering, in the eager path's order, then times x
        Vectorized<T> base = x.abs(), out = base;
        bool first = true;
        for (int64_t e = k - 1; e; e >>= 1) {
            if (e & 1) { out = first ? base : out * base; first = false; }
            if (e > 1) base = base * base;
        }
        return out * x;
    } else if constexpr (KIND == 2) {
        return x.abs().sqrt() | (x & sign);
    } else if constexpr (KIND == 3) {  // float32 only: y = |x|^(-1/3) from the exponent bits, 3 Newton steps
        const Vectorized<float> a = x.abs();
        const Vectorized<float> b = at::vec::maximum(a, Vectorized<float>(std::numeric_limits<float>::min()));
        const Vectorized<float> bits = at::vec::convert_to_fp_of_same_size<float>(at::vec::cast<int32_t>(b));
        Vectorized<float> y = at::vec::cast<float>(at::vec::convert_to_int_of_same_size<float>(
            Vectorized<float>(CUBE_ROOT_SEED.0f) - bits * Vectorized<float>(1.0f / 3.0f)));
        const Vectorized<float> third = b * Vectorized<float>(1.0f / 3.0f);
        for (int i = 0; i < 3; ++i) y = y * (Vectorized<float>(4.0f / 3.0f) - third * (y * y * y));
        Vectorized<float> out = (k % 3 == 1) ? a * (y * y) : a * y;
        for (int64_t i = 0; i < k / 3; ++i) out = out * a;
        return out | (x & sign);
    } else {  // exp(r log|x|); log 0 = -inf gives 0
        return (x.abs().log() * Vectorized<T>(r)).exp() | (x & sign);
    }
}

// One range [begin, end) of whole vectors: new dual into s, new parameter into w, running max |w|.
template <typename T, int KIND, bool STREAM>
static inline Vectorized<T> span(T* w, const T* u, T* s, const T* g, T lr, T r, int64_t k, bool s_aligned,
                                 int64_t begin, int64_t end, Vectorized<T> top) {
    constexpr int64_t V = Vectorized<T>::size();
    const Vectorized<T> rate(lr);
    for (int64_t i = begin; i < end; i += V) {
        const Vectorized<T> x = Vectorized<T>::loadu(u + i) - Vectorized<T>::loadu(g + i) * rate;
        const Vectorized<T> y = power<T, KIND>(x, k, r);
        if (STREAM) {
            stream(w + i, y);
            if (s_aligned) stream(s + i, x); else x.store(s + i);
        } else {
            y.store(w + i);
            x.store(s + i);
        }
        top = at::vec::maximum(top, y.abs());
    }
    return top;
}

// A partial vector (head before alignment, tail): count < V entries, zeros beyond.
template <typename T, int KIND>
static inline Vectorized<T> part(T* w, const T* u, T* s, const T* g, T lr, T r, int64_t k, int64_t count,
                                 Vectorized<T> top) {
    if (count <= 0) return top;
    const Vectorized<T> x = Vectorized<T>::loadu(u, count) - Vectorized<T>::loadu(g, count) * Vectorized<T>(lr);
    const Vectorized<T> y = power<T, KIND>(x, k, r);
    x.store(s, count);
    y.store(w, count);
    return at::vec::maximum(top, y.abs());
}

template <typename T, int KIND>
static double run(T* w, const T* u, T* s, const T* g, double lr_, double r_, int64_t k, int64_t n, bool streaming) {
    constexpr int64_t V = Vectorized<T>::size();
    constexpr int64_t ALIGN = V * sizeof(T);
    const T lr = static_cast<T>(lr_), r = static_cast<T>(r_);
    const int64_t head = std::min<int64_t>(n, ((ALIGN - reinterpret_cast<uintptr_t>(w) % ALIGN) % ALIGN) / sizeof(T));
    const int64_t vectors = (n - head) / V, end = head + vectors * V;
    const bool s_aligned = (reinterpret_cast<uintptr_t>(s) + head * sizeof(T)) % ALIGN == 0;
    Vectorized<T> top(T(0));
    top = part<T, KIND>(w, u, s, g, lr, r, k, head, top);
    top = part<T, KIND>(w + end, u + end, s + end, g + end, lr, r, k, n - end, top);
    __at_align__ T lanes[V];
    const int threads = vectors >= 4096 ? omp_get_max_threads() : 1;
    #pragma omp parallel num_threads(threads)
    {
        const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
        const int64_t lo = head + (vectors * t / nt) * V, hi = head + (vectors * (t + 1) / nt) * V;
        const Vectorized<T> zero(T(0));
        Vectorized<T> mine = streaming ? span<T, KIND, true>(w, u, s, g, lr, r, k, s_aligned, lo, hi, zero)
                                       : span<T, KIND, false>(w, u, s, g, lr, r, k, s_aligned, lo, hi, zero);
        if (streaming) fence();
        #pragma omp critical
        top = at::vec::maximum(top, mine);
    }
    top.store(lanes);
    double best = 0.0;
    bool nan = false;
    for (int64_t i = 0; i < V; ++i) {
        nan = nan || std::isnan(lanes[i]);
        best = std::max(best, static_cast<double>(lanes[i]));
    }
    return nan ? std::numeric_limits<double>::quiet_NaN() : best;
}

template <typename T>
static double dispatch(int64_t kind, T* w, const T* u, T* s, const T* g, double lr, double r, int64_t k, int64_t n,
                       bool streaming) {
    switch (kind) {
        case 0: return run<T, 0>(w, u, s, g, lr, r, k, n, streaming);
        case 1: return run<T, 1>(w, u, s, g, lr, r, k, n, streaming);
        case 2: return run<T, 2>(w, u, s, g, lr, r, k, n, streaming);
        case 3: if constexpr (std::is_same_v<T, float>) return run<T, 3>(w, u, s, g, lr, r, k, n, streaming);
                [[fallthrough]];
        default: return run<T, 4>(w, u, s, g, lr, r, k, n, streaming);
    }
}

// scalars: double[2] = {lr, r}; top: double[1] receives max |w| (NaN if any w is NaN).
extern "C" void kernel(uintptr_t w, uintptr_t u, uintptr_t s, uintptr_t g, uintptr_t scalars, uintptr_t top,
                       int64_t n, int64_t is_double, int64_t kind, int64_t k, int64_t streaming) {
    const double* lr_r = reinterpret_cast<const double*>(scalars);
    double* out = reinterpret_cast<double*>(top);
    if (is_double)
        *out = dispatch<double>(kind, reinterpret_cast<double*>(w), reinterpret_cast<const double*>(u),
                                reinterpret_cast<double*>(s), reinterpret_cast<const double*>(g), lr_r[0], lr_r[1], k,
                                n, streaming);
    else
        *out = dispatch<float>(kind, reinterpret_cast<float*>(w), reinterpret_cast<const float*>(u),
                               reinterpret_cast<float*>(s), reinterpret_cast<const float*>(g), lr_r[0], lr_r[1], k, n,
                               streaming);
}
"""


@functools.cache
def available() -> bool:
    """Whether this machine has a vector ISA inductor compiles for (the kernel is built for it)."""
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    return bool(pick_vec_isa())


@functools.cache
def _kernel():
    from torch._inductor.codecache import CppPythonBindingsCodeCache

    return CppPythonBindingsCodeCache.load_pybinding(
        ["uintptr_t"] * 6 + ["int64_t"] * 5, _SOURCE.replace("CUBE_ROOT_SEED", str(_CUBE_ROOT_SEED)),
        extra_flags=("-ffp-contract=off",))


def supports(w: Tensor, u: Tensor) -> bool:
    """Whether the kernel updates parameter ``w`` with dual ``u``: CPU, contiguous, float32/float64,
    the same dtype (low-precision parameters keep a float32 dual and take the torch.compile path)."""
    return (w.device.type == "cpu" and w.dtype == u.dtype and w.dtype in (torch.float32, torch.float64)
            and w.is_contiguous() and u.is_contiguous() and available())


def update(w: Tensor, u: Tensor, s: Tensor, g: Tensor, lr: float, r: float) -> float:
    """s <- u - lr g, w <- sign(s)|s|^r in one pass (``supports(w, u)`` must hold, s like u); returns
    max |w|, NaN or infinite iff some new entry of w is."""
    g = g.to(u.dtype).contiguous()
    if not (s.is_contiguous() and s.dtype == u.dtype and s.numel() == u.numel() == g.numel() == w.numel()):
        raise ValueError("cpu_kernel.update: s must be a contiguous tensor like u, and g and w of its size")
    kind, k = _power_kind(r, u.dtype)
    scalars = torch.tensor([lr, r], dtype=torch.float64)
    top = torch.empty(1, dtype=torch.float64)
    streaming = int(w.numel() * w.element_size() >= STREAM_BYTES)
    _kernel()(w.data_ptr(), u.data_ptr(), s.data_ptr(), g.data_ptr(), scalars.data_ptr(), top.data_ptr(), w.numel(),
              int(u.dtype == torch.float64), _POWER_KINDS.index(kind), k, streaming)
    return top.item()
