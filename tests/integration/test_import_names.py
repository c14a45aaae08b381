"""The installed import name, loadprof, cannot shadow or be shadowed by a user's own
profiler.py or converters.py: the clash a training repository commonly has."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

USER_PROFILER = '''
import time


class Timer:
    """The user's own profiler module, as many training repositories have one."""

    def __enter__(self):
        self.t = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.t
'''

TRAIN = '''
import torch
from converters import to_tensor
from profiler import Timer

model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(640, 8)), batch_size=16)
with Timer() as t:
    for _ in range(2):
        for (x,) in data:
            opt.zero_grad()
            model(to_tensor(x)).sum().backward()
            opt.step()
print(f"trained in {t.seconds:.3f} s")
'''


@pytest.fixture
def user_repo(tmp_path: Path) -> Path:
    (tmp_path / "profiler.py").write_text(textwrap.dedent(USER_PROFILER))
    (tmp_path / "converters.py").write_text("def to_tensor(x):\n    return x\n")
    (tmp_path / "train_small.py").write_text(textwrap.dedent(TRAIN))
    return tmp_path


def test_a_script_importing_its_own_profiler_and_converters_runs_unchanged_under_loadprof(user_repo: Path) -> None:
    loadprof = Path(sys.executable).with_name("loadprof")
    proc = subprocess.run([str(loadprof), "diagnose", "--json", "run.json", "train_small.py"], cwd=user_repo,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "trained in" in proc.stdout
    report = json.loads((user_repo / "run.json").read_text())
    assert report["exit_status"] == "ok"
    assert report["verdict"] != "inconclusive"
    # The host helper process started from this folder too: its readings, not the thread's.
    assert not any("host sampler process" in line for line in report["limitations"]), report["limitations"]


def test_python_dash_m_loadprof_from_a_folder_with_those_modules(user_repo: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "loadprof", "diagnose", "train_small.py"], cwd=user_repo,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "trained in" in proc.stdout
    assert "loadprof verdict" in proc.stderr  # the report goes to stderr, the script keeps stdout


def test_every_public_name_of_each_package_resolves_to_an_object() -> None:
    code = ("import importlib\n"
            "for pkg in ('loadprof', 'loadprof.fixes', 'loadprof.samplers'):\n"
            "    module = importlib.import_module(pkg)\n"
            "    for name in module.__all__:\n"
            "        assert getattr(module, name) is not None, (pkg, name)\n"
            "print('ok')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
