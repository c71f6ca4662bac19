"""The command's torch thread budget (`posbias --threads`) and the busy-core warning."""
import torch
from typer.testing import CliRunner

from posbias.cli.main import app
from posbias.utils.threads import THREADS_ENV, busy_core_hint, busy_cores, thread_budget
from posbias.utils.workers import threads_per_worker


def test_busy_cores_count_work_running_now_and_for_the_last_minute():
    assert busy_cores("1.02 0.83 1.47 2/345 12345") == (1, 1.02)  # one job besides the reader
    assert busy_cores("2.00 1.50 1.00 1/99 7") == (0, 2.0)  # the jobs behind the load just ended
    assert busy_cores("0.10 0.20 0.30 3/99 7") == (0, 0.1)  # a momentary burst, not a job
    assert busy_cores("3.90 3.00 2.00 5/99 7") == (4, 3.9)


def test_the_warning_names_a_thread_count_that_fits_the_free_cores():
    line = busy_core_hint(threads=2, cores=2, busy=1, load=1.0)
    assert "1 of 2 CPU cores are busy" in line and "posbias --threads 1" in line and "free cores" in line
    assert busy_core_hint(threads=8, cores=8, busy=3, load=3.2).count("--threads 5") == 1
    assert "every core is busy" in busy_core_hint(threads=2, cores=2, busy=2, load=2.0)
    assert busy_core_hint(threads=1, cores=2, busy=1, load=1.0) is None  # fits beside the other job
    assert busy_core_hint(threads=2, cores=2, busy=0, load=0.0) is None  # idle machine


def test_threads_option_sets_torch_and_the_workers_share(monkeypatch):
    monkeypatch.delenv(THREADS_ENV, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "6")
    assert thread_budget() == 6 and threads_per_worker(2) == 3
    before = torch.get_num_threads()
    try:
        result = CliRunner().invoke(app, ["--threads", "4", "tune", "--help"])
        assert result.exit_code == 0, result.output
        assert torch.get_num_threads() == 4
        assert thread_budget() == 4 and threads_per_worker(3) == 1  # --threads wins over OMP_NUM_THREADS
    finally:
        torch.set_num_threads(before)


def test_a_command_beside_a_busy_core_prints_the_warning_once(tmp_path, monkeypatch):
    from posbias.utils import threads

    loadavg = tmp_path / "loadavg"
    loadavg.write_text("1.10 0.90 0.50 2/120 4242\n")
    monkeypatch.setattr(threads, "LOADAVG", str(loadavg))
    monkeypatch.setattr(threads, "cpu_cores", lambda: 2)
    monkeypatch.delenv(threads.NO_HINT_ENV)
    monkeypatch.delenv(THREADS_ENV, raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    result = CliRunner().invoke(app, ["tune", "--help"])
    assert result.exit_code == 0
    assert result.output.count("1 of 2 CPU cores are busy (1-minute load 1.1)") == 1
    before = torch.get_num_threads()
    try:
        result = CliRunner().invoke(app, ["--threads", "1", "tune", "--help"])
        assert "cores are busy" not in result.output
    finally:
        torch.set_num_threads(before)
