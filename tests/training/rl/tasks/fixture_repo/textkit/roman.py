_PAIRS = [
    (1000, "M"),
    (900, "CM"),
    (500, "D"),
    (400, "CD"),
    (100, "C"),
    (90, "XC"),
    (50, "L"),
    (40, "XL"),
    (10, "X"),
    (9, "IX"),
    (5, "V"),
    (4, "IV"),
    (1, "I"),
]


def to_roman(number):
    """Roman numeral for 1 <= number <= 3999."""
    if not 1 <= number <= 3999:
        raise ValueError("roman numerals cover 1..3999 only")
    numeral_parts = []
    for value, letters in _PAIRS:
        repeat_count, number = divmod(number, value)
        numeral_parts.append(letters * repeat_count)
    return "".join(numeral_parts)
