"""Stubs generated from ../proto by `python -m prefixlog_client.codegen` (not committed).

grpcio-tools emits `import records_pb2` (top-level) in query_pb2, so this directory is put on
sys.path before the stubs are imported.
"""
import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
if _here not in sys.path:
    sys.path.insert(0, _here)
