"""Where the package's bundled data lives (reterm_jax/assets/): the tiny tokenizer and the demo rows."""
import os

ASSETS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets")
TINY_TOKENIZER_DIR = os.path.join(ASSETS_DIR, "tokenizer")
