import gc
import weakref

from verispec.bench.collector import frozen_heap


class Node:
    pass


def cycle() -> weakref.ref:
    node = Node()
    node.self = node
    return weakref.ref(node)


def test_frozen_heap_leaves_older_objects_out_and_still_collects_new_cycles():
    before = cycle()  # garbage from before the block: the entry collection frees it
    with frozen_heap():
        assert before() is None
        assert gc.get_freeze_count() > 0
        inside = cycle()
        gc.collect()
        assert inside() is None  # what the timed work leaves behind is still collected
    assert gc.get_freeze_count() == 0


def test_frozen_heap_unfreezes_when_the_timed_work_raises():
    try:
        with frozen_heap():
            raise RuntimeError("a failed timing")
    except RuntimeError:
        pass
    assert gc.get_freeze_count() == 0
