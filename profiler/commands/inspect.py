"""``loadprof inspect PATH``: an HDF5 file or TFRecord shards summarised, every CRC checked."""

from __future__ import annotations

import argparse


class InspectCommand:
    name = "inspect"
    help = "summarise an HDF5 file or TFRecord shard(s) and check every CRC"

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("path", metavar="PATH",
                            help="an HDF5 file, a TFRecord shard, or a directory of shards")

    def run(self, args: argparse.Namespace) -> int:
        from ..converters.inspection import inspect_path

        summary = inspect_path(args.path)
        print("\n".join(summary.lines()))
        return 0


