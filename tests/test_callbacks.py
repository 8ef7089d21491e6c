"""Callback delivery against receivers that misbehave: one that accepts the connection and never
answers, one that trickles its answer a byte at a time (each read arrives before a per-read timeout
would fire), beside a receiver that answers at once. Two deliverers (as two API processes) share one
real SQLite store; receivers are real HTTP servers on loopback."""

from __future__ import annotations

import collections
import socket
import threading
import time

import pytest

from api.background.callbacks import Callbacks
from api.store import NewJob, Store, payload_hash
from settings.api import ApiConfig

from test_api_http import Receiver


class SilentReceiver:
    """Accepts connections, reads what is sent, never answers (or trickles a byte every ``trickle_s``
    forever). Counts the connections open at once."""

    def __init__(self, trickle_s: float | None = None):
        self.trickle_s = trickle_s
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/hook"
        self.open = 0
        self.most_open = 0
        self.connections = 0
        self.lock = threading.Lock()
        self.closing = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closing.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._hold, args=(conn,), daemon=True).start()

    def _hold(self, conn: socket.socket) -> None:
        with self.lock:
            self.open += 1
            self.connections += 1
            self.most_open = max(self.most_open, self.open)
        try:
            conn.settimeout(0.2)
            sent_status = False
            while not self.closing.is_set():
                try:
                    if not conn.recv(65536):
                        return  # the client gave up
                except TimeoutError:
                    pass
                if self.trickle_s is not None:
                    conn.sendall(b"HTTP/1.1 200 OK\r\n" if not sent_status else b"X")
                    sent_status = True
                    time.sleep(self.trickle_s)
        except OSError:
            return
        finally:
            with self.lock:
                self.open -= 1
            conn.close()

    def close(self) -> None:
        self.closing.set()
        self.sock.close()


@pytest.fixture
def receivers():
    made = {"hung": SilentReceiver(), "trickle": SilentReceiver(trickle_s=0.2), "good": Receiver(refuse=0)}
    yield made
    for r in made.values():
        r.close()


def _accept(store: Store, n: int, url: str) -> str:
    request = {"work_id": "w", "shot_id": f"s{n}", "prompt": "p"}
    job = NewJob(
        kind="r2v",
        work_id="w",
        shot_id=f"s{n}",
        job_id=f"job-{n}",
        request=request,
        payload_hash=payload_hash(request),
    )
    version = store.accept(job).version_id
    store.enqueue_callback(version, url, {"version_id": version, "status": "succeeded"})
    return version


def test_hung_and_trickling_receivers_delay_no_other_callback_and_are_retried(tmp_path, receivers):
    api = ApiConfig(
        callback_timeout_seconds=3.0,
        callback_backoff_seconds=0.2,
        callback_max_attempts=2,
        callback_concurrency=6,  # the two misbehaving receivers can hold 4 of a deliverer's slots
        callback_concurrency_per_host=2,
    )
    url = api.resolved_database_url(tmp_path / "state")
    stores = [Store(url), Store(url)]  # two API processes' stores on one database
    store = stores[0]
    # The misbehaving receivers' callbacks are due first: a sequential outbox would wait on each.
    hung = [_accept(store, n, receivers["hung"].url) for n in range(3)]
    trickled = [_accept(store, n, receivers["trickle"].url) for n in range(3, 5)]
    good = [_accept(store, n, receivers["good"].url) for n in range(5, 11)]

    stopping = threading.Event()
    deliverers = [Callbacks(s, api, stopping) for s in stores]
    threads = [threading.Thread(target=d.loop, daemon=True) for d in deliverers]
    started = time.time()
    for t in threads:
        t.start()
    try:
        deadline = time.time() + 30
        while len(receivers["good"].delivered) < len(good) and time.time() < deadline:
            time.sleep(0.05)
        # Every good callback arrived before any hung or trickled attempt had ended.
        assert sorted(d["body"]["version_id"] for d in receivers["good"].delivered) == sorted(good)
        ended = [store.callback_for(v) for v in hung + trickled]
        assert [d.attempts for d in ended] == [0] * len(ended), [(d.attempts, d.last_error) for d in ended]
        assert max(d["at"] for d in receivers["good"].delivered) - started < api.callback_timeout_seconds

        # The others are retried as configured, each attempt cut at the timeout (the trickle too).
        def gave_up():
            return all(store.callback_for(v).status == "gave_up" for v in hung + trickled)

        deadline = time.time() + 60
        while not gave_up() and time.time() < deadline:
            time.sleep(0.2)
        for v in hung + trickled:
            d = store.callback_for(v)
            assert (d.status, d.attempts) == ("gave_up", 2), (v, d)
            assert "callback_timeout_seconds (3 s)" in d.last_error
    finally:
        stopping.set()
        for t in threads:
            t.join(timeout=10)
        for s in stores:
            s.close()

    # Exactly once each across both deliverers, with the outbox's delivery id.
    counts = collections.Counter(d["body"]["version_id"] for d in receivers["good"].delivered)
    assert dict(counts) == {v: 1 for v in good}
    assert {d["delivery_id"] for d in receivers["good"].delivered} == {
        Store(url).callback_for(v).delivery_id for v in good
    }
    assert sum(d.delivered for d in deliverers) == len(good)
    # No receiver host held more attempts at once than callback_concurrency_per_host, summed over
    # the two deliverers (each has its own slots); every attempt was its own connection.
    assert receivers["hung"].most_open <= 2 * api.callback_concurrency_per_host
    assert receivers["hung"].connections == 2 * len(hung)


def test_each_callback_carries_the_shared_secret_its_receiver_asks_for(tmp_path, monkeypatch):
    """The Echo Director's channel, with its secret set, refuses a callback without it (401)."""
    monkeypatch.setenv("DIRECTOR_SECRET", " s3cret ")
    good = Receiver(refuse=0)
    api = ApiConfig(
        callback_secret_env="DIRECTOR_SECRET",
        callback_secret_urls=[good.url.rsplit("/", 1)[0] + "/"],  # the receiver's own base
        callback_backoff_seconds=0.1,
    )
    store = Store(api.resolved_database_url(tmp_path / "state"))
    version = _accept(store, 1, good.url)
    stopping = threading.Event()
    thread = threading.Thread(target=Callbacks(store, api, stopping).loop, daemon=True)
    thread.start()
    try:
        deadline = time.time() + 20
        while not good.delivered and time.time() < deadline:
            time.sleep(0.05)
        [delivery] = good.delivered
        assert delivery["body"]["version_id"] == version and delivery["secret"] == "s3cret"
    finally:
        stopping.set()
        thread.join(timeout=10)
        store.close()
        good.close()
    # A client names any callback URL: the secret goes only where the server YAML says.
    other = Store(api.resolved_database_url(tmp_path / "other"))
    deliverer = Callbacks(other, api, stopping)
    host = good.url.split("/hook")[0]
    assert deliverer.headers_for(good.url) == {"X-Nanobot-Director-Secret": "s3cret"}
    for elsewhere in (
        "http://attacker.example/hook",
        host + "0/hook",  # another port that starts alike
        host.replace("127.0.0.1", "127.0.0.2") + "/hook",
        "https" + host[4:] + "/hook",
    ):
        assert deliverer.headers_for(elsewhere) == {}, elsewhere
    monkeypatch.delenv("DIRECTOR_SECRET")  # unset: no such header at all
    assert Callbacks(other, api, stopping).headers_for(good.url) == {}
    other.close()
