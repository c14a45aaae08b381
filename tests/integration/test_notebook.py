"""In Jupyter: a Profile block shows its report inline, and %%loadprof profiles a cell;
a real notebook executed headless by nbclient on an ipykernel."""

from __future__ import annotations

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("torch")

TRAIN = """\
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(160, 8), torch.randint(0, 2, (160,))),
                                   batch_size=16)
for x, y in data:
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
"""


def _html(cell) -> list[str]:
    return [o["data"]["text/html"] for o in cell.outputs if "text/html" in o.get("data", {})]


def _stderr(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.get("name") == "stderr")


def _job_file(path) -> None:
    """A two-rank job's merged report whose GPUs idle 60% of each step (conftest's starved run)."""
    from loadprof.jobs.records import JobRun, RankRun
    from loadprof.report.job import build_job_report
    from tests.conftest import starved_run

    ranks = []
    for r in (0, 1):
        run = starved_run()
        for g in run.gpu_samples:
            g.index = r
        ranks.append(RankRun(rank=r, world_size=2, local_rank=r, host="node0", run=run))
    path.write_text(build_job_report(JobRun(world_size=2, ranks=ranks, merged="at exit")).to_json())


@pytest.mark.slow
def test_a_notebook_shows_the_report_inline_and_the_cell_magic_profiles_a_cell(tmp_path):
    _job_file(tmp_path / "job.json")
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("import torch\nfrom loadprof import Profile"),
        nbformat.v4.new_code_cell("with Profile(gpu=False, host_helper=False, gpu_hour_price=2.0) as prof:\n"
                                  + "".join("    " + line + "\n" for line in TRAIN.splitlines())),
        nbformat.v4.new_code_cell("%load_ext loadprof"),
        nbformat.v4.new_code_cell("%%loadprof --no-gpu --max-steps 6\n" + TRAIN),
        nbformat.v4.new_code_cell("print(_loadprof.report.steps['count'], prof.report.steps['count'])"),
        nbformat.v4.new_code_cell("import loadprof.report\nloadprof.report.load_report('job.json', gpu_hour_price=2.0)"),
    ]
    nbclient.NotebookClient(nb, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    block, magic, counts = nb.cells[1], nb.cells[3], nb.cells[4]
    (page,) = _html(block)
    assert "loadprof verdict:" in page and "max-width" in page
    assert "Cost: not measured (no GPU readings: GPU unavailable (GPU sampling turned off))" in page
    assert "loadprof verdict" not in _stderr(block)  # the terminal panels are not printed as well
    (page,) = _html(magic)
    assert "loadprof verdict:" in page
    assert [o["output_type"] for o in magic.outputs if "text/html" in o.get("data", {})] == ["execute_result"]
    assert counts.outputs[0]["text"].split() == ["6", "10"]  # --max-steps stopped the cell's loop
    (page,) = _html(nb.cells[5])  # a job's merged report, its cost summed over its ranks' GPUs
    assert "loadprof verdict:" in page
    assert "Cost: input wait 28.80 GPU-h/day on 2 GPUs of 2 ranks" in page
    assert "at 2/GPU-h: 57.60/day lost to input" in page
