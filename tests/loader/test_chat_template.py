"""Chat templates: the HF sandbox, helpers and extensions."""

from __future__ import annotations

import jinja2
import pytest

from localradix.loader.chat_template import render_chat_template, select_template


def test_helpers():
    template = (
        "{{ messages | tojson }}|{{ tools | tojson(indent=1) }}|{{ strftime_now('%Y') | length }}"
        "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}[{{ m.content }}]{% endfor %}"
        "{% generation %}<gen>{% endgeneration %}"
    )
    out = render_chat_template(
        template, messages=[{"content": "héllo 🙂"}, {"content": "x"}], tools=[1]
    )
    assert out == '[{"content": "héllo 🙂"}, {"content": "x"}]|[\n 1\n]|4[héllo 🙂]<gen>'


def test_raise_exception_and_sandbox():
    with pytest.raises(jinja2.TemplateError, match="roles must alternate"):
        render_chat_template("{{ raise_exception('roles must alternate') }}", messages=[])
    with pytest.raises(jinja2.exceptions.SecurityError):
        render_chat_template("{{ messages.__class__.__mro__ }}", messages=[])
    # A template may grow lists (Kimi K2's do), on a copy of what it is given.
    given: list[int] = []
    assert (
        render_chat_template("{{ messages.append(1) }}{{ messages }}", messages=given) == "None[1]"
    )
    assert given == []


def test_trim_and_lstrip_blocks():
    template = "{% for m in messages %}\n  {{ m }}\n{% endfor %}"
    assert render_chat_template(template, messages=["a", "b"]) == "  a\n  b\n"


def test_select_template():
    assert select_template("x") == "x" and select_template(None) is None
    named = [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]
    assert select_template(named) == "D" and select_template(named, "tool_use") == "T"
