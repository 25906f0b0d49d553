from textkit import slugify, word_count


def test_word_count_simple():
    assert word_count("one two three") == 3


def test_word_count_apostrophe():
    assert word_count("don't stop") == 2


def test_slugify():
    assert slugify("Hello, World") == "hello-world"


def test_slugify_sep():
    assert slugify("It's Fine", sep="_") == "its_fine"
