"""Config dataclass fields that carry their own documentation (`option`): the command line
reads it with `dataclasses.fields` (`cli.options.add_field_flags`), so a flag's help is the
field's documentation and nothing parses source text."""

from __future__ import annotations

from dataclasses import MISSING, Field, field


def option(default=MISSING, *, doc: str, factory=MISSING):
    """A dataclass field documented by `doc` (the help of its flag, where a command has one);
    `factory`: its default is built per instance (`default_factory`)."""
    return field(default=default, default_factory=factory, metadata={"doc": " ".join(doc.split())})


def doc_of(f: Field) -> str:
    """A field's documentation ("" where it has none)."""
    return f.metadata.get("doc", "")
