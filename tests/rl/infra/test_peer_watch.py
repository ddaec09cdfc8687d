"""The peer watch (rl/infra/distributed.py `_watch`) against a scripted coordination store and clock: a peer
whose beat stops is reported once, after STALE_S, naming it; a peer that never started or left normally
(DONE) is not. The 2-process kill is tests/rl/runners/test_lost_process.py (slow tier)."""

from __future__ import annotations

import threading

import pytest

from rl.infra import distributed

KEY = "rl/alive/1/"


class Store:
    """The client's key-value calls; `tick(beat)` runs at each of this process's beats (the peers' side)."""

    def __init__(self, tick):
        self.values, self.tick, self.beats = {}, tick, 0

    def key_value_set(self, key, value, allow_overwrite=False):
        assert allow_overwrite
        self.values[key] = value
        if key == f"{KEY}0":
            self.beats += 1
            self.tick(self)

    def key_value_try_get(self, key):
        if key not in self.values:
            raise RuntimeError(f"NOT_FOUND: {key}")
        return self.values[key]


def _watch(tick, n=2, beats=100):
    """Run the watch as process 0 of `n` for at most `beats` beats of one second each: the reports."""
    reports, stop = [], threading.Event()
    store = Store(lambda s: (tick(s), s.beats >= beats and stop.set()))
    distributed._watch(store, KEY, 0, n, lambda who, e: reports.append((who, str(e))), stop,
                       clock=lambda: float(store.beats))
    return reports


@pytest.fixture(autouse=True)
def _no_waiting(monkeypatch):
    monkeypatch.setattr(distributed, "BEAT_S", 0.0)


def test_a_peer_whose_beat_stops_is_reported_once_after_stale_s():
    def peer(store):  # beats for 5 s, then dies
        if store.beats <= 5:
            store.values[f"{KEY}1"] = str(store.beats)

    assert _watch(peer) == [("process 1 of 2", "no heartbeat for 21 s")]


def test_the_silent_one_of_three_is_named():
    def peers(store):
        store.values[f"{KEY}1"] = str(store.beats)
        if store.beats <= 3:
            store.values[f"{KEY}2"] = str(store.beats)

    assert _watch(peers, n=3) == [("process 2 of 3", "no heartbeat for 21 s")]


def test_peers_that_beat_never_started_or_left_normally_are_not_reported():
    assert _watch(lambda s: s.values.__setitem__(f"{KEY}1", str(s.beats))) == []  # beating throughout
    assert _watch(lambda s: None) == []  # not yet at the loop: a slow start is not a death

    def done(store):  # beats, then leaves the watch
        store.values[f"{KEY}1"] = str(store.beats) if store.beats <= 5 else distributed.DONE

    assert _watch(done) == []


def test_a_peer_stale_by_one_second_less_than_stale_s_is_not_reported():
    def peer(store):
        if store.beats <= 80:
            store.values[f"{KEY}1"] = str(store.beats)

    assert _watch(peer, beats=80 + int(distributed.STALE_S)) == []
