"""The host loop's one-hour ETA note (`Pace.eta_note`, rl/runners/loop.py) at its boundary."""

from __future__ import annotations

import pytest

from rl.runners.loop import Pace


@pytest.mark.parametrize("left_s, says", [(3600, False), (3601, True)])
def test_eta_note_only_when_the_rest_takes_over_an_hour(left_s, says):
    """At 10 env steps/s, exactly one hour left is not over an hour: no note; one second more is."""
    pace = Pace(train_from=0, total=200 + 10 * left_s)
    pace.record(0, 100, 10.0)
    pace.record(100, 200, 10.0)
    assert pace.rate == 10.0
    assert (pace.eta_note(200, num_seeds=1) is not None) == says
