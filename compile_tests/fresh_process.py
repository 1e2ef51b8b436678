"""Test calls in processes of their own, forked from a server that imported torch and the library once.

A host-side check on CUDA that crashes (the SIGSEGV of issue 25) must fail its own case only, so each bad-input case
runs in a process of its own. A `python -c` per case pays a Python start, a torch import and a library load (1.6 s a
case at 14 workers on the H200, which outran the GPU suite's call); these processes are forked from a server
(multiprocessing's forkserver) that preloaded torch and the library before any CUDA initialization
(cuda_case_server.py), so a case costs a fork and its own CUDA context. The calls run a few at a time.

A job is (module, function, args, env): the child sets env (None values unset it), imports the module by name (the
suites' folder is on the server's path), calls function(*args), and reports whether it raised and with what.
"""

from __future__ import annotations

import concurrent.futures
import functools
import multiprocessing
import os
import signal
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
CHILD_TIMEOUT_S = 120


@dataclass(frozen=True)
class Job:
    module: str
    function: str
    args: tuple = ()
    env: tuple = ()  # ((name, value or None), ...): None unsets the variable


@dataclass
class ChildResult:
    returncode: int  # -999: hung; < 0: killed by that signal
    report: dict | None  # {"raised": bool, "type": ..., "message": ...}; None if the child died first
    output: str  # the child's stdout and stderr

    def failure(self) -> str | None:
        """Why the child did not finish normally (crashed, hung, exited early), or None."""
        tail = self.output[-3000:]
        if self.returncode == -999:
            return f"the child process hung: {tail}"
        if self.returncode < 0:
            try:
                sig = signal.Signals(-self.returncode).name
            except ValueError:
                sig = f"signal {-self.returncode}"
            return f"the process crashed ({sig}) instead of raising\n{tail}"
        if self.returncode != 0 or self.report is None:
            return f"the child exited {self.returncode} without a report\n{tail}"
        return None


@functools.lru_cache(maxsize=1)
def _context():
    if str(HERE) not in sys.path:  # the server and the children import the suites by name
        sys.path.insert(0, str(HERE))
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["cuda_case_server"])
    return context


def _child(job: Job, report, log_path: str) -> None:
    with open(log_path, "w") as log:  # the child's output, for the failure message
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    for name, value in job.env:  # the library reads these at each call
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    import importlib

    import torch

    assert not torch.cuda.is_initialized(), "the case server initialized CUDA before forking"
    import kdtree_ops.ops  # noqa: F401  (loaded in the server already where a build was cached)

    function = getattr(importlib.import_module(job.module), job.function)
    try:
        function(*job.args)
        result = {"raised": False}
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as exc:  # reported, not raised: the parent judges it (pytest.raises' Failed included)
        result = {"raised": True, "type": type(exc).__name__, "message": str(exc)}
    report.send(result)


def run(job: Job) -> ChildResult:
    context = _context()
    receive, send = context.Pipe(duplex=False)
    with tempfile.NamedTemporaryFile("r", suffix=".log") as log:
        process = context.Process(target=_child, args=(job, send, log.name))
        process.start()
        send.close()
        try:
            report = receive.recv() if receive.poll(CHILD_TIMEOUT_S) else None
        except EOFError:  # the child died before it reported
            report = None
        process.join(30)
        if process.exitcode is None:
            process.kill()
            process.join()
            return ChildResult(-999, None, f"timed out after {CHILD_TIMEOUT_S} s\n{log.read()}")
        return ChildResult(process.exitcode, report, log.read())


def run_all(jobs: dict[str, Job]):
    """A generator fixture's body: yields {name: Future[ChildResult]}, the jobs running a few at a time."""
    workers = max(1, min(16, (os.cpu_count() or 2) - 1))
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        yield {name: pool.submit(run, job) for name, job in jobs.items()}


def selected_params(request, param: str) -> list:
    """The values of parametrize argument `param` among this session's items of the requesting module."""
    return [item.callspec.params[param] for item in request.session.items
            if item.module is request.module and hasattr(item, "callspec") and param in item.callspec.params]


def bad_input_jobs(request, module: str, value_cases) -> dict[str, Job]:
    """The selected `case_id`s of a DDTree suite's bad-input test as jobs of `module.raise_bad_input(case_id, "cuda")`,
    the value checks with KDTREE_OPS_DEBUG=1 (the only mode in which CUDA reads values)."""
    return {case_id: Job(module, "raise_bad_input", (case_id, "cuda"), (
        ("KDTREE_OPS_DEBUG", "1" if case_id in value_cases else None), ("KDTREE_OPS_UNVERIFIED", "1")))
        for case_id in selected_params(request, "case_id")}


def assert_raised_as_expected(result: ChildResult) -> None:
    """A raise_bad_input child: it finished, and its pytest.raises held (the child reports no exception)."""
    failure = result.failure()
    assert failure is None, failure
    assert not result.report["raised"], f"{result.report['type']}: {result.report['message']}"
