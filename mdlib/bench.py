"""Benchmarks behind ``python -m mdlib bench ...``; each returns a JSON-serializable dict.

Timings on shared 2-core machines are noisy: each benchmark interleaves the contenders, repeats,
and reports medians and ratios measured side by side in one run.
"""

from __future__ import annotations

import os
import random
import statistics
import time

# OpenMP threads spin while waiting; a passive policy keeps a neighbour's load from distorting timings.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def median_time(fn, repeats: int) -> float:
    """Median wall time of ``fn()`` over ``repeats`` calls, in seconds."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


#: How a model's parameters split into tensors (a few large, several small), scaled to any total.
TENSOR_SPLIT = (0.4, 0.2, 0.2, 0.1, 0.05, 0.03, 0.02)


def optimizer_step_times(total: int, ps=(1.1, 1.75, 3.0), repeats: int = 31, modes=("eager", "compiled"),
                         seed: int = 0) -> dict[str, list[float]]:
    """Seconds per optimizer step on ``total`` float32 parameters (split as ``TENSOR_SPLIT``), for
    torch SGD (foreach, fused), Adam (foreach, fused) and LpMirrorDescent at each p in each mode
    ("eager", "compiled"); after two warm-up steps (which also compile), the contenders take one step
    each per round, in a new random order every round (seeded). Returns {contender: [seconds per round]}."""
    import torch

    from mdlib.optim import LpMirrorDescent

    generator = torch.Generator().manual_seed(seed)
    sizes = [max(1, round(total * share)) for share in TENSOR_SPLIT]

    def make(factory):
        params = [torch.nn.Parameter(torch.randn(n, generator=generator) * 0.05) for n in sizes]
        for w in params:
            w.grad = torch.randn(w.shape, generator=generator) * 1e-3
        return factory(params)

    contenders = {
        "sgd_foreach": make(lambda ps_: torch.optim.SGD(ps_, lr=1e-3, foreach=True)),
        "sgd_fused": make(lambda ps_: torch.optim.SGD(ps_, lr=1e-3, fused=True)),
        "adam_foreach": make(lambda ps_: torch.optim.Adam(ps_, lr=1e-3, foreach=True)),
        "adam_fused": make(lambda ps_: torch.optim.Adam(ps_, lr=1e-3, fused=True)),
    }
    for p in ps:
        for mode in modes:
            contenders[f"md_p{p:g}_{mode}"] = make(
                lambda ps_, p=p, mode=mode: LpMirrorDescent(ps_, lr=1e-3, p=p, compile=mode == "compiled"))
    for opt in contenders.values():
        opt.step()
        opt.step()
    rounds = {name: [] for name in contenders}
    order = random.Random(seed)
    for _ in range(repeats):
        names = list(contenders)
        order.shuffle(names)  # no contender always follows the same one (caches, dirty lines, clocks)
        for name in names:
            rounds[name].append(median_time(contenders[name].step, 1))
    return rounds


def optimizer(args) -> dict:
    """Per-step time of LpMirrorDescent (p = 1.1, 1.75, 3; eager and compiled) against torch SGD and
    Adam on 10M float32 parameters, interleaved round by round; medians and median ratios to fused Adam."""
    import torch

    import numpy as np

    repeats = args.repeats or 31
    rounds = optimizer_step_times(10_000_000, repeats=repeats)
    ms = {name: 1e3 * statistics.median(t) for name, t in rounds.items()}
    ratios = {name: np.array(rounds[name]) / np.array(rounds["adam_fused"]) for name in rounds if name.startswith("md_")}
    ratio = {name: float(np.median(r)) for name, r in ratios.items()}
    compiled = [r for name, r in ratio.items() if name.endswith("_compiled")]
    return {"params": 10_000_000, "threads": torch.get_num_threads(), "repeats": repeats,
            "step_ms_median": {k: round(v, 2) for k, v in ms.items()},
            "md_over_adam_fused_median_ratio": {k: round(v, 3) for k, v in ratio.items()},
            "md_over_adam_fused_ci95": {k: [round(x, 3) for x in median_interval(r)] for k, r in ratios.items()},
            "target_md_compiled_no_slower_than_fused_adam": max(compiled) <= 1.0}


def median_interval(values, confidence: float = 0.95, resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """Percentile-bootstrap interval of the median of ``values`` (seeded)."""
    import numpy as np

    values = np.asarray(values, dtype=float)
    draws = np.random.default_rng(seed).choice(values, size=(resamples, len(values)))
    low, high = np.quantile(np.median(draws, axis=1), [(1 - confidence) / 2, (1 + confidence) / 2])
    return float(low), float(high)


def training_step_time(model, optimizer, inputs, labels, loss_fn, repeats: int = 3) -> float:
    """Median seconds of one training step (forward, loss, backward, optimizer step) after one warm-up."""
    def step():
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(inputs), labels).backward()
        optimizer.step()

    step()
    return median_time(step, repeats)


def synthetic(args) -> dict:
    """The full experiment E1 (``--seeds`` seeds x p in {1.75, 2, 3} at the paper's step counts, each
    path compared with the SVMs of all three exponents), timed end to end, nothing cached."""
    from mdlib.synthetic import fixed_decoder_experiment

    steps = {1.75: 1500, 2.0: 2000, 3.0: 20000}
    start = time.perf_counter()
    result = fixed_decoder_experiment(args.seeds, steps, lr=0.1, svm_ps=tuple(steps))
    seconds = time.perf_counter() - start
    final = result["final"].groupby(["train_p", "svm_p"]).divergence.mean()
    table = {f"{p:g}": {f"{q:g}": round(float(final[(p, q)]), 6) for q in steps} for p in steps}
    own_smallest = all(min(row, key=row.get) == p for p, row in table.items())
    return {"seconds": round(seconds, 2), "seeds": args.seeds, "final_divergence": table,
            "own_svm_smallest_on_every_path": own_smallest}


def svm(args) -> dict:
    """l_p attention SVM of E1 size (n = 6, T = 8, d = 10: 42 constraints, 100 unknowns).

    Contenders, per p in {1.1, 1.75, 2, 3}: ``mdlib.svm.lp_margin`` on a batch of 100 problems (time
    per problem), ``lp_margin`` on one problem at a time, and cvxpy + Clarabel building and solving
    ``min ||w||_p s.t. A w >= 1`` one problem at a time (as the authors' code does) on the first few.
    Each repeat times all three side by side; the report gives medians over repeats of the times
    and of the speedup ratios, the largest certified relative gap, and the largest relative
    difference between our optimal norms and cvxpy's.
    """
    # one BLAS thread for numpy (Clarabel is single-threaded too); effective only before numpy loads
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    import cvxpy as cp
    import numpy as np

    from mdlib.svm import attention_constraints, globally_optimal_tokens, lp_margin

    batch, handful, repeats = 100, 5, args.repeats or 5
    rng = np.random.default_rng(0)

    def unit(x):
        return x / np.linalg.norm(x, axis=-1, keepdims=True)

    n, T, d = 6, 8, 10
    X, z, v = unit(rng.standard_normal((batch, n, T, d))), unit(rng.standard_normal((batch, n, d))), unit(
        rng.standard_normal((batch, d)))
    y = rng.choice([-1.0, 1.0], size=(batch, n))
    alpha = globally_optimal_tokens(X, y, v)  # E1 selects tokens by training; the optimal ones are its limit
    A = attention_constraints(X, z, alpha)

    def cvxpy_solve(a, p):
        w = cp.Variable(a.shape[1])
        problem = cp.Problem(cp.Minimize(cp.norm(w, p)), [a @ w >= 1])
        problem.solve(solver=cp.CLARABEL)
        return problem.value

    results = {}
    for p in (1.1, 1.75, 2.0, 3.0):
        sol = lp_margin(A, p)  # warm-up, and the certificate of every problem
        cvx_norms = np.array([cvxpy_solve(A[b], p) for b in range(handful)])
        rows = []
        for _ in range(repeats):
            t_cvx = statistics.median(median_time(lambda b=b: cvxpy_solve(A[b], p), 1) for b in range(handful))
            t_single = statistics.median(median_time(lambda b=b: lp_margin(A[b], p), 1) for b in range(handful))
            t_batch = median_time(lambda: lp_margin(A, p), 1) / batch
            rows.append((t_cvx, t_single, t_batch))
        t_cvx, t_single, t_batch = (statistics.median(col) for col in zip(*rows))
        results[f"p={p:g}"] = {
            "cvxpy_clarabel_ms_per_problem": 1e3 * t_cvx,
            "single_ms_per_problem": 1e3 * t_single,
            "batched_ms_per_problem": 1e3 * t_batch,
            "speedup_batched": statistics.median(c / b for c, _, b in rows),
            "speedup_single": statistics.median(c / s for c, s, _ in rows),
            "max_rel_gap": float(np.max(sol.rel_gap)),
            "max_violation": float(np.max(sol.violation)),
            "median_iterations": float(np.median(sol.iterations)),
            "max_norm_rel_diff_vs_cvxpy": float(np.max(np.abs(sol.norm[:handful] - cvx_norms) / cvx_norms)),
        }
    return {
        "benchmark": "svm",
        "target_100x_cvxpy_every_p": all(r["speedup_batched"] >= 100 for r in results.values()),
        "problem": {"n": n, "T": T, "d": d, "constraints": n * (T - 1), "unknowns": d * d},
        "batch": batch,
        "cvxpy_problems": handful,
        "repeats": repeats,
        "threads": {key: os.environ.get(key) for key in ("OPENBLAS_NUM_THREADS", "OMP_WAIT_POLICY")},
        "results": results,
    }
