"""CANARY_* environment variables: defaults, values, and errors that name the variable."""

from __future__ import annotations

import pytest

from canary.env import env_choice, env_number


def test_unset_or_empty_gives_the_default() -> None:
    assert env_number("CANARY_X", 7.5, environ={}) == 7.5
    assert env_number("CANARY_X", 7.5, environ={"CANARY_X": "  "}) == 7.5


def test_values_are_parsed() -> None:
    assert env_number("CANARY_X", 1.0, environ={"CANARY_X": "250"}) == 250.0
    assert env_number("CANARY_X", 1.0, environ={"CANARY_X": "0.5"}) == 0.5
    assert env_number("CANARY_X", 1, integer=True, environ={"CANARY_X": "0"}) == 0


@pytest.mark.parametrize("raw,integer,words", [
    ("fast", False, "is not a number"),
    ("1.5", True, "is not an integer"),
    ("-1", False, "is below 0"),
    ("nan", False, "is below 0"),
])
def test_bad_values_name_the_variable_and_what_to_set(raw: str, integer: bool,
                                                       words: str) -> None:
    with pytest.raises(ValueError) as err:
        env_number("CANARY_SPIN_US", 1000, integer=integer, environ={"CANARY_SPIN_US": raw})
    msg = str(err.value)
    assert "CANARY_SPIN_US" in msg and repr(raw) in msg and words in msg
    assert "unset it (default 1000)" in msg


def test_a_time_that_must_be_above_zero_refuses_zero() -> None:
    # CANARY_STARTUP_TIMEOUT=0 was accepted, and every job then failed blaming its driver
    with pytest.raises(ValueError) as err:
        env_number("CANARY_STARTUP_TIMEOUT", 120, above=True,
                   environ={"CANARY_STARTUP_TIMEOUT": "0"})
    assert str(err.value) == ("environment variable CANARY_STARTUP_TIMEOUT='0' is not above 0: "
                              "set it to a number > 0 or unset it (default 120)")
    assert env_number("CANARY_STALL_S", 10, above=True, environ={"CANARY_STALL_S": "0.5"}) == 0.5


def test_a_typo_in_canary_compile_after_stops_the_job_in_one_line() -> None:
    # it was read when canary.worker.chain was imported, and a typo ended every rank with a
    # traceback; now it is read with the other knobs
    from tests.conftest import mpirun

    r = mpirun(2, "apps/power_iteration.py", env_extra={"CANARY_COMPILE_AFTER": "2e5x"},
               timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.count("canary: error: environment variable CANARY_COMPILE_AFTER='2e5x' is "
                          "not an integer") == 1


def test_a_choice_is_one_of_its_values_or_a_clear_error() -> None:
    assert env_choice("CANARY_Y", ("full", "loop"), "full", environ={}) == "full"
    spaced = {"CANARY_Y": " loop "}
    assert env_choice("CANARY_Y", ("full", "loop"), "full", environ=spaced) == "loop"
    with pytest.raises(ValueError, match=r"CANARY_Y='all' is not one of full, loop"):
        env_choice("CANARY_Y", ("full", "loop"), "full", environ={"CANARY_Y": "all"})


def test_the_load_report_period_is_set_by_canary_report_ms_and_must_fit_the_stall_time() -> None:
    from canary.mpi_runner import check_report_period
    from canary.worker.config import WorkerConfig

    assert WorkerConfig.from_env({}).report_s == 0.5
    assert WorkerConfig.from_env({"CANARY_REPORT_MS": "20"}).report_s == pytest.approx(0.02)
    with pytest.raises(ValueError, match="CANARY_REPORT_MS='often' is not a number"):
        WorkerConfig.from_env({"CANARY_REPORT_MS": "often"})
    for bad in ("-5", "0"):  # -5 was told 'a number >= 0', and 0 was then refused
        with pytest.raises(ValueError, match=f"CANARY_REPORT_MS='{bad}' is not above 0: set it "
                                             "to a number > 0"):
            WorkerConfig.from_env({"CANARY_REPORT_MS": bad})
    check_report_period(0.5, 10.0)
    check_report_period(5.0, 15.0)
    # reports rarer than a third of the stall time would have working workers named as stuck
    for report_s, stall_s in ((5.0, 10.0), (0.0, 10.0)):
        with pytest.raises(ValueError, match="CANARY_REPORT_MS=.*CANARY_STALL_S"):
            check_report_period(report_s, stall_s)


def test_canary_keep_is_refused_by_its_own_name_below_1() -> None:
    # it said "--keep must be at least 1", a flag the user never gave, and "integer >= 0"
    from canary.mpi_runner import checkpoint_config

    for value, says in (("0", "CANARY_KEEP='0' is below 1: set it to an integer >= 1"),
                        ("abc", "CANARY_KEEP='abc' is not an integer: set it to an integer >= 1")):
        with pytest.raises(ValueError, match=says):
            checkpoint_config({"CANARY_CHECKPOINT": "/tmp/ck", "CANARY_KEEP": value})


def test_the_run_ahead_pace_is_set_by_canary_window_ms_and_0_fixes_the_window() -> None:
    from canary.worker.config import WorkerConfig

    assert WorkerConfig.from_env({}).window_s == 0.5
    assert WorkerConfig.from_env({"CANARY_WINDOW_MS": "2000"}).window_s == pytest.approx(2.0)
    assert WorkerConfig.from_env({"CANARY_WINDOW_MS": "0"}).window_s == 0.0
    with pytest.raises(ValueError, match="CANARY_WINDOW_MS='-1'"):
        WorkerConfig.from_env({"CANARY_WINDOW_MS": "-1"})
