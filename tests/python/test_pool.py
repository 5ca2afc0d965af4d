"""The caching pool through Python on the host backend: data, alignment, stats.

Host-backend pointers are real host memory, so every test writes and reads
the bytes it allocates: a pool that hands out overlapping or dangling blocks
fails here, not only one that miscounts.
"""

from __future__ import annotations

import ctypes
import random
import re
import threading

import pytest

from conftest import MiB, pattern, read_bytes, write_bytes

SIZES = [1, 7, 511, 512, 513, 4095, 4096, 65537, MiB - 1, MiB, MiB + 1, 3 * MiB + 5, 16 * MiB]
CORE_KEYS = (
    "allocated_bytes.all.current",
    "allocated_bytes.all.peak",
    "reserved_bytes.all.current",
    "reserved_bytes.all.peak",
)


def test_version_is_semver(symm):
    v = symm.version()
    assert re.fullmatch(r"\d+\.\d+\.\d+([-+.][0-9A-Za-z.+-]+)?", v), v


def test_backend_is_host_after_init(symm):
    assert symm.device_count() >= 1
    assert symm.backend() == "host"


def test_round_trip_alignment_and_no_overlap(symm):
    live = []
    try:
        for i, size in enumerate(SIZES):
            ptr = symm.alloc(size)
            assert ptr, f"alloc({size}) returned NULL"
            assert ptr % 512 == 0, f"alloc({size}) = {ptr:#x} is not 512-byte aligned"
            write_bytes(ptr, pattern(size, i))
            live.append((ptr, size, i))
        spans = sorted((p, p + s) for p, s, _ in live)
        for (_, end), (start, _) in zip(spans, spans[1:]):
            assert end <= start, "two live blocks overlap"
        for ptr, size, i in live:
            assert read_bytes(ptr, size) == pattern(size, i), f"block of {size} B lost its data"
    finally:
        for ptr, size, _ in live:
            symm.free(ptr, size)


def test_cached_block_reused_and_rewritable(symm):
    p = symm.alloc(MiB)
    write_bytes(p, pattern(MiB, 1))
    symm.free(p, MiB)
    q = symm.alloc(MiB)
    try:
        write_bytes(q, pattern(MiB, 2))
        assert read_bytes(q, MiB) == pattern(MiB, 2)
    finally:
        symm.free(q, MiB)


def test_size_zero_returns_null_without_error(symm):
    before = symm.memory_stats()
    assert symm.alloc(0) == 0
    symm.free(0, 0)  # NULL is ignored, with no error
    after = symm.memory_stats()
    for key in ("allocated_bytes.all.current", "reserved_bytes.all.current"):
        assert after[key] == before[key]


def test_streams_are_accepted(symm):
    for stream in (0, 1, 2):
        p = symm.alloc(4096, 0, stream)
        write_bytes(p, b"x" * 4096)
        symm.free(p, 4096, 0, stream)


def test_stats_keys_and_types(symm):
    stats = symm.memory_stats()
    for key in CORE_KEYS:
        assert key in stats, f"missing stat {key}; have {sorted(stats)}"
    assert all(isinstance(v, int) for v in stats.values())
    assert stats["reserved_bytes.all.current"] >= stats["allocated_bytes.all.current"]
    assert stats["allocated_bytes.all.peak"] >= stats["allocated_bytes.all.current"]
    assert stats["reserved_bytes.all.peak"] >= stats["reserved_bytes.all.current"]


def test_stats_track_allocated_reserved_and_peaks(symm):
    size = 8 * MiB + 3
    a0, r0 = symm.memory_allocated(), symm.memory_reserved()
    p = symm.alloc(size)
    try:
        a1, r1 = symm.memory_allocated(), symm.memory_reserved()
        assert size <= a1 - a0 <= 2 * size, (a0, a1)
        assert r1 >= r0 and r1 >= a1
        assert symm.max_memory_allocated() >= a1
        assert symm.max_memory_reserved() >= r1
    finally:
        symm.free(p, size)
    assert symm.memory_allocated() == a0
    assert symm.memory_reserved() >= symm.memory_allocated()
    assert symm.max_memory_allocated() >= a1
    stats = symm.memory_stats()
    assert symm.memory_allocated() == stats["allocated_bytes.all.current"]
    assert symm.memory_reserved() == stats["reserved_bytes.all.current"]
    assert symm.max_memory_allocated() == stats["allocated_bytes.all.peak"]
    assert symm.max_memory_reserved() == stats["reserved_bytes.all.peak"]


def test_reset_peak(symm):
    p = symm.alloc(32 * MiB)
    symm.free(p, 32 * MiB)
    assert symm.max_memory_allocated() >= symm.memory_allocated() + 32 * MiB
    symm.reset_peak_memory_stats()
    assert symm.max_memory_allocated() == symm.memory_allocated()
    assert symm.max_memory_reserved() == symm.memory_reserved()


def test_empty_cache_lowers_reserved_and_keeps_live_blocks(symm):
    keep = symm.alloc(MiB)
    write_bytes(keep, pattern(MiB, 9))
    p = symm.alloc(8 * MiB)
    symm.free(p, 8 * MiB)
    before = symm.memory_reserved()
    symm.empty_cache()
    after = symm.memory_reserved()
    try:
        assert after <= before - 8 * MiB, (before, after)
        assert after >= symm.memory_allocated() >= MiB
        assert read_bytes(keep, MiB) == pattern(MiB, 9)
    finally:
        symm.free(keep, MiB)


def test_record_stream_on_live_block_and_interior_pointer(symm):
    p = symm.alloc(64 * 1024, 0, 0)
    try:
        symm.record_stream(p, 1)
        symm.record_stream(p + 4096, 2)
    finally:
        symm.free(p, 64 * 1024, 0, 0)
    q = symm.alloc(64 * 1024, 0, 0)  # still usable afterwards
    symm.free(q, 64 * 1024, 0, 0)


def test_eight_threads_allocate_write_verify_free(symm):
    errors: list[str] = []

    def worker(tid: int) -> None:
        rng = random.Random(tid)
        live = []
        try:
            for i in range(300):
                size = rng.choice([512, 1000, 4096, 65536, MiB, 2 * MiB + 1])
                ptr = symm.alloc(size)
                fill = bytes([(tid * 31 + i) & 0xFF]) * size
                ctypes.memset(ptr, fill[0], size)
                live.append((ptr, size, fill))
                if len(live) > 6:
                    ptr, size, fill = live.pop(rng.randrange(len(live)))
                    if read_bytes(ptr, size) != fill:
                        errors.append(f"thread {tid}: block {ptr:#x} ({size} B) was overwritten")
                    symm.free(ptr, size)
        except Exception as e:  # reported below, with the thread's id
            errors.append(f"thread {tid}: {e!r}")
        finally:
            for ptr, size, _ in live:
                symm.free(ptr, size)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    a0 = symm.memory_allocated()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a worker thread hung"
    assert not errors, "\n".join(errors)
    assert symm.memory_allocated() == a0


def test_negative_size_is_rejected_in_python(symm):
    with pytest.raises(ValueError):
        symm.alloc(-1)
