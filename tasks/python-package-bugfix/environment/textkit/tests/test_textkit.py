import textkit
from textkit import slugify, top_words, word_counts


def test_version():
    assert textkit.VERSION == "1.2.0"


def test_slugify():
    assert slugify("Héllo, World!") == "hello-world"
    assert slugify("  many   spaces_here ", sep="_") == "many_spaces_here"


def test_word_counts_case_insensitive():
    c = word_counts("The cat and THE Cat")
    assert c == {"cat": 2}


def test_top_words_ties_alphabetical():
    assert top_words("pear apple pear apple fig kiwi", n=3) == ["apple", "pear", "fig"]
