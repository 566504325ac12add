"""The persistent containers (``spec.persistent``, ``spec.linked_queue``) behave like the tuples, lists and dicts they
replace, operation by operation; the spec with persistent containers equals the spec with tuples
in lockstep on every family."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvspec.harness.targets.spec import SpecTarget
from kvspec.harness.world.families import FAMILIES
from kvspec.spec.linked_queue import LinkedQueue, queue_push
from kvspec.spec.persistent import CHUNK, PMap, PVec, vec_changed, vec_set

SIZES = st.sampled_from([1, 2, 5, CHUNK - 1, CHUNK, CHUNK + 3, 3 * CHUNK + 1])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=SIZES, data=st.data())
def test_pvec_is_a_vector(n: int, data: st.DataObject) -> None:
    model = list(range(n))
    vec = PVec.of(model)
    for _ in range(data.draw(st.integers(0, 6))):
        updates = data.draw(st.dictionaries(st.integers(0, n - 1), st.integers(-3, 3), max_size=8))
        old, old_model = vec, list(model)
        vec = vec.set(updates)
        for i, v in updates.items():
            model[i] = v
        assert list(vec) == model and len(vec) == n
        assert [vec[i] for i in range(n)] == model and vec[-1] == model[-1]
        assert vec == tuple(model) and vec == PVec.of(model) and list(old) == old_model  # old is untouched
        assert sorted(vec_changed(old, vec)) == [i for i in range(n) if old_model[i] != model[i]]
        assert vec_set(tuple(old_model), updates) == tuple(model)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_pmap_is_a_mapping(data: st.DataObject) -> None:
    num_blocks = data.draw(st.sampled_from([4, 300, 5000]))
    keys = st.one_of(st.integers(0, 40), st.binary(min_size=1, max_size=6))
    pmap: PMap[object, int] = PMap.empty(num_blocks)
    model: dict[object, int] = {}
    for _ in range(data.draw(st.integers(1, 8))):
        changes = data.draw(st.dictionaries(keys, st.none() | st.integers(0, 9), max_size=10))
        old, old_model = pmap, dict(model)
        pmap = pmap.update(changes)
        for k, v in changes.items():
            if v is None:
                model.pop(k, None)
            else:
                model[k] = v
        assert dict(pmap.items()) == model and len(pmap) == len(model) and set(pmap) == set(model)
        assert all(pmap.get(k) == model.get(k) and (k in pmap) == (k in model) for k in changes)
        assert pmap == model and dict(old.items()) == old_model  # old is untouched
    rebuilt: PMap[object, int] = PMap.empty(num_blocks).update(model)  # type: ignore[arg-type]
    assert rebuilt == pmap and list(rebuilt) == list(PMap.empty(num_blocks).update(model))  # type: ignore[arg-type]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.sampled_from([2, 3, 9, CHUNK + 5, 2 * CHUNK + 7]), data=st.data())
def test_linked_queue_is_vllms_free_list(n: int, data: st.DataObject) -> None:
    """popleft, remove and push on a ``LinkedQueue`` do to the sequence what list operations do;
    two queues built differently compare equal exactly when their sequences are equal."""
    model = data.draw(st.permutations(range(n)).map(lambda p: p[: data.draw(st.integers(0, n))]))
    queue = LinkedQueue.of(model, n)
    for _ in range(data.draw(st.integers(1, 12))):
        old, old_model = queue, list(model)
        kind = data.draw(st.sampled_from(["popleft", "remove", "push"]))
        if kind == "popleft":
            k = data.draw(st.integers(0, len(model)))
            queue, taken = queue.popleft(k)
            assert list(taken) == model[:k]
            model = model[k:]
        elif kind == "remove":
            leaving = data.draw(st.sets(st.sampled_from(model), max_size=5)) if model else set()
            queue = queue.remove(leaving)
            model = [b for b in model if b not in leaving]
        else:
            outside = [b for b in range(n) if b not in model]
            new = data.draw(st.permutations(outside).map(lambda p: p[: data.draw(st.integers(0, len(p)))]))
            cut = data.draw(st.integers(0, len(new)))
            queue = queue_push(queue, new[:cut], new[cut:])
            model = new[:cut] + model + new[cut:]
        assert list(queue) == model and list(reversed(queue)) == model[::-1] and len(queue) == len(model)
        assert list(old) == old_model
        assert all((b in queue) == (b in model) for b in range(-1, n + 1))
        k = data.draw(st.integers(1, 4))
        assert queue.first(k) == tuple(model[:k]) and queue.last(k) == tuple(model[-k:] if model else ())
        assert queue[:k] == tuple(model[:k]) and (not model or (queue[0], queue[-1]) == (model[0], model[-1]))
        assert queue == tuple(model) and queue == LinkedQueue.of(model, n)
        assert (queue == old) == (model == old_model)


def test_linked_queue_refuses_a_block_twice() -> None:
    queue = LinkedQueue.of([1, 2], 4)
    with pytest.raises(AssertionError, match="already in the free queue"):
        queue.push([2], [])
    with pytest.raises(AssertionError, match="not in the free queue"):
        queue.remove({3})
    with pytest.raises(AssertionError, match="at most once"):
        LinkedQueue.of([1, 1], 4)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_persistent_spec_equals_the_tuple_spec_in_lockstep(family: str, machine_run: Any) -> None:
    """Every family's workload, the spec with persistent containers as the target and the spec
    with tuples as the reference: observations equal after every step, no finding."""
    stats = machine_run(family, lambda: SpecTarget(persistent=True), "spec-persistent", seed=5, shrink_seconds=5)
    assert stats.finding is None and stats.steps > 0
