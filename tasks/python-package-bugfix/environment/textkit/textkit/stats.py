import re
from collections import Counter

from textkit.util.stopwords import STOPWORDS

WORD = re.compile(r"[a-z']+")


def word_counts(text, skip_stopwords=True):
    words = WORD.findall(text)
    if skip_stopwords:
        words = [w for w in words if w not in STOPWORDS]
    return Counter(words)


def top_words(text, n=3):
    """The n most common words, most frequent first; ties in alphabetical order."""
    counts = word_counts(text)
    return [w for w, _ in counts.most_common(n)]
