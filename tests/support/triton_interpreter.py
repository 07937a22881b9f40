"""Triton kernels tested on the CPU: cases run in one subprocess under
``TRITON_INTERPRET=1`` (fixed when a ``@triton.jit`` function is defined, so it must
never leak into the rest of the suite), reported as one JSON object the pytest side
parametrizes over."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable

import pytest

from harness.procs import REPO_ROOT

Case = Callable[[], float | str]


class Cases(dict[str, Case]):
    """Named cases, each returning an error measure (or a text saying what failed)."""

    def case(self, name: str) -> Callable[[Case], Case]:
        """Decorator: register the function as case ``name``."""
        def register(fn: Case) -> Case:
            self[name] = fn
            return fn

        return register

    def report(self) -> None:
        """Run every case and print name -> result as one JSON line; an exception
        becomes that case's result text."""
        results: dict[str, float | str] = {}
        for name, fn in self.items():
            try:
                results[name] = fn()
            except Exception as exc:  # reported per case by the pytest side
                results[name] = f"{type(exc).__name__}: {exc}"
        print(json.dumps(results))


def run_cases_module(module: str, timeout_s: float = 240) -> tuple[dict, str]:
    """(the JSON results, the whole stdout) of ``python -m module`` under the
    interpreter; fails the calling test with the stderr tail if the module did."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-m", module], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout_s)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stdout


def error_suite(cases_module: str, case_names: list[str], tolerance: Callable[[str], float]
                ) -> tuple[Callable, Callable, Callable]:
    """The ``results`` fixture and the two tests of a suite whose cases each return an
    error measure: every case of ``case_names`` ran (and no other), and each one's error
    is a float below ``tolerance(name)``. A test module binds them to the names
    ``results``, ``test_every_case_ran`` and ``test_triton_matches_reference``."""

    @pytest.fixture(scope="module")
    def results() -> dict[str, float | str]:
        return run_cases_module(cases_module)[0]

    def test_every_case_ran(results):
        assert sorted(results) == sorted(case_names)

    @pytest.mark.parametrize("name", case_names)
    def test_triton_matches_reference(results, name):
        error = results[name]
        assert isinstance(error, float), error
        assert error < tolerance(name)

    return results, test_every_case_ran, test_triton_matches_reference
