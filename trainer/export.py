"""Export a checkpoint's actor as a Hugging Face model directory.

    python -m trainer.export outputs/colorl/reverse_demo            # the latest checkpoint of a run
    python -m trainer.export outputs/colorl/reverse_demo/global_step_40 --out my_model

Every checkpoint's ``actor/`` already is an HF directory (safetensors, config, tokenizer); export checks that
the checkpoint is complete, copies that directory and loads it back with ``from_pretrained`` to be sure.
A LoRA run's ``actor/`` holds only the adapters: export loads the base model they name
(``base_model_name_or_path`` in ``adapter_config.json``), merges the adapters into its weights and writes the
merged model, so the result loads with ``from_pretrained`` without peft.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from trainer.checkpoint import CheckpointManager, check_checkpoint

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "README.md")  # peft's, merged on export


def export(checkpoint: str, out: str, role: str = "actor") -> Path:
    """Copy ``role`` of ``checkpoint`` (a ``global_step_N`` dir, or a run dir: its latest) to ``out``."""
    path = Path(checkpoint)
    if not path.name.startswith("global_step_"):
        latest = CheckpointManager(str(path)).find("auto")
        if latest is None:
            raise FileNotFoundError(f"{path} holds no complete checkpoint")
        path = latest
    check_checkpoint(path)
    target = Path(out)
    shutil.copytree(path / role, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns(
        "optimizer.pt", "extra.pt", "rng_rank*.pt", *ADAPTER_FILES))
    if (path / role / "adapter_config.json").exists():
        _merge_adapters(path / role, target)
    _verify(target)
    return target


def _merge_adapters(adapters: Path, target: Path) -> None:
    """Write the base model with the LoRA adapters under ``adapters`` merged in (W + (α/r)·B·A) to ``target``."""
    from peft import PeftConfig, PeftModel
    from transformers import AutoModelForCausalLM

    base_path = PeftConfig.from_pretrained(adapters).base_model_name_or_path
    if not base_path:
        raise ValueError(f"{adapters}/adapter_config.json names no base_model_name_or_path to merge the adapters into")
    base = AutoModelForCausalLM.from_pretrained(base_path)
    PeftModel.from_pretrained(base, adapters).merge_and_unload().save_pretrained(target)


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
    args = parser.parse_args()
    out = args.out or str(Path(args.checkpoint) / f"hf_{args.role}")
    print(f"exported {export(args.checkpoint, out, args.role)}")


if __name__ == "__main__":
    main()
