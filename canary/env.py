"""The ``CANARY_*`` environment variables: read once, checked, with errors that say what to set."""

from __future__ import annotations

import os
from collections.abc import Mapping

# What ``canary run`` sets for the job's ranks (``canary.mpi_runner`` reads them)
CHAOS_ENV = "CANARY_CHAOS_MIGRATE"  # a seed: random moves (tests, experiments)
BALANCE_ENV = "CANARY_BALANCE"  # on | off (--balance)
CHECKPOINT_ENV = "CANARY_CHECKPOINT"  # the snapshot folder (--checkpoint)
CHECKPOINT_EVERY_ENV = "CANARY_CHECKPOINT_EVERY"  # seconds between snapshots
KEEP_ENV = "CANARY_KEEP"  # snapshots kept
SLOWDOWN_ENV = "CANARY_SLOWDOWN"  # WORKER:FACTOR: a slower machine (experiments)
# Read by canary.run on rank 0 (set by the user, not by canary run)
PROGRESS_ENV = "CANARY_PROGRESS_S"  # seconds between progress lines (0: none)


def env_number(name: str, default: float, minimum: float = 0.0, integer: bool = False,
               environ: Mapping[str, str] = os.environ, above: bool = False) -> float:
    """The value of environment variable ``name`` as a number (``default`` when unset or empty).

    Raises ValueError naming the variable, its value and what it accepts when the value is not
    a number (an integer if ``integer``) or is below ``minimum`` (or equal to it, if ``above``):
    a typo in a launch script must not silently fall back to the default.
    """
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    want = "an integer" if integer else "a number"
    rule = f"{want} {'>' if above else '>='} {minimum:g}"
    try:
        value = float(int(raw)) if integer else float(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not {want}: set it to "
                         f"{rule} or unset it (default {default:g})") from None
    if not (value > minimum if above else value >= minimum):  # also rejects nan
        raise ValueError(f"environment variable {name}={raw!r} is "
                         f"{'not above' if above else 'below'} {minimum:g}: set it to "
                         f"{rule} or unset it (default {default:g})")
    return value


def env_choice(name: str, choices: tuple[str, ...], default: str,
               environ: Mapping[str, str] = os.environ) -> str:
    """The value of environment variable ``name``, one of ``choices`` (``default`` when unset or
    empty). Raises ValueError naming the variable, its value and the choices otherwise."""
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    if raw not in choices:
        raise ValueError(f"environment variable {name}={raw!r} is not one of "
                         f"{', '.join(choices)}: set one of them or unset it (default {default})")
    return raw
