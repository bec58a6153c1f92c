"""The micro-batcher: when batches start, how failures and callers that go away are handled."""

import asyncio

import pytest

from ps_agent.batching import MicroBatcher

LONG = 600.0  # a max_wait no test may reach: a batch that starts did so on an event, not a timeout


class Recorder:
    """A batch function that records its batches and answers each item doubled; items named in ``fails`` raise."""

    def __init__(self, fails: tuple[int, ...] = ()) -> None:
        self.batches: list[list[int]] = []
        self.fails = fails

    async def __call__(self, items: list[int]) -> list[int]:
        self.batches.append(list(items))
        await asyncio.sleep(0)
        if any(item in self.fails for item in items):
            raise RuntimeError(f"cannot run {self.fails}")
        return [2 * item for item in items]


def run(coroutine, timeout_s: float = 30.0):
    """Run ``coroutine``, failing the test if it waits for a timeout it should not need."""
    return asyncio.run(asyncio.wait_for(coroutine, timeout_s))


def test_a_batch_starts_as_soon_as_it_is_full_and_holds_at_most_size_items():
    record = Recorder()
    batcher = MicroBatcher(record, size=2, max_wait_s=LONG)

    async def five():
        return await asyncio.gather(*(batcher.submit([i]) for i in range(4)), batcher.submit([4, 5]))

    assert run(five()) == [[0], [2], [4], [6], [8, 10]]
    assert record.batches == [[0, 1], [2, 3], [4, 5]]


def test_a_partial_batch_starts_after_max_wait():
    record = Recorder()
    batcher = MicroBatcher(record, size=10, max_wait_s=0.05)

    async def two():
        return await asyncio.gather(batcher.submit([1]), batcher.submit([2]))

    assert run(two()) == [[2], [4]]
    assert record.batches == [[1, 2]]


def test_a_smaller_size_starts_the_waiting_batch_at_once():
    """What a training rollout does when one of its rollouts finishes: fewer turns now make a batch."""
    record = Recorder()
    batcher = MicroBatcher(record, size=3, max_wait_s=LONG)

    async def two_then_shrink():
        waiting = [asyncio.create_task(batcher.submit([i])) for i in (1, 2)]
        await asyncio.sleep(0.05)
        assert record.batches == []  # 2 of 3 wait
        batcher.size = 2
        return await asyncio.gather(*waiting)

    assert run(two_then_shrink()) == [[2], [4]]
    assert record.batches == [[1, 2]]


def test_a_failed_batch_is_retried_one_item_at_a_time_so_only_the_culprit_fails():
    record = Recorder(fails=(3,))
    batcher = MicroBatcher(record, size=3, max_wait_s=LONG, retry_alone=True)

    async def three():
        return await asyncio.gather(*(batcher.submit([i]) for i in (1, 3, 5)), return_exceptions=True)

    good, bad, other = run(three())
    assert (good, other) == ([2], [10]) and isinstance(bad, RuntimeError)
    assert record.batches == [[1, 3, 5], [1], [3], [5]]


def test_without_retry_alone_every_item_of_a_failed_batch_fails():
    record = Recorder(fails=(3,))
    batcher = MicroBatcher(record, size=2, max_wait_s=LONG)

    async def two():
        return await asyncio.gather(batcher.submit([1]), batcher.submit([3]), return_exceptions=True)

    assert all(isinstance(result, RuntimeError) for result in run(two()))
    assert record.batches == [[1, 3]]


def test_a_batch_function_giving_the_wrong_number_of_results_fails_its_batch():
    async def short(items):
        return items[:-1]

    batcher = MicroBatcher(short, size=2, max_wait_s=LONG)

    async def two():
        return await asyncio.gather(batcher.submit([1]), batcher.submit([2]), return_exceptions=True)

    assert [str(e) for e in run(two())] == ["a batch of 2 items gave 1 results"] * 2


def test_an_item_whose_caller_went_away_is_not_run():
    record = Recorder()
    batcher = MicroBatcher(record, size=3, max_wait_s=0.2)

    async def one_leaves():
        leaving = asyncio.create_task(batcher.submit([1]))
        staying = asyncio.create_task(batcher.submit([2]))
        await asyncio.sleep(0.01)
        leaving.cancel()
        with pytest.raises(asyncio.CancelledError):
            await leaving
        return await staying

    assert run(one_leaves()) == [4]
    assert record.batches == [[2]]


def test_run_now_runs_its_items_alone_and_at_once():
    record = Recorder()
    batcher = MicroBatcher(record, size=10, max_wait_s=LONG)
    assert run(batcher.run_now([1, 2])) == [2, 4]
    assert record.batches == [[1, 2]]


def test_one_batcher_serves_one_event_loop_after_another():
    """A policy outlives the event loops of its runs (a training step each): the batcher works in each."""
    record = Recorder()
    batcher = MicroBatcher(record, size=2, max_wait_s=LONG)

    async def two(first: int):
        return await asyncio.gather(batcher.submit([first]), batcher.submit([first + 1]))

    assert run(two(1)) == [[2], [4]]
    assert run(two(5)) == [[10], [12]]
    assert record.batches == [[1, 2], [5, 6]]


def test_event_loops_running_at_once_on_two_threads_each_get_their_own_batches():
    """A policy shared by two runs, each on its own thread's loop (two `run_sync` agents): the second loop's first
    submit dropped every item the first loop had waiting, whose callers then waited forever, and one worker ran
    the other loop's items, setting their futures from the wrong thread."""
    import threading

    record = Recorder()
    batcher = MicroBatcher(record, size=2, max_wait_s=LONG)
    first_waits, results = threading.Event(), {}

    async def two(first: int, wait_for: threading.Event | None):
        calls = [asyncio.ensure_future(batcher.submit([first]))]
        await asyncio.sleep(0)
        first_waits.set()  # one item of this loop waits for a second one
        if wait_for is not None:
            await asyncio.to_thread(wait_for.wait)
        calls.append(asyncio.ensure_future(batcher.submit([first + 1])))
        return await asyncio.gather(*calls)

    second_submitted = threading.Event()

    def first_loop():
        results[1] = run(two(1, second_submitted), timeout_s=20)

    thread = threading.Thread(target=first_loop)
    thread.start()
    assert first_waits.wait(20)
    first_waits.clear()

    async def second():  # submits while the first loop's item waits
        call = asyncio.ensure_future(batcher.submit([10]))
        await asyncio.sleep(0)
        second_submitted.set()
        return await asyncio.gather(call, batcher.submit([11]))

    results[10] = run(second(), timeout_s=20)
    thread.join(30)
    assert results == {1: [[2], [4]], 10: [[20], [22]]}
    assert sorted(record.batches) == [[1, 2], [10, 11]]  # a loop's items are never batched with another's


def test_a_caller_that_goes_away_mid_batch_leaves_the_others_their_results():
    started, release = asyncio.Event(), asyncio.Event()

    async def slow(items):
        started.set()
        await release.wait()
        return items

    batcher = MicroBatcher(slow, size=2, max_wait_s=LONG)

    async def one_leaves_mid_batch():
        leaving = asyncio.create_task(batcher.submit([1]))
        staying = asyncio.create_task(batcher.submit([2]))
        await started.wait()
        leaving.cancel()
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await leaving
        return await staying, await batcher.submit([3, 4])  # and the batcher still works

    assert run(one_leaves_mid_batch()) == ([2], [3, 4])


def test_a_caller_with_many_items_shares_each_batch_with_the_others():
    batches: list[list[str]] = []

    async def run_batch(items):
        batches.append(list(items))
        await asyncio.sleep(0)
        return items

    async def scenario():
        batcher = MicroBatcher(run_batch, size=4, max_wait_s=0.05)
        heavy = asyncio.create_task(batcher.submit([f"heavy {i}" for i in range(12)]))
        await asyncio.sleep(0)
        light = asyncio.create_task(batcher.submit(["light"]))
        return await heavy, await light

    heavy, light = asyncio.run(scenario())
    assert light == ["light"] and heavy == [f"heavy {i}" for i in range(12)]
    # the first batch started when 4 of heavy's items waited; light joins the next one, not the last
    assert "light" in batches[1] and [len(b) for b in batches] == [4, 4, 4, 1]


def test_a_batch_call_the_backend_cancelled_fails_it_and_the_batcher_goes_on():
    """A backend that cancels its own call (an HTTP library cancelling its request) raised CancelledError in the
    worker: the worker died with the batch taken, and its callers, the innocent one with them, waited for ever."""

    batches = []

    async def backend(items: list[str]) -> list[str]:
        batches.append(items)
        if "cancelled" in items:
            cancelled = asyncio.get_running_loop().create_future()
            cancelled.cancel()
            await cancelled
        return [item.upper() for item in items]

    batcher = MicroBatcher(backend, size=2, max_wait_s=0.0, retry_alone=True)

    async def two_then_one():
        both = await asyncio.gather(batcher.submit(["cancelled"]), batcher.submit(["b"]), return_exceptions=True)
        return [*both, await batcher.submit(["c"])]

    failed, innocent, later = run(two_then_one())
    assert isinstance(failed, RuntimeError) and "cancelled by the backend" in str(failed)
    assert (innocent, later) == (["B"], ["C"])
    assert batches == [["cancelled", "b"], ["cancelled"], ["b"], ["c"]]


def test_a_request_that_failed_has_its_other_items_dropped_not_run_one_by_one():
    """One failing item fails its request; its other items had no one waiting for them, but were each run alone
    after a failed batch, while every other caller waited (a backend down made it one call per item)."""
    record = Recorder(fails=(3,))
    batcher = MicroBatcher(record, size=8, max_wait_s=0.0, retry_alone=True)
    with pytest.raises(RuntimeError, match=r"cannot run \(3,\)"):
        run(batcher.submit([1, 3, 5, 7, 9]))
    assert record.batches == [[1, 3, 5, 7, 9], [1], [3]]
