class Stack:
    """LIFO stack."""

    def __init__(self):
        self._items = []

    def push(self, item):
        self._items.append(item)
        return len(self._items)

    def pop(self):
        if not self._items:
            raise IndexError("pop from an empty Stack")
        top_item = self._items.pop()
        return top_item

    def __len__(self):
        return len(self._items)
