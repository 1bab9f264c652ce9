"""textkit: small text helpers."""
from textkit.slug import slugify
from textkit.stats import word_counts, top_words

VERSION = "1.2.0"
__all__ = ["slugify", "word_counts", "top_words", "VERSION"]
