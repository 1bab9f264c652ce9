import hashlib
import subprocess
import sys
from pathlib import Path

D = Path("/app/textkit")
TEST_SHA = "e6fb242761c4fd197bdf2f7957733326146fedd191528ba50b61a3c7e667863b"


def run(code):
    return subprocess.run([sys.executable, "-c", code], cwd=D, capture_output=True, text=True, timeout=30)


def test_tests_untouched_and_passing():
    assert hashlib.sha256((D / "tests/test_textkit.py").read_bytes()).hexdigest() == TEST_SHA
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_textkit.py"],
                       cwd=D, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout
    assert "4 passed" in r.stdout


def test_hidden_behaviour():
    code = """
import textkit
from textkit.util.stopwords import STOPWORDS
from textkit import slugify, word_counts, top_words
assert textkit.VERSION == '1.2.0' and 'the' in STOPWORDS
assert word_counts('It is THE Dog and the dog') == {'dog': 2}
assert word_counts('The the', skip_stopwords=False) == {'the': 2}
assert top_words('y x c y x c d', n=2) == ['c', 'x']
assert top_words('Zeta zeta alpha', n=5) == ['zeta', 'alpha']
assert slugify('Crème Brûlée -- Recipe') == 'creme-brulee-recipe'
print('ok')
"""
    r = run(code)
    assert r.stdout.strip() == "ok", r.stderr
