"""Before any model loads: each distillation teacher (``distillation.teacher_models.<name>.model_path``) is a causal
LM whose tokenizer has the student's vocabulary, since the teacher scores the student's own token ids."""

from __future__ import annotations

from typing import Any

from transformers import AutoTokenizer

from config import ConfigError, PPOConfig
from config.distillation import active_teachers, uses_topk


def check_teachers(cfg: PPOConfig, check_model: Any) -> None:
    """``check_model(key, path, trust_remote_code, causal_lm)`` (``trainer.preflight.dry_run``'s) on every teacher, then
    the vocabularies; ConfigError in one line naming the key, the path and the difference."""
    if not cfg.distillation.enabled:
        return
    student = cfg.actor_rollout_ref.model
    student_vocab = None
    for name, teacher in active_teachers(cfg.distillation).items():
        key = f"distillation.teacher_models.{name}.model_path"
        check_model(key, teacher.model_path, student.trust_remote_code, causal_lm=True)
        if student_vocab is None:
            student_vocab = _vocabulary(student.path, student.trust_remote_code)
        teacher_vocab = _vocabulary(teacher.model_path, student.trust_remote_code, key)
        if teacher_vocab != student_vocab:
            raise ConfigError.invalid(key, teacher.model_path, _difference(teacher_vocab, student_vocab, student.path))
    topk = cfg.distillation.distillation_loss.topk
    if uses_topk(cfg.distillation) and topk > len(student_vocab):
        raise ConfigError.invalid(
            "distillation.distillation_loss.topk", topk, f"more than the vocabulary's {len(student_vocab)} tokens"
        )


def _vocabulary(path: str | None, trust_remote_code: bool, key: str = "actor_rollout_ref.model.path") -> dict:
    """token -> id of the tokenizer at ``path`` (null: the built-in demo's character tokenizer)."""
    if path is None:
        from data.builtin import build_char_tokenizer  # the demo model's, built in memory

        return build_char_tokenizer().get_vocab()
    try:
        return AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code).get_vocab()
    except (OSError, ValueError) as exc:
        raise ConfigError.invalid(key, path, f"no tokenizer there ({str(exc).splitlines()[0]})") from None


def _difference(teacher: dict, student: dict, student_path: str | None) -> str:
    only = sorted(set(teacher) ^ set(student), key=lambda token: (teacher.get(token, student.get(token)), token))
    moved = [token for token in teacher if token in student and teacher[token] != student[token]]
    example = f"token {only[0]!r} is in one only" if only else f"token {moved[0]!r} has another id"
    return (
        f"its tokenizer's vocabulary ({len(teacher)} tokens) differs from the student's ({len(student)} tokens, "
        f"actor_rollout_ref.model.path={student_path or 'the built-in demo model'}): {example}; the teacher scores "
        "the student's token ids, so both need one vocabulary (e.g. a teacher of the student's model family)"
    )
