"""``loadprof convert SRC OUT``: a dataset into HDF5 or TFRecord (the work: converters/).

For bad input ``run`` raises the converters' ``ConvertError`` (one line naming the file
and record); ``cli.main`` prints ``loadprof: error: <message>`` and exits 2. The
conversion machinery (numpy, h5py, rich) is imported in ``run``: every loadprof
command builds this parser, and those imports would cost ~0.1 s of start-up that
``loadprof diagnose`` should not pay.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..converters.sizes import format_size, parse_size


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


class ConvertCommand:
    name = "convert"
    help = "convert an image folder, .npy/.npz, MNIST IDX, CSV or PyTorch dataset to HDF5 or TFRecord"

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("src", metavar="SRC",
                            help="image folder (one subfolder per class), .npy/.npz, IDX file, "
                                 ".csv, or a PyTorch map-style Dataset as module:attribute")
        parser.add_argument("out", metavar="OUT",
                            help="output: an HDF5 file, or a directory for TFRecord shards")
        parser.add_argument("--to", required=True, choices=("hdf5", "tfrecord"), help="output format")
        parser.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
        parser.add_argument("--verify", action="store_true",
                            help="read the output back; check record count and checksums against the source")
        parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                            help="progress bar on stderr (default: only when stderr is a terminal)")
        img = parser.add_argument_group("image folders")
        img.add_argument("--decode", action="store_true",
                         help="store decoded uint8 arrays, not the encoded files (needs one shape)")
        img.add_argument("--resize", nargs=2, type=int, metavar=("H", "W"),
                         help="with --decode: resize every image to H x W")
        img.add_argument("--mode", choices=("RGB", "L"),
                         help="with --decode: colour (RGB, default) or grayscale (L)")
        other = parser.add_argument_group("other sources")
        other.add_argument("--keys", nargs="+", metavar="KEY", help=".npz: arrays to convert (default: all)")
        other.add_argument("--labels", metavar="PATH", help="IDX: labels file (default: found beside SRC)")
        other.add_argument("--label-column", metavar="NAME",
                           help="CSV: the label column (default: label)")
        h5 = parser.add_argument_group("HDF5")
        h5.add_argument("--compression", choices=("lzf", "gzip"), help="compress chunks (default: none)")
        tfr = parser.add_argument_group("TFRecord")
        tfr.add_argument("--shard-size", type=_size, metavar="SIZE",
                         help="bytes per shard, e.g. 64MiB (default: 128 MiB)")
        tfr.add_argument("--split", metavar="NAME",
                         help="shard name prefix: NAME-00000-of-00008.tfrecord (default: train)")

    def run(self, args: argparse.Namespace) -> int:
        from ..converters.stopping import ConversionStopped, stop_on_signals

        # NOTE [ Signals during a conversion ] (conversion.py): the temporary output is
        # removed on the way out; the exit code is the shell's for that signal.
        try:
            with stop_on_signals(replace=True):
                return self._run(args)
        except KeyboardInterrupt:
            print("loadprof: interrupted; no partial output left", file=sys.stderr)
            return 128 + 2
        except ConversionStopped as exc:
            print(f"loadprof: stopped by {exc.signame}; no partial output left", file=sys.stderr)
            return 128 + exc.signum

    def _run(self, args: argparse.Namespace) -> int:
        from ..converters.conversion import ConvertOptions, convert
        from ..converters.sources import SourceOptions

        # Flags left unset fall back to the defaults of ConvertOptions / SourceOptions,
        # documented there only.
        given = {k: v for k, v in vars(args).items() if v is not None}
        source: dict[str, Any] = {k: given[k] for k in ("mode", "labels", "label_column") if k in given}
        if "resize" in given:
            source["resize"] = tuple(given["resize"])
        if "keys" in given:
            source["keys"] = tuple(given["keys"])
        options = ConvertOptions(
            to=args.to,
            source=SourceOptions(decode=args.decode, **source),
            compression=args.compression,
            overwrite=args.overwrite,
            verify=args.verify,
            progress=args.progress,
            **{k: given[k] for k in ("shard_size", "split") if k in given},
        )
        result = convert(args.src, args.out, options)
        for note in result.notes:
            print(f"loadprof: note: {note}", file=sys.stderr)
        shards = sum(1 for f in result.files if f.suffix == ".tfrecord")
        where = f"{result.output} ({shards} shard{'s' if shards != 1 else ''})" if shards else str(result.output)
        fields = ", ".join(f"{f.name}: {f.describe()}" for f in result.schema.fields)
        print(
            f"wrote {result.records} records to {where}, {format_size(result.bytes)}, "
            f"in {result.seconds:.1f} s{'; verified' if result.verified else ''} [{fields}]"
        )
        return 0


