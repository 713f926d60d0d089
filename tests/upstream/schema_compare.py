"""Compares a schema written here with the one a pinned package publishes, descriptor against
descriptor (`google.protobuf.descriptor_pb2.FileDescriptorProto`), and prints what differs.

What is compared, for one `.proto` file:
- the package and syntax;
- every message, nested message and map entry (by qualified name): fields by name, each with
  its number, type, label, type name, containing oneof, proto3 `optional` and packed encoding;
  the oneofs a message declares;
- every enum (top level and nested): values by name, with their numbers;
- every service: methods by name, with input and output types and streaming on either side.

Each difference is one line: `- missing …` (published, not in ours), `+ extra …` (ours, not
published: never allowed) or `~ changed …` (both, differently). A `- missing` line is not a
failure when the allow-list names it (`Omissions`); an allow-list entry that matches nothing is
a failure of its own (`! stale …`), so the list stays exact. Comments, options other than
`packed`, reserved ranges and imports are not compared (they do not change the wire).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from google.protobuf import descriptor_pb2 as d

F = d.FieldDescriptorProto

# Scalar types that proto3 packs when repeated unless told otherwise.
_PACKABLE = {
    F.TYPE_DOUBLE, F.TYPE_FLOAT, F.TYPE_INT64, F.TYPE_UINT64, F.TYPE_INT32, F.TYPE_FIXED64,
    F.TYPE_FIXED32, F.TYPE_BOOL, F.TYPE_UINT32, F.TYPE_ENUM, F.TYPE_SFIXED32, F.TYPE_SFIXED64,
    F.TYPE_SINT32, F.TYPE_SINT64,
}


@dataclass
class Omissions:
    """What our copy may leave out of one published file: `(kind, qualified name) -> reason`.

    Kinds: `message`, `enum`, `field`, `value` (an enum value), `service`, `method`. Qualified
    names are the published ones, without a leading dot: `pkg.Message.field`."""

    entries: dict[tuple[str, str], str] = field(default_factory=dict)

    def reason(self, kind: str, name: str) -> str | None:
        return self.entries.get((kind, name))


@dataclass
class Report:
    """The differences found in one file; `failures` are those no allow-list entry excuses."""

    file: str
    failures: list[str] = field(default_factory=list)
    allowed: list[str] = field(default_factory=list)

    def text(self) -> str:
        lines = [f"{self.file}: {len(self.failures)} difference(s) with the published schema"]
        lines += [f"  {f}" for f in self.failures]
        if self.allowed:
            lines.append(f"  ({len(self.allowed)} omission(s) allowed by the list, not shown)")
        return "\n".join(lines)


# Descriptor labels as a reader of a proto3 file knows them (proto3 `optional`: a flag below).
_LABELS = {F.LABEL_OPTIONAL: "singular", F.LABEL_REPEATED: "repeated", F.LABEL_REQUIRED: "required"}


def _type(f: F) -> str:
    name = F.Type.Name(f.type).removeprefix("TYPE_").lower()
    return f"{name} {f.type_name.lstrip('.')}" if f.type_name else name


def _packed(f: F, syntax: str) -> bool:
    if f.label != F.LABEL_REPEATED or f.type not in _PACKABLE:
        return False
    if f.options.HasField("packed"):
        return f.options.packed
    return syntax == "proto3"


def _field_shape(f: F, msg: d.DescriptorProto, syntax: str) -> dict:
    oneof = msg.oneof_decl[f.oneof_index].name if f.HasField("oneof_index") else None
    return {
        "number": f.number,
        "type": _type(f),
        "label": _LABELS[f.label],
        "oneof": oneof,
        "proto3_optional": f.proto3_optional,
        "packed": _packed(f, syntax),
    }


def _describe(shape: dict) -> str:
    s = f"{shape['label']} {shape['type']} = {shape['number']}"
    if shape["oneof"]:
        s += f" (oneof {shape['oneof']})"
    if shape["proto3_optional"]:
        s += " (proto3 optional)"
    if shape["packed"]:
        s += " [packed]"
    return s


class _Comparison:
    def __init__(self, ours: d.FileDescriptorProto, published: d.FileDescriptorProto,
                 omissions: Omissions):
        self.ours, self.published, self.omissions = ours, published, omissions
        self.report = Report(ours.name)
        self.used: set[tuple[str, str]] = set()

    def missing(self, kind: str, name: str, what: str):
        if self.omissions.reason(kind, name) is not None:
            self.used.add((kind, name))
            self.report.allowed.append(f"- missing {kind} {name}")
        else:
            self.report.failures.append(f"- missing {kind} {name}: {what}")

    def extra(self, kind: str, name: str, what: str):
        self.report.failures.append(f"+ extra {kind} {name}: {what} (not in the published schema)")

    def changed(self, kind: str, name: str, ours: str, published: str):
        self.report.failures.append(f"~ changed {kind} {name}: ours {ours}, published {published}")

    def run(self) -> Report:
        o, p = self.ours, self.published
        if o.package != p.package:
            self.changed("package", o.name, o.package, p.package)
        if (o.syntax or "proto2") != (p.syntax or "proto2"):
            self.changed("syntax", o.name, o.syntax, p.syntax)
        self.enums(p.package, o.enum_type, p.enum_type)
        self.messages(p.package, o.message_type, p.message_type)
        self.services(p.package, o.service, p.service)
        for kind, name in sorted(set(self.omissions.entries) - self.used):
            self.report.failures.append(
                f"! stale allow-list entry {kind} {name}: the published schema has no such "
                "omission (it exists in ours, or not in the published file): remove the entry")
        return self.report

    def enums(self, scope: str, ours, published):
        ours_by = {e.name: e for e in ours}
        pub_by = {e.name: e for e in published}
        for name, e in pub_by.items():
            qn = f"{scope}.{name}"
            if name not in ours_by:
                self.missing("enum", qn, f"{len(e.value)} values")
                continue
            o_values = {v.name: v.number for v in ours_by[name].value}
            for v in e.value:
                if v.name not in o_values:
                    self.missing("value", f"{qn}.{v.name}", f"= {v.number}")
                elif o_values[v.name] != v.number:
                    mine = f"= {o_values[v.name]}"
                    self.changed("value", f"{qn}.{v.name}", mine, f"= {v.number}")
            p_names = {v.name for v in e.value}
            for v in ours_by[name].value:
                if v.name not in p_names:
                    self.extra("value", f"{qn}.{v.name}", f"= {v.number}")
        for name in ours_by.keys() - pub_by.keys():
            self.extra("enum", f"{scope}.{name}", "declared by our copy")

    def messages(self, scope: str, ours, published):
        ours_by = {m.name: m for m in ours}
        pub_by = {m.name: m for m in published}
        for name, m in pub_by.items():
            qn = f"{scope}.{name}"
            if name in ours_by:
                self.message(qn, ours_by[name], m)
            else:
                self.missing("message", qn, f"{len(m.field)} fields")
        for name in ours_by.keys() - pub_by.keys():
            self.extra("message", f"{scope}.{name}", "declared by our copy")

    def message(self, qn: str, o: d.DescriptorProto, p: d.DescriptorProto):
        o_syntax, p_syntax = self.ours.syntax, self.published.syntax
        o_fields = {f.name: f for f in o.field}
        for f in p.field:
            shape = _field_shape(f, p, p_syntax)
            if f.name not in o_fields:
                self.missing("field", f"{qn}.{f.name}", _describe(shape))
                continue
            mine = _field_shape(o_fields[f.name], o, o_syntax)
            if mine != shape:
                self.changed("field", f"{qn}.{f.name}", _describe(mine), _describe(shape))
        p_names = {f.name for f in p.field}
        for f in o.field:
            if f.name not in p_names:
                self.extra("field", f"{qn}.{f.name}", _describe(_field_shape(f, o, o_syntax)))
        # A field's oneof is part of its shape above; a published oneof whose members are all
        # omitted is reported through its members.
        p_oneofs = {x.name for x in p.oneof_decl}
        for x in o.oneof_decl:
            if x.name not in p_oneofs:
                self.extra("oneof", f"{qn}.{x.name}", "declared by our copy")
        self.enums(qn, o.enum_type, p.enum_type)
        self.messages(qn, o.nested_type, p.nested_type)

    def services(self, scope: str, ours, published):
        ours_by = {s.name: s for s in ours}
        for s in published:
            qn = f"{scope}.{s.name}"
            if s.name not in ours_by:
                self.missing("service", qn, f"{len(s.method)} methods")
                continue
            o_methods = {m.name: m for m in ours_by[s.name].method}
            for m in s.method:
                shape = _method_shape(m)
                if m.name not in o_methods:
                    self.missing("method", f"{qn}.{m.name}", shape)
                elif (mine := _method_shape(o_methods[m.name])) != shape:
                    self.changed("method", f"{qn}.{m.name}", mine, shape)
            for name in o_methods.keys() - {m.name for m in s.method}:
                self.extra("method", f"{qn}.{name}", _method_shape(o_methods[name]))
        for name in ours_by.keys() - {s.name for s in published}:
            self.extra("service", f"{scope}.{name}", "declared by our copy")


def _method_shape(m: d.MethodDescriptorProto) -> str:
    def side(streaming: bool, t: str) -> str:
        return f"{'stream ' if streaming else ''}{t.lstrip('.')}"

    request = side(m.client_streaming, m.input_type)
    return f"({request}) returns ({side(m.server_streaming, m.output_type)})"


def compare(ours: d.FileDescriptorProto, published: d.FileDescriptorProto,
            omissions: Omissions | None = None) -> Report:
    """Every difference between our copy of a file and the published one."""
    return _Comparison(ours, published, omissions or Omissions()).run()
