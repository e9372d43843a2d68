"""Training runs through the results store: one (``run``) or many (``run_many``, a pool of worker
processes, or the jobs of an executor); a run the store holds is read back instead of trained.

``run(kind, config, build)``: ``build(config)`` makes a ``train.Setup`` (model, optimizer, data), and
``mdlib.experiments.train.train_setup`` trains it, with checkpoints, unless the store holds the run::

    result = pool.run("e4-sentiment", config, build, extras=train.model_state)
    results = pool.run_many("e4-sentiment", configs, build, workers=2)  # 2 CPU processes, or 1 per GPU
    results = pool.run_many("e4-sentiment", configs, build, executor=client.get_executor())  # Dask
    train.load_model_state(model, result)  # the trained weights, back into a model

Where ``run_many`` trains the missing runs is named by an executor spec (``--executor SPEC`` of
``python -m mdlib run|book``, ``executor: SPEC`` in a profile, ``$MDLIB_EXECUTOR``)::

    processes               run_many's own pool of ``workers`` processes (the default)
    dask-local:N            a Dask LocalCluster of N single-threaded worker processes on this machine
    dask:ADDRESS            the Dask scheduler at ADDRESS, e.g. dask:tcp://node7:8786 (``dask scheduler``,
                            a dask_jobqueue.SLURMCluster); its workers share the build folder

Importing this module imports no torch (the book's process checks a spec with it); training does.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from tqdm.auto import tqdm

from mdlib.experiments import paths
from mdlib.runs import lockfile, progress as _progress, store
from mdlib.runs.identity import Config, RunId
from mdlib.runs.store import RunResult

if TYPE_CHECKING:
    import torch
    from torch import nn

    from mdlib.experiments.train import Setup

__all__ = ["EXECUTOR_ENV", "EXECUTOR_SPECS", "open_executor", "parse_executor", "run", "run_many"]

log = logging.getLogger(__name__)

EXECUTOR_ENV = "MDLIB_EXECUTOR"  #: the executor spec run_many uses when it is given none
EXECUTOR_SPECS = "processes, dask-local:N or dask:ADDRESS (e.g. dask:tcp://host:8786)"


def parse_executor(spec: str) -> tuple[str, str | int | None]:
    """An executor spec as (``"processes"``, None), (``"dask-local"``, N) or (``"dask"``, address); a
    ValueError saying what a spec looks like otherwise. ``processes``: ``run_many``'s own pool of
    ``workers`` processes; ``dask-local:N``: a Dask LocalCluster of N single-threaded worker
    processes; ``dask:ADDRESS``: the Dask scheduler at ADDRESS (``dask scheduler``, a SLURMCluster)."""
    name, _, argument = str(spec).strip().partition(":")
    if name == "processes" and not argument:
        return name, None
    if name == "dask-local" and argument.isdigit() and int(argument) >= 1:
        return name, int(argument)
    if name == "dask" and argument:
        return name, argument
    raise ValueError(f"unknown executor {spec!r}; an executor is {EXECUTOR_SPECS}")


@contextlib.contextmanager
def open_executor(spec: str):
    """The ``concurrent.futures.Executor`` of an executor spec (:func:`parse_executor`) for the block,
    None for ``processes``; a LocalCluster it started is closed after it. Dask comes with the extra
    ``cluster``; its workers get ``OMP_NUM_THREADS=1`` by default."""
    name, argument = parse_executor(spec)
    if name == "processes":
        yield None
        return
    from distributed import Client, LocalCluster

    if name == "dask-local":
        with LocalCluster(n_workers=argument, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
                Client(cluster) as client:
            yield client.get_executor()
    else:
        with Client(argument) as client:
            yield client.get_executor()


def run(kind: str, config: Config, build: Callable[[Config], Setup], *,
        extras: Callable[[nn.Module], Mapping[str, Any]] | None = None, progress: bool = True,
        device: str | torch.device | None = None, num_workers: int = 0, force: bool = False) -> RunResult:
    """The stored result of training run (``kind``, ``config``), training it first if it is not stored.

    ``config``, a typed run config, holds every setting that changes the numbers; its ``fit`` part is
    a ``train.FitOptions`` (epochs, batch_size, seed, loss, ...). On a miss,
    ``build(config)`` makes the ``Setup``, ``train.fit`` trains it with checkpoints in
    ``<build>/checkpoints/<kind>/<key>/`` (so an interrupted run resumes), and the store keeps
    ``history`` (the DataFrame ``fit`` returns), the loss and accuracy of the trained model on each of
    the Setup's ``final_evaluations`` (and their sizes), plus whatever ``extras(trained_model)`` returns (arrays,
    DataFrames or JSON values, e.g. ``model_state(model)``); the checkpoint is deleted once stored.
    Under torchrun every process trains, rank 0 stores, and all return the stored result.
    """
    return _run(RunId.of(kind, config), config, build, extras=extras, progress=progress, device=device,
                num_workers=num_workers, force=force)


def _run(run_id: RunId, config: Config, build: Callable[[Config], Setup], *,
         extras: Callable[[nn.Module], Mapping[str, Any]] | None, progress: bool, device: str | torch.device | None,
         num_workers: int = 0, force: bool = False) -> RunResult:
    """``run``, given the run's id (that of ``config``), made once by the caller and passed to each visit
    of the store."""
    import torch.distributed as dist

    from mdlib.experiments import train

    if not isinstance(config, Config) or not isinstance(getattr(config, "fit", None), train.FitOptions):
        raise TypeError(f"config must be a typed run config (a identity.Config) whose fit part is a "
                        f"train.FitOptions, got {type(config).__name__}")
    options = config.fit
    if not force and (hit := store.load(run_id)) is not None:
        return hit
    world = train.process_world(device)
    folder = paths.checkpoints_dir() / run_id.kind / run_id.key

    def compute() -> dict[str, Any]:
        return train.train_setup(build(config), options, extras=extras, checkpoint=folder, progress=progress,
                                 world=world, num_workers=num_workers)

    if world.rank != 0:
        compute()
        dist.barrier()
        return store.load(run_id)
    result = store.load_or_run(run_id, compute, force=force)
    shutil.rmtree(folder, ignore_errors=True)
    if world.size > 1:
        dist.barrier()
    return result


def _worker_init(parent: int, devices=None) -> None:
    """Set up a ``run_many`` worker: one thread, on CUDA the GPU it takes from ``devices`` (a queue of
    ``CUDA_VISIBLE_DEVICES`` values, one per worker; set before torch touches CUDA), and exit as soon as
    ``parent`` (the process that started it) is gone: a parent-death signal on Linux, and on every
    system a daemon thread that polls the parent's pid (a worker whose parent died is reparented)."""
    import torch

    torch.set_num_threads(1)
    if devices is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = devices.get()
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass  # the watchdog below still applies
    lockfile.watch_parent(parent, lambda: os._exit(1))


def _device_slots() -> list[str]:
    """The GPUs a worker can be pinned to, as ``CUDA_VISIBLE_DEVICES`` values: the entries of this
    process's ``CUDA_VISIBLE_DEVICES`` when it is set, else ``0 .. device_count - 1``."""
    import torch

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [entry.strip() for entry in visible.split(",") if entry.strip()]
    return [str(index) for index in range(torch.cuda.device_count())]


def _start_pool(workers: int, devices: list[str]):
    """A ProcessPoolExecutor of ``workers`` spawned processes with one thread each (``_worker_init``);
    with ``devices``, worker i sees only GPU ``devices[i % len(devices)]``."""
    import concurrent.futures
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    slots = None
    if devices:
        slots = context.Queue()
        for index in range(workers):
            slots.put(devices[index % len(devices)])
    return concurrent.futures.ProcessPoolExecutor(workers, mp_context=context, initializer=_worker_init,
                                                  initargs=(os.getpid(), slots))


@contextlib.contextmanager
def _terminate_raises():
    """Within the block, SIGTERM raises SystemExit(143) in the main thread (so the caller can stop its
    workers and say what was kept) instead of ending the process at once."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _stop(pool) -> None:
    """Cancel the pending jobs of a ProcessPoolExecutor and kill its workers now."""
    processes = list((getattr(pool, "_processes", None) or {}).values())  # no public API before 3.14
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.kill()
    for process in processes:
        process.join(5)


def _train_job(build_dir: str, run_id: RunId, config: Config, build: Callable[[Config], Setup],
               extras: Callable[[nn.Module], Mapping[str, Any]] | None, device: str | None) -> None:
    """Train and store the launcher's run ``run_id`` (of ``config``) in a worker process, which must store
    into the launcher's results store ``build_dir`` and run its code (the id of ``config`` here is
    ``run_id``, else the run would be stored where the launcher does not look)."""
    if paths.build_dir().resolve() != Path(build_dir).resolve():
        raise RuntimeError(f"this worker's results store is {paths.build_dir()}, the launcher's {build_dir}: start "
                           f"the workers with {paths.BUILD_ENV}={build_dir} (a folder both see, e.g. on NFS)")
    here = RunId.of(run_id.kind, config)  # this process's code
    if here != run_id:
        raise RuntimeError(f"a worker keys run {run_id.kind}/{run_id.key[:12]} as {here.key[:12]}: it runs other "
                           "mdlib code than the launcher; give the workers the same checkout or version")
    _run(run_id, config, build, extras=extras, progress=False, device=device)


def run_many(kind: str, configs: list[Config], build: Callable[[Config], Setup], *,
             extras: Callable[[nn.Module], Mapping[str, Any]] | None = None, workers: int = 1,
             skip: tuple[type[BaseException], ...] = (), progress: bool = True,
             device: str | torch.device | None = None, executor=None) -> list[RunResult | None]:
    """``run(kind, config, build, extras=extras)`` for every config, in order, the missing ones trained
    at once by

    * ``executor``, a ``concurrent.futures.Executor`` (e.g. Dask's ``Client.get_executor()``): one job
      per missing run, in its workers, which must share this process's results store; else the
      executor that ``$MDLIB_EXECUTOR`` names (:func:`parse_executor`; ``processes``, the default,
      means the pool below);
    * with ``workers`` > 1, ``workers`` spawned processes with one thread each: on the CPU, or on CUDA
      with several GPUs visible, one process per GPU (worker i sees only GPU i mod count, through
      ``CUDA_VISIBLE_DEVICES``). On one GPU, an indexed ``device`` or under torchrun, the runs go one
      after another in this process.

    With an executor or workers > 1, ``build`` and ``extras`` must be module-level functions of an
    importable module (they are sent to other processes). A run that raises one of the exception types
    in ``skip`` (e.g. FloatingPointError: a step size too large) gives None instead of stopping the
    others. The worker processes end with the process that started them (even when it is killed); on
    Ctrl-C or SIGTERM they are stopped and one line says what was kept. Processes asking for the same
    runs (two launchers on a shared build folder) train each once (the store's lock) and share them
    out: each starts with the runs no other process trains at that moment. A command that executes the
    notebook (``$MDLIB_PROGRESS_DIR``) is told which runs are stored, waiting, trained and failed
    (``mdlib.runs.progress``)."""
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an integer >= 1, got {workers!r}")
    runs = [(RunId.of(kind, config), config) for config in configs]  # each run's id, made once
    missing = list({run_id: (run_id, config) for run_id, config in runs if not store.exists(run_id)}.values())
    failed: dict[RunId, BaseException] = {}
    alone = int(os.environ.get("WORLD_SIZE", "1")) == 1
    if alone:  # the runs another process trains now last: by then they are stored, or it died
        missing.sort(key=lambda run: store.busy(run[0]))
    spec = os.environ.get(EXECUTOR_ENV, "").strip() or "processes"
    report = _progress.status(kind, runs, {run_id for run_id, _ in missing}, workers, lock_of=store.lock_path,
                              checkpoint_of=_checkpoint_folder, entry_of=store.entry_dir)
    try:
        if missing and alone and (executor is not None or parse_executor(spec)[0] != "processes"):
            with contextlib.nullcontext(executor) if executor is not None else open_executor(spec) as chosen:
                failed = _run_on(chosen, kind, missing, build, extras, skip, progress,
                                 None if device is None else str(device), report)
        elif alone and (devices := _pool_devices(workers, len(missing), device)) is not None:
            failed = _run_in_processes(kind, missing, build, extras, workers, skip, progress, devices, report)
        elif alone and len(missing) > 1:
            failed = _run_free_first(missing, build, extras, skip, progress, device, report)
        results = []
        for run_id, config in runs:
            try:
                if run_id in failed:
                    raise failed[run_id]
                results.append(_run(run_id, config, build, extras=extras, progress=progress, device=device))
                _finished(report, run_id, results[-1])
            except skip as error:
                failed[run_id] = error
                log.info("run %s/%s failed and is skipped: %s", kind, run_id.key[:12], error)
                _finished(report, run_id, error=error)
                results.append(None)
        return results
    finally:
        if report is not None:
            report.close()


def _checkpoint_folder(run_id: RunId) -> Path:
    """Where ``_run`` keeps the checkpoint of run ``run_id`` while it trains."""
    return paths.checkpoints_dir() / run_id.kind / run_id.key


def _finished(report: _progress.Status | None, run_id: RunId, result: Mapping[str, Any] | None = None,
              error: BaseException | None = None) -> None:
    """Tell ``report`` (when there is one) that run ``run_id`` is stored (``result``, else read back from the
    store) or was stopped by ``error`` (one of the caller's ``skip``); a run it knew as stored, or as
    finished already, stays as it was."""
    if report is None or not report.waiting(run_id):
        return
    if error is None and result is None:
        result = store.load(run_id)
    report.finished(run_id, None if result is None else result.get("history"), failed=error or result is None)


def _pool_devices(workers: int, runs: int, device: str | torch.device | None) -> list[str] | None:
    """How ``run_many``'s pool trains ``runs`` runs: [] on the CPU, the GPUs of one worker each on CUDA
    with several visible; None when there is no pool (one worker or run, one GPU, an indexed device)."""
    import torch

    if workers == 1 or runs < 2:
        return None
    target = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if target.type == "cpu":
        return []
    devices = _device_slots() if target.type == "cuda" and target.index is None else []
    return devices if len(devices) > 1 else None


def _run_free_first(missing: list[tuple[RunId, Config]], build: Callable[[Config], Setup],
                    extras: Callable[[nn.Module], Mapping[str, Any]] | None, skip: tuple[type[BaseException], ...],
                    progress: bool, device: str | torch.device | None,
                    report: _progress.Status | None = None) -> dict[RunId, BaseException]:
    """Train the ``missing`` runs (id, config) in this process, each time one that no other process
    trains now when there is one (so two launchers on the same runs share them out); returns the errors
    of type ``skip`` by run."""
    failed: dict[RunId, BaseException] = {}
    pending = list(missing)
    while pending:
        chosen = next((run for run in pending if not store.busy(run[0])), pending[0])
        pending.remove(chosen)
        run_id, config = chosen
        try:
            _finished(report, run_id, _run(run_id, config, build, extras=extras, progress=progress, device=device))
        except skip as error:
            failed[run_id] = error
            _finished(report, run_id, error=error)
    return failed


def _sendable(build: Callable, extras: Callable | None, where: str) -> None:
    """A ValueError unless ``build`` and ``extras`` pickle (they go to other processes: ``where``)."""
    import pickle

    for name, function in (("build", build), ("extras", extras)):
        try:
            pickle.dumps(function)
        except Exception as error:
            raise ValueError(f"run_many({where}) sends {name} to other processes, so it must be a module-level "
                             "function of an importable module (not one defined in a notebook or a lambda); got "
                             f"{function!r}, or train in this process (workers=1, executor processes)") from error


def _gather(jobs: Mapping[Any, RunId], skip: tuple[type[BaseException], ...], bar,
            report: _progress.Status | None = None) -> dict[RunId, BaseException]:
    """Wait for the jobs (future -> run) as they finish (each told to ``report``); returns the errors of
    type ``skip`` by run, raises the first other error."""
    import concurrent.futures

    failed: dict[RunId, BaseException] = {}
    for job in concurrent.futures.as_completed(jobs):
        error = job.exception()
        if error is not None and not isinstance(error, skip):
            raise error
        if error is not None:
            failed[jobs[job]] = error
        _finished(report, jobs[job], error=error)
        bar.update()
    return failed


def _run_on(executor, kind: str, missing: list[tuple[RunId, Config]], build: Callable[[Config], Setup],
            extras: Callable[[nn.Module], Mapping[str, Any]] | None, skip: tuple[type[BaseException], ...],
            progress: bool, device: str | None, report: _progress.Status | None = None) -> dict[RunId, BaseException]:
    """Train and store the ``missing`` runs (id, config) as jobs of ``executor`` (``run_many``'s part for
    an executor); returns the errors of type ``skip`` by run. Another error is raised once every job is
    done."""
    import concurrent.futures

    _sendable(build, extras, f"executor={type(executor).__name__}")
    build_dir = str(paths.build_dir())
    jobs = {executor.submit(_train_job, build_dir, run_id, config, build, extras, device): run_id
            for run_id, config in missing}
    with tqdm(total=len(jobs), desc=f"{kind}: {len(jobs)} runs on {type(executor).__name__}",
              disable=not progress) as bar:
        try:
            return _gather(jobs, skip, bar, report)
        except Exception:
            concurrent.futures.wait(jobs)  # the other runs still finish and are stored
            raise


def _run_in_processes(kind: str, missing: list[tuple[RunId, Config]], build: Callable[[Config], Setup],
                      extras: Callable[[nn.Module], Mapping[str, Any]] | None, workers: int,
                      skip: tuple[type[BaseException], ...], progress: bool,
                      devices: list[str], report: _progress.Status | None = None) -> dict[RunId, BaseException]:
    """Train and store the ``missing`` runs (id, config) in ``workers`` spawned processes, on the CPU or,
    with ``devices``, one GPU each (``run_many``'s pool); returns the errors of type ``skip`` by run.
    Another error stops waiting (the running jobs still finish and are stored) and is raised; Ctrl-C or
    SIGTERM kills the workers and one line says what was kept."""
    _sendable(build, extras, f"workers={workers}")
    pool = _start_pool(min(workers, len(missing)), devices)
    build_dir, device = str(paths.build_dir()), "cuda" if devices else "cpu"
    where = f" on {len(devices)} GPUs" if devices else ""
    bar = tqdm(total=len(missing), desc=f"{kind}: {len(missing)} runs, {workers} processes{where}", disable=not progress)
    try:
        with _terminate_raises(), bar:
            jobs = {pool.submit(_train_job, build_dir, run_id, config, build, extras, device): run_id
                    for run_id, config in missing}
            try:
                failed = _gather(jobs, skip, bar, report)
            except Exception:
                pool.shutdown()  # after an error, the other runs still finish and are stored
                raise
    except (KeyboardInterrupt, SystemExit):
        _stop(pool)
        done = sum(store.exists(run_id) for run_id, _ in missing)
        print(f"interrupted: {done} of {len(missing)} {kind} runs finished and are stored; the running ones "
              "keep their checkpoint of their last finished epoch; run the same command again to resume",
              file=sys.stderr, flush=True)
        raise
    pool.shutdown()
    return failed
