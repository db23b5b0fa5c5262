"""The many-seed loop helper: same answers as a plain loop, and a failing seed named."""

from __future__ import annotations

import os

import pytest

from tests.seeds import over_seeds


def test_answers_come_back_in_seed_order_from_every_process() -> None:
    got = over_seeds(lambda s: (s * s, os.getpid()), range(10), processes=3)
    assert [v for v, _ in got] == [s * s for s in range(10)]
    assert len({pid for _, pid in got}) == 3  # three processes answered


@pytest.mark.parametrize("bad", [0, 4, 7])  # checked by this process and by each fork
def test_the_first_failing_seed_is_named_with_its_traceback(bad: int) -> None:
    def check(s: int) -> int:
        assert s != bad and s != 8, f"wrong answer at {s}"
        return s

    with pytest.raises(AssertionError, match=rf"(?s)seed {bad} failed.*wrong answer at {bad}"):
        over_seeds(check, range(9), processes=3)
