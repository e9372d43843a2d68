"""Where ``pool.run_many`` trains the missing runs, named by an executor spec (``--executor SPEC`` of
``python -m mdlib run|book``, ``executor: SPEC`` in a profile, ``$MDLIB_EXECUTOR``); no torch here, so
the book's process checks a spec without importing it::

    processes               run_many's own pool of ``workers`` processes (the default)
    dask-local:N            a Dask LocalCluster of N single-threaded worker processes on this machine
    dask:ADDRESS            the Dask scheduler at ADDRESS, e.g. dask:tcp://node7:8786 (``dask scheduler``,
                            a dask_jobqueue.SLURMCluster); its workers share the build folder
"""

from __future__ import annotations

import contextlib

__all__ = ["EXECUTOR_ENV", "EXECUTOR_SPECS", "open_executor", "parse_executor"]

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
