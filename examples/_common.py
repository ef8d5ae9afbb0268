"""Command-line handling shared by the seed examples: CPU by default, `--device cuda` where GPUs exist."""

import argparse


def parse_device(description: str) -> str:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="cuda needs GPUs (one per worker)")
    return parser.parse_args().device
