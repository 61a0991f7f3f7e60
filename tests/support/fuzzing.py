"""Hypothesis profiles: the default run is deterministic, ``python3 dev.py fuzz`` explores (ADR 0009).

- ``ci`` is loaded by ``tests/support/fixtures.py`` for every run, so ``python3 dev.py test`` draws the same
  examples on every machine and every time: derandomized, no example database, no deadline (a loaded
  2-core machine is not a bug), and the reproduction blob printed with any failure.
- ``fuzz`` (``--hypothesis-profile=fuzz``, what ``python3 dev.py fuzz`` passes) draws with random seeds and
  10,000 examples per ``fuzz``-marked property. Its findings are reported, and each one is then kept as an
  explicit ``@example`` so that the deterministic run guards it from then on.

The ``fuzz``-marked properties run in both: :func:`fuzz_settings` gives them a fixed moderate count in a
derandomized run and the profile's count in an exploratory one.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

DETERMINISTIC = "ci"
EXPLORATORY = "fuzz"
FUZZ_EXAMPLES = 10_000
# Per fuzz property in the deterministic run: the same 300 examples each time, a few seconds per property.
DETERMINISTIC_FUZZ_EXAMPLES = 300


def register_profiles() -> None:
    """Register the ``ci`` and ``fuzz`` profiles (replacing hypothesis' own ``ci``)."""
    for name, randomness in (
        (DETERMINISTIC, {"derandomize": True, "database": None}),
        (EXPLORATORY, {"derandomize": False, "max_examples": FUZZ_EXAMPLES}),
    ):
        settings.register_profile(
            name,
            deadline=None,
            print_blob=True,
            suppress_health_check=[HealthCheck.too_slow],
            **randomness,
        )


def fuzz_settings() -> settings:
    """Settings for a ``fuzz``-marked property, read from the active profile when the test is defined.

    A random run (the ``fuzz`` profile) explores with the profile's count; a derandomized run repeats the
    same examples every time, so a moderate fixed count is all it needs.
    """
    active = settings.default
    assert active is not None
    count = DETERMINISTIC_FUZZ_EXAMPLES if active.derandomize else active.max_examples
    return settings(max_examples=count)
