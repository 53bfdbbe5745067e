"""gnnsched.portable.storage_booking: the one dispatch mode behind the worker's parallel-inference meter and the fake
GPU."""

from __future__ import annotations

import gc

import pytest

torch = pytest.importorskip("torch")

from gnnsched.portable.storage_booking import storage_booking_mode  # noqa: E402


def test_each_new_storage_is_booked_once_and_released_when_it_dies():
    booked: dict[int, int] = {}
    released: list[tuple[int, int]] = []

    def book(key: int, nbytes: int) -> int | None:
        if key in booked:
            return None
        booked[key] = nbytes
        return nbytes * 2  # what is released is what book returned, not the storage's size

    with storage_booking_mode(book, lambda key, amount: released.append((key, amount))):
        a = torch.ones(256)  # 1 KiB of float32
        view = a[:10]  # a view: the same storage, offered again and skipped by book
        b = a + 1
    assert sorted(booked.values()) == [1024, 1024] and len(booked) == 2
    assert view.untyped_storage().data_ptr() == a.untyped_storage().data_ptr()
    key_b = id(b.untyped_storage())
    del b
    gc.collect()
    assert released == [(key_b, 2048)]


def test_a_storage_book_declines_is_never_released_and_book_may_fail_the_operator():
    released: list[tuple[int, int]] = []

    with storage_booking_mode(lambda key, nbytes: None, lambda key, amount: released.append((key, amount))):
        x = torch.zeros(8)
    del x
    gc.collect()
    assert released == []

    def refuse(key: int, nbytes: int) -> int | None:
        raise torch.OutOfMemoryError("no room")

    with pytest.raises(torch.OutOfMemoryError, match="no room"), storage_booking_mode(refuse, lambda k, a: None):
        torch.ones(4)

