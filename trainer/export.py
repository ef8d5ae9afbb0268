"""Export a checkpoint's actor as a Hugging Face model directory.

    python -m trainer.export outputs/colorl/reverse_demo            # the latest checkpoint of a run
    python -m trainer.export outputs/colorl/reverse_demo/global_step_40 --out my_model

Every checkpoint's ``actor/`` already is an HF directory (safetensors, config, tokenizer); export checks that
the checkpoint is complete, copies that directory and loads it back with ``from_pretrained`` to be sure.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from trainer.checkpoint import CheckpointError, CheckpointManager, check_checkpoint


def export(checkpoint: str, out: str, role: str = "actor", overwrite: bool = False) -> Path:
    """Copy ``role`` of ``checkpoint`` (a ``global_step_N`` dir, or a run dir: its latest) to ``out``; an ``out``
    that exists and is not empty is refused unless ``overwrite`` (then it is replaced, never merged into)."""
    target = Path(out)
    if target.exists() and any(target.iterdir()):
        if not overwrite:
            raise FileExistsError(f"--out {target} exists and is not empty; exporting into it would mix two models' "
                                  "files. Pass --overwrite to replace it, or choose another --out")
        shutil.rmtree(target)
    path = Path(checkpoint)
    if not path.name.startswith("global_step_"):
        latest = CheckpointManager(str(path)).find("auto")
        if latest is None:
            raise FileNotFoundError(f"{path} holds no complete checkpoint")
        path = latest
    check_checkpoint(path)
    shutil.copytree(path / role, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns("optimizer.pt", "extra.pt", "rng_rank*.pt"))
    _verify(target)
    return target


def _verify(path: Path) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification

    config = AutoConfig.from_pretrained(path)
    is_lm = any(arch.endswith("ForCausalLM") for arch in config.architectures or [])
    (AutoModelForCausalLM if is_lm else AutoModelForTokenClassification).from_pretrained(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="a global_step_N directory, or a run directory (its latest checkpoint)")
    parser.add_argument("--out", help="target directory (default: <checkpoint>/hf_<role>)")
    parser.add_argument("--role", default="actor", choices=["actor", "critic"])
    parser.add_argument("--overwrite", action="store_true", help="replace --out when it exists")
    args = parser.parse_args()
    out = args.out or str(Path(args.checkpoint) / f"hf_{args.role}")
    try:
        print(f"exported {export(args.checkpoint, out, args.role, args.overwrite)}")
    except (FileExistsError, FileNotFoundError, CheckpointError) as exc:
        raise SystemExit(f"colorl: export: {exc}") from None


if __name__ == "__main__":
    main()
