"""``stage`` names where an exception came from (the innermost stage), and ``noted`` adds a
line of advice where its function gives one, read only when an exception passes."""
import sys

import pytest

from dptrain.core.stage import noted, stage, stage_of


def test_the_innermost_stage_names_the_exception():
    with pytest.raises(KeyError) as failed:
        with stage("outer"), stage(lambda: "inner, batch 3"):
            raise KeyError("x")
    assert stage_of(failed.value) == "inner, batch 3"


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception notes: Python >= 3.11")
def test_noted_adds_its_line_only_when_it_gives_one_and_an_exception_passes():
    calls = []

    def line(text):
        calls.append(text)
        return text
    with noted(lambda: line("advice")):
        pass
    assert calls == []                   # (nothing read on the way through)
    with pytest.raises(ValueError) as failed:
        with noted(lambda: line(None)), noted(lambda: line("give DataLoader(...)")):
            raise ValueError("bad")
    assert failed.value.__notes__ == ["give DataLoader(...)"]
