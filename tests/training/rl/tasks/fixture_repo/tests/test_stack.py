import pytest
from textkit import Stack


def test_push_pop():
    stack = Stack()
    stack.push(1)
    stack.push(2)
    assert stack.pop() == 2
    assert len(stack) == 1


def test_pop_empty():
    with pytest.raises(IndexError):
        Stack().pop()


def test_len_starts_at_zero():
    assert len(Stack()) == 0
