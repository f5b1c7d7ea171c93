"""The worker's error file: what torchrun's agent reads of a failed worker, whole or absent."""
import pytest
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from dptrain.distributed import worker


def test_the_agent_reads_the_error_line_and_the_rank_it_blames(tmp_path, monkeypatch):
    path = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
    worker.record_error("rank 0 of 2 lost its connection", blames=1)
    failure = ProcessFailure(local_rank=0, pid=1, exitcode=1, error_file=str(path))
    assert failure.message == "rank 0 of 2 lost its connection"
    assert failure.error_file_data["blames"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["error.json"]       # no temp file left


def test_a_signal_during_the_write_leaves_no_half_file_for_the_agent(tmp_path, monkeypatch):
    """The agent stops the other workers (SIGTERM) and then reads their error files: one cut
    short mid-write was an empty file, and the agent itself died on it (JSONDecodeError) instead
    of restarting the job."""
    path = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))

    def cut(record):
        raise KeyboardInterrupt          # as a signal's handler would, between open and write
    monkeypatch.setattr(worker.json, "dumps", cut)
    monkeypatch.setattr(worker.json, "dump", lambda record, f: cut(record))
    with pytest.raises(KeyboardInterrupt):
        worker.record_error("rank 0 of 2 lost its connection")
    assert list(tmp_path.iterdir()) == []
    ProcessFailure(local_rank=0, pid=1, exitcode=1, error_file=str(path))     # read as "no error file"


def test_no_error_file_is_written_outside_a_launched_job(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    monkeypatch.chdir(tmp_path)
    worker.record_error("anything")
    assert list(tmp_path.iterdir()) == []
