"""What a worker publishes again after a NATS reconnect: the last window's chunks, in order."""

from __future__ import annotations

from workers.recent_chunks import RecentChunks


def test_the_window_keeps_the_last_seconds_in_order() -> None:
    recent = RecentChunks(window_s=10.0, max_items=100)
    for t in range(20):
        recent.add(float(t), f"tok.{t % 3}", bytes([t]))
    assert recent.since(19.0) == [(f"tok.{t % 3}", bytes([t])) for t in range(9, 20)]
    assert len(recent) == 11  # older ones dropped as new ones came
    assert recent.since(40.0) == []  # nothing recent long after


def test_the_bound_on_items_holds_under_a_burst() -> None:
    recent = RecentChunks(window_s=10.0, max_items=5)
    for i in range(50):
        recent.add(1.0, "tok.x", bytes([i]))
    assert [p for _, p in recent.since(1.0)] == [bytes([i]) for i in range(45, 50)]
