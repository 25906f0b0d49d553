import re

_WORD = re.compile(r"[A-Za-z0-9']+")


def word_count(text):
    """Number of words in ``text``; apostrophes stay inside words."""
    found_words = _WORD.findall(text)
    return len(found_words)


def slugify(text, sep="-"):
    """Lower-case words of ``text`` joined by ``sep``."""
    lowered = [w.lower().replace("'", "") for w in _WORD.findall(text)]
    return sep.join(lowered)


def shout(text):
    """Not covered by any test: deleting it breaks nothing."""
    louder = text.upper()
    return louder + "!"
