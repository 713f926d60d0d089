"""Generates the gRPC stubs into prefixlog_client/_gen from the repository's proto/ directory.

    python -m prefixlog_client.codegen [PROTO_DIR]

PROTO_DIR defaults to ../proto/proto relative to the python/ directory of the repository.
"""
import os
import sys


def generate(proto_dir=None):
    from grpc_tools import protoc  # dev dependency: grpcio-tools

    here = os.path.dirname(os.path.abspath(__file__))
    proto_dir = proto_dir or os.path.join(here, "..", "..", "proto", "proto")
    out = os.path.join(here, "_gen")
    files = ["records.proto", "query.proto"]
    args = ["protoc", f"-I{proto_dir}", f"--python_out={out}", f"--grpc_python_out={out}"]
    args += [os.path.join(proto_dir, f) for f in files]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed for {files} in {proto_dir}")
    return out


if __name__ == "__main__":
    print(generate(sys.argv[1] if len(sys.argv) > 1 else None))
