"""Seed-only (not used by the trainer): small model pieces that demonstrate tensor-parallel worker groups (seed 000, chapter 4)."""
