"""plan_scale: which members go and how many come, for every state a member can be in."""

from __future__ import annotations

import pytest

from launch.ray.scaling import ScalePlan, plan_scale, pool_sizes
from launch.ray.spec import MemberState


def members(*specs: str) -> list[MemberState]:
    """'decode-1:ready' -> a decode member decode-1 that is ready."""
    out = []
    for spec in specs:
        member, status = spec.split(":")
        out.append(MemberState(member, member.rsplit("-", 1)[0] if "-" in member else member, status))
    return out


def test_growing_adds_the_missing_members_and_removes_nothing():
    assert plan_scale(members("router:ready", "prefill-0:ready", "decode-1:ready"), "decode", 3) == ScalePlan(add=2)


def test_shrinking_removes_the_newest_ready_members():
    pool = members("decode-1:ready", "decode-4:ready", "decode-2:ready")
    assert plan_scale(pool, "decode", 1) == ScalePlan(remove=("decode-4", "decode-2"))


def test_shrinking_removes_members_that_serve_nothing_yet_before_ready_ones():
    pool = members("decode-1:ready", "decode-2:starting", "decode-3:ready", "decode-5:unreachable")
    assert plan_scale(pool, "decode", 2) == ScalePlan(remove=("decode-2", "decode-5"))


def test_broken_members_are_replaced_within_the_target():
    pool = members("decode-1:failed", "decode-2:ready", "decode-3:dead")
    assert plan_scale(pool, "decode", 2) == ScalePlan(remove=("decode-1", "decode-3"), add=1)


def test_broken_members_go_first_when_shrinking():
    pool = members("decode-1:ready", "decode-2:ready", "decode-3:failed")
    assert plan_scale(pool, "decode", 1) == ScalePlan(remove=("decode-3", "decode-2"))


def test_asking_for_the_current_size_of_a_healthy_pool_does_nothing():
    plan = plan_scale(members("prefill-0:ready", "decode-1:starting", "decode-2:unreachable"), "decode", 2)
    assert plan == ScalePlan() and plan.empty


def test_other_roles_are_never_touched():
    assert plan_scale(members("prefill-0:failed", "decode-1:ready"), "decode", 0) == ScalePlan(remove=("decode-1",))


@pytest.mark.parametrize("replicas", [-1, 1.5, True])
def test_a_bad_replica_count_is_refused(replicas):
    with pytest.raises(ValueError, match="must be an int >= 0"):
        plan_scale([], "decode", replicas)


def test_pool_sizes_count_every_member_of_each_pool_whatever_its_state():
    assert pool_sizes(["router", "redis", "prefill", "decode", "decode"]) == {"prefill": 1, "decode": 2}
