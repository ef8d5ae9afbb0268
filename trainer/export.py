"""Export a checkpoint's actor (or critic) as a Hugging Face model directory.

    python -m trainer.export outputs/colorl/reverse_demo            # the latest checkpoint of a run
    python -m trainer.export outputs/colorl/reverse_demo/global_step_40 --out my_model [--overwrite]

A checkpoint holds each role as sharded ``torch.distributed.checkpoint`` files (written by every rank at once);
export checks the checkpoint (complete, checksums), builds the model from its ``config.json``, reads the shards
into it in this one process (from any number of ranks they were written by), writes it with ``save_pretrained``
beside the tokenizer, and loads the result back with ``from_pretrained`` to be sure. A LoRA run's shards hold only
the adapters: export loads the base model ``adapter_config.json`` names (``base_model_name_or_path``), reads the
adapters into it, merges them into its weights (W + (α/r)·B·A) and writes the merged model, which loads without peft.
"""

from __future__ import annotations

import argparse
import os
import shutil
import warnings
from pathlib import Path

import torch.distributed.checkpoint as dcp
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForTokenClassification,
    AutoTokenizer,
    GenerationConfig,
)

from planner.worker_roles import ACTOR, ROLES
from trainer.state.checkpoint import LATEST, PREFIX, CheckpointError, CheckpointManager, check_checkpoint
from trainer.state.run_dir import LOCK
from workers.checkpoint.shards import PlainLoadPlanner, PlainReader, check_fits

RUN_FILES = (LATEST, "metrics.jsonl", LOCK)  # what a run directory holds besides its checkpoints


def export(checkpoint: str, out: str, role: str = ACTOR.name, overwrite: bool = False) -> Path:
    """Write ``role`` of ``checkpoint`` (a ``global_step_N`` dir, or a run dir: its latest) to ``out``; an ``out``
    that exists and is not empty is refused unless ``overwrite`` (then it is replaced, never merged into). Nothing
    is deleted before the checkpoint is verified and read, and never a run directory."""
    target = Path(out)
    path = Path(checkpoint)
    if not path.name.startswith(PREFIX):
        latest = CheckpointManager(str(path)).find("auto")
        if latest is None:
            raise FileNotFoundError(f"{path} holds no complete checkpoint")
        path = latest
    replace = target.exists() and any(target.iterdir())
    if replace and not overwrite:
        raise FileExistsError(
            f"--out {target} exists and is not empty; exporting into it would mix two models' "
            "files. Pass --overwrite to replace it, or choose another --out"
        )
    if replace:
        _refuse_run_dir(target, path)
    check_checkpoint(path)
    model = _load(path / role)
    if replace:
        shutil.rmtree(target)
    model.save_pretrained(target)
    AutoTokenizer.from_pretrained(path / role).save_pretrained(target)
    _model_class(target).from_pretrained(target)
    return target


def _refuse_run_dir(target: Path, checkpoint: Path) -> None:
    """``--overwrite`` deletes ``target``: not when it holds the checkpoint being exported or any run directory."""
    if checkpoint.resolve().is_relative_to(target.resolve()):
        raise FileExistsError(
            f"--out {target} holds the checkpoint being exported ({checkpoint}); --overwrite would "
            "delete it. Choose another --out"
        )
    for folder, dirs, files in os.walk(target):
        run_files = [f for f in files if f in RUN_FILES] + [d for d in dirs if d.startswith(PREFIX)]
        if run_files:
            raise FileExistsError(
                f"--out {target} is or holds a run directory ({Path(folder) / run_files[0]}); "
                "--overwrite would delete its checkpoints or metrics. Choose another --out"
            )


def _model_class(path: Path) -> type:
    config = AutoConfig.from_pretrained(path)
    is_lm = any(arch.endswith("ForCausalLM") for arch in config.architectures or [])
    return AutoModelForCausalLM if is_lm else AutoModelForTokenClassification


def _load(src: Path):
    """The role's model, built from its config and filled from its shards (LoRA: adapters merged into the base)."""
    if (src / "adapter_config.json").exists():
        return _merged_lora(src)
    model = _model_class(src).from_config(AutoConfig.from_pretrained(src))
    if (src / "generation_config.json").exists():
        model.generation_config = GenerationConfig.from_pretrained(src)
    _read_shards(src, model.state_dict())
    return model


def _merged_lora(src: Path):
    from peft import LoraConfig, get_peft_model

    config = LoraConfig.from_pretrained(src)
    if not config.base_model_name_or_path:
        raise ValueError(f"{src}/adapter_config.json names no base_model_name_or_path to merge the adapters into")
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(config.base_model_name_or_path), config)
    _read_shards(src, {name: p.data for name, p in model.named_parameters() if p.requires_grad})
    return model.merge_and_unload()


def _read_shards(src: Path, state: dict) -> None:
    """Fill ``state`` (name -> tensor, in place) from the role's shards under ``src``."""
    reader = PlainReader(src)
    check_fits(src, reader.read_metadata(), state, "model.")
    with warnings.catch_warnings():  # one process reading every rank's shards is the point here
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load({"model": state}, storage_reader=reader, planner=PlainLoadPlanner(), no_dist=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="a global_step_N directory, or a run directory (its latest checkpoint)")
    parser.add_argument("--out", help="target directory (default: <checkpoint>/hf_<role>)")
    parser.add_argument("--role", default=ACTOR.name, choices=[role.name for role in ROLES if role.trained])
    parser.add_argument("--overwrite", action="store_true", help="replace --out when it exists")
    args = parser.parse_args()
    out = args.out or str(Path(args.checkpoint) / f"hf_{args.role}")
    try:
        print(f"exported {export(args.checkpoint, out, args.role, args.overwrite)}")
    except (FileExistsError, FileNotFoundError, ValueError, CheckpointError) as exc:
        raise SystemExit(f"colorl: export: {exc}") from None


if __name__ == "__main__":
    main()
