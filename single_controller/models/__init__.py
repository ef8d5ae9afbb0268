"""Small model pieces that demonstrate tensor-parallel worker groups (seed 000, chapter 4)."""
