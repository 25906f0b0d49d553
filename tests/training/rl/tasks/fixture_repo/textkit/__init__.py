"""A tiny text toolkit: the fixture repository for feature-deletion tests."""

from textkit.roman import to_roman
from textkit.stack import Stack
from textkit.words import slugify, word_count

__all__ = ["Stack", "slugify", "to_roman", "word_count"]
