"""Processes agree on sub-chunk ends and signals through the coordination service while compiled programs over
some of their devices run (rl/infra/distributed.py): 2 local processes x 2 CPU devices, gloo collectives."""

from __future__ import annotations

import json
import subprocess
import sys

from rl.infra import distributed
from tests.rl.infra.test_multiprocess import ROOT, _env, _finish
from tests.rl.infra.test_sharding import _free_port

SCRIPT = ROOT / "tests" / "multidevice" / "agreement.py"
ROUNDS = 300


def test_agreement_while_a_learner_program_runs_shares_process_0s_end_and_any_signal(tmp_path):
    out, port = tmp_path / "agreed.json", _free_port()
    procs = [subprocess.Popen([sys.executable, str(SCRIPT), str(out), str(ROUNDS)], cwd=ROOT, env=_env(port, i),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(2)]
    for code, text in _finish(procs, "agreement", watchdog_s=120):
        assert code == 0, text[-3000:]
    got = json.loads(out.read_text())
    assert got["finite"]
    # process 0's end (1000 i; process 1 proposed 1000 i + 7) and save (every third round; process 1 proposed
    # the others), and the signal only process 1 received
    assert got["agreed"] == [[1000 * i, 15 if i == ROUNDS - 3 else None, i % 3 == 0] for i in range(ROUNDS)]
    assert got["run_dir"] == "/tmp/run-of-0"  # process 0's run dir on every process


def test_agree_takes_process_0s_end_and_save_and_the_first_signal_received(monkeypatch):
    """One agreement with three processes' answers (patched exchange): the end and the save decision are
    process 0's, whoever proposes otherwise; the signal is this process's own, else the first one received."""
    answers = ["100,0,0", "250,0,1", "50,10,1"]
    sent = []
    monkeypatch.setattr(distributed, "exchange", lambda value: sent.append(value) or answers)
    assert distributed.agree(250, None, save=True) == (100, 10, False)
    assert distributed.agree(250, 15) == (100, 15, False)  # its own signal first
    answers[0], answers[2] = "100,0,1", "50,0,0"
    assert distributed.agree(50, None) == (100, None, True)
    assert sent == ["250,0,1", "250,15,0", "50,0,0"]


class _Store:
    """A coordination service's key-value store, the other process's values set in advance."""

    def __init__(self, other: dict[str, str]):
        self.kv = dict(other)

    def key_value_set(self, key, value):
        self.kv[key] = value

    def blocking_key_value_get(self, key, timeout_ms):
        return self.kv[key]

    def key_value_delete(self, key):
        del self.kv[key]


def test_exchange_returns_values_in_process_order_and_keeps_only_the_last_two_rounds(monkeypatch):
    """Process 1 of 2: each round returns [process 0's, its own] value; a process deletes its key of round
    r - 2 at round r (every process has read it by then), so a long run leaves at most two keys of its own in
    the store, never one per agreement."""
    import jax

    store = _Store({f"rl/exchange/{r}/0": f"p0-{r}" for r in range(1, 7)})
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(jax, "process_index", lambda: 1)
    monkeypatch.setattr(distributed, "_client", lambda: store)
    monkeypatch.setattr(distributed, "_round", 0)
    for r in range(1, 7):
        assert distributed.exchange(f"p1-{r}") == [f"p0-{r}", f"p1-{r}"]
        assert sorted(k for k in store.kv if k.endswith("/1")) == [
            f"rl/exchange/{q}/1" for q in range(max(1, r - 1), r + 1)]
