"""Waiting-queue policies: admission order and preemption victims."""

from __future__ import annotations

import pytest

from pyagent_ref.sched import Request
from pyagent_ref.sched.policy import MLFQQueue, make_queue


def req(rid, arrival, **kw):
    r = Request(rid, [1], **kw)
    r.times.arrival = arrival
    return r


def drain(queue):
    out = []
    while len(queue):
        out.append(queue.pop().request_id)
    return out


def test_fcfs_with_preempted_first():
    q = make_queue("fcfs")
    for r in (req("b", 2), req("a", 1), req("c", 3)):
        q.push(r)
    q.push_preempted(req("p", 9))
    assert drain(q) == ["p", "a", "b", "c"]


def test_priority_then_arrival():
    q = make_queue("priority")
    for r in (req("low", 1, priority=5), req("hi2", 3, priority=0), req("hi1", 2, priority=0)):
        q.push(r)
    assert drain(q) == ["hi1", "hi2", "low"]
    running = [req("x", 1, priority=0), req("y", 2, priority=3), req("z", 3, priority=3)]
    assert q.victim(running).request_id == "z"  # lowest priority, latest arrival


def test_deadline_is_earliest_first():
    q = make_queue("deadline")
    for r in (req("late", 1, deadline=50.0), req("soon", 2, deadline=10.0), req("none", 0)):
        q.push(r)
    assert drain(q) == ["soon", "late", "none"]


def test_fair_share_serves_the_least_served_client():
    q = make_queue("fair")
    a1, a2, b1 = (
        req("a1", 1, client_id="A"),
        req("a2", 2, client_id="A"),
        req("b1", 3, client_id="B"),
    )
    for r in (a1, a2, b1):
        q.push(r)
    assert q.pop() is a1
    q.charge(a1, 100)  # A has been served: B goes next despite arriving later
    assert q.pop() is b1 and q.pop() is a2


def test_mlfq_demotes_heavy_requests_and_ages_waiting_ones():
    now = [0.0]
    q = MLFQQueue(clock=lambda: now[0], levels=3, quantum=10, aging_s=5.0)
    heavy, light = req("heavy", 1), req("light", 2)
    heavy.times.queued = light.times.queued = 0.0
    q.charge(heavy, 30)  # 10 at level 0, 20 at level 1: now level 2
    assert q.level["heavy"] == 2
    q.push(heavy)
    q.push(light)
    assert q.peek() is light
    assert q.victim([heavy, light]) is heavy
    now[0] = 10.0  # waited two aging periods: heavy rises to level 0, arrival decides
    assert q.level_of(heavy) == 0 and q.peek() is heavy


def test_remove_and_len():
    q = make_queue("priority")
    a, b = req("a", 1), req("b", 2)
    q.push(a)
    q.push(b)
    q.remove(a)
    q.remove(req("never-added", 3))
    assert len(q) == 1 and list(q) == [b] and q.pop() is b
    with pytest.raises(IndexError):
        q.peek()


def test_unknown_policy():
    with pytest.raises(ValueError, match="'lifo'"):
        make_queue("lifo")
