"""Regenerates the ``*_pb2.py`` modules from the ``.proto`` sources.

Run ``python -m brokerd.proto.compile`` after editing a ``.proto`` file; it needs
the pinned ``grpcio-tools`` of the ``test`` extra, whose protoc emits code for the
protobuf runtime that setup.py requires.
"""

import argparse
import pathlib
import sys

PROTO_DIR = pathlib.Path(__file__).resolve().parent
SOURCE_ROOT = PROTO_DIR.parent.parent  # imports in .proto files are relative to it


def proto_sources():
    """The .proto files, as paths relative to the source root, in a stable order."""
    return sorted(p.relative_to(SOURCE_ROOT).as_posix() for p in PROTO_DIR.glob("*.proto"))


def compile_protos(output_root):
    """Writes brokerd/proto/*_pb2.py under C{output_root}; raises on protoc errors."""
    from grpc_tools import protoc

    output_root = pathlib.Path(output_root)
    (output_root / "brokerd" / "proto").mkdir(parents=True, exist_ok=True)
    args = ["protoc", f"-I{SOURCE_ROOT}", f"--python_out={output_root}", *proto_sources()]
    status = protoc.main(args)
    if status != 0:
        raise RuntimeError(f"protoc failed with status {status}: {' '.join(args)}")
    return sorted((output_root / "brokerd" / "proto").glob("*_pb2.py"))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--output-root",
        default=str(SOURCE_ROOT),
        help="directory that receives brokerd/proto/*_pb2.py (default: the source tree)",
    )
    options = parser.parse_args(argv)
    for path in compile_protos(options.output_root):
        print(path)


if __name__ == "__main__":
    sys.exit(main())
