from dptrain.cli.main import main


def test_train_plot_and_overlay(data_dir, tmp_path, capsys):
    common = ["train", "--data-dir", data_dir, "--epochs", "2", "--max-batches", "2", "--eval-batches", "1"]
    assert main(common + ["--devices", "1", "--metrics", str(tmp_path / "one.jsonl"),
                          "--plot", str(tmp_path / "one.png")]) == 0
    assert (tmp_path / "one.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(common + ["--devices", "2", "--metrics", str(tmp_path / "two.jsonl")]) == 0
    capsys.readouterr()
    assert main(["plot", str(tmp_path / "one.jsonl"), str(tmp_path / "two.jsonl"), "-o", str(tmp_path / "c.svg")]) == 0
    svg = (tmp_path / "c.svg").read_text()
    for text in ("lenet-scratch on [cpu:0]", "lenet-scratch on [cpu:0, cpu:1]", "test accuracy", "train loss", "epoch"):
        assert text in svg


def test_plot_errors(tmp_path, capsys):
    assert main(["train", "--plot", str(tmp_path / "x.gif")]) == 2
    assert "must end in .png, .svg or .pdf" in capsys.readouterr().err
    (tmp_path / "empty.jsonl").write_text("")
    assert main(["plot", str(tmp_path / "empty.jsonl"), "-o", str(tmp_path / "o.png")]) == 2
    assert "holds no metrics records" in capsys.readouterr().err
    assert main(["plot", str(tmp_path / "missing.jsonl"), "-o", str(tmp_path / "o.png")]) == 2
    assert "cannot read metrics file" in capsys.readouterr().err
