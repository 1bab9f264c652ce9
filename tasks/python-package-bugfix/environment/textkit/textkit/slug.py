import re
import unicodedata

from textkit import VERSION  # noqa: F401  (used to tag debug output)


def slugify(text, sep="-"):
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[\s_-]+", sep, text)
