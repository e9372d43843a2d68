"""Benchmarks behind ``python -m mdlib bench ...``, each returning a JSON-serializable dict: the optimizer
step and training step costs against their targets (measured by ``mdlib.experiments.cost``, which also
makes chapter 08's tables), chapter 04's step with the CPU fast path against torch's kernels, the results
store's reads, the SVM solver against cvxpy and experiment E1 end to end.

Timings on shared 2-core machines are noisy: each benchmark interleaves the contenders, repeats,
and reports medians and ratios measured side by side in one run.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping

from mdlib.experiments import cost, paper

if TYPE_CHECKING:
    import argparse


#: ``bench optimizer``'s table (issue 32): torch's optimizers in their foreach and fused forms, every
#: LpMirrorDescent mode, at two sizes; each mode against AdamW in the same form, the default and fused
#: modes with a target (None: reported, no target).
TABLE_CONTENDERS = {f"{name}_{form}": (cls, {**kw, form: True})
                    for name, (cls, kw) in {"sgd": ("SGD", {}), "sgd-momentum": ("SGD", {"momentum": 0.9}),
                                            "adam": ("Adam", {}), "adamw": ("AdamW", {})}.items()
                    for form in ("foreach", "fused")}
TABLE_TARGETS = {"default": ("adamw_foreach", 1.2), "foreach": ("adamw_foreach", None),
                 "default-unchecked": ("adamw_foreach", None), "fused": ("adamw_fused", 1.3),
                 "fused-unchecked": ("adamw_fused", None)}
TABLE_SIZES = (1_000_000, 10_000_000)


def sparse_embedding_step_times(p: float = 1.1, repeats: int = 21, threads: int = 1, seed: int = 0
                                ) -> dict[str, list[float]]:
    """Seconds per training step of chapter 04's model (``cost.training_setup("sentiment")``) with mirror
    descent at ``p``, its token table's gradient dense (as the chapters train) or sparse
    (``nn.Embedding.sparse``: the step updates the rows of the batch's tokens only), interleaved round
    by round after two warm-up steps. Returns {"dense": [...], "sparse": [...]}."""
    import torch

    from mdlib.experiments import methods

    make, inputs, labels, loss_fn = cost.training_setup("sentiment", seed)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        steps = {}
        for name in ("dense", "sparse"):
            model = make()
            model.token.sparse = name == "sparse"
            opt = methods.make_optimizer(model.parameters(), "md", 1e-4, p)

            def step(model=model, opt=opt):
                opt.zero_grad(set_to_none=True)
                loss_fn(model(**inputs), labels).backward()
                opt.step()
            steps[name] = step
        return cost.interleaved_rounds(steps, repeats, seed, warmup=2)
    finally:
        torch.set_num_threads(before)


def optimizer(args: argparse.Namespace) -> dict:
    """(1) The optimizer-step table (issue 32): at 1M and 10M float32 parameters, LpMirrorDescent at
    p = 1.1, 1.75 and 3 in every mode of ``cost.MD_MODES`` beside SGD, SGD with momentum, Adam and AdamW in
    their foreach and fused forms; each mode against AdamW in the same form (``TABLE_TARGETS``: default
    within 1.2x of AdamW(foreach), fused within 1.3x of AdamW(fused)); (2) one training step of the
    sentiment encoder and of the ViT at the default profile's sizes, mirror descent at each p against
    Adam (target: within 1.10x); (3) chapter 04's training step with the token table's gradient sparse
    against dense (``sparse_embedding_step_times``, no target). Medians over interleaved rounds of
    side-by-side ratios, with 95 % intervals; ``table`` is the step table as text."""
    import torch

    repeats = args.repeats or 31
    steps, lines = {}, []
    for total in TABLE_SIZES:
        rounds = cost.optimizer_step_times(total, repeats=repeats, modes=tuple(TABLE_TARGETS),
                                           torch_contenders=TABLE_CONTENDERS)
        steps[str(total)] = {"step_ms_median": {k: round(1e3 * statistics.median(v), 2) for k, v in rounds.items()},
                             "step_ratios": cost.step_ratios(rounds, TABLE_TARGETS)}
        lines += step_table(total, steps[str(total)])
    ratios = {f"{total} {name}": entry for total, report in steps.items()
              for name, entry in report["step_ratios"].items()}
    training = {}
    for which in cost.TRAINING_MODELS:
        times = cost.training_step_times(which, repeats=repeats)
        training[which] = {"step_ms_median": {k: round(1e3 * statistics.median(v), 2) for k, v in times.items()}}
        for name in times:
            if name.startswith("md_"):
                training[which][f"{name} / adam"] = cost.ratio_entry(times[name], times["adam"],
                                                                     cost.TRAINING_TARGET)
    sparse = sparse_embedding_step_times(repeats=repeats)
    sparse_report = {"step_ms_median": {k: round(1e3 * statistics.median(v), 2) for k, v in sparse.items()},
                     "sparse / dense": cost.ratio_entry(sparse["sparse"], sparse["dense"], None)}
    met = all(r["met"] is not False for r in ratios.values()) and all(
        v["met"] for t in training.values() for k, v in t.items() if k.endswith("/ adam"))
    return {"benchmark": "optimizer", "date": time.strftime("%Y-%m-%d"), "machine": _machine(),
            "torch": torch.__version__, "threads": torch.get_num_threads(), "training_threads": 1,
            "repeats": repeats, "steps": steps, "training_steps": training, "sparse_embedding": sparse_report,
            "all_targets_met": met, "table": lines}


def _machine() -> str:
    import platform

    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"


def step_table(total: int, report: Mapping[str, Any]) -> list[str]:
    """The rows of one size of the step table as Markdown: every contender's median ms, and for mirror
    descent its ratio to its reference with the 95 % interval and the target."""
    lines = [f"{total:,} float32 parameters", "| optimizer | ms | vs | ratio [95 % interval] | target |",
             "|---|---:|---|---|---|"]
    for name, ms in report["step_ms_median"].items():
        entry = report["step_ratios"].get(name)
        if entry is None:
            lines.append(f"| {name} | {ms:.2f} | | | |")
            continue
        target = "" if entry["target"] is None else f"<= {entry['target']} ({'met' if entry['met'] else 'missed'})"
        low, high = entry["ci95"]
        lines.append(f"| {name} | {ms:.2f} | {entry['vs']} | {entry['median_ratio']:.2f} [{low:.2f}, {high:.2f}] "
                     f"| {target} |")
    return lines


#: The issue-19 target: chapter 04's training step at least this many times faster than before.
KERNELS_TARGET = 2.0


def kernel_step_times(repeats: int = 21, batches: int = 20, seed: int = 0) -> dict[str, list[float]]:
    """Seconds per training step of chapter 04's default run (the authors' encoder, width 24, 3 layers
    and heads, training mode, the summed binary cross-entropy, real batches of the Rotten Tomatoes
    training split cut as ``fit`` cuts them), one thread, with the CPU fast path of ``mdlib.models``
    ("fast") and with torch's own kernels (``models.reference_kernels``: SDPA and torch's dropout, the
    implementation before it: "reference"), for ℓ1.1 mirror descent and GD. Each round takes
    ``batches`` steps per contender, the contenders in a seeded random order. Returns {contender:
    [seconds per step, one per round]}."""
    import contextlib

    import torch
    import torch.nn.functional as F

    from mdlib import models
    from mdlib.experiments import methods, sentiment, train

    config = sentiment.run_config(layers=3, optimizer="md", p=1.1, lr=2.4e-3, width=24, train_size=None, seed=seed)
    parts = sentiment.splits(config.dataset, config.split_seed, config.max_length)
    train_set = sentiment.training_subset(parts["train"], config.train_size, config.split_seed)
    world = train.World(0, 1, torch.device("cpu"))
    order = train.train_batches(len(train_set), 100, seed, 0, world, torch.tensor([len(x) for x in train_set.ids]),
                                 config.fit.pool)[:batches]
    data = [sentiment.collate([train_set[i] for i in indices]) for indices, _ in order]
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        steps = {}
        for kernels in ("fast", "reference"):
            for name, p, lr in (("md_p1.1", 1.1, 2.4e-3), ("gd", 2.0, 4e-3)):
                model = sentiment.initial_model(config).train()
                opt = methods.make_optimizer(model.parameters(), "md", lr, p)
                context = models.reference_kernels if kernels == "reference" else contextlib.nullcontext

                def run(model=model, opt=opt, context=context):
                    with context():
                        for inputs, labels in data:
                            loss = F.binary_cross_entropy_with_logits(model(**inputs), labels, reduction="sum")
                            opt.zero_grad(set_to_none=True)
                            loss.backward()
                            opt.step()
                steps[f"{name}_{kernels}"] = run
        return cost.interleaved_rounds(steps, repeats, seed, warmup=1, per_call=len(data))
    finally:
        torch.set_num_threads(before)


def training(args: argparse.Namespace) -> dict:
    """The issue-19 benchmark: chapter 04's training step with the CPU fast path against torch's own
    kernels, side by side in one run (``kernel_step_times``): per optimizer, the median over rounds of
    the reference's time over the fast path's, with its 95 % interval, against ``KERNELS_TARGET``."""
    import torch

    repeats = args.repeats or 21
    rounds = kernel_step_times(repeats=repeats)
    speedups = {}
    for name in ("md_p1.1", "gd"):
        speedups[name] = cost.ratio_entry(rounds[f"{name}_reference"], rounds[f"{name}_fast"], KERNELS_TARGET,
                                          key="median_speedup", at_least=True)
    return {"benchmark": "training", "torch": torch.__version__, "model": "chapter 04 default (width 24, 3 layers)",
            "threads": 1, "repeats": repeats,
            "step_ms_median": {k: round(1e3 * statistics.median(v), 2) for k, v in rounds.items()},
            "speedup_vs_reference_kernels": speedups, "all_targets_met": all(v["met"] for v in speedups.values())}


def store_reads(args: argparse.Namespace) -> dict:
    """What checking a stored run's content costs on reads: per run kind of the build's results store, its
    entries from today's code (``python -m mdlib store`` lists them) read back whole (``store._read``,
    which hashes every file) and their content check alone (``files.check_content``), interleaved over
    ``--repeats`` rounds (default 7); medians of the rounds' totals, in milliseconds."""
    from mdlib.experiments import paths
    from mdlib.runs import files, identity, store

    found = [e for e in store.entries() if e.current]
    if not found:
        raise ValueError(f"no stored runs from today's code in {paths.runs_dir()}: build a chapter first "
                         "(python -m mdlib run NOTEBOOK)")
    out = {}
    for kind in sorted({e.kind for e in found}):
        of = [e.path for e in found if e.kind == kind]
        run = {path: identity.RunId.of(kind, json.loads((path / "config.json").read_text("utf-8"))) for path in of}
        meta = {path: json.loads((path / "meta.json").read_text("utf-8")) for path in of}

        def read_all(of=of, run=run, kind=kind):
            if any(store._read(path, run[path]) is None for path in of):
                raise ValueError(f"a {kind} entry does not read back: python -m mdlib store --prune")

        def check_all(of=of, meta=meta):
            for path in of:
                files.check_content(path, meta[path])

        rounds = cost.interleaved_rounds({"read": read_all, "check": check_all}, args.repeats or 7, seed=0,
                                         warmup=1)
        read_ms, check_ms = (1e3 * statistics.median(rounds[name]) for name in ("read", "check"))
        out[kind] = {"entries": len(of), "mb": round(sum(e.bytes for e in found if e.kind == kind) / 1e6, 1),
                     "read_ms": round(read_ms, 1), "check_ms": round(check_ms, 1),
                     "check_share": round(check_ms / read_ms, 3)}
    return {"benchmark": "store", "runs": str(paths.runs_dir()), "repeats": args.repeats or 7, "kinds": out}


def synthetic(args: argparse.Namespace) -> dict:
    """The full experiment E1 (``--seeds`` seeds x p in {1.75, 2, 3} at the paper's step counts, each
    path compared with the SVMs of all three exponents), timed end to end, nothing cached."""
    from mdlib.experiments.synthetic import fixed_decoder_experiment

    steps = dict(paper.E1_STEPS)
    config = dict(seeds=args.seeds, steps={f"{p:g}": k for p, k in steps.items()}, lr=0.1, n=6, T=8, d=10,
                  svm_ps=list(steps), seed=0, eps=None, points=250)
    start = time.perf_counter()
    result = fixed_decoder_experiment(config, cache=False)
    seconds = time.perf_counter() - start
    final = result["final"].groupby(["train_p", "svm_p"]).divergence.mean()
    table = {f"{p:g}": {f"{q:g}": round(float(final[(p, q)]), 6) for q in steps} for p in steps}
    own_smallest = all(min(row, key=row.get) == p for p, row in table.items())
    return {"seconds": round(seconds, 2), "seeds": args.seeds, "final_divergence": table,
            "own_svm_smallest_on_every_path": own_smallest}


def svm(args: argparse.Namespace) -> dict:
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
            t_cvx = statistics.median(cost.median_time(lambda b=b: cvxpy_solve(A[b], p), 1)
                                      for b in range(handful))
            t_single = statistics.median(cost.median_time(lambda b=b: lp_margin(A[b], p), 1)
                                         for b in range(handful))
            t_batch = cost.median_time(lambda: lp_margin(A, p), 1) / batch
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


#: ``python -m mdlib bench WHAT``: each benchmark by its name on the command line.
BENCHMARKS: dict[str, Callable[[argparse.Namespace], dict]] = {
    "optimizer": optimizer, "svm": svm, "synthetic": synthetic, "training": training, "store": store_reads}
