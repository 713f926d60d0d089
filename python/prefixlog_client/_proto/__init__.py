"""Generated gRPC/protobuf modules for proto/proto/{records,query,peer}.proto. DO NOT EDIT.

Committed so that `pip install` needs neither grpcio-tools nor the protos; regenerate with
`python -m prefixlog_client.codegen` (from python/) after a proto change. A test fails when
these differ from a fresh generation. Imports between them are package-relative.
"""
