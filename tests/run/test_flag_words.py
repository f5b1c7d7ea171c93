"""``fit``'s errors name its keywords, not the command line's flags (the settings' checks are
written once, with the flags): ``resume=True``, not ``--resume``; the CLI keeps its flags."""
import pytest
import torch
from torch import nn

import dptrain
from dptrain.run.flag_words import as_keywords

DATA = (torch.randn(8, 2), torch.randint(0, 2, (8,)))


@pytest.mark.parametrize("settings, message", [
    ({"resume": True}, r"^resume=True needs checkpoint_dir=DIR \(where the checkpoint is\)"),
    ({"resume": True, "overwrite": True, "checkpoint_dir": "x"}, r"^resume=True continues a run and overwrite=True "
                                                                 r"replaces it: give one"),
    ({"checkpoint_every": 0}, r"^checkpoint_every must be a whole number >= 1, got 0"),
    ({"on_nan": "x"}, r"^unknown on_nan 'x'; choose one of stop, skip"),
    ({"log_grad_norm": True}, r"^log_grad_norm goes with log_every_n_steps=N"),
    ({"shuffle": 3}, r"^shuffle must be True or False, got 3"),
])
def test_fits_errors_name_its_keywords(settings, message):
    with pytest.raises(ValueError, match=message):
        dptrain.fit(nn.Linear(2, 2), DATA, log=None, **settings)


def test_a_missing_checkpoint_to_resume_from_says_the_keywords(tmp_path):
    with pytest.raises(dptrain.core.errors.CheckpointError, match=f"run once with checkpoint_dir {tmp_path / 'no'} "
                                                                 f"before resume=True"):
        dptrain.fit(nn.Linear(2, 2), DATA, log=None, resume=True, checkpoint_dir=tmp_path / "no")


def test_flags_of_other_tools_and_the_users_own_errors_are_left_as_they_are():
    assert as_keywords("--no-shuffle keeps the order; torchrun --nproc-per-node 2; --metrics FILE.jsonl") == \
        "shuffle=False keeps the order; torchrun --nproc-per-node 2; metrics_file=FILE.jsonl"

    class Mine(dptrain.Callback):
        def on_fit_start(self, run):
            raise ValueError("my script needs --resume")
    with pytest.raises(ValueError, match=r"^my script needs --resume(\n|$)"):
        dptrain.fit(nn.Linear(2, 2), DATA, log=None, devices=1, callbacks=[Mine()])


def test_the_command_line_keeps_its_flags(capsys):
    from dptrain.cli.main import main
    assert main(["train", "--recipe", "tests.tasks.gan:make_task", "--resume"]) == 2
    assert "--resume needs --checkpoint-dir DIR" in capsys.readouterr().err


def test_fits_lines_name_its_keywords_too():
    from dptrain.run.flag_words import keyword_log
    lines = []
    keyword_log(lines.append)("compiled in 3.1 sec (--compile default); --no-shuffle")
    assert lines == ["compiled in 3.1 sec (compile default); shuffle=False"] and keyword_log(None) is None


def test_a_resumed_fit_with_another_lr_takes_it_and_says_so(tmp_path):
    """The CLI's --lr was honoured on a resume; fit's lr= was silently the checkpoint's."""
    seen, lines = [], []

    class LearningRate(dptrain.Callback):
        def on_epoch_start(self, run, epoch):
            seen.append(run.engine.trainer.learning_rate)
    for lr, resume in ((0.05, False), (0.1, True)):
        dptrain.fit(nn.Linear(2, 2), DATA, epochs=1 + 2 * resume, lr=lr, checkpoint_dir=tmp_path, resume=resume,
                    devices=1, log=lines.append, progress=False, callbacks=[LearningRate()])
    assert seen == [0.05, 0.1, 0.1]
    assert "resuming with lr 0.1 (the checkpoint's run had 0.05)" in lines
